//! An open device (`ibv_open_device`): the engine that drives transport and backend, and
//! what makes it progress (a background thread, busy-polling or sleeping, or the caller).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use roce_provider::afxdp::AfXdpBackend;
use roce_provider::backend::Backend;
use roce_provider::capture::PcapRecorder;
use roce_provider::engine::{Addressing, Engine, EngineStats};
use roce_provider::udp::UdpBackend;
use roce_provider::xdp::XdpMode;
use roce_transport::endpoint::AsyncEvent;
use roce_transport::{CqId, Endpoint};
use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};

use crate::cq::{ChannelInner, CompChannel, Cq, CqShared};
use crate::device::Device;
use crate::neighbour;
use crate::qp::{Pending, Submission};
use crate::{Error, Pd};

/// How frames move for this context.
#[non_exhaustive]
pub enum BackendChoice {
    /// AF_XDP in native mode, else generic mode, else kernel UDP sockets; which one was
    /// taken, and why, is in [`Context::backend_kind`].
    Auto,
    /// AF_XDP only (root).
    AfXdp(XdpMode),
    /// Kernel UDP sockets on port 4791 of the device's IPv4 address (no root).
    Udp,
    /// Any backend (the in-memory wire, fault injection, pcap): the caller says who we are
    /// on the link and which MACs the neighbours have.
    Custom(Box<dyn Backend>, Addressing),
}

/// What drives the engine: receiving, timers, transmitting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// A background thread that never sleeps: lowest latency, one core spent.
    BusyPoll,
    /// A background thread that sleeps in poll(2) until a frame, a timer or a post.
    Events,
    /// No thread: posting and polling a CQ drive the engine (one thread per context).
    Caller,
}

/// Options of [`Context::open`].
pub struct OpenOptions {
    /// How frames move.
    pub backend: BackendChoice,
    /// What drives the engine.
    pub progress: Progress,
    /// Seed of the memory keys; `None` takes it from the OS (use a seed only in tests).
    pub seed: Option<[u8; 32]>,
    /// Write every frame sent and received to this pcap file.
    pub pcap: Option<std::path::PathBuf>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            backend: BackendChoice::Auto,
            progress: Progress::Events,
            seed: None,
            pcap: None,
        }
    }
}

/// Which backend a context ended up with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendKind {
    /// AF_XDP in this mode.
    AfXdp(XdpMode),
    /// Kernel UDP sockets; `fallback` says why AF_XDP was not used, when it was tried.
    Udp {
        /// The AF_XDP error, for [`BackendChoice::Auto`].
        fallback: Option<String>,
    },
    /// A backend the caller gave.
    Custom,
}

/// Where neighbours' MACs come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Neighbours {
    /// The kernel's table, asking it to resolve missing entries.
    Kernel,
    /// The kernel addresses the frames (UDP sockets): no MAC needed.
    NotNeeded,
    /// Only those the caller gave.
    Static,
}

/// Everything behind the one lock of a context.
pub(crate) struct Core {
    pub(crate) engine: Engine<Box<dyn Backend>>,
    /// The channel of each CQ that has one.
    pub(crate) channels: HashMap<CqId, Arc<ChannelInner>>,
    /// The user-side queue of each CQ, which `poll` reads without this lock.
    pub(crate) cqs: HashMap<CqId, Arc<CqShared>>,
    /// Each QP's submission queues, which posting fills without this lock.
    pub(crate) submissions: std::collections::BTreeMap<u32, Arc<Submission>>,
    pub(crate) async_events: VecDeque<AsyncEvent>,
}

impl Core {
    pub(crate) fn endpoint(&mut self) -> &mut Endpoint {
        self.engine.endpoint()
    }

    /// Moves the engine's news to where users wait for it: completions to the CQs' own
    /// queues, CQ events to their channels, async events to the context.
    pub(crate) fn deliver(&mut self) {
        let mut moved = Vec::new();
        for (&id, shared) in &self.cqs {
            let cq = self.engine.endpoint().cq(id);
            if cq.is_overflowed() {
                shared.overflowed.store(true, Ordering::Release);
            }
            if cq.is_empty() {
                shared.backlog.store(false, Ordering::Release);
                continue;
            }
            if let Ok(mut entries) = shared.entries.lock() {
                // What does not fit waits in the endpoint's CQ, which overflows when full;
                // pollers that empty their queue fetch it (see `Cq::poll_into`).
                let room = shared.depth.saturating_sub(entries.len());
                moved.clear();
                cq.poll(room, &mut moved);
                entries.extend(moved.drain(..));
                shared.backlog.store(!cq.is_empty(), Ordering::Release);
            }
        }
        for (&cq, channel) in &self.channels {
            if self.engine.endpoint().cq(cq).take_event() {
                channel.push(cq);
            }
        }
        self.async_events
            .extend(self.engine.endpoint().take_events());
    }

    /// One round of the engine: admitted work in, every waiting frame, due timers, every
    /// packet ready, completions out.
    pub(crate) fn drive(&mut self) -> io::Result<()> {
        self.submit(Instant::now());
        let result = self.engine.poll();
        self.refresh_gates();
        self.deliver();
        result
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
        for (&qpn, queues) in &self.submissions {
            let Some(gate) = endpoint.post_gate(qpn) else {
                continue;
            };
            if let Ok(mut sends) = queues.sends.lock() {
                sends.gate = gate;
            }
            if let Ok(mut recvs) = queues.recvs.lock() {
                recvs.gate = gate;
            }
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

/// State shared by a context and every object made from it.
pub(crate) struct Shared {
    core: Mutex<Core>,
    pub(crate) device: Device,
    pub(crate) kind: BackendKind,
    pub(crate) progress: Progress,
    neighbours: Neighbours,
    /// Set while the background thread runs; otherwise callers drive the engine.
    thread_running: AtomicBool,
    stop: AtomicBool,
    /// Written to wake a sleeping background thread (a post, or stopping).
    wake: OwnedFd,
    /// The error that stopped the engine, if one did.
    failure: Mutex<Option<String>>,
    /// Whether `failure` is set, readable without a lock.
    failed: AtomicBool,
    /// Next address handed to a region registered without one.
    next_iova: AtomicU64,
}

impl Shared {
    /// The lock over engine, endpoint and CQs; fails once the engine has failed.
    pub(crate) fn lock(&self) -> Result<MutexGuard<'_, Core>, Error> {
        self.check_running()?;
        self.core.lock().map_err(|_| Error::Poisoned)
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

    /// After a post: make the new work leave now.
    pub(crate) fn kick(&self, core: &mut Core) -> Result<(), Error> {
        if self.caller_drives() {
            self.drive(core)
        } else {
            self.wake();
            Ok(())
        }
    }

    /// [`Core::drive`], recording a failure for every later call.
    pub(crate) fn drive(&self, core: &mut Core) -> Result<(), Error> {
        core.drive().map_err(|error| self.fail(error))
    }

    fn fail(&self, error: io::Error) -> Error {
        let why = error.to_string();
        if let Ok(mut failure) = self.failure.lock() {
            failure.get_or_insert(why.clone());
        }
        self.failed.store(true, Ordering::Release);
        Error::EngineFailed(why)
    }

    /// After work was admitted without the lock: make the engine thread take it.
    pub(crate) fn wake(&self) {
        if self.progress == Progress::Events {
            self.wake_thread();
        }
    }

    fn wake_thread(&self) {
        // A full counter already means "wake up"; nothing to do on error.
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    fn resolve6(&self, ip: Ipv6Addr) -> Result<(), Error> {
        match self.neighbours {
            Neighbours::NotNeeded => Err(Error::Unsupported(
                "IPv6 GIDs over kernel UDP sockets (use AF_XDP)",
            )),
            Neighbours::Static => {
                let known = self.lock()?.engine.knows_neighbour6(&ip);
                known.then_some(()).ok_or(Error::NoNeighbour6(ip))
            }
            Neighbours::Kernel => {
                let device = &self.device;
                let mac = neighbour::resolve6(ip, &device.name, device.ifindex)?;
                self.lock()?.engine.add_neighbour6(ip, mac);
                Ok(())
            }
        }
    }

    /// Whether packets can go from the GID at `index` to `dgid`.
    pub(crate) fn check_path(&self, index: u8, dgid: [u8; 16]) -> Result<(), Error> {
        let gid = self
            .device
            .gid(usize::from(index))
            .ok_or(Error::NoGid(index))?;
        let v4 = |gid: [u8; 16]| Ipv6Addr::from(gid).to_ipv4_mapped().is_some();
        if v4(gid) != v4(dgid) {
            return Err(Error::InvalidArgument(
                "source and destination GIDs of different families (IPv4-mapped and IPv6)",
            ));
        }
        match Ipv6Addr::from(gid).to_ipv4_mapped() {
            // IPv4 leaves from the first address only.
            Some(ip) if Some(ip) == self.device.ipv4() => Ok(()),
            Some(_) => Err(Error::Unsupported(
                "source GIDs other than the IPv4-mapped GID of the first address",
            )),
            None if self.neighbours == Neighbours::NotNeeded => Err(Error::Unsupported(
                "IPv6 GIDs over kernel UDP sockets (use AF_XDP)",
            )),
            None => Ok(()),
        }
    }

    /// Learns an IPv6 neighbour's MAC (for contexts over a caller's backend, whose
    /// neighbours are static).
    pub(crate) fn add_neighbour6(&self, ip: Ipv6Addr, mac: [u8; 6]) -> Result<(), Error> {
        self.lock()?.engine.add_neighbour6(ip, mac);
        Ok(())
    }

    /// A fresh, page-aligned address range of `len` bytes for a region, with a guard gap so
    /// an off-by-one address never lands in the next region.
    pub(crate) fn allocate_iova(&self, len: usize) -> u64 {
        let span = (len as u64).div_ceil(4096) * 4096 + 4096;
        self.next_iova.fetch_add(span, Ordering::Relaxed)
    }

    /// Makes sure the engine can reach `dgid`: its MAC is known.
    pub(crate) fn resolve(&self, dgid: [u8; 16]) -> Result<(), Error> {
        let Some(ip) = Ipv6Addr::from(dgid).to_ipv4_mapped() else {
            return self.resolve6(Ipv6Addr::from(dgid));
        };
        match self.neighbours {
            Neighbours::NotNeeded => {
                // The engine still wants an entry; the kernel picks the real MAC.
                self.lock()?.engine.add_neighbour(ip, [0; 6]);
                Ok(())
            }
            Neighbours::Static => {
                let known = self
                    .lock()?
                    .engine
                    .addressing()
                    .neighbours
                    .contains_key(&ip);
                known.then_some(()).ok_or(Error::NoNeighbour(ip))
            }
            Neighbours::Kernel => {
                // Outside the lock: resolving may take a few hundred milliseconds.
                let mac = neighbour::resolve(ip, &self.device.name)?;
                self.lock()?.engine.add_neighbour(ip, mac);
                Ok(())
            }
        }
    }
}

/// An open device.
///
/// Every object made from it ([`Pd`], [`Cq`], [`Qp`](crate::Qp), ...) keeps the device open;
/// dropping the context stops its background thread, after which polling a CQ drives the
/// engine instead.
pub struct Context {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Context {
    /// Opens `device` (in this thread's network namespace).
    pub fn open(device: &Device, options: OpenOptions) -> Result<Context, Error> {
        // IPv4-mapped GIDs leave from the first IPv4 address; without one, only IPv6 GIDs
        // (and no UDP sockets, which carry IPv4 here).
        let ip = device.ipv4().unwrap_or(Ipv4Addr::UNSPECIFIED);
        let needs_ipv4 =
            || Error::Unsupported("kernel UDP sockets on a device without an IPv4 address");
        if ip.is_unspecified() && matches!(options.backend, BackendChoice::Udp) {
            return Err(needs_ipv4());
        }
        let addressing = Addressing {
            mac: device.mac,
            ip,
            neighbours: HashMap::new(),
        };
        let (backend, addressing, kind): (Box<dyn Backend>, _, _) = match options.backend {
            BackendChoice::AfXdp(mode) => (
                Box::new(AfXdpBackend::open(&device.name, mode)?),
                addressing,
                BackendKind::AfXdp(mode),
            ),
            BackendChoice::Udp => (
                Box::new(UdpBackend::bind(ip, device.mac)?),
                addressing,
                BackendKind::Udp { fallback: None },
            ),
            BackendChoice::Auto => {
                let native = AfXdpBackend::open(&device.name, XdpMode::Native)
                    .map(|backend| (backend, XdpMode::Native));
                match native.or_else(|_| {
                    AfXdpBackend::open(&device.name, XdpMode::Generic)
                        .map(|backend| (backend, XdpMode::Generic))
                }) {
                    Ok((backend, mode)) => {
                        (Box::new(backend), addressing, BackendKind::AfXdp(mode))
                    }
                    Err(_) if ip.is_unspecified() => return Err(needs_ipv4()),
                    Err(error) => (
                        Box::new(UdpBackend::bind(ip, device.mac)?),
                        addressing,
                        BackendKind::Udp {
                            fallback: Some(error.to_string()),
                        },
                    ),
                }
            }
            BackendChoice::Custom(backend, addressing) => {
                (backend, addressing, BackendKind::Custom)
            }
        };
        let backend: Box<dyn Backend> = match &options.pcap {
            Some(path) => Box::new(PcapRecorder::create(backend, path).map_err(io::Error::other)?),
            None => backend,
        };
        let neighbours = match kind {
            BackendKind::AfXdp(_) => Neighbours::Kernel,
            BackendKind::Udp { .. } => Neighbours::NotNeeded,
            BackendKind::Custom => Neighbours::Static,
        };
        let seed = match options.seed {
            Some(seed) => seed,
            None => {
                let mut seed = [0u8; 32];
                rustix::rand::getrandom(&mut seed, rustix::rand::GetRandomFlags::empty())
                    .map_err(io::Error::from)?;
                seed
            }
        };
        let mut endpoint = Endpoint::new(seed);
        endpoint.set_port_mtu(device.query_port().active_mtu);
        let mut engine = Engine::new(endpoint, backend, addressing);
        engine.set_gid_table(device.gids.clone());
        let shared = Arc::new(Shared {
            core: Mutex::new(Core {
                engine,
                channels: HashMap::new(),
                cqs: HashMap::new(),
                submissions: std::collections::BTreeMap::new(),
                async_events: VecDeque::new(),
            }),
            device: device.clone(),
            kind,
            progress: options.progress,
            neighbours,
            thread_running: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            wake: eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
                .map_err(io::Error::from)?,
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
            next_iova: AtomicU64::new(0x1_0000_0000),
        });
        let thread = match options.progress {
            Progress::Caller => None,
            progress => {
                shared.thread_running.store(true, Ordering::Release);
                let for_thread = Arc::clone(&shared);
                Some(
                    std::thread::Builder::new()
                        .name(format!("roce-{}", device.name))
                        .spawn(move || run(&for_thread, progress))?,
                )
            }
        };
        Ok(Context { shared, thread })
    }

    /// The device this context drives.
    pub fn device(&self) -> &Device {
        &self.shared.device
    }

    /// Which backend carries the frames.
    pub fn backend_kind(&self) -> &BackendKind {
        &self.shared.kind
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&self) -> Result<Pd, Error> {
        Pd::new(&self.shared)
    }

    /// Creates a completion channel (`ibv_create_comp_channel`).
    pub fn create_comp_channel(&self) -> Result<CompChannel, Error> {
        CompChannel::new(&self.shared)
    }

    /// Creates a CQ of `depth` entries whose events go to `channel` (`ibv_create_cq`).
    pub fn create_cq(&self, depth: usize, channel: Option<&CompChannel>) -> Result<Cq, Error> {
        Cq::new(&self.shared, depth, channel)
    }

    /// With [`Progress::Caller`], one round of the engine: what a program calls while it
    /// waits on something other than a CQ (memory a peer WRITEs, a socket), so that the
    /// peer's traffic is still answered. With a background thread it does nothing.
    pub fn progress(&self) -> Result<(), Error> {
        if self.shared.caller_drives() {
            let mut core = self.shared.lock()?;
            self.shared.drive(&mut core)?;
        }
        Ok(())
    }

    /// Takes the oldest async event (`ibv_get_async_event`, without blocking).
    pub fn get_async_event(&self) -> Result<Option<AsyncEvent>, Error> {
        Ok(self.shared.lock()?.async_events.pop_front())
    }

    /// Tells a context over a caller's backend ([`BackendChoice::Custom`]) the MAC of an
    /// IPv6 neighbour (AF_XDP contexts ask the kernel).
    pub fn add_neighbour6(&self, ip: Ipv6Addr, mac: [u8; 6]) -> Result<(), Error> {
        self.shared.add_neighbour6(ip, mac)
    }

    /// The engine's frame counters.
    pub fn stats(&self) -> Result<EngineStats, Error> {
        Ok(self.shared.lock()?.engine.stats)
    }

    /// Runs `f` on the backend, e.g. to flush a pcap recorder.
    pub fn with_backend<T>(&self, f: impl FnOnce(&mut dyn Backend) -> T) -> Result<T, Error> {
        Ok(f(self.shared.lock()?.engine.backend().as_mut()))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake_thread();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.shared.thread_running.store(false, Ordering::Release);
    }
}

/// Longest sleep of the event-driven thread when the backend has no readiness fd (the
/// in-memory wire): frames are then noticed this late at worst.
const POLL_WITHOUT_FD: Duration = Duration::from_micros(50);
/// Longest sleep otherwise, so a stop request is never missed for long.
const MAX_SLEEP: Duration = Duration::from_millis(100);

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
fn run(shared: &Shared, progress: Progress) {
    let _guard = FailOnPanic(shared);
    // A duplicate of the backend's fd, to sleep on without holding the lock.
    let readiness = match shared.core.lock() {
        Ok(mut core) => core
            .engine
            .backend()
            .readiness_fd()
            .map(|fd| fd.try_clone_to_owned()),
        Err(_) => return,
    };
    let readiness = match readiness.transpose() {
        Ok(fd) => fd,
        Err(error) => {
            shared.fail(error);
            return;
        }
    };
    while !shared.stop.load(Ordering::Acquire) {
        let next_timer = {
            let Ok(mut core) = shared.core.lock() else {
                shared.fail(io::Error::other("a thread panicked inside a verbs call"));
                return;
            };
            if let Err(error) = core.drive() {
                drop(core);
                shared.fail(error);
                return;
            }
            core.engine.poll_timeout()
        };
        match progress {
            Progress::BusyPoll => std::thread::yield_now(),
            _ => sleep(shared, readiness.as_ref(), next_timer),
        }
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
    let mut fds = vec![PollFd::new(&shared.wake, PollFlags::IN)];
    if let Some(fd) = readiness {
        fds.push(PollFd::from_borrowed_fd(fd.as_fd(), PollFlags::IN));
    }
    let _ = poll(&mut fds, Some(&timeout));
    if fds[0].revents().contains(PollFlags::IN) {
        let mut counter = [0u8; 8];
        let _ = rustix::io::read(&shared.wake, &mut counter);
    }
}
