//! The requester: turns posted send work requests into packets, PSN by PSN.
//!
//! A WQE's packets are rebuilt from the WQE whenever they are (re)sent, so going back N after
//! a NAK or timeout is only moving the cursor (`next`, `pkt_in_wqe`, `next_psn`) back.

use roce_wire::opcode::Position;
use roce_wire::{atomic_eth, deth, ieth, immdt, reth, ExtRepr, Opcode, Psn};

use super::{Ctx, OutPacket, PostError, Qp};
use crate::cq::{WcOpcode, WcStatus, WorkCompletion};
use crate::qp_state::{QpState, QpType};
use crate::ring::Ring;
use crate::timer::Timer;
use crate::wr::{SendFlags, SendOp, SendWr};

/// rxe asks for an ACK at least this often within a long message.
const MAX_PACKETS_PER_ACK: u32 = 64;

/// At most this many PSNs unacknowledged at once (rxe's `RXE_MAX_UNACKED_PSNS`): with go back
/// N, an unbounded window would resend everything posted after every loss.
pub(crate) const MAX_UNACKED_PSNS: i32 = 128;

/// A posted send and its progress.
#[derive(Debug, Default)]
pub(crate) struct SendWqe {
    pub wr: SendWr,
    /// Message length in bytes.
    pub len: u32,
    /// PSN of its first packet, once it has started.
    pub first_psn: Psn,
    /// PSNs it consumes (a READ consumes one per response packet).
    pub npsn: u32,
    /// READ response packets received, in order.
    pub responses: u32,
}

impl SendWqe {
    pub fn last_psn(&self) -> Psn {
        self.first_psn + (self.npsn - 1)
    }

    pub fn contains(&self, psn: Psn) -> bool {
        let offset = psn.distance(self.first_psn);
        offset >= 0 && (offset as u32) < self.npsn
    }
}

/// Send-queue state shared by the requester and the completer.
#[derive(Debug, Default)]
pub(crate) struct Requester {
    /// Posted and not yet completed, oldest first.
    pub wqes: Ring<SendWqe>,
    /// Index of the first WQE not fully transmitted.
    pub next: usize,
    /// Packets of `wqes[next]` already transmitted.
    pub pkt_in_wqe: u32,
    /// PSN of the next packet to transmit.
    pub next_psn: Psn,
    /// Highest PSN ever transmitted: anything at or below it is a retransmission.
    pub max_sent_psn: Psn,
    /// Highest PSN acknowledged (cumulatively).
    pub acked_psn: Psn,
    /// Transport retries left before RETRY_EXC_ERR.
    pub retries_left: u8,
    /// RNR retries left before RNR_RETRY_EXC_ERR (unused when rnr_retry is 7).
    pub rnr_retries_left: u8,
    /// Packets sent since the last one with AckReq.
    pub noack_pkts: u32,
    /// Where the retry under way resumed; cleared by progress or a timeout.
    pub recovering: Option<Psn>,
}

/// The completion opcode of a send work request.
pub(crate) fn wc_opcode(wr: &SendWr) -> WcOpcode {
    match wr.op {
        SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_) => WcOpcode::Send,
        SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
        SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
        SendOp::CompareSwap { .. } => WcOpcode::CompareSwap,
        SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
    }
}

pub(crate) fn supported(qp_type: QpType, wr: &SendWr) -> bool {
    match qp_type {
        QpType::Rc => true,
        QpType::Uc => matches!(
            wr.op,
            SendOp::Send
                | SendOp::SendWithImm(_)
                | SendOp::RdmaWrite { .. }
                | SendOp::RdmaWriteWithImm { .. }
        ),
        QpType::Ud => matches!(wr.op, SendOp::Send | SendOp::SendWithImm(_)) && wr.ud.is_some(),
    }
}

/// `ibv_post_send` for one work request.
#[inline]
pub(crate) fn post(qp: &mut Qp, ctx: &mut Ctx, wr: &SendWr) -> Result<(), PostError> {
    let len = qp.post_gate().check_send(wr, 0)?;
    if qp.state == QpState::Err {
        let completion = qp.send_completion(wr.wr_id, WcStatus::WrFlush, wc_opcode(wr), 0);
        qp.complete(ctx, qp.send_cq, completion);
        return Ok(());
    }
    let npsn = if wr.op.is_atomic() {
        1
    } else {
        qp.config.packets(len)
    };
    // Copied field by field into its slot: a WQE is big, and every move of one is a copy.
    let wqe = qp.req.wqes.push_slot();
    wqe.wr.clone_from(wr);
    wqe.len = len;
    wqe.first_psn = Psn::new(0);
    wqe.npsn = npsn;
    wqe.responses = 0;
    Ok(())
}

/// Whether the WQE at `index` must wait: for a fence, or for a read/atomic slot.
fn must_wait(qp: &Qp, index: usize) -> bool {
    let wqe = &qp.req.wqes[index];
    let fence = wqe.wr.flags.contains(SendFlags::FENCE);
    if !fence && !wqe.wr.op.is_read_or_atomic() {
        return false; // the common case, without scanning the queue
    }
    let earlier_reads = qp
        .req
        .wqes
        .iter()
        .take(index)
        .filter(|w| w.wr.op.is_read_or_atomic())
        .count();
    let fenced = fence && earlier_reads > 0;
    let starting = qp.req.pkt_in_wqe == 0;
    let no_slot = wqe.wr.op.is_read_or_atomic()
        && starting
        && earlier_reads >= usize::from(qp.config.max_rd_atomic.max(1));
    fenced || no_slot
}

fn position(index: u32, count: u32) -> Position {
    match (index, count) {
        (_, 1) => Position::Only,
        (0, _) => Position::First,
        (i, n) if i + 1 == n => Position::Last,
        _ => Position::Middle,
    }
}

fn send_opcode(qp_type: QpType, op: &SendOp, position: Position) -> Opcode {
    use Opcode::*;
    use Position::*;
    match (qp_type, op, position) {
        (QpType::Ud, SendOp::SendWithImm(_), _) => UdSendOnlyWithImmediate,
        (QpType::Ud, _, _) => UdSendOnly,
        (QpType::Rc, SendOp::RdmaRead { .. }, _) => RcRdmaReadRequest,
        (QpType::Rc, SendOp::CompareSwap { .. }, _) => RcCompareSwap,
        (QpType::Rc, SendOp::FetchAdd { .. }, _) => RcFetchAdd,
        (rc_or_uc, op, position) => {
            let rc = rc_or_uc == QpType::Rc;
            let pick = |rc_opcode, uc_opcode| if rc { rc_opcode } else { uc_opcode };
            match (op, position) {
                (SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. }, First) => {
                    pick(RcRdmaWriteFirst, UcRdmaWriteFirst)
                }
                (SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. }, Middle) => {
                    pick(RcRdmaWriteMiddle, UcRdmaWriteMiddle)
                }
                (SendOp::RdmaWrite { .. }, Last) => pick(RcRdmaWriteLast, UcRdmaWriteLast),
                (SendOp::RdmaWrite { .. }, Only) => pick(RcRdmaWriteOnly, UcRdmaWriteOnly),
                (SendOp::RdmaWriteWithImm { .. }, Last) => {
                    pick(RcRdmaWriteLastWithImmediate, UcRdmaWriteLastWithImmediate)
                }
                (SendOp::RdmaWriteWithImm { .. }, Only) => {
                    pick(RcRdmaWriteOnlyWithImmediate, UcRdmaWriteOnlyWithImmediate)
                }
                (_, First) => pick(RcSendFirst, UcSendFirst),
                (_, Middle) => pick(RcSendMiddle, UcSendMiddle),
                (SendOp::SendWithImm(_), Last) => {
                    pick(RcSendLastWithImmediate, UcSendLastWithImmediate)
                }
                (SendOp::SendWithImm(_), Only) => {
                    pick(RcSendOnlyWithImmediate, UcSendOnlyWithImmediate)
                }
                (SendOp::SendWithInv(_), Last) => RcSendLastWithInvalidate,
                (SendOp::SendWithInv(_), Only) => RcSendOnlyWithInvalidate,
                (_, Last) => pick(RcSendLast, UcSendLast),
                (_, Only) => pick(RcSendOnly, UcSendOnly),
            }
        }
    }
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
    if !matches!(qp.state, QpState::Rts | QpState::Sqd) || qp.timers.is_set(Timer::RnrWait) {
        return false;
    }
    // SQD drains: what was already sent may go again, nothing new starts.
    if qp.state == QpState::Sqd && qp.req.next_psn.distance(qp.req.max_sent_psn) > 0 {
        return false;
    }
    let index = qp.req.next;
    if index >= qp.req.wqes.len() || must_wait(qp, index) {
        return false;
    }
    if qp.qp_type == QpType::Rc && qp.req.next_psn.distance(qp.req.acked_psn) > MAX_UNACKED_PSNS {
        return false;
    }
    if qp.req.pkt_in_wqe == 0 {
        qp.req.wqes[index].first_psn = qp.req.next_psn;
    }
    let k = qp.req.pkt_in_wqe;
    let wqe = &qp.req.wqes[index];
    let psn = qp.req.next_psn;
    let position = position(k, wqe.npsn);
    let is_read = matches!(wqe.wr.op, SendOp::RdmaRead { .. });
    out.payload.clear();
    if !is_read && !wqe.wr.op.is_atomic() {
        let offset = k as usize * qp.config.mtu;
        let chunk = (wqe.len as usize - offset).min(qp.config.mtu);
        if wqe.wr.flags.contains(SendFlags::INLINE) {
            out.payload
                .extend_from_slice(&wqe.wr.inline_data[offset..offset + chunk]);
        } else if ctx
            .mrs
            .gather(
                qp.pd,
                &wqe.wr.sg_list,
                offset as u64,
                chunk,
                &mut out.payload,
            )
            .is_err()
        {
            super::completer::fail_wqe(qp, ctx, index, WcStatus::LocalProtection);
            return false;
        }
    }
    out.ext = ext_headers(qp, wqe, k, position);
    let mut bth = qp.bth(
        send_opcode(qp.qp_type, &wqe.wr.op, position),
        psn,
        wqe.wr.ud.as_ref(),
    );
    bth.pad_count = ((4 - out.payload.len() % 4) % 4) as u8;
    let solicit = matches!(
        wqe.wr.op,
        SendOp::Send
            | SendOp::SendWithImm(_)
            | SendOp::SendWithInv(_)
            | SendOp::RdmaWriteWithImm { .. }
    );
    bth.solicited =
        solicit && position.ends_message() && wqe.wr.flags.contains(SendFlags::SOLICITED);
    if qp.qp_type == QpType::Rc {
        bth.ack_req =
            position.ends_message() || is_read || qp.req.noack_pkts + 1 >= MAX_PACKETS_PER_ACK;
        qp.req.noack_pkts = if bth.ack_req {
            0
        } else {
            qp.req.noack_pkts + 1
        };
    }
    out.bth = bth;
    out.av = wqe.wr.ud.map_or_else(|| qp.connected_av(), |dest| dest.av);

    // Advance: a READ request stands for all of its response PSNs.
    let consumed = if is_read { wqe.npsn - k } else { 1 };
    let last_psn = psn + (consumed - 1);
    if last_psn.distance(qp.req.max_sent_psn) <= 0 {
        qp.stats.retransmits += 1;
    } else {
        qp.req.max_sent_psn = last_psn;
    }
    qp.req.next_psn = psn + consumed;
    qp.req.pkt_in_wqe += consumed;
    if qp.req.pkt_in_wqe == qp.req.wqes[index].npsn {
        qp.req.next += 1;
        qp.req.pkt_in_wqe = 0;
        if qp.qp_type != QpType::Rc {
            complete_unreliable(qp, ctx);
        }
    }
    if qp.qp_type == QpType::Rc && !qp.timers.is_set(Timer::Retransmit) {
        if let Some(timeout) = qp.config.ack_timeout() {
            qp.timers.set(Timer::Retransmit, ctx.now + timeout);
        }
    }
    true
}

/// The completion the front WQE reports when it succeeds, if it is signaled (read in place:
/// a WQE is too big to move out just to report it).
pub(crate) fn success_of_front(qp: &Qp) -> Option<WorkCompletion> {
    let wqe = qp.req.wqes.front()?;
    let signaled = qp.sq_sig_all || wqe.wr.flags.contains(SendFlags::SIGNALED);
    signaled
        .then(|| qp.send_completion(wqe.wr.wr_id, WcStatus::Success, wc_opcode(&wqe.wr), wqe.len))
}

/// UC and UD sends are done once their last packet leaves.
fn complete_unreliable(qp: &mut Qp, ctx: &mut Ctx) {
    if qp.req.wqes.front().is_none() {
        return;
    }
    let completion = success_of_front(qp);
    qp.req.wqes.pop_front();
    qp.req.next -= 1;
    if let Some(completion) = completion {
        qp.complete(ctx, qp.send_cq, completion);
    }
}
