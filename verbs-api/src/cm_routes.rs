//! Where the endpoint's CM events go: each connection and listener belongs to one CM id,
//! whose event channel hears of it. The engine side ([`CmRoutes::deliver`], under the device
//! lock after every round) also does what librdmacm does on its own for a connection with a
//! QP: on the REP it moves the QP to RTR and RTS and sends the RTU; on a disconnect it moves
//! the QP to ERR.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Weak};
use std::time::Instant;

use roce_transport::cm::{Cm, CmEvent, ConnId, ConnectRequest, QpAttrs, ServiceId};
use roce_transport::qp_state::{ModifyQpError, QpAttr, QpState};
use roce_transport::Endpoint;
use roce_wire::cm::cma::{self, Addresses};

use crate::queues::{EventQueue, Submission};
use crate::shared::Shared;

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
        shared: Weak<Shared>,
    },
    /// The REP could not be applied to the QP (`RDMA_CM_EVENT_CONNECT_ERROR`).
    ConnectError,
    Cm(Box<CmEvent>),
}

/// The channel of one id, and its QP once it has one.
#[derive(Clone)]
pub(crate) struct Route {
    pub(crate) id: u64,
    pub(crate) queue: Arc<EventQueue<Notice>>,
    pub(crate) qpn: Option<u32>,
    /// The context the id lives on (its requests make ids there).
    pub(crate) shared: Weak<Shared>,
    /// A listener's address: which requests it takes ([`takes`]).
    pub(crate) bound: Option<SocketAddr>,
}

impl Route {
    fn tell(&self, what: What) {
        self.queue.push(Notice { id: self.id, what });
    }
}

/// The routes of a context's CM.
#[derive(Default)]
pub(crate) struct CmRoutes {
    pub(crate) listeners: HashMap<ServiceId, Route>,
    pub(crate) conns: HashMap<ConnId, Route>,
    next_id: u64,
}

impl CmRoutes {
    /// A fresh id number (never 0, never reused).
    pub(crate) fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Takes every event of the endpoint's CM to its id's channel, acting on the QPs as
    /// librdmacm does. A QP moved is given its new gate (`submissions`) before its event is
    /// told, so a program that posts as soon as it hears ESTABLISHED is not refused.
    pub(crate) fn deliver(
        &mut self,
        endpoint: &mut Endpoint,
        submissions: &BTreeMap<u32, Arc<Submission>>,
        now: Instant,
    ) {
        while let Some(event) = endpoint.cm().and_then(Cm::poll_event) {
            match event {
                CmEvent::ConnectRequest { conn, request } => {
                    let Some(listener) = self.listeners.get(&request.service_id).cloned() else {
                        // The listener went away after the REQ arrived.
                        if let Some(cm) = endpoint.cm() {
                            let _ = cm.reject(now, conn, &[]);
                        }
                        continue;
                    };
                    let new_id = self.new_id();
                    let route = Route {
                        id: new_id,
                        qpn: None,
                        bound: None,
                        ..listener.clone()
                    };
                    self.conns.insert(conn, route);
                    listener.tell(What::Request {
                        new_id,
                        conn,
                        taken: takes(&listener, &request),
                        request: Box::new(request),
                        shared: listener.shared.clone(),
                    });
                }
                CmEvent::ConnectResponse { conn, qp, .. } => {
                    let Some(route) = self.conns.get(&conn) else {
                        if let Some(cm) = endpoint.cm() {
                            cm.destroy(conn);
                        }
                        continue;
                    };
                    let applied = route.qpn.map(|qpn| {
                        let applied = apply_qp_attrs(endpoint, now, qpn, &qp);
                        refresh_gate(endpoint, submissions, qpn);
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
                            refresh_gate(endpoint, submissions, qpn);
                        }
                        route.tell(What::Cm(Box::new(event)));
                    }
                }
                CmEvent::Established { conn }
                | CmEvent::Rejected { conn, .. }
                | CmEvent::Unreachable { conn }
                | CmEvent::TimewaitExit { conn } => {
                    if let Some(route) = self.conns.get(&conn) {
                        route.tell(What::Cm(Box::new(event)));
                    }
                }
                // UD ids (SIDR) are not offered yet: nothing listens in the UDP port space,
                // so the CM answers SIDR requests itself.
                _ => {}
            }
        }
    }
}

/// Whether `listener` takes `request`, as the kernel's `cma_match_private_data`: one bound
/// to the IPv6 wildcard takes both families (`bindv6only` is 0 by default), one bound to
/// the IPv4 wildcard IPv4 only, one bound to an address only requests to it. A request
/// without rdma_cm's header (a bare IB CM peer) names no address to check.
fn takes(listener: &Route, request: &ConnectRequest) -> bool {
    let (Some(bound), Ok(header)) = (
        listener.bound,
        cma::Packet::new_checked(&request.req.private_data[..])
            .and_then(|packet| cma::Repr::parse(&packet)),
    ) else {
        return true;
    };
    match (bound.ip(), header.addresses) {
        (IpAddr::V6(ip), _) if ip.is_unspecified() => true,
        (IpAddr::V4(ip), Addresses::V4 { dst, .. }) => ip.is_unspecified() || ip == dst,
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

/// Gives QP `qpn`'s submission queues the QP's current gate.
pub(crate) fn refresh_gate(
    endpoint: &Endpoint,
    submissions: &BTreeMap<u32, Arc<Submission>>,
    qpn: u32,
) {
    let (Some(gate), Some(queues)) = (endpoint.post_gate(qpn), submissions.get(&qpn)) else {
        return;
    };
    if let Ok(mut sends) = queues.sends.lock() {
        sends.gate = gate;
    }
    if let Ok(mut recvs) = queues.recvs.lock() {
        recvs.gate = gate;
    }
}

/// Any state → ERR.
pub(crate) fn to_error() -> QpAttr {
    QpAttr {
        state: Some(QpState::Err),
        ..QpAttr::default()
    }
}
