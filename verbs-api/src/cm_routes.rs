//! Where the endpoint's CM events go: each connection and listener belongs to one CM id,
//! whose event channel hears of it. The engine side ([`CmRoutes::deliver`], under the device
//! lock after every round) also does what librdmacm does on its own for a connection with a
//! QP: on the REP it moves the QP to RTR and RTS and sends the RTU; on a disconnect it moves
//! the QP to ERR.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use roce_transport::cm::{Cm, CmEvent, ConnId, ConnectRequest, QpAttrs, ServiceId, SidrReply};
use roce_transport::qp_state::{ModifyQpError, QpAttr, QpState};
use roce_transport::Endpoint;
use roce_wire::cm::cma::{self, Addresses};
use roce_wire::cm::sidr_rep::SidrStatus;

use crate::queues::{EventQueue, QpSlot};

/// Names a context's CM (never reused in a process): a request's notice says where its
/// new id lives, and the channel finds that context among its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ContextKey(u64);

impl ContextKey {
    fn fresh() -> ContextKey {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        ContextKey(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// What a CM id's channel is told: the id (its number) and what happened.
#[derive(Debug, Clone)]
pub(crate) struct Notice {
    pub(crate) id: u64,
    pub(crate) what: What,
}

/// Address and route resolution happen in the caller's thread; the rest comes from the CM.
#[derive(Debug, Clone)]
pub(crate) enum What {
    AddrResolved,
    AddrError(i32),
    RouteResolved,
    RouteError(i32),
    /// A REQ for the listener `id`; `new_id` is the connection's own id.
    Request {
        new_id: u64,
        conn: ConnId,
        /// Whether the listener takes it ([`takes`]); if not, it is rejected where the
        /// peer's MAC can be learnt (the caller's thread), and nobody hears of it.
        taken: bool,
        request: Box<ConnectRequest>,
        /// The listener's context, where the new id lives.
        context: ContextKey,
    },
    /// A SIDR_REQ ([`CmEvent::SidrRequest`]) for the UD listener `id`; `new_id` is the
    /// request's own id.
    SidrRequest {
        new_id: u64,
        request: Box<CmEvent>,
        /// The listener's context, where the new id lives.
        context: ContextKey,
    },
    /// The REP could not be applied to the QP (`RDMA_CM_EVENT_CONNECT_ERROR`).
    ConnectError,
    /// The REP came for a QP the program moves (`RDMA_CM_EVENT_CONNECT_RESPONSE`).
    ConnectResponse(Box<ConnReply>),
    /// The connection is up (`RDMA_CM_EVENT_ESTABLISHED`); on the active side, with the
    /// REP it came with.
    Established(Option<Box<ConnReply>>),
    Cm(Box<CmEvent>),
    /// A group joined (`RDMA_CM_EVENT_MULTICAST_JOIN`), told unless `live` was cleared by
    /// a leave meanwhile.
    MulticastJoin {
        join: Box<crate::cm::McastJoin>,
        live: Arc<std::sync::atomic::AtomicBool>,
    },
}

/// What the active side learns from the REP, as the kernel's rdma_cm reports it with
/// `RDMA_CM_EVENT_CONNECT_RESPONSE` and `RDMA_CM_EVENT_ESTABLISHED`
/// (`cma_set_rep_event_data`): the peer's private data and what was settled, from our
/// side (libfabric's RxM reads its peer's flow control from it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnReply {
    /// The REP's private data, all 196 bytes of it.
    pub private_data: Vec<u8>,
    /// READs and atomics our QP accepts at once (the peer's initiator depth).
    pub responder_resources: u8,
    /// READs and atomics our QP issues at once (the peer's responder resources).
    pub initiator_depth: u8,
    /// The peer's RNR retry count.
    pub rnr_retry_count: u8,
    /// The peer's QP number.
    pub qp_num: u32,
}

impl ConnReply {
    fn new(qp: &QpAttrs, private_data: &[u8]) -> ConnReply {
        ConnReply {
            private_data: private_data.to_vec(),
            responder_resources: qp.rtr.max_dest_rd_atomic.unwrap_or(0),
            initiator_depth: qp.rts.max_rd_atomic.unwrap_or(0),
            rnr_retry_count: qp.rts.rnr_retry.unwrap_or(0),
            qp_num: qp.rtr.dest_qp_num.unwrap_or(0),
        }
    }
}

/// The channel of one id, and its QP once it has one.
#[derive(Clone)]
pub(crate) struct Route {
    pub(crate) id: u64,
    pub(crate) queue: Arc<EventQueue<Notice>>,
    pub(crate) qpn: Option<u32>,
    /// The program moves the active side's QP itself: the REP is told as a connect
    /// response, and the establishment its `rdma_establish` makes is not told back
    /// (librdmacm's behaviour for an id without a QP).
    pub(crate) program_qp: bool,
    /// A listener's address: which requests it takes ([`takes`]).
    pub(crate) bound: Option<SocketAddr>,
    /// The REP of an active side's connection, until `ESTABLISHED` tells it.
    pub(crate) reply: Option<Box<ConnReply>>,
    /// The local ACK timeout the program set (`RDMA_OPTION_ID_ACK_TIMEOUT`), for the RTS
    /// the REP brings.
    pub(crate) ack_timeout: Option<u8>,
}

impl Route {
    fn tell(&self, what: What) {
        self.queue.push(Notice { id: self.id, what });
    }
}

/// The routes of a context's CM.
pub(crate) struct CmRoutes {
    pub(crate) listeners: HashMap<ServiceId, Route>,
    pub(crate) conns: HashMap<ConnId, Route>,
    next_id: u64,
    context: ContextKey,
}

impl Default for CmRoutes {
    fn default() -> Self {
        CmRoutes {
            listeners: HashMap::new(),
            conns: HashMap::new(),
            next_id: 0,
            context: ContextKey::fresh(),
        }
    }
}

impl CmRoutes {
    /// Which context these routes belong to.
    pub(crate) fn context(&self) -> ContextKey {
        self.context
    }

    /// A fresh id number (never 0, never reused).
    pub(crate) fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Takes every event of the endpoint's CM to its id's channel, acting on the QPs as
    /// librdmacm does. A QP moved has its new state published (`qps`) before its event is
    /// told, so a program that posts as soon as it hears ESTABLISHED is not refused.
    pub(crate) fn deliver(
        &mut self,
        endpoint: &mut Endpoint,
        qps: &BTreeMap<u32, QpSlot>,
        now: Instant,
    ) {
        while let Some(event) = endpoint.cm().and_then(Cm::poll_event) {
            match event {
                CmEvent::ConnectRequest { conn, request } => {
                    let Some((new_id, listener)) = self.admit(conn, request.service_id) else {
                        // The listener went away after the REQ arrived.
                        if let Some(cm) = endpoint.cm() {
                            let _ = cm.reject(now, conn, &[]);
                        }
                        continue;
                    };
                    listener.tell(What::Request {
                        new_id,
                        conn,
                        taken: takes(&listener, &request),
                        request: Box::new(request),
                        context: self.context,
                    });
                }
                CmEvent::ConnectResponse {
                    conn,
                    qp,
                    private_data,
                } => {
                    let Some(route) = self.conns.get_mut(&conn) else {
                        if let Some(cm) = endpoint.cm() {
                            cm.destroy(conn);
                        }
                        continue;
                    };
                    let reply = Box::new(ConnReply::new(&qp, &private_data));
                    if route.program_qp {
                        route.tell(What::ConnectResponse(reply));
                        continue;
                    }
                    route.reply = Some(reply);
                    let mut qp = qp;
                    if route.ack_timeout.is_some() {
                        qp.rts.timeout = route.ack_timeout;
                    }
                    let applied = route.qpn.map(|qpn| {
                        let applied = apply_qp_attrs(endpoint, now, qpn, &qp);
                        publish_state(endpoint, qps, qpn);
                        applied
                    });
                    let established = match (applied, endpoint.cm()) {
                        (Some(Ok(())), Some(cm)) => cm.establish(conn).is_ok(),
                        (_, Some(cm)) => {
                            cm.destroy(conn);
                            false
                        }
                        (_, None) => false,
                    };
                    if !established {
                        route.tell(What::ConnectError);
                    }
                }
                CmEvent::Disconnected { conn } => {
                    if let Some(route) = self.conns.get(&conn) {
                        if let Some(qpn) = route.qpn {
                            let _ = endpoint.modify_qp(now, qpn, &to_error());
                            publish_state(endpoint, qps, qpn);
                        }
                        route.tell(What::Cm(Box::new(event)));
                    }
                }
                CmEvent::Established { conn } => {
                    if let Some(route) = self.conns.get_mut(&conn) {
                        if !route.program_qp {
                            let reply = route.reply.take();
                            route.tell(What::Established(reply));
                        }
                    }
                }
                CmEvent::Rejected { conn, .. }
                | CmEvent::Unreachable { conn }
                | CmEvent::TimewaitExit { conn } => {
                    if let Some(route) = self.conns.get(&conn) {
                        route.tell(What::Cm(Box::new(event)));
                    }
                }
                CmEvent::SidrRequest { .. }
                | CmEvent::SidrResolved { .. }
                | CmEvent::SidrRejected { .. } => self.deliver_sidr(endpoint, now, event),
                _ => {}
            }
        }
    }
}

impl CmRoutes {
    /// A UD id's events: a SIDR request gets its own id on the listener's channel (or a
    /// refusal when nobody listens any more); an answer goes to the requester's id.
    fn deliver_sidr(&mut self, endpoint: &mut Endpoint, now: Instant, event: CmEvent) {
        match event {
            CmEvent::SidrRequest {
                conn, service_id, ..
            } => {
                let Some((new_id, listener)) = self.admit(conn, service_id) else {
                    if let Some(cm) = endpoint.cm() {
                        let _ = cm.sidr_reply(now, conn, &sidr_refusal(), &[]);
                    }
                    return;
                };
                listener.tell(What::SidrRequest {
                    new_id,
                    request: Box::new(event),
                    context: self.context,
                });
            }
            CmEvent::SidrResolved { conn, .. } | CmEvent::SidrRejected { conn, .. } => {
                if let Some(route) = self.conns.get(&conn) {
                    route.tell(What::Cm(Box::new(event)));
                }
            }
            _ => {}
        }
    }

    /// A request's own id on the listener of `service_id`, routed to the listener's
    /// channel; none when nobody listens there any more.
    fn admit(&mut self, conn: ConnId, service_id: ServiceId) -> Option<(u64, Route)> {
        let listener = self.listeners.get(&service_id).cloned()?;
        let new_id = self.new_id();
        let route = Route {
            id: new_id,
            qpn: None,
            program_qp: false,
            bound: None,
            reply: None,
            ..listener.clone()
        };
        self.conns.insert(conn, route);
        Some((new_id, listener))
    }
}

/// The SIDR_REP of a UD request refused (`rdma_reject`) or whose listener went away.
pub(crate) fn sidr_refusal() -> SidrReply {
    SidrReply {
        status: SidrStatus::REJECT,
        qpn: 0,
        qkey: 0,
    }
}

/// Whether an id bound to `ip` is bound to no device: the wildcard or a loopback address,
/// which the kernel's rdma_cm takes alike (`cma_any_addr`): libfabric binds its listeners
/// to `localhost` and then offers the device's own addresses.
pub(crate) fn is_any(ip: IpAddr) -> bool {
    ip.is_unspecified() || ip.is_loopback()
}

/// Whether `listener` takes `request`, as the kernel's `cma_match_private_data`: one bound
/// to the IPv6 wildcard (or loopback) takes both families (`bindv6only` is 0 by default),
/// one bound to the IPv4 wildcard (or loopback) IPv4 only, one bound to an address only
/// requests to it. A request without rdma_cm's header (a bare IB CM peer) names no address
/// to check.
fn takes(listener: &Route, request: &ConnectRequest) -> bool {
    let (Some(bound), Ok(header)) = (
        listener.bound,
        cma::Packet::new_checked(&request.req.private_data[..])
            .and_then(|packet| cma::Repr::parse(&packet)),
    ) else {
        return true;
    };
    match (bound.ip(), header.addresses) {
        (ip @ IpAddr::V6(_), _) if is_any(ip) => true,
        (ip @ IpAddr::V4(v4), Addresses::V4 { dst, .. }) => is_any(ip) || v4 == dst,
        (IpAddr::V6(ip), Addresses::V6 { dst, .. }) => ip == dst,
        _ => false,
    }
}

/// RESET→INIT (or INIT→INIT for a QP `create_qp` left in INIT: the access the peer may
/// use is known only now), INIT→RTR and RTR→RTS with the CM's attributes.
pub(crate) fn apply_qp_attrs(
    endpoint: &mut Endpoint,
    now: Instant,
    qpn: u32,
    attrs: &QpAttrs,
) -> Result<(), ModifyQpError> {
    if matches!(endpoint.qp_state(qpn), Some(QpState::Reset | QpState::Init)) {
        endpoint.modify_qp(now, qpn, &attrs.init)?;
    }
    endpoint.modify_qp(now, qpn, &attrs.rtr)?;
    endpoint.modify_qp(now, qpn, &attrs.rts)
}

/// Publishes QP `qpn`'s state to its posters.
fn publish_state(endpoint: &Endpoint, qps: &BTreeMap<u32, QpSlot>, qpn: u32) {
    if let Some(slot) = qps.get(&qpn) {
        slot.queues.publish_state(endpoint);
    }
}

/// Any state → ERR.
pub(crate) fn to_error() -> QpAttr {
    QpAttr {
        state: Some(QpState::Err),
        ..QpAttr::default()
    }
}
