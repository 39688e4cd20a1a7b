//! The passive side of a connection: REQ in (duplicates, stale peers, no listener), REP
//! out, RTU in.

use std::time::Instant;

use roce_wire::cm::rej::RejectReason;
use roce_wire::cm::req::ServiceType;
use roce_wire::cm::{self, mra, rej, rep, req, rtu, Message, MessageKind, ServiceId};
use roce_wire::mad;
use roce_wire::Psn;

use super::attrs::{Negotiated, QpAttrs};
use super::common::{private_data, Common, HeldReq, Listener, MAX_HELD};
use super::connection::{ConnState, Connection, RemoteKey};
use super::event::{CmError, CmEvent, ConnectRequest};
use super::ids::{ConnId, Gid};
use super::params::AcceptParams;
use crate::qp_state::{AddressVector, PathMtu};

/// Service timeout an MRA announces for a REQ the application has not answered yet
/// (rdma_cm's `CMA_CM_MRA_SETTING`: 4.096 µs × 2^24, about 69 s).
const MRA_SERVICE_TIMEOUT: u8 = 24;

/// What the passive side grants a request: its GID for the address vector, and the READ
/// and atomic depths (the accept's, or before it what the REQ asked, as the kernel's
/// `cm_req_handler` sets them).
pub(super) struct Grant {
    pub sgid_index: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
}

/// The attributes of a passive connection from its REQ.
pub(super) fn request_negotiated(
    c: &Connection,
    request: &req::Repr,
    rq_psn: Psn,
    grant: &Grant,
    max_path_mtu: PathMtu,
) -> Result<Negotiated, CmError> {
    let path_mtu = PathMtu::from_code(request.path_mtu.into())
        .ok_or(CmError::InvalidState(c.state))?
        .min(max_path_mtu);
    Ok(Negotiated {
        service_type: request.service_type,
        path_mtu,
        remote_qpn: request.local_qpn,
        // As the kernel CM: the responder sends from the REQ's starting PSN and
        // receives from its own REP's (rping_rdmacm.pcap).
        rq_psn,
        sq_psn: request.starting_psn,
        responder_resources: grant.responder_resources,
        initiator_depth: grant.initiator_depth,
        retry_count: request.retry_count,
        rnr_retry_count: request.rnr_retry_count,
        ack_timeout: request.primary_path.local_ack_timeout,
        av: AddressVector {
            dgid: c.remote_gid,
            sgid_index: grant.sgid_index,
            hop_limit: request.primary_path.hop_limit,
            traffic_class: request.primary_path.traffic_class,
            flow_label: request.primary_path.flow_label,
        },
    })
}

impl Common {
    pub(super) fn accept(
        &mut self,
        now: Instant,
        conn: ConnId,
        params: &AcceptParams,
        private: &[u8],
    ) -> Result<QpAttrs, CmError> {
        let private_data = private_data(private)?;
        let rq_psn = self.reserved_psn(conn)?;
        let config = self.config;
        let c = self.connection(conn)?;
        let request = match (c.state, c.req) {
            (ConnState::ReqReceived | ConnState::MraReqSent, Some(request)) => request,
            _ => return Err(CmError::InvalidState(c.state)),
        };
        let granted = Grant {
            sgid_index: params.sgid_index,
            responder_resources: params.responder_resources,
            initiator_depth: params.initiator_depth,
        };
        let negotiated = request_negotiated(c, &request, rq_psn, &granted, config.max_path_mtu)?;
        let reply = rep::Repr {
            local_comm_id: conn.0,
            remote_comm_id: c.remote_comm_id,
            local_qkey: 0,
            local_qpn: params.qpn & 0xFF_FFFF,
            starting_psn: rq_psn,
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
        let mad = Self::emit(c.transaction_id, Message::Rep(reply));
        // The kernel waits the response time the REQ announced, as often as it allows.
        c.send_reliably(
            now,
            mad,
            request.max_cm_retries,
            Self::ms(request.local_cm_response_timeout),
        );
        c.state = ConnState::RepSent;
        let attrs = negotiated.qp_attrs();
        c.attrs = Some(attrs);
        self.release_listener_slot(conn.0);
        self.send_on(conn.0, mad);
        Ok(attrs)
    }

    /// The PSN a passive connection's REP carries (its QP receives from it): drawn once,
    /// when the attributes are first asked for or at the accept.
    pub(super) fn reserved_psn(&mut self, conn: ConnId) -> Result<Psn, CmError> {
        if let Some(psn) = self.connection(conn)?.reserved_psn {
            return Ok(psn);
        }
        let psn = self.random_psn();
        self.connection(conn)?.reserved_psn = Some(psn);
        Ok(psn)
    }

    pub(super) fn reject(
        &mut self,
        now: Instant,
        conn: ConnId,
        private: &[u8],
    ) -> Result<(), CmError> {
        let private_data = private_data(private)?;
        let wait = self.timewait(0);
        let c = self.connection(conn)?;
        if !matches!(c.state, ConnState::ReqReceived | ConnState::MraReqSent) {
            return Err(CmError::InvalidState(c.state));
        }
        let mad = Self::emit(
            c.transaction_id,
            Self::rej_for(conn.0, c, RejectReason::CONSUMER_DEFINED, private_data),
        );
        c.last_reply = Some(mad);
        // Duplicates of the REQ get the same REJ until the wait ends.
        c.enter_timewait(now, wait, false);
        self.release_listener_slot(conn.0);
        self.send_on(conn.0, mad);
        Ok(())
    }

    pub(super) fn notify_comm_established(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.get_mut(&conn.0) {
            if c.state == ConnState::RepSent {
                c.answered();
                c.state = ConnState::Established;
                self.events.push_back(CmEvent::Established { conn });
            }
        }
    }

    pub(super) fn reject_req(
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

    pub(super) fn on_req(
        &mut self,
        now: Instant,
        local_gid: Gid,
        remote_gid: Gid,
        tid: u64,
        request: req::Repr,
    ) {
        let key = RemoteKey::Conn {
            ca_guid: request.local_ca_guid,
            comm_id: request.local_comm_id,
        };
        if let Some(&id) = self.remotes.get(&key) {
            self.on_duplicate_req(id, local_gid, remote_gid, tid, &request);
            return;
        }
        if self.held.iter().any(|held| held.key == key) {
            self.stats.duplicates += 1;
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
        let held = HeldReq {
            key,
            local_gid,
            remote_gid,
            tid,
            request,
            until: now + self.config.unlistened_hold,
        };
        match self.listeners.get(&request.service_id).copied() {
            Some(listener) => self.offer(listener, held),
            None if self.held.len() < MAX_HELD && !self.config.unlistened_hold.is_zero() => {
                self.held.push(held);
            }
            None => self.reject_unlistened(&held),
        }
    }

    /// Offers the REQs held for `service_id` to its new listener.
    pub(super) fn offer_held(&mut self, service_id: ServiceId) {
        let (waiting, others) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|held| held.request.service_id == service_id);
        self.held = others;
        for held in waiting {
            if let Some(listener) = self.listeners.get(&service_id).copied() {
                self.offer(listener, held);
            }
        }
    }

    /// Rejects the held REQs whose wait for a listener is over.
    pub(super) fn expire_held(&mut self, now: Instant) {
        let (expired, waiting): (Vec<HeldReq>, Vec<HeldReq>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|held| held.until <= now);
        self.held = waiting;
        for held in &expired {
            self.reject_unlistened(held);
        }
    }

    fn reject_unlistened(&mut self, held: &HeldReq) {
        self.stats.no_listener += 1;
        self.reject_req(
            held.local_gid,
            held.remote_gid,
            held.tid,
            &held.request,
            RejectReason::INVALID_SERVICE_ID,
        );
    }

    /// Hands a REQ to `listener`'s application, or rejects what it cannot serve.
    fn offer(&mut self, listener: Listener, held: HeldReq) {
        let HeldReq {
            key,
            local_gid,
            remote_gid,
            tid,
            request,
            ..
        } = held;
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
        if PathMtu::from_code(request.path_mtu.into()).is_none() {
            self.reject_req(
                local_gid,
                remote_gid,
                tid,
                &request,
                RejectReason::INVALID_MTU,
            );
            return;
        }
        let mut c = Connection::new(
            ConnState::ReqReceived,
            local_gid,
            remote_gid,
            request.service_id,
        );
        c.remote_qpn = request.local_qpn;
        c.req = Some(request);
        c.ack_timeout = request.primary_path.local_ack_timeout;
        let Some(id) = self.admit(listener, c, key, request.local_comm_id, tid) else {
            return;
        };
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

    /// Admits a request for a listener's application as `c`, counted against the listener's
    /// backlog and found again by `key` when the peer resends. Drops it, counted, when the
    /// backlog or the connection table is full.
    pub(super) fn admit(
        &mut self,
        listener: Listener,
        mut c: Connection,
        key: RemoteKey,
        remote_comm_id: u32,
        tid: u64,
    ) -> Option<u32> {
        if listener.pending >= listener.backlog {
            self.stats.dropped_full += 1;
            return None;
        }
        let Ok(id) = self.alloc_id() else {
            self.stats.dropped_full += 1;
            return None;
        };
        if let Some(listener) = self.listeners.get_mut(&c.service_id) {
            listener.pending += 1;
        }
        c.remote_key = Some(key);
        c.remote_comm_id = remote_comm_id;
        c.transaction_id = tid;
        c.pending_on_listener = true;
        self.conns.insert(id, c);
        self.remotes.insert(key, id);
        Some(id)
    }

    pub(super) fn on_duplicate_req(
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

    pub(super) fn on_rtu(&mut self, m: rtu::Repr) {
        let id = m.remote_comm_id;
        match self.matching(id, m.local_comm_id).map(|c| c.state) {
            Some(ConnState::RepSent) => self.notify_comm_established(ConnId(id)),
            Some(ConnState::Established) => self.stats.duplicates += 1,
            _ => self.stats.unexpected += 1,
        }
    }
}
