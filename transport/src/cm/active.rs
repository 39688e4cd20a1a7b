//! The active side of a connection: REQ out, REP in, RTU out; MRA stretching the wait.

use std::time::{Duration, Instant};

use roce_wire::cm::rej::RejectReason;
use roce_wire::cm::{mra, path, rej, rep, req, rtu, Message, MessageKind};
use roce_wire::mad;

use super::attrs::{self, Negotiated};
use super::common::{private_data, Common};
use super::connection::{ConnState, Connection, RemoteKey};
use super::event::{CmError, CmEvent};
use super::ids::ConnId;
use super::params::ConnectParams;
use crate::qp_state::{AddressVector, PathMtu};

/// How long after a REJ "invalid service ID" a REQ is sent again, while
/// [`CmConfig::unlistened_retry`](super::CmConfig::unlistened_retry) lasts (perftest's own
/// pause between its connection attempts).
pub const UNLISTENED_RESEND: Duration = Duration::from_millis(100);

impl Common {
    pub(super) fn connect(
        &mut self,
        now: Instant,
        params: &ConnectParams,
        private: &[u8],
    ) -> Result<ConnId, CmError> {
        let private_data = private_data(private)?;
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
                subnet_local: params.hop_limit <= 1,
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
            ConnState::ReqSent,
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

    pub(super) fn establish(&mut self, conn: ConnId) -> Result<(), CmError> {
        let c = self.connection(conn)?;
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

    pub(super) fn on_rep(&mut self, m: rep::Repr) {
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
                let Some(path_mtu) = PathMtu::from_code(request.path_mtu.into()) else {
                    return;
                };
                let ack_timeout =
                    attrs::ack_timeout(m.target_ack_delay, our_ack_timeout.saturating_sub(1));
                let negotiated = Negotiated {
                    service_type: request.service_type,
                    path_mtu,
                    remote_qpn: m.local_qpn,
                    // As the kernel's cm_rep_handler: the requester sends from the REP's
                    // starting PSN and receives from its own REQ's (rping_rdmacm.pcap).
                    rq_psn: request.starting_psn,
                    sq_psn: m.starting_psn,
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
                    c.attrs = Some(negotiated.qp_attrs());
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

    /// A REJ "invalid service ID" of our REQ, within [`CmConfig::unlistened_retry`] of the
    /// first: the REQ goes again after [`UNLISTENED_RESEND`] (not counted as one of its
    /// retries) and the REJ is not reported. Whether it was taken so.
    ///
    /// [`CmConfig::unlistened_retry`]: super::CmConfig::unlistened_retry
    pub(super) fn retry_unlistened(&mut self, now: Instant, id: u32, m: &rej::Repr) -> bool {
        if m.reason != RejectReason::INVALID_SERVICE_ID || m.message_rejected != MessageKind::Req {
            return false;
        }
        let window = self.config.unlistened_retry;
        let Some(c) = self.conns.get_mut(&id) else {
            return false;
        };
        let first = *c.unlistened_since.get_or_insert(now);
        let left = window.saturating_sub(now.saturating_duration_since(first));
        let Some(outstanding) = c.outstanding.as_mut().filter(|_| !left.is_zero()) else {
            return false;
        };
        // The timer's resend takes one retry: this one gives it back.
        outstanding.retries_left = outstanding.retries_left.saturating_add(1);
        c.deadline = Some(now + UNLISTENED_RESEND.min(left));
        self.stats.unlistened_retries += 1;
        true
    }

    pub(super) fn on_mra(&mut self, now: Instant, m: mra::Repr) {
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
}
