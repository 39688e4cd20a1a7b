//! The responder: executes incoming requests in PSN order, answers duplicates, NAKs gaps
//! (once per gap) and errors, and acknowledges with coalescing. SENDs to a QP on a
//! tag-matching SRQ are `tagged`'s.

mod tagged;

use roce_wire::aeth::{self, CreditCount, NakCode, Syndrome};
use roce_wire::frame::IpRepr;
use roce_wire::opcode::{Operation, Position, Service};
use roce_wire::{atomic_ack_eth, ExtRepr, FrameRepr, Psn};

use super::common::{response_opcode, Common, Ctx, Failure, Lent, OutPacket, NO_CQ};
use super::resources::{Output, Owed, Resource, ResourceKind, Resources};
use super::selective::Reorder;
use crate::cq::{NetworkHeader, TmInfo, WcOpcode, WcStatus, WorkCompletion};
use crate::mr::{AtomicOp, Location, MrError, PdId};
use crate::qp_state::{QpState, QpType};
use crate::ring::Ring;
use crate::srq::SrqId;
use crate::wr::RecvWr;
use crate::AccessFlags;

/// Bytes at the start of a UD receive buffer that hold the GRH (or, for IPv4, the IPv4
/// header in its last 20 bytes), as verbs requires.
pub const GRH_LEN: usize = 40;

/// A multi-packet message being received.
#[derive(Debug)]
enum InMessage {
    /// Into the receive at the front of the queue, which stays there until the message ends.
    Send { received: u32 },
    Write {
        address: u64,
        rkey: u32,
        remaining: u32,
        length: u32,
    },
}

/// Receive-queue and responder state.
#[derive(Debug, Default)]
pub(crate) struct Responder {
    /// Expected PSN of the next new request.
    epsn: Psn,
    /// The PSN after the last SEND, WRITE or atomic executed: duplicates are acknowledged
    /// with the one before it, as rxe does, so a duplicate's ACK never names a READ's PSN
    /// (which would complete that READ at an rxe requester without its data).
    ack_psn: Psn,
    /// Requests completed (the AETH's MSN).
    msn: u32,
    rq: Ring<RecvWr>,
    in_message: Option<InMessage>,
    /// A sequence NAK was sent for the current gap.
    nak_sent: bool,
    /// READ/atomic resources and the responses, ACKs and NAKs owed, in order.
    resources: Resources,
    /// PSN of the newest ACK owed; later ACKs replace it (coalescing).
    pending_ack: Option<Psn>,
    /// UC: a packet was lost; drop until the next FIRST or ONLY.
    uc_resync: bool,
    /// Selective repeat, once the peer offered it: requests kept ahead of a gap.
    reorder: Option<Reorder>,
    /// The highest PSN of a READ response or atomic result sent so far.
    responses_through: Psn,
    /// Tag matching: where the SEND under way goes.
    tagged: Option<tagged::Delivery>,
    /// Tag matching: a rendezvous READ for the QP to send, from the request just matched.
    rendezvous: Option<RendezvousRead>,
    /// XRC target: the SRQ of the message under way, which its every packet must name.
    xrc_srq: Option<SrqId>,
}

impl Responder {
    /// The peer offered selective repeat: keep out-of-order requests from now on.
    pub fn keep_out_of_order(&mut self) {
        self.reorder.get_or_insert_with(Reorder::default);
    }

    /// Expects the next request at `psn` (`rq_psn` of `modify_qp`).
    pub fn set_psn(&mut self, psn: Psn) {
        self.epsn = psn;
        self.ack_psn = psn;
        self.responses_through = psn - 1;
    }

    /// Entries queued to send (see [`Resources::backlog`]).
    pub fn backlog(&self) -> usize {
        self.resources.backlog()
    }

    /// Queues a receive work request the QP admitted.
    pub fn post(&mut self, wr: &RecvWr) {
        self.rq.push_slot().clone_from(wr);
    }

    /// Receives posted and not yet completed.
    pub fn rq_len(&self) -> usize {
        self.rq.len()
    }

    /// Every receive not yet completed, oldest first (one a message is arriving into is
    /// the front), leaving none and no message under way.
    pub fn take_receives(&mut self) -> Ring<RecvWr> {
        self.in_message = None;
        self.xrc_srq = None;
        std::mem::take(&mut self.rq)
    }

    /// The rendezvous READ the last request asked for, if it was a matched rendezvous
    /// request: the QP sends it.
    pub fn take_rendezvous(&mut self) -> Option<RendezvousRead> {
        self.rendezvous.take()
    }
}

pub(crate) use tagged::{abandon as abandon_tagged, flush as flush_tagged, RendezvousRead};

/// How a request failed.
enum Refusal {
    /// No receive posted: RNR NAK (RC) or drop (UC, UD).
    NotReady,
    /// A NAK that ends the connection, and the status of the receive at the front of the
    /// queue if the request consumed it.
    Fatal(NakCode, Option<WcStatus>),
}

/// Whether a receive waits for the message arriving now, at the front of the QP's own
/// queue: the receive source. A QP on an SRQ takes the SRQ's next WQE into its own queue
/// when it has none, and holds it there until the message completes.
fn receive_ready(resp: &mut Responder, qp: &mut Common, ctx: &mut Ctx) -> bool {
    if let (true, Some(srq)) = (resp.rq.is_empty(), qp.srq) {
        ctx.srqs.take_into(srq, &mut resp.rq);
    }
    !resp.rq.is_empty()
}

/// The completion of receive `wr` on QP `qpn`, before what the message adds to it.
pub(crate) fn recv_completion(qpn: u32, wr: &RecvWr, status: WcStatus) -> WorkCompletion {
    WorkCompletion {
        wr_id: wr.wr_id,
        status,
        opcode: WcOpcode::Recv,
        byte_len: 0,
        imm_data: None,
        invalidated_rkey: None,
        qp_num: qpn,
        src_qp: 0,
        solicited: false,
        network_header: None,
        tm: TmInfo::NONE,
    }
}

/// Writes the next response, NAK or (coalesced) ACK to send into `out`; `false` if none.
pub(crate) fn next_packet(
    resp: &mut Responder,
    qp: &mut Common,
    ctx: &Ctx,
    out: &mut OutPacket,
) -> bool {
    // Each turn either writes a packet or drops the front entry, so this ends.
    while let Some(entry) = resp.resources.front() {
        match entry {
            Output::Ack { psn, syndrome, msn } => {
                resp.resources.pop_front();
                out.replace_with(ack_packet(qp, psn, syndrome, msn));
                return true;
            }
            Output::Responses(first_psn) => {
                if next_response(resp, qp, ctx, first_psn, out) {
                    return true;
                }
            }
        }
    }
    match resp.pending_ack.take() {
        Some(psn) => {
            let ack = Syndrome::Ack(CreditCount::UNLIMITED);
            out.replace_with(ack_packet(qp, psn, ack, resp.msn));
            true
        }
        None => false,
    }
}

fn ack_packet(qp: &Common, psn: Psn, syndrome: Syndrome, msn: u32) -> OutPacket {
    let ext = ExtRepr {
        aeth: Some(aeth::Repr { syndrome, msn }),
        ..ExtRepr::default()
    };
    let opcode = response_opcode(qp.qp_type, Operation::Acknowledge, Position::Only);
    qp.packet(qp.bth(opcode, psn, None), ext, Vec::new())
}

/// Puts any ACK owed in the queue, so what follows it stays in PSN order.
fn flush_pending_ack(resp: &mut Responder) {
    if let Some(psn) = resp.pending_ack.take() {
        let ack = Syndrome::Ack(CreditCount::UNLIMITED);
        resp.resources.queue_ack(psn, ack, resp.msn);
    }
}

fn nak(resp: &mut Responder, qp: &mut Common, psn: Psn, syndrome: Syndrome) {
    tracing::debug!(qpn = qp.qpn, %psn, ?syndrome, "NAK sent");
    qp.stats.naks_sent += 1;
    flush_pending_ack(resp);
    resp.resources.queue_ack(psn, syndrome, resp.msn);
}

/// Writes the next response the resource at `first_psn` owes into `out`, building it from
/// memory now; `false` (and the entry is dropped) when it owes nothing more.
fn next_response(
    resp: &mut Responder,
    qp: &mut Common,
    ctx: &Ctx,
    first_psn: Psn,
    out: &mut OutPacket,
) -> bool {
    let mtu = qp.config.mtu;
    let Some(resource) = resp.resources.get_mut(first_psn) else {
        resp.resources.pop_front();
        return false;
    };
    let Some(owed) = resource.owed else {
        resp.resources.pop_front();
        return false;
    };
    let k = owed.next;
    let done = k + 1 >= owed.end.min(resource.npsn);
    resource.owed = (!done).then_some(Owed {
        next: k + 1,
        ..owed
    });
    let resource = *resource;
    if done {
        resp.resources.pop_front();
    }
    count_response(resp, qp, first_psn + k);
    match resource.kind {
        ResourceKind::Atomic { original } => {
            out.replace_with(atomic_ack_packet(qp, first_psn, original, resource.msn));
        }
        ResourceKind::AtomicWrite => {
            // As rxe answers it: a READ response of no data, with the ACK's AETH.
            let ext = ExtRepr {
                aeth: Some(aeth::Repr {
                    syndrome: Syndrome::Ack(CreditCount::UNLIMITED),
                    msn: resource.msn,
                }),
                ..ExtRepr::default()
            };
            let opcode = response_opcode(qp.qp_type, Operation::ReadResponse, Position::Only);
            let bth = qp.bth(opcode, first_psn, None);
            out.replace_with(qp.packet(bth, ext, Vec::new()));
        }
        ResourceKind::Read {
            address,
            rkey,
            len,
            pd,
        } => {
            let offset = u64::from(k) * mtu as u64;
            let chunk = (u64::from(len) - offset.min(u64::from(len))).min(mtu as u64) as u32;
            let position = Position::of(k - owed.start, owed.end.min(resource.npsn) - owed.start);
            let psn = first_psn + k;
            let read = AccessFlags::REMOTE_READ;
            // The region may have gone since the request was accepted. The bytes are lent:
            // the provider copies them from the region into the frame.
            out.payload.clear();
            out.lent = None;
            let located = remote_access(qp, pd, ctx, rkey, address + offset, chunk, read);
            if let Ok(location) = located {
                out.lent = (chunk > 0).then_some(Lent::Region {
                    location,
                    len: chunk as usize,
                });
            } else {
                tracing::debug!(qpn = qp.qpn, %psn, "NAK sent: READ of memory gone");
                qp.stats.naks_sent += 1;
                let nak = Syndrome::Nak(NakCode::RemoteAccessError);
                out.replace_with(ack_packet(qp, psn, nak, resource.msn));
                if let Some(resource) = resp.resources.get_mut(first_psn) {
                    resource.owed = None;
                }
                if !done {
                    resp.resources.pop_front();
                }
                return true;
            };
            let opcode = response_opcode(qp.qp_type, Operation::ReadResponse, position);
            let mut ext = ExtRepr::default();
            if position != Position::Middle {
                ext.aeth = Some(aeth::Repr {
                    syndrome: Syndrome::Ack(CreditCount::UNLIMITED),
                    msn: resource.msn,
                });
            }
            out.ext = ext;
            out.bth = qp.bth(opcode, psn, None);
            out.bth.pad_count = ((4 - chunk % 4) % 4) as u8;
            out.av = qp.connected_av();
        }
    }
    true
}

/// Counts a response packet sent again (a duplicate READ or atomic asked for it).
fn count_response(resp: &mut Responder, qp: &mut Common, psn: Psn) {
    if psn.distance(resp.responses_through) <= 0 {
        qp.stats.responses_resent += 1;
    } else {
        resp.responses_through = psn;
    }
}

/// Handles a request addressed to this QP; a request that breaks the connection returns why,
/// for the QP to enter ERR.
pub(crate) fn handle_request(
    resp: &mut Responder,
    qp: &mut Common,
    ctx: &mut Ctx,
    frame: &FrameRepr,
) -> Option<Failure> {
    // An XRC initiator has no responder.
    let service_matches = matches!(
        (qp.qp_type, frame.bth.opcode.service()),
        (QpType::Rc, Service::Rc)
            | (QpType::Uc, Service::Uc)
            | (QpType::Ud, Service::Ud)
            | (QpType::XrcRecv, Service::Xrc)
    );
    if !service_matches || !matches!(qp.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
        qp.stats.dropped += 1;
        return None;
    }
    if qp.qp_type != QpType::Ud {
        ctx.counters.rcvd_pkts += 1; // a UD packet counts once its Q_Key matched
    }
    match qp.qp_type {
        QpType::Rc => return rc_request(resp, qp, ctx, frame),
        QpType::XrcRecv => return xrc_request(resp, qp, ctx, frame),
        QpType::Uc => uc_request(resp, qp, ctx, frame),
        QpType::Ud => ud_request(resp, qp, ctx, frame),
        QpType::XrcSend => {}
    }
    None
}

/// An XRC target: the request is for the XRC SRQ its XRCETH names, which must be of the
/// target's domain (and, within a message, the SRQ its first packet named). That SRQ gives
/// the receive, the PD its keys are checked in and the CQ it completes in; then the request
/// runs as RC's. A new request naming another SRQ is NAKed as an invalid request (counted in
/// the NAKs sent) and the target enters ERR; a duplicate or early one is dropped.
fn xrc_request(
    resp: &mut Responder,
    qp: &mut Common,
    ctx: &mut Ctx,
    frame: &FrameRepr,
) -> Option<Failure> {
    let named = frame
        .ext
        .xrceth
        .zip(qp.xrcd)
        .and_then(|(xrceth, xrcd)| ctx.srqs.xrc_target(xrceth.srqn, xrcd))
        .filter(|(srq, _)| resp.in_message.is_none() || resp.xrc_srq == Some(*srq));
    let Some((srq, xrc)) = named else {
        tracing::debug!(qpn = qp.qpn, xrceth = ?frame.ext.xrceth, "XRCETH names no SRQ of the domain");
        if frame.bth.psn == resp.epsn {
            nak(
                resp,
                qp,
                frame.bth.psn,
                Syndrome::Nak(NakCode::InvalidRequest),
            );
            return Some(Failure::InvalidRequest);
        }
        qp.stats.dropped += 1;
        return None;
    };
    qp.pd = xrc.pd;
    qp.srq = Some(srq);
    qp.recv_cq = xrc.cq;
    let failure = rc_request(resp, qp, ctx, frame);
    // Between messages the target has no SRQ; a receive held for a message under way keeps
    // its CQ, where it is flushed if the target fails meanwhile.
    qp.srq = None;
    resp.xrc_srq = resp.in_message.is_some().then_some(srq);
    if resp.rq.is_empty() {
        qp.recv_cq = NO_CQ;
        qp.pd = PdId::NONE;
    }
    failure
}

#[inline(always)]
fn rc_request(
    resp: &mut Responder,
    qp: &mut Common,
    ctx: &mut Ctx,
    frame: &FrameRepr,
) -> Option<Failure> {
    let psn = frame.bth.psn;
    let ahead = psn.distance(resp.epsn);
    if ahead > 0 {
        // Selective repeat: keep it, and name the gap every time.
        if let Some(reorder) = &mut resp.reorder {
            if reorder.keep(frame, ahead) {
                ctx.counters.out_of_seq_request += 1;
                name_gap(resp, qp);
                return None;
            }
        }
        if !resp.nak_sent {
            resp.nak_sent = true;
            ctx.counters.out_of_seq_request += 1;
            let epsn = resp.epsn;
            nak(resp, qp, epsn, Syndrome::Nak(NakCode::PsnSequenceError));
        }
        qp.stats.dropped += 1;
        return None;
    }
    if ahead < 0 {
        ctx.counters.duplicate_request += 1;
        duplicate(resp, qp, ctx, frame);
        if resp.reorder.as_ref().is_some_and(Reorder::holding) {
            name_gap(resp, qp);
        }
        return None;
    }
    let failure = rc_in_order(resp, qp, ctx, frame);
    if failure.is_none() && resp.reorder.as_ref().is_some_and(Reorder::holding) {
        return drain(resp, qp, ctx);
    }
    failure
}

/// Executes the request at the expected PSN.
fn rc_in_order(
    resp: &mut Responder,
    qp: &mut Common,
    ctx: &mut Ctx,
    frame: &FrameRepr,
) -> Option<Failure> {
    let psn = frame.bth.psn;
    resp.nak_sent = false;
    match execute(resp, qp, ctx, frame) {
        Ok(()) => {}
        Err(Refusal::NotReady) => {
            let timer = qp.config.min_rnr_timer;
            ctx.counters.send_rnr_err += 1;
            nak(resp, qp, psn, Syndrome::RnrNak(timer));
        }
        Err(Refusal::Fatal(code, receive)) => {
            nak(resp, qp, psn, Syndrome::Nak(code));
            if let (Some(status), Some(wqe)) = (receive, resp.rq.front()) {
                let completion = recv_completion(qp.qpn, wqe, status);
                resp.rq.pop_front();
                qp.complete(ctx, qp.recv_cq, completion);
            }
            return Some(match code {
                NakCode::RemoteAccessError => Failure::Access,
                _ => Failure::InvalidRequest,
            });
        }
    }
    None
}

/// Selective repeat: executes the requests kept that are now in order; then names the
/// next gap, or acknowledges all of them. A refusal (RNR) forgets what was kept, which
/// the requester sends again when it goes back to the refused PSN.
fn drain(resp: &mut Responder, qp: &mut Common, ctx: &mut Ctx) -> Option<Failure> {
    let mut executed = false;
    loop {
        let epsn = resp.epsn;
        let Some(taken) = resp.reorder.as_mut().and_then(|reorder| reorder.take(epsn)) else {
            break;
        };
        let failure = rc_in_order(resp, qp, ctx, &taken.frame());
        if failure.is_some() || resp.epsn == epsn {
            if let Some(reorder) = &mut resp.reorder {
                reorder.clear();
            }
            return failure;
        }
        executed = true;
    }
    if resp.reorder.as_ref().is_some_and(Reorder::holding) {
        name_gap(resp, qp);
    } else if executed && resp.pending_ack.is_none() {
        resp.pending_ack = Some(resp.ack_psn - 1);
    }
    None
}

/// Selective repeat: a NAK for the expected PSN while requests are kept beyond it. It
/// acknowledges everything before, so it replaces any ACK owed: an ACK alone would tell
/// the requester that nothing was kept.
fn name_gap(resp: &mut Responder, qp: &mut Common) {
    resp.pending_ack = None;
    let epsn = resp.epsn;
    nak(resp, qp, epsn, Syndrome::Nak(NakCode::PsnSequenceError));
}

/// A request with a PSN already executed: re-ACK SEND/WRITE, re-execute READ, replay the
/// atomic's saved result or the ATOMIC WRITE's answer (never the write itself).
fn duplicate(resp: &mut Responder, qp: &mut Common, ctx: &mut Ctx, frame: &FrameRepr) {
    let psn = frame.bth.psn;
    let resource = resp.resources.find(psn).copied();
    // Response packets asked for again: one for an atomic.
    let mut asked = 1;
    let asked_again = match frame.bth.opcode.info().operation {
        Operation::ReadRequest => {
            let mtu = qp.config.mtu;
            frame.ext.reth.is_some_and(|reth| {
                let (address, rkey, len) = (reth.virtual_address, reth.rkey, reth.dma_length);
                let read = AccessFlags::REMOTE_READ;
                let part = resource.and_then(|r| r.read_part(psn, mtu, rkey, address, len));
                asked = part.unwrap_or(1);
                part.is_some() && remote_access(qp, qp.pd, ctx, rkey, address, len, read).is_ok()
            })
        }
        Operation::CompareSwap | Operation::FetchAdd => {
            resource.is_some_and(|r| matches!(r.kind, ResourceKind::Atomic { .. }))
        }
        Operation::AtomicWrite => {
            resource.is_some_and(|r| matches!(r.kind, ResourceKind::AtomicWrite))
        }
        _ => {
            resp.pending_ack = Some(resp.ack_psn - 1);
            return;
        }
    };
    if asked_again {
        flush_pending_ack(resp);
        resp.resources.restart(psn, asked);
    } else {
        qp.stats.dropped += 1;
    }
}

/// Executes an in-order request; on success the expected PSN moves past it.
fn execute(
    resp: &mut Responder,
    qp: &mut Common,
    ctx: &mut Ctx,
    frame: &FrameRepr,
) -> Result<(), Refusal> {
    let info = frame.bth.opcode.info();
    let (operation, position) = (info.operation, info.position);
    // FLUSH is not implemented: an invalid request.
    if operation == Operation::Flush {
        return Err(Refusal::Fatal(NakCode::InvalidRequest, None));
    }
    let continuing = match &resp.in_message {
        Some(InMessage::Send { .. }) => Some(Operation::Send),
        Some(InMessage::Write { .. }) => Some(Operation::Write),
        None => None,
    };
    let sequence_ok = if position.starts_message() {
        continuing.is_none()
    } else {
        continuing == Some(operation)
    };
    if !sequence_ok {
        return Err(Refusal::Fatal(NakCode::InvalidRequest, None));
    }
    // FIRST and MIDDLE carry exactly one MTU; LAST between one byte and one MTU.
    let mtu = qp.config.mtu;
    let len = frame.payload.len();
    let length_ok = match position {
        Position::First | Position::Middle => len == mtu,
        Position::Last => (1..=mtu).contains(&len),
        Position::Only => len <= mtu,
    };
    let too_long = frame.ext.reth.is_some_and(|reth| reth.dma_length > 1 << 31);
    if !length_ok || too_long {
        return Err(Refusal::Fatal(NakCode::InvalidRequest, None));
    }
    let reads_allowed = qp.config.max_dest_rd_atomic > 0 || !qp.qp_type.is_reliable();
    let read_or_atomic = matches!(operation, Operation::ReadRequest | Operation::AtomicWrite)
        || operation.is_atomic();
    if read_or_atomic && !reads_allowed {
        return Err(Refusal::Fatal(NakCode::InvalidRequest, None));
    }
    match operation {
        Operation::Send if tagged::applies(qp, ctx) => tagged::receive(resp, qp, ctx, frame)?,
        Operation::Send => receive_send(resp, qp, ctx, frame)?,
        Operation::Write => receive_write(resp, qp, ctx, frame)?,
        Operation::ReadRequest => return read_request(resp, qp, ctx, frame),
        Operation::CompareSwap | Operation::FetchAdd => {
            atomic(resp, qp, ctx, frame)?;
            resp.epsn = resp.epsn + 1;
            resp.ack_psn = resp.epsn;
            return Ok(());
        }
        Operation::AtomicWrite => {
            atomic_write(resp, qp, ctx, frame)?;
            resp.epsn = resp.epsn + 1;
            resp.ack_psn = resp.epsn;
            return Ok(());
        }
        _ => return Err(Refusal::Fatal(NakCode::InvalidRequest, None)),
    }
    resp.epsn = resp.epsn + 1;
    resp.ack_psn = resp.epsn;
    if frame.bth.ack_req && qp.qp_type.is_reliable() {
        resp.pending_ack = Some(frame.bth.psn);
    }
    Ok(())
}

/// A new READ request becomes a resource whose responses are built as they are sent.
fn read_request(
    resp: &mut Responder,
    qp: &mut Common,
    ctx: &mut Ctx,
    frame: &FrameRepr,
) -> Result<(), Refusal> {
    let reth = frame
        .ext
        .reth
        .ok_or(Refusal::Fatal(NakCode::InvalidRequest, None))?;
    let (address, rkey, len) = (reth.virtual_address, reth.rkey, reth.dma_length);
    remote_access(qp, qp.pd, ctx, rkey, address, len, AccessFlags::REMOTE_READ)?;
    let npsn = qp.config.packets(len);
    resp.msn = resp.msn.wrapping_add(1);
    let resource = Resource {
        first_psn: frame.bth.psn,
        npsn,
        msn: resp.msn,
        kind: ResourceKind::Read {
            address,
            rkey,
            len,
            pd: qp.pd,
        },
        owed: Some(Owed::all(npsn)),
    };
    remember(resp, qp, resource);
    resp.epsn = resp.epsn + npsn;
    Ok(())
}

fn receive_send(
    resp: &mut Responder,
    qp: &mut Common,
    ctx: &mut Ctx,
    frame: &FrameRepr,
) -> Result<(), Refusal> {
    let position = frame.bth.opcode.info().position;
    let received = if position.starts_message() {
        0
    } else {
        match resp.in_message {
            Some(InMessage::Send { received }) => received,
            _ => return Err(Refusal::Fatal(NakCode::InvalidRequest, None)),
        }
    };
    // The message's receive: taken off the queue only when the message ends.
    if !receive_ready(resp, qp, ctx) {
        return Err(Refusal::NotReady);
    }
    let Some(wqe) = resp.rq.front() else {
        return Err(Refusal::NotReady);
    };
    if ctx
        .mrs
        .scatter(qp.pd, &wqe.sg_list, u64::from(received), frame.payload)
        .is_err()
    {
        // A message longer than the receive is the sender's error (class C, as rxe's
        // RESPST_ERR_LENGTH); a receive whose own keys, PD, ranges or pages fail is ours: the
        // sender hears Remote Operational Error (rxe's RESPST_ERR_MALFORMED_WQE).
        let room: u64 = wqe.sg_list.iter().map(|sge| u64::from(sge.length)).sum();
        let needed = u64::from(received) + frame.payload.len() as u64;
        return Err(if needed > room {
            Refusal::Fatal(NakCode::InvalidRequest, Some(WcStatus::LocalLength))
        } else {
            Refusal::Fatal(
                NakCode::RemoteOperationalError,
                Some(WcStatus::LocalProtection),
            )
        });
    }
    let received = received + frame.payload.len() as u32;
    if !position.ends_message() {
        resp.in_message = Some(InMessage::Send { received });
        return Ok(());
    }
    if let Some(ieth) = frame.ext.ieth {
        invalidate(qp, ctx, ieth.rkey)?;
    }
    let completion = WorkCompletion {
        byte_len: received,
        imm_data: frame.ext.immdt.map(|imm| imm.immediate),
        invalidated_rkey: frame.ext.ieth.map(|ieth| ieth.rkey),
        solicited: frame.bth.solicited,
        ..recv_completion(qp.qpn, wqe, WcStatus::Success)
    };
    resp.rq.pop_front();
    resp.in_message = None;
    resp.msn = resp.msn.wrapping_add(1);
    qp.complete(ctx, qp.recv_cq, completion);
    Ok(())
}

/// The first packet of a WRITE: its RETH names the whole message's target.
fn start_write(
    resp: &mut Responder,
    qp: &mut Common,
    ctx: &Ctx,
    frame: &FrameRepr,
) -> Result<(), Refusal> {
    let reth = frame
        .ext
        .reth
        .ok_or(Refusal::Fatal(NakCode::InvalidRequest, None))?;
    // An ONLY packet carrying the whole message is checked once, as it is written.
    let only = frame.bth.opcode.info().position == Position::Only;
    if !only || frame.payload.len() != reth.dma_length as usize {
        let write = AccessFlags::REMOTE_WRITE;
        remote_access(
            qp,
            qp.pd,
            ctx,
            reth.rkey,
            reth.virtual_address,
            reth.dma_length,
            write,
        )?;
    }
    resp.in_message = Some(InMessage::Write {
        address: reth.virtual_address,
        rkey: reth.rkey,
        remaining: reth.dma_length,
        length: reth.dma_length,
    });
    Ok(())
}

fn receive_write(
    resp: &mut Responder,
    qp: &mut Common,
    ctx: &mut Ctx,
    frame: &FrameRepr,
) -> Result<(), Refusal> {
    let position = frame.bth.opcode.info().position;
    let has_imm = frame.bth.opcode.info().has_immediate;
    if position.starts_message() {
        start_write(resp, qp, ctx, frame)?;
    }
    // A WRITE with immediate consumes a receive: refuse before touching memory.
    if has_imm && !receive_ready(resp, qp, ctx) {
        if position.starts_message() {
            resp.in_message = None;
        }
        return Err(Refusal::NotReady);
    }
    let Some(InMessage::Write {
        address,
        rkey,
        remaining,
        length,
    }) = resp.in_message.take()
    else {
        return Err(Refusal::Fatal(NakCode::InvalidRequest, None));
    };
    let len = frame.payload.len() as u32;
    let ends = position.ends_message();
    if len > remaining || (ends && len != remaining) {
        return Err(Refusal::Fatal(NakCode::InvalidRequest, None));
    }
    if len > 0 {
        let write = AccessFlags::REMOTE_WRITE;
        qp_permits(qp, write)?;
        ctx.mrs
            .write_remote(qp.pd, qp.qpn, rkey, address, frame.payload, write)
            .map_err(|_| Refusal::Fatal(NakCode::RemoteAccessError, None))?;
    }
    if !ends {
        resp.in_message = Some(InMessage::Write {
            address: address + u64::from(len),
            rkey,
            remaining: remaining - len,
            length,
        });
        return Ok(());
    }
    resp.msn = resp.msn.wrapping_add(1);
    if has_imm {
        let Some(wqe) = resp.rq.front() else {
            return Err(Refusal::NotReady);
        };
        let completion = WorkCompletion {
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len: length,
            imm_data: frame.ext.immdt.map(|imm| imm.immediate),
            solicited: frame.bth.solicited,
            ..recv_completion(qp.qpn, wqe, WcStatus::Success)
        };
        resp.rq.pop_front();
        qp.complete(ctx, qp.recv_cq, completion);
    }
    Ok(())
}

/// A SEND with invalidate frees the type 2 memory window it names, which must be bound by
/// this QP (rxe's `invalidate_rkey`). Any other key (a region's, another QP's or PD's
/// window, a stale one) is IBTA's class J error: the receive completes with
/// `IBV_WC_REM_INV_REQ_ERR`, the request is NAKed as invalid and the QP enters ERR (rxe
/// acknowledges it instead; its requester then completes the SEND successfully).
fn invalidate(qp: &Common, ctx: &mut Ctx, rkey: u32) -> Result<(), Refusal> {
    ctx.mrs
        .invalidate(qp.pd, Some(qp.qpn), rkey)
        .map_err(|error| {
            tracing::debug!(qpn = qp.qpn, rkey, %error, "SEND with invalidate refused");
            Refusal::Fatal(
                NakCode::InvalidRequest,
                Some(WcStatus::RemoteInvalidRequest),
            )
        })
}

/// The first half of the responder's access check: the QP's own remote rights.
fn qp_permits(qp: &Common, needed: AccessFlags) -> Result<(), Refusal> {
    if qp.config.access.contains(needed) {
        Ok(())
    } else {
        Err(Refusal::Fatal(NakCode::RemoteAccessError, None))
    }
}

/// The responder's access check, QP rights then R_Key, region and bounds in `pd`: a
/// violation is a remote access error NAK.
fn remote_access(
    qp: &Common,
    pd: PdId,
    ctx: &Ctx,
    rkey: u32,
    address: u64,
    len: u32,
    needed: AccessFlags,
) -> Result<Location, Refusal> {
    qp_permits(qp, needed)?;
    ctx.mrs
        .check_remote(pd, qp.qpn, rkey, address, u64::from(len), needed)
        .map_err(|_| Refusal::Fatal(NakCode::RemoteAccessError, None))
}

fn atomic(
    resp: &mut Responder,
    qp: &mut Common,
    ctx: &mut Ctx,
    frame: &FrameRepr,
) -> Result<(), Refusal> {
    let op = frame
        .ext
        .atomic_eth
        .ok_or(Refusal::Fatal(NakCode::InvalidRequest, None))?;
    qp_permits(qp, AccessFlags::REMOTE_ATOMIC)?;
    let operation = match frame.bth.opcode.info().operation {
        Operation::CompareSwap => AtomicOp::CompareSwap {
            compare: op.compare,
            swap: op.swap_add,
        },
        _ => AtomicOp::FetchAdd(op.swap_add),
    };
    let original = ctx
        .mrs
        .atomic_remote(qp.pd, qp.qpn, op.rkey, op.virtual_address, operation)
        .map_err(|error| match error {
            MrError::Misaligned => Refusal::Fatal(NakCode::InvalidRequest, None),
            _ => Refusal::Fatal(NakCode::RemoteAccessError, None),
        })?;
    resp.msn = resp.msn.wrapping_add(1);
    let resource = Resource {
        first_psn: frame.bth.psn,
        npsn: 1,
        msn: resp.msn,
        kind: ResourceKind::Atomic { original },
        owed: Some(Owed::all(1)),
    };
    remember(resp, qp, resource);
    Ok(())
}

/// ATOMIC WRITE: its 8 bytes stored in one atomic store at the RETH's address, which must be
/// 8-byte aligned in a region the QP may write; kept as a resource so that a duplicate gets
/// the answer again without storing again.
fn atomic_write(
    resp: &mut Responder,
    qp: &mut Common,
    ctx: &mut Ctx,
    frame: &FrameRepr,
) -> Result<(), Refusal> {
    let invalid = Refusal::Fatal(NakCode::InvalidRequest, None);
    let reth = frame.ext.reth.ok_or(invalid)?;
    let Ok(data) = <[u8; 8]>::try_from(frame.payload) else {
        return Err(Refusal::Fatal(NakCode::InvalidRequest, None));
    };
    if reth.dma_length != 8 {
        return Err(Refusal::Fatal(NakCode::InvalidRequest, None));
    }
    let store = AtomicOp::Write(u64::from_ne_bytes(data));
    qp_permits(qp, store.needs())?;
    ctx.mrs
        .atomic_remote(qp.pd, qp.qpn, reth.rkey, reth.virtual_address, store)
        .map_err(|error| match error {
            MrError::Misaligned => Refusal::Fatal(NakCode::InvalidRequest, None),
            _ => Refusal::Fatal(NakCode::RemoteAccessError, None),
        })?;
    resp.msn = resp.msn.wrapping_add(1);
    let resource = Resource {
        first_psn: frame.bth.psn,
        npsn: 1,
        msn: resp.msn,
        kind: ResourceKind::AtomicWrite,
        owed: Some(Owed::all(1)),
    };
    remember(resp, qp, resource);
    Ok(())
}

fn atomic_ack_packet(qp: &Common, psn: Psn, original: u64, msn: u32) -> OutPacket {
    let ext = ExtRepr {
        aeth: Some(aeth::Repr {
            syndrome: Syndrome::Ack(CreditCount::UNLIMITED),
            msn,
        }),
        atomic_ack_eth: Some(atomic_ack_eth::Repr { original }),
        ..ExtRepr::default()
    };
    let opcode = response_opcode(qp.qp_type, Operation::AtomicAcknowledge, Position::Only);
    qp.packet(qp.bth(opcode, psn, None), ext, Vec::new())
}

/// Keeps a new READ/atomic (behind any ACK owed), forgetting the oldest beyond
/// `max_dest_rd_atomic`.
fn remember(resp: &mut Responder, qp: &mut Common, resource: Resource) {
    flush_pending_ack(resp);
    let limit = usize::from(qp.config.max_dest_rd_atomic);
    resp.resources.add(resource, limit);
}

/// UC: no ACKs or NAKs; after a loss, drop until the next message starts.
fn uc_request(resp: &mut Responder, qp: &mut Common, ctx: &mut Ctx, frame: &FrameRepr) {
    let starts = frame.bth.opcode.info().position.starts_message();
    if frame.bth.psn != resp.epsn || resp.uc_resync {
        abandon_message(resp);
        if !starts {
            resp.uc_resync = true;
            qp.stats.dropped += 1;
            return;
        }
        resp.uc_resync = false;
        resp.epsn = frame.bth.psn;
    }
    if execute(resp, qp, ctx, frame).is_err() {
        // A receive the failed packet was filling stays at the front for the next message.
        abandon_message(resp);
        resp.uc_resync = true;
        resp.epsn = frame.bth.psn + 1;
        qp.stats.dropped += 1;
    }
}

/// Gives up the message under way; a receive it was filling is still the queue's front,
/// for the next message.
fn abandon_message(resp: &mut Responder) {
    resp.in_message = None;
}

/// UD: one packet per message, a Q_Key check, and the GRH area in front of the data.
fn ud_request(resp: &mut Responder, qp: &mut Common, ctx: &mut Ctx, frame: &FrameRepr) {
    let Some(deth) = frame.ext.deth else { return };
    if deth.qkey == qp.config.qkey {
        ctx.counters.rcvd_pkts += 1;
    }
    if deth.qkey != qp.config.qkey || !receive_ready(resp, qp, ctx) {
        tracing::debug!(
            qpn = qp.qpn,
            qkey = deth.qkey,
            "UD dropped: wrong Q_Key or no receive"
        );
        qp.stats.dropped += 1;
        return;
    }
    let mut grh = [0u8; GRH_LEN];
    let udp_len = 8
        + roce_wire::bth::HEADER_LEN
        + ExtRepr::buffer_len(frame.bth.opcode)
        + frame.payload.len()
        + usize::from(frame.bth.pad_count)
        + roce_wire::icrc::ICRC_LEN;
    let (written, network_header) = match frame.ip {
        IpRepr::V4(_) => (frame.ip.emit(udp_len, &mut grh[20..]), NetworkHeader::Ipv4),
        IpRepr::V6(_) => (frame.ip.emit(udp_len, &mut grh[..]), NetworkHeader::Ipv6),
    };
    let Some(wqe) = resp.rq.front() else {
        return;
    };
    let scattered = written.is_ok()
        && ctx.mrs.scatter(qp.pd, &wqe.sg_list, 0, &grh).is_ok()
        && ctx
            .mrs
            .scatter(qp.pd, &wqe.sg_list, GRH_LEN as u64, frame.payload)
            .is_ok();
    if !scattered {
        qp.stats.dropped += 1;
        return;
    }
    let completion = WorkCompletion {
        byte_len: (GRH_LEN + frame.payload.len()) as u32,
        imm_data: frame.ext.immdt.map(|imm| imm.immediate),
        src_qp: deth.src_qpn,
        solicited: frame.bth.solicited,
        network_header: Some(network_header),
        ..recv_completion(qp.qpn, wqe, WcStatus::Success)
    };
    resp.rq.pop_front();
    qp.complete(ctx, qp.recv_cq, completion);
}
