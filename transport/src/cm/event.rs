//! What the CM gives back: events, MADs to send, errors and counters.

use roce_wire::cm::rej::RejectReason;
use roce_wire::cm::sidr_rep::SidrStatus;
use roce_wire::cm::{rej, rep, req, sidr_rep, sidr_req};
use roce_wire::mad;

use roce_wire::cm::ServiceId;

use super::attrs::QpAttrs;
use super::connection::ConnState;
use super::ids::{ConnId, Gid};
use crate::qp_state::QpState;

/// A REQ as the passive application sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectRequest {
    /// The requested service.
    pub service_id: ServiceId,
    /// The GID the REQ arrived on.
    pub local_gid: Gid,
    /// The requester's GID.
    pub remote_gid: Gid,
    /// The whole REQ (remote QPN, responder resources, initiator depth, private data ...).
    pub req: req::Repr,
}

/// What the CM tells the application, as rdma_cm's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CmEvent {
    /// Passive: a REQ for a service we listen on (`RDMA_CM_EVENT_CONNECT_REQUEST`); answer with
    /// [`Cm::accept`](super::Cm::accept) or [`Cm::reject`](super::Cm::reject).
    ConnectRequest {
        /// The new connection.
        conn: ConnId,
        /// The request.
        request: ConnectRequest,
    },
    /// Active: the REP arrived (`RDMA_CM_EVENT_CONNECT_RESPONSE`). Apply `qp` to the QP, then
    /// call [`Cm::establish`](super::Cm::establish).
    ConnectResponse {
        /// The connection.
        conn: ConnId,
        /// The attributes for INIT, RTR and RTS.
        qp: QpAttrs,
        /// The REP's private data.
        private_data: [u8; rep::PRIVATE_DATA_LEN],
    },
    /// The connection is usable (`RDMA_CM_EVENT_ESTABLISHED`).
    Established {
        /// The connection.
        conn: ConnId,
    },
    /// The peer refused (`RDMA_CM_EVENT_REJECTED`, status = reason). The connection is gone.
    Rejected {
        /// The connection.
        conn: ConnId,
        /// Why.
        reason: RejectReason,
        /// The REJ's private data.
        private_data: [u8; rej::PRIVATE_DATA_LEN],
    },
    /// The peer never answered (`RDMA_CM_EVENT_UNREACHABLE`). The connection is gone.
    Unreachable {
        /// The connection.
        conn: ConnId,
    },
    /// The connection is closed (`RDMA_CM_EVENT_DISCONNECTED`); move the QP to ERR.
    Disconnected {
        /// The connection.
        conn: ConnId,
    },
    /// Time-wait ended (`RDMA_CM_EVENT_TIMEWAIT_EXIT`); the QP may be reused.
    TimewaitExit {
        /// The connection.
        conn: ConnId,
    },
    /// Passive SIDR: a SIDR_REQ for a service we listen on; answer with [`Cm::sidr_reply`](super::Cm::sidr_reply).
    SidrRequest {
        /// The request.
        conn: ConnId,
        /// The requested service.
        service_id: ServiceId,
        /// The GID the SIDR_REQ arrived on.
        local_gid: Gid,
        /// The requester's GID.
        remote_gid: Gid,
        /// The SIDR_REQ's private data.
        private_data: [u8; sidr_req::PRIVATE_DATA_LEN],
    },
    /// Active SIDR: the service's UD QP (`RDMA_CM_EVENT_ESTABLISHED` for UD).
    SidrResolved {
        /// The request.
        conn: ConnId,
        /// The service's QPN.
        qpn: u32,
        /// Its Q_Key.
        qkey: u32,
        /// The SIDR_REP's private data.
        private_data: [u8; sidr_rep::PRIVATE_DATA_LEN],
    },
    /// Active SIDR: the service refused or does not exist (`RDMA_CM_EVENT_UNREACHABLE`).
    SidrRejected {
        /// The request.
        conn: ConnId,
        /// Why.
        status: SidrStatus,
    },
}

/// A MAD to send from QP1 to QP1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadTransmit {
    /// The GID to send from.
    pub local_gid: Gid,
    /// The GID to send to.
    pub remote_gid: Gid,
    /// The 256-byte MAD.
    pub mad: [u8; mad::MAD_LEN],
}

/// Why a CM call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// No such connection.
    #[error("no such CM connection")]
    UnknownConnection,
    /// The call does not fit the connection's state.
    #[error("the CM connection is in state {0:?}")]
    InvalidState(ConnState),
    /// More private data than the message carries.
    #[error("private data longer than the message carries")]
    PrivateDataTooLong,
    /// Someone already listens on the service ID.
    #[error("service ID already in use")]
    AddressInUse,
    /// Attributes asked for a QP state the CM does not settle (only INIT, RTR and RTS).
    #[error("the CM gives no attributes for QP state {0:?}")]
    UnsupportedQpState(QpState),
    /// [`CmConfig::max_connections`](super::CmConfig::max_connections) reached.
    #[error("too many CM connections")]
    TooManyConnections,
}

/// Counters of what the CM dropped or repeated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmStats {
    /// MADs that did not parse as a CM message.
    pub malformed: u64,
    /// Messages for no known connection, or not fitting its state.
    pub unexpected: u64,
    /// REQs and SIDR_REQs for a service nobody listens on.
    pub no_listener: u64,
    /// REQs dropped because the listener's backlog or the connection table was full.
    pub dropped_full: u64,
    /// Duplicates answered again.
    pub duplicates: u64,
    /// REJs "stale connection" sent.
    pub stale: u64,
    /// MADs resent after a timeout.
    pub retransmits: u64,
    /// REQs sent again after the peer rejected them because nobody listened
    /// ([`CmConfig::unlistened_retry`](super::CmConfig::unlistened_retry)).
    pub unlistened_retries: u64,
}
