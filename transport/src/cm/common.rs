//! What every part of the CM shares: the connection and listener tables, the randomness
//! for IDs and PSNs, the outgoing MADs and events, the counters, and the timers. The roles
//! (`active`, `passive`, `sidr`, `teardown`) and the coordinator (`Cm`) import this module;
//! it imports none of them.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rand_chacha::ChaCha12Rng;
use rand_core::{Rng, SeedableRng};
use roce_wire::cm::{self, req, time_to_ms, Message, ServiceId};
use roce_wire::{mad, Psn};
use rustc_hash::FxHashMap;

use super::connection::{ConnState, Connection, RemoteKey};
use super::event::{CmError, CmEvent, CmStats, MadTransmit};
use super::ids::{ConnId, Gid};
use super::params::CmConfig;

/// The caller's private data as a message's private data field of length `N`.
pub(super) fn private_data<const N: usize>(private: &[u8]) -> Result<[u8; N], CmError> {
    cm::private_data(private).map_err(|_| CmError::PrivateDataTooLong)
}

/// REQs held at once for services nobody listens on yet; more are rejected at once.
pub(super) const MAX_HELD: usize = 64;

/// A REQ for a service nobody listens on, waiting [`CmConfig::unlistened_hold`] for a
/// listener.
#[derive(Debug, Clone)]
pub(super) struct HeldReq {
    pub key: RemoteKey,
    pub local_gid: Gid,
    pub remote_gid: Gid,
    pub tid: u64,
    pub request: req::Repr,
    pub until: Instant,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Listener {
    pub backlog: usize,
    pub pending: usize,
}

/// The state of one port's CM, which the roles work on and `Cm` coordinates.
#[derive(Debug)]
pub(super) struct Common {
    pub config: CmConfig,
    rng: ChaCha12Rng,
    /// XORed into a counter to form communication IDs, as the kernel randomises its IDs.
    id_operand: u32,
    next_id: u32,
    /// The top byte every ID we hand out carries, when the device is shared
    /// ([`Cm::set_comm_id_block`](super::Cm::set_comm_id_block)).
    pub id_block: Option<u8>,
    /// High half of the transaction IDs we start.
    tid_high: u32,
    pub conns: FxHashMap<u32, Connection>,
    pub remotes: FxHashMap<RemoteKey, u32>,
    pub listeners: FxHashMap<ServiceId, Listener>,
    pub held: Vec<HeldReq>,
    pub transmits: VecDeque<MadTransmit>,
    pub events: VecDeque<CmEvent>,
    pub stats: CmStats,
}

impl Common {
    pub(super) fn new(config: CmConfig) -> Common {
        let mut rng = ChaCha12Rng::from_seed(config.seed);
        Common {
            id_operand: rng.next_u32(),
            tid_high: rng.next_u32(),
            rng,
            config,
            next_id: 0,
            id_block: None,
            conns: FxHashMap::default(),
            remotes: FxHashMap::default(),
            listeners: FxHashMap::default(),
            held: Vec::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            stats: CmStats::default(),
        }
    }

    /// The connection a caller names, or why it cannot be used.
    pub(super) fn connection(&mut self, conn: ConnId) -> Result<&mut Connection, CmError> {
        self.conns
            .get_mut(&conn.0)
            .ok_or(CmError::UnknownConnection)
    }

    pub(super) fn alloc_id(&mut self) -> Result<u32, CmError> {
        if self.conns.len() >= self.config.max_connections {
            return Err(CmError::TooManyConnections);
        }
        // At most `max_connections` IDs are taken, so this finds a free one quickly.
        loop {
            self.next_id = self.next_id.wrapping_add(1);
            let id = match self.id_block {
                Some(block) => {
                    (u32::from(block) << 24) | ((self.next_id ^ self.id_operand) & 0xFF_FFFF)
                }
                None => self.next_id ^ self.id_operand,
            };
            if id != 0 && !self.conns.contains_key(&id) {
                return Ok(id);
            }
        }
    }

    pub(super) fn new_tid(&self, local_id: u32) -> u64 {
        (u64::from(self.tid_high) << 32) | u64::from(local_id)
    }

    pub(super) fn random_psn(&mut self) -> Psn {
        Psn::new(self.rng.next_u32())
    }

    pub(super) fn ms(exponent: u8) -> Duration {
        Duration::from_millis(time_to_ms(exponent))
    }

    pub(super) fn emit(transaction_id: u64, message: Message) -> [u8; mad::MAD_LEN] {
        let mut bytes = [0; mad::MAD_LEN];
        cm::Repr {
            transaction_id,
            message,
        }
        .emit(&mut mad::Packet::new_unchecked(&mut bytes[..]));
        bytes
    }

    pub(super) fn send(&mut self, local_gid: Gid, remote_gid: Gid, mad: [u8; mad::MAD_LEN]) {
        self.transmits.push_back(MadTransmit {
            local_gid,
            remote_gid,
            mad,
        });
    }

    pub(super) fn send_on(&mut self, id: u32, mad: [u8; mad::MAD_LEN]) {
        if let Some(conn) = self.conns.get(&id) {
            let (local, remote) = (conn.local_gid, conn.remote_gid);
            self.send(local, remote, mad);
        }
    }

    pub(super) fn remove(&mut self, id: u32) {
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
    pub(super) fn release_listener_slot(&mut self, id: u32) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if std::mem::take(&mut conn.pending_on_listener) {
            if let Some(listener) = self.listeners.get_mut(&conn.service_id) {
                listener.pending = listener.pending.saturating_sub(1);
            }
        }
    }

    pub(super) fn timewait(&self, ack_timeout: u8) -> Duration {
        Self::ms(ack_timeout.max(self.config.packet_life_time + 1))
    }

    /// The connection a message addressed to `our_id` from `their_id` belongs to.
    pub(super) fn matching(&self, our_id: u32, their_id: u32) -> Option<&Connection> {
        let c = self.conns.get(&our_id)?;
        (c.remote_comm_id == 0 || c.remote_comm_id == their_id).then_some(c)
    }

    pub(super) fn resend_last_reply(&mut self, id: u32) {
        if let Some(mad) = self.conns.get(&id).and_then(|c| c.last_reply) {
            self.stats.duplicates += 1;
            self.send_on(id, mad);
        }
    }

    pub(super) fn expire(&mut self, now: Instant, id: u32) {
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
