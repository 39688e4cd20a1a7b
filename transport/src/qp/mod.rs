//! One queue pair: the coordinator over its send queue, requester, completer and responder.
//!
//! Calling order, for the [`Endpoint`](crate::Endpoint) that owns it: inputs
//! (`post_send`, `post_recv`, `handle_packet`, `handle_timeout`) in any order, then
//! `poll_packet` until it returns `false`, then `next_timeout` for when to call again.

mod common;
mod completer;
mod congestion;
mod dcqcn;
mod pacer;
mod requester;
mod resources;
mod responder;
mod selective;
mod send_queue;

use std::sync::Arc;
use std::time::Instant;

use roce_wire::frame::IpRepr;
use roce_wire::icrc::Running;
use roce_wire::{FrameRepr, Opcode, Psn};

use crate::congestion::{CongestionConfig, QpRate, RateLimit};
use crate::counters::Counters;
use crate::cq::{WcStatus, WorkCompletion};
use crate::mr::{MrTable, PdId};
use crate::qp_state::{check_modify, ModifyQpError, QpAttr, QpState, QpType};
use crate::srq::SrqTable;
use crate::timer::{Timer, TimerTable};
use crate::wr::{RecvWr, SendOp, SendWr};

pub use crate::limits::QpCaps;
use common::{Common, FullCqs, QpConfig};
pub(crate) use common::{Ctx, Failure, Lent, NO_CQ};
pub use common::{OutPacket, PostError, QpRetry, QpStats};
use completer::{Completer, Outcome, Then};
use congestion::Congestion;
use requester::Next;
use responder::{RendezvousRead, Responder};
use selective::Selective;
use send_queue::{Origin, SendQueue};

/// Everything that decides whether a post is accepted, as of one moment: what the
/// requester and responder check, and what a verbs layer checks to admit work from other
/// threads without holding the endpoint ([`Endpoint::post_gate`](crate::Endpoint::post_gate)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PostGate {
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// Queue sizes and limits.
    pub caps: QpCaps,
    /// The QP's state.
    pub state: QpState,
    /// Largest packet payload (a UD message must fit one).
    pub mtu: usize,
    /// Send work requests queued in the QP.
    pub sq_len: usize,
    /// Receive work requests posted to the QP itself and not yet completed (none on an
    /// SRQ: the verbs layer counts the QP's retired receives from this).
    pub rq_len: usize,
    /// The QP takes its receives from a shared receive queue.
    pub has_srq: bool,
}

impl PostGate {
    /// Whether `wr` may be posted with `queued` more sends already admitted ahead of it;
    /// returns its message length.
    pub fn check_send(&self, wr: &SendWr, queued: usize) -> Result<u32, PostError> {
        if self.qp_type == QpType::XrcRecv {
            return Err(PostError::UnsupportedOperation);
        }
        if !matches!(self.state, QpState::Rts | QpState::Sqd | QpState::Err) {
            return Err(PostError::InvalidState);
        }
        if self.sq_len + queued >= self.caps.max_send_wr as usize {
            return Err(PostError::QueueFull);
        }
        if wr.sg_list.len() > self.caps.max_send_sge as usize {
            return Err(PostError::TooManySge);
        }
        let inline = wr.flags.contains(crate::wr::SendFlags::INLINE);
        if inline && wr.inline_data.len() > self.caps.max_inline_data as usize {
            return Err(PostError::InlineTooLong);
        }
        if !send_queue::supported(self.qp_type, wr) {
            return Err(PostError::UnsupportedOperation);
        }
        let len = if matches!(wr.op, SendOp::AtomicWrite { .. }) {
            Some(8) // its data, in the request; no gather list is read
        } else if inline {
            u32::try_from(wr.inline_data.len()).ok()
        } else {
            crate::wr::sg_len(&wr.sg_list)
        };
        let len = len
            .filter(|&len| len <= 1 << 31)
            .ok_or(PostError::InvalidLength)?;
        if (wr.op.is_atomic() && len != 8)
            || (self.qp_type == QpType::Ud && len as usize > self.mtu)
        {
            return Err(PostError::InvalidLength);
        }
        Ok(len)
    }

    /// Whether `wr` may be posted with `queued` more receives already admitted ahead of it.
    pub fn check_recv(&self, wr: &RecvWr, queued: usize) -> Result<(), PostError> {
        // XRC QPs have no receive queue: a target receives into XRC SRQs.
        if self.has_srq || matches!(self.qp_type, QpType::XrcSend | QpType::XrcRecv) {
            return Err(PostError::UsesSrq);
        }
        if self.state == QpState::Reset {
            return Err(PostError::InvalidState);
        }
        if self.rq_len + queued >= self.caps.max_recv_wr as usize {
            return Err(PostError::QueueFull);
        }
        if wr.sg_list.len() > self.caps.max_recv_sge as usize {
            return Err(PostError::TooManySge);
        }
        Ok(())
    }
}

/// What a QP's responder has queued to send, and the most it can ever hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponderBacklog {
    /// READ responses (one entry per READ, however long), atomic results, ACKs and NAKs.
    pub queued: usize,
    /// The most that can be queued, set by `max_dest_rd_atomic`, not by what peers ask.
    pub bound: usize,
}

/// One queue pair: owns its parts and calls the roles with the pieces each needs. The
/// fields the endpoint reads are public.
#[derive(Debug)]
pub(crate) struct Qp {
    pub common: Common,
    /// The CQs a completion could not be queued on; the owner reports each as an async event.
    pub cq_overflowed: FullCqs,
    /// Set when the QP went to ERR on its own; the owner reports it as an async event.
    pub failure: Option<Failure>,
    /// Set when a QP on an SRQ entered ERR: it takes no more WQEs from the SRQ, and the
    /// owner reports that as an async event (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    pub last_wqe_reached: bool,
    caps: QpCaps,
    sq_sig_all: bool,
    sq: SendQueue,
    comp: Completer,
    resp: Responder,
    timers: TimerTable,
    congestion: Congestion,
    selective: Selective,
}

/// What a QP is created with, besides its CQs (which
/// [`Endpoint::create_qp`](crate::Endpoint::create_qp) takes as ids).
#[derive(Debug, Clone, Copy)]
pub struct QpInit {
    /// Protection domain of every region it touches.
    pub pd: PdId,
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// Queue sizes.
    pub caps: QpCaps,
    /// Complete every send, not only `SIGNALED` ones.
    pub sq_sig_all: bool,
}

impl Qp {
    /// Whether this QP completes into the CQ in slot `cq`.
    pub(crate) fn uses_cq(&self, cq: usize) -> bool {
        self.common.send_cq == cq || self.common.recv_cq == cq
    }

    /// A QP in RESET whose completions go to the CQs in slots `send_cq` and `recv_cq`, on a
    /// device configured for congestion control as `congestion` says.
    pub fn new(
        qpn: u32,
        init: QpInit,
        send_cq: usize,
        recv_cq: usize,
        congestion: Arc<CongestionConfig>,
    ) -> Self {
        Qp {
            common: Common {
                qpn,
                qp_type: init.qp_type,
                pd: init.pd,
                send_cq,
                recv_cq,
                state: QpState::Reset,
                config: QpConfig::default(),
                stats: QpStats::default(),
                srq: None,
                xrcd: None,
                cq_full: FullCqs::default(),
            },
            caps: init.caps,
            sq_sig_all: init.sq_sig_all,
            sq: SendQueue::default(),
            comp: Completer::default(),
            resp: Responder::default(),
            timers: TimerTable::default(),
            selective: Selective::new(selective_repeat(&init, &congestion)),
            congestion: Congestion::new(congestion),
            cq_overflowed: FullCqs::default(),
            failure: None,
            last_wqe_reached: false,
        }
    }

    pub fn modify(&mut self, ctx: &mut Ctx, attr: &QpAttr) -> Result<(), ModifyQpError> {
        let to = check_modify(self.common.qp_type, self.common.state, attr)?;
        let config = &mut self.common.config;
        if let Some(access) = attr.access_flags {
            config.access = access;
        }
        if let Some(qkey) = attr.qkey {
            config.qkey = qkey;
        }
        if let Some(av) = attr.av {
            config.av = Some(self.congestion.traffic_class(av));
        }
        if let Some(mtu) = attr.path_mtu {
            config.mtu = mtu.bytes();
        }
        if let Some(qpn) = attr.dest_qp_num {
            config.dest_qpn = qpn;
        }
        if let Some(n) = attr.max_dest_rd_atomic {
            config.max_dest_rd_atomic = n;
        }
        if let Some(timer) = attr.min_rnr_timer {
            config.min_rnr_timer = timer;
        }
        if let Some(timeout) = attr.timeout {
            config.timeout = timeout;
        }
        if let Some(n) = attr.retry_cnt {
            config.retry_cnt = n;
            self.comp.set_retry_cnt(n);
        }
        if let Some(n) = attr.rnr_retry {
            config.rnr_retry = n;
            self.comp.set_rnr_retry(n);
        }
        if let Some(n) = attr.max_rd_atomic {
            config.max_rd_atomic = n;
        }
        if let Some(psn) = attr.rq_psn {
            self.resp.set_psn(psn);
        }
        if let Some(psn) = attr.sq_psn {
            self.sq.set_psn(psn);
        }
        if to != self.common.state {
            tracing::debug!(qpn = self.common.qpn, from = ?self.common.state, ?to, "QP state (modify_qp)");
        }
        match to {
            QpState::Err if self.common.state != QpState::Err => self.enter_error(ctx),
            QpState::Reset => {
                self.abandon_tags(ctx.srqs);
                self.sq = SendQueue::default();
                self.comp = Completer::default();
                self.resp = Responder::default();
                self.timers = TimerTable::default();
                self.congestion.reset();
                self.selective = Selective::new(self.selective.enabled());
                self.common.state = QpState::Reset;
            }
            QpState::Sqd if self.common.state == QpState::Rts => {
                self.common.state = to;
                // A burst cut short (a full ring, the turn's budget) left its last packet
                // without AckReq, and draining starts nothing new that would ask: go back
                // now, so the unacknowledged packets go again, the last one asking.
                let unacked = self.sq.max_sent_psn().distance(self.sq.acked_psn()) > 0;
                if unacked && self.sq.noack_pkts() > 0 {
                    self.timers.set(Timer::Retransmit, ctx.now);
                }
            }
            _ => self.common.state = to,
        }
        Ok(())
    }

    #[inline]
    pub fn post_send(&mut self, ctx: &mut Ctx, wr: &SendWr) -> Result<(), PostError> {
        let len = self.post_gate().check_send(wr, 0)?;
        if self.common.state == QpState::Err {
            let completion = send_queue::completion(self.common.qpn, wr, WcStatus::WrFlush, 0);
            self.complete(ctx, self.common.send_cq, completion);
        } else {
            requester::post(&mut self.sq, &self.common.config, wr, len);
        }
        Ok(())
    }

    pub fn post_recv(&mut self, ctx: &mut Ctx, wr: &RecvWr) -> Result<(), PostError> {
        self.post_gate().check_recv(wr, 0)?;
        if self.common.state == QpState::Err {
            let completion = responder::recv_completion(self.common.qpn, wr, WcStatus::WrFlush);
            self.complete(ctx, self.common.recv_cq, completion);
        } else {
            self.resp.post(wr);
        }
        Ok(())
    }

    #[inline]
    pub fn handle_packet(&mut self, ctx: &mut Ctx, frame: &FrameRepr) {
        // Only the default partition exists (full or limited member), and a connected QP
        // hears only its peer (rxe's check_keys and check_addr).
        let connected = self.common.qp_type != QpType::Ud;
        if frame.bth.pkey & 0x7FFF != 0x7FFF || (connected && !self.is_from_peer(frame)) {
            tracing::debug!(
                qpn = self.common.qpn,
                pkey = frame.bth.pkey,
                source = ?frame.ip,
                "dropped: foreign P_Key or not from the connected peer"
            );
            self.common.stats.dropped += 1;
            return;
        }
        let is_request = frame.bth.opcode.info().is_request;
        if self.selective.enabled() {
            self.selective_seen(frame, is_request);
        }
        if connected && frame.ip.ecn() == crate::congestion::CE {
            self.congestion_experienced(ctx, is_request);
        }
        if is_request {
            let failure = responder::handle_request(&mut self.resp, &mut self.common, ctx, frame);
            if let Some(read) = self.resp.take_rendezvous() {
                self.start_rendezvous(ctx, read);
            }
            self.handle_cq_full(ctx);
            if let Some(failure) = failure {
                self.fail_by_peer(ctx, failure);
            }
        } else if frame.bth.opcode != Opcode::Cnp {
            self.handle_response(ctx, frame);
        } else if connected {
            self.congestion_notified(ctx);
        }
    }

    /// A packet from the peer, on a device that takes part in selective repeat: an offer
    /// (in a request) or the answer to ours (in a response).
    #[inline(never)]
    fn selective_seen(&mut self, frame: &FrameRepr, is_request: bool) {
        if self.selective.on_packet(&frame.bth, is_request) {
            tracing::debug!(
                qpn = self.common.qpn,
                "selective repeat: the peer offered it"
            );
            self.resp.keep_out_of_order();
        }
        self.comp.selective = self.selective.accepted;
    }

    /// A packet for this QP came marked CE (out of line: the usual packet pays one test).
    #[cold]
    #[inline(never)]
    fn congestion_experienced(&mut self, ctx: &mut Ctx, request: bool) {
        self.congestion.on_ce(ctx.now, request, ctx.counters);
    }

    /// A CNP for this QP came from its peer.
    #[cold]
    #[inline(never)]
    fn congestion_notified(&mut self, ctx: &mut Ctx) {
        self.congestion.on_cnp(ctx.now, ctx.counters);
        self.arm_congestion_timer();
    }

    /// Sets the congestion timer to what congestion control waits for next.
    fn arm_congestion_timer(&mut self) {
        match self.congestion.next_deadline() {
            Some(at) => self.timers.set(Timer::Congestion, at),
            None => self.timers.stop(Timer::Congestion),
        }
    }

    /// The device's congestion settings changed at `now`.
    pub fn set_congestion(&mut self, now: Instant, config: Arc<CongestionConfig>) {
        self.congestion.set_config(now, config);
        self.arm_congestion_timer();
    }

    /// Sets or clears the QP's rate limit at `now`; only a QP that sends or is about to
    /// (RTR, RTS, SQD) takes one, as `IBV_QP_RATE_LIMIT` is only taken on the way to RTS
    /// and in it.
    pub fn set_rate_limit(
        &mut self,
        now: Instant,
        limit: Option<RateLimit>,
    ) -> Result<(), ModifyQpError> {
        if !matches!(
            self.common.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd
        ) {
            return Err(ModifyQpError::OutOfRange(
                "rate_limit (not in RTR, RTS or SQD)",
            ));
        }
        self.congestion.set_limit(now, limit);
        self.arm_congestion_timer();
        Ok(())
    }

    /// The QP's rates as of `now`, and whether it agreed selective repeat.
    pub fn rate(&mut self, now: Instant) -> QpRate {
        QpRate {
            selective_repeat: self.selective.accepted,
            ..self.congestion.snapshot(now)
        }
    }

    fn handle_response(&mut self, ctx: &mut Ctx, frame: &FrameRepr) {
        let acked_before = self.sq.acked_psn();
        let Some(outcome) =
            completer::handle_response(&mut self.comp, &mut self.sq, &mut self.common, ctx, frame)
        else {
            return;
        };
        self.apply(ctx, outcome);
        if self.sq.acked_psn() != acked_before {
            self.selective.progress(self.sq.acked_psn());
        }
        if self.common.state != QpState::Err {
            completer::settle(
                &mut self.comp,
                &self.sq,
                &mut self.timers,
                &self.common,
                ctx,
                frame,
                acked_before,
            );
        }
    }

    /// Carries out what the completer decided, in order; a CQ overflow on the way (which
    /// moves the QP to ERR and flushes the queue) ends it.
    fn apply(&mut self, ctx: &mut Ctx, outcome: Outcome) {
        for _ in 0..outcome.complete {
            self.complete_front(ctx);
            if self.common.state == QpState::Err {
                return;
            }
        }
        self.complete_local_front(ctx);
        match outcome.then {
            Then::Nothing => {}
            Then::Retry { from, wait } => {
                if let Some(wait) = wait {
                    tracing::debug!(qpn = self.common.qpn, ?wait, resume = %from, "RNR wait");
                    self.timers.set(Timer::RnrWait, ctx.now + wait);
                } else {
                    ctx.counters.completer_retry_err += 1;
                    if self.selective.accepted {
                        // The ACK timer, with a peer that keeps what comes after a gap:
                        // see `handle_timeout`.
                        self.selective.probe(from);
                        return;
                    }
                }
                self.sq.rewind(from);
            }
            Then::Resend(psn) => {
                // Only the ACK timer spends retries, as with go-back-N: a packet that goes
                // missing again and again ends in RETRY_EXC_ERR after `retry_cnt` timers
                // without progress.
                if self.selective.wants(psn) {
                    ctx.counters.completer_retry_err += 1;
                    self.selective.queue(psn);
                }
            }
            Then::Fail(status) => {
                tracing::debug!(qpn = self.common.qpn, ?status, "send work request failed");
                match status {
                    WcStatus::RetryExceeded => ctx.counters.retry_exceeded_err += 1,
                    WcStatus::RnrRetryExceeded => ctx.counters.retry_rnr_exceeded_err += 1,
                    _ => {}
                }
                self.fail_wqe(ctx, 0, status)
            }
        }
    }

    /// Whether a frame comes from the address this connected QP was given.
    fn is_from_peer(&self, frame: &FrameRepr) -> bool {
        let source = match frame.ip {
            IpRepr::V4(v4) => v4.src.to_ipv6_mapped().octets(),
            IpRepr::V6(v6) => v6.src.octets(),
        };
        self.common.config.av.is_some_and(|av| av.dgid == source)
    }

    pub fn handle_timeout(&mut self, ctx: &mut Ctx) {
        let expired: Vec<Timer> = self.timers.expire(ctx.now).collect();
        for timer in expired {
            match timer {
                Timer::Retransmit if self.congestion.holding() => {
                    // The pacer held back the next packet until after the timer was due (a
                    // late wake-up): the ACK timer runs from when it goes, as it would
                    // have had the engine woken at the pacer's time.
                    if let Some(timeout) = self.common.config.ack_timeout() {
                        self.timers.set(Timer::Retransmit, ctx.now + timeout);
                    }
                }
                Timer::Retransmit => {
                    let outcome =
                        completer::ack_timeout(&mut self.comp, &mut self.sq, &mut self.common);
                    self.apply(ctx, outcome);
                    if self.selective.accepted && self.selective.next_resend().is_some() {
                        // Selective repeat probes with the last packet sent: in order, it
                        // fills a lost tail; beyond a gap, it draws the NAK that names it;
                        // a duplicate, it draws the ACK that was lost. The last PSN of a
                        // READ or atomic is a response's: then the oldest unanswered
                        // request goes (asking for what is missing of it).
                        let last = self.sq.max_sent_psn();
                        let request = self
                            .sq
                            .holding(last)
                            .is_some_and(|wqe| !wqe.wr.op.is_read_or_atomic());
                        if request {
                            self.selective.probe(last);
                        }
                        // The NAK it draws is news, not an echo of the loss just retried.
                        self.comp.forget_recovery();
                    }
                }
                Timer::RnrWait => {}
                Timer::Congestion => {
                    self.congestion.on_timeout(ctx.now, ctx.counters);
                    self.arm_congestion_timer();
                }
            }
        }
    }

    /// The receives posted to this QP and not yet completed: none on an SRQ or an XRC
    /// target, whose responder holds a WQE of the SRQ's while a message arrives into it.
    fn own_receives(&self) -> usize {
        let shared = self.common.srq.is_some() || self.common.qp_type == QpType::XrcRecv;
        if shared {
            0
        } else {
            self.resp.rq_len()
        }
    }

    /// What decides whether a post is accepted now.
    pub fn post_gate(&self) -> PostGate {
        PostGate {
            qp_type: self.common.qp_type,
            caps: self.caps,
            state: self.common.state,
            mtu: self.common.config.mtu,
            sq_len: self.sq.program_len(),
            rq_len: self.own_receives(),
            has_srq: self.common.srq.is_some(),
        }
    }

    /// Writes the next packet to send into `out`, whose payload buffer is reused: responses
    /// first (they unblock the peer), then requests. `false` when there is nothing to send
    /// (`out` is then unspecified).
    #[inline]
    pub fn poll_packet(&mut self, ctx: &mut Ctx, out: &mut OutPacket) -> bool {
        if self.congestion.active() || self.selective.active() {
            return self.poll_slow(ctx, out);
        }
        responder::next_packet(&mut self.resp, &mut self.common, ctx, out)
            || self.poll_request(ctx, out)
    }

    /// [`Self::poll_packet`] for a QP that owes a CNP, has a pacer, or takes part in
    /// selective repeat: the CNP first, then the responder's packets (never paced), then,
    /// if the pacer lets one go, a packet selective repeat sends again or the next request.
    #[cold]
    #[inline(never)]
    fn poll_slow(&mut self, ctx: &mut Ctx, out: &mut OutPacket) -> bool {
        let peer = self.common.config.dest_qpn;
        let av = self.common.connected_av();
        if let Some((bth, ext, av)) = self.congestion.take_cnp(peer, av, ctx.counters) {
            out.replace_with(OutPacket {
                bth,
                ext,
                payload: Vec::new(),
                av,
                lent: None,
            });
            return true;
        }
        if responder::next_packet(&mut self.resp, &mut self.common, ctx, out) {
            self.selective.mark(&mut out.bth, false);
            return true;
        }
        let waiting = self.sq.cursor().is_some() || self.selective.next_resend().is_some();
        if self.congestion.pace(ctx.now, waiting).is_err() {
            self.arm_congestion_timer();
            return false;
        }
        let again = self
            .selective
            .next_resend()
            .is_some_and(|psn| self.send_again(ctx, out, psn));
        if !again {
            if !self.poll_request(ctx, out) {
                return false;
            }
            self.selective.mark(&mut out.bth, true);
        }
        if !self.congestion.paced() {
            return true;
        }
        // Paced, the next packet waits for the pacer: a message's end asks for its ACK now
        // (`requester::next_packet` counted on the next one following at once).
        let info = out.bth.opcode.info();
        if self.common.qp_type.is_reliable()
            && info.is_request
            && info.position.ends_message()
            && !out.bth.ack_req
        {
            out.bth.ack_req = true;
            self.sq.ack_requested();
        }
        let bytes = congestion::FRAME_OVERHEAD
            + out.payload_len() as u64
            + u64::from(out.bth.pad_count)
            + roce_wire::ExtRepr::buffer_len(out.bth.opcode) as u64;
        self.congestion.sent(ctx.now, bytes);
        self.arm_congestion_timer();
        // The pacer, not the peer, is what delays the ACK of what went before: the ACK timer
        // runs from the latest request, as rxe restarts it with every packet it sends.
        if let (QpType::Rc, Some(timeout)) = (self.common.qp_type, self.common.config.ack_timeout())
        {
            self.timers.set(Timer::Retransmit, ctx.now + timeout);
        }
        true
    }

    /// Selective repeat: writes the packet at `psn` (sent before) into `out`, without moving
    /// where transmission stands; `false` if it cannot go now (or was acknowledged since).
    fn send_again(&mut self, ctx: &mut Ctx, out: &mut OutPacket, psn: Psn) -> bool {
        // Within a READ, from its first response still missing: what came stays.
        let psn = match self.sq.holding(psn) {
            Some(wqe)
                if wqe.wr.op.is_read_or_atomic() && psn.distance(wqe.answered_through()) < 0 =>
            {
                wqe.answered_through()
            }
            _ => psn,
        };
        let unacked = psn.distance(self.sq.acked_psn()) > 0;
        if !unacked || psn.distance(self.sq.next_psn()) >= 0 {
            self.selective.resent(false);
            return false;
        }
        let cursor = self.sq.save_cursor();
        self.sq.rewind(psn);
        // A READ asks only for the responses missing from `psn` to the next one received.
        let read_part = self.sq.cursor().and_then(|(index, k)| {
            let wqe = self.sq.get(index)?;
            let mtu = self.common.config.mtu as u32;
            matches!(wqe.wr.op, SendOp::RdmaRead { .. })
                .then(|| (wqe.missing_from(k) * mtu).min(wqe.len - k * mtu))
        });
        let sent = self.poll_request(ctx, out);
        self.sq.restore_cursor(cursor);
        if sent {
            tracing::debug!(qpn = self.common.qpn, %psn, "selective repeat: sent again");
            self.selective.resent(true);
            out.bth.ack_req = true;
            if let (Some(len), Some(reth)) = (read_part, &mut out.ext.reth) {
                reth.dma_length = len;
            }
        }
        sent
    }

    /// The requester's next packet, finishing what it reports.
    #[inline]
    fn poll_request(&mut self, ctx: &mut Ctx, out: &mut OutPacket) -> bool {
        let (sq, timers) = (&mut self.sq, &mut self.timers);
        let next = requester::next_packet(sq, timers, &mut self.common, ctx, out);
        // Local operations the requester ran complete once nothing before them is left,
        // ahead of the WQE whose packet just left.
        self.complete_local_front(ctx);
        match next {
            Next::Nothing => false,
            Next::Sent { completes_front } => {
                if completes_front {
                    // The WQE is retired as its last packet leaves: the packet takes its
                    // own copy of the payload first.
                    self.materialize(ctx.mrs, out);
                    self.complete_sent_front(ctx);
                }
                true
            }
            Next::Fail { index, status } => {
                self.fail_wqe(ctx, index, status);
                false
            }
        }
    }

    /// Copies the lent payload of the packet this QP gave last into `out` (as long as its
    /// [`Lent::len`](OutPacket::payload_len)) and returns `icrc` continued over it: from the
    /// WQE's inline data or gather list, or from the region a READ response reads (or the
    /// one SGE a request's bytes lie in).
    pub fn write_payload(
        &self,
        mrs: &MrTable,
        lent: Lent,
        out: &mut [u8],
        icrc: Running,
    ) -> Result<Running, WcStatus> {
        match lent {
            Lent::Wqe { .. } => {
                self.copy_payload(mrs, lent, out)?;
                Ok(icrc.update(out))
            }
            Lent::Region { location, .. } => mrs
                .read_icrc(location, out, icrc)
                .map_err(|_| WcStatus::LocalProtection),
        }
    }

    /// Copies a lent payload into `out`, as [`write_payload`](Self::write_payload) does.
    fn copy_payload(&self, mrs: &MrTable, lent: Lent, out: &mut [u8]) -> Result<(), WcStatus> {
        match lent {
            Lent::Wqe { index, offset, .. } => {
                let wqe = self.sq.get(index).ok_or(WcStatus::LocalQpOperation)?;
                requester::write_payload(&self.common, mrs, wqe, offset, out)
            }
            Lent::Region { location, .. } => mrs
                .read(location, out)
                .map_err(|_| WcStatus::LocalProtection),
        }
    }

    /// Makes `out` hold its payload's bytes rather than lend them.
    pub fn materialize(&self, mrs: &MrTable, out: &mut OutPacket) {
        let Some(lent) = out.lent else {
            return;
        };
        let mut bytes = std::mem::take(&mut out.payload);
        bytes.clear();
        bytes.resize(out.payload_len(), 0);
        if let Err(status) = self.copy_payload(mrs, lent, &mut bytes) {
            // Checked when the packet was made, and nothing changed since.
            tracing::warn!(
                qpn = self.common.qpn,
                ?status,
                "a lent payload could not be read"
            );
        }
        out.payload = bytes;
        out.lent = None;
    }

    /// What the responder has queued to send.
    pub fn responder_backlog(&self) -> ResponderBacklog {
        let limit = usize::from(self.common.config.max_dest_rd_atomic);
        ResponderBacklog {
            queued: self.resp.backlog(),
            bound: resources::Resources::backlog_bound(limit),
        }
    }

    pub fn next_timeout(&self) -> Option<Instant> {
        self.timers.next_deadline()
    }

    /// Queues a completion on `cq`; a full CQ moves the QP to ERR.
    #[inline(always)]
    fn complete(&mut self, ctx: &mut Ctx, cq: usize, completion: WorkCompletion) {
        self.common.complete(ctx, cq, completion);
        self.handle_cq_full(ctx);
    }

    /// A completion (the QP's own or a role's) found its CQ full: the QP enters ERR.
    #[inline(always)]
    fn handle_cq_full(&mut self, ctx: &mut Ctx) {
        let full = std::mem::take(&mut self.common.cq_full);
        if full.any() {
            self.cq_overflowed.add(full);
            if self.common.state != QpState::Err {
                self.enter_error(ctx);
            }
        }
    }

    /// [`Self::complete_front`] for a UC or UD WQE whose last packet left, out of line: the
    /// packet loop stays small, and the completer's loop gets the inlined copy.
    #[inline(never)]
    fn complete_sent_front(&mut self, ctx: &mut Ctx) {
        self.complete_front(ctx);
    }

    /// Removes the front send WQE, which succeeded, and reports it if it is signaled.
    #[inline(always)]
    fn complete_front(&mut self, ctx: &mut Ctx) {
        let Some(front) = self.sq.front() else {
            return;
        };
        if front.origin != Origin::Program {
            let (origin, len) = (front.origin, front.len);
            self.sq.pop_front();
            self.finish_own(ctx, origin, WcStatus::Success, len);
            return;
        }
        let completion = self.sq.success_of_front(self.common.qpn, self.sq_sig_all);
        count_send(ctx.counters, self.sq.front().map(|wqe| &wqe.wr));
        self.sq.pop_front();
        if let Some(completion) = completion {
            self.complete(ctx, self.common.send_cq, completion);
        }
    }

    /// Completes the local operations (binds, local invalidations) at the front that have
    /// run: they wait for nothing but the WQEs before them.
    #[inline]
    fn complete_local_front(&mut self, ctx: &mut Ctx) {
        if self.sq.has_locals() {
            self.complete_local_front_now(ctx);
        }
    }

    #[inline(never)]
    fn complete_local_front_now(&mut self, ctx: &mut Ctx) {
        while self.sq.front().is_some_and(|wqe| wqe.local_done())
            && self.common.state != QpState::Err
        {
            self.complete_front(ctx);
        }
    }

    /// Completes the send WQE at `index` with an error (earlier ones are flushed first, to
    /// keep completions in order) and moves the QP to ERR, which flushes the rest.
    fn fail_wqe(&mut self, ctx: &mut Ctx, index: usize, status: WcStatus) {
        if self.common.state != QpState::Err {
            self.failure = Some(Failure::Fatal(status));
        }
        for flushed in 0..=index {
            let Some(wqe) = self.sq.front() else {
                break;
            };
            let status = if flushed < index {
                WcStatus::WrFlush
            } else {
                count_send(ctx.counters, Some(&wqe.wr));
                status
            };
            if wqe.origin != Origin::Program {
                let (origin, len) = (wqe.origin, wqe.len);
                self.sq.pop_front();
                self.finish_own(ctx, origin, status, len);
                continue;
            }
            let completion = send_queue::completion(self.common.qpn, &wqe.wr, status, 0);
            self.sq.pop_front();
            self.complete(ctx, self.common.send_cq, completion);
        }
        if self.common.state != QpState::Err {
            self.enter_error(ctx);
        }
    }

    /// Moves to ERR because of a peer's request, saying why.
    fn fail_by_peer(&mut self, ctx: &mut Ctx, failure: Failure) {
        if self.common.state != QpState::Err {
            self.failure = Some(failure);
            self.enter_error(ctx);
        }
    }

    /// Moves to ERR and flushes every outstanding work request, sends first, in order. A
    /// QP on an SRQ flushes only the WQE it took for a message under way; the SRQ's own
    /// stay for the other QPs.
    pub fn enter_error(&mut self, ctx: &mut Ctx) {
        tracing::debug!(qpn = self.common.qpn, from = ?self.common.state, failure = ?self.failure, "QP to ERR");
        self.common.state = QpState::Err;
        self.last_wqe_reached = self.common.srq.is_some();
        self.timers = TimerTable::default();
        let sends = self.sq.take_all();
        for wqe in sends.iter() {
            if wqe.origin != Origin::Program {
                self.finish_own(ctx, wqe.origin, WcStatus::WrFlush, wqe.len);
                continue;
            }
            let completion = send_queue::completion(self.common.qpn, &wqe.wr, WcStatus::WrFlush, 0);
            self.complete(ctx, self.common.send_cq, completion);
        }
        responder::flush_tagged(&mut self.resp, &mut self.common, ctx);
        let recvs = self.resp.take_receives();
        for wr in recvs.iter() {
            let completion = responder::recv_completion(self.common.qpn, wr, WcStatus::WrFlush);
            self.complete(ctx, self.common.recv_cq, completion);
        }
    }
}

/// Whether a QP created with `init` on a device configured with `config` takes part in
/// selective repeat (only RC has something to repeat).
fn selective_repeat(init: &QpInit, config: &CongestionConfig) -> bool {
    config.selective_repeat && init.qp_type == QpType::Rc
}

impl Qp {
    /// Tag matching: sends the READ of a matched rendezvous request's data, as a WQE of the
    /// QP's own behind those posted; a QP that failed meanwhile fails the tag at once.
    fn start_rendezvous(&mut self, ctx: &mut Ctx, read: RendezvousRead) {
        let origin = Origin::Rendezvous(read.handle);
        let len = read.wr.sg_list.iter().map(|sge| sge.length).sum();
        if self.common.state == QpState::Err {
            self.finish_own(ctx, origin, WcStatus::WrFlush, len);
            return;
        }
        let npsn = self.common.config.packets(len);
        self.sq.push_from(origin, &read.wr, len, npsn);
    }

    /// A WQE of the QP's own, `len` bytes long, ended with `status`. A rendezvous READ
    /// completes its tag (`DATA_VALID`, or the failure) on the SRQ's CQ, frees it, and on
    /// success sends the FIN; a FIN reports nothing.
    fn finish_own(&mut self, ctx: &mut Ctx, origin: Origin, status: WcStatus, len: u32) {
        let (Origin::Rendezvous(handle), Some(srq)) = (origin, self.common.srq) else {
            return;
        };
        let Some(tm) = ctx.srqs.tm_mut(srq) else {
            return;
        };
        let cq = tm.cq;
        let Some((completion, fin)) = tm.finish_rendezvous(handle, self.common.qpn, status, len)
        else {
            return;
        };
        self.complete(ctx, cq, completion);
        if let (Some(fin), false) = (fin, self.common.state == QpState::Err) {
            let len = fin.inline_data.len() as u32;
            self.sq.push_from(Origin::Fin, &fin, len, 1);
        }
    }

    /// Frees the tags this QP holds (a rendezvous being read, a tagged message arriving)
    /// without completions: it is being destroyed or reset.
    pub fn abandon_tags(&mut self, srqs: &mut SrqTable) {
        if let Some(tm) = self.common.srq.and_then(|srq| srqs.tm_mut(srq)) {
            for index in 0..self.sq.len() {
                if let Some(Origin::Rendezvous(handle)) = self.sq.get(index).map(|wqe| wqe.origin) {
                    tm.release(handle);
                }
            }
        }
        responder::abandon_tagged(&mut self.resp, srqs);
    }
}

/// rxe's `rdma_sends`: a SEND work request (of any kind) completing, whatever its status.
fn count_send(counters: &mut Counters, wr: Option<&SendWr>) {
    let send = |wr: &SendWr| {
        matches!(
            wr.op,
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_)
        )
    };
    if wr.is_some_and(send) {
        counters.rdma_sends += 1;
    }
}
