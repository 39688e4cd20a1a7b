//! UD ids (`RDMA_PS_UDP`): no connection, only service ID resolution (SIDR). The active
//! side's [`connect_ud`](CmId::connect_ud) sends a SIDR_REQ and hears
//! [`CmEventKind::UdEstablished`](super::CmEventKind::UdEstablished) with the service's QP
//! and Q_Key (or `UdUnreachable`); the listener hears a connect request and answers it with
//! [`accept_ud`](CmId::accept_ud) (a SIDR_REP with its QP) or
//! [`reject`](CmId::reject). A UD QP uses the Q_Key [`RDMA_UDP_QKEY`] and moves
//! INIT → RTR → RTS with no peer: [`qp_attr`](CmId::qp_attr) gives those steps.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use roce_transport::cm::{CmEvent as TransportEvent, ConnId, SidrReply};
use roce_wire::cm::cma::{self, Addresses};
use roce_wire::cm::sidr_rep::SidrStatus;
use roce_wire::cm::{sidr_req, PortSpace, ServiceId};
use roce_wire::Psn;

use super::{CmId, ConnectRequest, EventChannel, IdState, HOP_LIMIT};
use crate::cm_routes::sidr_refusal;
use crate::context::Context;
use crate::error::Error;
use crate::shared::Shared;
use crate::{AddressVector, QpAttr, QpState};

/// The Q_Key of rdma_cm's UD QPs (`RDMA_UDP_QKEY`, rdma_cma.h).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// Private data a SIDR request carries after rdma_cm's header (216 − 36).
const MAX_UD_PRIVATE_DATA: usize = sidr_req::PRIVATE_DATA_LEN - cma::HEADER_LEN;

/// What a resolved UD service is (`struct rdma_ud_param` without the address, which is
/// [`CmId::ud_address`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdParam {
    /// The service's QP number.
    pub qp_num: u32,
    /// Its Q_Key.
    pub qkey: u32,
    /// The SIDR_REP's private data.
    pub private_data: Vec<u8>,
}

impl Context {
    /// Creates a UD id (`rdma_create_id` with `RDMA_PS_UDP`) on this device whose events go
    /// to `channel`.
    pub fn create_ud_id(&self, channel: &EventChannel) -> Result<CmId, Error> {
        let id = self.create_id(channel)?;
        id.state()?.ud = true;
        Ok(id)
    }
}

impl EventChannel {
    /// [`create_id`](Self::create_id) for a UD id (`RDMA_PS_UDP`).
    pub fn create_ud_id(&self) -> Result<CmId, Error> {
        let id = self.create_id()?;
        id.state()?.ud = true;
        Ok(id)
    }

    /// The passive id of a SIDR_REQ, and what the listener is told of it (the private data
    /// after rdma_cm's header; no QP or depths).
    pub(super) fn ud_request(
        &self,
        shared: &Arc<Shared>,
        number: u64,
        event: &TransportEvent,
    ) -> Option<ConnectRequest> {
        let TransportEvent::SidrRequest {
            conn,
            service_id,
            local_gid,
            remote_gid,
            private_data,
        } = *event
        else {
            return None;
        };
        let header = cma::Packet::new_checked(&private_data[..])
            .and_then(|packet| cma::Repr::parse(&packet))
            .ok();
        let port = service_id.0 as u16;
        let (src, dst) = match header.map(|header| (header.src_port, header.addresses)) {
            Some((src_port, Addresses::V4 { src, dst })) => (
                SocketAddr::new(IpAddr::V4(src), src_port),
                SocketAddr::new(IpAddr::V4(dst), port),
            ),
            Some((src_port, Addresses::V6 { src, dst })) => (
                SocketAddr::new(IpAddr::V6(src), src_port),
                SocketAddr::new(IpAddr::V6(dst), port),
            ),
            None => {
                refuse(shared, conn);
                return None;
            }
        };
        let state = IdState {
            // Our side is the destination of the request.
            src: Some(dst),
            dst: Some(src),
            sgid_index: shared.device.gids.iter().position(|gid| *gid == local_gid),
            dgid: Some(remote_gid),
            conn: Some(conn),
            ud: true,
            ..IdState::default()
        };
        Some(ConnectRequest {
            id: CmId::new(shared, &self.queue, number, state),
            private_data: private_data[cma::HEADER_LEN..].to_vec(),
            responder_resources: 0,
            initiator_depth: 0,
            remote_qpn: 0,
        })
    }
}

/// Refuses a SIDR request no id is made for (no rdma_cm header: nothing to answer it
/// with), so it does not hold its listener's backlog.
fn refuse(shared: &Shared, conn: ConnId) {
    let Ok(mut core) = shared.lock() else {
        return;
    };
    core.cm.conns.remove(&conn);
    if let Some(cm) = core.endpoint().cm() {
        let _ = cm.sidr_reply(Instant::now(), conn, &sidr_refusal(), &[]);
    }
    let _ = shared.kick(&mut core);
}

impl CmId {
    /// Whether this is a UD id.
    pub fn is_ud(&self) -> bool {
        self.state().is_ok_and(|state| state.ud)
    }

    /// Resolves the UD service at the resolved address (`rdma_connect` on a UD id): sends
    /// a SIDR_REQ with rdma_cm's header and `private_data` (at most 180 bytes).
    pub fn connect_ud(&self, private_data: &[u8]) -> Result<(), Error> {
        if private_data.len() > MAX_UD_PRIVATE_DATA {
            return Err(Error::InvalidArgument("private data beyond 180 bytes"));
        }
        let mut state = self.state()?;
        if !state.ud {
            return Err(Error::InvalidArgument("connect_ud on a connected-mode id"));
        }
        let request = self.outgoing(&mut state, private_data)?;
        let mut core = self.shared.lock()?;
        let conn = core.endpoint().cm().ok_or(Error::Gone)?.resolve_service(
            Instant::now(),
            ServiceId::rdma_ip(PortSpace::Udp, request.port),
            self.shared.device.gids[request.sgid_index],
            request.dgid,
            &request.private,
        )?;
        core.cm.conns.insert(conn, self.route(None)?);
        state.conn = Some(conn);
        drop(state);
        self.shared.kick(&mut core)
    }

    /// Answers the SIDR request this id came with (`rdma_accept` on a UD id): our UD QP
    /// `qpn` serves it, with Q_Key [`RDMA_UDP_QKEY`].
    pub fn accept_ud(&self, qpn: u32, private_data: &[u8]) -> Result<(), Error> {
        self.check_qp_num(qpn)?;
        let reply = SidrReply {
            status: SidrStatus::SUCCESS,
            qpn,
            qkey: RDMA_UDP_QKEY,
        };
        self.reply_ud(&reply, private_data)
    }

    pub(super) fn reply_ud(&self, reply: &SidrReply, private_data: &[u8]) -> Result<(), Error> {
        let (conn, dgid) = {
            let state = self.state()?;
            (state.conn, state.dgid)
        };
        let (Some(conn), Some(dgid)) = (conn, dgid) else {
            return Err(Error::InvalidArgument(
                "an answer on an id without a request",
            ));
        };
        // The SIDR_REP goes to the requester: learn its MAC first, outside the lock.
        self.shared.resolve(dgid)?;
        let mut core = self.shared.lock()?;
        core.endpoint().cm().ok_or(Error::Gone)?.sidr_reply(
            Instant::now(),
            conn,
            reply,
            private_data,
        )?;
        self.shared.kick(&mut core)
    }

    /// The peer's address as a UD QP reaches it (`rdma_ud_param.ah_attr`), once its
    /// address is resolved or its request came.
    pub fn ud_address(&self) -> Option<AddressVector> {
        let state = self.state().ok()?;
        Some(AddressVector {
            dgid: state.dgid?,
            sgid_index: u8::try_from(state.sgid_index?).ok()?,
            hop_limit: HOP_LIMIT,
            traffic_class: 0,
            flow_label: 0,
        })
    }

    /// What a UD QP needs for `state` (rdma-core's `ucma_init_ud_qp`): P_Key index, port
    /// and [`RDMA_UDP_QKEY`] at INIT; nothing at RTR; send PSN 0 at RTS.
    pub(super) fn ud_qp_attr(state: QpState) -> Result<QpAttr, Error> {
        let attr = QpAttr {
            state: Some(state),
            ..QpAttr::default()
        };
        match state {
            QpState::Init => Ok(QpAttr {
                pkey_index: Some(0),
                port_num: Some(1),
                qkey: Some(RDMA_UDP_QKEY),
                ..attr
            }),
            QpState::Rtr => Ok(attr),
            QpState::Rts => Ok(QpAttr {
                sq_psn: Some(Psn::new(0)),
                ..attr
            }),
            _ => Err(Error::InvalidArgument(
                "the CM gives INIT, RTR and RTS only",
            )),
        }
    }
}
