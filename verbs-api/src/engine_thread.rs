//! The background thread that drives a context's engine: busy-polling, or sleeping in
//! poll(2) until a frame, a timer or a wake-up.
//!
//! A sleeping thread listens on the socket only while it is the one taking the frames. A
//! program that polls its CQ in a loop (`ib_send_lat`, `ibv_rc_pingpong`) would take each
//! frame itself, as its empty polls run the engine's round; but the frame's arrival wakes
//! the thread inside the peer's `sendto` (veth runs the receive there), the woken thread
//! preempts at once and takes the frame first: a few context switches per message on two
//! cores (`docs/performance.md`). So when a frame wakes the thread while the program has
//! been running rounds, the thread sleeps off the socket, in slices of [`DEFER_SLICE`],
//! and listens again as soon as the program runs no round over a slice, leaves frames for
//! the thread, or blocks for an event ([`Shared::listen`]). A time off that ends within
//! [`SHORT_DEFERRAL`] keeps the thread listening for [`LISTEN_AFTER_SHORT`]: a program
//! that spins on memory (`ib_write_lat`: only the engine can take the peer's WRITE) polls
//! between messages, and must not have its WRITEs wait for a slice each.
//!
//! After work the thread polls on for `spin` before it sleeps; with no time set (the default
//! on fewer than four CPUs), for [`ALONE_SPIN`] while the process's other threads use next to
//! no CPU ([`Alone`]): a program blocked in read(2) (perftest's bandwidth servers) loses no
//! core to it, and each frame then costs no wake-up (the sender's `sendto` paid one each).
//! That is decided at once when a burst of work wakes the thread: each wake-up of a sleeping
//! thread lands on the sender's CPU, where it and the sending program then take turns, the
//! other CPU idle, until the scheduler spreads them.

use std::io;
use std::os::fd::OwnedFd;
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
/// How long the thread polls after work while it is alone ([`Alone`]) and no spin is set.
const ALONE_SPIN: Duration = Duration::from_micros(50);
/// How often [`Alone`] looks at the CPU time of the process's threads (two system calls):
/// several scheduler ticks, as the process's clock adds other threads' time at ticks.
const ALONE_CHECK: Duration = Duration::from_millis(20);
/// Longest sleep otherwise, so a stop request is never missed for long.
const MAX_SLEEP: Duration = Duration::from_millis(100);
/// A thread off the socket listens again when its own rounds took at least one frame in
/// this many of those the program's took over a slice.
const LEFT_SHARE: u64 = 4;
/// A time off the socket that ends sooner than this (the program left frames, or stopped
/// polling) says the program does not take its frames reliably: the thread then listens
/// for [`LISTEN_AFTER_SHORT`] whatever the program does. A program that polls all along
/// (`ib_send_lat`) keeps the thread off for its whole run.
const SHORT_DEFERRAL: Duration = Duration::from_millis(2);
/// How long the thread listens after a short time off the socket: each time off may hold
/// one frame back for up to a slice (`ib_write_lat`, which spins on memory and polls only
/// for its own ACKs, loses at most one slice in this).
const LISTEN_AFTER_SHORT: Duration = Duration::from_millis(100);
/// How long a thread off the socket sleeps before it looks whether the program still polls:
/// a program that stops polling without blocking for an event has its frames taken this
/// late at worst, once.
const DEFER_SLICE: Duration = Duration::from_micros(500);
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
    // A duplicate of the backend's readiness fd (an epoll), to sleep on without the lock.
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
    let mut policy = SocketPolicy::default();
    let mut alone = Alone::new(last_work, &mut ProcessThreads);
    let mut woken_by_socket = false;
    let mut slept = None;
    while !shared.stop_requested() {
        // Asked before the lock: a program waiting for it looks blocked.
        let alone_now = spin.is_zero()
            && alone.check(
                Instant::now(),
                slept.take(),
                shared.caller_rounds(),
                &mut ProcessThreads,
            );
        // Off the socket, the program's polls run the rounds: one under way (the lock held)
        // says it still polls, so the thread sleeps another slice rather than wait its turn
        // (`ib_write_bw`'s sender and its thread took turns at the lock 6,000 times a second).
        let locked = if shared.deferring() {
            shared.engine_try_lock()
        } else {
            shared.engine_lock().map(Some)
        };
        let mut core = match locked {
            Some(Some(core)) => core,
            Some(None) => {
                sleep(shared, None, false, None);
                continue;
            }
            None => {
                shared.fail(io::Error::other("a thread panicked inside a verbs call"));
                return;
            }
        };
        let rx_before = core.engine.stats.rx_frames;
        let worked = match core.round(&shared.doorbells) {
            Ok(worked) => worked,
            Err(error) => {
                drop(core);
                shared.fail(error);
                return;
            }
        };
        let received = core.engine.stats.rx_frames.wrapping_sub(rx_before);
        let (next_timer, seen) = (core.engine.poll_timeout(), core.doorbells_seen());
        let now = Instant::now();
        if worked {
            last_work = now;
        }
        let busy = progress == Progress::BusyPoll;
        let listen = !busy && policy.after_round(shared, now, received, woken_by_socket);
        woken_by_socket = false;
        // Spin a while after work: the next frame or post (a reply, the program's next
        // request) usually comes within microseconds, sooner than a wake-up would.
        let spin = if alone_now { ALONE_SPIN } else { spin };
        let sleeps = !busy && now.saturating_duration_since(last_work) >= spin;
        // The sockets are in the epoll only while the thread sleeps on them.
        if let Err(error) = core.engine.backend().listen(sleeps && listen) {
            drop(core);
            shared.fail(error);
            return;
        }
        drop(core);
        if let Some(link) = link.filter(|_| now - last_link_check >= LINK_CHECK) {
            last_link_check = now;
            // An interface that vanished is down; its engine fails on its own I/O.
            shared.set_port_up(link.is_up().unwrap_or(false));
        }
        if !busy {
            policy.before_sleep(shared);
        }
        if !sleeps {
            std::thread::yield_now();
            continue;
        }
        let socket = if listen { readiness.as_ref() } else { None };
        let asleep = Instant::now();
        shared.sleep_unless_posted(seen, || {
            woken_by_socket = sleep(shared, socket, listen, next_timer);
        });
        slept = Some(asleep.elapsed());
    }
}

/// Whether the process's other threads (the program's, other contexts' engines) leave the
/// CPUs to this one. A thread that polls then takes no core from them; one that polls while
/// the program spins on memory (`ib_write_lat`) on two cores makes the program's frames wait
/// for a scheduler tick.
///
/// While the thread works, every [`ALONE_CHECK`] it asks whether the others used under a
/// tenth of a CPU since the last look. But the window a thread slept through holds what they
/// did before (a program setting up, then blocking in read(2) for the run), which said "not
/// alone" for the first [`ALONE_CHECK`] of a run: all of perftest's 5,000 messages by default
/// (`docs/performance.md`, session 15). So a thread woken from a sleep asks instead whether
/// any of them is runnable now, at once after a long sleep, then again after
/// [`GLANCE_FIRST`], twice that, and so on (the program's last steps before it blocks).
struct Alone {
    looked: Instant,
    others: Duration,
    /// The program's rounds at the last look.
    rounds: u64,
    alone: bool,
    /// How long after the last look a thread back from a sleep looks again.
    glance_after: Duration,
}

/// The first look after a burst's first: a program on its way to block (a perftest server
/// finishing its handshake) gets there within a millisecond.
const GLANCE_FIRST: Duration = Duration::from_millis(1);

/// What [`Alone`] asks of the process's other threads.
trait Others {
    /// Their CPU time so far.
    fn cpu_time(&mut self) -> Duration;
    /// Whether any of them is running or wants to, now; `None` when that cannot be told.
    fn runnable(&mut self) -> Option<bool>;
}

impl Alone {
    fn new(now: Instant, others: &mut impl Others) -> Alone {
        Alone {
            looked: now,
            others: others.cpu_time(),
            rounds: 0,
            alone: false,
            glance_after: GLANCE_FIRST,
        }
    }

    /// Whether the thread is alone at `now`; `slept`: how long it slept just before, if it
    /// did; `rounds`: how many the program's threads have run.
    fn check(
        &mut self,
        now: Instant,
        slept: Option<Duration>,
        rounds: u64,
        others: &mut impl Others,
    ) -> bool {
        let period = now.saturating_duration_since(self.looked);
        let new_burst = slept.is_some_and(|slept| slept >= ALONE_CHECK);
        if new_burst {
            self.glance_after = GLANCE_FIRST;
        }
        let glance = slept.is_some() && period >= self.glance_after;
        if !(new_burst || glance || period >= ALONE_CHECK) {
            return self.alone;
        }
        let cpu_time = others.cpu_time();
        let runnable = slept.and_then(|_| others.runnable());
        let alone = match runnable {
            // A program that ran a round since the last look is at work, though it may be
            // waiting for a lock as it is asked (the rounds a long sleep saw are old news).
            Some(runnable) => !runnable && (new_burst || rounds == self.rounds),
            None if period >= ALONE_CHECK => cpu_time.saturating_sub(self.others) * 10 < period,
            None => return self.alone,
        };
        // Each look comes twice as long after the last, a burst's first ones soon: reading
        // the threads' states costs ~50 µs here, and a program that blocks for each
        // completion changes the answer at every message.
        if !new_burst {
            self.glance_after = (self.glance_after * 2).min(ALONE_CHECK);
        }
        self.alone = alone;
        self.rounds = rounds;
        (self.looked, self.others) = (now, cpu_time);
        self.alone
    }
}

/// The calling process's threads but the calling one.
struct ProcessThreads;

impl Others for ProcessThreads {
    fn cpu_time(&mut self) -> Duration {
        others_cpu_time()
    }

    fn runnable(&mut self) -> Option<bool> {
        let me = rustix::thread::gettid().as_raw_nonzero().to_string();
        for entry in std::fs::read_dir("/proc/self/task").ok()? {
            let entry = entry.ok()?;
            if entry.file_name().to_str() == Some(me.as_str()) {
                continue;
            }
            // A thread that exited meanwhile has no state to read: it is not runnable.
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            if thread_state(&stat) == Some('R') {
                return Some(true);
            }
        }
        Some(false)
    }
}

/// The state letter of a thread's `/proc/.../stat` line: after the command name, which is
/// in parentheses and may hold spaces and parentheses itself.
fn thread_state(stat: &str) -> Option<char> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

/// The CPU time of the process's threads but the calling one.
fn others_cpu_time() -> Duration {
    use rustix::time::{clock_gettime, ClockId};
    let time = |clock| {
        let at = clock_gettime(clock);
        Duration::new(
            at.tv_sec.max(0) as u64,
            at.tv_nsec.clamp(0, 999_999_999) as u32,
        )
    };
    let process = time(ClockId::ProcessCPUTime);
    process.saturating_sub(time(ClockId::ThreadCPUTime))
}

/// Whether the sleeping thread listens on the socket ([the module's docs](self)); the
/// context's `deferring` flag holds the decision, which a blocking program clears.
#[derive(Default)]
struct SocketPolicy {
    /// The program's rounds when the thread last went to sleep.
    rounds_at_sleep: u64,
    /// While off the socket: when the current slice began, and the program's rounds and
    /// received frames then, and the frames the thread's own rounds took since.
    slice: Option<Slice>,
    /// Until when the thread listens whatever the program does (after a short time off).
    listen_until: Option<Instant>,
}

struct Slice {
    /// When the thread left the socket.
    off_since: Instant,
    began: Instant,
    program: Program,
    engine_frames: u64,
}

/// What the program's threads did, as counted by [`Shared::round`].
#[derive(Clone, Copy)]
struct Program {
    rounds: u64,
    frames: u64,
}

impl Program {
    fn of(shared: &Shared) -> Program {
        Program {
            rounds: shared.caller_rounds(),
            frames: shared.caller_frames(),
        }
    }
}

impl SocketPolicy {
    /// After the thread's round (`received`: the frames it took; `woken_by_socket`: the
    /// socket woke it for that round): whether its next sleep listens on the socket,
    /// recorded in `shared`.
    fn after_round(
        &mut self,
        shared: &Shared,
        now: Instant,
        received: u64,
        woken_by_socket: bool,
    ) -> bool {
        let deferring = shared.deferring();
        let defer = self.decide(
            deferring,
            Program::of(shared),
            now,
            received,
            woken_by_socket,
        );
        if defer != deferring {
            shared.set_deferring(defer);
        }
        !defer
    }

    /// Whether the thread stays or goes off the socket (`deferring`: it is off).
    fn decide(
        &mut self,
        deferring: bool,
        program: Program,
        now: Instant,
        received: u64,
        woken_by_socket: bool,
    ) -> bool {
        if !deferring {
            self.slice = None;
            // A frame woke the thread while the program was polling: the program's next
            // poll would have taken it. Leave the socket to it, unless the last time off
            // was short.
            let polling = program.rounds != self.rounds_at_sleep;
            let listening = self.listen_until.is_some_and(|until| now < until);
            if !(woken_by_socket && polling) || listening {
                return false;
            }
            self.slice = Some(Slice::new(program, now));
            return true;
        }
        let Some(slice) = self.slice.as_mut() else {
            self.slice = Some(Slice::new(program, now));
            return true;
        };
        slice.engine_frames += received;
        if now.saturating_duration_since(slice.began) < DEFER_SLICE {
            return true;
        }
        let program_frames = program.frames.wrapping_sub(slice.program.frames);
        // The program left frames the thread had to take (it waits for them some other way
        // than polling, as `ib_write_lat` spins on memory and polls only for its ACKs, or
        // it lost its CPU for the slice), or it ran no round over the slice (it stopped
        // polling): listen again.
        let left = slice.engine_frames > 0 && slice.engine_frames * LEFT_SHARE >= program_frames;
        if left || program.rounds == slice.program.rounds {
            if now.saturating_duration_since(slice.off_since) < SHORT_DEFERRAL {
                self.listen_until = Some(now + LISTEN_AFTER_SHORT);
            }
            self.slice = None;
            return false;
        }
        let off_since = slice.off_since;
        *slice = Slice::new(program, now);
        slice.off_since = off_since;
        true
    }

    /// Before the thread sleeps.
    fn before_sleep(&mut self, shared: &Shared) {
        self.rounds_at_sleep = shared.caller_rounds();
    }
}

impl Slice {
    fn new(program: Program, now: Instant) -> Slice {
        Slice {
            off_since: now,
            began: now,
            program,
            engine_frames: 0,
        }
    }
}

/// Sleeps until a frame may be waiting on `readiness` (when listening), the next timer, a
/// wake-up, or a bound; whether the socket woke it.
fn sleep(
    shared: &Shared,
    readiness: Option<&OwnedFd>,
    listen: bool,
    next_timer: Option<Instant>,
) -> bool {
    let bound = if !listen {
        DEFER_SLICE
    } else if readiness.is_some() {
        MAX_SLEEP
    } else {
        POLL_WITHOUT_FD
    };
    let until_timer = next_timer.map(|at| at.saturating_duration_since(Instant::now()));
    let timeout = until_timer.map_or(bound, |until| until.min(bound));
    let Ok(timeout) = Timespec::try_from(timeout) else {
        return false;
    };
    let wake = shared.wake_fd();
    let mut fds = [
        PollFd::new(wake, PollFlags::IN),
        PollFd::new(wake, PollFlags::IN),
    ];
    if let Some(fd) = readiness {
        fds[1] = PollFd::new(fd, PollFlags::IN);
    }
    let watched = if readiness.is_some() { 2 } else { 1 };
    let _ = poll(&mut fds[..watched], Some(&timeout));
    if fds[0].revents().contains(PollFlags::IN) {
        let mut counter = [0u8; 8];
        let _ = rustix::io::read(wake, &mut counter);
    }
    watched == 2 && fds[1].revents().contains(PollFlags::IN)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process's other threads as a test sets them.
    #[derive(Default)]
    struct FakeOthers {
        cpu_time: Duration,
        runnable: bool,
        asked: usize,
    }

    impl Others for FakeOthers {
        fn cpu_time(&mut self) -> Duration {
            self.cpu_time
        }

        fn runnable(&mut self) -> Option<bool> {
            self.asked += 1;
            Some(self.runnable)
        }
    }

    /// A program that runs (or wants to), and a thread that has looked at it once.
    fn running_program(start: Instant) -> (Alone, FakeOthers) {
        let mut others = FakeOthers {
            runnable: true,
            ..FakeOthers::default()
        };
        (Alone::new(start, &mut others), others)
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_thread_state_is_read_past_any_command_name() {
        assert_eq!(thread_state("4242 (ib_write_bw) S 1 4242 0"), Some('S'));
        assert_eq!(thread_state("4243 (a) R (b)) R 1 4242 0"), Some('R'));
        assert_eq!(thread_state("4244 (cut"), None);
    }

    #[test]
    fn a_spinning_thread_of_the_process_is_runnable() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let spinning = Arc::clone(&stop);
        let spinner = std::thread::spawn(move || {
            while !spinning.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        let runnable = ProcessThreads.runnable();
        stop.store(true, Ordering::Relaxed);
        spinner.join().unwrap();
        assert_eq!(runnable, Some(true));
    }

    #[test]
    fn back_from_a_long_sleep_the_thread_asks_what_the_others_do_now() {
        let start = Instant::now();
        let mut others = FakeOthers::default();
        let mut alone = Alone::new(start, &mut others);
        // The program set up for 30 ms of the 50 the thread slept, then blocked in read(2);
        // a frame wakes the thread: it spins from the first round.
        others.cpu_time = 30 * MS;
        assert!(alone.check(start + 50 * MS, Some(45 * MS), 7, &mut others));
    }

    #[test]
    fn a_program_on_its_way_to_block_is_seen_blocked_a_glance_later() {
        let start = Instant::now();
        let (mut alone, mut others) = running_program(start);
        assert!(!alone.check(start + 50 * MS, Some(45 * MS), 7, &mut others));
        others.runnable = false;
        // Too soon for another look...
        assert!(!alone.check(start + 50 * MS + MS / 2, Some(MS / 4), 7, &mut others));
        // ...then the next wake-up looks again.
        assert!(alone.check(start + 51 * MS, Some(MS / 4), 7, &mut others));
    }

    #[test]
    fn a_program_that_ran_rounds_is_at_work_though_it_waits_for_the_lock() {
        let start = Instant::now();
        let (mut alone, mut others) = running_program(start);
        assert!(!alone.check(start + 50 * MS, Some(45 * MS), 7, &mut others));
        // Asleep in a lock's queue as the thread looks, after two rounds: at work.
        others.runnable = false;
        assert!(!alone.check(start + 51 * MS, Some(MS / 2), 9, &mut others));
        // No round since: blocked.
        assert!(alone.check(start + 53 * MS, Some(MS / 2), 9, &mut others));
    }

    #[test]
    fn looks_at_a_program_that_keeps_running_back_off() {
        let start = Instant::now();
        let (mut alone, mut others) = running_program(start);
        // Woken every 50 µs for 200 ms, the program polling all along: a look at 1, 2, 4,
        // 8, 16 ms, then one per ALONE_CHECK.
        let mut now = start;
        for round in 0..4000 {
            now += MS / 20;
            assert!(!alone.check(now, Some(MS / 40), round, &mut others));
        }
        assert!(others.asked <= 16, "{} looks", others.asked);
    }

    #[test]
    fn looks_back_off_though_the_answer_changes_at_every_message() {
        // A program that blocks for each completion (ibv_get_cq_event): runnable one look,
        // blocked the next.
        let start = Instant::now();
        let mut others = FakeOthers::default();
        let mut alone = Alone::new(start, &mut others);
        let mut now = start;
        for _ in 0..4000 {
            now += MS / 20;
            others.runnable = !others.runnable;
            alone.check(now, Some(MS / 40), 0, &mut others);
        }
        assert!(others.asked <= 16, "{} looks", others.asked);
    }

    #[test]
    fn awake_the_thread_judges_by_the_others_cpu_time() {
        let start = Instant::now();
        let mut others = FakeOthers::default();
        let mut alone = Alone::new(start, &mut others);
        others.cpu_time = MS;
        assert!(alone.check(start + ALONE_CHECK, None, 0, &mut others));
        others.cpu_time += ALONE_CHECK / 5;
        assert!(!alone.check(start + 2 * ALONE_CHECK, None, 0, &mut others));
        assert_eq!(others.asked, 0);
    }

    fn program(rounds: u64, frames: u64) -> Program {
        Program { rounds, frames }
    }

    /// A thread listening, asleep since the program's `rounds`-th round.
    fn asleep_at(rounds: u64) -> SocketPolicy {
        SocketPolicy {
            rounds_at_sleep: rounds,
            ..SocketPolicy::default()
        }
    }

    #[test]
    fn a_frame_that_wakes_the_thread_while_the_program_polls_sends_it_off_the_socket() {
        let now = Instant::now();
        // The program ran rounds while the thread slept: off the socket.
        assert!(asleep_at(10).decide(false, program(12, 0), now, 1, true));
        // It ran none: the thread is the one taking frames.
        assert!(!asleep_at(10).decide(false, program(10, 0), now, 1, true));
        // A post or a timer woke the thread, not a frame: it stays.
        assert!(!asleep_at(10).decide(false, program(12, 0), now, 0, false));
    }

    #[test]
    fn off_the_socket_the_thread_stays_off_while_the_program_polls_and_takes_its_frames() {
        let start = Instant::now();
        let mut policy = asleep_at(10);
        assert!(policy.decide(false, program(12, 0), start, 1, true));
        // Within the slice, nothing is decided.
        assert!(policy.decide(true, program(12, 0), start + DEFER_SLICE / 2, 0, false));
        // Slices in which the program polled and took its frames (one left over).
        let mut now = start;
        let mut rounds = 12;
        while now < start + SHORT_DEFERRAL {
            now += DEFER_SLICE;
            rounds += 500;
            assert!(policy.decide(true, program(rounds, rounds / 25), now, 1, false));
        }
        // A slice without the program's rounds: it stopped polling, the thread listens...
        now += DEFER_SLICE;
        assert!(!policy.decide(true, program(rounds, rounds / 25), now, 0, false));
        // ...and leaves again at the next frame that finds it polling (the time off was long).
        policy.rounds_at_sleep = rounds;
        assert!(policy.decide(false, program(rounds + 2, 0), now, 1, true));
    }

    #[test]
    fn a_short_time_off_keeps_the_thread_listening_for_a_while() {
        for left_frames in [true, false] {
            let start = Instant::now();
            let mut policy = asleep_at(10);
            assert!(policy.decide(false, program(12, 0), start, 1, true));
            // After one slice: the program polled for its ACKs (one frame) but left the
            // thread one in two; or it stopped polling (it spins on memory).
            let later = start + DEFER_SLICE;
            let (program_now, taken) = if left_frames {
                (program(40, 1), 1)
            } else {
                (program(12, 0), 0)
            };
            assert!(!policy.decide(true, program_now, later, taken, false));
            // Frames that wake it while the program polls no longer send it off...
            policy.rounds_at_sleep = 40;
            assert!(!policy.decide(false, program(45, 5), later, 1, true));
            // ...until the while is over.
            let after = later + LISTEN_AFTER_SHORT;
            assert!(policy.decide(false, program(50, 6), after, 1, true));
        }
    }
}
