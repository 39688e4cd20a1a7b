//! Who may touch memory and what touching it can run into: the access rights (of regions and
//! of QPs), the errors and the atomic operations, shared by the region table (`mr`), the
//! caller's memory (`caller_memory`) and the QP attributes (`qp_state`), which all import it.

use crate::errno;

bitflags::bitflags! {
    /// Memory and QP access rights, with the values of `IBV_ACCESS_*`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct AccessFlags: u32 {
        /// The local HCA may write (receives, READ responses, atomic results).
        const LOCAL_WRITE = 1;
        /// Peers may RDMA WRITE.
        const REMOTE_WRITE = 2;
        /// Peers may RDMA READ.
        const REMOTE_READ = 4;
        /// Peers may perform atomics.
        const REMOTE_ATOMIC = 8;
        /// Memory windows may be bound to the region (`IBV_ACCESS_MW_BIND`).
        const MW_BIND = 16;
    }
}

/// Why a registration or an access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MrError {
    /// No such protection domain.
    #[error("unknown protection domain")]
    UnknownPd,
    /// The PD still has memory regions registered.
    #[error("protection domain still has memory regions")]
    PdBusy,
    /// Remote write or atomic access without local write, which verbs forbids.
    #[error("REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE")]
    InvalidAccess,
    /// The region would wrap around the address space.
    #[error("region wraps around the address space")]
    AddressOverflow,
    /// No region has this key (or it was deregistered).
    #[error("unknown key")]
    UnknownKey,
    /// The region belongs to another protection domain.
    #[error("region belongs to another protection domain")]
    WrongPd,
    /// The region does not grant the access asked for.
    #[error("access not granted")]
    AccessDenied,
    /// The range is not inside the region.
    #[error("range outside the region")]
    OutOfBounds,
    /// An atomic target that is not 8-byte aligned.
    #[error("atomic target not 8-byte aligned")]
    Misaligned,
    /// The region's bytes could not be allocated.
    #[error("out of memory for the region")]
    OutOfMemory,
    /// A caller's memory at address 0.
    #[error("null address")]
    NullAddress,
    /// Longer than the device's `max_mr_size`.
    #[error("region larger than max_mr_size")]
    TooLarge,
    /// Memory windows are bound to the region: it cannot be deregistered (IBTA 10.6.7.2.6).
    #[error("memory windows are bound to the region")]
    WindowsBound,
    /// No memory window has this R_Key (or it was deallocated).
    #[error("unknown memory window")]
    UnknownWindow,
    /// `max_mw` memory windows exist already.
    #[error("no memory windows left")]
    TooManyWindows,
    /// A bind the window's type, state, PD, region or range does not allow (the
    /// operation completes with `IBV_WC_MW_BIND_ERR`).
    #[error("memory window bind refused: {0}")]
    Bind(&'static str),
    /// An invalidation (LOCAL_INV, or a SEND with invalidate) of a key that is not a type 2
    /// window bound here.
    #[error("cannot invalidate: {0}")]
    Invalidate(&'static str),
    /// Nothing (or nothing with the rights needed) is mapped there: an on-demand region's
    /// page fault failed.
    #[error("no page mapped there (on-demand page fault failed)")]
    Unmapped,
    /// A prefetch of a region not registered for on-demand paging.
    #[error("region not registered for on-demand paging")]
    NotOnDemand,
}

/// A remote atomic operation on an 8-byte word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicOp {
    /// Store `swap` if the word equals `compare`.
    CompareSwap {
        /// The value the word must hold.
        compare: u64,
        /// The value stored if it does.
        swap: u64,
    },
    /// Add to the word (wrapping).
    FetchAdd(u64),
    /// Store the value (ATOMIC WRITE); it needs remote write rights, not atomic ones.
    Write(u64),
}

impl AtomicOp {
    /// The right the region (and the QP) must grant.
    pub(crate) fn needs(self) -> AccessFlags {
        match self {
            AtomicOp::Write(_) => AccessFlags::REMOTE_WRITE,
            _ => AccessFlags::REMOTE_ATOMIC,
        }
    }

    /// The word's new value when it held `original`.
    pub(crate) fn apply(self, original: u64) -> u64 {
        match self {
            AtomicOp::CompareSwap { compare, swap } if original == compare => swap,
            AtomicOp::CompareSwap { .. } => original,
            AtomicOp::FetchAdd(add) => original.wrapping_add(add),
            AtomicOp::Write(value) => value,
        }
    }
}

impl MrError {
    /// The errno of a verbs call refused for this reason (`ibv_reg_mr`, `ibv_dealloc_pd`).
    pub fn errno(&self) -> i32 {
        match self {
            MrError::PdBusy => errno::EBUSY,
            MrError::OutOfMemory => errno::ENOMEM,
            MrError::NullAddress | MrError::Unmapped => errno::EFAULT,
            MrError::TooManyWindows => errno::ENOMEM,
            _ => errno::EINVAL,
        }
    }
}
