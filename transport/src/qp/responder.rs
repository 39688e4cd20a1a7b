//! The responder: executes incoming requests in PSN order, answers duplicates, NAKs gaps
//! (once per gap) and errors, and acknowledges with coalescing.

use roce_wire::aeth::{self, CreditCount, NakCode, Syndrome};
use roce_wire::frame::IpRepr;
use roce_wire::opcode::{Operation, Position, Service, Trailer};
use roce_wire::{atomic_ack_eth, ExtRepr, FrameRepr, Opcode, Psn};

use super::common::{Ctx, Failure, OutPacket, PostError};
use super::resources::{Output, Owed, Resource, ResourceKind, Resources};
use super::Qp;
use crate::cq::{WcOpcode, WcStatus, WorkCompletion};
use crate::mr::{AtomicOp, Location, MrError};
use crate::qp_state::{QpState, QpType};
use crate::ring::Ring;
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
}

impl Responder {
    /// Expects the next request at `psn` (`rq_psn` of `modify_qp`).
    pub fn set_psn(&mut self, psn: Psn) {
        self.epsn = psn;
        self.ack_psn = psn;
    }

    /// Entries queued to send (see [`Resources::backlog`]).
    pub fn backlog(&self) -> usize {
        self.resources.backlog()
    }

    /// Receives posted and not yet completed.
    pub fn rq_len(&self) -> usize {
        self.rq.len()
    }

    /// Every receive not yet completed, oldest first (one a message is arriving into is
    /// the front), leaving none and no message under way.
    pub fn take_receives(&mut self) -> Ring<RecvWr> {
        self.in_message = None;
        std::mem::take(&mut self.rq)
    }
}

/// How a request failed.
enum Refusal {
    /// No receive posted: RNR NAK (RC) or drop (UC, UD).
    NotReady,
    /// A NAK that ends the connection, and the status of the receive at the front of the
    /// queue if the request consumed it.
    Fatal(NakCode, Option<WcStatus>),
}

/// `ibv_post_recv` for one work request.
pub(crate) fn post(qp: &mut Qp, ctx: &mut Ctx, wr: &RecvWr) -> Result<(), PostError> {
    qp.post_gate().check_recv(wr, 0)?;
    if qp.common.state == QpState::Err {
        let completion = recv_completion(qp.common.qpn, wr, WcStatus::WrFlush);
        qp.complete(ctx, qp.common.recv_cq, completion);
    } else {
        qp.resp.rq.push_slot().clone_from(wr);
    }
    Ok(())
}

/// Whether a receive waits for the message arriving now, at the front of the QP's own
/// queue: the receive source. A QP on an SRQ takes the SRQ's next WQE into its own queue
/// when it has none, and holds it there until the message completes.
fn receive_ready(qp: &mut Qp, ctx: &mut Ctx) -> bool {
    if let (true, Some(srq)) = (qp.resp.rq.is_empty(), qp.common.srq) {
        ctx.srqs.take_into(srq, &mut qp.resp.rq);
    }
    !qp.resp.rq.is_empty()
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
    }
}

/// Writes the next response, NAK or (coalesced) ACK to send into `out`; `false` if none.
pub(crate) fn next_packet(qp: &mut Qp, ctx: &Ctx, out: &mut OutPacket) -> bool {
    // Each turn either writes a packet or drops the front entry, so this ends.
    while let Some(entry) = qp.resp.resources.front() {
        match entry {
            Output::Ack { psn, syndrome, msn } => {
                qp.resp.resources.pop_front();
                out.replace_with(ack_packet(qp, psn, syndrome, msn));
                return true;
            }
            Output::Responses(first_psn) => {
                if next_response(qp, ctx, first_psn, out) {
                    return true;
                }
            }
        }
    }
    match qp.resp.pending_ack.take() {
        Some(psn) => {
            let ack = Syndrome::Ack(CreditCount::UNLIMITED);
            out.replace_with(ack_packet(qp, psn, ack, qp.resp.msn));
            true
        }
        None => false,
    }
}

fn ack_packet(qp: &Qp, psn: Psn, syndrome: Syndrome, msn: u32) -> OutPacket {
    let ext = ExtRepr {
        aeth: Some(aeth::Repr { syndrome, msn }),
        ..ExtRepr::default()
    };
    qp.common.packet(
        qp.common.bth(Opcode::RcAcknowledge, psn, None),
        ext,
        Vec::new(),
    )
}

/// Puts any ACK owed in the queue, so what follows it stays in PSN order.
fn flush_pending_ack(qp: &mut Qp) {
    if let Some(psn) = qp.resp.pending_ack.take() {
        let ack = Syndrome::Ack(CreditCount::UNLIMITED);
        qp.resp.resources.queue_ack(psn, ack, qp.resp.msn);
    }
}

fn nak(qp: &mut Qp, psn: Psn, syndrome: Syndrome) {
    tracing::debug!(qpn = qp.common.qpn, %psn, ?syndrome, "NAK sent");
    qp.common.stats.naks_sent += 1;
    flush_pending_ack(qp);
    qp.resp.resources.queue_ack(psn, syndrome, qp.resp.msn);
}

/// Writes the next response the resource at `first_psn` owes into `out`, building it from
/// memory now; `false` (and the entry is dropped) when it owes nothing more.
fn next_response(qp: &mut Qp, ctx: &Ctx, first_psn: Psn, out: &mut OutPacket) -> bool {
    let mtu = qp.common.config.mtu;
    let Some(resource) = qp.resp.resources.get_mut(first_psn) else {
        qp.resp.resources.pop_front();
        return false;
    };
    let Some(owed) = resource.owed else {
        qp.resp.resources.pop_front();
        return false;
    };
    let k = owed.next;
    let done = k + 1 >= resource.npsn;
    resource.owed = (!done).then_some(Owed {
        next: k + 1,
        ..owed
    });
    let resource = *resource;
    if done {
        qp.resp.resources.pop_front();
    }
    match resource.kind {
        ResourceKind::Atomic { original } => {
            out.replace_with(atomic_ack_packet(qp, first_psn, original, resource.msn));
        }
        ResourceKind::Read { address, rkey, len } => {
            let offset = u64::from(k) * mtu as u64;
            let chunk = (u64::from(len) - offset.min(u64::from(len))).min(mtu as u64) as u32;
            let position = Position::of(k - owed.start, resource.npsn - owed.start);
            let psn = first_psn + k;
            let read = AccessFlags::REMOTE_READ;
            // The region may have gone since the request was accepted.
            out.payload.clear();
            let copied =
                remote_access(qp, ctx, rkey, address + offset, chunk, read).and_then(|location| {
                    (ctx.mrs.append(location, chunk as usize, &mut out.payload))
                        .map_err(|_| Refusal::Fatal(NakCode::RemoteAccessError, None))
                });
            if copied.is_err() {
                tracing::debug!(qpn = qp.common.qpn, %psn, "NAK sent: READ of memory gone");
                qp.common.stats.naks_sent += 1;
                let nak = Syndrome::Nak(NakCode::RemoteAccessError);
                out.replace_with(ack_packet(qp, psn, nak, resource.msn));
                if let Some(resource) = qp.resp.resources.get_mut(first_psn) {
                    resource.owed = None;
                }
                if !done {
                    qp.resp.resources.pop_front();
                }
                return true;
            };
            let opcode = Opcode::find(
                Service::Rc,
                Operation::ReadResponse,
                position,
                Trailer::None,
            );
            let mut ext = ExtRepr::default();
            if position != Position::Middle {
                ext.aeth = Some(aeth::Repr {
                    syndrome: Syndrome::Ack(CreditCount::UNLIMITED),
                    msn: resource.msn,
                });
            }
            out.ext = ext;
            // RC has a READ response for every position (the opcode table's tests check),
            // so the fallback is never taken.
            out.bth = qp
                .common
                .bth(opcode.unwrap_or(Opcode::RcRdmaReadResponseOnly), psn, None);
            out.bth.pad_count = ((4 - chunk % 4) % 4) as u8;
            out.av = qp.common.connected_av();
        }
    }
    true
}

/// Handles a request addressed to this QP.
pub(crate) fn handle_request(qp: &mut Qp, ctx: &mut Ctx, frame: &FrameRepr) {
    let service_matches = matches!(
        (qp.common.qp_type, frame.bth.opcode.service()),
        (QpType::Rc, roce_wire::opcode::Service::Rc)
            | (QpType::Uc, roce_wire::opcode::Service::Uc)
            | (QpType::Ud, roce_wire::opcode::Service::Ud)
    );
    if !service_matches || !matches!(qp.common.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
        qp.common.stats.dropped += 1;
        return;
    }
    if qp.common.qp_type != QpType::Ud {
        ctx.counters.rcvd_pkts += 1; // a UD packet counts once its Q_Key matched
    }
    match qp.common.qp_type {
        QpType::Rc => rc_request(qp, ctx, frame),
        QpType::Uc => uc_request(qp, ctx, frame),
        QpType::Ud => ud_request(qp, ctx, frame),
    }
}

fn rc_request(qp: &mut Qp, ctx: &mut Ctx, frame: &FrameRepr) {
    let psn = frame.bth.psn;
    let ahead = psn.distance(qp.resp.epsn);
    if ahead > 0 {
        if !qp.resp.nak_sent {
            qp.resp.nak_sent = true;
            ctx.counters.out_of_seq_request += 1;
            let epsn = qp.resp.epsn;
            nak(qp, epsn, Syndrome::Nak(NakCode::PsnSequenceError));
        }
        qp.common.stats.dropped += 1;
        return;
    }
    if ahead < 0 {
        ctx.counters.duplicate_request += 1;
        return duplicate(qp, ctx, frame);
    }
    qp.resp.nak_sent = false;
    match execute(qp, ctx, frame) {
        Ok(()) => {}
        Err(Refusal::NotReady) => {
            let timer = qp.common.config.min_rnr_timer;
            ctx.counters.send_rnr_err += 1;
            nak(qp, psn, Syndrome::RnrNak(timer));
        }
        Err(Refusal::Fatal(code, receive)) => {
            nak(qp, psn, Syndrome::Nak(code));
            if let (Some(status), Some(wqe)) = (receive, qp.resp.rq.front()) {
                let completion = recv_completion(qp.common.qpn, wqe, status);
                qp.resp.rq.pop_front();
                qp.complete(ctx, qp.common.recv_cq, completion);
            }
            let failure = match code {
                NakCode::RemoteAccessError => Failure::Access,
                _ => Failure::InvalidRequest,
            };
            qp.fail_by_peer(ctx, failure);
        }
    }
}

/// A request with a PSN already executed: re-ACK SEND/WRITE, re-execute READ, replay the
/// atomic's saved result.
fn duplicate(qp: &mut Qp, ctx: &mut Ctx, frame: &FrameRepr) {
    let psn = frame.bth.psn;
    let resource = qp.resp.resources.find(psn).copied();
    let asked_again = match frame.bth.opcode.info().operation {
        Operation::ReadRequest => {
            let mtu = qp.common.config.mtu;
            frame.ext.reth.is_some_and(|reth| {
                let (address, rkey, len) = (reth.virtual_address, reth.rkey, reth.dma_length);
                let read = AccessFlags::REMOTE_READ;
                resource.is_some_and(|r| r.covers_read(psn, mtu, rkey, address, len))
                    && remote_access(qp, ctx, rkey, address, len, read).is_ok()
            })
        }
        Operation::CompareSwap | Operation::FetchAdd => {
            resource.is_some_and(|r| matches!(r.kind, ResourceKind::Atomic { .. }))
        }
        _ => {
            qp.resp.pending_ack = Some(qp.resp.ack_psn - 1);
            return;
        }
    };
    if asked_again {
        flush_pending_ack(qp);
        qp.resp.resources.restart(psn);
    } else {
        qp.common.stats.dropped += 1;
    }
}

/// Executes an in-order request; on success the expected PSN moves past it.
fn execute(qp: &mut Qp, ctx: &mut Ctx, frame: &FrameRepr) -> Result<(), Refusal> {
    let info = frame.bth.opcode.info();
    let (operation, position) = (info.operation, info.position);
    // FLUSH and ATOMIC WRITE are not implemented: invalid requests.
    if matches!(operation, Operation::Flush | Operation::AtomicWrite) {
        return Err(Refusal::Fatal(NakCode::InvalidRequest, None));
    }
    let continuing = match &qp.resp.in_message {
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
    let mtu = qp.common.config.mtu;
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
    let reads_allowed = qp.common.config.max_dest_rd_atomic > 0 || qp.common.qp_type != QpType::Rc;
    let read_or_atomic = operation == Operation::ReadRequest || operation.is_atomic();
    if read_or_atomic && !reads_allowed {
        return Err(Refusal::Fatal(NakCode::InvalidRequest, None));
    }
    match operation {
        Operation::Send => receive_send(qp, ctx, frame)?,
        Operation::Write => receive_write(qp, ctx, frame)?,
        Operation::ReadRequest => return read_request(qp, ctx, frame),
        Operation::CompareSwap | Operation::FetchAdd => {
            atomic(qp, ctx, frame)?;
            qp.resp.epsn = qp.resp.epsn + 1;
            qp.resp.ack_psn = qp.resp.epsn;
            return Ok(());
        }
        _ => return Err(Refusal::Fatal(NakCode::InvalidRequest, None)),
    }
    qp.resp.epsn = qp.resp.epsn + 1;
    qp.resp.ack_psn = qp.resp.epsn;
    if frame.bth.ack_req && qp.common.qp_type == QpType::Rc {
        qp.resp.pending_ack = Some(frame.bth.psn);
    }
    Ok(())
}

/// A new READ request becomes a resource whose responses are built as they are sent.
fn read_request(qp: &mut Qp, ctx: &mut Ctx, frame: &FrameRepr) -> Result<(), Refusal> {
    let reth = frame
        .ext
        .reth
        .ok_or(Refusal::Fatal(NakCode::InvalidRequest, None))?;
    let (address, rkey, len) = (reth.virtual_address, reth.rkey, reth.dma_length);
    remote_access(qp, ctx, rkey, address, len, AccessFlags::REMOTE_READ)?;
    let npsn = qp.common.config.packets(len);
    qp.resp.msn = qp.resp.msn.wrapping_add(1);
    let resource = Resource {
        first_psn: frame.bth.psn,
        npsn,
        msn: qp.resp.msn,
        kind: ResourceKind::Read { address, rkey, len },
        owed: Some(Owed { start: 0, next: 0 }),
    };
    remember(qp, resource);
    qp.resp.epsn = qp.resp.epsn + npsn;
    Ok(())
}

fn receive_send(qp: &mut Qp, ctx: &mut Ctx, frame: &FrameRepr) -> Result<(), Refusal> {
    let position = frame.bth.opcode.info().position;
    let received = if position.starts_message() {
        0
    } else {
        match qp.resp.in_message {
            Some(InMessage::Send { received }) => received,
            _ => return Err(Refusal::Fatal(NakCode::InvalidRequest, None)),
        }
    };
    // The message's receive: taken off the queue only when the message ends.
    if !receive_ready(qp, ctx) {
        return Err(Refusal::NotReady);
    }
    let Some(wqe) = qp.resp.rq.front() else {
        return Err(Refusal::NotReady);
    };
    if let Err(error) = ctx.mrs.scatter(
        qp.common.pd,
        &wqe.sg_list,
        u64::from(received),
        frame.payload,
    ) {
        let status = if error == MrError::OutOfBounds {
            WcStatus::LocalLength
        } else {
            WcStatus::LocalProtection
        };
        return Err(Refusal::Fatal(NakCode::InvalidRequest, Some(status)));
    }
    let received = received + frame.payload.len() as u32;
    if !position.ends_message() {
        qp.resp.in_message = Some(InMessage::Send { received });
        return Ok(());
    }
    let completion = WorkCompletion {
        byte_len: received,
        imm_data: frame.ext.immdt.map(|imm| imm.immediate),
        invalidated_rkey: frame.ext.ieth.map(|ieth| ieth.rkey),
        solicited: frame.bth.solicited,
        ..recv_completion(qp.common.qpn, wqe, WcStatus::Success)
    };
    qp.resp.rq.pop_front();
    qp.resp.in_message = None;
    qp.resp.msn = qp.resp.msn.wrapping_add(1);
    qp.complete(ctx, qp.common.recv_cq, completion);
    Ok(())
}

/// The first packet of a WRITE: its RETH names the whole message's target.
fn start_write(qp: &mut Qp, ctx: &Ctx, frame: &FrameRepr) -> Result<(), Refusal> {
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
            ctx,
            reth.rkey,
            reth.virtual_address,
            reth.dma_length,
            write,
        )?;
    }
    qp.resp.in_message = Some(InMessage::Write {
        address: reth.virtual_address,
        rkey: reth.rkey,
        remaining: reth.dma_length,
        length: reth.dma_length,
    });
    Ok(())
}

fn receive_write(qp: &mut Qp, ctx: &mut Ctx, frame: &FrameRepr) -> Result<(), Refusal> {
    let position = frame.bth.opcode.info().position;
    let has_imm = frame.bth.opcode.info().has_immediate;
    if position.starts_message() {
        start_write(qp, ctx, frame)?;
    }
    // A WRITE with immediate consumes a receive: refuse before touching memory.
    if has_imm && !receive_ready(qp, ctx) {
        if position.starts_message() {
            qp.resp.in_message = None;
        }
        return Err(Refusal::NotReady);
    }
    let Some(InMessage::Write {
        address,
        rkey,
        remaining,
        length,
    }) = qp.resp.in_message.take()
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
            .write(qp.common.pd, rkey, address, frame.payload, write)
            .map_err(|_| Refusal::Fatal(NakCode::RemoteAccessError, None))?;
    }
    if !ends {
        qp.resp.in_message = Some(InMessage::Write {
            address: address + u64::from(len),
            rkey,
            remaining: remaining - len,
            length,
        });
        return Ok(());
    }
    qp.resp.msn = qp.resp.msn.wrapping_add(1);
    if has_imm {
        let Some(wqe) = qp.resp.rq.front() else {
            return Err(Refusal::NotReady);
        };
        let completion = WorkCompletion {
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len: length,
            imm_data: frame.ext.immdt.map(|imm| imm.immediate),
            solicited: frame.bth.solicited,
            ..recv_completion(qp.common.qpn, wqe, WcStatus::Success)
        };
        qp.resp.rq.pop_front();
        qp.complete(ctx, qp.common.recv_cq, completion);
    }
    Ok(())
}

/// The first half of the responder's access check: the QP's own remote rights.
fn qp_permits(qp: &Qp, needed: AccessFlags) -> Result<(), Refusal> {
    if qp.common.config.access.contains(needed) {
        Ok(())
    } else {
        Err(Refusal::Fatal(NakCode::RemoteAccessError, None))
    }
}

/// The responder's access check, QP rights then R_Key, region and bounds: a violation is a
/// remote access error NAK.
fn remote_access(
    qp: &Qp,
    ctx: &Ctx,
    rkey: u32,
    address: u64,
    len: u32,
    needed: AccessFlags,
) -> Result<Location, Refusal> {
    qp_permits(qp, needed)?;
    ctx.mrs
        .check(qp.common.pd, rkey, address, u64::from(len), needed)
        .map_err(|_| Refusal::Fatal(NakCode::RemoteAccessError, None))
}

fn atomic(qp: &mut Qp, ctx: &mut Ctx, frame: &FrameRepr) -> Result<(), Refusal> {
    let op = frame
        .ext
        .atomic_eth
        .ok_or(Refusal::Fatal(NakCode::InvalidRequest, None))?;
    qp_permits(qp, AccessFlags::REMOTE_ATOMIC)?;
    let operation = match frame.bth.opcode {
        Opcode::RcCompareSwap => AtomicOp::CompareSwap {
            compare: op.compare,
            swap: op.swap_add,
        },
        _ => AtomicOp::FetchAdd(op.swap_add),
    };
    let original = ctx
        .mrs
        .atomic(qp.common.pd, op.rkey, op.virtual_address, operation)
        .map_err(|error| match error {
            MrError::Misaligned => Refusal::Fatal(NakCode::InvalidRequest, None),
            _ => Refusal::Fatal(NakCode::RemoteAccessError, None),
        })?;
    qp.resp.msn = qp.resp.msn.wrapping_add(1);
    let resource = Resource {
        first_psn: frame.bth.psn,
        npsn: 1,
        msn: qp.resp.msn,
        kind: ResourceKind::Atomic { original },
        owed: Some(Owed { start: 0, next: 0 }),
    };
    remember(qp, resource);
    Ok(())
}

fn atomic_ack_packet(qp: &Qp, psn: Psn, original: u64, msn: u32) -> OutPacket {
    let ext = ExtRepr {
        aeth: Some(aeth::Repr {
            syndrome: Syndrome::Ack(CreditCount::UNLIMITED),
            msn,
        }),
        atomic_ack_eth: Some(atomic_ack_eth::Repr { original }),
        ..ExtRepr::default()
    };
    qp.common.packet(
        qp.common.bth(Opcode::RcAtomicAcknowledge, psn, None),
        ext,
        Vec::new(),
    )
}

/// Keeps a new READ/atomic (behind any ACK owed), forgetting the oldest beyond
/// `max_dest_rd_atomic`.
fn remember(qp: &mut Qp, resource: Resource) {
    flush_pending_ack(qp);
    let limit = usize::from(qp.common.config.max_dest_rd_atomic);
    qp.resp.resources.add(resource, limit);
}

/// UC: no ACKs or NAKs; after a loss, drop until the next message starts.
fn uc_request(qp: &mut Qp, ctx: &mut Ctx, frame: &FrameRepr) {
    let starts = frame.bth.opcode.info().position.starts_message();
    if frame.bth.psn != qp.resp.epsn || qp.resp.uc_resync {
        abandon_message(qp);
        if !starts {
            qp.resp.uc_resync = true;
            qp.common.stats.dropped += 1;
            return;
        }
        qp.resp.uc_resync = false;
        qp.resp.epsn = frame.bth.psn;
    }
    if execute(qp, ctx, frame).is_err() {
        // A receive the failed packet was filling stays at the front for the next message.
        abandon_message(qp);
        qp.resp.uc_resync = true;
        qp.resp.epsn = frame.bth.psn + 1;
        qp.common.stats.dropped += 1;
    }
}

/// Gives up the message under way; a receive it was filling is still the queue's front,
/// for the next message.
fn abandon_message(qp: &mut Qp) {
    qp.resp.in_message = None;
}

/// UD: one packet per message, a Q_Key check, and the GRH area in front of the data.
fn ud_request(qp: &mut Qp, ctx: &mut Ctx, frame: &FrameRepr) {
    let Some(deth) = frame.ext.deth else { return };
    if deth.qkey == qp.common.config.qkey {
        ctx.counters.rcvd_pkts += 1;
    }
    if deth.qkey != qp.common.config.qkey || !receive_ready(qp, ctx) {
        tracing::debug!(
            qpn = qp.common.qpn,
            qkey = deth.qkey,
            "UD dropped: wrong Q_Key or no receive"
        );
        qp.common.stats.dropped += 1;
        return;
    }
    let mut grh = [0u8; GRH_LEN];
    let udp_len = 8
        + roce_wire::bth::HEADER_LEN
        + ExtRepr::buffer_len(frame.bth.opcode)
        + frame.payload.len()
        + usize::from(frame.bth.pad_count)
        + roce_wire::icrc::ICRC_LEN;
    let written = match frame.ip {
        IpRepr::V4(_) => frame.ip.emit(udp_len, &mut grh[20..]),
        IpRepr::V6(_) => frame.ip.emit(udp_len, &mut grh[..]),
    };
    let Some(wqe) = qp.resp.rq.front() else {
        return;
    };
    let scattered = written.is_ok()
        && ctx.mrs.scatter(qp.common.pd, &wqe.sg_list, 0, &grh).is_ok()
        && ctx
            .mrs
            .scatter(qp.common.pd, &wqe.sg_list, GRH_LEN as u64, frame.payload)
            .is_ok();
    if !scattered {
        qp.common.stats.dropped += 1;
        return;
    }
    let completion = WorkCompletion {
        byte_len: (GRH_LEN + frame.payload.len()) as u32,
        imm_data: frame.ext.immdt.map(|imm| imm.immediate),
        src_qp: deth.src_qpn,
        solicited: frame.bth.solicited,
        ..recv_completion(qp.common.qpn, wqe, WcStatus::Success)
    };
    qp.resp.rq.pop_front();
    qp.complete(ctx, qp.common.recv_cq, completion);
}
