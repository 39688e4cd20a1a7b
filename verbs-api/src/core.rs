//! The locked core of a context: the engine with its endpoint, and the engine's side of
//! the queues it shares with posting and polling threads ([`queues`](crate::queues)).

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use roce_provider::backend::Backend;
use roce_provider::engine::{Engine, EngineStats};
use roce_transport::mr::{MrError, PdId};
use roce_transport::{AccessFlags, CqId, Endpoint};

use crate::async_events::AsyncEvents;
use crate::cm_routes::{refresh_gate, CmRoutes};
use crate::error::Error;
use crate::groups::Memberships;
use crate::iova::IovaSpace;
use crate::queues::{ChannelEvents, CqQueue, Pending, Submission};

/// Everything behind the one lock of a context.
pub(crate) struct Core {
    pub(crate) engine: Engine<Box<dyn Backend>>,
    /// The channel of each CQ that has one.
    pub(crate) channels: HashMap<CqId, Arc<ChannelEvents>>,
    /// The user-side queue of each CQ, which `poll` reads without this lock.
    pub(crate) cqs: HashMap<CqId, Arc<CqQueue>>,
    /// Each QP's submission queues, which posting fills without this lock.
    pub(crate) submissions: BTreeMap<u32, Arc<Submission>>,
    /// Where async events go: each context's queue, which a program reads without this lock.
    async_events: Arc<AsyncEvents>,
    /// Addresses for regions registered without one.
    iova: IovaSpace,
    /// Which CM id hears of each connection and listener.
    pub(crate) cm: CmRoutes,
    /// Multicast attachments and the interface's part in them.
    pub(crate) multicast: Memberships,
    /// The count of posts (`Shared::posted`) the last hand-over
    /// covered: while it stands, the submission queues hold nothing new.
    handed_over: u64,
}

impl Core {
    pub(crate) fn new(engine: Engine<Box<dyn Backend>>, async_events: Arc<AsyncEvents>) -> Core {
        Core {
            engine,
            channels: HashMap::new(),
            cqs: HashMap::new(),
            submissions: BTreeMap::new(),
            async_events,
            iova: IovaSpace::default(),
            cm: CmRoutes::default(),
            multicast: Memberships::default(),
            handed_over: 0,
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

    /// Moves the engine's news to where users wait for it: completions to the CQs' own
    /// queues, CQ events to their channels, async events to the context, CM events to
    /// their ids' channels.
    pub(crate) fn deliver(&mut self) {
        let endpoint = self.engine.endpoint();
        self.cm.deliver(endpoint, &self.submissions, Instant::now());
        let mut moved = Vec::new();
        for (&id, queue) in &self.cqs {
            let cq = self.engine.endpoint().cq(id);
            if cq.is_overflowed() {
                queue.overflowed.store(true, Ordering::Release);
            }
            if cq.is_empty() {
                queue.backlog.store(false, Ordering::Release);
                continue;
            }
            if let Ok(mut entries) = queue.entries.lock() {
                // What does not fit waits in the endpoint's CQ, which overflows when full;
                // pollers that empty their queue fetch it (see `Cq::poll_into`).
                let room = queue
                    .depth
                    .load(Ordering::Relaxed)
                    .saturating_sub(entries.len());
                moved.clear();
                cq.poll(room, &mut moved);
                entries.extend(moved.drain(..));
                queue.backlog.store(!cq.is_empty(), Ordering::Release);
            }
        }
        for (&cq, channel) in &self.channels {
            if self.engine.endpoint().cq(cq).take_event() {
                channel.push(cq);
            }
        }
        for event in self.engine.endpoint().take_events() {
            self.async_events.push(event);
        }
    }

    /// One round of the engine: admitted work in (when the count of posts, `posted`, moved
    /// since the last round), every waiting frame, due timers, every packet ready,
    /// completions out. Says whether work moved: posts handed over, frames in or out.
    pub(crate) fn drive(&mut self, posted: u64) -> io::Result<bool> {
        let handing_over = posted != self.handed_over;
        if handing_over {
            self.handed_over = posted;
            self.submit(Instant::now());
        }
        let frames = |stats: &EngineStats| stats.rx_frames + stats.tx_frames + stats.tx_full;
        let before = frames(&self.engine.stats);
        let result = self.engine.poll();
        self.refresh_gates();
        self.deliver();
        result.map(|()| handing_over || frames(&self.engine.stats) != before)
    }

    /// Hands every QP's admitted work to the endpoint, in order (they were checked against
    /// the gate when admitted), and refreshes the gates.
    pub(crate) fn submit(&mut self, now: Instant) {
        let endpoint = self.engine.endpoint();
        for (&qpn, queues) in &self.submissions {
            // Admitted against this QP's own gate, a request cannot be refused now; if it
            // were, there is no caller left to tell.
            hand_over(&queues.recvs, endpoint, qpn, |endpoint, wr| {
                let _ = endpoint.post_recv(now, qpn, &wr);
            });
            hand_over(&queues.sends, endpoint, qpn, |endpoint, wr| {
                let _ = endpoint.post_send(now, qpn, &wr);
            });
        }
    }

    /// Brings every QP's gate up to date (after the engine completed work or a QP changed).
    pub(crate) fn refresh_gates(&mut self) {
        let endpoint = self.engine.endpoint();
        for &qpn in self.submissions.keys() {
            refresh_gate(endpoint, &self.submissions, qpn);
        }
    }
}

/// Posts what waits in `queue` to QP `qpn`, in order, and renews the queue's gate under the
/// same lock (so admission never counts a request twice or not at all).
fn hand_over<T>(
    queue: &Mutex<Pending<T>>,
    endpoint: &mut Endpoint,
    qpn: u32,
    mut post: impl FnMut(&mut Endpoint, T),
) {
    if let Ok(mut pending) = queue.lock() {
        // Nothing queued: nothing to post, and the gate is renewed by `refresh_gates`,
        // which every caller runs after (this is every engine round, for every QP).
        if pending.items.is_empty() {
            return;
        }
        for wr in pending.items.drain(..) {
            post(endpoint, wr);
        }
        if let Some(gate) = endpoint.post_gate(qpn) {
            pending.gate = gate;
        }
    }
}
