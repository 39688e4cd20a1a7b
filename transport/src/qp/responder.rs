//! The responder: executes incoming requests in PSN order, answers duplicates, NAKs gaps
//! (once per gap) and errors, and acknowledges with coalescing.

use std::collections::VecDeque;

use roce_wire::aeth::{self, CreditCount, NakCode, Syndrome};
use roce_wire::frame::IpRepr;
use roce_wire::opcode::Position;
use roce_wire::{atomic_ack_eth, ExtRepr, FrameRepr, Opcode, Psn};

use super::{Ctx, OutPacket, PostError, Qp};
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

/// A READ or atomic kept to answer duplicates (max_dest_rd_atomic of them).
#[derive(Debug, Clone, Copy)]
struct Resource {
    first_psn: Psn,
    npsn: u32,
    kind: ResourceKind,
}

#[derive(Debug, Clone, Copy)]
enum ResourceKind {
    /// A READ of `len` bytes at `address` through `rkey`: a duplicate may ask again for any
    /// tail of it (a retry from a lost response), and for nothing else.
    Read { address: u64, rkey: u32, len: u32 },
    /// An atomic and the value it found.
    Atomic { original: u64 },
}

impl Resource {
    /// Whether a duplicate READ request at `psn` for `len` bytes at `address` asks for the
    /// part of this READ that begins at its packet `psn`.
    fn covers_read(&self, psn: Psn, mtu: usize, rkey: u32, address: u64, len: u32) -> bool {
        let ResourceKind::Read {
            address: start,
            rkey: key,
            len: total,
        } = self.kind
        else {
            return false;
        };
        let offset = psn.distance(self.first_psn) as u64 * mtu as u64;
        key == rkey
            && address == start + offset
            && u64::from(len) == u64::from(total) - offset.min(u64::from(total))
    }
}

/// Receive-queue and responder state.
#[derive(Debug, Default)]
pub(crate) struct Responder {
    /// Expected PSN of the next new request.
    pub epsn: Psn,
    /// The PSN after the last SEND, WRITE or atomic executed: duplicates are acknowledged
    /// with the one before it, as rxe does, so a duplicate's ACK never names a READ's PSN
    /// (which would complete that READ at an rxe requester without its data).
    pub ack_psn: Psn,
    /// Requests completed (the AETH's MSN).
    pub msn: u32,
    pub(crate) rq: Ring<RecvWr>,
    in_message: Option<InMessage>,
    /// A sequence NAK was sent for the current gap.
    nak_sent: bool,
    resources: VecDeque<Resource>,
    /// Responses and NAKs waiting to be sent, in order.
    out: VecDeque<OutPacket>,
    /// PSN of the newest ACK owed; later ACKs replace it (coalescing).
    pending_ack: Option<Psn>,
    /// UC: a packet was lost; drop until the next FIRST or ONLY.
    uc_resync: bool,
}

impl Responder {
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
    if qp.state == QpState::Err {
        let completion = recv_completion(qp, wr, WcStatus::WrFlush);
        qp.complete(ctx, qp.recv_cq, completion);
    } else {
        qp.resp.rq.push_slot().clone_from(wr);
    }
    Ok(())
}

fn recv_completion(qp: &Qp, wr: &RecvWr, status: WcStatus) -> WorkCompletion {
    WorkCompletion {
        wr_id: wr.wr_id,
        status,
        opcode: WcOpcode::Recv,
        byte_len: 0,
        imm_data: None,
        invalidated_rkey: None,
        qp_num: qp.qpn,
        src_qp: 0,
        solicited: false,
    }
}

/// Writes the next response, NAK or (coalesced) ACK to send into `out`; `false` if none.
pub(crate) fn next_packet(qp: &mut Qp, out: &mut OutPacket) -> bool {
    let packet = match qp.resp.out.pop_front() {
        Some(packet) => packet,
        None => match qp.resp.pending_ack.take() {
            Some(psn) => ack_packet(qp, psn, Syndrome::Ack(CreditCount::UNLIMITED)),
            None => return false,
        },
    };
    out.replace_with(packet);
    true
}

fn ack_packet(qp: &Qp, psn: Psn, syndrome: Syndrome) -> OutPacket {
    let ext = ExtRepr {
        aeth: Some(aeth::Repr {
            syndrome,
            msn: qp.resp.msn,
        }),
        ..ExtRepr::default()
    };
    qp.packet(qp.bth(Opcode::RcAcknowledge, psn, None), ext, Vec::new())
}

/// Queues a packet behind any ACK already owed, so responses stay in PSN order.
fn respond(qp: &mut Qp, packet: OutPacket) {
    if let Some(psn) = qp.resp.pending_ack.take() {
        let ack = ack_packet(qp, psn, Syndrome::Ack(CreditCount::UNLIMITED));
        qp.resp.out.push_back(ack);
    }
    qp.resp.out.push_back(packet);
}

fn nak(qp: &mut Qp, psn: Psn, syndrome: Syndrome) {
    qp.stats.naks_sent += 1;
    let packet = ack_packet(qp, psn, syndrome);
    respond(qp, packet);
}

/// Handles a request addressed to this QP.
pub(crate) fn handle_request(qp: &mut Qp, ctx: &mut Ctx, frame: &FrameRepr) {
    let service_matches = matches!(
        (qp.qp_type, frame.bth.opcode.service()),
        (QpType::Rc, roce_wire::opcode::Service::Rc)
            | (QpType::Uc, roce_wire::opcode::Service::Uc)
            | (QpType::Ud, roce_wire::opcode::Service::Ud)
    );
    if !service_matches || !matches!(qp.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
        qp.stats.dropped += 1;
        return;
    }
    match qp.qp_type {
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
            let epsn = qp.resp.epsn;
            nak(qp, epsn, Syndrome::Nak(NakCode::PsnSequenceError));
        }
        qp.stats.dropped += 1;
        return;
    }
    if ahead < 0 {
        return duplicate(qp, ctx, frame);
    }
    qp.resp.nak_sent = false;
    match execute(qp, ctx, frame) {
        Ok(()) => {}
        Err(Refusal::NotReady) => {
            let timer = qp.config.min_rnr_timer;
            nak(qp, psn, Syndrome::RnrNak(timer));
        }
        Err(Refusal::Fatal(code, receive)) => {
            nak(qp, psn, Syndrome::Nak(code));
            if let (Some(status), Some(wqe)) = (receive, qp.resp.rq.front()) {
                let completion = recv_completion(qp, wqe, status);
                qp.resp.rq.pop_front();
                qp.complete(ctx, qp.recv_cq, completion);
            }
            qp.enter_error(ctx);
        }
    }
}

/// A request with a PSN already executed: re-ACK SEND/WRITE, re-execute READ, replay the
/// atomic's saved result.
fn duplicate(qp: &mut Qp, ctx: &mut Ctx, frame: &FrameRepr) {
    let psn = frame.bth.psn;
    let resource = qp.resp.resources.iter().rev().find(|r| {
        let offset = psn.distance(r.first_psn);
        offset >= 0 && (offset as u32) < r.npsn
    });
    match frame.bth.opcode {
        Opcode::RcRdmaReadRequest => {
            let mtu = qp.config.mtu;
            let asked = frame.ext.reth.filter(|reth| {
                resource.is_some_and(|r| {
                    r.covers_read(psn, mtu, reth.rkey, reth.virtual_address, reth.dma_length)
                })
            });
            match asked {
                Some(reth) => {
                    let (address, rkey, len) = (reth.virtual_address, reth.rkey, reth.dma_length);
                    let _ = read_responses(qp, ctx, psn, address, rkey, len);
                }
                None => qp.stats.dropped += 1,
            }
        }
        Opcode::RcCompareSwap | Opcode::RcFetchAdd => match resource.map(|r| r.kind) {
            Some(ResourceKind::Atomic { original }) => {
                let packet = atomic_ack_packet(qp, psn, original);
                respond(qp, packet);
            }
            _ => qp.stats.dropped += 1,
        },
        _ => qp.resp.pending_ack = Some(qp.resp.ack_psn - 1),
    }
}

/// What an opcode asks of the responder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    Write,
    Read,
    Atomic,
}

/// What the responder does with a request opcode; `None` for the ones it does not implement
/// (FLUSH, ATOMIC WRITE), which are NAKed as invalid requests.
fn kind(opcode: Opcode) -> Option<Kind> {
    use Opcode::*;
    Some(match opcode {
        RcRdmaReadRequest => Kind::Read,
        RcCompareSwap | RcFetchAdd => Kind::Atomic,
        RcRdmaWriteFirst
        | RcRdmaWriteMiddle
        | RcRdmaWriteLast
        | RcRdmaWriteLastWithImmediate
        | RcRdmaWriteOnly
        | RcRdmaWriteOnlyWithImmediate
        | UcRdmaWriteFirst
        | UcRdmaWriteMiddle
        | UcRdmaWriteLast
        | UcRdmaWriteLastWithImmediate
        | UcRdmaWriteOnly
        | UcRdmaWriteOnlyWithImmediate => Kind::Write,
        RcSendFirst
        | RcSendMiddle
        | RcSendLast
        | RcSendLastWithImmediate
        | RcSendOnly
        | RcSendOnlyWithImmediate
        | RcSendLastWithInvalidate
        | RcSendOnlyWithInvalidate
        | UcSendFirst
        | UcSendMiddle
        | UcSendLast
        | UcSendLastWithImmediate
        | UcSendOnly
        | UcSendOnlyWithImmediate
        | UdSendOnly
        | UdSendOnlyWithImmediate => Kind::Send,
        _ => return None,
    })
}

/// Executes an in-order request; on success the expected PSN moves past it.
fn execute(qp: &mut Qp, ctx: &mut Ctx, frame: &FrameRepr) -> Result<(), Refusal> {
    let opcode = frame.bth.opcode;
    let position = opcode.info().position;
    let kind = kind(opcode).ok_or(Refusal::Fatal(NakCode::InvalidRequest, None))?;
    let continuing = match &qp.resp.in_message {
        Some(InMessage::Send { .. }) => Some(Kind::Send),
        Some(InMessage::Write { .. }) => Some(Kind::Write),
        None => None,
    };
    let sequence_ok = if position.starts_message() {
        continuing.is_none()
    } else {
        continuing == Some(kind)
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
    let reads_allowed = qp.config.max_dest_rd_atomic > 0 || qp.qp_type != QpType::Rc;
    if matches!(kind, Kind::Read | Kind::Atomic) && !reads_allowed {
        return Err(Refusal::Fatal(NakCode::InvalidRequest, None));
    }
    match kind {
        Kind::Send => receive_send(qp, ctx, frame)?,
        Kind::Write => receive_write(qp, ctx, frame)?,
        Kind::Read => {
            let reth = frame
                .ext
                .reth
                .ok_or(Refusal::Fatal(NakCode::InvalidRequest, None))?;
            let npsn = read_responses(
                qp,
                ctx,
                frame.bth.psn,
                reth.virtual_address,
                reth.rkey,
                reth.dma_length,
            )?;
            let kind = ResourceKind::Read {
                address: reth.virtual_address,
                rkey: reth.rkey,
                len: reth.dma_length,
            };
            remember(
                qp,
                Resource {
                    first_psn: frame.bth.psn,
                    npsn,
                    kind,
                },
            );
            qp.resp.msn = qp.resp.msn.wrapping_add(1);
            qp.resp.epsn = qp.resp.epsn + npsn;
            return Ok(());
        }
        Kind::Atomic => {
            atomic(qp, ctx, frame)?;
            qp.resp.epsn = qp.resp.epsn + 1;
            qp.resp.ack_psn = qp.resp.epsn;
            return Ok(());
        }
    }
    qp.resp.epsn = qp.resp.epsn + 1;
    qp.resp.ack_psn = qp.resp.epsn;
    if frame.bth.ack_req && qp.qp_type == QpType::Rc {
        qp.resp.pending_ack = Some(frame.bth.psn);
    }
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
    let Some(wqe) = qp.resp.rq.front() else {
        return Err(Refusal::NotReady);
    };
    if let Err(error) = ctx
        .mrs
        .scatter(qp.pd, &wqe.sg_list, u64::from(received), frame.payload)
    {
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
        ..recv_completion(qp, wqe, WcStatus::Success)
    };
    qp.resp.rq.pop_front();
    qp.resp.in_message = None;
    qp.resp.msn = qp.resp.msn.wrapping_add(1);
    qp.complete(ctx, qp.recv_cq, completion);
    Ok(())
}

fn receive_write(qp: &mut Qp, ctx: &mut Ctx, frame: &FrameRepr) -> Result<(), Refusal> {
    let position = frame.bth.opcode.info().position;
    let has_imm = frame.bth.opcode.info().has_immediate;
    if position.starts_message() {
        let reth = frame
            .ext
            .reth
            .ok_or(Refusal::Fatal(NakCode::InvalidRequest, None))?;
        // An ONLY packet carrying the whole message is checked once, as it is written.
        let whole = position == Position::Only && frame.payload.len() == reth.dma_length as usize;
        if !whole {
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
    }
    // A WRITE with immediate consumes a receive: refuse before touching memory.
    if has_imm && qp.resp.rq.is_empty() {
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
            .write(qp.pd, rkey, address, frame.payload, write)
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
            ..recv_completion(qp, wqe, WcStatus::Success)
        };
        qp.resp.rq.pop_front();
        qp.complete(ctx, qp.recv_cq, completion);
    }
    Ok(())
}

/// The first half of the responder's access check: the QP's own remote rights.
fn qp_permits(qp: &Qp, needed: AccessFlags) -> Result<(), Refusal> {
    if qp.config.access.contains(needed) {
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
        .check(qp.pd, rkey, address, u64::from(len), needed)
        .map_err(|_| Refusal::Fatal(NakCode::RemoteAccessError, None))
}

/// Queues the READ responses for `len` bytes at `address`, starting at `psn`; returns how
/// many PSNs they use.
fn read_responses(
    qp: &mut Qp,
    ctx: &mut Ctx,
    psn: Psn,
    address: u64,
    rkey: u32,
    len: u32,
) -> Result<u32, Refusal> {
    let location = remote_access(qp, ctx, rkey, address, len, AccessFlags::REMOTE_READ)?;
    let mtu = qp.config.mtu;
    let npsn = qp.config.packets(len);
    let msn = qp.resp.msn.wrapping_add(1);
    for k in 0..npsn {
        let opcode = match (k, npsn) {
            (_, 1) => Opcode::RcRdmaReadResponseOnly,
            (0, _) => Opcode::RcRdmaReadResponseFirst,
            (i, n) if i + 1 == n => Opcode::RcRdmaReadResponseLast,
            _ => Opcode::RcRdmaReadResponseMiddle,
        };
        let offset = k as usize * mtu;
        let chunk = (len as usize - offset).min(mtu);
        let at = crate::mr::Location {
            key: location.key,
            offset: location.offset + offset,
        };
        let mut payload = Vec::with_capacity(chunk);
        ctx.mrs
            .append(at, chunk, &mut payload)
            .map_err(|_| Refusal::Fatal(NakCode::RemoteAccessError, None))?;
        let mut ext = ExtRepr::default();
        if opcode != Opcode::RcRdmaReadResponseMiddle {
            ext.aeth = Some(aeth::Repr {
                syndrome: Syndrome::Ack(CreditCount::UNLIMITED),
                msn,
            });
        }
        let mut bth = qp.bth(opcode, psn + k, None);
        bth.pad_count = ((4 - chunk % 4) % 4) as u8;
        let packet = qp.packet(bth, ext, payload);
        respond(qp, packet);
    }
    Ok(npsn)
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
        .atomic(qp.pd, op.rkey, op.virtual_address, operation)
        .map_err(|error| match error {
            MrError::Misaligned => Refusal::Fatal(NakCode::InvalidRequest, None),
            _ => Refusal::Fatal(NakCode::RemoteAccessError, None),
        })?;
    let kind = ResourceKind::Atomic { original };
    remember(
        qp,
        Resource {
            first_psn: frame.bth.psn,
            npsn: 1,
            kind,
        },
    );
    qp.resp.msn = qp.resp.msn.wrapping_add(1);
    let packet = atomic_ack_packet(qp, frame.bth.psn, original);
    respond(qp, packet);
    Ok(())
}

fn atomic_ack_packet(qp: &Qp, psn: Psn, original: u64) -> OutPacket {
    let ext = ExtRepr {
        aeth: Some(aeth::Repr {
            syndrome: Syndrome::Ack(CreditCount::UNLIMITED),
            msn: qp.resp.msn,
        }),
        atomic_ack_eth: Some(atomic_ack_eth::Repr { original }),
        ..ExtRepr::default()
    };
    qp.packet(
        qp.bth(Opcode::RcAtomicAcknowledge, psn, None),
        ext,
        Vec::new(),
    )
}

/// Keeps a READ/atomic for duplicate handling, forgetting the oldest beyond the limit.
fn remember(qp: &mut Qp, resource: Resource) {
    let limit = usize::from(qp.config.max_dest_rd_atomic.max(1));
    while qp.resp.resources.len() >= limit {
        qp.resp.resources.pop_front();
    }
    qp.resp.resources.push_back(resource);
}

/// UC: no ACKs or NAKs; after a loss, drop until the next message starts.
fn uc_request(qp: &mut Qp, ctx: &mut Ctx, frame: &FrameRepr) {
    let starts = frame.bth.opcode.info().position.starts_message();
    if frame.bth.psn != qp.resp.epsn || qp.resp.uc_resync {
        abandon_message(qp);
        if !starts {
            qp.resp.uc_resync = true;
            qp.stats.dropped += 1;
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
        qp.stats.dropped += 1;
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
    if deth.qkey != qp.config.qkey || qp.resp.rq.is_empty() {
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
    let written = match frame.ip {
        IpRepr::V4(_) => frame.ip.emit(udp_len, &mut grh[20..]),
        IpRepr::V6(_) => frame.ip.emit(udp_len, &mut grh[..]),
    };
    let Some(wqe) = qp.resp.rq.front() else {
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
        ..recv_completion(qp, wqe, WcStatus::Success)
    };
    qp.resp.rq.pop_front();
    qp.complete(ctx, qp.recv_cq, completion);
}
