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
//! time (4.096 µs × 2^n, converted with [`time_to_ms`](roce_wire::cm::time_to_ms)), up to
//! `max_cm_retries` times, then the connection is [unreachable](CmEvent::Unreachable); a REP
//! every response time the REQ announced, as often as the REQ allows; a DREQ like a REQ. An MRA
//! stretches the wait to its service timeout. After a disconnect (or a reject) a connection
//! waits one local ACK timeout in time-wait, answering duplicates, before it is forgotten;
//! a REQ from a peer connection still known draws a REJ "stale connection".
//! A second difference: a REQ for a service nobody listens on waits
//! [`CmConfig::unlistened_hold`] for a listener before the REJ "invalid service ID", so a
//! program that closes one listener and opens the next on the same port does not lose
//! the REQ that came in between (perftest `-R`, whose client does not survive a REJ); and,
//! the same gap seen from the requester, a REQ such a peer rejects at once is sent again
//! for [`CmConfig::unlistened_retry`] before the REJ is reported.
//! One deliberate difference: the kernel drops a duplicate REQ its application has not
//! answered yet; this CM answers it with an MRA (service timeout 2^24, rdma_cm's
//! `CMA_CM_MRA_SETTING`), as the IBTA intends, so a slow acceptor does not use up the
//! requester's retries. Kernel requesters honour MRAs.
//! Memory is bounded: at most [`CmConfig::max_connections`] connections, and a listener holds
//! at most its backlog of unanswered requests (more are dropped; the peer resends). Each
//! connection has one deadline (resend or end of time-wait); [`Cm::poll_timeout`] takes the
//! earliest by a scan, cheap at the rate connections are made.
//!
//! This module is the coordinator: the public interface and the dispatch of received MADs.
//! The tables, timers and sending are in `common`; the protocol is in `active` (REQ out,
//! REP in, RTU out, MRA in), `passive` (REQ in, REP out, RTU in), `teardown` (DREQ/DREP,
//! REJ, destroy) and `sidr`, each working on `common`'s state and importing nothing from
//! this module; `attrs` derives the QP attributes.

mod active;
mod attrs;
mod common;
mod connection;
mod event;
mod ids;
mod params;
mod passive;
mod query;
mod sidr;
mod teardown;

use std::time::Instant;

use roce_wire::cm::{self, Message};
use roce_wire::mad;

use crate::qp_state::{QpAttr, QpState};

pub use active::UNLISTENED_RESEND;
pub use attrs::QpAttrs;
pub use connection::ConnState;
pub use event::{CmError, CmEvent, CmStats, ConnectRequest, MadTransmit};
pub use ids::{ConnId, Gid};
pub use params::{AcceptParams, CmConfig, ConnectParams, SidrReply};
pub use roce_wire::cm::ServiceId;

use common::{Common, Listener};

/// A communication manager for one port.
#[derive(Debug)]
pub struct Cm {
    common: Common,
}

impl Cm {
    /// A CM with no connections and no listeners.
    pub fn new(config: CmConfig) -> Cm {
        Cm {
            common: Common::new(config),
        }
    }

    /// Hands out only communication IDs (and SIDR request IDs) whose top byte is `block`,
    /// from now on: on a device several processes share, the messages that answer ours
    /// carry our ID as theirs, and its top byte names our process to the switch that
    /// steers them (as QP numbers do, see `Endpoint::set_id_block`).
    pub fn set_comm_id_block(&mut self, block: u8) {
        self.common.id_block = Some(block);
    }

    /// The counters.
    pub fn stats(&self) -> CmStats {
        self.common.stats
    }

    /// The state of a connection, while the CM knows it.
    pub fn state(&self, conn: ConnId) -> Option<ConnState> {
        self.common.conns.get(&conn.0).map(|c| c.state)
    }

    /// Number of connections held, time-wait included.
    pub fn connection_count(&self) -> usize {
        self.common.conns.len()
    }

    /// Accepts REQs and SIDR_REQs for `service_id`, holding at most `backlog` unanswered.
    /// REQs that came for it within [`CmConfig::unlistened_hold`] before are offered now.
    pub fn listen(&mut self, service_id: ServiceId, backlog: usize) -> Result<(), CmError> {
        if self.common.listeners.contains_key(&service_id) {
            return Err(CmError::AddressInUse);
        }
        self.common.listeners.insert(
            service_id,
            Listener {
                backlog,
                pending: 0,
            },
        );
        self.common.offer_held(service_id);
        Ok(())
    }

    /// Stops listening; later REQs for the service are rejected.
    pub fn stop_listening(&mut self, service_id: ServiceId) {
        self.common.listeners.remove(&service_id);
    }

    /// The earliest time [`handle_timeout`](Self::handle_timeout) has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let held = self.common.held.iter().map(|held| held.until);
        let conns = self.common.conns.values().filter_map(|c| c.deadline);
        conns.chain(held).min()
    }

    /// The next MAD to send.
    pub fn poll_transmit(&mut self) -> Option<MadTransmit> {
        self.common.transmits.pop_front()
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        let event = self.common.events.pop_front();
        if let Some(event) = &event {
            tracing::debug!(?event, "CM event");
        }
        event
    }

    /// Active side: sends a REQ. Events follow: [`CmEvent::ConnectResponse`],
    /// [`CmEvent::Rejected`] or [`CmEvent::Unreachable`].
    pub fn connect(
        &mut self,
        now: Instant,
        params: &ConnectParams,
        private: &[u8],
    ) -> Result<ConnId, CmError> {
        self.common.connect(now, params, private)
    }

    /// Active side: after [`CmEvent::ConnectResponse`] (and the QP moved to RTS), sends the
    /// RTU; [`CmEvent::Established`] follows.
    pub fn establish(&mut self, conn: ConnId) -> Result<(), CmError> {
        self.common.establish(conn)
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
        self.common.accept(now, conn, params, private)
    }

    /// The attributes that move a connection's QP to `state` (INIT, RTR or RTS) as far as
    /// the exchange has settled them (`rdma_init_qp_attr`): after the REP (active) or the
    /// accept (passive), those applied; on a request not yet accepted, those the accept
    /// will give if it grants what the REQ asked (the REP's PSN is drawn now), with our
    /// GID at `sgid_index`; while our REQ is out, INIT only.
    pub fn qp_attr(
        &mut self,
        conn: ConnId,
        state: QpState,
        sgid_index: u8,
    ) -> Result<QpAttr, CmError> {
        self.common.qp_attr(conn, state, sgid_index)
    }

    /// Passive side: refuses a [`CmEvent::ConnectRequest`] (`rdma_reject`): a REJ with reason
    /// "consumer defined" and `private` as its private data.
    pub fn reject(&mut self, now: Instant, conn: ConnId, private: &[u8]) -> Result<(), CmError> {
        self.common.reject(now, conn, private)
    }

    /// Passive side: the QP received its first packet before the RTU (the verbs
    /// `IBV_EVENT_COMM_EST`); the connection is established as if the RTU had come.
    pub fn notify_comm_established(&mut self, conn: ConnId) {
        self.common.notify_comm_established(conn);
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
        self.common
            .resolve_service(now, service_id, local_gid, remote_gid, private)
    }

    /// Passive UD side: answers a [`CmEvent::SidrRequest`].
    pub fn sidr_reply(
        &mut self,
        now: Instant,
        conn: ConnId,
        reply: &SidrReply,
        private: &[u8],
    ) -> Result<(), CmError> {
        self.common.sidr_reply(now, conn, reply, private)
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
        self.common.disconnect(now, conn, private)
    }

    /// Forgets a connection at once (`rdma_destroy_id`): an unanswered request is rejected,
    /// an established connection gets one DREQ.
    pub fn destroy(&mut self, conn: ConnId) {
        self.common.destroy(conn);
    }

    /// Takes a MAD QP1 received from `remote_gid` on our `local_gid`. What is not a CM
    /// message, or fits no connection, is dropped and counted in [`CmStats`].
    pub fn handle_mad(&mut self, now: Instant, local_gid: Gid, remote_gid: Gid, bytes: &[u8]) {
        let Ok(repr) = mad::Packet::new_checked(bytes).and_then(|p| cm::Repr::parse(&p)) else {
            self.common.stats.malformed += 1;
            return;
        };
        let tid = repr.transaction_id;
        let c = &mut self.common;
        match repr.message {
            Message::Req(m) => c.on_req(now, local_gid, remote_gid, tid, m),
            Message::Mra(m) => c.on_mra(now, m),
            Message::Rej(m) => c.on_rej(now, m),
            Message::Rep(m) => c.on_rep(m),
            Message::Rtu(m) => c.on_rtu(m),
            Message::Dreq(m) => c.on_dreq(now, local_gid, remote_gid, tid, m),
            Message::Drep(m) => c.on_drep(now, m),
            Message::SidrReq(m) => c.on_sidr_req(now, local_gid, remote_gid, tid, m),
            Message::SidrRep(m) => c.on_sidr_rep(m),
        }
    }

    /// Resends what is unanswered, gives up what ran out of retries, ends time-waits.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.common.expire_held(now);
        let mut due: Vec<u32> = self
            .common
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|deadline| deadline <= now))
            .map(|(&id, _)| id)
            .collect();
        due.sort_unstable();
        for id in due {
            self.common.expire(now, id);
        }
    }
}
