//! The background thread that drives a context's engine: busy-polling, or sleeping in
//! poll(2) until a frame, a timer or a wake-up.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use roce_provider::link::Link;
use rustix::event::{poll, PollFd, PollFlags, Timespec};

use crate::backend::BackendKind;
use crate::options::Progress;
use crate::shared::Shared;

/// Longest sleep of the event-driven thread when the backend has no readiness fd (the
/// in-memory wire): frames are then noticed this late at worst.
const POLL_WITHOUT_FD: Duration = Duration::from_micros(50);
/// Longest sleep otherwise, so a stop request is never missed for long.
const MAX_SLEEP: Duration = Duration::from_millis(100);
/// How often the thread asks whether the interface is up (the port's state). One ioctl
/// per interval, on no frame's path, and no later than the longest sleep wakes it anyway;
/// an rtnetlink subscription would notice sooner but adds a socket to drain and parse in
/// every mode, for events programs wait for over seconds.
const LINK_CHECK: Duration = MAX_SLEEP;

/// Starts the thread that drives `shared`'s engine as `progress` says (an
/// [`Events`](Progress::Events) thread polling for `spin` after its last work before it
/// sleeps), named after the device; stop it with [`Shared::request_stop`] and join it.
pub(crate) fn spawn(
    shared: &Arc<Shared>,
    progress: Progress,
    spin: Duration,
) -> io::Result<JoinHandle<()>> {
    // Made here, in the opener's network namespace. A backend the caller gave carries no
    // interface's frames, so no interface's state is its port's.
    let link = match shared.kind {
        BackendKind::Custom => None,
        _ => Some(Link::new(&shared.device.name)?),
    };
    shared.set_thread_running(true);
    let for_thread = Arc::clone(shared);
    let spawned = std::thread::Builder::new()
        .name(format!("roce-{}", shared.device.name))
        .spawn(move || run(&for_thread, link.as_ref(), progress, spin));
    if spawned.is_err() {
        shared.set_thread_running(false);
    }
    spawned
}

/// Marks the engine failed if the thread that holds it unwinds, so that no caller waits
/// for it for ever.
struct FailOnPanic<'a>(&'a Shared);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail(io::Error::other("the engine thread panicked"));
        }
    }
}

/// The background thread.
fn run(shared: &Shared, link: Option<&Link>, progress: Progress, spin: Duration) {
    let _guard = FailOnPanic(shared);
    // A duplicate of the backend's fd, to sleep on without holding the lock.
    let readiness = match shared.engine_lock() {
        Some(mut core) => core
            .engine
            .backend()
            .readiness_fd()
            .map(|fd| fd.try_clone_to_owned()),
        None => return,
    };
    let readiness = match readiness.transpose() {
        Ok(fd) => fd,
        Err(error) => {
            shared.fail(error);
            return;
        }
    };
    let mut last_work = Instant::now();
    let mut last_link_check = last_work;
    while !shared.stop_requested() {
        let (worked, next_timer, seen) = {
            let Some(mut core) = shared.engine_lock() else {
                shared.fail(io::Error::other("a thread panicked inside a verbs call"));
                return;
            };
            match core.round(&shared.doorbells) {
                Ok(worked) => (worked, core.engine.poll_timeout(), core.doorbells_seen()),
                Err(error) => {
                    drop(core);
                    shared.fail(error);
                    return;
                }
            }
        };
        let now = Instant::now();
        if let Some(link) = link.filter(|_| now - last_link_check >= LINK_CHECK) {
            last_link_check = now;
            // An interface that vanished is down; its engine fails on its own I/O.
            shared.set_port_up(link.is_up().unwrap_or(false));
        }
        if progress == Progress::BusyPoll {
            std::thread::yield_now();
            continue;
        }
        // Spin a while after work: the next frame or post (a reply, the program's next
        // request) usually comes within microseconds, sooner than a wake-up would.
        if worked {
            last_work = now;
        }
        if now.saturating_duration_since(last_work) < spin {
            std::thread::yield_now();
            continue;
        }
        shared.sleep_unless_posted(seen, || {
            sleep(shared, readiness.as_ref(), next_timer);
        });
    }
}

/// Sleeps until a frame may be waiting, the next timer, a wake-up, or a bound.
fn sleep(shared: &Shared, readiness: Option<&OwnedFd>, next_timer: Option<Instant>) {
    let bound = if readiness.is_some() {
        MAX_SLEEP
    } else {
        POLL_WITHOUT_FD
    };
    let until_timer = next_timer.map(|at| at.saturating_duration_since(Instant::now()));
    let timeout = until_timer.map_or(bound, |until| until.min(bound));
    let Ok(timeout) = Timespec::try_from(timeout) else {
        return;
    };
    let wake = shared.wake_fd();
    let mut fds = [
        PollFd::new(wake, PollFlags::IN),
        PollFd::new(wake, PollFlags::IN),
    ];
    if let Some(fd) = readiness {
        fds[1] = PollFd::from_borrowed_fd(fd.as_fd(), PollFlags::IN);
    }
    let watched = if readiness.is_some() { 2 } else { 1 };
    let _ = poll(&mut fds[..watched], Some(&timeout));
    if fds[0].revents().contains(PollFlags::IN) {
        let mut counter = [0u8; 8];
        let _ = rustix::io::read(wake, &mut counter);
    }
}
