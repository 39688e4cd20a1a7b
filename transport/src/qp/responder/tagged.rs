//! SENDs to an RC QP on a tag-matching SRQ ([`crate::tm`]): the TMH at the start of the
//! first packet's payload says where the message goes, and the message completes on the
//! SRQ's CQ with tag matching's opcodes and flags. A matched rendezvous request is
//! acknowledged like any SEND; the READ of its data is handed to the QP, which sends it.
//!
//! A request without a whole TMH (a SEND of fewer than 16 bytes), with an opcode rdma-core
//! does not define, or a matched rendezvous request without a whole RVH is malformed: it is
//! NAKed as an invalid request (the QP enters ERR) and counted in the SRQ's
//! [`TmStats::malformed`](crate::tm::TmStats::malformed).

use roce_wire::aeth::NakCode;
use roce_wire::opcode::Position;
use roce_wire::{rvh, tmh, FrameRepr};

use super::{receive_ready, InMessage, Refusal, Responder};
use crate::cq::{TmFlags, TmInfo, WcOpcode, WcStatus, WorkCompletion};
use crate::limits::LIMITS;

use crate::qp::common::{Common, Ctx};
use crate::srq::SrqId;
use crate::tm::{message_completion, Arrival, TagBuffer};
use crate::wr::SendWr;

/// The tagged message under way on a QP, and where it goes.
#[derive(Debug)]
pub(super) struct Delivery {
    target: Target,
    /// What the TMH said; a match reports its tag and `app_ctx`.
    tmh: tmh::Repr,
    /// The SRQ's CQ slot, where it completes.
    cq: usize,
    srq: SrqId,
}

#[derive(Debug)]
enum Target {
    /// After its TMH into a matched tag's buffer, completing with `status` (success, or a
    /// rendezvous request left to the program).
    Tag { buffer: TagBuffer, status: WcStatus },
    /// Whole, TMH included, into the ordinary receive at the front of the QP's queue.
    Receive { opcode: WcOpcode, flags: TmFlags },
}

/// What a message's last packet adds to its completion.
#[derive(Debug, Clone, Copy, Default)]
struct Last {
    imm: Option<u32>,
    solicited: bool,
}

/// A rendezvous READ the responder asks its QP to send (see [`Responder::take_rendezvous`]).
#[derive(Debug)]
pub(crate) struct RendezvousRead {
    /// The handle of the tag it reads into.
    pub handle: u32,
    pub wr: SendWr,
}

/// Whether the QP's SENDs are tag matching's: it is on a tag-matching SRQ.
pub(super) fn applies(qp: &Common, ctx: &Ctx) -> bool {
    qp.srq.is_some_and(|srq| ctx.srqs.tm(srq).is_some())
}

/// Receives one packet of a SEND (its sequence and length already checked).
pub(super) fn receive(
    resp: &mut Responder,
    qp: &mut Common,
    ctx: &mut Ctx,
    frame: &FrameRepr,
) -> Result<(), Refusal> {
    let position = frame.bth.opcode.info().position;
    let received = if position.starts_message() {
        match begin(resp, qp, ctx, frame)? {
            Some(delivery) => resp.tagged = Some(delivery),
            // A rendezvous request: done with once matched.
            None => return Ok(()),
        }
        0
    } else {
        match (&resp.in_message, &resp.tagged) {
            (Some(InMessage::Send { received }), Some(_)) => *received,
            _ => return Err(Refusal::Fatal(NakCode::InvalidRequest, None)),
        }
    };
    let Some(delivery) = resp.tagged.as_ref() else {
        return Err(Refusal::Fatal(NakCode::InvalidRequest, None));
    };
    let scattered = match &delivery.target {
        Target::Tag { buffer, .. } => {
            // The TMH is the first packet's first 16 bytes, not data.
            let (offset, data) = match received.checked_sub(tmh::HEADER_LEN as u32) {
                Some(offset) => (offset, frame.payload),
                None => (0, &frame.payload[tmh::HEADER_LEN..]),
            };
            ctx.mrs
                .scatter(qp.pd, &buffer.sg_list, u64::from(offset), data)
                .map_err(|_| u64::from(offset) + data.len() as u64 > buffer.room())
        }
        Target::Receive { .. } => match resp.rq.front() {
            Some(wqe) => (ctx.mrs)
                .scatter(qp.pd, &wqe.sg_list, u64::from(received), frame.payload)
                .map_err(|_| {
                    let room: u64 = wqe.sg_list.iter().map(|sge| u64::from(sge.length)).sum();
                    u64::from(received) + frame.payload.len() as u64 > room
                }),
            None => return Err(Refusal::Fatal(NakCode::InvalidRequest, None)),
        },
    };
    if let Err(too_long) = scattered {
        // As for any receive: too long is the sender's error, a bad buffer ours.
        let (code, status) = if too_long {
            (NakCode::InvalidRequest, WcStatus::LocalLength)
        } else {
            (NakCode::RemoteOperationalError, WcStatus::LocalProtection)
        };
        finish(resp, qp, ctx, status, 0, TmFlags::empty(), Last::default());
        return Err(Refusal::Fatal(code, None));
    }
    let received = received + frame.payload.len() as u32;
    if !position.ends_message() {
        resp.in_message = Some(InMessage::Send { received });
        return Ok(());
    }
    let status = match &delivery.target {
        Target::Tag { status, .. } => *status,
        Target::Receive { .. } => WcStatus::Success,
    };
    let flags = match &delivery.target {
        Target::Tag { .. } => TmFlags::MATCH | TmFlags::DATA_VALID,
        Target::Receive { flags, .. } => *flags,
    };
    let last = Last {
        imm: frame.ext.immdt.map(|immdt| immdt.immediate),
        solicited: frame.bth.solicited,
    };
    finish(resp, qp, ctx, status, received, flags, last);
    resp.msn = resp.msn.wrapping_add(1);
    Ok(())
}

/// Decides where a new message goes from its TMH; `None` for a rendezvous request, which
/// the match completes (and the READ continues).
fn begin(
    resp: &mut Responder,
    qp: &mut Common,
    ctx: &mut Ctx,
    frame: &FrameRepr,
) -> Result<Option<Delivery>, Refusal> {
    let malformed = |ctx: &mut Ctx, srq: SrqId, what: &str| {
        tracing::debug!(qpn = qp.qpn, what, "tagged SEND refused: malformed");
        if let Some(tm) = ctx.srqs.tm_mut(srq) {
            tm.count_malformed();
        }
        Refusal::Fatal(NakCode::InvalidRequest, None)
    };
    let srq = qp
        .srq
        .ok_or(Refusal::Fatal(NakCode::InvalidRequest, None))?;
    let parsed = tmh::Packet::new_checked(frame.payload).and_then(|p| tmh::Repr::parse(&p));
    let Ok(tmh) = parsed else {
        return Err(malformed(ctx, srq, "TMH"));
    };
    let (arrival, cq) = match ctx.srqs.tm(srq) {
        Some(tm) => (tm.arrival(&tmh), tm.cq),
        None => return Err(Refusal::Fatal(NakCode::InvalidRequest, None)),
    };
    let receive = |opcode, flags| Delivery {
        target: Target::Receive { opcode, flags },
        tmh,
        cq,
        srq,
    };
    match arrival {
        Arrival::NoTag | Arrival::Unexpected => {
            // An ordinary receive or an RNR NAK, before anything is counted.
            if !receive_ready(resp, qp, ctx) {
                return Err(Refusal::NotReady);
            }
            let Some(tm) = ctx.srqs.tm_mut(srq) else {
                return Err(Refusal::Fatal(NakCode::InvalidRequest, None));
            };
            if arrival == Arrival::NoTag {
                tm.stats.no_tag += 1;
                Ok(Some(receive(WcOpcode::TmNoTag, TmFlags::empty())))
            } else {
                let flags = tm.count_unexpected();
                Ok(Some(receive(WcOpcode::TmRecv, flags)))
            }
        }
        Arrival::Matched(handle) => {
            let rvh = if tmh.opcode == tmh::TmOpcode::Rndv {
                let rest = frame.payload.get(tmh::HEADER_LEN..).unwrap_or_default();
                let parsed = rvh::Packet::new_checked(rest).and_then(|p| rvh::Repr::parse(&p));
                let Ok(rvh) = parsed else {
                    return Err(malformed(ctx, srq, "RVH"));
                };
                Some(rvh)
            } else {
                None
            };
            let Some(buffer) = ctx.srqs.tm_mut(srq).and_then(|tm| tm.consume(handle, &tmh)) else {
                return Err(Refusal::Fatal(NakCode::InvalidRequest, None));
            };
            let Some(rvh) = rvh else {
                let target = Target::Tag {
                    buffer,
                    status: WcStatus::Success,
                };
                return Ok(Some(Delivery {
                    target,
                    tmh,
                    cq,
                    srq,
                }));
            };
            // The receiver reads the data itself when the request is one short packet and
            // the tag holds what it names; otherwise the program finishes it.
            let position = frame.bth.opcode.info().position;
            let short = position == Position::Only
                && frame.payload.len() <= LIMITS.max_rndv_hdr_size as usize;
            if !short || u64::from(rvh.dma_length) > buffer.room() {
                let target = Target::Tag {
                    buffer,
                    status: WcStatus::TmRndvIncomplete,
                };
                return Ok(Some(Delivery {
                    target,
                    tmh,
                    cq,
                    srq,
                }));
            }
            let matched = message_completion(
                qp.qpn,
                buffer.recv_wr_id,
                WcStatus::Success,
                WcOpcode::TmRecv,
                0,
                TmInfo {
                    flags: TmFlags::MATCH,
                    app_ctx: tmh.app_ctx,
                    tag: tmh.tag,
                },
            );
            qp.complete(ctx, cq, matched);
            if let Some(tm) = ctx.srqs.tm_mut(srq) {
                tm.stats.rendezvous += 1;
            }
            resp.rendezvous = Some(RendezvousRead {
                handle,
                wr: buffer.rendezvous_read(&rvh),
            });
            resp.msn = resp.msn.wrapping_add(1);
            Ok(None)
        }
    }
}

/// Completes the message under way with `status` (its length `received` bytes on the wire,
/// TMH included, and what its last packet said) and lets go of its tag or receive.
fn finish(
    resp: &mut Responder,
    qp: &mut Common,
    ctx: &mut Ctx,
    status: WcStatus,
    received: u32,
    flags: TmFlags,
    last: Last,
) {
    resp.in_message = None;
    let Some(delivery) = resp.tagged.take() else {
        return;
    };
    let matched = TmInfo {
        flags,
        app_ctx: delivery.tmh.app_ctx,
        tag: delivery.tmh.tag,
    };
    let completion = match delivery.target {
        Target::Tag { buffer, .. } => {
            if let Some(tm) = ctx.srqs.tm_mut(delivery.srq) {
                tm.release(buffer.handle);
            }
            let data = received.saturating_sub(tmh::HEADER_LEN as u32);
            let tm = if flags.contains(TmFlags::MATCH) {
                matched
            } else {
                TmInfo {
                    flags,
                    ..TmInfo::NONE
                }
            };
            message_completion(
                qp.qpn,
                buffer.recv_wr_id,
                status,
                WcOpcode::TmRecv,
                data,
                tm,
            )
        }
        Target::Receive { opcode, .. } => {
            let Some(wqe) = resp.rq.front() else {
                return;
            };
            // Not matched: no tag to report (mlx5 scatters the TMH to the CQE on a match
            // only).
            let tm = TmInfo {
                flags,
                ..TmInfo::NONE
            };
            let completion = message_completion(qp.qpn, wqe.wr_id, status, opcode, received, tm);
            resp.rq.pop_front();
            completion
        }
    };
    let completion = WorkCompletion {
        imm_data: last.imm,
        solicited: last.solicited,
        ..completion
    };
    qp.complete(ctx, delivery.cq, completion);
}

/// Flushes the tagged message under way (the QP entered ERR): a matched tag completes
/// `IBV_WC_WR_FLUSH_ERR` and is free again; an ordinary receive is left at the front of the
/// queue, flushed with the others.
pub(crate) fn flush(resp: &mut Responder, qp: &mut Common, ctx: &mut Ctx) {
    if matches!(
        resp.tagged,
        Some(Delivery {
            target: Target::Tag { .. },
            ..
        })
    ) {
        finish(
            resp,
            qp,
            ctx,
            WcStatus::WrFlush,
            0,
            TmFlags::empty(),
            Last::default(),
        );
    }
    resp.tagged = None;
}

/// The tag a QP going away (destroyed, or reset) holds for the message under way: freed
/// without a completion.
pub(crate) fn abandon(resp: &mut Responder, srqs: &mut crate::srq::SrqTable) {
    if let Some(Delivery {
        target: Target::Tag { buffer, .. },
        srq,
        ..
    }) = resp.tagged.take()
    {
        if let Some(tm) = srqs.tm_mut(srq) {
            tm.release(buffer.handle);
        }
    }
}
