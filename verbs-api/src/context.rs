//! An open device (`ibv_open_device`): the public face over the shared state, and the
//! calls that make objects from it.
//!
//! One device, one engine per process: every context opened on a device's interface in
//! this process (the same network namespace and interface) drives the one engine the first
//! opened, as every `ibv_context` of an rxe device reaches the one device. So QP numbers
//! are unique on the device and the QPs of two contexts reach each other through the
//! endpoint's loopback, as rdma-core's tests need (they open a context per side); a second
//! engine could only fall back to UDP sockets beside the first's AF_XDP socket and never
//! see its own device's frames. Each context keeps its own async-event queue and fd.

use std::io;
use std::net::Ipv6Addr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use roce_provider::backend::Backend;
use roce_provider::engine::{Engine, EngineStats};
use roce_transport::cm::CmConfig;
use roce_transport::endpoint::AsyncEvent;
use roce_transport::qp_state::PathMtu;
use roce_transport::Endpoint;

use crate::backend::{self, BackendKind};
use crate::channel::CompChannel;
use crate::cq::Cq;
use crate::device::{Device, PortAttr, PortState};
use crate::engine_thread;
use crate::error::Error;
use crate::groups::Memberships;
use crate::mr::Pd;
use crate::options::{BackendChoice, CmTiming, OpenOptions, Progress};
use crate::queues::EventQueue;
use crate::shared::Shared;
use crate::wait;
use crate::xrc::Xrcd;

/// An open device.
///
/// Every object made from it ([`Pd`], [`Cq`], [`Qp`](crate::Qp), ...) keeps the device open;
/// dropping the last context of the device stops its background thread, after which
/// polling a CQ drives the engine instead.
pub struct Context {
    engine: Arc<DeviceEngine>,
    /// This context's async events (every event of the device, see `async_events`).
    events: Arc<EventQueue<AsyncEvent>>,
}

/// The engine of a device and the thread that drives it, shared by the device's contexts.
struct DeviceEngine {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for DeviceEngine {
    fn drop(&mut self) {
        self.shared.request_stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.shared.set_thread_running(false);
    }
}

/// Which interface an engine serves: its network namespace (the inode of the opener's),
/// name and index, and its receive queue if it has one of its own.
type EngineKey = (u64, String, u32, Option<u32>);

/// The engines of the devices open on their own interfaces in this process; the last
/// context of a device drops its engine.
static ENGINES: Mutex<Vec<(EngineKey, Weak<DeviceEngine>)>> = Mutex::new(Vec::new());

impl Context {
    /// Opens `device` (in this thread's network namespace).
    ///
    /// A device already open in this process on its interface ([`BackendChoice::Auto`],
    /// [`AfXdp`](BackendChoice::AfXdp) or [`Udp`](BackendChoice::Udp)) is not opened again:
    /// the new context drives the same engine (one QP number space, one loopback), and the
    /// options that shape the engine (backend, progress, spin, seed, pcap, loss, CM timing)
    /// are those of the first open; `async_fd` is this context's own. A
    /// [`Custom`](BackendChoice::Custom) backend always gets an engine of its own.
    pub fn open(device: &Device, mut options: OpenOptions) -> Result<Context, Error> {
        let events = Arc::new(match options.async_fd.take() {
            Some(fd) => EventQueue::with_fd(fd),
            None => EventQueue::new()?,
        });
        let engine = if matches!(options.backend, BackendChoice::Custom(..)) {
            Arc::new(DeviceEngine::start(device, options)?)
        } else {
            let netns = std::fs::metadata("/proc/thread-self/ns/net")?.ino();
            let key = (netns, device.name.clone(), device.ifindex, options.queue);
            // Held while a first open starts the engine, so a racing open waits and shares it.
            let mut engines = ENGINES.lock().map_err(|_| Error::Poisoned)?;
            engines.retain(|(_, engine)| engine.strong_count() > 0);
            let open = engines
                .iter()
                .find(|(open, _)| *open == key)
                .and_then(|(_, engine)| engine.upgrade());
            match open {
                Some(engine) => engine,
                None => {
                    let engine = Arc::new(DeviceEngine::start(device, options)?);
                    engines.push((key, Arc::downgrade(&engine)));
                    engine
                }
            }
        };
        engine.shared.async_events.subscribe(&events);
        Ok(Context { engine, events })
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.engine.shared
    }

    /// The device this context drives.
    pub fn device(&self) -> &Device {
        &self.shared().device
    }

    /// `ibv_query_port` of the one port, its state as the engine thread last saw the
    /// interface (the state [`AsyncEvent::PortActive`] and [`AsyncEvent::PortError`]
    /// report; a caller-driven context has no thread and keeps the state it opened with).
    pub fn query_port(&self) -> PortAttr {
        let state = if self.shared().port_up() {
            PortState::Active
        } else {
            PortState::Down
        };
        PortAttr {
            state,
            ..self.shared().device.query_port()
        }
    }

    /// Which backend carries the frames.
    pub fn backend_kind(&self) -> &BackendKind {
        &self.shared().kind
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&self) -> Result<Pd, Error> {
        Pd::new(self.shared())
    }

    /// Opens a new XRC domain (`ibv_open_xrcd`).
    pub fn open_xrcd(&self) -> Result<Xrcd, Error> {
        Xrcd::new(self.shared())
    }

    /// Creates a completion channel (`ibv_create_comp_channel`).
    pub fn create_comp_channel(&self) -> Result<CompChannel, Error> {
        CompChannel::new(self.shared())
    }

    /// Creates a CQ of `depth` entries whose events go to `channel` (`ibv_create_cq`).
    pub fn create_cq(&self, depth: usize, channel: Option<&CompChannel>) -> Result<Cq, Error> {
        Cq::new(self.shared(), depth, channel)
    }

    /// With [`Progress::Caller`], one round of the engine: what a program calls while it
    /// waits on something other than a CQ (memory a peer WRITEs, a socket), so that the
    /// peer's traffic is still answered. With a background thread it does nothing.
    pub fn progress(&self) -> Result<(), Error> {
        if self.shared().caller_drives() {
            let mut core = self.shared().lock()?;
            self.shared().drive(&mut core)?;
        }
        Ok(())
    }

    /// Waits for the next async event (`ibv_get_async_event`): `None` waits for ever; a
    /// timeout gives [`Error::TimedOut`]. Events are taken once, oldest first; there is
    /// nothing to acknowledge.
    pub fn get_async_event(&self, timeout: Option<Duration>) -> Result<AsyncEvent, Error> {
        wait::next_event(self.shared(), &self.events, timeout)
    }

    /// Takes the oldest async event if one waits, without blocking.
    pub fn try_get_async_event(&self) -> Result<Option<AsyncEvent>, Error> {
        if self.shared().caller_drives() {
            let mut core = self.shared().lock()?;
            self.shared().drive(&mut core)?;
        }
        self.shared().check_running()?;
        Ok(self.events.pop())
    }

    /// An eventfd that polls readable while async events wait (`ibv_context`'s
    /// `async_fd`; [`OpenOptions::async_fd`] if given): the engine signals it as it queues
    /// an event. Epoll it, then take them with
    /// [`try_get_async_event`](Self::try_get_async_event). With [`Progress::Caller`] events
    /// arrive only while something drives the engine.
    pub fn async_fd(&self) -> BorrowedFd<'_> {
        self.events.as_fd()
    }

    /// Tells a context over a caller's backend ([`BackendChoice::Custom`]) the MAC of an
    /// IPv6 neighbour (AF_XDP contexts ask the kernel).
    ///
    /// [`BackendChoice::Custom`]: crate::BackendChoice::Custom
    pub fn add_neighbour6(&self, ip: Ipv6Addr, mac: [u8; 6]) -> Result<(), Error> {
        self.shared().add_neighbour6(ip, mac)
    }

    /// The engine's frame counters.
    pub fn stats(&self) -> Result<EngineStats, Error> {
        Ok(self.shared().lock()?.engine.stats)
    }

    /// Runs `f` on the backend, e.g. to flush a pcap recorder.
    pub fn with_backend<T>(&self, f: impl FnOnce(&mut dyn Backend) -> T) -> Result<T, Error> {
        Ok(f(self.shared().lock()?.engine.backend().as_mut()))
    }
}

/// The CM's settings for `device`: the kernel's defaults, the CA GUID the EUI-64 of the MAC
/// (as rxe's node GUID), a seed of its own drawn from the context's, and `timing`.
fn cm_config(device: &Device, seed: [u8; 32], port_mtu: PathMtu, timing: CmTiming) -> CmConfig {
    let mac = device.mac;
    let guid = [
        mac[0] ^ 2,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ];
    let mut cm_seed = seed;
    cm_seed.reverse();
    cm_seed[0] ^= 0xC3;
    CmConfig {
        local_ca_guid: u64::from_be_bytes(guid),
        seed: cm_seed,
        max_path_mtu: port_mtu,
        cm_response_timeout: timing.response_timeout.min(31),
        max_cm_retries: timing.max_retries.min(15),
        ..CmConfig::default()
    }
}

impl DeviceEngine {
    /// Opens `device`'s backend and starts its engine as `options` say.
    fn start(device: &Device, options: OpenOptions) -> Result<DeviceEngine, Error> {
        let (backend, addressing, kind) = backend::open(
            device,
            options.backend,
            options.pcap.as_deref(),
            options.loss,
            options.queue,
        )?;
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
        let port_mtu = device.query_port().active_mtu;
        endpoint.set_port_mtu(port_mtu);
        endpoint.enable_cm(cm_config(device, seed, port_mtu, options.cm_timing));
        endpoint.set_congestion(std::time::Instant::now(), options.congestion);
        let progress = options.progress;
        tracing::debug!(device = %device.name, backend = ?kind, ?progress, "opened");
        let mut engine = Engine::new(endpoint, backend, addressing);
        engine.set_gid_table(device.gids.clone());
        let multicast = Memberships::new(device, &kind)?;
        let shared = Arc::new(Shared::new(engine, device.clone(), kind)?);
        shared.lock()?.multicast = multicast;
        let thread = match options.progress {
            Progress::Caller => None,
            progress => Some(engine_thread::spawn(&shared, progress, options.spin)?),
        };
        Ok(DeviceEngine { shared, thread })
    }
}
