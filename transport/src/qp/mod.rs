//! One queue pair: the coordinator over its send queue, requester, completer and responder.
//!
//! Calling order, for the [`Endpoint`](crate::Endpoint) that owns it: inputs
//! (`post_send`, `post_recv`, `handle_packet`, `handle_timeout`) in any order, then
//! `poll_packet` until it returns `false`, then `next_timeout` for when to call again.

mod completer;
mod requester;
mod resources;
mod responder;
mod send_queue;

use std::time::{Duration, Instant};

use roce_wire::aeth::RnrTimer;
use roce_wire::frame::IpRepr;
use roce_wire::{bth, ExtRepr, FrameRepr, Opcode, Psn};

use crate::counters::Counters;
use crate::cq::{Cq, WcOpcode, WcStatus, WorkCompletion};
use crate::errno;
use crate::mr::{MrTable, PdId};
use crate::qp_state::{
    check_modify, AddressVector, ModifyQpError, PathMtu, QpAttr, QpState, QpType,
};
use crate::srq::{SrqId, SrqTable};
use crate::timer::{Timer, TimerTable};
use crate::wr::{RecvWr, SendOp, SendWr, UdDest};
use crate::AccessFlags;

use completer::{Completer, Outcome, Then};
use responder::Responder;
use send_queue::SendQueue;

/// Queue sizes and limits fixed at creation (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send work requests outstanding at once.
    pub max_send_wr: u32,
    /// Receive work requests outstanding at once.
    pub max_recv_wr: u32,
    /// Gather elements per send.
    pub max_send_sge: u32,
    /// Scatter elements per receive.
    pub max_recv_sge: u32,
    /// Bytes of inline data per send.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 256,
        }
    }
}

/// Why a post was refused (the call fails; no completion is generated).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PostError {
    /// No QP with that number.
    #[error("no such QP")]
    UnknownQp,
    /// The QP's state does not accept this queue's work yet (RESET, or RESET/INIT for sends).
    #[error("QP state does not allow posting")]
    InvalidState,
    /// The queue already holds `max_send_wr`/`max_recv_wr` requests.
    #[error("work queue full")]
    QueueFull,
    /// More gather/scatter elements than the caps allow.
    #[error("too many scatter/gather elements")]
    TooManySge,
    /// Inline data longer than `max_inline_data`.
    #[error("inline data too long")]
    InlineTooLong,
    /// The QP takes its receives from a shared receive queue (post to the SRQ instead).
    #[error("QP takes its receives from an SRQ")]
    UsesSrq,
    /// An operation this QP type cannot do (READ on UC, WRITE on UD, ...), or a UD send
    /// without a destination.
    #[error("operation not supported on this QP type")]
    UnsupportedOperation,
    /// A message longer than 2^31 bytes, or an atomic whose result buffer is not 8 bytes.
    #[error("invalid length")]
    InvalidLength,
}

impl PostError {
    /// The errno `ibv_post_send`/`ibv_post_recv` fail with (rdma-core's rxe: a full queue
    /// is `ENOMEM`, everything else `EINVAL`).
    pub fn errno(&self) -> i32 {
        match self {
            PostError::QueueFull => errno::ENOMEM,
            _ => errno::EINVAL,
        }
    }
}

/// The attributes a QP has been given through `modify_qp`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpConfig {
    pub access: AccessFlags,
    pub qkey: u32,
    pub av: Option<AddressVector>,
    pub mtu: usize,
    pub dest_qpn: u32,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: RnrTimer,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub max_rd_atomic: u8,
}

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            access: AccessFlags::empty(),
            qkey: 0,
            av: None,
            mtu: PathMtu::Mtu1024.bytes(),
            dest_qpn: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: RnrTimer::new(0),
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            max_rd_atomic: 0,
        }
    }
}

impl QpConfig {
    /// Packets a message of `len` bytes takes, at least one. Every path MTU is a power of
    /// two, so this shifts rather than divides (it runs for every posted request).
    pub fn packets(&self, len: u32) -> u32 {
        debug_assert!(self.mtu.is_power_of_two());
        let len = u64::from(len);
        let mtu = self.mtu as u64;
        ((len + mtu - 1) >> mtu.trailing_zeros()).max(1) as u32
    }

    /// Local ACK timeout: 4.096 µs × 2^timeout; `None` for 0, which means wait forever.
    pub fn ack_timeout(&self) -> Option<Duration> {
        (self.timeout != 0).then(|| Duration::from_nanos(4096 << self.timeout))
    }
}

/// A packet a QP wants sent, before the provider adds Ethernet, IP and UDP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutPacket {
    /// Base transport header.
    pub bth: bth::Repr,
    /// Extension headers.
    pub ext: ExtRepr,
    /// Payload (without pad).
    pub payload: Vec<u8>,
    /// Where it goes.
    pub av: AddressVector,
}

impl Default for OutPacket {
    /// A blank packet to fill: an ACK for PSN 0 to nowhere, with no payload.
    fn default() -> Self {
        OutPacket {
            bth: bth::Repr::new(Opcode::RcAcknowledge, 0, Psn::new(0)),
            ext: ExtRepr::default(),
            payload: Vec::new(),
            av: NO_ADDRESS,
        }
    }
}

impl OutPacket {
    /// Becomes `packet`, keeping this packet's payload buffer when `packet` has none, so a
    /// reused packet does not give up its allocation to an ACK.
    pub(crate) fn replace_with(&mut self, packet: OutPacket) {
        if packet.payload.is_empty() {
            let mut buffer = std::mem::take(&mut self.payload);
            buffer.clear();
            *self = OutPacket {
                payload: buffer,
                ..packet
            };
        } else {
            *self = packet;
        }
    }
}

/// The address of a connected QP that has not been given one yet.
const NO_ADDRESS: AddressVector = AddressVector {
    dgid: [0; 16],
    sgid_index: 0,
    hop_limit: 64,
    traffic_class: 0,
    flow_label: 0,
};

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
    /// Receive work requests queued in the QP.
    pub rq_len: usize,
    /// The QP takes its receives from a shared receive queue.
    pub has_srq: bool,
}

impl PostGate {
    /// Whether `wr` may be posted with `queued` more sends already admitted ahead of it;
    /// returns its message length.
    pub fn check_send(&self, wr: &SendWr, queued: usize) -> Result<u32, PostError> {
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
        let len = if inline {
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
        if self.has_srq {
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

/// Counters of one QP, for tools and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpStats {
    /// Request packets sent again after a NAK, RNR NAK or timeout.
    pub retransmits: u64,
    /// Local ACK timeouts.
    pub timeouts: u64,
    /// NAKs (sequence, RNR and errors) this QP's responder sent.
    pub naks_sent: u64,
    /// NAKs this QP's completer received.
    pub naks_received: u64,
    /// Incoming packets dropped (wrong state, duplicate responses, ghosts, bad Q_Key...).
    pub dropped: u64,
}

/// What a QP's responder has queued to send, and the most it can ever hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponderBacklog {
    /// READ responses (one entry per READ, however long), atomic results, ACKs and NAKs.
    pub queued: usize,
    /// The most that can be queued, set by `max_dest_rd_atomic`, not by what peers ask.
    pub bound: usize,
}

/// Why a QP went to ERR on its own (not through `modify_qp`), for its owner to report as an
/// async event, as an HCA does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// One of its own send work requests failed; its completion carries this status.
    Fatal(WcStatus),
    /// A peer's request broke the protocol; it was NAKed as an invalid request.
    InvalidRequest,
    /// A peer's request broke an access rule; it was NAKed as a remote access error.
    Access,
}

/// What a QP needs from its owner while it runs.
pub(crate) struct Ctx<'a> {
    pub now: Instant,
    pub mrs: &'a mut MrTable,
    pub cqs: &'a mut [Cq],
    pub srqs: &'a mut SrqTable,
    pub counters: &'a mut Counters,
}

/// One queue pair. The fields the endpoint reads are public; the rest belong to this module
/// and the requester, completer and responder under it.
#[derive(Debug)]
pub(crate) struct Qp {
    pub qpn: u32,
    pub state: QpState,
    pub config: QpConfig,
    pub stats: QpStats,
    /// Set when a completion could not be queued; the owner reports it as an async event.
    pub cq_overflowed: bool,
    /// Set when the QP went to ERR on its own; the owner reports it as an async event.
    pub failure: Option<Failure>,
    /// Set when a QP on an SRQ entered ERR: it takes no more WQEs from the SRQ, and the
    /// owner reports that as an async event (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    pub last_wqe_reached: bool,
    /// Where its receives come from when not posted to the QP itself.
    pub srq: Option<SrqId>,
    qp_type: QpType,
    pd: PdId,
    send_cq: usize,
    recv_cq: usize,
    caps: QpCaps,
    sq_sig_all: bool,
    sq: SendQueue,
    comp: Completer,
    resp: Responder,
    timers: TimerTable,
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
        self.send_cq == cq || self.recv_cq == cq
    }

    /// A QP in RESET whose completions go to the CQs in slots `send_cq` and `recv_cq`.
    pub fn new(qpn: u32, init: QpInit, send_cq: usize, recv_cq: usize) -> Self {
        Qp {
            qpn,
            qp_type: init.qp_type,
            pd: init.pd,
            send_cq,
            recv_cq,
            caps: init.caps,
            sq_sig_all: init.sq_sig_all,
            state: QpState::Reset,
            config: QpConfig::default(),
            sq: SendQueue::default(),
            comp: Completer::default(),
            resp: Responder::default(),
            timers: TimerTable::default(),
            stats: QpStats::default(),
            cq_overflowed: false,
            failure: None,
            last_wqe_reached: false,
            srq: None,
        }
    }

    pub fn modify(&mut self, ctx: &mut Ctx, attr: &QpAttr) -> Result<(), ModifyQpError> {
        let to = check_modify(self.qp_type, self.state, attr)?;
        let config = &mut self.config;
        if let Some(access) = attr.access_flags {
            config.access = access;
        }
        if let Some(qkey) = attr.qkey {
            config.qkey = qkey;
        }
        if let Some(av) = attr.av {
            config.av = Some(av);
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
        if to != self.state {
            tracing::debug!(qpn = self.qpn, from = ?self.state, ?to, "QP state (modify_qp)");
        }
        match to {
            QpState::Err if self.state != QpState::Err => self.enter_error(ctx),
            QpState::Reset => {
                self.sq = SendQueue::default();
                self.comp = Completer::default();
                self.resp = Responder::default();
                self.timers = TimerTable::default();
                self.state = QpState::Reset;
            }
            _ => self.state = to,
        }
        Ok(())
    }

    #[inline]
    pub fn post_send(&mut self, ctx: &mut Ctx, wr: &SendWr) -> Result<(), PostError> {
        requester::post(self, ctx, wr)
    }

    pub fn post_recv(&mut self, ctx: &mut Ctx, wr: &RecvWr) -> Result<(), PostError> {
        responder::post(self, ctx, wr)
    }

    #[inline]
    pub fn handle_packet(&mut self, ctx: &mut Ctx, frame: &FrameRepr) {
        // Only the default partition exists (full or limited member), and a connected QP
        // hears only its peer (rxe's check_keys and check_addr).
        let connected = self.qp_type != QpType::Ud;
        if frame.bth.pkey & 0x7FFF != 0x7FFF || (connected && !self.is_from_peer(frame)) {
            tracing::debug!(
                qpn = self.qpn,
                pkey = frame.bth.pkey,
                source = ?frame.ip,
                "dropped: foreign P_Key or not from the connected peer"
            );
            self.stats.dropped += 1;
            return;
        }
        if frame.bth.opcode.info().is_request {
            responder::handle_request(self, ctx, frame);
        } else if frame.bth.opcode != Opcode::Cnp {
            self.handle_response(ctx, frame);
        }
    }

    fn handle_response(&mut self, ctx: &mut Ctx, frame: &FrameRepr) {
        let acked_before = self.sq.acked_psn();
        let Some(outcome) = completer::handle_response(self, ctx, frame) else {
            return;
        };
        self.apply(ctx, outcome);
        if self.state != QpState::Err {
            completer::settle(self, ctx, frame, acked_before);
        }
    }

    /// Carries out what the completer decided, in order; a CQ overflow on the way (which
    /// moves the QP to ERR and flushes the queue) ends it.
    fn apply(&mut self, ctx: &mut Ctx, outcome: Outcome) {
        for _ in 0..outcome.complete {
            self.complete_front(ctx);
            if self.state == QpState::Err {
                return;
            }
        }
        match outcome.then {
            Then::Nothing => {}
            Then::Retry { from, wait } => {
                if let Some(wait) = wait {
                    tracing::debug!(qpn = self.qpn, ?wait, resume = %from, "RNR wait");
                    self.timers.set(Timer::RnrWait, ctx.now + wait);
                } else {
                    ctx.counters.completer_retry_err += 1;
                }
                self.sq.rewind(from);
            }
            Then::Fail(status) => {
                tracing::debug!(qpn = self.qpn, ?status, "send work request failed");
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
        self.config.av.is_some_and(|av| av.dgid == source)
    }

    pub fn handle_timeout(&mut self, ctx: &mut Ctx) {
        let expired: Vec<Timer> = self.timers.expire(ctx.now).collect();
        for timer in expired {
            match timer {
                Timer::Retransmit => {
                    let outcome = completer::ack_timeout(self);
                    self.apply(ctx, outcome);
                }
                Timer::RnrWait => {}
            }
        }
    }

    /// What decides whether a post is accepted now.
    pub fn post_gate(&self) -> PostGate {
        PostGate {
            qp_type: self.qp_type,
            caps: self.caps,
            state: self.state,
            mtu: self.config.mtu,
            sq_len: self.sq.len(),
            rq_len: self.resp.rq_len(),
            has_srq: self.srq.is_some(),
        }
    }

    /// Writes the next packet to send into `out`, whose payload buffer is reused: responses
    /// first (they unblock the peer), then requests. `false` when there is nothing to send
    /// (`out` is then unspecified).
    #[inline]
    pub fn poll_packet(&mut self, ctx: &mut Ctx, out: &mut OutPacket) -> bool {
        responder::next_packet(self, ctx, out) || requester::next_packet(self, ctx, out)
    }

    /// What the responder has queued to send.
    pub fn responder_backlog(&self) -> ResponderBacklog {
        let limit = usize::from(self.config.max_dest_rd_atomic);
        ResponderBacklog {
            queued: self.resp.backlog(),
            bound: resources::Resources::backlog_bound(limit),
        }
    }

    pub fn next_timeout(&self) -> Option<Instant> {
        self.timers.next_deadline()
    }

    /// The address of a connected QP's peer (UD packets carry their own).
    fn connected_av(&self) -> AddressVector {
        self.config.av.unwrap_or(NO_ADDRESS)
    }

    /// Builds a packet to the connected peer.
    fn packet(&self, bth: bth::Repr, ext: ExtRepr, payload: Vec<u8>) -> OutPacket {
        OutPacket {
            bth,
            ext,
            payload,
            av: self.connected_av(),
        }
    }

    /// A BTH to the connected peer with the fields every packet shares.
    fn bth(&self, opcode: Opcode, psn: Psn, dest: Option<&UdDest>) -> bth::Repr {
        bth::Repr::new(
            opcode,
            dest.map_or(self.config.dest_qpn, |d| d.remote_qpn),
            psn,
        )
    }

    /// Queues a completion on `cq`; a full CQ moves the QP to ERR.
    #[inline(always)]
    fn complete(&mut self, ctx: &mut Ctx, cq: usize, completion: WorkCompletion) {
        let received = matches!(
            completion.opcode,
            WcOpcode::Recv | WcOpcode::RecvRdmaWithImm
        );
        if received && completion.status == WcStatus::Success {
            ctx.counters.rdma_recvs += 1;
        }
        if ctx.cqs[cq].push(completion).is_err() {
            self.cq_overflowed = true;
            if self.state != QpState::Err {
                self.enter_error(ctx);
            }
        }
    }

    /// Removes the front send WQE, which succeeded, and reports it if it is signaled.
    #[inline]
    fn complete_front(&mut self, ctx: &mut Ctx) {
        if self.sq.front().is_none() {
            return;
        }
        let completion = self.sq.success_of_front(self.qpn, self.sq_sig_all);
        count_send(ctx.counters, self.sq.front().map(|wqe| &wqe.wr));
        self.sq.pop_front();
        if let Some(completion) = completion {
            self.complete(ctx, self.send_cq, completion);
        }
    }

    /// Completes the send WQE at `index` with an error (earlier ones are flushed first, to
    /// keep completions in order) and moves the QP to ERR, which flushes the rest.
    fn fail_wqe(&mut self, ctx: &mut Ctx, index: usize, status: WcStatus) {
        if self.state != QpState::Err {
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
            let completion = send_queue::completion(self.qpn, &wqe.wr, status, 0);
            self.sq.pop_front();
            self.complete(ctx, self.send_cq, completion);
        }
        if self.state != QpState::Err {
            self.enter_error(ctx);
        }
    }

    /// Moves to ERR because of a peer's request, saying why.
    fn fail_by_peer(&mut self, ctx: &mut Ctx, failure: Failure) {
        if self.state != QpState::Err {
            self.failure = Some(failure);
            self.enter_error(ctx);
        }
    }

    /// Moves to ERR and flushes every outstanding work request, sends first, in order. A
    /// QP on an SRQ flushes only the WQE it took for a message under way; the SRQ's own
    /// stay for the other QPs.
    pub fn enter_error(&mut self, ctx: &mut Ctx) {
        tracing::debug!(qpn = self.qpn, from = ?self.state, failure = ?self.failure, "QP to ERR");
        self.state = QpState::Err;
        self.last_wqe_reached = self.srq.is_some();
        self.timers = TimerTable::default();
        let sends = self.sq.take_all();
        for wqe in sends.iter() {
            let completion = send_queue::completion(self.qpn, &wqe.wr, WcStatus::WrFlush, 0);
            self.complete(ctx, self.send_cq, completion);
        }
        let recvs = self.resp.take_receives();
        for wr in recvs.iter() {
            let completion = responder::recv_completion(self.qpn, wr, WcStatus::WrFlush);
            self.complete(ctx, self.recv_cq, completion);
        }
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
