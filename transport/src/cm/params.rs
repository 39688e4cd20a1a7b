//! What the caller gives the CM: its settings and the parameters of each call.

use std::time::Duration;

use roce_wire::cm::req::ServiceType;
use roce_wire::cm::sidr_rep::SidrStatus;

use roce_wire::cm::ServiceId;

use super::ids::Gid;
use crate::qp_state::PathMtu;

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
    /// How long a REQ for a service nobody listens on waits for a listener before it is
    /// rejected (the kernel rejects at once). Programs that close one listener and open
    /// the next on the same port (perftest `-R` after its key exchange) otherwise lose the
    /// peer's REQ that arrives in between. Zero rejects at once.
    pub unlistened_hold: Duration,
    /// How long after a peer first rejected our REQ with "invalid service ID" (nobody
    /// listens) the REQ is still sent again, every [`UNLISTENED_RESEND`](super::UNLISTENED_RESEND),
    /// before the REJ is reported: the mirror of `unlistened_hold` for a peer that rejects at
    /// once, as the kernel's CM does. perftest `-R`'s client connects a second time right
    /// after its key exchange, while the server is still opening its second listener, and
    /// does not survive that REJ (perftest 4.5-0.17 retries on freed ids and crashes).
    /// Zero reports the first REJ, as the kernel.
    pub unlistened_retry: Duration,
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
            unlistened_hold: Duration::from_millis(500),
            unlistened_retry: Duration::from_secs(2),
        }
    }
}

/// What [`Cm::connect`](super::Cm::connect) needs: the path, the QP and rdma_cm's `struct rdma_conn_param`.
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

/// What [`Cm::accept`](super::Cm::accept) needs (rdma_cm's `struct rdma_conn_param` on the passive side).
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

/// The answer [`Cm::sidr_reply`](super::Cm::sidr_reply) sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrReply {
    /// [`SidrStatus::SUCCESS`] or why not.
    pub status: SidrStatus,
    /// The UD QP serving the request.
    pub qpn: u32,
    /// Its Q_Key.
    pub qkey: u32,
}
