//! The verbs API of roce-xdp, with rdma-core's names where they fit: RDMA over RoCEv2 on any
//! network interface, in user space.
//!
//! ```text
//! devices() → Context::open → alloc_pd → reg_mr / create_cq (+ create_comp_channel)
//!           → create_qp → connect (or modify through RESET→INIT→RTR→RTS)
//!           → post_send / post_recv → poll / req_notify + get_cq_event
//! ```
//!
//! - **Progress.** A context drives its transport endpoint over a backend (AF_XDP, kernel UDP
//!   sockets, or any [`Backend`](roce_provider::backend::Backend)) from a background thread
//!   that busy-polls or sleeps in poll(2) ([`Progress`]), or from the caller's own posts and
//!   polls ([`Progress::Caller`], lowest latency for one thread).
//! - **Memory.** A region owns its bytes ([`Pd::reg_mr`], [`Pd::reg_mr_buffer`]) and programs
//!   read and write them through [`Mr`], so nothing the peer can write is ever freed or moved
//!   under it; or it covers the program's own memory ([`Pd::reg_mr_raw`], `unsafe`: the
//!   program keeps it mapped until deregistration), as `ibv_reg_mr` does.
//! - **Locking.** With an engine thread, the data path never takes the context's lock:
//!   posting checks the request against the QP's state and room as of the engine's last
//!   round and queues it in the QP's own submission queue; polling reads the CQ's own queue,
//!   which the engine fills after each round. So threads on different QPs and CQs do not
//!   meet, and spinning pollers never hold up the engine. Registering memory, `modify` and
//!   reading or writing a region take the context's lock for the length of the call (never
//!   across a wait). With [`Progress::Caller`] the caller's calls drive the engine, under the
//!   lock.
//! - **Neighbours.** Over AF_XDP the peer's MAC comes from the kernel's table, resolved on
//!   demand when a QP is given a destination or an address handle is created.
//! - **Errors** are typed ([`Error`]); posts report which work request failed
//!   ([`PostFailure`]).
//!
//! - **GIDs.** rxe's table: index 0 the link-local IPv6 GID from the MAC, then the
//!   IPv4-mapped GID of each IPv4 address, then each other IPv6 address. Over AF_XDP both
//!   IPv4-mapped and IPv6 GIDs carry traffic (IPv4 from the interface's first address; IPv6
//!   from the GID the address vector's `sgid_index` names); kernel UDP sockets carry IPv4.
//!
//! Not yet: shared receive queues, memory windows, a C ABI.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod context;
mod cq;
pub mod device;
mod mr;
mod neighbour;
mod qp;

use std::net::Ipv4Addr;

pub use context::{BackendChoice, BackendKind, Context, OpenOptions, Progress};
pub use cq::{CompChannel, Cq};
pub use device::{devices, Device, DeviceAttr, Gid, PortAttr, PortState};
pub use mr::{Mr, Pd};
pub use qp::{AddressHandle, ConnectOptions, PostFailure, Qp, QpEndpoint, QpInitAttr};

pub use roce_provider::engine::{Addressing, EngineStats};
pub use roce_provider::xdp::XdpMode;
pub use roce_transport::cq::{WcOpcode, WcStatus, WorkCompletion};
pub use roce_transport::endpoint::AsyncEvent;
pub use roce_transport::qp::{QpCaps, QpStats};
pub use roce_transport::qp_state::{AddressVector, PathMtu, QpAttr, QpState, QpType, RetryConfig};
pub use roce_transport::wr::{RecvWr, SendFlags, SendOp, SendWr, SgList, Sge, UdDest};
pub use roce_transport::{AccessFlags, CqId};
pub use roce_wire::aeth::RnrTimer;
pub use roce_wire::Psn;

/// Why a verbs call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The operating system refused something (opening a socket, AF_XDP, ...).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Registering or freeing memory failed.
    #[error("memory region: {0}")]
    Mr(#[from] roce_transport::mr::MrError),
    /// A QP transition or attribute was refused, as `ibv_modify_qp` refuses it.
    #[error("modify QP: {0}")]
    ModifyQp(#[from] roce_transport::qp_state::ModifyQpError),
    /// A work request was refused.
    #[error("post: {0}")]
    Post(#[from] roce_transport::qp::PostError),
    /// A QP could not be created.
    #[error("create QP: {0}")]
    CreateQp(#[from] roce_transport::endpoint::CreateQpError),
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
    NoNeighbour6(std::net::Ipv6Addr),
    /// A bad argument.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// Something this implementation does not do yet.
    #[error("not supported yet: {0}")]
    Unsupported(&'static str),
}

impl From<Error> for std::io::Error {
    fn from(error: Error) -> Self {
        match error {
            Error::Io(error) => error,
            Error::TimedOut => std::io::Error::new(std::io::ErrorKind::TimedOut, error),
            other => std::io::Error::other(other),
        }
    }
}

impl From<PostFailure> for std::io::Error {
    fn from(failure: PostFailure) -> Self {
        std::io::Error::other(failure)
    }
}
