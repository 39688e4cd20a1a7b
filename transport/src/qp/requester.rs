//! The requester: turns posted send work requests into packets, PSN by PSN, from the send
//! queue's cursor.

use roce_wire::opcode::Position;
use roce_wire::{atomic_eth, deth, ieth, immdt, reth, ExtRepr};

use super::send_queue::{self, SendWqe};
use super::{Ctx, OutPacket, PostError, Qp};
use crate::cq::WcStatus;
use crate::qp_state::{QpState, QpType};
use crate::timer::Timer;
use crate::wr::{SendFlags, SendOp, SendWr};

/// rxe asks for an ACK at least this often within a long message.
const MAX_PACKETS_PER_ACK: u32 = 64;

/// At most this many PSNs unacknowledged at once (rxe's `RXE_MAX_UNACKED_PSNS`): with go back
/// N, an unbounded window would resend everything posted after every loss.
const MAX_UNACKED_PSNS: i32 = 128;

/// `ibv_post_send` for one work request.
#[inline]
pub(crate) fn post(qp: &mut Qp, ctx: &mut Ctx, wr: &SendWr) -> Result<(), PostError> {
    let len = qp.post_gate().check_send(wr, 0)?;
    if qp.state == QpState::Err {
        let completion = send_queue::completion(qp.qpn, wr, WcStatus::WrFlush, 0);
        qp.complete(ctx, qp.send_cq, completion);
        return Ok(());
    }
    let npsn = if wr.op.is_atomic() {
        1
    } else {
        qp.config.packets(len)
    };
    qp.sq.push(wr, len, npsn);
    Ok(())
}

/// Whether the WQE at `index` must wait: for a fence, or for a read/atomic slot.
fn must_wait(qp: &Qp, index: usize, pkt_in_wqe: u32) -> bool {
    let Some(wqe) = qp.sq.get(index) else {
        return true;
    };
    let fence = wqe.wr.flags.contains(SendFlags::FENCE);
    if !fence && !wqe.wr.op.is_read_or_atomic() {
        return false; // the common case, without scanning the queue
    }
    let earlier_reads = (0..index)
        .filter_map(|i| qp.sq.get(i))
        .filter(|w| w.wr.op.is_read_or_atomic())
        .count();
    let fenced = fence && earlier_reads > 0;
    let starting = pkt_in_wqe == 0;
    let no_slot = wqe.wr.op.is_read_or_atomic()
        && starting
        && earlier_reads >= usize::from(qp.config.max_rd_atomic.max(1));
    fenced || no_slot
}

/// Extension headers of packet `index` of a WQE.
fn ext_headers(qp: &Qp, wqe: &SendWqe, index: u32, position: Position) -> ExtRepr {
    let mtu = qp.config.mtu as u64;
    let mut ext = ExtRepr::default();
    let ends = position.ends_message();
    match wqe.wr.op {
        SendOp::RdmaWrite { remote_addr, rkey }
        | SendOp::RdmaWriteWithImm {
            remote_addr, rkey, ..
        } if position.starts_message() => {
            ext.reth = Some(reth::Repr {
                virtual_address: remote_addr,
                rkey,
                dma_length: wqe.len,
            });
        }
        SendOp::RdmaRead { remote_addr, rkey } => {
            // A retried READ asks only for what is still missing.
            let done = u64::from(index) * mtu;
            ext.reth = Some(reth::Repr {
                virtual_address: remote_addr + done,
                rkey,
                dma_length: wqe.len - done as u32,
            });
        }
        SendOp::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            ext.atomic_eth = Some(atomic_eth::Repr {
                virtual_address: remote_addr,
                rkey,
                swap_add: swap,
                compare,
            });
        }
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            ext.atomic_eth = Some(atomic_eth::Repr {
                virtual_address: remote_addr,
                rkey,
                swap_add: add,
                compare: 0,
            });
        }
        _ => {}
    }
    match wqe.wr.op {
        SendOp::SendWithImm(imm) | SendOp::RdmaWriteWithImm { imm, .. } if ends => {
            ext.immdt = Some(immdt::Repr { immediate: imm });
        }
        SendOp::SendWithInv(rkey) if ends => ext.ieth = Some(ieth::Repr { rkey }),
        _ => {}
    }
    if let Some(dest) = &wqe.wr.ud {
        // A Q_Key with the high bit set means "use the QP's own" (IBTA 10.2.5).
        let qkey = if dest.remote_qkey & 0x8000_0000 != 0 {
            qp.config.qkey
        } else {
            dest.remote_qkey
        };
        ext.deth = Some(deth::Repr {
            qkey,
            src_qpn: qp.qpn,
        });
    }
    ext
}

/// Writes the next request packet into `out` (reusing its payload buffer) and advances the
/// cursor; `false` if nothing may be sent now.
pub(crate) fn next_packet(qp: &mut Qp, ctx: &mut Ctx, out: &mut OutPacket) -> bool {
    let Some((index, k)) = sendable(qp) else {
        return false;
    };
    qp.sq.begin_packet();
    let psn = qp.sq.next_psn();
    let Some(wqe) = qp.sq.get(index) else {
        return false;
    };
    let is_read = matches!(wqe.wr.op, SendOp::RdmaRead { .. });
    // A READ request or an atomic is one packet, whatever its response takes.
    let position = if is_read || wqe.wr.op.is_atomic() {
        Position::Only
    } else {
        Position::of(k, wqe.npsn)
    };
    let Some(opcode) = send_queue::request_opcode(qp.qp_type, &wqe.wr.op, position) else {
        qp.fail_wqe(ctx, index, WcStatus::LocalQpOperation);
        return false;
    };
    if let Err(status) = payload(qp, ctx, wqe, k, &mut out.payload) {
        qp.fail_wqe(ctx, index, status);
        return false;
    }
    out.ext = ext_headers(qp, wqe, k, position);
    let mut bth = qp.bth(opcode, psn, wqe.wr.ud.as_ref());
    bth.pad_count = ((4 - out.payload.len() % 4) % 4) as u8;
    // Only what consumes a receive at the responder may ask it to raise an event.
    let consumes_receive = matches!(
        wqe.wr.op,
        SendOp::Send
            | SendOp::SendWithImm(_)
            | SendOp::SendWithInv(_)
            | SendOp::RdmaWriteWithImm { .. }
    );
    bth.solicited =
        consumes_receive && position.ends_message() && wqe.wr.flags.contains(SendFlags::SOLICITED);
    if qp.qp_type == QpType::Rc {
        bth.ack_req =
            position.ends_message() || is_read || qp.sq.noack_pkts() + 1 >= MAX_PACKETS_PER_ACK;
    }
    out.bth = bth;
    out.av = wqe.wr.ud.map_or_else(|| qp.connected_av(), |dest| dest.av);

    // A READ request stands for all of its response PSNs.
    let consumed = if is_read { wqe.npsn - k } else { 1 };
    let advance = qp.sq.advance(consumed, bth.ack_req);
    if advance.retransmit {
        qp.stats.retransmits += 1;
    }
    if advance.wqe_sent && qp.qp_type != QpType::Rc {
        // UC and UD sends are done once their last packet leaves.
        qp.complete_front(ctx);
    }
    if qp.qp_type == QpType::Rc && !qp.timers.is_set(Timer::Retransmit) {
        if let Some(timeout) = qp.config.ack_timeout() {
            qp.timers.set(Timer::Retransmit, ctx.now + timeout);
        }
    }
    true
}

/// The WQE and packet to send next, if the QP's state, the RNR wait, fences, read slots and
/// the window allow one now.
fn sendable(qp: &Qp) -> Option<(usize, u32)> {
    if !matches!(qp.state, QpState::Rts | QpState::Sqd) || qp.timers.is_set(Timer::RnrWait) {
        return None;
    }
    // SQD drains: what was already sent may go again, nothing new starts.
    if qp.state == QpState::Sqd && qp.sq.next_psn().distance(qp.sq.max_sent_psn()) > 0 {
        return None;
    }
    let (index, k) = qp.sq.cursor()?;
    if must_wait(qp, index, k) {
        return None;
    }
    let window = qp.sq.next_psn().distance(qp.sq.acked_psn());
    if qp.qp_type == QpType::Rc && window > MAX_UNACKED_PSNS {
        return None;
    }
    Some((index, k))
}

/// Fills `payload` with the data of packet `k` of `wqe` (none for a READ request or an
/// atomic).
fn payload(
    qp: &Qp,
    ctx: &mut Ctx,
    wqe: &SendWqe,
    k: u32,
    payload: &mut Vec<u8>,
) -> Result<(), WcStatus> {
    payload.clear();
    if wqe.wr.op.is_read_or_atomic() {
        return Ok(());
    }
    let offset = k as usize * qp.config.mtu;
    let chunk = (wqe.len as usize - offset).min(qp.config.mtu);
    if wqe.wr.flags.contains(SendFlags::INLINE) {
        payload.extend_from_slice(&wqe.wr.inline_data[offset..offset + chunk]);
        return Ok(());
    }
    ctx.mrs
        .gather(qp.pd, &wqe.wr.sg_list, offset as u64, chunk, payload)
        .map_err(|_| WcStatus::LocalProtection)
}
