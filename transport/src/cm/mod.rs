//! The InfiniBand communication manager (IBTA Vol 1 ch. 12) as rdma_cm uses it over RoCEv2,
//! sans-IO: connection setup and teardown with REQ/MRA/REJ/REP/RTU/DREQ/DREP, and service ID
//! resolution for UD with SIDR_REQ/SIDR_REP, behaving as the Linux kernel CM does on the wire
//! (its timeouts, retries, duplicate and stale-connection handling).
//!
//! The CM does not care how MADs travel. On RoCEv2 they are UD SEND_ONLY packets from QP1 to
//! QP1 with Q_Key [`GSI_QKEY`](roce_wire::mad::GSI_QKEY) and P_Key 0xFFFF; the caller owns that
//! QP and the address resolution. Calling order, like the transport's QPs:
//!
//! 1. [`Cm::handle_mad`] with every MAD QP1 receives, the sender's GID (the GRH / IP source)
//!    and the GID it arrived on; [`Cm::handle_timeout`] when [`Cm::poll_timeout`] is due;
//!    and the calls that start or answer things: [`listen`](Cm::listen),
//!    [`connect`](Cm::connect), [`accept`](Cm::accept), [`reject`](Cm::reject),
//!    [`establish`](Cm::establish), [`disconnect`](Cm::disconnect),
//!    [`resolve_service`](Cm::resolve_service), [`sidr_reply`](Cm::sidr_reply).
//! 2. [`Cm::poll_transmit`] until `None`: each MAD to send from QP1 to QP1 at a GID.
//! 3. [`Cm::poll_event`] until `None`: what the application is told (rdma_cm's events).
//!
//! The CM hands out the QP attributes the kernel CM would apply ([`QpAttrs`]); the caller
//! applies them to its QP (the active side on [`CmEvent::ConnectResponse`], before
//! [`establish`](Cm::establish) sends the RTU; the passive side from [`accept`](Cm::accept),
//! before the REP goes out). Private data is opaque here: rdma_cm's
//! [header](roce_wire::cm::cma) in a REQ is the caller's to write and read.
//!
//! Timing, as the kernel CM: a REQ is resent every 2 × packet lifetime + the peer's response
//! time (4.096 µs × 2^n, converted with [`time_to_ms`]), up to `max_cm_retries` times, then
//! the connection is [unreachable](CmEvent::Unreachable); a REP every response time the REQ
//! announced, as often as the REQ allows; a DREQ like the message before it. An MRA
//! stretches the wait to its service timeout. After a disconnect (or a reject) a connection
//! waits one local ACK timeout in time-wait, answering duplicates, before it is forgotten;
//! a REQ from a peer connection still known draws a REJ "stale connection".
//! Memory is bounded: at most [`CmConfig::max_connections`] connections, and a listener holds
//! at most its backlog of unanswered requests (more are dropped; the peer resends).

mod attrs;
mod connection;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rand_chacha::ChaCha12Rng;
use rand_core::{Rng, SeedableRng};
use roce_wire::cm::rej::RejectReason;
use roce_wire::cm::req::ServiceType;
use roce_wire::cm::sidr_rep::SidrStatus;
use roce_wire::cm::{
    self, drep, dreq, mra, path, private_data, rej, rep, req, rtu, sidr_rep, sidr_req, time_to_ms,
    Message, MessageKind,
};
use roce_wire::{mad, Psn};
use rustc_hash::FxHashMap;

pub use attrs::QpAttrs;
pub use connection::ConnState;
pub use roce_wire::cm::ServiceId;

use crate::qp_state::{AddressVector, PathMtu};
use attrs::Negotiated;
use connection::{Connection, RemoteKey};

/// A GID: on RoCEv2 an IPv6 address, IPv4-mapped (`::ffff:a.b.c.d`) for IPv4.
pub type Gid = [u8; 16];

/// A connection (or SIDR request) of this CM: its local communication ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u32);

/// Service timeout an MRA announces for a REQ the application has not answered yet
/// (rdma_cm's `CMA_CM_MRA_SETTING`: 4.096 µs × 2^24, about 69 s).
const MRA_SERVICE_TIMEOUT: u8 = 24;

/// The CM's settings; the defaults are the kernel rdma_cm's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmConfig {
    /// This node's CA GUID; must be unique and stable (the kernel's timewait key).
    pub local_ca_guid: u64,
    /// Seed of the communication IDs, transaction IDs and starting PSNs.
    pub seed: [u8; 32],
    /// The CA's ACK delay exponent (rxe: 15), sent as a REP's target ACK delay.
    pub ca_ack_delay: u8,
    /// Packet lifetime exponent of every path (`CMA_IBOE_PACKET_LIFETIME`: 18; 16 in newer
    /// kernels).
    pub packet_life_time: u8,
    /// Response time exponent announced and assumed (`CMA_CM_RESPONSE_TIMEOUT`: 20).
    pub cm_response_timeout: u8,
    /// Resends of an unanswered REQ, REP, DREQ or SIDR_REQ (`CMA_MAX_CM_RETRIES`: 15).
    pub max_cm_retries: u8,
    /// The largest path MTU this side's QPs use.
    pub max_path_mtu: PathMtu,
    /// Connections (all states, time-wait included) held at once.
    pub max_connections: usize,
}

impl Default for CmConfig {
    fn default() -> Self {
        CmConfig {
            local_ca_guid: 0,
            seed: [0; 32],
            ca_ack_delay: 15,
            packet_life_time: 18,
            cm_response_timeout: 20,
            max_cm_retries: 15,
            max_path_mtu: PathMtu::Mtu4096,
            max_connections: 4096,
        }
    }
}

/// What [`Cm::connect`] needs: the path, the QP and rdma_cm's `struct rdma_conn_param`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectParams {
    /// The service to reach.
    pub service_id: ServiceId,
    /// Our GID.
    pub local_gid: Gid,
    /// Index of our GID in the device's table (for the QP's address vector).
    pub sgid_index: u8,
    /// The peer's GID.
    pub remote_gid: Gid,
    /// Our QP's number.
    pub qpn: u32,
    /// RC or UC.
    pub service_type: ServiceType,
    /// The path MTU to offer (capped by [`CmConfig::max_path_mtu`]).
    pub path_mtu: PathMtu,
    /// READs and atomics our QP accepts at once.
    pub responder_resources: u8,
    /// READs and atomics our QP issues at once.
    pub initiator_depth: u8,
    /// Transport retries (capped at 7).
    pub retry_count: u8,
    /// RNR retries (capped at 7; 7 is infinite).
    pub rnr_retry_count: u8,
    /// Whether our QP uses an SRQ.
    pub srq: bool,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// IP traffic class of the path.
    pub traffic_class: u8,
    /// IP hop limit of the path.
    pub hop_limit: u8,
    /// IPv6 flow label of the path.
    pub flow_label: u32,
}

/// What [`Cm::accept`] needs (rdma_cm's `struct rdma_conn_param` on the passive side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcceptParams {
    /// Our QP's number.
    pub qpn: u32,
    /// Index of our GID (the one the REQ arrived on) in the device's table.
    pub sgid_index: u8,
    /// READs and atomics our QP accepts at once.
    pub responder_resources: u8,
    /// READs and atomics our QP issues at once.
    pub initiator_depth: u8,
    /// RNR retries the peer's QP should use (capped at 7).
    pub rnr_retry_count: u8,
    /// Whether our QP uses an SRQ.
    pub srq: bool,
    /// End-to-end flow control.
    pub flow_control: bool,
}

/// The answer [`Cm::sidr_reply`] sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrReply {
    /// [`SidrStatus::SUCCESS`] or why not.
    pub status: SidrStatus,
    /// The UD QP serving the request.
    pub qpn: u32,
    /// Its Q_Key.
    pub qkey: u32,
}

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
    /// [`Cm::accept`] or [`Cm::reject`].
    ConnectRequest {
        /// The new connection.
        conn: ConnId,
        /// The request.
        request: ConnectRequest,
    },
    /// Active: the REP arrived (`RDMA_CM_EVENT_CONNECT_RESPONSE`). Apply `qp` to the QP, then
    /// call [`Cm::establish`].
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
    /// Passive SIDR: a SIDR_REQ for a service we listen on; answer with [`Cm::sidr_reply`].
    SidrRequest {
        /// The request.
        conn: ConnId,
        /// The requested service.
        service_id: ServiceId,
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
    /// [`CmConfig::max_connections`] reached.
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
}

#[derive(Debug, Clone, Copy)]
struct Listener {
    backlog: usize,
    pending: usize,
}

/// A communication manager for one port.
#[derive(Debug)]
pub struct Cm {
    config: CmConfig,
    rng: ChaCha12Rng,
    /// XORed into a counter to form communication IDs, as the kernel randomises its IDs.
    id_operand: u32,
    next_id: u32,
    /// High half of the transaction IDs we start.
    tid_high: u32,
    conns: FxHashMap<u32, Connection>,
    remotes: FxHashMap<RemoteKey, u32>,
    listeners: FxHashMap<ServiceId, Listener>,
    transmits: VecDeque<MadTransmit>,
    events: VecDeque<CmEvent>,
    stats: CmStats,
}

impl Cm {
    /// A CM with no connections and no listeners.
    pub fn new(config: CmConfig) -> Cm {
        let mut rng = ChaCha12Rng::from_seed(config.seed);
        Cm {
            id_operand: rng.next_u32(),
            tid_high: rng.next_u32(),
            rng,
            config,
            next_id: 0,
            conns: FxHashMap::default(),
            remotes: FxHashMap::default(),
            listeners: FxHashMap::default(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            stats: CmStats::default(),
        }
    }

    /// The counters.
    pub fn stats(&self) -> CmStats {
        self.stats
    }

    /// The state of a connection, while the CM knows it.
    pub fn state(&self, conn: ConnId) -> Option<ConnState> {
        self.conns.get(&conn.0).map(|c| c.state)
    }

    /// Number of connections held, time-wait included.
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Accepts REQs and SIDR_REQs for `service_id`, holding at most `backlog` unanswered.
    pub fn listen(&mut self, service_id: ServiceId, backlog: usize) -> Result<(), CmError> {
        if self.listeners.contains_key(&service_id) {
            return Err(CmError::AddressInUse);
        }
        self.listeners.insert(
            service_id,
            Listener {
                backlog,
                pending: 0,
            },
        );
        Ok(())
    }

    /// Stops listening; later REQs for the service are rejected.
    pub fn stop_listening(&mut self, service_id: ServiceId) {
        self.listeners.remove(&service_id);
    }

    /// The earliest time [`handle_timeout`](Self::handle_timeout) has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.conns.values().filter_map(|c| c.deadline).min()
    }

    /// The next MAD to send.
    pub fn poll_transmit(&mut self) -> Option<MadTransmit> {
        self.transmits.pop_front()
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    fn alloc_id(&mut self) -> Result<u32, CmError> {
        if self.conns.len() >= self.config.max_connections {
            return Err(CmError::TooManyConnections);
        }
        // At most `max_connections` IDs are taken, so this finds a free one quickly.
        loop {
            self.next_id = self.next_id.wrapping_add(1);
            let id = self.next_id ^ self.id_operand;
            if id != 0 && !self.conns.contains_key(&id) {
                return Ok(id);
            }
        }
    }

    fn new_tid(&self, local_id: u32) -> u64 {
        (u64::from(self.tid_high) << 32) | u64::from(local_id)
    }

    fn random_psn(&mut self) -> Psn {
        Psn::new(self.rng.next_u32())
    }

    fn ms(exponent: u8) -> Duration {
        Duration::from_millis(time_to_ms(exponent))
    }

    fn emit(transaction_id: u64, message: Message) -> [u8; mad::MAD_LEN] {
        let mut bytes = [0; mad::MAD_LEN];
        cm::Repr {
            transaction_id,
            message,
        }
        .emit(&mut mad::Packet::new_unchecked(&mut bytes[..]));
        bytes
    }

    fn send(&mut self, local_gid: Gid, remote_gid: Gid, mad: [u8; mad::MAD_LEN]) {
        self.transmits.push_back(MadTransmit {
            local_gid,
            remote_gid,
            mad,
        });
    }

    fn send_on(&mut self, id: u32, mad: [u8; mad::MAD_LEN]) {
        if let Some(conn) = self.conns.get(&id) {
            let (local, remote) = (conn.local_gid, conn.remote_gid);
            self.send(local, remote, mad);
        }
    }

    fn remove(&mut self, id: u32) {
        if let Some(conn) = self.conns.remove(&id) {
            if let Some(key) = conn.remote_key {
                if self.remotes.get(&key) == Some(&id) {
                    self.remotes.remove(&key);
                }
            }
            self.release_backlog(&conn);
        }
    }

    fn release_backlog(&mut self, conn: &Connection) {
        if conn.pending_on_listener {
            if let Some(listener) = self.listeners.get_mut(&conn.service_id) {
                listener.pending = listener.pending.saturating_sub(1);
            }
        }
    }

    /// How long an answered SIDR_REQ is remembered: past the requester's next resend.
    fn sidr_linger(&self) -> Duration {
        Self::ms(self.config.cm_response_timeout) * 2
    }

    fn timewait(&self, ack_timeout: u8) -> Duration {
        Self::ms(ack_timeout.max(self.config.packet_life_time + 1))
    }

    /// Active side: sends a REQ. Events follow: [`CmEvent::ConnectResponse`],
    /// [`CmEvent::Rejected`] or [`CmEvent::Unreachable`].
    pub fn connect(
        &mut self,
        now: Instant,
        params: &ConnectParams,
        private: &[u8],
    ) -> Result<ConnId, CmError> {
        let private_data = private_data(private).map_err(|_| CmError::PrivateDataTooLong)?;
        let id = self.alloc_id()?;
        let ack_timeout =
            attrs::ack_timeout(self.config.ca_ack_delay, self.config.packet_life_time);
        let path_mtu = params.path_mtu.min(self.config.max_path_mtu);
        // The kernel writes the permissive LID when the path leaves the subnet.
        let lid = if params.hop_limit > 1 { 0xFFFF } else { 0 };
        let request = req::Repr {
            local_comm_id: id,
            vendor_id: 0,
            service_id: params.service_id,
            local_ca_guid: self.config.local_ca_guid,
            local_qkey: 0,
            local_qpn: params.qpn & 0xFF_FFFF,
            responder_resources: params.responder_resources,
            initiator_depth: params.initiator_depth,
            remote_cm_response_timeout: self.config.cm_response_timeout,
            service_type: params.service_type,
            flow_control: params.flow_control,
            starting_psn: self.random_psn(),
            local_cm_response_timeout: self.config.cm_response_timeout,
            retry_count: params.retry_count.min(7),
            pkey: mad::DEFAULT_PKEY,
            path_mtu: path_mtu as u8,
            rnr_retry_count: params.rnr_retry_count.min(7),
            max_cm_retries: self.config.max_cm_retries.min(15),
            srq: params.srq,
            extended_transport_type: 0,
            primary_path: path::Repr {
                local_lid: lid,
                remote_lid: lid,
                local_gid: params.local_gid,
                remote_gid: params.remote_gid,
                flow_label: params.flow_label,
                packet_rate: 0,
                traffic_class: params.traffic_class,
                hop_limit: params.hop_limit,
                sl: 0,
                subnet_local: false,
                local_ack_timeout: ack_timeout,
            },
            alternate_path: path::Repr::default(),
            private_data,
        };
        let tid = self.new_tid(id);
        let mad = Self::emit(tid, Message::Req(request));
        let timeout =
            Self::ms(self.config.packet_life_time) * 2 + Self::ms(self.config.cm_response_timeout);
        let mut conn = Connection::new(
            connection::ConnState::ReqSent,
            params.local_gid,
            params.remote_gid,
            params.service_id,
        );
        conn.transaction_id = tid;
        conn.req = Some(request);
        conn.ack_timeout = ack_timeout;
        conn.sgid_index = params.sgid_index;
        conn.send_reliably(now, mad, request.max_cm_retries, timeout);
        self.conns.insert(id, conn);
        self.send_on(id, mad);
        Ok(ConnId(id))
    }

    /// Passive side: accepts a [`CmEvent::ConnectRequest`] with a REP. Returns the attributes
    /// to move our QP to INIT, RTR and RTS before the REP reaches the peer.
    pub fn accept(
        &mut self,
        now: Instant,
        conn: ConnId,
        params: &AcceptParams,
        private: &[u8],
    ) -> Result<QpAttrs, CmError> {
        let private_data = private_data(private).map_err(|_| CmError::PrivateDataTooLong)?;
        let sq_psn = self.random_psn();
        let config = self.config;
        let c = self
            .conns
            .get_mut(&conn.0)
            .ok_or(CmError::UnknownConnection)?;
        let request = match (c.state, c.req) {
            (ConnState::ReqReceived | ConnState::MraReqSent, Some(request)) => request,
            _ => return Err(CmError::InvalidState(c.state)),
        };
        let path_mtu = attrs::path_mtu(request.path_mtu)
            .ok_or(CmError::InvalidState(c.state))?
            .min(config.max_path_mtu);
        let reply = rep::Repr {
            local_comm_id: conn.0,
            remote_comm_id: c.remote_comm_id,
            local_qkey: 0,
            local_qpn: params.qpn & 0xFF_FFFF,
            starting_psn: sq_psn,
            responder_resources: params.responder_resources,
            initiator_depth: params.initiator_depth,
            target_ack_delay: config.ca_ack_delay,
            failover_accepted: 0,
            flow_control: params.flow_control,
            rnr_retry_count: params.rnr_retry_count.min(7),
            srq: params.srq,
            local_ca_guid: config.local_ca_guid,
            private_data,
        };
        let negotiated = Negotiated {
            service_type: request.service_type,
            path_mtu,
            remote_qpn: request.local_qpn,
            rq_psn: request.starting_psn,
            sq_psn,
            responder_resources: params.responder_resources,
            initiator_depth: params.initiator_depth,
            retry_count: request.retry_count,
            rnr_retry_count: request.rnr_retry_count,
            ack_timeout: request.primary_path.local_ack_timeout,
            av: AddressVector {
                dgid: c.remote_gid,
                sgid_index: params.sgid_index,
                hop_limit: request.primary_path.hop_limit,
                traffic_class: request.primary_path.traffic_class,
                flow_label: request.primary_path.flow_label,
            },
        };
        let mad = Self::emit(c.transaction_id, Message::Rep(reply));
        // The kernel waits the response time the REQ announced, as often as it allows.
        c.send_reliably(
            now,
            mad,
            request.max_cm_retries,
            Self::ms(request.local_cm_response_timeout),
        );
        c.state = ConnState::RepSent;
        let was_pending = std::mem::take(&mut c.pending_on_listener);
        let service_id = c.service_id;
        if was_pending {
            self.release_listener_slot(service_id);
        }
        self.send_on(conn.0, mad);
        Ok(negotiated.qp_attrs())
    }

    fn release_listener_slot(&mut self, service_id: ServiceId) {
        if let Some(listener) = self.listeners.get_mut(&service_id) {
            listener.pending = listener.pending.saturating_sub(1);
        }
    }

    /// Passive side: refuses a [`CmEvent::ConnectRequest`] (`rdma_reject`): a REJ with reason
    /// "consumer defined" and `private` as its private data.
    pub fn reject(&mut self, now: Instant, conn: ConnId, private: &[u8]) -> Result<(), CmError> {
        let private_data = private_data(private).map_err(|_| CmError::PrivateDataTooLong)?;
        let wait = self.timewait(0);
        let c = self
            .conns
            .get_mut(&conn.0)
            .ok_or(CmError::UnknownConnection)?;
        if !matches!(c.state, ConnState::ReqReceived | ConnState::MraReqSent) {
            return Err(CmError::InvalidState(c.state));
        }
        let mad = Self::emit(
            c.transaction_id,
            Message::Rej(rej::Repr {
                local_comm_id: conn.0,
                remote_comm_id: c.remote_comm_id,
                message_rejected: MessageKind::Req,
                reason: RejectReason::CONSUMER_DEFINED,
                ari_length: 0,
                ari: [0; rej::ARI_LEN],
                private_data,
            }),
        );
        c.last_reply = Some(mad);
        // Duplicates of the REQ get the same REJ until the wait ends.
        c.enter_timewait(now, wait, false);
        let was_pending = std::mem::take(&mut c.pending_on_listener);
        let service_id = c.service_id;
        if was_pending {
            self.release_listener_slot(service_id);
        }
        self.send_on(conn.0, mad);
        Ok(())
    }

    /// Active side: after [`CmEvent::ConnectResponse`] (and the QP moved to RTS), sends the
    /// RTU; [`CmEvent::Established`] follows.
    pub fn establish(&mut self, conn: ConnId) -> Result<(), CmError> {
        let c = self
            .conns
            .get_mut(&conn.0)
            .ok_or(CmError::UnknownConnection)?;
        if c.state != ConnState::RepReceived {
            return Err(CmError::InvalidState(c.state));
        }
        let mad = Self::emit(
            c.transaction_id,
            Message::Rtu(rtu::Repr {
                local_comm_id: conn.0,
                remote_comm_id: c.remote_comm_id,
                private_data: [0; rtu::PRIVATE_DATA_LEN],
            }),
        );
        c.state = ConnState::Established;
        // A REP that comes again means the RTU was lost: it is sent again then.
        c.last_reply = Some(mad);
        self.send_on(conn.0, mad);
        self.events.push_back(CmEvent::Established { conn });
        Ok(())
    }

    /// Passive side: the QP received its first packet before the RTU (the verbs
    /// `IBV_EVENT_COMM_EST`); the connection is established as if the RTU had come.
    pub fn notify_comm_established(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.get_mut(&conn.0) {
            if c.state == ConnState::RepSent {
                c.answered();
                c.state = ConnState::Established;
                self.events.push_back(CmEvent::Established { conn });
            }
        }
    }

    /// Either side: sends a DREQ (`rdma_disconnect`); [`CmEvent::Disconnected`] follows when
    /// the DREP comes or the retries run out. A connection already disconnecting or closed is
    /// left alone.
    pub fn disconnect(
        &mut self,
        now: Instant,
        conn: ConnId,
        private: &[u8],
    ) -> Result<(), CmError> {
        let private_data = private_data(private).map_err(|_| CmError::PrivateDataTooLong)?;
        let tid = self.new_tid(conn.0);
        let timeout =
            Self::ms(self.config.packet_life_time) * 2 + Self::ms(self.config.cm_response_timeout);
        let retries = self.config.max_cm_retries;
        let c = self
            .conns
            .get_mut(&conn.0)
            .ok_or(CmError::UnknownConnection)?;
        match c.state {
            ConnState::Established | ConnState::RepSent => {}
            ConnState::DreqSent | ConnState::TimeWait => return Ok(()),
            state => return Err(CmError::InvalidState(state)),
        }
        let mad = Self::emit(
            tid,
            Message::Dreq(dreq::Repr {
                local_comm_id: conn.0,
                remote_comm_id: c.remote_comm_id,
                remote_qpn: c.remote_qpn,
                private_data,
            }),
        );
        c.transaction_id = tid;
        c.state = ConnState::DreqSent;
        c.send_reliably(now, mad, retries, timeout);
        self.send_on(conn.0, mad);
        Ok(())
    }

    /// Forgets a connection at once (`rdma_destroy_id`): an unanswered request is rejected,
    /// an established connection gets one DREQ.
    pub fn destroy(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get(&conn.0) else {
            return;
        };
        let message = match c.state {
            ConnState::ReqReceived | ConnState::MraReqSent => Some(Message::Rej(rej::Repr {
                local_comm_id: conn.0,
                remote_comm_id: c.remote_comm_id,
                message_rejected: MessageKind::Req,
                reason: RejectReason::TIMEOUT,
                ari_length: 0,
                ari: [0; rej::ARI_LEN],
                private_data: [0; rej::PRIVATE_DATA_LEN],
            })),
            ConnState::Established | ConnState::RepSent => Some(Message::Dreq(dreq::Repr {
                local_comm_id: conn.0,
                remote_comm_id: c.remote_comm_id,
                remote_qpn: c.remote_qpn,
                private_data: [0; dreq::PRIVATE_DATA_LEN],
            })),
            _ => None,
        };
        if let Some(message) = message {
            let mad = Self::emit(c.transaction_id, message);
            self.send_on(conn.0, mad);
        }
        self.remove(conn.0);
    }

    /// Active UD side: sends a SIDR_REQ for `service_id` (`rdma_resolve_route` +
    /// `rdma_connect` on a UDP-space id). [`CmEvent::SidrResolved`],
    /// [`CmEvent::SidrRejected`] or [`CmEvent::Unreachable`] follows.
    pub fn resolve_service(
        &mut self,
        now: Instant,
        service_id: ServiceId,
        local_gid: Gid,
        remote_gid: Gid,
        private: &[u8],
    ) -> Result<ConnId, CmError> {
        let private_data = private_data(private).map_err(|_| CmError::PrivateDataTooLong)?;
        let id = self.alloc_id()?;
        let tid = self.new_tid(id);
        let mad = Self::emit(
            tid,
            Message::SidrReq(sidr_req::Repr {
                request_id: id,
                pkey: mad::DEFAULT_PKEY,
                service_id,
                private_data,
            }),
        );
        let mut c = Connection::new(ConnState::SidrReqSent, local_gid, remote_gid, service_id);
        c.transaction_id = tid;
        c.send_reliably(
            now,
            mad,
            self.config.max_cm_retries,
            Self::ms(self.config.cm_response_timeout),
        );
        self.conns.insert(id, c);
        self.send_on(id, mad);
        Ok(ConnId(id))
    }

    /// Passive UD side: answers a [`CmEvent::SidrRequest`].
    pub fn sidr_reply(
        &mut self,
        now: Instant,
        conn: ConnId,
        reply: &SidrReply,
        private: &[u8],
    ) -> Result<(), CmError> {
        let private_data = private_data(private).map_err(|_| CmError::PrivateDataTooLong)?;
        let wait = self.sidr_linger();
        let c = self
            .conns
            .get_mut(&conn.0)
            .ok_or(CmError::UnknownConnection)?;
        if c.state != ConnState::SidrReqReceived {
            return Err(CmError::InvalidState(c.state));
        }
        let mad = Self::emit(
            c.transaction_id,
            Message::SidrRep(sidr_rep::Repr {
                request_id: c.remote_comm_id,
                status: reply.status,
                info_length: 0,
                qpn: reply.qpn & 0xFF_FFFF,
                service_id: c.service_id,
                qkey: reply.qkey,
                info: [0; sidr_rep::INFO_LEN],
                private_data,
            }),
        );
        c.last_reply = Some(mad);
        // A SIDR_REP is not resent, but a repeated SIDR_REQ gets it again until the wait ends.
        c.enter_timewait(now, wait, false);
        let was_pending = std::mem::take(&mut c.pending_on_listener);
        let service_id = c.service_id;
        if was_pending {
            self.release_listener_slot(service_id);
        }
        self.send_on(conn.0, mad);
        Ok(())
    }

    /// Takes a MAD QP1 received from `remote_gid` on our `local_gid`. What is not a CM
    /// message, or fits no connection, is dropped and counted in [`CmStats`].
    pub fn handle_mad(&mut self, now: Instant, local_gid: Gid, remote_gid: Gid, bytes: &[u8]) {
        let Ok(repr) = mad::Packet::new_checked(bytes).and_then(|p| cm::Repr::parse(&p)) else {
            self.stats.malformed += 1;
            return;
        };
        let tid = repr.transaction_id;
        match repr.message {
            Message::Req(m) => self.on_req(local_gid, remote_gid, tid, m),
            Message::Mra(m) => self.on_mra(now, m),
            Message::Rej(m) => self.on_rej(now, m),
            Message::Rep(m) => self.on_rep(m),
            Message::Rtu(m) => self.on_rtu(m),
            Message::Dreq(m) => self.on_dreq(now, local_gid, remote_gid, tid, m),
            Message::Drep(m) => self.on_drep(now, m),
            Message::SidrReq(m) => self.on_sidr_req(now, local_gid, remote_gid, tid, m),
            Message::SidrRep(m) => self.on_sidr_rep(m),
        }
    }

    /// The connection a message addressed to `our_id` from `their_id` belongs to.
    fn matching(&self, our_id: u32, their_id: u32) -> Option<&Connection> {
        let c = self.conns.get(&our_id)?;
        (c.remote_comm_id == 0 || c.remote_comm_id == their_id).then_some(c)
    }

    fn reject_req(
        &mut self,
        local_gid: Gid,
        remote_gid: Gid,
        tid: u64,
        request: &req::Repr,
        reason: RejectReason,
    ) {
        // As the kernel's cm_issue_rej: our ID is the REQ's (reserved) remote ID word, zero.
        let mad = Self::emit(
            tid,
            Message::Rej(rej::Repr {
                local_comm_id: 0,
                remote_comm_id: request.local_comm_id,
                message_rejected: MessageKind::Req,
                reason,
                ari_length: 0,
                ari: [0; rej::ARI_LEN],
                private_data: [0; rej::PRIVATE_DATA_LEN],
            }),
        );
        self.send(local_gid, remote_gid, mad);
    }

    fn on_req(&mut self, local_gid: Gid, remote_gid: Gid, tid: u64, request: req::Repr) {
        let key = RemoteKey::Conn {
            ca_guid: request.local_ca_guid,
            comm_id: request.local_comm_id,
        };
        if let Some(&id) = self.remotes.get(&key) {
            self.on_duplicate_req(id, local_gid, remote_gid, tid, &request);
            return;
        }
        let same_qp_connected = self.conns.values().any(|c| {
            matches!(
                c.state,
                ConnState::RepSent | ConnState::Established | ConnState::DreqSent
            ) && c.remote_qpn == request.local_qpn
                && matches!(c.remote_key, Some(RemoteKey::Conn { ca_guid, .. }) if ca_guid == request.local_ca_guid)
        });
        if same_qp_connected {
            self.stats.stale += 1;
            self.reject_req(
                local_gid,
                remote_gid,
                tid,
                &request,
                RejectReason::STALE_CONNECTION,
            );
            return;
        }
        let Some(listener) = self.listeners.get(&request.service_id).copied() else {
            self.stats.no_listener += 1;
            self.reject_req(
                local_gid,
                remote_gid,
                tid,
                &request,
                RejectReason::INVALID_SERVICE_ID,
            );
            return;
        };
        if !matches!(request.service_type, ServiceType::Rc | ServiceType::Uc) {
            self.reject_req(
                local_gid,
                remote_gid,
                tid,
                &request,
                RejectReason::INVALID_TRANSPORT_TYPE,
            );
            return;
        }
        if attrs::path_mtu(request.path_mtu).is_none() {
            self.reject_req(
                local_gid,
                remote_gid,
                tid,
                &request,
                RejectReason::INVALID_MTU,
            );
            return;
        }
        if listener.pending >= listener.backlog {
            self.stats.dropped_full += 1;
            return;
        }
        let Ok(id) = self.alloc_id() else {
            self.stats.dropped_full += 1;
            return;
        };
        if let Some(listener) = self.listeners.get_mut(&request.service_id) {
            listener.pending += 1;
        }
        let mut c = Connection::new(
            ConnState::ReqReceived,
            local_gid,
            remote_gid,
            request.service_id,
        );
        c.remote_key = Some(key);
        c.remote_comm_id = request.local_comm_id;
        c.remote_qpn = request.local_qpn;
        c.transaction_id = tid;
        c.req = Some(request);
        c.pending_on_listener = true;
        c.ack_timeout = request.primary_path.local_ack_timeout;
        self.conns.insert(id, c);
        self.remotes.insert(key, id);
        self.events.push_back(CmEvent::ConnectRequest {
            conn: ConnId(id),
            request: ConnectRequest {
                service_id: request.service_id,
                local_gid,
                remote_gid,
                req: request,
            },
        });
    }

    fn on_duplicate_req(
        &mut self,
        id: u32,
        local_gid: Gid,
        remote_gid: Gid,
        tid: u64,
        request: &req::Repr,
    ) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match c.state {
            ConnState::ReqReceived => {
                // The application is slow to answer: ask the peer to wait (rdma_cm does).
                let mad = Self::emit(
                    c.transaction_id,
                    Message::Mra(mra::Repr {
                        local_comm_id: id,
                        remote_comm_id: c.remote_comm_id,
                        message_mraed: MessageKind::Req,
                        service_timeout: MRA_SERVICE_TIMEOUT,
                        private_data: [0; mra::PRIVATE_DATA_LEN],
                    }),
                );
                c.state = ConnState::MraReqSent;
                c.last_reply = Some(mad);
                self.stats.duplicates += 1;
                self.send_on(id, mad);
            }
            ConnState::MraReqSent => self.resend_last_reply(id),
            ConnState::TimeWait => {
                let was_rejected = c.last_reply.is_some_and(|mad| {
                    mad::Packet::new_unchecked(&mad[..]).attribute_id() == cm::attribute::REJ
                });
                if was_rejected {
                    self.resend_last_reply(id);
                } else {
                    self.stats.stale += 1;
                    self.reject_req(
                        local_gid,
                        remote_gid,
                        tid,
                        request,
                        RejectReason::STALE_CONNECTION,
                    );
                }
            }
            // The REP is resent by its own timer.
            _ => self.stats.duplicates += 1,
        }
    }

    fn resend_last_reply(&mut self, id: u32) {
        if let Some(mad) = self.conns.get(&id).and_then(|c| c.last_reply) {
            self.stats.duplicates += 1;
            self.send_on(id, mad);
        }
    }

    fn on_rep(&mut self, m: rep::Repr) {
        let id = m.remote_comm_id;
        let Some(c) = self.matching(id, m.local_comm_id) else {
            self.stats.unexpected += 1;
            return;
        };
        let (transaction_id, remote_gid, sgid_index, our_ack_timeout) =
            (c.transaction_id, c.remote_gid, c.sgid_index, c.ack_timeout);
        match (c.state, c.req) {
            (ConnState::ReqSent, Some(request)) => {
                let key = RemoteKey::Conn {
                    ca_guid: m.local_ca_guid,
                    comm_id: m.local_comm_id,
                };
                if self.remotes.get(&key).is_some_and(|&other| other != id) {
                    self.stats.stale += 1;
                    let mad = Self::emit(
                        transaction_id,
                        Message::Rej(rej::Repr {
                            local_comm_id: id,
                            remote_comm_id: m.local_comm_id,
                            message_rejected: MessageKind::Rep,
                            reason: RejectReason::STALE_CONNECTION,
                            ari_length: 0,
                            ari: [0; rej::ARI_LEN],
                            private_data: [0; rej::PRIVATE_DATA_LEN],
                        }),
                    );
                    self.send_on(id, mad);
                    return;
                }
                let Some(path_mtu) = attrs::path_mtu(request.path_mtu) else {
                    return;
                };
                let ack_timeout =
                    attrs::ack_timeout(m.target_ack_delay, our_ack_timeout.saturating_sub(1));
                let negotiated = Negotiated {
                    service_type: request.service_type,
                    path_mtu,
                    remote_qpn: m.local_qpn,
                    rq_psn: m.starting_psn,
                    sq_psn: request.starting_psn,
                    // The peer's initiator depth is what our responder must hold, and
                    // the reverse (the kernel's cm_rep_handler).
                    responder_resources: m.initiator_depth,
                    initiator_depth: m.responder_resources,
                    retry_count: request.retry_count,
                    rnr_retry_count: m.rnr_retry_count,
                    ack_timeout,
                    av: AddressVector {
                        dgid: remote_gid,
                        sgid_index,
                        hop_limit: request.primary_path.hop_limit,
                        traffic_class: request.primary_path.traffic_class,
                        flow_label: request.primary_path.flow_label,
                    },
                };
                if let Some(c) = self.conns.get_mut(&id) {
                    c.answered();
                    c.state = ConnState::RepReceived;
                    c.remote_comm_id = m.local_comm_id;
                    c.remote_qpn = m.local_qpn;
                    c.remote_key = Some(key);
                    c.ack_timeout = ack_timeout;
                }
                self.remotes.insert(key, id);
                self.events.push_back(CmEvent::ConnectResponse {
                    conn: ConnId(id),
                    qp: negotiated.qp_attrs(),
                    private_data: m.private_data,
                });
            }
            (ConnState::Established, _) => self.resend_last_reply(id),
            (ConnState::RepReceived, _) => self.stats.duplicates += 1,
            _ => self.stats.unexpected += 1,
        }
    }

    fn on_rtu(&mut self, m: rtu::Repr) {
        let id = m.remote_comm_id;
        match self.matching(id, m.local_comm_id).map(|c| c.state) {
            Some(ConnState::RepSent) => self.notify_comm_established(ConnId(id)),
            Some(ConnState::Established) => self.stats.duplicates += 1,
            _ => self.stats.unexpected += 1,
        }
    }

    fn on_mra(&mut self, now: Instant, m: mra::Repr) {
        let id = m.remote_comm_id;
        let state = self.matching(id, m.local_comm_id).map(|c| c.state);
        let fits = matches!(
            (state, m.message_mraed),
            (Some(ConnState::ReqSent), MessageKind::Req)
                | (Some(ConnState::RepSent), MessageKind::Rep)
        );
        match self.conns.get_mut(&id) {
            Some(c) if fits => {
                // As cm_mra_handler: wait the announced service time plus a round trip.
                c.deadline = Some(now + Self::ms(m.service_timeout) + Self::ms(c.ack_timeout));
            }
            _ => self.stats.unexpected += 1,
        }
    }

    fn on_rej(&mut self, now: Instant, m: rej::Repr) {
        let id = m.remote_comm_id;
        let Some(state) = self.matching(id, m.local_comm_id).map(|c| c.state) else {
            self.stats.unexpected += 1;
            return;
        };
        match state {
            ConnState::ReqSent
            | ConnState::RepSent
            | ConnState::MraReqSent
            | ConnState::RepReceived => {
                self.remove(id);
                self.events.push_back(CmEvent::Rejected {
                    conn: ConnId(id),
                    reason: m.reason,
                    private_data: m.private_data,
                });
            }
            ConnState::Established | ConnState::DreqSent => {
                let wait = self.timewait(self.conns.get(&id).map_or(0, |c| c.ack_timeout));
                if let Some(c) = self.conns.get_mut(&id) {
                    c.enter_timewait(now, wait, true);
                }
                self.events
                    .push_back(CmEvent::Disconnected { conn: ConnId(id) });
            }
            _ => self.stats.unexpected += 1,
        }
    }

    fn drep_for(tid: u64, dreq: &dreq::Repr) -> [u8; mad::MAD_LEN] {
        Self::emit(
            tid,
            Message::Drep(drep::Repr {
                local_comm_id: dreq.remote_comm_id,
                remote_comm_id: dreq.local_comm_id,
                private_data: [0; drep::PRIVATE_DATA_LEN],
            }),
        )
    }

    fn on_dreq(&mut self, now: Instant, local_gid: Gid, remote_gid: Gid, tid: u64, m: dreq::Repr) {
        let id = m.remote_comm_id;
        let drep = Self::drep_for(tid, &m);
        let Some(c) = self.matching(id, m.local_comm_id) else {
            // As the kernel: a DREQ for a connection we forgot still gets its DREP.
            self.stats.unexpected += 1;
            self.send(local_gid, remote_gid, drep);
            return;
        };
        match c.state {
            ConnState::Established
            | ConnState::RepSent
            | ConnState::DreqSent
            | ConnState::RepReceived => {
                let wait = self.timewait(c.ack_timeout);
                if let Some(c) = self.conns.get_mut(&id) {
                    c.last_reply = Some(drep);
                    c.enter_timewait(now, wait, true);
                }
                self.send_on(id, drep);
                self.events
                    .push_back(CmEvent::Disconnected { conn: ConnId(id) });
            }
            ConnState::TimeWait => {
                self.stats.duplicates += 1;
                self.send_on(id, drep);
            }
            _ => self.stats.unexpected += 1,
        }
    }

    fn on_drep(&mut self, now: Instant, m: drep::Repr) {
        let id = m.remote_comm_id;
        match self
            .matching(id, m.local_comm_id)
            .map(|c| (c.state, c.ack_timeout))
        {
            Some((ConnState::DreqSent, ack_timeout)) => {
                let wait = self.timewait(ack_timeout);
                if let Some(c) = self.conns.get_mut(&id) {
                    c.enter_timewait(now, wait, true);
                }
                self.events
                    .push_back(CmEvent::Disconnected { conn: ConnId(id) });
            }
            Some((ConnState::TimeWait, _)) => self.stats.duplicates += 1,
            _ => self.stats.unexpected += 1,
        }
    }

    fn on_sidr_req(
        &mut self,
        now: Instant,
        local_gid: Gid,
        remote_gid: Gid,
        tid: u64,
        m: sidr_req::Repr,
    ) {
        let key = RemoteKey::Sidr {
            gid: remote_gid,
            request_id: m.request_id,
        };
        if let Some(&id) = self.remotes.get(&key) {
            let linger = self.sidr_linger();
            match self.conns.get_mut(&id) {
                Some(c) if c.state == ConnState::TimeWait => {
                    // Our reply was lost: send it again and stay for the next resend.
                    c.deadline = Some(now + linger);
                    self.resend_last_reply(id);
                }
                _ => self.stats.duplicates += 1,
            }
            return;
        }
        let Some(listener) = self.listeners.get(&m.service_id).copied() else {
            self.stats.no_listener += 1;
            let mad = Self::emit(
                tid,
                Message::SidrRep(sidr_rep::Repr {
                    request_id: m.request_id,
                    status: SidrStatus::UNSUPPORTED,
                    info_length: 0,
                    qpn: 0,
                    service_id: m.service_id,
                    qkey: 0,
                    info: [0; sidr_rep::INFO_LEN],
                    private_data: [0; sidr_rep::PRIVATE_DATA_LEN],
                }),
            );
            self.send(local_gid, remote_gid, mad);
            return;
        };
        if listener.pending >= listener.backlog {
            self.stats.dropped_full += 1;
            return;
        }
        let Ok(id) = self.alloc_id() else {
            self.stats.dropped_full += 1;
            return;
        };
        if let Some(listener) = self.listeners.get_mut(&m.service_id) {
            listener.pending += 1;
        }
        let mut c = Connection::new(
            ConnState::SidrReqReceived,
            local_gid,
            remote_gid,
            m.service_id,
        );
        c.remote_key = Some(key);
        c.remote_comm_id = m.request_id;
        c.transaction_id = tid;
        c.pending_on_listener = true;
        self.conns.insert(id, c);
        self.remotes.insert(key, id);
        self.events.push_back(CmEvent::SidrRequest {
            conn: ConnId(id),
            service_id: m.service_id,
            remote_gid,
            private_data: m.private_data,
        });
    }

    fn on_sidr_rep(&mut self, m: sidr_rep::Repr) {
        let id = m.request_id;
        if self.conns.get(&id).map(|c| c.state) != Some(ConnState::SidrReqSent) {
            self.stats.unexpected += 1;
            return;
        }
        self.remove(id);
        let conn = ConnId(id);
        self.events.push_back(if m.status == SidrStatus::SUCCESS {
            CmEvent::SidrResolved {
                conn,
                qpn: m.qpn,
                qkey: m.qkey,
                private_data: m.private_data,
            }
        } else {
            CmEvent::SidrRejected {
                conn,
                status: m.status,
            }
        });
    }

    /// Resends what is unanswered, gives up what ran out of retries, ends time-waits.
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut due: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|deadline| deadline <= now))
            .map(|(&id, _)| id)
            .collect();
        due.sort_unstable();
        for id in due {
            self.expire(now, id);
        }
    }

    fn expire(&mut self, now: Instant, id: u32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.deadline = None;
        if c.state == ConnState::TimeWait {
            let report = c.report_timewait_exit;
            self.remove(id);
            if report {
                self.events
                    .push_back(CmEvent::TimewaitExit { conn: ConnId(id) });
            }
            return;
        }
        let Some(outstanding) = c.outstanding.as_mut() else {
            return;
        };
        if outstanding.retries_left > 0 {
            outstanding.retries_left -= 1;
            let mad = outstanding.mad;
            c.deadline = Some(now + outstanding.timeout);
            self.stats.retransmits += 1;
            self.send_on(id, mad);
            return;
        }
        let (state, ack_timeout) = (c.state, c.ack_timeout);
        match state {
            ConnState::DreqSent => {
                let wait = self.timewait(ack_timeout);
                if let Some(c) = self.conns.get_mut(&id) {
                    c.enter_timewait(now, wait, true);
                }
                self.events
                    .push_back(CmEvent::Disconnected { conn: ConnId(id) });
            }
            _ => {
                self.remove(id);
                self.events
                    .push_back(CmEvent::Unreachable { conn: ConnId(id) });
            }
        }
    }
}
