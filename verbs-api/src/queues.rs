//! What the engine shares with posting and polling threads outside the device lock: each
//! QP's send and receive rings with their doorbell and what the engine publishes of the QP,
//! each CQ's ring of completions, each channel's events and the context's async events. The
//! engine's side (`QpSlot`, `CqSlot`) is used under the device lock (see `core`); the
//! objects' side takes only its own small locks, never the device's.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use roce_transport::cq::{Cq, WorkCompletion};
use roce_transport::qp::{PostError, PostGate, QpCaps};
use roce_transport::qp_state::{QpState, QpType};
use roce_transport::wr::{RecvWr, SendWr};
use roce_transport::{CqId, Endpoint};
use rustix::event::{eventfd, EventfdFlags};

use crate::ring::{ring, Consumer, Producer};

/// Events waiting to be taken, and an eventfd readable while any wait: a completion
/// channel's (the CQs that signalled) and a context's async events.
pub(crate) struct EventQueue<T> {
    fd: OwnedFd,
    /// Oldest first.
    events: Mutex<VecDeque<T>>,
}

/// A completion channel's events: the CQs that signalled.
pub(crate) type ChannelEvents = EventQueue<CqId>;

impl<T> EventQueue<T> {
    pub(crate) fn new() -> io::Result<EventQueue<T>> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(EventQueue::with_fd(fd))
    }

    /// A queue that signals `fd`, an eventfd (blocking or not: it is read only when its
    /// counter is known to be non-zero).
    pub(crate) fn with_fd(fd: OwnedFd) -> EventQueue<T> {
        EventQueue {
            fd,
            events: Mutex::new(VecDeque::new()),
        }
    }

    pub(crate) fn push(&self, event: T) {
        if let Ok(mut events) = self.events.lock() {
            events.push_back(event);
            // Under the lock: a `pop` between the two would leave the fd readable with no
            // event. A saturated counter still reads as readable.
            let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
        }
    }

    pub(crate) fn pop(&self) -> Option<T> {
        let mut events = self.events.lock().ok()?;
        let event = events.pop_front()?;
        if events.is_empty() {
            // Drain the counter so the fd polls readable only while events wait. It is
            // non-zero (every push wrote it), so the read never blocks.
            let mut counter = [0u8; 8];
            let _ = rustix::io::read(&self.fd, &mut counter);
        }
        Some(event)
    }
}

impl<T> AsFd for EventQueue<T> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A CQ as pollers see it: the ring the engine fills after its rounds (single producer,
/// under the device lock) and pollers drain (single consumer, one poller at a time under
/// `polling`'s own lock, never the device's; taken after the device's lock when both are
/// held, so a poller releases it before it runs a round).
pub(crate) struct CqQueue {
    pub(crate) polling: Mutex<Polling>,
    pub(crate) overflowed: AtomicBool,
    /// Completions still wait in the engine's CQ (the ring was full).
    pub(crate) backlog: AtomicBool,
}

/// The pollers' side of a CQ's ring, and the completions set aside from it when some had
/// to be taken out of order (a QP reset forgets its own): those come first.
pub(crate) struct Polling {
    ring: Consumer<WorkCompletion>,
    set_aside: VecDeque<WorkCompletion>,
}

impl Polling {
    /// Hands up to `max` completions, oldest first, to `take`; how many.
    pub(crate) fn take(&mut self, max: usize, take: &mut impl FnMut(&WorkCompletion)) -> usize {
        let mut count = 0;
        while count < max {
            let Some(completion) = self.set_aside.pop_front().or_else(|| self.ring.pop()) else {
                break;
            };
            take(&completion);
            count += 1;
        }
        count
    }

    /// Completions waiting to be polled here.
    pub(crate) fn len(&self) -> usize {
        self.set_aside.len() + self.ring.len()
    }

    /// Forgets the waiting completions of QP `qpn`, keeping the others' order.
    pub(crate) fn discard_qp(&mut self, qpn: u32) {
        while let Some(completion) = self.ring.pop() {
            self.set_aside.push_back(completion);
        }
        self.set_aside.retain(|completion| completion.qp_num != qpn);
    }
}

/// The engine's side of a CQ: where it moves the transport's completions to.
pub(crate) struct CqSlot {
    pub(crate) producer: Producer<WorkCompletion>,
    pub(crate) queue: Arc<CqQueue>,
    /// Its completion channel, if it has one.
    pub(crate) channel: Option<Arc<ChannelEvents>>,
}

/// A CQ of `depth` entries: the pollers' side and the engine's.
pub(crate) fn cq_queue(depth: usize, channel: Option<Arc<ChannelEvents>>) -> CqSlot {
    let (producer, ring) = ring(depth);
    CqSlot {
        producer,
        queue: Arc::new(CqQueue {
            polling: Mutex::new(Polling {
                ring,
                set_aside: VecDeque::new(),
            }),
            overflowed: AtomicBool::new(false),
            backlog: AtomicBool::new(false),
        }),
        channel,
    }
}

impl CqSlot {
    /// [`deliver`](Self::deliver) from CQ `id` of `endpoint`, and its event, if one is due,
    /// to its channel.
    pub(crate) fn deliver_with_event(&mut self, id: CqId, endpoint: &mut Endpoint) {
        let cq = endpoint.cq(id);
        self.deliver(cq);
        if let Some(channel) = &self.channel {
            if cq.take_event() {
                channel.push(id);
            }
        }
    }

    /// Moves what waits in the endpoint's CQ `cq` into the ring, as much as fits, and says
    /// whether it moved any.
    pub(crate) fn deliver(&mut self, cq: &mut Cq) -> bool {
        if cq.is_overflowed() && !self.queue.overflowed.load(Ordering::Relaxed) {
            self.queue.overflowed.store(true, Ordering::Release);
        }
        if cq.is_empty() {
            if self.queue.backlog.load(Ordering::Relaxed) {
                self.queue.backlog.store(false, Ordering::Release);
            }
            return false;
        }
        let producer = &mut self.producer;
        let moved = cq.poll_with(usize::MAX, |completion| producer.push(*completion).is_ok());
        // What does not fit waits in the endpoint's CQ, which overflows when full; pollers
        // that empty the ring fetch it (see `Cq::poll_with`).
        let backlog = !cq.is_empty();
        if self.queue.backlog.load(Ordering::Relaxed) != backlog {
            self.queue.backlog.store(backlog, Ordering::Release);
        }
        moved > 0
    }
}

/// A QP's queues as the posting side sees them: each queue a ring that posts write and the
/// engine drains, the doorbell a post rings, and what the engine publishes of the QP for
/// posts to be checked against without its lock (its state when it changes, how many
/// requests it retired after each round that moved some).
pub(crate) struct QpQueues {
    pub(crate) qpn: u32,
    pub(crate) sends: Mutex<Posting<SendWr>>,
    pub(crate) recvs: Mutex<Posting<RecvWr>>,
    /// Set by the post that finds it clear, cleared by the engine as it takes the QP's
    /// requests: one doorbell per QP per round, however many posts.
    pub(crate) rung: AtomicBool,
    qp_type: QpType,
    caps: QpCaps,
    has_srq: bool,
    /// Published when they change (`modify`, the CM, the engine's move to ERR).
    state: AtomicU8,
    mtu: AtomicUsize,
    /// Requests of each queue retired (completed, flushed, or consumed by a message), as
    /// of the engine's last round that moved any.
    sends_retired: AtomicU64,
    recvs_retired: AtomicU64,
}

/// One queue's posting side: its ring and how many requests went in, ever.
pub(crate) struct Posting<T> {
    producer: Producer<T>,
    posted: u64,
}

/// The engine's side of a QP's queues: the rings' consumers and how many requests it handed
/// to the endpoint, ever.
pub(crate) struct QpSlot {
    pub(crate) queues: Arc<QpQueues>,
    sends: Consumer<SendWr>,
    recvs: Consumer<RecvWr>,
    sends_handed: u64,
    recvs_handed: u64,
}

/// `QpState` as the number `QpQueues::state` holds.
const STATES: [QpState; 7] = [
    QpState::Reset,
    QpState::Init,
    QpState::Rtr,
    QpState::Rts,
    QpState::Sqd,
    QpState::Sqe,
    QpState::Err,
];

fn state_number(state: QpState) -> u8 {
    STATES.iter().position(|&s| s == state).unwrap_or(0) as u8
}

/// A QP's queues as its gate (the transport's posting rules as of now) describes them: the
/// posting side and the engine's.
pub(crate) fn qp_queues(qpn: u32, gate: PostGate) -> (Arc<QpQueues>, QpSlot) {
    let (send_producer, send_consumer) = ring(gate.caps.max_send_wr as usize);
    let (recv_producer, recv_consumer) = ring(gate.caps.max_recv_wr as usize);
    let queues = Arc::new(QpQueues {
        qpn,
        sends: Mutex::new(Posting {
            producer: send_producer,
            posted: 0,
        }),
        recvs: Mutex::new(Posting {
            producer: recv_producer,
            posted: 0,
        }),
        rung: AtomicBool::new(false),
        qp_type: gate.qp_type,
        caps: gate.caps,
        has_srq: gate.has_srq,
        state: AtomicU8::new(state_number(gate.state)),
        mtu: AtomicUsize::new(gate.mtu),
        sends_retired: AtomicU64::new(0),
        recvs_retired: AtomicU64::new(0),
    });
    let slot = QpSlot {
        queues: Arc::clone(&queues),
        sends: send_consumer,
        recvs: recv_consumer,
        sends_handed: 0,
        recvs_handed: 0,
    };
    (queues, slot)
}

impl QpQueues {
    /// The gate a post is checked against: the published state and MTU, and every request
    /// posted and not known to be retired counted as in the queue.
    fn gate(&self, sends_posted: u64, recvs_posted: u64) -> PostGate {
        let outstanding = |posted: u64, retired: &AtomicU64| {
            posted.saturating_sub(retired.load(Ordering::Acquire)) as usize
        };
        PostGate {
            qp_type: self.qp_type,
            caps: self.caps,
            state: STATES[usize::from(self.state.load(Ordering::Acquire)) % STATES.len()],
            mtu: self.mtu.load(Ordering::Acquire),
            sq_len: outstanding(sends_posted, &self.sends_retired),
            rq_len: outstanding(recvs_posted, &self.recvs_retired),
            has_srq: self.has_srq,
        }
    }

    /// Requests of the send queue (`send`) or the receive queue retired, as last published.
    pub(crate) fn retired(&self, send: bool) -> u64 {
        let retired = if send {
            &self.sends_retired
        } else {
            &self.recvs_retired
        };
        retired.load(Ordering::Acquire)
    }

    /// Publishes the QP's state and MTU as the endpoint has them now.
    pub(crate) fn publish_state(&self, endpoint: &Endpoint) {
        if let Some(gate) = endpoint.post_gate(self.qpn) {
            self.state
                .store(state_number(gate.state), Ordering::Release);
            self.mtu.store(gate.mtu, Ordering::Release);
        }
    }
}

impl QpQueues {
    /// Clears the doorbell, before the engine looks at the rings.
    pub(crate) fn clear_doorbell(&self) {
        // SeqCst, against `Doorbells::ring`'s swap: either the engine's look at the rings
        // comes after the post's write, or the post finds the doorbell clear and rings.
        self.rung.swap(false, Ordering::SeqCst);
    }
}

/// The QPs whose doorbell rang since the engine last looked, and how many times anything
/// rang, ever: the engine thread looks again, rather than sleep, when that count moved.
#[derive(Default)]
pub(crate) struct Doorbells {
    rung: Mutex<Vec<u32>>,
    count: AtomicU64,
}

impl Doorbells {
    /// Rings the doorbell of `queues` (after a post wrote its rings) unless it is rung
    /// already; whether this rang it.
    pub(crate) fn ring(&self, queues: &QpQueues) -> bool {
        if queues.rung.swap(true, Ordering::SeqCst) {
            return false;
        }
        if let Ok(mut rung) = self.rung.lock() {
            rung.push(queues.qpn);
        }
        self.count.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// Makes the engine thread look again without a QP (stopping, work done under the lock
    /// for it to finish).
    pub(crate) fn bump(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    /// How many times anything rang, ever.
    pub(crate) fn count(&self) -> u64 {
        // SeqCst, against the engine thread's store of `sleeping` before it reads this:
        // either it sees the new count, or the poster sees it sleeping.
        self.count.load(Ordering::SeqCst)
    }

    /// Moves the QPs that rang into `out`.
    pub(crate) fn take_into(&self, out: &mut Vec<u32>) {
        if let Ok(mut rung) = self.rung.lock() {
            out.append(&mut rung);
        }
    }
}

/// What a post checks a request against, per queue.
pub(crate) trait WorkRequest: Sized {
    /// Whether it is a send queue's.
    const SEND: bool;
    /// The transport's rule for posting it.
    fn check(gate: &PostGate, wr: &Self) -> Result<(), PostError>;
}

impl WorkRequest for SendWr {
    const SEND: bool = true;
    fn check(gate: &PostGate, wr: &Self) -> Result<(), PostError> {
        gate.check_send(wr, 0).map(drop)
    }
}

impl WorkRequest for RecvWr {
    const SEND: bool = false;
    fn check(gate: &PostGate, wr: &Self) -> Result<(), PostError> {
        gate.check_recv(wr, 0)
    }
}

impl<T: WorkRequest> Posting<T> {
    /// Checks `wr` against the QP's gate, every request posted and not known to be
    /// retired counted as in the queue.
    pub(crate) fn check(&self, queues: &QpQueues, wr: &T) -> Result<(), PostError> {
        let gate = if T::SEND {
            queues.gate(self.posted, 0)
        } else {
            queues.gate(0, self.posted)
        };
        T::check(&gate, wr)
    }

    /// Writes a checked request into the ring, which has room for every request the check
    /// lets in (its capacity is the queue's size); `QueueFull` should it not.
    pub(crate) fn push(&mut self, wr: T) -> Result<(), PostError> {
        self.producer.push(wr).map_err(|_| PostError::QueueFull)?;
        self.posted += 1;
        Ok(())
    }

    /// Requests posted and not yet known to be retired.
    pub(crate) fn outstanding(&self, retired: u64) -> u64 {
        self.posted.saturating_sub(retired)
    }
}

impl QpSlot {
    /// Hands every request waiting in the rings to the endpoint, in order (each was checked
    /// against the QP's gate as it was posted); whether there was any.
    pub(crate) fn hand_over(&mut self, endpoint: &mut Endpoint, now: Instant) -> bool {
        let qpn = self.queues.qpn;
        let mut handed = false;
        while let Some(posted) = self.recvs.pop_with(|wr| endpoint.post_recv(now, qpn, wr)) {
            if let Err(error) = posted {
                // Checked when posted against the state then; the QP has since changed
                // (it was reset under the post): lost, as on an HCA reset under its ring.
                tracing::debug!(qpn, %error, "a posted receive was refused when handed over");
            }
            self.recvs_handed += 1;
            handed = true;
        }
        while let Some(posted) = self.sends.pop_with(|wr| endpoint.post_send(now, qpn, wr)) {
            if let Err(error) = posted {
                tracing::debug!(qpn, %error, "a posted send was refused when handed over");
            }
            self.sends_handed += 1;
            handed = true;
        }
        handed
    }

    /// Publishes how many requests of each queue the QP has retired; whether any it was
    /// handed is still outstanding.
    pub(crate) fn publish_retired(&self, endpoint: &Endpoint) -> bool {
        let Some(gate) = endpoint.post_gate(self.queues.qpn) else {
            return false;
        };
        let sends = self.sends_handed - gate.sq_len as u64;
        // A QP on an SRQ (or an XRC target) holds the SRQ's receive a message is arriving
        // into in its own queue, though none came through its ring.
        let recvs = self.recvs_handed.saturating_sub(gate.rq_len as u64);
        self.queues.sends_retired.store(sends, Ordering::Release);
        self.queues.recvs_retired.store(recvs, Ordering::Release);
        sends != self.sends_handed || recvs != self.recvs_handed
    }
}
