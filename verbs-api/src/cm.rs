//! The connection manager as librdmacm offers it (`rdma_cm`): event channels, CM ids,
//! address and route resolution, listen/connect/accept/reject/disconnect, and events that
//! mirror `RDMA_CM_EVENT_*`. The IB CM protocol itself runs in the context's endpoint, on
//! QP 1, and speaks with the Linux kernel's CM.
//!
//! ```text
//! active:  create_event_channel → create_id → resolve_addr (AddrResolved)
//!          → resolve_route (RouteResolved) → create_qp → connect (Established)
//! passive: create_id → bind_addr → listen (ConnectRequest with a new id) → create_qp
//!          → accept (Established)
//! either:  disconnect (Disconnected on both sides; the QPs go to ERR)
//! ```
//!
//! An event channel spans devices, as rdma_cm's does: [`EventChannel::new`] belongs to none,
//! and each id is created on the context of its device ([`Context::create_id`]; a C face
//! picks the device an address belongs to). Ids are RC (`RDMA_PS_TCP`) only for now. Resolution is
//! synchronous (it finishes before the call returns) but reported as events, as rdma_cm
//! does: the source is the device's address of the destination's family and the peer's MAC
//! comes from the kernel's neighbour table (or the caller's, for a custom backend).
//! Connecting writes rdma_cm's private-data header ([`roce_wire::cm::cma`]) in front of the
//! caller's private data; a connect request hands the caller only what follows it.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use roce_transport::cm::{
    AcceptParams, CmEvent as TransportEvent, ConnId, ConnectParams, ConnectRequest as Request,
    ServiceId,
};
use roce_wire::cm::cma::{self, Addresses};
use roce_wire::cm::req::{self, ServiceType};
use roce_wire::cm::{rej, PortSpace};

pub use crate::cm_routes::ConnReply;
use crate::cm_routes::{apply_qp_attrs, is_any, to_error, ContextKey, Notice, Route, What};
use crate::context::Context;
use crate::error::Error;
use crate::mr::Pd;
use crate::qp::{Qp, QpInitAttr};
use crate::queues::EventQueue;
use crate::shared::Shared;
use crate::{PathMtu, QpState, QpType};

mod mcast;
mod own_qp;
mod ud;

pub use mcast::McastJoin;
pub use own_qp::PathRecord;
pub use ud::{UdParam, RDMA_UDP_QKEY};

/// Private data a connect carries after rdma_cm's header (`RDMA_MAX_PRIVATE_DATA` for a REQ
/// over IP: 92 − 36).
pub const MAX_CONNECT_PRIVATE_DATA: usize = req::PRIVATE_DATA_LEN - cma::HEADER_LEN;

/// First port handed out to an id bound to port 0 or connecting without binding one.
const EPHEMERAL_PORTS: u16 = 0xC000;

/// An event's status for a call made in the wrong order (as the kernel's `-EINVAL`).
const EINVAL: i32 = 22;

/// IP hop limit of connections (the kernel's default TTL for RoCE paths).
const HOP_LIMIT: u8 = 64;

/// How long a wait for a CM event sleeps before looking at the devices again.
const WAIT_SLICE: Duration = Duration::from_millis(100);
/// How long one round of a caller-driven wait sleeps in the backend.
const CALLER_WAIT_SLICE: Duration = Duration::from_millis(1);

/// An event channel (`rdma_event_channel`): its fd polls readable while events wait. It
/// belongs to no device: its ids' contexts report to it.
pub struct EventChannel {
    queue: Arc<EventQueue<Notice>>,
    /// The contexts of its ids: a caller-driven one is driven while waiting; the first is
    /// where [`create_id`](Self::create_id) makes ids.
    contexts: Mutex<Vec<Weak<Shared>>>,
}

/// What `rdma_connect` and `rdma_accept` take (`struct rdma_conn_param`, RC fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data for the peer (at most [`MAX_CONNECT_PRIVATE_DATA`] on a connect, 196 on
    /// an accept).
    pub private_data: Vec<u8>,
    /// READs and atomics our QP accepts at once.
    pub responder_resources: u8,
    /// READs and atomics our QP issues at once.
    pub initiator_depth: u8,
    /// Transport retries (connect only; at most 7).
    pub retry_count: u8,
    /// RNR retries (at most 7, which is infinite).
    pub rnr_retry_count: u8,
}

impl Default for ConnParam {
    /// rping's: one READ each way, 7 retries of each kind.
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
        }
    }
}

/// A connect request as the listener sees it (`RDMA_CM_EVENT_CONNECT_REQUEST`).
pub struct ConnectRequest {
    /// The new connection's id: [`accept`](CmId::accept) or [`reject`](CmId::reject) it.
    pub id: CmId,
    /// The requester's private data, after rdma_cm's header (56 bytes over IP).
    pub private_data: Vec<u8>,
    /// READs and atomics the requester accepts at once.
    pub responder_resources: u8,
    /// READs and atomics the requester issues at once.
    pub initiator_depth: u8,
    /// The requester's QP number.
    pub remote_qpn: u32,
}

impl fmt::Debug for ConnectRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectRequest")
            .field("id", &self.id.handle())
            .field("remote_qpn", &self.remote_qpn)
            .finish_non_exhaustive()
    }
}

/// What happened (`enum rdma_cm_event_type`).
#[derive(Debug)]
#[non_exhaustive]
pub enum CmEventKind {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED`.
    AddrResolved,
    /// `RDMA_CM_EVENT_ADDR_ERROR`, with the negative errno.
    AddrError(i32),
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED`.
    RouteResolved,
    /// `RDMA_CM_EVENT_ROUTE_ERROR`, with the negative errno.
    RouteError(i32),
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`, on the listening id.
    ConnectRequest(Box<ConnectRequest>),
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE`: the REP came for a QP the program moves itself
    /// ([`CmId::connect_program_qp`]); it moves it with [`CmId::qp_attr`], then calls
    /// [`CmId::establish`].
    ConnectResponse,
    /// `RDMA_CM_EVENT_CONNECT_ERROR`: the peer's answer could not be applied to the QP.
    ConnectError,
    /// `RDMA_CM_EVENT_UNREACHABLE`: the peer never answered.
    Unreachable,
    /// `RDMA_CM_EVENT_REJECTED`, with the IB CM reject reason as status (28 for a consumer
    /// reject, 8 for a port nobody listens on) and the REJ's private data.
    Rejected {
        /// The reject reason.
        reason: u16,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// `RDMA_CM_EVENT_ESTABLISHED`.
    Established,
    /// `RDMA_CM_EVENT_ESTABLISHED` on a UD id: the service's QP
    /// ([`CmId::ud_address`] is where it is).
    UdEstablished(UdParam),
    /// `RDMA_CM_EVENT_UNREACHABLE` on a UD id: the service refused or does not exist, with
    /// the SIDR_REP's status (1 unsupported service, 2 rejected).
    UdUnreachable(u8),
    /// `RDMA_CM_EVENT_DISCONNECTED`; the QP is in ERR.
    Disconnected,
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`.
    TimewaitExit,
    /// `RDMA_CM_EVENT_MULTICAST_JOIN`: the group joined with
    /// [`CmId::join_multicast`], and how to send to it.
    MulticastJoin(McastJoin),
}

impl CmEventKind {
    /// The `RDMA_CM_EVENT_*` number (rdma_cma.h).
    pub fn code(&self) -> u32 {
        match self {
            CmEventKind::AddrResolved => 0,
            CmEventKind::AddrError(_) => 1,
            CmEventKind::RouteResolved => 2,
            CmEventKind::RouteError(_) => 3,
            CmEventKind::ConnectRequest(_) => 4,
            CmEventKind::ConnectResponse => 5,
            CmEventKind::ConnectError => 6,
            CmEventKind::Unreachable | CmEventKind::UdUnreachable(_) => 7,
            CmEventKind::Rejected { .. } => 8,
            CmEventKind::Established | CmEventKind::UdEstablished(_) => 9,
            CmEventKind::Disconnected => 10,
            CmEventKind::MulticastJoin(_) => 12,
            CmEventKind::TimewaitExit => 15,
        }
    }
}

/// An event (`struct rdma_cm_event`): which id it is for ([`CmId::handle`]) and what
/// happened. Nothing to acknowledge: it is taken once.
#[derive(Debug)]
pub struct CmEvent {
    /// The id's handle (for a connect request, the listener's).
    pub id: u64,
    /// What happened.
    pub kind: CmEventKind,
    /// On the active side's `CONNECT_RESPONSE` and `ESTABLISHED`: the REP.
    pub reply: Option<ConnReply>,
}

impl Context {
    /// Creates an event channel (`rdma_create_event_channel`) whose
    /// [`create_id`](EventChannel::create_id) makes ids on this device.
    pub fn create_event_channel(&self) -> Result<EventChannel, Error> {
        let channel = EventChannel::new()?;
        channel.attach(self.shared())?;
        Ok(channel)
    }

    /// Creates an RC id (`rdma_create_id` with `RDMA_PS_TCP`) on this device whose events go
    /// to `channel`.
    pub fn create_id(&self, channel: &EventChannel) -> Result<CmId, Error> {
        channel.attach(self.shared())?;
        let number = self.shared().lock()?.cm.new_id();
        Ok(CmId::new(
            self.shared(),
            &channel.queue,
            number,
            IdState::default(),
        ))
    }
}

impl EventChannel {
    /// An event channel of no device (`rdma_create_event_channel`).
    pub fn new() -> Result<EventChannel, Error> {
        Ok(EventChannel {
            queue: Arc::new(EventQueue::new()?),
            contexts: Mutex::new(Vec::new()),
        })
    }

    /// Remembers a context whose ids report here (once).
    fn attach(&self, shared: &Arc<Shared>) -> Result<(), Error> {
        let mut contexts = self.contexts.lock().map_err(|_| Error::Poisoned)?;
        contexts.retain(|context| context.strong_count() > 0);
        if !contexts
            .iter()
            .any(|context| std::ptr::eq(context.as_ptr(), Arc::as_ptr(shared)))
        {
            contexts.push(Arc::downgrade(shared));
        }
        Ok(())
    }

    fn contexts(&self) -> Result<Vec<Arc<Shared>>, Error> {
        let contexts = self.contexts.lock().map_err(|_| Error::Poisoned)?;
        Ok(contexts.iter().filter_map(Weak::upgrade).collect())
    }

    /// The context among this channel's whose CM `key` names.
    fn context_of(&self, key: ContextKey) -> Option<Arc<Shared>> {
        self.contexts()
            .ok()?
            .into_iter()
            .find(|shared| shared.lock().is_ok_and(|core| core.cm.context() == key))
    }

    /// Creates an RC id (`rdma_create_id` with `RDMA_PS_TCP`) on the device of the channel's
    /// first id, or the one [`Context::create_event_channel`] made it for.
    pub fn create_id(&self) -> Result<CmId, Error> {
        let shared = self
            .contexts()?
            .into_iter()
            .next()
            .ok_or(Error::InvalidArgument(
                "a channel of no device: use Context::create_id",
            ))?;
        let number = shared.lock()?.cm.new_id();
        Ok(CmId::new(&shared, &self.queue, number, IdState::default()))
    }

    /// Waits for the next event (`rdma_get_cm_event`): `None` waits for ever; a timeout
    /// gives [`Error::TimedOut`]. A context nobody else drives is driven meanwhile.
    pub fn get_cm_event(&self, timeout: Option<Duration>) -> Result<CmEvent, Error> {
        let deadline = timeout.and_then(|timeout| Instant::now().checked_add(timeout));
        loop {
            if let Some(event) = self.try_get_cm_event()? {
                return Ok(event);
            }
            let left = deadline.map(|at| at.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return Err(Error::TimedOut);
            }
            let driven = self.contexts()?;
            let driven: Vec<_> = driven
                .iter()
                .filter(|shared| shared.caller_drives())
                .collect();
            let slice = if driven.is_empty() {
                WAIT_SLICE
            } else {
                CALLER_WAIT_SLICE
            };
            let slice = left.map_or(slice, |left| left.min(slice));
            if let Some(shared) = driven.first() {
                // Sleep in one backend; the others are driven by `try_get_cm_event`.
                let mut core = shared.lock()?;
                shared.drive_waiting(&mut core, slice)?;
                continue;
            }
            // In slices, so a failed engine is noticed.
            let timeout = rustix::event::Timespec::try_from(slice).map_err(|_| Error::TimedOut)?;
            let mut fds = [rustix::event::PollFd::new(
                &*self.queue,
                rustix::event::PollFlags::IN,
            )];
            match rustix::event::poll(&mut fds, Some(&timeout)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(error) => return Err(io::Error::from(error).into()),
            }
        }
    }

    /// The next event if one waits, without blocking (`rdma_get_cm_event` on an
    /// `O_NONBLOCK` fd; `None` is its `EAGAIN`).
    pub fn try_get_cm_event(&self) -> Result<Option<CmEvent>, Error> {
        for shared in self.contexts()? {
            if shared.caller_drives() {
                let mut core = shared.lock()?;
                shared.drive(&mut core)?;
            }
            shared.check_running()?;
        }
        while let Some(notice) = self.queue.pop() {
            if let Some(event) = self.event(notice) {
                return Ok(Some(event));
            }
        }
        Ok(None)
    }

    /// The event a notice tells; none for a request whose device is closed or that the
    /// listener does not take.
    fn event(&self, notice: Notice) -> Option<CmEvent> {
        let mut reply = None;
        let kind = match notice.what {
            What::AddrResolved => CmEventKind::AddrResolved,
            What::AddrError(errno) => CmEventKind::AddrError(errno),
            What::RouteResolved => CmEventKind::RouteResolved,
            What::RouteError(errno) => CmEventKind::RouteError(errno),
            What::ConnectError => CmEventKind::ConnectError,
            What::ConnectResponse(rep) => {
                reply = Some(*rep);
                CmEventKind::ConnectResponse
            }
            What::Established(rep) => {
                reply = rep.map(|rep| *rep);
                CmEventKind::Established
            }
            What::MulticastJoin { join, live } => {
                if !mcast::still_joined(&live) {
                    return None;
                }
                CmEventKind::MulticastJoin(*join)
            }
            What::Request {
                new_id,
                conn,
                taken,
                request,
                context,
            } => {
                let shared = self.context_of(context)?;
                let request = self.request(&shared, new_id, conn, &request);
                if !taken {
                    // For an address the listener is not on: rejected (consumer defined,
                    // as the kernel's rdma_cm), to the peer's MAC, learnt first.
                    if let Some((_, dgid)) = request.id.gids() {
                        let _ = shared.resolve(dgid);
                    }
                    let _ = request.id.reject(&[]);
                    return None;
                }
                CmEventKind::ConnectRequest(Box::new(request))
            }
            What::SidrRequest {
                new_id,
                request,
                context,
            } => {
                let shared = self.context_of(context)?;
                CmEventKind::ConnectRequest(Box::new(self.ud_request(&shared, new_id, &request)?))
            }
            What::Cm(event) => match *event {
                TransportEvent::Established { .. } => CmEventKind::Established,
                TransportEvent::Unreachable { .. } => CmEventKind::Unreachable,
                TransportEvent::Disconnected { .. } => CmEventKind::Disconnected,
                TransportEvent::TimewaitExit { .. } => CmEventKind::TimewaitExit,
                TransportEvent::Rejected {
                    reason,
                    private_data,
                    ..
                } => CmEventKind::Rejected {
                    reason: reason.0,
                    private_data: private_data[..rej::PRIVATE_DATA_LEN].to_vec(),
                },
                TransportEvent::SidrResolved {
                    qpn,
                    qkey,
                    private_data,
                    ..
                } => CmEventKind::UdEstablished(UdParam {
                    qp_num: qpn,
                    qkey,
                    private_data: private_data.to_vec(),
                }),
                TransportEvent::SidrRejected { status, .. } => CmEventKind::UdUnreachable(status.0),
                // `cm_routes` sends no other CM event to a channel.
                _ => CmEventKind::ConnectError,
            },
        };
        Some(CmEvent {
            id: notice.id,
            kind,
            reply,
        })
    }

    /// The passive id of a REQ, and what the listener is told of it.
    fn request(
        &self,
        shared: &Arc<Shared>,
        number: u64,
        conn: ConnId,
        request: &Request,
    ) -> ConnectRequest {
        let req = &request.req;
        let header = cma::Packet::new_checked(&req.private_data[..])
            .and_then(|packet| cma::Repr::parse(&packet))
            .ok();
        let port = match request.service_id.port_space() {
            Some(_) => request.service_id.0 as u16,
            None => 0,
        };
        let (src, dst) = match header.map(|header| (header.src_port, header.addresses)) {
            Some((src_port, Addresses::V4 { src, dst })) => (
                Some(SocketAddr::new(IpAddr::V4(src), src_port)),
                Some(SocketAddr::new(IpAddr::V4(dst), port)),
            ),
            Some((src_port, Addresses::V6 { src, dst })) => (
                Some(socket_addr(shared, IpAddr::V6(src), src_port)),
                Some(socket_addr(shared, IpAddr::V6(dst), port)),
            ),
            None => (None, None),
        };
        let state = IdState {
            // Our side is the destination of the request.
            src: dst,
            dst: src,
            sgid_index: shared
                .device
                .gids
                .iter()
                .position(|gid| *gid == request.local_gid),
            dgid: Some(request.remote_gid),
            conn: Some(conn),
            remote_qpn: Some(req.local_qpn),
            ..IdState::default()
        };
        let skip = if header.is_some() { cma::HEADER_LEN } else { 0 };
        ConnectRequest {
            id: CmId::new(shared, &self.queue, number, state),
            private_data: req.private_data[skip..].to_vec(),
            responder_resources: req.responder_resources,
            initiator_depth: req.initiator_depth,
            remote_qpn: req.local_qpn,
        }
    }
}

/// `ip`:`port`, a link-local IPv6 address scoped to the device's interface.
fn socket_addr(shared: &Shared, ip: IpAddr, port: u16) -> SocketAddr {
    match ip {
        IpAddr::V6(ip) if ip.is_unicast_link_local() => {
            SocketAddr::V6(SocketAddrV6::new(ip, port, 0, shared.device.ifindex))
        }
        ip => SocketAddr::new(ip, port),
    }
}

impl fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventChannel").finish_non_exhaustive()
    }
}

impl AsFd for EventChannel {
    /// Readable while events wait to be taken.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.queue.as_fd()
    }
}

/// What [`CmId::outgoing`] settles for a connect or SIDR request.
struct Outgoing {
    private: Vec<u8>,
    /// The service's port.
    port: u16,
    dgid: [u8; 16],
    sgid_index: usize,
}

#[derive(Debug, Default)]
struct IdState {
    /// Our address and port.
    src: Option<SocketAddr>,
    /// The peer's.
    dst: Option<SocketAddr>,
    /// Our GID's index in the device's table.
    sgid_index: Option<usize>,
    /// The peer's GID, once its address is resolved.
    dgid: Option<[u8; 16]>,
    route_resolved: bool,
    conn: Option<ConnId>,
    listening: Option<ServiceId>,
    qpn: Option<u32>,
    remote_qpn: Option<u32>,
    /// A UD id (`RDMA_PS_UDP`): SIDR instead of a connection.
    ud: bool,
    /// The multicast groups it joined.
    joins: Vec<mcast::Joined>,
    /// The local ACK timeout its QP gets at RTS (`RDMA_OPTION_ID_ACK_TIMEOUT`), if set.
    ack_timeout: Option<u8>,
    /// The traffic class (TOS) of its connection (`rdma_set_option`'s
    /// `RDMA_OPTION_ID_TOS`): in the REQ's path, so both QPs send with it.
    tos: u8,
}

/// A CM id (`struct rdma_cm_id`): an endpoint of one connection, or a listener.
/// Dropping it destroys it (`rdma_destroy_id`): a connection still set up is rejected or
/// disconnected, a listener stops listening.
pub struct CmId {
    shared: Arc<Shared>,
    /// Its channel's queue ([`migrate`](Self::migrate) changes it).
    queue: Mutex<Arc<EventQueue<Notice>>>,
    number: u64,
    state: Mutex<IdState>,
}

impl CmId {
    fn new(
        shared: &Arc<Shared>,
        queue: &Arc<EventQueue<Notice>>,
        number: u64,
        state: IdState,
    ) -> CmId {
        CmId {
            shared: Arc::clone(shared),
            queue: Mutex::new(Arc::clone(queue)),
            number,
            state: Mutex::new(state),
        }
    }

    /// `rdma_set_option(RDMA_OPTION_ID_TOS)`: the IP header's DSCP and ECN bits (IPv6
    /// traffic class) of the connection it will make; the ECN bits are ECT(0) while the
    /// device marks its packets ECN-capable (see `roce_transport::congestion`).
    pub fn set_tos(&self, tos: u8) -> Result<(), Error> {
        self.state()?.tos = tos;
        Ok(())
    }

    /// What events for this id carry as [`CmEvent::id`].
    pub fn handle(&self) -> u64 {
        self.number
    }

    /// Our address and port, once bound or resolved.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.state().ok()?.src
    }

    /// Whether the id is bound to one of the device's own addresses: not unbound, nor bound
    /// to the wildcard or a loopback address, which the kernel takes alike (`cma_any_addr`)
    /// and which leave `rdma_cm_id.verbs` NULL until a peer is resolved.
    pub fn bound_to_device(&self) -> bool {
        self.local_addr().is_some_and(|addr| !is_any(addr.ip()))
    }

    /// The peer's address and port.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.state().ok()?.dst
    }

    fn state(&self) -> Result<MutexGuard<'_, IdState>, Error> {
        self.state.lock().map_err(|_| Error::Poisoned)
    }

    fn queue(&self) -> Result<Arc<EventQueue<Notice>>, Error> {
        Ok(Arc::clone(
            &*self.queue.lock().map_err(|_| Error::Poisoned)?,
        ))
    }

    fn tell(&self, what: What) {
        if let Ok(queue) = self.queue() {
            queue.push(Notice {
                id: self.number,
                what,
            });
        }
    }

    /// Our GID and the peer's, once the address is resolved or the request came.
    pub fn gids(&self) -> Option<([u8; 16], [u8; 16])> {
        let state = self.state().ok()?;
        Some((self.shared.device.gids[state.sgid_index?], state.dgid?))
    }

    /// The peer's QP number (the REQ's or the REP's), once known.
    pub fn remote_qpn(&self) -> Option<u32> {
        self.state().ok()?.remote_qpn
    }

    /// Sends this id's events, from now on, to `channel` (`rdma_migrate_id`). Events
    /// already waiting on the old channel stay there.
    pub fn migrate(&self, channel: &EventChannel) -> Result<(), Error> {
        channel.attach(&self.shared)?;
        let mut queue = self.queue.lock().map_err(|_| Error::Poisoned)?;
        let mut core = self.shared.lock()?;
        let cm = &mut core.cm;
        let routes = cm.listeners.values_mut().chain(cm.conns.values_mut());
        for route in routes.filter(|route| route.id == self.number) {
            route.queue = Arc::clone(&channel.queue);
        }
        *queue = Arc::clone(&channel.queue);
        Ok(())
    }

    fn route(&self, qpn: Option<u32>) -> Result<Route, Error> {
        Ok(Route {
            id: self.number,
            queue: self.queue()?,
            qpn,
            program_qp: false,
            bound: None,
            reply: None,
            ack_timeout: None,
        })
    }

    /// Sets the local ACK timeout (4.096 µs × 2^`timeout`) its QP gets when the connection
    /// moves it to RTS, in place of the one derived from the packet lifetime
    /// (`rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)`); `rdma_init_qp_attr` reports it too.
    pub fn set_ack_timeout(&self, timeout: u8) -> Result<(), Error> {
        if timeout > 31 {
            return Err(Error::InvalidArgument("an ACK timeout above 31"));
        }
        self.state()?.ack_timeout = Some(timeout);
        Ok(())
    }

    /// The index of our GID for a peer at `dst`, as the kernel picks the source address:
    /// the IPv4-mapped GID of the device's first IPv4 address; for IPv6 an address of the
    /// same scope (link-local or not), the one sharing the longest prefix with `dst`
    /// (RFC 6724's last rule), the first of equals.
    fn source_gid(&self, dst: IpAddr) -> Option<usize> {
        let gids = &self.shared.device.gids;
        match dst {
            IpAddr::V4(_) => self.gid_of(IpAddr::V4(self.shared.device.ipv4()?)),
            IpAddr::V6(dst) => gids
                .iter()
                .map(|gid| Ipv6Addr::from(*gid))
                .enumerate()
                .filter(|(_, gid)| {
                    // The wildcard (a listener's) takes any, if only the link-local GID 0.
                    gid.to_ipv4_mapped().is_none()
                        && (dst.is_unspecified()
                            || gid.is_unicast_link_local() == dst.is_unicast_link_local())
                })
                .min_by_key(|&(index, gid)| {
                    let differ = u128::from(gid) ^ u128::from(dst);
                    (std::cmp::Reverse(differ.leading_zeros()), index)
                })
                .map(|(index, _)| index),
        }
    }

    /// The index of the GID that is `ip` (an IPv4 address's IPv4-mapped GID).
    fn gid_of(&self, ip: IpAddr) -> Option<usize> {
        let gid = match ip {
            IpAddr::V4(ip) => ip.to_ipv6_mapped().octets(),
            IpAddr::V6(ip) => ip.octets(),
        };
        self.shared.device.gids.iter().position(|ours| *ours == gid)
    }

    /// A link-local IPv6 address names its interface by scope id, which must be this
    /// device's; binding to one without it is `EINVAL`, as in the kernel
    /// (`cma_check_linklocal`). A peer's may leave it 0: this device's link.
    fn check_scope(&self, addr: SocketAddr, required: bool) -> Result<(), Error> {
        let SocketAddr::V6(addr) = addr else {
            return Ok(());
        };
        match addr.scope_id() {
            _ if !addr.ip().is_unicast_link_local() => Ok(()),
            0 if !required => Ok(()),
            0 => Err(Error::InvalidArgument(
                "a link-local address without its interface's scope id",
            )),
            scope if scope == self.shared.device.ifindex => Ok(()),
            _ => Err(Error::InvalidArgument(
                "a link-local address of another interface",
            )),
        }
    }

    /// Binds the id to one of the device's addresses and a port (`rdma_bind_addr`); port 0
    /// takes a free one. The wildcard of a family (or its loopback address) takes
    /// our address for it once a peer is resolved; a listener bound to the IPv6 wildcard
    /// takes IPv4 requests too.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<(), Error> {
        self.check_scope(addr, true)?;
        let index = match addr.ip() {
            // The wildcard, or a loopback address, which binds no device as the wildcard
            // does (the kernel's `cma_any_addr`); the address is kept as given.
            ip if is_any(ip) => {
                let wildcard = match ip {
                    IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                    IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                };
                self.source_gid(wildcard)
                    .ok_or(Error::InvalidArgument("no GID of this address family"))?
            }
            // IPv4 leaves from the first address only (see `check_path`).
            IpAddr::V4(ip) if Some(ip) != self.shared.device.ipv4() => {
                return Err(Error::InvalidArgument("not an address of this device"))
            }
            ip => self
                .gid_of(ip)
                .ok_or(Error::InvalidArgument("not an address of this device"))?,
        };
        let mut addr = addr;
        if addr.port() == 0 {
            // As the kernel's `cma_alloc_any_port`: the port is the id's from the bind on,
            // so a listener on port 0 can tell its peers where it listens.
            addr.set_port(self.ephemeral_port());
        }
        let mut state = self.state()?;
        state.src = Some(addr);
        state.sgid_index = Some(index);
        Ok(())
    }

    /// The port an id takes when it has none: one of 16384 from 0xC000, by the id's number.
    fn ephemeral_port(&self) -> u16 {
        EPHEMERAL_PORTS.wrapping_add(self.number as u16 & 0x3FFF)
    }

    /// Resolves `dst` (`rdma_resolve_addr`): picks our address and learns the peer's MAC,
    /// then reports [`CmEventKind::AddrResolved`] or [`CmEventKind::AddrError`].
    pub fn resolve_addr(&self, dst: SocketAddr) -> Result<(), Error> {
        let bound = self.state()?.src;
        let index = match bound.filter(|src| !is_any(src.ip())) {
            Some(src) => self.gid_of(src.ip()),
            None => self.source_gid(dst.ip()),
        };
        let Some(index) = index.filter(|_| self.check_scope(dst, false).is_ok()) else {
            self.tell(What::AddrError(-EINVAL));
            return Ok(());
        };
        let dgid = match dst.ip() {
            IpAddr::V4(ip) => ip.to_ipv6_mapped().octets(),
            IpAddr::V6(ip) => ip.octets(),
        };
        let resolved = self
            .shared
            .check_path(index as u8, dgid)
            .and_then(|()| self.shared.resolve(dgid));
        match resolved {
            Ok(()) => {
                let mut state = self.state()?;
                // Unbound or bound to the wildcard: our address is now the GID's.
                if state.src.is_none_or(|src| is_any(src.ip())) {
                    let gid = Ipv6Addr::from(self.shared.device.gids[index]);
                    let ip = gid.to_ipv4_mapped().map_or(IpAddr::V6(gid), IpAddr::V4);
                    let port = state.src.map_or(0, |src| src.port());
                    state.src = Some(socket_addr(&self.shared, ip, port));
                }
                state.sgid_index = Some(index);
                state.dst = Some(socket_addr(&self.shared, dst.ip(), dst.port()));
                state.dgid = Some(dgid);
                drop(state);
                self.tell(What::AddrResolved);
            }
            Err(error) => self.tell(What::AddrError(-error.errno())),
        }
        Ok(())
    }

    /// Resolves the route to the resolved address (`rdma_resolve_route`): on RoCE the path
    /// is local (no SA), so this reports [`CmEventKind::RouteResolved`] at once, or
    /// [`CmEventKind::RouteError`] before an address was resolved.
    pub fn resolve_route(&self) -> Result<(), Error> {
        let mut state = self.state()?;
        if state.dgid.is_none() {
            drop(state);
            self.tell(What::RouteError(-EINVAL));
            return Ok(());
        }
        state.route_resolved = true;
        drop(state);
        self.tell(What::RouteResolved);
        Ok(())
    }

    /// Listens on the bound port (`rdma_listen`), holding at most `backlog` requests not
    /// yet answered.
    pub fn listen(&self, backlog: usize) -> Result<(), Error> {
        let mut state = self.state()?;
        let port = state
            .src
            .ok_or(Error::InvalidArgument("listen before bind_addr"))?
            .port();
        let space = if state.ud {
            PortSpace::Udp
        } else {
            PortSpace::Tcp
        };
        let service_id = ServiceId::rdma_ip(space, port);
        // On a shared device the switch must send this service's requests to us, and
        // nobody else may listen on it.
        crate::backend::claim(&self.shared)?;
        if let Some(link) = self.shared.kind.switch() {
            link.listen(service_id.0)
                .map_err(|error| match error.raw_os_error() {
                    Some(code) if code == rustix::io::Errno::ADDRINUSE.raw_os_error() => {
                        Error::Cm(roce_transport::cm::CmError::AddressInUse)
                    }
                    _ => Error::Io(error),
                })?;
        }
        let mut core = self.shared.lock()?;
        let listened = core
            .endpoint()
            .cm()
            .ok_or(Error::Gone)
            .and_then(|cm| Ok(cm.listen(service_id, backlog)?));
        if let Err(error) = listened {
            drop(core);
            if let Some(link) = self.shared.kind.switch() {
                let _ = link.unlisten(service_id.0);
            }
            return Err(error);
        }
        let route = Route {
            bound: state.src,
            ..self.route(None)?
        };
        core.cm.listeners.insert(service_id, route);
        state.listening = Some(service_id);
        Ok(())
    }

    /// Creates an RC QP for this id and moves it to INIT (`rdma_create_qp`), so receives
    /// can be posted before [`connect`](Self::connect) or [`accept`](Self::accept), with
    /// [`qp_attr`](Self::qp_attr)'s INIT attributes as librdmacm does: P_Key index 0, port
    /// 1, no remote access before a connect, a request's access on its own id.
    pub fn create_qp(&self, pd: &Pd, attr: &QpInitAttr) -> Result<Qp, Error> {
        if attr.qp_type != QpType::Rc {
            return Err(Error::Unsupported("CM ids for other than RC QPs"));
        }
        let qp = pd.create_qp(attr)?;
        self.check_qp(&qp)?;
        qp.modify(&self.qp_attr(QpState::Init)?)?;
        Ok(qp)
    }

    /// Connects `qp` (RC, in RESET or INIT) to the resolved peer (`rdma_connect`): sends
    /// the REQ; on the REP the QP goes to RTR and RTS and [`CmEventKind::Established`]
    /// follows, or [`CmEventKind::Rejected`] / [`CmEventKind::Unreachable`].
    pub fn connect(&self, qp: &Qp, param: &ConnParam) -> Result<(), Error> {
        self.check_qp(qp)?;
        self.connect_qp_num(qp.qp_num(), param)
    }

    /// [`connect`](Self::connect) for the QP numbered `qpn` of this id's context (for C
    /// faces, whose QP objects are their own).
    pub fn connect_qp_num(&self, qpn: u32, param: &ConnParam) -> Result<(), Error> {
        self.connect_as(qpn, param, false)
    }

    /// [`connect_qp_num`](Self::connect_qp_num) for a QP the program moves itself
    /// (librdmacm's `rdma_connect` on an id without a QP): the REP is reported as
    /// [`CmEventKind::ConnectResponse`]; the program moves its QP with
    /// [`qp_attr`](Self::qp_attr) and calls [`establish`](Self::establish).
    pub fn connect_program_qp(&self, qpn: u32, param: &ConnParam) -> Result<(), Error> {
        self.connect_as(qpn, param, true)
    }

    fn connect_as(&self, qpn: u32, param: &ConnParam, program_qp: bool) -> Result<(), Error> {
        self.check_qp_num(qpn)?;
        if param.private_data.len() > MAX_CONNECT_PRIVATE_DATA {
            return Err(Error::InvalidArgument("private data beyond 56 bytes"));
        }
        let mut state = self.state()?;
        if state.ud {
            return Err(Error::InvalidArgument("a UD id connects with connect_ud"));
        }
        let request = self.outgoing(&mut state, &param.private_data)?;
        let private = request.private;
        let params = ConnectParams {
            service_id: ServiceId::rdma_ip(PortSpace::Tcp, request.port),
            local_gid: self.shared.device.gids[request.sgid_index],
            sgid_index: request.sgid_index as u8,
            remote_gid: request.dgid,
            qpn,
            service_type: ServiceType::Rc,
            path_mtu: self
                .shared
                .device
                .query_port()
                .active_mtu
                .min(PathMtu::Mtu4096),
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            retry_count: param.retry_count,
            rnr_retry_count: param.rnr_retry_count,
            srq: false,
            flow_control: true,
            traffic_class: state.tos,
            hop_limit: HOP_LIMIT,
            flow_label: 0,
        };
        let mut core = self.shared.lock()?;
        let conn =
            core.endpoint()
                .cm()
                .ok_or(Error::Gone)?
                .connect(Instant::now(), &params, &private)?;
        let route = Route {
            program_qp,
            ack_timeout: state.ack_timeout,
            ..self.route((!program_qp).then_some(qpn))?
        };
        core.cm.conns.insert(conn, route);
        state.conn = Some(conn);
        state.qpn = (!program_qp).then_some(qpn);
        drop(state);
        self.shared.kick(&mut core)
    }

    /// Accepts the connect request this id came with (`rdma_accept`): `qp` goes to RTR and
    /// RTS and the REP leaves; [`CmEventKind::Established`] follows the peer's RTU.
    pub fn accept(&self, qp: &Qp, param: &ConnParam) -> Result<(), Error> {
        self.check_qp(qp)?;
        self.accept_qp_num(qp.qp_num(), param)
    }

    /// [`accept`](Self::accept) for the QP numbered `qpn` of this id's context (for C
    /// faces).
    pub fn accept_qp_num(&self, qpn: u32, param: &ConnParam) -> Result<(), Error> {
        self.accept_as(qpn, param, false)
    }

    /// [`accept_qp_num`](Self::accept_qp_num) for a QP the program has moved to RTS
    /// itself with [`qp_attr`](Self::qp_attr) (librdmacm's `rdma_accept` on an id without a
    /// QP): only the REP leaves; the QP is left alone, then and on a disconnect.
    pub fn accept_program_qp(&self, qpn: u32, param: &ConnParam) -> Result<(), Error> {
        self.accept_as(qpn, param, true)
    }

    fn accept_as(&self, qpn: u32, param: &ConnParam, program_qp: bool) -> Result<(), Error> {
        self.check_qp_num(qpn)?;
        let mut state = self.state()?;
        let (Some(conn), Some(dgid), Some(index)) = (state.conn, state.dgid, state.sgid_index)
        else {
            return Err(Error::InvalidArgument("accept on an id without a request"));
        };
        // The REP and everything after it go to the peer: learn its MAC first (outside the
        // lock, as it may take a while).
        self.shared.resolve(dgid)?;
        let params = AcceptParams {
            qpn,
            sgid_index: index as u8,
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            rnr_retry_count: param.rnr_retry_count,
            srq: false,
            flow_control: true,
        };
        let now = Instant::now();
        let mut core = self.shared.lock()?;
        core.submit(now);
        let endpoint = core.endpoint();
        let cm = endpoint.cm().ok_or(Error::Gone)?;
        let mut attrs = cm.accept(now, conn, &params, &param.private_data)?;
        if state.ack_timeout.is_some() {
            attrs.rts.timeout = state.ack_timeout;
        }
        if program_qp {
            drop(state);
            return self.shared.kick(&mut core);
        }
        let applied = apply_qp_attrs(endpoint, now, qpn, &attrs);
        if let Err(error) = applied {
            if let Some(cm) = endpoint.cm() {
                cm.destroy(conn);
            }
            core.refresh_gates();
            return Err(error.into());
        }
        core.refresh_gates();
        if let Some(route) = core.cm.conns.get_mut(&conn) {
            route.qpn = Some(qpn);
        }
        state.qpn = Some(qpn);
        drop(state);
        self.shared.kick(&mut core)
    }

    /// Rejects the connect request this id came with (`rdma_reject`; reason 28, consumer
    /// defined, with up to 148 bytes of private data).
    pub fn reject(&self, private_data: &[u8]) -> Result<(), Error> {
        let state = self.state()?;
        let conn = state
            .conn
            .ok_or(Error::InvalidArgument("reject on an id without a request"))?;
        if state.ud {
            drop(state);
            return self.reply_ud(&crate::cm_routes::sidr_refusal(), private_data);
        }
        let mut core = self.shared.lock()?;
        core.endpoint()
            .cm()
            .ok_or(Error::Gone)?
            .reject(Instant::now(), conn, private_data)?;
        self.shared.kick(&mut core)
    }

    /// Disconnects (`rdma_disconnect`): the QP goes to ERR and the DREQ leaves;
    /// [`CmEventKind::Disconnected`] follows on both sides.
    pub fn disconnect(&self) -> Result<(), Error> {
        let state = self.state()?;
        let conn = state.conn.ok_or(Error::InvalidArgument(
            "disconnect on an id without a connection",
        ))?;
        let now = Instant::now();
        let mut core = self.shared.lock()?;
        if let Some(qpn) = state.qpn {
            core.submit(now);
            let _ = core.endpoint().modify_qp(now, qpn, &to_error());
            core.refresh_gates();
        }
        core.endpoint()
            .cm()
            .ok_or(Error::Gone)?
            .disconnect(now, conn, &[])?;
        self.shared.kick(&mut core)
    }

    /// Where a connect or SIDR request goes, and the private data it carries: rdma_cm's
    /// header (our port taken now if the id has none), then the caller's `private`.
    fn outgoing(&self, state: &mut IdState, private: &[u8]) -> Result<Outgoing, Error> {
        let (Some(dst), Some(dgid), Some(index), true) = (
            state.dst,
            state.dgid,
            state.sgid_index,
            state.route_resolved,
        ) else {
            return Err(Error::InvalidArgument("connect before resolve_route"));
        };
        if state.conn.is_some() {
            return Err(Error::InvalidArgument("the id is already connecting"));
        }
        let mut src = state
            .src
            .ok_or(Error::InvalidArgument("no source address"))?;
        if src.port() == 0 {
            src.set_port(self.ephemeral_port());
            state.src = Some(src);
        }
        let addresses = match (src.ip(), dst.ip()) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => Addresses::V4 { src, dst },
            (IpAddr::V6(src), IpAddr::V6(dst)) => Addresses::V6 { src, dst },
            _ => return Err(Error::InvalidArgument("mixed address families")),
        };
        let header = cma::Repr {
            src_port: src.port(),
            addresses,
        };
        let mut bytes = vec![0u8; cma::HEADER_LEN + private.len()];
        header.emit(&mut cma::Packet::new_unchecked(
            &mut bytes[..cma::HEADER_LEN],
        ));
        bytes[cma::HEADER_LEN..].copy_from_slice(private);
        Ok(Outgoing {
            private: bytes,
            port: dst.port(),
            dgid,
            sgid_index: index,
        })
    }

    fn check_qp(&self, qp: &Qp) -> Result<(), Error> {
        if !Arc::ptr_eq(qp.shared(), &self.shared) {
            return Err(Error::ForeignObject("QP"));
        }
        if qp.qp_type() != QpType::Rc {
            return Err(Error::Unsupported("CM ids for other than RC QPs"));
        }
        Ok(())
    }

    fn check_qp_num(&self, qpn: u32) -> Result<(), Error> {
        match self.shared.lock()?.endpoint().qp_state(qpn) {
            Some(_) => Ok(()),
            None => Err(Error::InvalidArgument("no such QP on this id's device")),
        }
    }
}

impl fmt::Debug for CmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmId")
            .field("handle", &self.number)
            .finish_non_exhaustive()
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        // Before the core's lock, which leaving takes after the memberships'.
        mcast::leave_all(self, &mut state);
        let Ok(mut core) = self.shared.lock() else {
            return;
        };
        if let Some(service_id) = state.listening {
            core.cm.listeners.remove(&service_id);
            if let Some(cm) = core.endpoint().cm() {
                cm.stop_listening(service_id);
            }
        }
        if let Some(conn) = state.conn {
            core.cm.conns.remove(&conn);
            if let Some(cm) = core.endpoint().cm() {
                cm.destroy(conn);
            }
        }
        // The REJ or DREQ leaves now, not when the engine thread next runs: a program
        // that exits right after rdma_destroy_id (perftest's server) would otherwise leave
        // its peer resending DREQs to nobody until its retries run out.
        let _ = self.shared.drive(&mut core);
        drop(core);
        if let (Some(service_id), Some(link)) = (state.listening, self.shared.kind.switch()) {
            let _ = link.unlisten(service_id.0);
        }
    }
}
