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
//!   polls ([`Progress::Caller`], lowest latency for one thread). Every context of a device
//!   in one process drives the same endpoint (one QP number space, one loopback), each with
//!   async events of its own.
//! - **Memory.** A region owns its bytes ([`Pd::reg_mr`], [`Pd::reg_mr_buffer`]) and programs
//!   read and write them through [`Mr`], so nothing the peer can write is ever freed or moved
//!   under it; or it covers the program's own memory ([`Pd::reg_mr_raw`], `unsafe`: the
//!   program keeps it mapped until deregistration), as `ibv_reg_mr` does; or it pages on
//!   demand ([`Pd::reg_mr_on_demand`], [`Pd::reg_mr_implicit`]: nothing need be mapped, an
//!   access where nothing is fails). [`Mr::rereg`] changes a region's PD, rights and memory
//!   under the same keys.
//! - **Locking.** The data path never takes the context's lock: a QP's send and receive
//!   queues and a CQ's queue are single-producer/single-consumer rings between the object
//!   and the engine; posting checks a request against the QP's state as published when it
//!   changed and its room as of the engine's last round, writes it into the ring and rings
//!   the QP's doorbell; polling reads the CQ's ring. So threads on different QPs and CQs do
//!   not meet, and spinning pollers never hold up the engine. Progress is one kind of round
//!   whoever runs it: the background thread, a poll that finds its ring short, a send to an
//!   idle QP ([`Progress::Caller`]: no thread, only those). Registering memory, `modify`
//!   and reading or writing a region take the context's lock for the length of the call
//!   (never across a wait).
//! - **Neighbours.** Over AF_XDP the peer's MAC comes from the kernel's table, resolved on
//!   demand when a QP is given a destination or an address handle is created.
//! - **Errors** are typed ([`Error`]) and each has rdma-core's errno ([`Error::errno`]);
//!   posts report which work request failed ([`PostFailure`]). The device's limits
//!   ([`Device::query`]) are enforced where rdma-core's rxe provider enforces them.
//! - **Lifetimes.** Handles free their object on drop; a QP keeps its PD and CQs alive, a CQ
//!   its channel. The explicit `destroy` of a CQ or channel still in use is refused with
//!   [`Error::Busy`] (`EBUSY`), as `ibv_destroy_cq` refuses it.
//! - **Async events** ([`Context::get_async_event`]) wait in a queue whose fd
//!   ([`Context::async_fd`]) polls readable while any wait.
//! - **GIDs.** rxe's table: index 0 the link-local IPv6 GID from the MAC, then the
//!   IPv4-mapped GID of each IPv4 address, then each other IPv6 address. Over AF_XDP both
//!   IPv4-mapped and IPv6 GIDs carry traffic (IPv4 from the interface's first address; IPv6
//!   from the GID the address vector's `sgid_index` names); kernel UDP sockets carry IPv4.
//!
//! - **Shared receive queues** ([`Pd::create_srq`], [`Pd::create_qp_with_srq`]): receives
//!   posted once for many QPs, with the limit event among the async events.
//! - **XRC** ([`Context::open_xrcd`], [`Pd::create_xrc_srq`], [`Xrcd::create_recv_qp`],
//!   [`QpType::XrcSend`]): XRC domains, XRC SRQs and both halves of XRC connections.
//! - **UD multicast** ([`Qp::attach_mcast`], [`CmId::join_multicast`]): a datagram to a group
//!   reaches every attached QP; rdma_cm's join joins the host to the group (IGMP, by the
//!   kernel), as for rxe.
//!
//! - **Memory windows** ([`Pd::alloc_mw`], [`Qp::bind_mw`], [`SendOp::BindMw`],
//!   [`SendOp::LocalInv`]): type 1 and type 2 windows as rxe gives them.
//!
//! The code, each module importing only those listed before it: `error`, `device`,
//! `options`, `ring` (a lock-free single-producer/single-consumer ring), `queues` (what the
//! engine shares with posters and pollers outside the lock: the rings, the doorbells),
//! `async_events` (each context's queue of them),
//! `iova` (region addresses), `limits` (the device's limits), `neighbour`, `backend`
//! (choosing one), `cm_routes` (where CM events go), `groups` (multicast attachments and the
//! interface's part in them), `core` (the state behind the lock), `shared` (what every object holds),
//! `path` (destinations), `wait` (blocking on an event queue), `engine_thread`; then one
//! module per object: `mr` (PD and MR), `channel`, `cq`, `ah`, `handshake`, `xrc` (XRC
//! domains), `srq`, `qp`, `mw`,
//! `context`, the public front that opens a device and makes the objects, `counters` (its
//! rxe-named counters), `mcast` (attaching QPs to multicast groups), and `cm`, the
//! connection manager (rdma_cm) over it.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod ah;
mod async_events;
mod backend;
mod channel;
mod cm;
mod cm_routes;
mod context;
mod core;
mod counters;
mod cq;
pub mod device;
mod engine_thread;
mod error;
mod groups;
mod handshake;
mod iova;
mod limits;
mod mcast;
mod mr;
mod mw;
mod neighbour;
mod options;
mod path;
mod qp;
mod queues;
mod ring;
mod shared;
mod srq;
pub mod sysfs;
mod tm;
mod wait;
mod xrc;

pub use ah::AddressHandle;
pub use backend::{BackendKind, SwitchLink};
pub use channel::CompChannel;
pub use cm::{
    CmEvent, CmEventKind, CmId, ConnParam, ConnReply, ConnectRequest, EventChannel, McastJoin,
    PathRecord, UdParam, MAX_CONNECT_PRIVATE_DATA, RDMA_UDP_QKEY,
};
pub use context::Context;
pub use cq::Cq;
pub use device::{devices, Device, DeviceAttr, Gid, PortAttr, PortState};
pub use error::{Error, PostFailure};
pub use handshake::{ConnectOptions, QpEndpoint};
pub use mr::{Mr, Pd, Rereg};
pub use mw::{inc_rkey, Mw, MwBindInfo};
pub use options::{BackendChoice, CmTiming, FrameLoss, OpenOptions, Progress};
pub use qp::{Qp, QpInitAttr};
pub use roce_transport::congestion::{CongestionConfig, QpRate, Rate, RateLimit};
pub use roce_transport::Counters;
pub use srq::Srq;
pub use xrc::Xrcd;

pub use roce_provider::engine::{Addressing, EngineStats};
pub use roce_provider::xdp::XdpMode;
pub use roce_transport::cq::{TmFlags, TmInfo, WcOpcode, WcStatus, WorkCompletion};
pub use roce_transport::endpoint::AsyncEvent;
pub use roce_transport::mr::MwType;
pub use roce_transport::qp::{QpCaps, QpStats};
pub use roce_transport::qp_state::{AddressVector, PathMtu, QpAttr, QpState, QpType, RetryConfig};
pub use roce_transport::srq::{SrqAttr, SrqModify};
pub use roce_transport::tm::{TmOp, TmOpWr, TmSrqCaps, TmStats};
pub use roce_transport::wr::{
    MwBind, MwId, RecvWr, SendFlags, SendOp, SendWr, SgList, Sge, UdDest,
};
pub use roce_transport::xrc::XrcdId;
pub use roce_transport::{AccessFlags, CqId, SrqId};
pub use roce_wire::aeth::RnrTimer;
pub use roce_wire::Psn;
