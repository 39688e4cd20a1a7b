//! Completion queues: a fixed number of slots; a completion with no slot is an error.

use crate::ring::Ring;

/// How a work request ended, with the values of `enum ibv_wc_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
#[non_exhaustive]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`.
    Success = 0,
    /// `IBV_WC_LOC_LEN_ERR`: a message longer than the receive buffer.
    LocalLength = 1,
    /// `IBV_WC_LOC_QP_OP_ERR`: an internal QP consistency error.
    LocalQpOperation = 2,
    /// `IBV_WC_LOC_PROT_ERR`: a local key or access violation in a gather/scatter list.
    LocalProtection = 4,
    /// `IBV_WC_WR_FLUSH_ERR`: the QP entered ERR before the request ran.
    WrFlush = 5,
    /// `IBV_WC_MW_BIND_ERR`: a memory window bind was refused.
    MwBind = 6,
    /// `IBV_WC_BAD_RESP_ERR`: the responder answered with something impossible.
    BadResponse = 7,
    /// `IBV_WC_LOC_ACCESS_ERR`: a protection error on a local RDMA READ/atomic target.
    LocalAccess = 8,
    /// `IBV_WC_REM_INV_REQ_ERR`: the responder NAKed an invalid request.
    RemoteInvalidRequest = 9,
    /// `IBV_WC_REM_ACCESS_ERR`: the responder NAKed an R_Key/access/bounds violation.
    RemoteAccess = 10,
    /// `IBV_WC_REM_OP_ERR`: the responder could not complete the request.
    RemoteOperation = 11,
    /// `IBV_WC_RETRY_EXC_ERR`: transport retries (timeouts, sequence NAKs) exhausted.
    RetryExceeded = 12,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: RNR retries exhausted.
    RnrRetryExceeded = 13,
    /// `IBV_WC_GENERAL_ERR`.
    General = 21,
    /// `IBV_WC_TM_ERR`: a tag-matching list operation failed (a tag deleted after it was
    /// consumed).
    TmError = 22,
    /// `IBV_WC_TM_RNDV_INCOMPLETE`: a rendezvous request matched a tag but its data was not
    /// read for it; the request's headers are in the tag's buffer, for the program to finish
    /// ("TM software rendezvous").
    TmRndvIncomplete = 23,
}

/// What a completion reports, with the values of `enum ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    /// A SEND (with or without immediate or invalidate) completed at the requester.
    Send = 0,
    /// An RDMA WRITE (with or without immediate) completed at the requester.
    RdmaWrite = 1,
    /// An RDMA READ completed.
    RdmaRead = 2,
    /// An atomic compare-and-swap completed.
    CompareSwap = 3,
    /// An atomic fetch-and-add completed.
    FetchAdd = 4,
    /// A memory window bind completed.
    BindMw = 5,
    /// A local invalidation completed.
    LocalInv = 6,
    /// An ATOMIC WRITE completed (`IBV_WC_ATOMIC_WRITE`).
    AtomicWrite = 9,
    /// A receive consumed by a SEND.
    Recv = 128,
    /// A receive consumed by an RDMA WRITE with immediate.
    RecvRdmaWithImm = 129,
    /// A tag-matching SRQ added a tag (`IBV_WC_TM_ADD`).
    TmAdd = 130,
    /// A tag-matching SRQ deleted a tag (`IBV_WC_TM_DEL`).
    TmDel = 131,
    /// A tag-matching SRQ took the count of unexpected messages handled (`IBV_WC_TM_SYNC`).
    TmSync = 132,
    /// A tagged message matched a tag, landed in it, or arrived unexpected
    /// (`IBV_WC_TM_RECV`; [`TmInfo::flags`] says which).
    TmRecv = 133,
    /// An untagged message on a tag-matching SRQ (`IBV_WC_TM_NO_TAG`).
    TmNoTag = 134,
}

bitflags::bitflags! {
    /// The tag-matching bits of a completion's `wc_flags` (`enum ibv_wc_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct TmFlags: u8 {
        /// The SRQ's count of unexpected messages and the program's differ: post
        /// `IBV_WR_TAG_SYNC` with the count it handled (`IBV_WC_TM_SYNC_REQ`).
        const SYNC_REQ = 1 << 4;
        /// The message matched the tag named by `wr_id` (`IBV_WC_TM_MATCH`).
        const MATCH = 1 << 5;
        /// The message's data is in the tag's buffer (`IBV_WC_TM_DATA_VALID`).
        const DATA_VALID = 1 << 6;
    }
}

/// What a tag-matching completion adds (`ibv_wc_read_tm_info` and the tag-matching
/// `wc_flags`); all zero for any other completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TmInfo {
    /// Which tag-matching bits the completion has.
    pub flags: TmFlags,
    /// The sender's opaque value from the TMH (`priv`), on a match.
    pub app_ctx: u32,
    /// The tag from the TMH, on a match.
    pub tag: u64,
}

impl TmInfo {
    /// Nothing to add: every completion that is not tag matching's.
    pub const NONE: TmInfo = TmInfo {
        flags: TmFlags::empty(),
        app_ctx: 0,
        tag: 0,
    };
}

/// One completion: `struct ibv_wc` without the fields RoCE has no use for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The caller's identifier of the work request.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
    /// What it was.
    pub opcode: WcOpcode,
    /// Bytes received or read (receives and READs).
    pub byte_len: u32,
    /// Immediate data of a SEND or WRITE with immediate.
    pub imm_data: Option<u32>,
    /// The R_Key a SEND with invalidate invalidated.
    pub invalidated_rkey: Option<u32>,
    /// The local QP number.
    pub qp_num: u32,
    /// The sending QP (UD receives).
    pub src_qp: u32,
    /// Whether the SEND asked for a solicited event.
    pub solicited: bool,
    /// The network header of the packet a UD receive came in (what its GRH area holds).
    pub network_header: Option<NetworkHeader>,
    /// Tag matching's part ([`TmInfo::NONE`] elsewhere).
    pub tm: TmInfo,
}

/// The network header of a received RoCEv2 packet, as the kernel's `rdma_network_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NetworkHeader {
    /// IPv4: its 20-byte header is in the second half of the GRH area.
    Ipv4,
    /// IPv6: its 40-byte header fills the GRH area.
    Ipv6,
}

impl WorkCompletion {
    /// The RoCE packet type that mlx5 reports in a receive completion's `sl`: bit 3 for a
    /// UDP header (RoCEv2), bits 2..0 the network header (1 IPv6, 2 IPv4); 0 when there is
    /// none. UCX's UD transport reads it to find the destination GID in the GRH area
    /// (`uct_ud_iface_check_grh`: without it an IPv4 packet's GRH area reads as a wrong
    /// GID and every datagram is dropped). rxe reports 0.
    pub fn roce_packet_type(&self) -> u8 {
        match self.network_header {
            None => 0,
            Some(NetworkHeader::Ipv6) => 0x8 | 0x1,
            Some(NetworkHeader::Ipv4) => 0x8 | 0x2,
        }
    }
}

/// The CQ had no free slot: the completion is lost and the CQ is in error, as an HCA reports
/// `IBV_EVENT_CQ_ERR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("completion queue overflow")]
pub struct CqOverflow;

/// A resize below the number of completions waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{waiting} completions wait, more than the new depth")]
pub struct CqResizeError {
    /// Completions waiting.
    pub waiting: usize,
}

/// What a CQ's free slots hold.
const BLANK: WorkCompletion = WorkCompletion {
    wr_id: 0,
    status: WcStatus::Success,
    opcode: WcOpcode::Send,
    byte_len: 0,
    imm_data: None,
    invalidated_rkey: None,
    qp_num: 0,
    src_qp: 0,
    solicited: false,
    network_header: None,
    tm: TmInfo::NONE,
};

/// A completion queue of fixed depth with `ibv_req_notify_cq` arming.
#[derive(Debug)]
pub struct Cq {
    depth: usize,
    entries: Ring<WorkCompletion>,
    overflowed: bool,
    armed: Option<NotifyOn>,
    event_pending: bool,
}

/// Which completions wake a waiter, as `ibv_req_notify_cq(cq, solicited_only)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotifyOn {
    /// Any new completion.
    Any,
    /// Only completions of solicited SENDs (and any error).
    Solicited,
}

impl Cq {
    /// An empty CQ with `depth` slots.
    pub fn new(depth: usize) -> Self {
        Cq {
            depth,
            entries: Ring::default(),
            overflowed: false,
            armed: None,
            event_pending: false,
        }
    }

    /// Number of slots.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Gives the CQ `depth` slots (`ibv_resize_cq`), keeping the completions that wait;
    /// refused, changing nothing, when more than `depth` wait (rxe's `rxe_cq_chk_attr`).
    pub fn resize(&mut self, depth: usize) -> Result<(), CqResizeError> {
        if self.entries.len() > depth {
            return Err(CqResizeError {
                waiting: self.entries.len(),
            });
        }
        self.depth = depth;
        Ok(())
    }

    /// Drops the completions of QP `qpn` that wait, keeping the others in order; how many
    /// went. For a QP reset: what it completed before is not reported after, as mlx5's
    /// provider cleans its CQs (`mlx5_cq_clean`) when a QP enters RESET.
    pub fn discard_qp(&mut self, qpn: u32) -> usize {
        if !self.entries.iter().any(|entry| entry.qp_num == qpn) {
            return 0;
        }
        let mut all = Vec::with_capacity(self.entries.len());
        self.poll(usize::MAX, &mut all);
        let before = all.len();
        all.retain(|entry| entry.qp_num != qpn);
        for entry in &all {
            self.entries.push_with(*entry, || BLANK);
        }
        before - all.len()
    }

    /// Completions waiting to be polled.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no completion waits.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether a completion was ever lost; the CQ is then unusable.
    pub fn is_overflowed(&self) -> bool {
        self.overflowed
    }

    /// Adds a completion, or fails and marks the CQ overflowed when every slot is taken.
    #[inline(always)]
    pub fn push(&mut self, completion: WorkCompletion) -> Result<(), CqOverflow> {
        if self.overflowed || self.entries.len() == self.depth {
            self.overflowed = true;
            return Err(CqOverflow);
        }
        // Written straight into its slot, not moved there through the stack.
        self.entries.push_with(completion, || BLANK);
        let wakes = match self.armed {
            Some(NotifyOn::Any) => true,
            Some(NotifyOn::Solicited) => {
                completion.solicited || completion.status != WcStatus::Success
            }
            None => false,
        };
        if wakes {
            self.armed = None;
            self.event_pending = true;
        }
        Ok(())
    }

    /// Hands completions, oldest first, to `take` until it refuses one (which stays) or
    /// `max` were taken; returns how many were taken. For a consumer that moves them on
    /// without a container in between (the verbs layer's ring).
    pub fn poll_with(
        &mut self,
        max: usize,
        mut take: impl FnMut(&WorkCompletion) -> bool,
    ) -> usize {
        let (front, back) = self.entries.as_slices();
        let mut count = 0;
        for completion in front.iter().chain(back).take(max) {
            if !take(completion) {
                break;
            }
            count += 1;
        }
        self.entries.pop_front_n(count);
        count
    }

    /// Moves up to `max` completions, oldest first, into `out`; returns how many.
    pub fn poll(&mut self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        let count = max.min(self.entries.len());
        // Completions are `Copy`: two slice copies instead of one element at a time.
        let (front, back) = self.entries.as_slices();
        let from_front = count.min(front.len());
        out.extend_from_slice(&front[..from_front]);
        out.extend_from_slice(&back[..count - from_front]);
        self.entries.pop_front_n(count);
        count
    }

    /// Arms the CQ for one event, as `ibv_req_notify_cq`.
    pub fn request_notify(&mut self, on: NotifyOn) {
        self.armed = Some(on);
    }

    /// Takes the pending event, if an armed CQ received a matching completion.
    pub fn take_event(&mut self) -> bool {
        std::mem::take(&mut self.event_pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(wr_id: u64, solicited: bool) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: 0,
            imm_data: None,
            invalidated_rkey: None,
            qp_num: 1,
            src_qp: 0,
            solicited,
            network_header: None,
            tm: TmInfo::NONE,
        }
    }

    #[test]
    fn completions_come_out_in_order() {
        let mut cq = Cq::new(4);
        for id in 0..4 {
            cq.push(completion(id, false)).unwrap();
        }
        let mut out = Vec::new();
        assert_eq!(cq.poll(3, &mut out), 3);
        assert_eq!(cq.poll(3, &mut out), 1);
        assert_eq!(
            out.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        assert!(cq.is_empty());
    }

    #[test]
    fn resizing_keeps_what_waits_and_refuses_less_room_than_that() {
        let mut cq = Cq::new(2);
        cq.push(completion(0, false)).unwrap();
        cq.push(completion(1, false)).unwrap();
        assert_eq!(cq.resize(1), Err(CqResizeError { waiting: 2 }));
        assert_eq!(cq.depth(), 2, "a refused resize changes nothing");
        cq.resize(3).unwrap();
        cq.push(completion(2, false)).unwrap();
        assert_eq!(cq.push(completion(3, false)), Err(CqOverflow));
        let mut out = Vec::new();
        cq.poll(8, &mut out);
        assert_eq!(out.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [0, 1, 2]);
        let mut cq = Cq::new(4);
        cq.push(completion(0, false)).unwrap();
        cq.resize(1).unwrap();
        assert_eq!(cq.push(completion(1, false)), Err(CqOverflow));
    }

    #[test]
    fn discarding_a_qps_completions_keeps_the_others_in_order() {
        let mut cq = Cq::new(8);
        for (wr_id, qpn) in [(0, 1), (1, 2), (2, 1), (3, 3)] {
            cq.push(WorkCompletion {
                qp_num: qpn,
                ..completion(wr_id, false)
            })
            .unwrap();
        }
        assert_eq!(cq.discard_qp(1), 2);
        assert_eq!(cq.discard_qp(9), 0);
        let mut out = Vec::new();
        cq.poll(8, &mut out);
        assert_eq!(out.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [1, 3]);
    }

    #[test]
    fn overflow_is_an_error_that_sticks() {
        let mut cq = Cq::new(2);
        cq.push(completion(0, false)).unwrap();
        cq.push(completion(1, false)).unwrap();
        assert_eq!(cq.push(completion(2, false)), Err(CqOverflow));
        assert!(cq.is_overflowed());
        let mut out = Vec::new();
        cq.poll(8, &mut out);
        assert_eq!(
            cq.push(completion(3, false)),
            Err(CqOverflow),
            "an overflowed CQ stays broken"
        );
    }

    #[test]
    fn notification_fires_once_per_arming() {
        let mut cq = Cq::new(8);
        cq.push(completion(0, false)).unwrap();
        assert!(!cq.take_event(), "not armed");
        cq.request_notify(NotifyOn::Solicited);
        cq.push(completion(1, false)).unwrap();
        assert!(!cq.take_event(), "unsolicited completion");
        cq.push(completion(2, true)).unwrap();
        assert!(cq.take_event());
        assert!(!cq.take_event(), "taken");
        cq.push(completion(3, true)).unwrap();
        assert!(!cq.take_event(), "disarmed after firing");
        cq.request_notify(NotifyOn::Any);
        cq.push(completion(4, false)).unwrap();
        assert!(cq.take_event());
    }
}
