//! Work requests: what applications post to send and receive queues.

use smallvec::SmallVec;

use crate::access::AccessFlags;
use crate::qp_state::AddressVector;

/// A gather or scatter list: one element inline (rc_pingpong, perftest and most programs post
/// one), more on the heap. Posting a one-element list allocates nothing, and the list sits
/// in the work request instead of behind a pointer; it is as big as a `Vec`. Build one with
/// `[sge].into()`, `SgList::new()` or `collect()`.
pub type SgList = SmallVec<[Sge; 1]>;

/// A scatter/gather element: `length` bytes at `addr` in the region whose lkey is `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Address (the region's iova space).
    pub addr: u64,
    /// Byte count.
    pub length: u32,
    /// Local key of the region.
    pub lkey: u32,
}

/// What a send work request does, with its operands (`ibv_wr_opcode` and `wr.rdma`/`wr.atomic`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum SendOp {
    /// SEND.
    #[default]
    Send,
    /// SEND with immediate data.
    SendWithImm(u32),
    /// SEND that invalidates the given R_Key at the responder.
    SendWithInv(u32),
    /// RDMA WRITE to `remote_addr`.
    RdmaWrite {
        /// Target address at the responder.
        remote_addr: u64,
        /// Target R_Key.
        rkey: u32,
    },
    /// RDMA WRITE with immediate data (consumes a receive at the responder).
    RdmaWriteWithImm {
        /// Target address at the responder.
        remote_addr: u64,
        /// Target R_Key.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ from `remote_addr` into the gather list.
    RdmaRead {
        /// Source address at the responder.
        remote_addr: u64,
        /// Source R_Key.
        rkey: u32,
    },
    /// 64-bit compare and swap; the original value lands in the 8-byte gather list.
    CompareSwap {
        /// Target address (8-byte aligned).
        remote_addr: u64,
        /// Target R_Key.
        rkey: u32,
        /// Value compared with the target.
        compare: u64,
        /// Value stored when they are equal.
        swap: u64,
    },
    /// 64-bit fetch and add; the original value lands in the 8-byte gather list.
    FetchAdd {
        /// Target address (8-byte aligned).
        remote_addr: u64,
        /// Target R_Key.
        rkey: u32,
        /// Value added.
        add: u64,
    },
    /// Binds a memory window to a range of a region (`IBV_WR_BIND_MW`, and what
    /// `ibv_bind_mw` posts for a type 1 window); runs locally, sends nothing.
    BindMw(MwBind),
    /// Invalidates the type 2 memory window with this R_Key (`IBV_WR_LOCAL_INV`); runs
    /// locally, sends nothing.
    LocalInv(u32),
    /// ATOMIC WRITE (IBTA 1.5 memory placement extensions, RC only): `data`, as these bytes
    /// are in memory, stored at `remote_addr` in one 8-byte atomic store after every
    /// earlier request of the QP took effect. It takes no gather list; the responder needs
    /// remote write rights and answers as a READ would, without data.
    AtomicWrite {
        /// Target address (8-byte aligned).
        remote_addr: u64,
        /// Target R_Key.
        rkey: u32,
        /// The 8 bytes to store.
        data: [u8; 8],
    },
}

/// A memory window of an endpoint: its R_Key without the key byte, which stays the same
/// through every bind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MwId(pub(crate) u32);

impl MwId {
    /// The window's index, the upper 24 bits of each of its R_Keys.
    pub fn index(self) -> u32 {
        self.0
    }
}

/// What a memory window bind asks (`struct ibv_mw_bind_info` and the new R_Key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBind {
    /// The window.
    pub mw: MwId,
    /// The R_Key it takes: only its low 8 bits (the key byte the consumer owns) count.
    pub rkey: u32,
    /// The region's L_Key (ignored when `length` is 0, which unbinds a type 1 window).
    pub mr_lkey: u32,
    /// First address of the window, in the region's addresses.
    pub addr: u64,
    /// Its length in bytes.
    pub length: u64,
    /// What peers may do through it (the remote rights of [`AccessFlags`]).
    pub access: AccessFlags,
    /// Peers address the window from 0 rather than from `addr` (`IBV_ACCESS_ZERO_BASED`;
    /// type 2 windows only).
    pub zero_based: bool,
}

impl SendOp {
    /// Whether the responder must keep a resource (and answer with a response of its own,
    /// not an ACK) for this request: READ, the atomics and ATOMIC WRITE, which also take
    /// one of the requester's `max_rd_atomic` slots.
    pub const fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::RdmaRead { .. }
                | SendOp::CompareSwap { .. }
                | SendOp::FetchAdd { .. }
                | SendOp::AtomicWrite { .. }
        )
    }

    /// Whether this is an atomic that returns the original value (compare and swap, fetch
    /// and add).
    pub const fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }

    /// Whether this runs at the requester without sending a packet (memory window binds and
    /// local invalidation).
    pub const fn is_local(&self) -> bool {
        matches!(self, SendOp::BindMw(_) | SendOp::LocalInv(_))
    }
}

bitflags::bitflags! {
    /// Send flags, with the values of `IBV_SEND_*`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Wait for every earlier RDMA READ and atomic to complete first.
        const FENCE = 1;
        /// Generate a completion even if the QP does not signal all.
        const SIGNALED = 2;
        /// Ask for a solicited event at the receiver.
        const SOLICITED = 4;
        /// Take the data from `inline_data` now, not from registered memory later.
        const INLINE = 8;
    }
}

/// Where a UD send goes (`wr.ud`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// The address handle's contents.
    pub av: AddressVector,
    /// Destination QP.
    pub remote_qpn: u32,
    /// Destination Q_Key.
    pub remote_qkey: u32,
}

/// A send work request.
#[derive(Debug, PartialEq, Eq, Default)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// Where the local data is (or, for READ and atomics, where results go).
    pub sg_list: SgList,
    /// The data of an `INLINE` send.
    pub inline_data: Vec<u8>,
    /// Signaled, fenced, solicited, inline.
    pub flags: SendFlags,
    /// Destination of a UD send.
    pub ud: Option<UdDest>,
    /// The XRC SRQ at the destination an XRC send is for (`qp_type.xrc.remote_srqn`);
    /// ignored by other QPs.
    pub xrc_srqn: u32,
}

/// A receive work request.
#[derive(Debug, PartialEq, Eq, Default)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where incoming data goes.
    pub sg_list: SgList,
}

/// A signaled send work request of one gather element: what most tests and tools post.
pub fn signaled(wr_id: u64, op: SendOp, sge: Sge) -> SendWr {
    SendWr {
        wr_id,
        op,
        sg_list: [sge].into(),
        inline_data: Vec::new(),
        flags: SendFlags::SIGNALED,
        ud: None,
        xrc_srqn: 0,
    }
}

// Cloned by hand because posting clones every request into a queue slot (`clone_from`):
// the derived one would extend the list element by element and build a whole new request
// to move into the slot.
impl Clone for SendWr {
    fn clone(&self) -> Self {
        let mut copy = SendWr::default();
        copy.clone_from(self);
        copy
    }

    /// In place, keeping `self`'s allocations: how a send queue slot takes a new request.
    fn clone_from(&mut self, source: &Self) {
        self.wr_id = source.wr_id;
        self.op = source.op;
        copy_list_into(&mut self.sg_list, &source.sg_list);
        self.inline_data.clone_from(&source.inline_data);
        self.flags = source.flags;
        self.ud = source.ud;
        self.xrc_srqn = source.xrc_srqn;
    }
}

impl Clone for RecvWr {
    fn clone(&self) -> Self {
        let mut copy = RecvWr::default();
        copy.clone_from(self);
        copy
    }

    /// In place, keeping `self`'s allocations: how a receive queue slot takes a new request.
    fn clone_from(&mut self, source: &Self) {
        self.wr_id = source.wr_id;
        copy_list_into(&mut self.sg_list, &source.sg_list);
    }
}

/// Copies `from` into `to`, keeping `to`'s heap buffer if it has one. A one-element list is
/// rebuilt from its element, which the compiler keeps in registers.
#[inline]
fn copy_list_into(to: &mut SgList, from: &SgList) {
    match from.as_slice() {
        &[one] if !to.spilled() => *to = SgList::from_buf([one]),
        more => {
            to.clear();
            to.extend_from_slice(more);
        }
    }
}

/// Total bytes of a gather/scatter list; `None` if it overflows 32 bits.
pub fn sg_len(sg_list: &[Sge]) -> Option<u32> {
    sg_list
        .iter()
        .try_fold(0u32, |total, sge| total.checked_add(sge.length))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The point of [`SgList`]: no bigger than the `Vec` it replaced.
    #[test]
    fn sg_list_is_as_small_as_a_vec() {
        assert_eq!(size_of::<SgList>(), size_of::<Vec<Sge>>());
        let one: SgList = [Sge {
            addr: 1,
            length: 2,
            lkey: 3,
        }]
        .into();
        assert!(!one.spilled());
    }
}
