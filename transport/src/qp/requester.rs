//! The requester: turns posted send work requests into packets, PSN by PSN, from the send
//! queue's cursor.

use roce_wire::opcode::Position;
use roce_wire::{atomic_eth, deth, ieth, immdt, reth, xrceth, ExtRepr};

use super::common::{Common, Ctx, Lent, OutPacket, QpConfig};
use super::send_queue::{self, SendQueue, SendWqe};
use crate::cq::WcStatus;
use crate::mr::MrTable;
use crate::qp_state::{QpState, QpType};
use crate::timer::{Timer, TimerTable};
use crate::wr::{SendFlags, SendOp, SendWr};

/// A packet asks for an ACK at least this often (rxe: 64 within a long message): a quarter
/// of [`MAX_UNACKED_PSNS`], so ACKs reopen the window before it closes.
const MAX_PACKETS_PER_ACK: u32 = 32;

/// At most this many PSNs unacknowledged at once (rxe's `RXE_MAX_UNACKED_PSNS`): with go back
/// N, an unbounded window would resend everything posted after every loss.
const MAX_UNACKED_PSNS: i32 = 128;

/// Queues a send work request the QP admitted, `len` bytes long.
#[inline]
pub(crate) fn post(sq: &mut SendQueue, config: &QpConfig, wr: &SendWr, len: u32) {
    let npsn = if wr.op.is_local() {
        0
    } else if wr.op.is_atomic() {
        1
    } else {
        config.packets(len)
    };
    sq.push(wr, len, npsn);
}

/// What [`next_packet`] did, for the QP to finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Nothing may be sent now.
    Nothing,
    /// A packet was written; with `completes_front`, it was the last of a UC or UD WQE,
    /// which is done once its last packet leaves.
    Sent { completes_front: bool },
    /// The WQE at `index` cannot be sent and fails with `status`.
    Fail { index: usize, status: WcStatus },
}

/// Whether the WQE at `index` must wait: for a fence, or for a read/atomic slot.
fn must_wait(sq: &SendQueue, qp: &Common, index: usize, pkt_in_wqe: u32) -> bool {
    let Some(wqe) = sq.get(index) else {
        return true;
    };
    let fence = wqe.wr.flags.contains(SendFlags::FENCE);
    if !fence && !wqe.wr.op.is_read_or_atomic() {
        return false; // the common case, without scanning the queue
    }
    let earlier_reads = (0..index)
        .filter_map(|i| sq.get(i))
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
fn ext_headers(qp: &Common, wqe: &SendWqe, index: u32, position: Position) -> ExtRepr {
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
        SendOp::AtomicWrite {
            remote_addr, rkey, ..
        } => {
            ext.reth = Some(reth::Repr {
                virtual_address: remote_addr,
                rkey,
                dma_length: wqe.len,
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
    if qp.qp_type == QpType::XrcSend {
        ext.xrceth = Some(xrceth::Repr {
            srqn: wqe.wr.xrc_srqn & 0xFF_FFFF,
        });
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
pub(crate) fn next_packet(
    sq: &mut SendQueue,
    timers: &mut TimerTable,
    qp: &mut Common,
    ctx: &mut Ctx,
    out: &mut OutPacket,
) -> Next {
    let (index, k) = match next_remote(sq, timers, qp, ctx) {
        Ok(Some(found)) => found,
        Ok(None) => return Next::Nothing,
        Err(failed) => return failed,
    };
    sq.begin_packet();
    let psn = sq.next_psn();
    let Some(wqe) = sq.get(index) else {
        return Next::Nothing;
    };
    let is_read = matches!(wqe.wr.op, SendOp::RdmaRead { .. });
    // A READ request or an atomic is one packet, whatever its response takes.
    let position = if is_read || wqe.wr.op.is_atomic() {
        Position::Only
    } else {
        Position::of(k, wqe.npsn)
    };
    let Some(opcode) = send_queue::request_opcode(qp.qp_type, &wqe.wr.op, position) else {
        let status = WcStatus::LocalQpOperation;
        return Next::Fail { index, status };
    };
    if let Err(status) = payload(qp, ctx, index, wqe, k, out) {
        return Next::Fail { index, status };
    }
    out.ext = ext_headers(qp, wqe, k, position);
    let mut bth = qp.bth(opcode, psn, wqe.wr.ud.as_ref());
    bth.pad_count = ((4 - out.payload_len() % 4) % 4) as u8;
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
    let reliable = qp.qp_type.is_reliable();
    if reliable {
        // A READ or an atomic asks as rxe's always do: it is answered whatever it asks.
        bth.ack_req = wqe.wr.op.is_read_or_atomic() || sq.noack_pkts() + 1 >= MAX_PACKETS_PER_ACK;
    }
    out.bth = bth;
    out.av = wqe.wr.ud.map_or_else(|| qp.connected_av(), |dest| dest.av);

    // A READ request stands for all of its response PSNs.
    let consumed = if is_read { wqe.npsn - k } else { 1 };
    let advance = sq.advance(consumed, bth.ack_req);
    // A message's end asks for an ACK unless another packet follows it at once (IBTA lets
    // the responder coalesce ACKs; asking once per burst lets it, where rxe asks at every
    // end): the 64 B WRITE rate sent 0.4 ACKs per WRITE, each through its own sendto.
    if reliable && position.ends_message() && !out.bth.ack_req && !follows_at_once(sq, timers, qp) {
        out.bth.ack_req = true;
        sq.ack_requested();
    }
    if advance.retransmit {
        qp.stats.retransmits += 1;
    }
    if reliable && !timers.is_set(Timer::Retransmit) {
        if let Some(timeout) = qp.config.ack_timeout() {
            timers.set(Timer::Retransmit, ctx.now + timeout);
        }
    }
    Next::Sent {
        completes_front: advance.wqe_sent && !reliable,
    }
}

/// The WQE and packet to send next, running the local operations the cursor passes on the
/// way (each once: going back N passes them by); `Err` with the failure of one that fails.
#[inline(always)]
fn next_remote(
    sq: &mut SendQueue,
    timers: &TimerTable,
    qp: &Common,
    ctx: &mut Ctx,
) -> Result<Option<(usize, u32)>, Next> {
    loop {
        let Some((index, k)) = sendable(sq, timers, qp) else {
            return Ok(None);
        };
        if !sq.has_locals() || !pass_local(sq, qp, ctx, index)? {
            return Ok(Some((index, k)));
        }
    }
}

/// If the WQE at `index`, under the cursor, is a local operation: runs it (unless it has
/// run before going back N) and moves the cursor past it, `Ok(true)`. Out of the hot path:
/// only queues with local operations get here.
#[cold]
#[inline(never)]
fn pass_local(sq: &mut SendQueue, qp: &Common, ctx: &mut Ctx, index: usize) -> Result<bool, Next> {
    let Some(wqe) = sq.get(index) else {
        return Ok(false);
    };
    if !wqe.wr.op.is_local() {
        return Ok(false);
    }
    if !wqe.done {
        run_local(qp, ctx, &wqe.wr.op).map_err(|status| Next::Fail { index, status })?;
    }
    sq.pass_local();
    Ok(true)
}

/// Runs a memory window bind or a local invalidation (`rxe_do_local_ops`): a refused bind
/// fails with `IBV_WC_MW_BIND_ERR`, a refused invalidation with `IBV_WC_LOC_QP_OP_ERR`.
fn run_local(qp: &Common, ctx: &mut Ctx, op: &SendOp) -> Result<(), WcStatus> {
    let result = match op {
        SendOp::BindMw(bind) => (ctx.mrs.bind_mw(qp.pd, qp.qpn, bind).map(drop))
            .map_err(|error| (error, WcStatus::MwBind)),
        SendOp::LocalInv(rkey) => (ctx.mrs.invalidate(qp.pd, None, *rkey))
            .map_err(|error| (error, WcStatus::LocalQpOperation)),
        _ => Ok(()),
    };
    result.map_err(|(error, status)| {
        tracing::debug!(qpn = qp.qpn, %error, "local operation failed");
        status
    })
}

/// Whether the packet under the cursor will be sent right after the one just sent, so that
/// one need not ask for an ACK: a packet of the program's, sendable now. A local operation
/// next does not count: it sends nothing, and nothing may follow it.
fn follows_at_once(sq: &SendQueue, timers: &TimerTable, qp: &Common) -> bool {
    sendable(sq, timers, qp)
        .and_then(|(index, _)| sq.get(index))
        .is_some_and(|wqe| !wqe.wr.op.is_local())
}

/// The WQE and packet to send next, if the QP's state, the RNR wait, fences, read slots and
/// the window allow one now.
fn sendable(sq: &SendQueue, timers: &TimerTable, qp: &Common) -> Option<(usize, u32)> {
    if !matches!(qp.state, QpState::Rts | QpState::Sqd) || timers.is_set(Timer::RnrWait) {
        return None;
    }
    // SQD drains: what was already sent may go again, nothing new starts.
    if qp.state == QpState::Sqd && sq.next_psn().distance(sq.max_sent_psn()) > 0 {
        return None;
    }
    let (index, k) = sq.cursor()?;
    if must_wait(sq, qp, index, k) {
        return None;
    }
    let window = sq.next_psn().distance(sq.acked_psn());
    if qp.qp_type.is_reliable() && window > MAX_UNACKED_PSNS {
        return None;
    }
    Some((index, k))
}

/// Says where the data of packet `k` of `wqe` (at `index` of the queue) lies, having
/// checked that it may be read (none for a READ request or an atomic): the provider copies
/// it from there into the frame. An ATOMIC WRITE's own 8 bytes the packet holds.
fn payload(
    qp: &Common,
    ctx: &mut Ctx,
    index: usize,
    wqe: &SendWqe,
    k: u32,
    out: &mut OutPacket,
) -> Result<(), WcStatus> {
    out.payload.clear();
    out.lent = None;
    if let SendOp::AtomicWrite { data, .. } = wqe.wr.op {
        out.payload.extend_from_slice(&data);
        return Ok(());
    }
    if wqe.wr.op.is_read_or_atomic() {
        return Ok(());
    }
    let offset = k as usize * qp.config.mtu;
    let len = (wqe.len as usize - offset).min(qp.config.mtu);
    if len == 0 {
        return Ok(());
    }
    let mut lent = Lent::Wqe { index, offset, len };
    if !wqe.wr.flags.contains(SendFlags::INLINE) {
        let one_region = (ctx.mrs)
            .check_gather(qp.pd, &wqe.wr.sg_list, offset as u64, len)
            .map_err(|_| WcStatus::LocalProtection)?;
        // In one region (most payloads): read there, without a second look at the list.
        if let Some(location) = one_region {
            lent = Lent::Region { location, len };
        }
    }
    out.lent = Some(lent);
    Ok(())
}

/// Copies a lent payload of `wqe` (bytes `offset..offset + out.len()` of its message) into
/// `out`.
pub(crate) fn write_payload(
    qp: &Common,
    mrs: &MrTable,
    wqe: &SendWqe,
    offset: usize,
    out: &mut [u8],
) -> Result<(), WcStatus> {
    if wqe.wr.flags.contains(SendFlags::INLINE) {
        let bytes = wqe.wr.inline_data.get(offset..offset + out.len());
        out.copy_from_slice(bytes.ok_or(WcStatus::LocalLength)?);
        return Ok(());
    }
    mrs.gather_into(qp.pd, &wqe.wr.sg_list, offset as u64, out)
        .map_err(|_| WcStatus::LocalProtection)
}
