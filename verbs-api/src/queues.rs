//! What the engine shares with posting and polling threads outside the device lock: each
//! QP's submission queues, each CQ's queue of handed-over completions, each channel's
//! events and the context's async events. The engine side fills and drains them under the
//! device lock (see `core`); the objects' side takes only their own small locks.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Mutex;

use roce_transport::cq::WorkCompletion;
use roce_transport::qp::PostGate;
use roce_transport::wr::{RecvWr, SendWr};
use roce_transport::CqId;
use rustix::event::{eventfd, EventfdFlags};

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

/// The completions of one CQ that the engine has handed over: polling takes only this
/// lock, never the device's, so pollers and the engine thread do not contend.
pub(crate) struct CqQueue {
    pub(crate) entries: Mutex<VecDeque<WorkCompletion>>,
    /// Changed only by `Cq::resize`, under the device lock.
    pub(crate) depth: AtomicUsize,
    pub(crate) overflowed: AtomicBool,
    /// Completions still wait in the engine's CQ (this queue was full).
    pub(crate) backlog: AtomicBool,
}

impl CqQueue {
    pub(crate) fn new(depth: usize) -> CqQueue {
        CqQueue {
            entries: Mutex::new(VecDeque::with_capacity(depth)),
            depth: AtomicUsize::new(depth),
            overflowed: AtomicBool::new(false),
            backlog: AtomicBool::new(false),
        }
    }
}

/// Work requests admitted for a QP and not yet handed to the endpoint, with the view of
/// the QP they were admitted against.
pub(crate) struct Pending<T> {
    pub(crate) items: VecDeque<T>,
    pub(crate) gate: PostGate,
}

/// A QP's submission queues: posting threads take only these locks; the engine drains
/// them (and refreshes their gates) under the device lock, at every round.
pub(crate) struct Submission {
    pub(crate) sends: Mutex<Pending<SendWr>>,
    pub(crate) recvs: Mutex<Pending<RecvWr>>,
}

impl Submission {
    pub(crate) fn new(gate: PostGate) -> Submission {
        Submission {
            sends: Mutex::new(Pending {
                items: VecDeque::new(),
                gate,
            }),
            recvs: Mutex::new(Pending {
                items: VecDeque::new(),
                gate,
            }),
        }
    }
}
