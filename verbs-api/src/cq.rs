//! Completion queues and completion channels.
//!
//! A [`CompChannel`] is an eventfd: epoll it, or block in
//! [`get_cq_event`](CompChannel::get_cq_event). As with `ibv_req_notify_cq`, a CQ signals
//! its channel once per arming, for the first matching completion after it.
//!
//! A CQ of depth N holds at least N completions (as `ibv_create_cq` may give more than
//! asked): N in the queue pollers read, and up to N more in the engine's, which overflows
//! (an async event, the QP to ERR) when both are full.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use roce_transport::cq::{NotifyOn, WorkCompletion};
use roce_transport::CqId;
use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};

use crate::context::Shared;
use crate::Error;

/// The part of a channel the engine signals.
pub(crate) struct ChannelInner {
    fd: OwnedFd,
    /// CQs that signalled, oldest first.
    events: Mutex<VecDeque<CqId>>,
}

impl ChannelInner {
    pub(crate) fn push(&self, cq: CqId) {
        if let Ok(mut events) = self.events.lock() {
            events.push_back(cq);
            // Under the lock: a `pop` between the two would leave the fd readable with no
            // event. A saturated counter still reads as readable.
            let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
        }
    }

    fn pop(&self) -> Option<CqId> {
        let mut events = self.events.lock().ok()?;
        let cq = events.pop_front();
        if events.is_empty() {
            // Drain the counter so the fd polls readable only while events wait.
            let mut counter = [0u8; 8];
            let _ = rustix::io::read(&self.fd, &mut counter);
        }
        cq
    }
}

/// A completion channel (`ibv_comp_channel`).
pub struct CompChannel {
    shared: Arc<Shared>,
    pub(crate) inner: Arc<ChannelInner>,
}

/// How long one round of a caller-driven wait sleeps in the backend before looking again.
const CALLER_WAIT_SLICE: Duration = Duration::from_millis(1);
/// How long a wait on the channel's fd lasts before checking on the engine again.
const THREAD_WAIT_SLICE: Duration = Duration::from_millis(100);

impl CompChannel {
    pub(crate) fn new(shared: &Arc<Shared>) -> Result<CompChannel, Error> {
        let fd =
            eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).map_err(io::Error::from)?;
        Ok(CompChannel {
            shared: Arc::clone(shared),
            inner: Arc::new(ChannelInner {
                fd,
                events: Mutex::new(VecDeque::new()),
            }),
        })
    }

    /// Waits for a CQ of this channel to signal (`ibv_get_cq_event`) and says which
    /// ([`Cq::id`]). `None` waits for ever; a timeout gives [`Error::TimedOut`].
    pub fn get_cq_event(&self, timeout: Option<Duration>) -> Result<CqId, Error> {
        // A timeout too long to represent is no timeout.
        let deadline = timeout.and_then(|timeout| Instant::now().checked_add(timeout));
        loop {
            if let Some(cq) = self.inner.pop() {
                return Ok(cq);
            }
            self.shared.check_running()?;
            let left = deadline.map(|at| at.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return Err(Error::TimedOut);
            }
            if self.shared.caller_drives() {
                // Nobody else moves the engine: sleep in the backend, a slice at a time.
                let slice = left.map_or(CALLER_WAIT_SLICE, |left| left.min(CALLER_WAIT_SLICE));
                let mut core = self.shared.lock()?;
                let waited = core.engine.run_once(slice);
                self.shared.drive(&mut core)?;
                waited?;
            } else {
                // In slices, so a failed engine or a dropped context is noticed.
                let slice = left.map_or(THREAD_WAIT_SLICE, |left| left.min(THREAD_WAIT_SLICE));
                let timeout = Timespec::try_from(slice).map_err(|_| Error::TimedOut)?;
                let timeout = Some(timeout);
                let mut fds = [PollFd::new(&self.inner.fd, PollFlags::IN)];
                match poll(&mut fds, timeout.as_ref()) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(error) => return Err(io::Error::from(error).into()),
                }
            }
        }
    }
}

impl AsFd for CompChannel {
    /// Readable while events wait to be taken with [`get_cq_event`](Self::get_cq_event).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }
}

/// The completions of one CQ that the engine has handed over: polling takes only this
/// lock, never the device's, so pollers and the engine thread do not contend.
pub(crate) struct CqShared {
    pub(crate) entries: Mutex<VecDeque<WorkCompletion>>,
    pub(crate) depth: usize,
    pub(crate) overflowed: AtomicBool,
    /// Completions still wait in the engine's CQ (this queue was full).
    pub(crate) backlog: AtomicBool,
}

/// A completion queue (`ibv_cq`).
pub struct Cq {
    pub(crate) shared: Arc<Shared>,
    pub(crate) id: CqId,
    channel: Option<Arc<ChannelInner>>,
    queue: Arc<CqShared>,
}

impl Cq {
    pub(crate) fn new(
        shared: &Arc<Shared>,
        depth: usize,
        channel: Option<&CompChannel>,
    ) -> Result<Cq, Error> {
        if channel.is_some_and(|channel| !Arc::ptr_eq(&channel.shared, shared)) {
            return Err(Error::ForeignObject("completion channel"));
        }
        let mut core = shared.lock()?;
        let id = core
            .endpoint()
            .create_cq(depth)
            .map_err(|_| Error::InvalidArgument("a CQ needs 1 to max_cqe entries"))?;
        if let Some(channel) = channel {
            core.channels.insert(id, Arc::clone(&channel.inner));
        }
        let queue = Arc::new(CqShared {
            entries: Mutex::new(VecDeque::with_capacity(depth)),
            depth,
            overflowed: AtomicBool::new(false),
            backlog: AtomicBool::new(false),
        });
        core.cqs.insert(id, Arc::clone(&queue));
        Ok(Cq {
            shared: Arc::clone(shared),
            id,
            channel: channel.map(|channel| Arc::clone(&channel.inner)),
            queue,
        })
    }

    /// Which CQ this is, as [`CompChannel::get_cq_event`] names it.
    pub fn id(&self) -> CqId {
        self.id
    }

    /// Moves up to `max` completions, oldest first, into `out` and returns how many
    /// (`ibv_poll_cq`). Fails once the CQ has overflowed.
    pub fn poll_into(&self, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize, Error> {
        if self.shared.caller_drives() {
            let mut core = self.shared.lock()?;
            self.shared.drive(&mut core)?;
        } else {
            self.shared.check_running()?;
        }
        if self.queue.overflowed.load(Ordering::Acquire) {
            return Err(Error::CqOverflow);
        }
        let count = self.take(max, out)?;
        if count < max && self.queue.backlog.load(Ordering::Acquire) {
            // This queue ran dry with more waiting in the engine's CQ: fetch them now, or a
            // program that drains before waiting for an event would wait for ever.
            self.shared.lock()?.deliver();
            return Ok(count + self.take(max - count, out)?);
        }
        Ok(count)
    }

    fn take(&self, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize, Error> {
        let mut entries = self.queue.entries.lock().map_err(|_| Error::Poisoned)?;
        let count = max.min(entries.len());
        out.extend(entries.drain(..count));
        Ok(count)
    }

    /// Up to `max` completions, oldest first.
    pub fn poll(&self, max: usize) -> Result<Vec<WorkCompletion>, Error> {
        let mut out = Vec::new();
        self.poll_into(max, &mut out)?;
        Ok(out)
    }

    /// Polls until `count` completions arrived, giving up with [`Error::TimedOut`] when
    /// `stall` passes without a new one. Yields the CPU between empty polls.
    pub fn wait_for(&self, count: usize, stall: Duration) -> Result<Vec<WorkCompletion>, Error> {
        let mut out = Vec::with_capacity(count);
        let mut last_progress = Instant::now();
        while out.len() < count {
            if self.poll_into(count - out.len(), &mut out)? > 0 {
                last_progress = Instant::now();
            } else if last_progress.elapsed() > stall {
                return Err(Error::TimedOut);
            } else {
                std::thread::yield_now();
            }
        }
        Ok(out)
    }

    /// Arms the CQ for one event on its channel (`ibv_req_notify_cq`): the next completion,
    /// or with `solicited_only` the next solicited one (or any error).
    pub fn req_notify(&self, solicited_only: bool) -> Result<(), Error> {
        if self.channel.is_none() {
            return Err(Error::InvalidArgument("the CQ has no completion channel"));
        }
        let on = if solicited_only {
            NotifyOn::Solicited
        } else {
            NotifyOn::Any
        };
        self.shared
            .lock()?
            .endpoint()
            .cq(self.id)
            .request_notify(on);
        Ok(())
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // The endpoint keeps the (empty) slot: its CQs are never renumbered.
        if let Ok(mut core) = self.shared.lock() {
            core.channels.remove(&self.id);
            core.cqs.remove(&self.id);
        }
    }
}
