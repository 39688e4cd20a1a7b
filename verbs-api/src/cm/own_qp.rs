//! What programs that create and move their QP themselves use (rping `-q`, UCX, pyverbs):
//! the attributes of each QP state (`rdma_init_qp_attr`), the RTU after they moved it
//! (`rdma_establish`), and the route's path record (`id->route.path_rec`).

use roce_transport::cm::CmConfig;

use super::{CmId, HOP_LIMIT};
use crate::error::Error;
use crate::{AccessFlags, PathMtu, QpAttr, QpState};

/// `struct ibv_sa_path_rec` as the kernel fills it for a RoCE route
/// (`cma_resolve_iboe_route`): there is no SA, the path is the local interface's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathRecord {
    /// Our GID.
    pub sgid: [u8; 16],
    /// The peer's.
    pub dgid: [u8; 16],
    /// Always the default P_Key.
    pub pkey: u16,
    /// The interface's path MTU.
    pub mtu: PathMtu,
    /// IB static rate code; 0 is "the port's current rate" (the kernel's answer for a link
    /// slower than 10 Gb/s or of unknown speed).
    pub rate: u8,
    /// Packet lifetime exponent (`CMA_IBOE_PACKET_LIFETIME`).
    pub packet_life_time: u8,
    /// Service level (0 for traffic class 0).
    pub sl: u8,
    /// IP traffic class.
    pub traffic_class: u8,
    /// IP hop limit.
    pub hop_limit: u8,
    /// IPv6 flow label.
    pub flow_label: u32,
}

/// RESET → INIT before any REQ (the kernel's `cma_ib_init_qp_attr`): no remote access.
fn unconnected_init() -> QpAttr {
    QpAttr::init(AccessFlags::empty())
}

impl CmId {
    /// The attributes that move this id's QP to `state` (INIT, RTR or RTS), as the
    /// kernel's rdma_cm derives them for `rdma_init_qp_attr`: before a connect INIT only,
    /// with no remote access; once the REQ is out or in, from the exchange (see
    /// [`Cm::qp_attr`](roce_transport::cm::Cm::qp_attr)); for a UD id, the Q_Key
    /// [`RDMA_UDP_QKEY`](super::RDMA_UDP_QKEY) at INIT and no peer.
    pub fn qp_attr(&self, state: QpState) -> Result<QpAttr, Error> {
        let ids = self.state()?;
        if ids.ud {
            return Self::ud_qp_attr(state);
        }
        let Some(conn) = ids.conn else {
            return match state {
                QpState::Init => Ok(unconnected_init()),
                _ => Err(Error::InvalidArgument(
                    "RTR and RTS attributes need a connection",
                )),
            };
        };
        let sgid_index = ids.sgid_index.and_then(|index| u8::try_from(index).ok());
        let mut core = self.shared.lock()?;
        let cm = core.endpoint().cm().ok_or(Error::Gone)?;
        let mut attr = cm.qp_attr(conn, state, sgid_index.unwrap_or(0))?;
        if state == QpState::Rts && ids.ack_timeout.is_some() {
            attr.timeout = ids.ack_timeout;
        }
        Ok(attr)
    }

    /// Sends the RTU after a [`CmEventKind::ConnectResponse`](super::CmEventKind) once the
    /// program moved its QP to RTS (`rdma_establish`). No event follows on this side.
    pub fn establish(&self) -> Result<(), Error> {
        let conn = self.state()?.conn.ok_or(Error::InvalidArgument(
            "establish on an id without a connection",
        ))?;
        let mut core = self.shared.lock()?;
        core.endpoint().cm().ok_or(Error::Gone)?.establish(conn)?;
        self.shared.kick(&mut core)
    }

    /// The path to the peer once the route is resolved, or for a request's id.
    pub fn path_record(&self) -> Option<PathRecord> {
        let (sgid, dgid) = self.gids()?;
        let ids = self.state().ok()?;
        if !ids.route_resolved && ids.conn.is_none() {
            return None;
        }
        Some(PathRecord {
            sgid,
            dgid,
            pkey: 0xFFFF,
            mtu: self
                .shared
                .device
                .query_port()
                .active_mtu
                .min(PathMtu::Mtu4096),
            rate: 0,
            packet_life_time: CmConfig::default().packet_life_time,
            sl: 0,
            traffic_class: 0,
            hop_limit: HOP_LIMIT,
            flow_label: 0,
        })
    }
}
