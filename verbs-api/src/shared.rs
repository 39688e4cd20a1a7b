//! What a context shares with every object made from it: the locked core, the device, how
//! the engine progresses, and whether it has failed.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use roce_provider::backend::Backend;
use roce_provider::engine::Engine;
use roce_transport::endpoint::AsyncEvent;
use roce_transport::mr::PdId;
use roce_transport::AccessFlags;
use rustix::event::{eventfd, EventfdFlags};

use crate::async_events::AsyncEvents;
use crate::backend::{BackendKind, Neighbours};
use crate::core::Core;
use crate::device::Device;
use crate::error::Error;
use crate::limits;
use crate::queues::{Doorbells, QpQueues};

/// State shared by a context and every object made from it.
pub(crate) struct Shared {
    core: Mutex<Core>,
    pub(crate) device: Device,
    pub(crate) kind: BackendKind,
    pub(crate) neighbours: Neighbours,
    /// Where the async events the engine reports go: every open context's queue.
    pub(crate) async_events: Arc<AsyncEvents>,
    /// Set while the background thread runs; otherwise callers drive the engine.
    thread_running: AtomicBool,
    stop: AtomicBool,
    /// The QPs whose rings have new requests for the engine.
    pub(crate) doorbells: Doorbells,
    /// Set while the background thread sleeps (or is about to): only then does a post
    /// write `wake`.
    sleeping: AtomicBool,
    /// Written to wake a sleeping background thread (a post, or stopping).
    wake: OwnedFd,
    /// Rounds run by the program's threads (its polls, its posts): while they go on, the
    /// program takes its frames itself.
    caller_rounds: AtomicU64,
    /// The frames those rounds received.
    caller_frames: AtomicU64,
    /// Set while the background thread sleeps off the socket, leaving received frames to
    /// the program's polls (`engine_thread`'s `SocketPolicy`).
    deferring: AtomicBool,
    /// Whether the interface was up and running when last looked at (the port's state).
    port_up: AtomicBool,
    /// The error that stopped the engine, if one did.
    failure: Mutex<Option<String>>,
    /// Whether `failure` is set, readable without a lock.
    failed: AtomicBool,
}

impl Shared {
    /// The state of a context whose engine is `engine`.
    pub(crate) fn new(
        engine: Engine<Box<dyn Backend>>,
        device: Device,
        kind: BackendKind,
    ) -> io::Result<Shared> {
        let async_events = Arc::new(AsyncEvents::default());
        Ok(Shared {
            core: Mutex::new(Core::new(engine, Arc::clone(&async_events))),
            port_up: AtomicBool::new(device.up),
            device,
            async_events,
            neighbours: kind.neighbours(),
            kind,
            thread_running: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            doorbells: Doorbells::default(),
            sleeping: AtomicBool::new(false),
            wake: eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?,
            caller_rounds: AtomicU64::new(0),
            caller_frames: AtomicU64::new(0),
            deferring: AtomicBool::new(false),
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
        })
    }

    /// The lock over engine, endpoint and CQs; fails once the engine has failed.
    pub(crate) fn lock(&self) -> Result<MutexGuard<'_, Core>, Error> {
        self.check_running()?;
        self.core.lock().map_err(|_| Error::Poisoned)
    }

    /// The lock if nobody holds it (the engine thread may be driving), and the engine runs.
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, Core>> {
        self.check_running().ok()?;
        self.core.try_lock().ok()
    }

    /// The lock for the engine thread, which drives until told to stop whether or not a
    /// failure was recorded; `None` once a thread panicked under it.
    pub(crate) fn engine_lock(&self) -> Option<MutexGuard<'_, Core>> {
        self.core.lock().ok()
    }

    /// [`engine_lock`](Self::engine_lock) if nobody holds it: `Ok(None)` if somebody does.
    pub(crate) fn engine_try_lock(&self) -> Option<Option<MutexGuard<'_, Core>>> {
        match self.core.try_lock() {
            Ok(core) => Some(Some(core)),
            Err(std::sync::TryLockError::WouldBlock) => Some(None),
            Err(std::sync::TryLockError::Poisoned(_)) => None,
        }
    }

    /// Fails once the engine has failed (what a poller must hear, without taking the lock).
    pub(crate) fn check_running(&self) -> Result<(), Error> {
        if self.core.is_poisoned() {
            return Err(Error::Poisoned);
        }
        if !self.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        match self.failure.lock().map_err(|_| Error::Poisoned)?.as_ref() {
            Some(why) => Err(Error::EngineFailed(why.clone())),
            None => Ok(()),
        }
    }

    /// Whether callers must drive the engine themselves.
    pub(crate) fn caller_drives(&self) -> bool {
        !self.thread_running.load(Ordering::Acquire)
    }

    /// Records whether a background thread drives the engine.
    pub(crate) fn set_thread_running(&self, running: bool) {
        self.thread_running.store(running, Ordering::Release);
    }

    /// Asks the background thread to stop, waking it.
    pub(crate) fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.doorbells.bump();
        self.wake_thread();
    }

    pub(crate) fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// After a change under the lock (a CM step, `modify`): make what it queued leave now,
    /// by a round here when the caller drives, else by the engine thread.
    pub(crate) fn kick(&self, core: &mut Core) -> Result<(), Error> {
        if self.caller_drives() {
            self.drive(core)
        } else {
            self.wake();
            Ok(())
        }
    }

    /// One round of the engine ([`Core::round`]), recording a failure for every later
    /// call.
    pub(crate) fn drive(&self, core: &mut Core) -> Result<(), Error> {
        self.round(core).map(drop)
    }

    /// [`drive`](Self::drive), saying whether the round moved work. (The program's
    /// rounds; the engine thread runs [`Core::round`] itself.)
    pub(crate) fn round(&self, core: &mut Core) -> Result<bool, Error> {
        self.caller_rounds.fetch_add(1, Ordering::Relaxed);
        let rx_before = core.engine.stats.rx_frames;
        let worked = core.round(&self.doorbells);
        let received = core.engine.stats.rx_frames.wrapping_sub(rx_before);
        if received > 0 {
            self.caller_frames.fetch_add(received, Ordering::Relaxed);
        }
        worked.map_err(|error| self.fail(error))
    }

    /// How a caller-driven wait passes its time: a round, then, if it moved nothing, a
    /// sleep in the backend until a frame may be waiting, the engine's next timer or
    /// `slice`, then another round.
    pub(crate) fn drive_waiting(&self, core: &mut Core, slice: Duration) -> Result<(), Error> {
        if self.round(core)? {
            return Ok(());
        }
        let now = Instant::now();
        let until = core
            .engine
            .poll_timeout()
            .map(|at| at.saturating_duration_since(now));
        let wait = until.map_or(slice, |until| until.min(slice));
        core.engine.backend().wait(Some(wait))?;
        self.drive(core)
    }

    /// Records `error` as what stopped the engine (the first one stays) and returns it.
    pub(crate) fn fail(&self, error: io::Error) -> Error {
        let why = error.to_string();
        if let Ok(mut failure) = self.failure.lock() {
            failure.get_or_insert(why.clone());
        }
        self.failed.store(true, Ordering::Release);
        Error::EngineFailed(why)
    }

    /// After work was done for the engine under its lock (a change to finish): make the
    /// engine thread look again, waking it if it sleeps (a spinning or busy thread sees
    /// the count move).
    pub(crate) fn wake(&self) {
        self.doorbells.bump();
        self.wake_if_sleeping();
    }

    fn wake_if_sleeping(&self) {
        if self.sleeping.load(Ordering::SeqCst) {
            self.wake_thread();
        }
    }

    /// After a post wrote `queues`' rings (`rang`: and rang its doorbell). The caller's
    /// progress is a round, the same one the engine thread runs:
    ///
    /// - a send to a QP that had none outstanding (a request, a ping, a reply: latency)
    ///   leaves now, sent by a round from this thread when the engine is free (waking the
    ///   engine thread costs more than the round: on two cores it preempts a program);
    /// - a send behind others (a program posting faster than rounds go) waits for the next
    ///   round: the poll that comes for their completions, or the engine thread's, woken if
    ///   it sleeps; so a burst of posts is sent by a few rounds, not a round per post;
    /// - a receive only has to be in the endpoint before its SEND arrives, and that frame
    ///   makes the round that takes it answer the doorbells first: nothing more.
    pub(crate) fn posted(&self, send: bool, rang: bool, was_idle: bool) {
        if !send {
            return;
        }
        if was_idle {
            if let Some(mut core) = self.try_lock() {
                // A failure is recorded for every later call; this post was taken.
                let _ = self.drive(&mut core);
                return;
            }
        }
        // A send behind others, while the thread leaves frames to the program's polls: the
        // next poll sends it too; waking the thread for it would have the two take turns at
        // the lock (`ib_write_bw`'s sender: 12 % of its rate). The thread looks again within
        // a slice.
        if rang && (was_idle || !self.deferring()) {
            self.wake_if_sleeping();
        }
    }

    /// Rings `queues`' doorbell; whether this rang it.
    pub(crate) fn ring(&self, queues: &QpQueues) -> bool {
        self.doorbells.ring(queues)
    }

    /// Runs `sleep` unless something rang since the count `seen` (what the engine's last
    /// round answered); a doorbell rung during `sleep` writes the wake-up fd.
    pub(crate) fn sleep_unless_posted(&self, seen: u64, sleep: impl FnOnce()) {
        self.sleeping.store(true, Ordering::SeqCst);
        if self.doorbells.count() == seen {
            sleep();
        }
        self.sleeping.store(false, Ordering::Release);
    }

    /// How many rounds the program's threads have run.
    pub(crate) fn caller_rounds(&self) -> u64 {
        self.caller_rounds.load(Ordering::Relaxed)
    }

    /// How many frames the program's rounds have received.
    pub(crate) fn caller_frames(&self) -> u64 {
        self.caller_frames.load(Ordering::Relaxed)
    }

    /// Whether the background thread leaves received frames to the program's polls.
    pub(crate) fn deferring(&self) -> bool {
        self.deferring.load(Ordering::Acquire)
    }

    /// Records whether the background thread leaves received frames to the program.
    pub(crate) fn set_deferring(&self, deferring: bool) {
        self.deferring.store(deferring, Ordering::Release);
    }

    /// Before the program blocks (a wait for an event) and so stops polling: the
    /// background thread listens on the socket again, woken if it sleeps off it.
    pub(crate) fn listen(&self) {
        if self.deferring.swap(false, Ordering::AcqRel) {
            self.wake_thread();
        }
    }

    /// Whether the port is active, as last seen by [`set_port_up`](Self::set_port_up).
    pub(crate) fn port_up(&self) -> bool {
        self.port_up.load(Ordering::Acquire)
    }

    /// Records the interface's state; a change raises `IBV_EVENT_PORT_ACTIVE` or
    /// `IBV_EVENT_PORT_ERR`, as rxe's netdev notifier does.
    pub(crate) fn set_port_up(&self, up: bool) {
        if self.port_up.swap(up, Ordering::AcqRel) != up {
            tracing::debug!(device = %self.device.name, up, "port state changed");
            self.async_events.push(if up {
                AsyncEvent::PortActive
            } else {
                AsyncEvent::PortError
            });
        }
    }

    fn wake_thread(&self) {
        // A full counter already means "wake up"; nothing to do on error.
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    /// The eventfd a sleeping engine thread waits on besides the backend.
    pub(crate) fn wake_fd(&self) -> &OwnedFd {
        &self.wake
    }

    /// Registers `len` zeroed bytes in `pd` at `iova`, or at a fresh range of this context's
    /// when `None` ([`Core::reg_mr`]), within the device's `max_mr_size`.
    pub(crate) fn reg_mr(
        &self,
        pd: PdId,
        iova: Option<u64>,
        len: usize,
        access: AccessFlags,
    ) -> Result<(u64, u32), Error> {
        limits::check_mr_len(len)?;
        self.lock()?.reg_mr(pd, iova, len, access)
    }
}
