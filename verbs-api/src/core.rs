//! The locked core of a context: the engine with its endpoint, and the engine's side of
//! the rings it shares with posting and polling threads ([`queues`](crate::queues)).
//!
//! A round ([`Core::round`]) serves only what asks for it: the QPs whose doorbell rang
//! since the last round (their rings handed to the endpoint), the frames waiting, the
//! timers due, the packets ready; then it publishes the retired counts of the QPs with
//! requests outstanding and moves new completions to the CQs' rings. Nothing is done for a
//! QP or CQ that has nothing new.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::Arc;
use std::time::Instant;

use roce_provider::backend::Backend;
use roce_provider::engine::{Engine, EngineStats};
use roce_transport::cq::NotifyOn;
use roce_transport::endpoint::AsyncEvent;
use roce_transport::mr::{MrError, PdId};
use roce_transport::{AccessFlags, CqId, Endpoint};

use crate::async_events::AsyncEvents;
use crate::cm_routes::CmRoutes;
use crate::error::Error;
use crate::groups::Memberships;
use crate::iova::IovaSpace;
use crate::queues::{CqSlot, Doorbells, QpSlot};

/// Everything behind the one lock of a context.
pub(crate) struct Core {
    pub(crate) engine: Engine<Box<dyn Backend>>,
    /// The engine's side of each CQ's ring, with its channel.
    pub(crate) cqs: HashMap<CqId, CqSlot>,
    /// The engine's side of each QP's rings.
    pub(crate) qps: BTreeMap<u32, QpSlot>,
    /// The QPs with requests handed to the endpoint and not all retired: their retired
    /// counts are published after each round.
    outstanding: Vec<u32>,
    /// Where async events go: each context's queue, which a program reads without this lock.
    async_events: Arc<AsyncEvents>,
    /// Addresses for regions registered without one.
    iova: IovaSpace,
    /// Which CM id hears of each connection and listener.
    pub(crate) cm: CmRoutes,
    /// Multicast attachments and the interface's part in them.
    pub(crate) multicast: Memberships,
    /// The count of doorbells the last round took: while it stands, no QP rang.
    doorbells_seen: u64,
    /// The QPs that rang, taken from the doorbells (kept for its allocation).
    rung: Vec<u32>,
}

impl Core {
    pub(crate) fn new(engine: Engine<Box<dyn Backend>>, async_events: Arc<AsyncEvents>) -> Core {
        Core {
            engine,
            cqs: HashMap::new(),
            qps: BTreeMap::new(),
            outstanding: Vec::new(),
            async_events,
            iova: IovaSpace::default(),
            cm: CmRoutes::default(),
            multicast: Memberships::default(),
            doorbells_seen: 0,
            rung: Vec::new(),
        }
    }

    /// Registers `len` zeroed bytes in `pd` at `iova`, or at a fresh range when `None`;
    /// returns the address and the key. A failed registration takes no address.
    pub(crate) fn reg_mr(
        &mut self,
        pd: PdId,
        iova: Option<u64>,
        len: usize,
        access: AccessFlags,
    ) -> Result<(u64, u32), Error> {
        let (iova, placement) = match iova {
            Some(iova) => (iova, None),
            None => {
                // No room left below 2^64: as out of memory as the bytes themselves.
                let placement = self.iova.place(len).ok_or(MrError::OutOfMemory)?;
                (placement.iova, Some(placement))
            }
        };
        let key = self.endpoint().mrs().reg_mr(pd, iova, len, access)?;
        if let Some(placement) = placement {
            self.iova.advance(placement);
        }
        Ok((iova, key))
    }

    pub(crate) fn endpoint(&mut self) -> &mut Endpoint {
        self.engine.endpoint()
    }

    /// Moves the engine's news to where users wait for it: completions to the CQs' rings,
    /// CQ events to their channels, async events to the context (publishing the state of
    /// a QP one names: it went to ERR), CM events to their ids' channels.
    pub(crate) fn deliver(&mut self, now: Instant) {
        let endpoint = self.engine.endpoint();
        self.cm.deliver(endpoint, &self.qps, now);
        for (&id, slot) in &mut self.cqs {
            slot.deliver_with_event(id, endpoint);
        }
        for event in endpoint.take_events() {
            if let Some(slot) = event_qpn(&event).and_then(|qpn| self.qps.get(&qpn)) {
                slot.queues.publish_state(endpoint);
            }
            self.async_events.push(event);
        }
    }

    /// Arms CQ `id` for one event on its channel (`ibv_req_notify_cq`), having first moved
    /// what it holds to the ring its pollers read. A completion made outside a round (a
    /// flush by `modify`) before the arm is then found by the polls that follow it, as on
    /// an HCA; it would otherwise wait unseen, while the engine thread holds the lock, for
    /// a round that brings no event, and a program that sleeps on the channel would sleep
    /// for ever.
    pub(crate) fn arm_cq(&mut self, id: CqId, on: NotifyOn) {
        let endpoint = self.engine.endpoint();
        if let Some(slot) = self.cqs.get_mut(&id) {
            slot.deliver_with_event(id, endpoint);
        }
        endpoint.cq(id).request_notify(on);
    }

    /// One round of the engine: the rings of the QPs that rang (when the count of
    /// doorbells moved since the last round), every waiting frame, due timers, every
    /// packet ready, then what the round retired and completed published. Says whether
    /// work moved: requests handed over, frames in or out.
    pub(crate) fn round(&mut self, doorbells: &Doorbells) -> io::Result<bool> {
        let now = Instant::now();
        let rang = doorbells.count();
        let handed = rang != self.doorbells_seen && {
            self.doorbells_seen = rang;
            self.answer_doorbells(doorbells, now)
        };
        let frames = |stats: &EngineStats| stats.rx_frames + stats.tx_frames + stats.tx_full;
        let before = frames(&self.engine.stats);
        let result = self.engine.poll_at(now);
        self.publish_retired();
        self.deliver(now);
        result.map(|()| handed || frames(&self.engine.stats) != before)
    }

    /// The count of doorbells the last round answered.
    pub(crate) fn doorbells_seen(&self) -> u64 {
        self.doorbells_seen
    }

    /// Hands the rings of every QP that rang to the endpoint; whether there was anything.
    fn answer_doorbells(&mut self, doorbells: &Doorbells, now: Instant) -> bool {
        let mut rung = std::mem::take(&mut self.rung);
        doorbells.take_into(&mut rung);
        let mut handed = false;
        for &qpn in &rung {
            handed |= self.hand_over(qpn, now);
        }
        rung.clear();
        self.rung = rung;
        handed
    }

    /// Hands QP `qpn`'s rings to the endpoint (clearing its doorbell first, so a post that
    /// comes after this look rings again); whether there was anything.
    pub(crate) fn hand_over(&mut self, qpn: u32, now: Instant) -> bool {
        let endpoint = self.engine.endpoint();
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return false;
        };
        slot.queues.clear_doorbell();
        let handed = slot.hand_over(endpoint, now);
        if handed && !self.outstanding.contains(&qpn) {
            self.outstanding.push(qpn);
        }
        handed
    }

    /// Publishes QP `qpn`'s state and retired counts.
    pub(crate) fn publish(&mut self, qpn: u32) {
        let endpoint = self.engine.endpoint();
        if let Some(slot) = self.qps.get(&qpn) {
            slot.queues.publish_state(endpoint);
            slot.publish_retired(endpoint);
        }
    }

    /// Publishes the retired counts of the QPs with requests outstanding, forgetting those
    /// with none left.
    fn publish_retired(&mut self) {
        if self.outstanding.is_empty() {
            return;
        }
        let endpoint = self.engine.endpoint();
        let qps = &self.qps;
        self.outstanding.retain(|qpn| {
            qps.get(qpn)
                .is_some_and(|slot| slot.publish_retired(endpoint))
        });
    }

    /// Hands every QP's waiting requests to the endpoint, in order (before a change of a QP,
    /// so work posted before it reaches the QP first).
    pub(crate) fn submit(&mut self, now: Instant) {
        let qpns: Vec<u32> = self.qps.keys().copied().collect();
        for qpn in qpns {
            self.hand_over(qpn, now);
        }
        self.publish_retired();
    }

    /// Publishes every QP's state (after a change of one: `modify`, the CM).
    pub(crate) fn refresh_gates(&mut self) {
        let endpoint = self.engine.endpoint();
        for slot in self.qps.values() {
            slot.queues.publish_state(endpoint);
        }
    }
}

/// The QP an async event is about, if any.
fn event_qpn(event: &AsyncEvent) -> Option<u32> {
    match *event {
        AsyncEvent::CqOverflow { qpn, .. }
        | AsyncEvent::QpFatal { qpn, .. }
        | AsyncEvent::QpRequestError { qpn }
        | AsyncEvent::QpAccessError { qpn }
        | AsyncEvent::QpLastWqeReached { qpn } => Some(qpn),
        _ => None,
    }
}
