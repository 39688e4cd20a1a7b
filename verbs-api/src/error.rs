//! Why a verbs call failed, and the errno rdma-core gives for the same failure.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};

use roce_transport::cm::CmError;
use roce_transport::endpoint::CreateQpError;
use roce_transport::mcast::McastError;
use roce_transport::mr::MrError;
use roce_transport::qp::PostError;
use roce_transport::qp_state::ModifyQpError;
use roce_transport::srq::SrqError;
use roce_transport::tm::TmOpError;
use rustix::io::Errno;

/// Why a verbs call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The operating system refused something (opening a socket, AF_XDP, ...).
    #[error(transparent)]
    Io(#[from] io::Error),
    /// Registering or freeing memory failed.
    #[error("memory region: {0}")]
    Mr(#[from] MrError),
    /// A QP transition or attribute was refused, as `ibv_modify_qp` refuses it.
    #[error("modify QP: {0}")]
    ModifyQp(#[from] ModifyQpError),
    /// A work request was refused.
    #[error("post: {0}")]
    Post(#[from] PostError),
    /// A QP could not be created.
    #[error("create QP: {0}")]
    CreateQp(#[from] CreateQpError),
    /// A shared receive queue call was refused.
    #[error("SRQ: {0}")]
    Srq(#[from] SrqError),
    /// A tag-matching list operation was refused, as `ibv_post_srq_ops` refuses it.
    #[error("tag matching: {0}")]
    TagMatching(#[from] TmOpError),
    /// The connection manager refused a call.
    #[error("connection manager: {0}")]
    Cm(#[from] CmError),
    /// A multicast attach or detach was refused.
    #[error("multicast: {0}")]
    Mcast(#[from] McastError),
    /// The engine failed (its backend broke); the context is unusable.
    #[error("the device's engine stopped: {0}")]
    EngineFailed(String),
    /// A thread panicked while holding the device's lock.
    #[error("a thread panicked inside a verbs call; the device is unusable")]
    Poisoned,
    /// An object made from another context.
    #[error("the {0} belongs to another device context")]
    ForeignObject(&'static str),
    /// The object was destroyed underneath.
    #[error("the object no longer exists")]
    Gone,
    /// The object is still in use (a CQ by a QP), as `ibv_destroy_cq` answers `EBUSY`.
    #[error("the {0} is still in use")]
    Busy(&'static str),
    /// A wait ran out of time.
    #[error("timed out")]
    TimedOut,
    /// A CQ lost a completion for want of room; it is unusable, as after `IBV_EVENT_CQ_ERR`.
    #[error("completion queue overflow")]
    CqOverflow,
    /// An offset and length outside a memory region.
    #[error("outside the memory region")]
    OutOfBounds,
    /// No GID at this index.
    #[error("no GID at index {0}")]
    NoGid(u8),
    /// The neighbour's MAC could not be resolved.
    #[error("no neighbour entry for {0} (ARP got no answer)")]
    NoNeighbour(Ipv4Addr),
    /// The IPv6 neighbour's MAC could not be resolved.
    #[error("no neighbour entry for {0} (neighbour discovery got no answer)")]
    NoNeighbour6(Ipv6Addr),
    /// A bad argument.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// Something this implementation does not do yet.
    #[error("not supported yet: {0}")]
    Unsupported(&'static str),
}

impl Error {
    /// The errno rdma-core's verbs (with the rxe provider) return for this failure: what a C
    /// caller sees in `errno` or as the call's result.
    pub fn errno(&self) -> i32 {
        let errno = match self {
            Error::Io(error) => return error.raw_os_error().unwrap_or(Errno::IO.raw_os_error()),
            Error::Mr(error) => return error.errno(),
            Error::Post(error) => return error.errno(),
            Error::CreateQp(error) => return error.errno(),
            Error::ModifyQp(error) => return error.errno(),
            Error::Srq(error) => return error.errno(),
            Error::TagMatching(error) => return error.errno(),
            Error::Mcast(error) => return error.errno(),
            Error::Cm(CmError::AddressInUse) => Errno::ADDRINUSE,
            Error::Cm(CmError::TooManyConnections) => Errno::NOMEM,
            Error::Cm(_) => Errno::INVAL,
            Error::ForeignObject(_)
            | Error::OutOfBounds
            | Error::NoGid(_)
            | Error::InvalidArgument(_) => Errno::INVAL,
            Error::EngineFailed(_) | Error::Poisoned | Error::CqOverflow => Errno::IO,
            Error::Gone => Errno::NOENT,
            Error::Busy(_) => Errno::BUSY,
            Error::TimedOut => Errno::TIMEDOUT,
            Error::NoNeighbour(_) | Error::NoNeighbour6(_) => Errno::HOSTUNREACH,
            Error::Unsupported(_) => Errno::OPNOTSUPP,
        };
        errno.raw_os_error()
    }
}

impl From<Error> for io::Error {
    /// Keeps the message; the kind is that of the errno ([`Error::errno`]).
    fn from(error: Error) -> Self {
        match error {
            Error::Io(error) => error,
            other => {
                let kind = io::Error::from_raw_os_error(other.errno()).kind();
                io::Error::new(kind, other)
            }
        }
    }
}

/// A post that failed: which work request (`bad_wr`) and why. Those before it were posted.
#[derive(Debug, thiserror::Error)]
#[error("work request {index} not posted: {error}")]
pub struct PostFailure {
    /// Index of the first work request not posted.
    pub index: usize,
    /// Why.
    pub error: Error,
}

impl From<PostFailure> for io::Error {
    fn from(failure: PostFailure) -> Self {
        let kind = io::Error::from_raw_os_error(failure.error.errno()).kind();
        io::Error::new(kind, failure)
    }
}
