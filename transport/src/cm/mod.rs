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
//! announced, as often as the REQ allows; a DREQ like a REQ. An MRA
//! stretches the wait to its service timeout. After a disconnect (or a reject) a connection
//! waits one local ACK timeout in time-wait, answering duplicates, before it is forgotten;
//! a REQ from a peer connection still known draws a REJ "stale connection".
//! One deliberate difference: the kernel drops a duplicate REQ its application has not
//! answered yet; this CM answers it with an MRA (service timeout 2^24, rdma_cm's
//! `CMA_CM_MRA_SETTING`), as the IBTA intends, so a slow acceptor does not use up the
//! requester's retries. Kernel requesters honour MRAs.
//! Memory is bounded: at most [`CmConfig::max_connections`] connections, and a listener holds
//! at most its backlog of unanswered requests (more are dropped; the peer resends). Each
//! connection has one deadline (resend or end of time-wait); [`Cm::poll_timeout`] takes the
//! earliest by a scan, cheap at the rate connections are made.
//!
//! This module keeps the tables, the dispatch and the timers; the protocol is in `active`
//! (REQ out, REP in, RTU out, MRA in), `passive` (REQ in, REP out, RTU in), `teardown`
//! (DREQ/DREP, REJ, destroy) and `sidr`; `attrs` derives the QP attributes.

mod active;
mod attrs;
mod connection;
mod event;
mod ids;
mod params;
mod passive;
mod sidr;
mod teardown;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rand_chacha::ChaCha12Rng;
use rand_core::{Rng, SeedableRng};
use roce_wire::cm::{self, time_to_ms, Message};
use roce_wire::{mad, Psn};
use rustc_hash::FxHashMap;

pub use attrs::QpAttrs;
pub use connection::ConnState;
pub use event::{CmError, CmEvent, CmStats, ConnectRequest, MadTransmit};
pub use ids::{ConnId, Gid};
pub use params::{AcceptParams, CmConfig, ConnectParams, SidrReply};
pub use roce_wire::cm::ServiceId;

use connection::{Connection, RemoteKey};

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
        let event = self.events.pop_front();
        if let Some(event) = &event {
            tracing::debug!(?event, "CM event");
        }
        event
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
        self.release_listener_slot(id);
        if let Some(conn) = self.conns.remove(&id) {
            if let Some(key) = conn.remote_key {
                if self.remotes.get(&key) == Some(&id) {
                    self.remotes.remove(&key);
                }
            }
        }
    }

    /// The application answered a request (or it is gone): it no longer counts against its
    /// listener's backlog.
    fn release_listener_slot(&mut self, id: u32) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if std::mem::take(&mut conn.pending_on_listener) {
            if let Some(listener) = self.listeners.get_mut(&conn.service_id) {
                listener.pending = listener.pending.saturating_sub(1);
            }
        }
    }

    fn timewait(&self, ack_timeout: u8) -> Duration {
        Self::ms(ack_timeout.max(self.config.packet_life_time + 1))
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

    fn resend_last_reply(&mut self, id: u32) {
        if let Some(mad) = self.conns.get(&id).and_then(|c| c.last_reply) {
            self.stats.duplicates += 1;
            self.send_on(id, mad);
        }
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
