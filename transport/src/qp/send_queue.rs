//! The send queue: posted send WQEs, the transmit cursor over them, the acknowledged PSN, and
//! the completions a WQE reports.
//!
//! A WQE's packets are rebuilt from the WQE whenever they are (re)sent, so going back N after
//! a NAK or timeout is only moving the cursor back ([`SendQueue::rewind`]).

use roce_wire::opcode::{Operation, Position, Trailer};
use roce_wire::{Opcode, Psn};

use super::common::service;
use crate::cq::{TmInfo, WcOpcode, WcStatus, WorkCompletion};
use crate::qp_state::QpType;
use crate::ring::Ring;
use crate::wr::{SendFlags, SendOp, SendWr};

/// Who queued a WQE: the program, or the QP itself for tag matching. The QP's own complete
/// without a completion of their own and are not counted against `max_send_wr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Origin {
    #[default]
    Program,
    /// The RDMA READ of a matched rendezvous request's data into the buffer of the tag of
    /// this handle (of the QP's SRQ, which keeps the rest).
    Rendezvous(u32),
    /// The SEND that tells a rendezvous sender its data was read.
    Fin,
}

/// A posted send and its progress.
#[derive(Debug, Default)]
pub(crate) struct SendWqe {
    pub wr: SendWr,
    pub origin: Origin,
    /// Message length in bytes.
    pub len: u32,
    /// PSN of its first packet, once it has started.
    pub first_psn: Psn,
    /// PSNs it consumes (a READ consumes one per response packet).
    pub npsn: u32,
    /// READ response packets received, in order.
    pub responses: u32,
    /// Selective repeat: READ responses received ahead of `responses`, bit `i` for packet
    /// `responses + 1 + i`.
    pub early: u128,
    /// Selective repeat: the READ's last response came (early or not): its stream of
    /// responses has ended, so a gap in it is a loss, not responses still on their way.
    pub tail_seen: bool,
    /// A local operation (bind, local invalidate) that has run: going back N passes it by.
    pub done: bool,
}

impl SendWqe {
    /// PSN of its last packet (a local operation, which has none, is not asked).
    #[inline]
    pub fn last_psn(&self) -> Psn {
        self.first_psn + (self.npsn.max(1) - 1)
    }

    /// Whether it is a local operation that has run: it completes as soon as every WQE
    /// before it has.
    #[inline]
    pub fn local_done(&self) -> bool {
        self.done && self.wr.op.is_local()
    }

    #[inline]
    pub fn contains(&self, psn: Psn) -> bool {
        let offset = psn.distance(self.first_psn);
        offset >= 0 && (offset as u32) < self.npsn
    }

    /// The PSN after the last READ response or atomic result received.
    #[inline]
    pub fn answered_through(&self) -> Psn {
        self.first_psn + self.responses
    }

    /// Selective repeat: READ response packets missing from packet `k` on, up to the next
    /// one received (or the end).
    pub fn missing_from(&self, k: u32) -> u32 {
        let rest = self.npsn.saturating_sub(k);
        if k != self.responses || self.early == 0 {
            return rest;
        }
        (1 + self.early.trailing_zeros()).min(rest)
    }
}

/// Posted sends not yet completed and where transmission stands.
#[derive(Debug, Default)]
pub(crate) struct SendQueue {
    /// Posted and not yet completed, oldest first.
    wqes: Ring<SendWqe>,
    /// Index of the first WQE not fully transmitted.
    next: usize,
    /// Packets of `wqes[next]` already transmitted.
    pkt_in_wqe: u32,
    /// PSN of the next packet to transmit.
    next_psn: Psn,
    /// Highest PSN ever transmitted: anything at or below it is a retransmission.
    max_sent_psn: Psn,
    /// Highest PSN acknowledged (cumulatively).
    acked_psn: Psn,
    /// Packets sent since the last one with AckReq.
    noack_pkts: u32,
    /// WQEs of the QP's own ([`Origin`]) among `wqes`.
    own: usize,
    /// A local operation (bind, local invalidation) was posted since the queue was last
    /// empty: until it empties again, the requester and completer look for them.
    locals: bool,
}

/// Where transmission stands, to return to after sending one packet from elsewhere
/// (selective repeat sends a packet again without going back).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cursor {
    next: usize,
    pkt_in_wqe: u32,
    next_psn: Psn,
    noack_pkts: u32,
}

/// What transmitting one packet did to the queue.
pub(crate) struct Advance {
    /// The packet had been sent before.
    pub retransmit: bool,
    /// It was its WQE's last.
    pub wqe_sent: bool,
}

impl SendQueue {
    #[inline]
    pub fn len(&self) -> usize {
        self.wqes.len()
    }

    /// WQEs the program posted (not those of the QP's own).
    #[inline]
    pub fn program_len(&self) -> usize {
        self.wqes.len() - self.own
    }

    #[inline]
    pub fn get(&self, index: usize) -> Option<&SendWqe> {
        self.wqes.get(index)
    }

    #[inline]
    pub fn front(&self) -> Option<&SendWqe> {
        self.wqes.front()
    }

    /// Whether any local operation is queued.
    #[inline]
    pub fn has_locals(&self) -> bool {
        self.locals
    }

    #[inline]
    pub fn next_psn(&self) -> Psn {
        self.next_psn
    }

    #[inline]
    pub fn max_sent_psn(&self) -> Psn {
        self.max_sent_psn
    }

    #[inline]
    pub fn acked_psn(&self) -> Psn {
        self.acked_psn
    }

    #[inline]
    pub fn noack_pkts(&self) -> u32 {
        self.noack_pkts
    }

    /// Starts numbering at `psn` (`sq_psn` of `modify_qp`).
    #[inline]
    pub fn set_psn(&mut self, psn: Psn) {
        self.next_psn = psn;
        self.max_sent_psn = psn - 1;
        self.acked_psn = psn - 1;
    }

    /// Copies `wr` into the back slot field by field: a WQE is big, and every move of one is
    /// a copy.
    #[inline]
    pub fn push(&mut self, wr: &SendWr, len: u32, npsn: u32) {
        self.push_from(Origin::Program, wr, len, npsn);
    }

    /// [`push`](Self::push) for a WQE of `origin`.
    #[inline]
    pub fn push_from(&mut self, origin: Origin, wr: &SendWr, len: u32, npsn: u32) {
        if origin != Origin::Program {
            self.own += 1;
        }
        let wqe = self.wqes.push_slot();
        wqe.origin = origin;
        wqe.wr.clone_from(wr);
        wqe.len = len;
        wqe.first_psn = Psn::new(0);
        wqe.npsn = npsn;
        wqe.responses = 0;
        wqe.early = 0;
        wqe.tail_seen = false;
        wqe.done = false;
        self.locals |= wr.op.is_local();
    }

    /// The WQE to transmit from and the packet of it that goes next, if any WQE is left.
    #[inline]
    pub fn cursor(&self) -> Option<(usize, u32)> {
        (self.next < self.wqes.len()).then_some((self.next, self.pkt_in_wqe))
    }

    /// Whether any packet of the WQE at `index` has been transmitted.
    #[inline]
    pub fn started(&self, index: usize) -> bool {
        index < self.next || (index == self.next && self.pkt_in_wqe > 0)
    }

    /// Whether every packet of the WQE at `index` has been transmitted.
    #[inline]
    pub fn fully_sent(&self, index: usize) -> bool {
        index < self.next
    }

    /// Gives the WQE under the cursor its first PSN when its first packet is about to go.
    #[inline]
    pub fn begin_packet(&mut self) {
        if self.pkt_in_wqe == 0 {
            let psn = self.next_psn;
            if let Some(wqe) = self.wqes.get_mut(self.next) {
                wqe.first_psn = psn;
            }
        }
    }

    /// Moves the cursor past a packet that used `consumed` PSNs and asked for an ACK or not.
    #[inline]
    pub fn advance(&mut self, consumed: u32, ack_req: bool) -> Advance {
        let last_psn = self.next_psn + (consumed - 1);
        let retransmit = last_psn.distance(self.max_sent_psn) <= 0;
        if !retransmit {
            self.max_sent_psn = last_psn;
        }
        self.noack_pkts = if ack_req {
            0
        } else {
            self.noack_pkts.saturating_add(1)
        };
        self.next_psn = self.next_psn + consumed;
        self.pkt_in_wqe += consumed;
        let npsn = self.wqes.get(self.next).map_or(0, |wqe| wqe.npsn);
        let wqe_sent = self.pkt_in_wqe == npsn;
        if wqe_sent {
            self.next += 1;
            self.pkt_in_wqe = 0;
        }
        Advance {
            retransmit,
            wqe_sent,
        }
    }

    /// The packet just sent asks for an ACK after all (see `requester::next_packet`).
    #[inline]
    pub fn ack_requested(&mut self) {
        self.noack_pkts = 0;
    }

    /// Moves the cursor past the local operation under it, which has run (or had run before
    /// going back N): it takes no PSN.
    #[inline]
    pub fn pass_local(&mut self) {
        let psn = self.next_psn;
        if let Some(wqe) = self.wqes.get_mut(self.next) {
            wqe.first_psn = psn;
            wqe.done = true;
        }
        self.next += 1;
        self.pkt_in_wqe = 0;
    }

    /// Moves the transmit cursor back to `psn` (go back N); a READ whose response packets
    /// from `psn` on are asked for again expects them again.
    #[inline]
    pub fn rewind(&mut self, psn: Psn) {
        let Some(index) = self
            .wqes
            .iter()
            .take(self.next + 1)
            .position(|wqe| wqe.contains(psn))
        else {
            return;
        };
        let Some(wqe) = self.wqes.get_mut(index) else {
            return;
        };
        let k = psn.distance(wqe.first_psn) as u32;
        if matches!(wqe.wr.op, SendOp::RdmaRead { .. }) && wqe.responses != k {
            wqe.responses = k;
            wqe.early = 0;
            wqe.tail_seen = false;
        }
        self.next = index;
        self.pkt_in_wqe = k;
        self.next_psn = psn;
        self.noack_pkts = 0;
    }

    /// The WQE (sent, not yet completed) that `psn` belongs to.
    pub fn holding(&self, psn: Psn) -> Option<&SendWqe> {
        self.wqes
            .iter()
            .take(self.next + 1)
            .find(|wqe| wqe.contains(psn))
    }

    /// Where transmission stands now.
    #[inline]
    pub fn save_cursor(&self) -> Cursor {
        Cursor {
            next: self.next,
            pkt_in_wqe: self.pkt_in_wqe,
            next_psn: self.next_psn,
            noack_pkts: self.noack_pkts,
        }
    }

    /// Returns to `cursor` after one RC packet was sent from elsewhere ([`rewind`]
    /// (Self::rewind) then one advance, which completes no WQE).
    #[inline]
    pub fn restore_cursor(&mut self, cursor: Cursor) {
        self.next = cursor.next;
        self.pkt_in_wqe = cursor.pkt_in_wqe;
        self.next_psn = cursor.next_psn;
        self.noack_pkts = cursor.noack_pkts;
    }

    /// Records everything through `psn` as acknowledged.
    #[inline]
    pub fn acknowledge(&mut self, psn: Psn) {
        self.acked_psn = psn;
    }

    /// Counts one more READ response landed for the WQE at `index`, and those that had
    /// landed ahead of it; whether it was the last.
    #[inline]
    pub fn record_response(&mut self, index: usize) -> bool {
        self.wqes.get_mut(index).is_some_and(|wqe| {
            wqe.tail_seen |= wqe.responses + 1 == wqe.npsn;
            wqe.responses += 1;
            if wqe.early != 0 {
                // Bit i is now packet responses + i: take the run that landed early.
                let run = wqe.early.trailing_ones();
                wqe.responses += run;
                wqe.early = wqe.early.checked_shr(run + 1).unwrap_or(0);
            }
            wqe.responses >= wqe.npsn
        })
    }

    /// Selective repeat: READ response packet `responses + ahead` of the WQE at `index`
    /// landed early; `false` if it had already (or is beyond what is tracked).
    #[inline]
    pub fn record_early(&mut self, index: usize, ahead: u32) -> bool {
        let Some(wqe) = self.wqes.get_mut(index) else {
            return false;
        };
        wqe.tail_seen |= wqe.responses + ahead + 1 == wqe.npsn;
        let Some(bit) = ahead.checked_sub(1).filter(|&bit| bit < u128::BITS) else {
            return false;
        };
        let new = wqe.early & (1 << bit) == 0;
        wqe.early |= 1 << bit;
        new
    }

    /// Removes the front WQE (whose completion has been built from it).
    #[inline]
    pub fn pop_front(&mut self) {
        if self
            .wqes
            .front()
            .is_some_and(|wqe| wqe.origin != Origin::Program)
        {
            self.own -= 1;
        }
        self.wqes.pop_front();
        self.locals &= !self.wqes.is_empty();
        self.next = self.next.saturating_sub(1);
    }

    /// Every WQE not yet completed, oldest first, leaving the queue empty.
    #[inline]
    pub fn take_all(&mut self) -> Ring<SendWqe> {
        self.next = 0;
        self.own = 0;
        self.locals = false;
        std::mem::take(&mut self.wqes)
    }

    /// The completion the front WQE reports when it succeeds, if it is signaled (read in
    /// place: a WQE is too big to move out just to report it).
    #[inline]
    pub fn success_of_front(&self, qpn: u32, sig_all: bool) -> Option<WorkCompletion> {
        let wqe = self.wqes.front()?;
        let signaled = sig_all || wqe.wr.flags.contains(SendFlags::SIGNALED);
        signaled.then(|| completion(qpn, &wqe.wr, WcStatus::Success, wqe.len))
    }
}

/// The completion of send work request `wr` on QP `qpn`.
#[inline]
pub(crate) fn completion(qpn: u32, wr: &SendWr, status: WcStatus, byte_len: u32) -> WorkCompletion {
    WorkCompletion {
        wr_id: wr.wr_id,
        status,
        opcode: wc_opcode(wr),
        byte_len,
        imm_data: None,
        invalidated_rkey: None,
        qp_num: qpn,
        src_qp: 0,
        solicited: false,
        network_header: None,
        tm: TmInfo::NONE,
    }
}

/// The completion opcode of a send work request.
#[inline]
fn wc_opcode(wr: &SendWr) -> WcOpcode {
    match wr.op {
        SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_) => WcOpcode::Send,
        SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
        SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
        SendOp::CompareSwap { .. } => WcOpcode::CompareSwap,
        SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        SendOp::BindMw(_) => WcOpcode::BindMw,
        SendOp::LocalInv(_) => WcOpcode::LocalInv,
        SendOp::AtomicWrite { .. } => WcOpcode::AtomicWrite,
    }
}

/// The wire operation a work request carries out, and what ends its message; `None` for a
/// local operation, which sends nothing.
#[inline]
fn operation(op: &SendOp) -> Option<(Operation, Trailer)> {
    Some(match op {
        SendOp::Send => (Operation::Send, Trailer::None),
        SendOp::SendWithImm(_) => (Operation::Send, Trailer::Immediate),
        SendOp::SendWithInv(_) => (Operation::Send, Trailer::Invalidate),
        SendOp::RdmaWrite { .. } => (Operation::Write, Trailer::None),
        SendOp::RdmaWriteWithImm { .. } => (Operation::Write, Trailer::Immediate),
        SendOp::RdmaRead { .. } => (Operation::ReadRequest, Trailer::None),
        SendOp::CompareSwap { .. } => (Operation::CompareSwap, Trailer::None),
        SendOp::FetchAdd { .. } => (Operation::FetchAdd, Trailer::None),
        SendOp::AtomicWrite { .. } => (Operation::AtomicWrite, Trailer::None),
        SendOp::BindMw(_) | SendOp::LocalInv(_) => return None,
    })
}

/// The opcode of a request packet at `position` in the message of `op` (a READ request or
/// an atomic is one packet whatever its response takes); `None` if the QP type has no such
/// operation (the opcode table is what says READ is RC only, and so on).
#[inline]
pub(crate) fn request_opcode(qp_type: QpType, op: &SendOp, position: Position) -> Option<Opcode> {
    let (operation, trailer) = operation(op)?;
    let trailer = if position.ends_message() {
        trailer
    } else {
        Trailer::None
    };
    Opcode::find(service(qp_type), operation, position, trailer)
}

/// Whether a QP of `qp_type` can carry out `wr` (a UD send also needs its destination).
/// Memory window binds and local invalidation run on QPs that send to one peer (rxe: RC and
/// UC; its XRC patches add the XRC initiator).
pub(crate) fn supported(qp_type: QpType, wr: &SendWr) -> bool {
    if request_opcode(qp_type, &wr.op, Position::Only).is_some() {
        return qp_type != QpType::Ud || wr.ud.is_some();
    }
    let connected = matches!(qp_type, QpType::Rc | QpType::Uc | QpType::XrcSend);
    wr.op.is_local() && connected && wr.sg_list.is_empty()
}
