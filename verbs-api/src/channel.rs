//! Completion channels (`ibv_comp_channel`).
//!
//! A [`CompChannel`] is an eventfd: epoll it, or block in
//! [`get_cq_event`](CompChannel::get_cq_event). As with `ibv_req_notify_cq`, a CQ signals
//! its channel once per arming, for the first matching completion after it.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use roce_transport::CqId;
use rustix::event::{poll, PollFd, PollFlags, Timespec};

use crate::error::Error;
use crate::queues::ChannelEvents;
use crate::shared::Shared;

/// A completion channel (`ibv_comp_channel`).
pub struct CompChannel {
    pub(crate) shared: Arc<Shared>,
    pub(crate) events: Arc<ChannelEvents>,
}

/// How long one round of a caller-driven wait sleeps in the backend before looking again.
const CALLER_WAIT_SLICE: Duration = Duration::from_millis(1);
/// How long a wait on the channel's fd lasts before checking on the engine again.
const THREAD_WAIT_SLICE: Duration = Duration::from_millis(100);

impl CompChannel {
    pub(crate) fn new(shared: &Arc<Shared>) -> Result<CompChannel, Error> {
        Ok(CompChannel {
            shared: Arc::clone(shared),
            events: Arc::new(ChannelEvents::new()?),
        })
    }

    /// Waits for a CQ of this channel to signal (`ibv_get_cq_event`) and says which
    /// ([`Cq::id`](crate::Cq::id)). `None` waits for ever; a timeout gives
    /// [`Error::TimedOut`].
    pub fn get_cq_event(&self, timeout: Option<Duration>) -> Result<CqId, Error> {
        // A timeout too long to represent is no timeout.
        let deadline = timeout.and_then(|timeout| Instant::now().checked_add(timeout));
        loop {
            if let Some(cq) = self.events.pop() {
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
                let mut fds = [PollFd::new(&*self.events, PollFlags::IN)];
                match poll(&mut fds, Some(&timeout)) {
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
        self.events.as_fd()
    }
}
