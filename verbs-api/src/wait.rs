//! Blocking until an event queue has something: a completion channel's CQ events, a
//! context's async events.

use std::io;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};

use crate::error::Error;
use crate::queues::EventQueue;
use crate::shared::Shared;

/// How long one round of a caller-driven wait sleeps in the backend before looking again.
const CALLER_WAIT_SLICE: Duration = Duration::from_millis(1);
/// How long a wait on the queue's fd lasts before checking on the engine again.
const THREAD_WAIT_SLICE: Duration = Duration::from_millis(100);

/// Takes the oldest event of `queue`, waiting for one for up to `timeout` (`None`: for
/// ever; too long to represent: for ever too) and driving the engine meanwhile if nobody
/// else does. Fails with [`Error::TimedOut`], or once the engine has failed.
pub(crate) fn next_event<T>(
    shared: &Shared,
    queue: &EventQueue<T>,
    timeout: Option<Duration>,
) -> Result<T, Error> {
    let deadline = timeout.and_then(|timeout| Instant::now().checked_add(timeout));
    loop {
        if let Some(event) = queue.pop() {
            return Ok(event);
        }
        shared.check_running()?;
        let left = deadline.map(|at| at.saturating_duration_since(Instant::now()));
        if left == Some(Duration::ZERO) {
            return Err(Error::TimedOut);
        }
        if shared.caller_drives() {
            // Nobody else moves the engine: sleep in the backend, a slice at a time.
            let slice = left.map_or(CALLER_WAIT_SLICE, |left| left.min(CALLER_WAIT_SLICE));
            let mut core = shared.lock()?;
            shared.drive_waiting(&mut core, slice)?;
        } else {
            // The frames that bring the event must be taken by the engine thread now.
            shared.listen();
            // In slices, so a failed engine or a dropped context is noticed.
            let slice = left.map_or(THREAD_WAIT_SLICE, |left| left.min(THREAD_WAIT_SLICE));
            let timeout = Timespec::try_from(slice).map_err(|_| Error::TimedOut)?;
            let mut fds = [PollFd::new(queue, PollFlags::IN)];
            match poll(&mut fds, Some(&timeout)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(error) => return Err(io::Error::from(error).into()),
            }
        }
    }
}
