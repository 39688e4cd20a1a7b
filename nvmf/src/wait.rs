//! Sleeping until a CQ or an rdma_cm event channel has something, for the target's and
//! the host's threads: arm the CQ, look at it once more (a completion before the arming
//! would not wake us), then poll(2) both fds.

use std::io;
use std::time::Duration;

use roce_verbs::{CompChannel, Cq, EventChannel};
use rustix::event::{poll, PollFd, PollFlags, Timespec};

/// Sleeps for at most `timeout` unless `recheck` (which polls the CQ after it is armed)
/// found work; consumes the channel's CQ events.
pub(crate) fn sleep(
    cq: &Cq,
    comp: &CompChannel,
    channel: &EventChannel,
    timeout: Duration,
    recheck: impl FnOnce() -> io::Result<bool>,
) -> io::Result<()> {
    cq.req_notify(false)
        .map_err(|error| io::Error::other(format!("arming the CQ: {error}")))?;
    if recheck()? {
        return Ok(());
    }
    let timeout = Timespec::try_from(timeout).unwrap_or(Timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    });
    let mut fds = [
        PollFd::new(channel, PollFlags::IN),
        PollFd::new(comp, PollFlags::IN),
    ];
    match poll(&mut fds, Some(&timeout)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => {}
        Err(error) => return Err(error.into()),
    }
    while comp.get_cq_event(Some(Duration::ZERO)).is_ok() {}
    Ok(())
}
