//! What [`Context::open`](crate::Context::open) is asked for: the backend and what drives
//! the engine.

use std::os::fd::OwnedFd;
use std::time::Duration;

use roce_provider::backend::Backend;
use roce_provider::engine::Addressing;
use roce_provider::xdp::XdpMode;

/// How frames move for this context.
#[non_exhaustive]
pub enum BackendChoice {
    /// AF_XDP in native mode, else generic mode, else kernel UDP sockets; which one was
    /// taken, and why, is in [`Context::backend_kind`](crate::Context::backend_kind).
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
    /// A background thread that polls for [`OpenOptions::spin`] after its last work, then
    /// sleeps in poll(2) until a frame, a timer or a post.
    Events,
    /// No thread: a poll that finds its CQ short runs a round, as does a send to a QP with
    /// nothing outstanding; sends behind others wait for the next poll (or wait for an
    /// event, or [`Context::progress`](crate::Context::progress)). One thread per context.
    Caller,
}

/// How long an [`Events`](Progress::Events) thread keeps polling after its last work by
/// default: 50 µs with 4 CPUs or more, else 0. A reply that comes within the spin is taken
/// without a wake-up; but a spinning thread on a machine with no core to spare shares one
/// with a program thread that spins on memory (`ib_write_lat`), which then waits a
/// scheduler tick (4 ms measured) for the frame it spins for (`docs/performance.md`, "The
/// drop-in's progress engine").
fn default_spin() -> Duration {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    if cpus >= 4 {
        Duration::from_micros(50)
    } else {
        Duration::ZERO
    }
}

/// How long the connection manager waits for answers, and how often it asks again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmTiming {
    /// The response time we announce and assume of the peer, as an exponent: 4.096 µs ×
    /// 2^n (at most 31). A REQ or DREQ is resent after twice the packet lifetime (about
    /// 2.1 s) plus this. Default 20 (about 4.3 s), the kernel's `CMA_CM_RESPONSE_TIMEOUT`.
    pub response_timeout: u8,
    /// Resends of an unanswered REQ, REP or DREQ before the peer is given up
    /// (`UNREACHABLE`, or `DISCONNECTED` for a DREQ), at most 15. Default 15, the kernel's
    /// `CMA_MAX_CM_RETRIES`.
    pub max_retries: u8,
}

impl Default for CmTiming {
    fn default() -> Self {
        CmTiming {
            response_timeout: 20,
            max_retries: 15,
        }
    }
}

/// Frames dropped on purpose: the provider's seeded `FaultInjector` loses each frame we
/// send with this probability. Only sent frames: the injector sits where frames leave, and
/// giving both ends a loss covers both directions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FrameLoss {
    /// Probability a frame is dropped, 0 to 1.
    pub probability: f64,
    /// Seed of the choices, so that a run can be repeated.
    pub seed: u64,
}

/// Options of [`Context::open`](crate::Context::open).
pub struct OpenOptions {
    /// How frames move.
    pub backend: BackendChoice,
    /// What drives the engine.
    pub progress: Progress,
    /// How long an [`Events`](Progress::Events) thread keeps polling the backend and the
    /// posted work after its last work before it sleeps: longer spends more CPU while
    /// idle, shorter pays a thread wake-up (several µs) for a frame or post that comes
    /// later. Zero sleeps at once; the default is 50 µs with 4 CPUs or more, else 0.
    pub spin: Duration,
    /// Seed of the memory keys; `None` takes it from the OS (use a seed only in tests).
    pub seed: Option<[u8; 32]>,
    /// Write every frame sent and received to this pcap file.
    pub pcap: Option<std::path::PathBuf>,
    /// Drop this share of the frames we send (fault injection for tests; the pcap file
    /// records only the frames that were sent).
    pub loss: Option<FrameLoss>,
    /// The eventfd [`Context::async_fd`](crate::Context::async_fd) is to be (a C ABI hands
    /// out its fd before the engine starts); `None` makes a fresh one.
    pub async_fd: Option<OwnedFd>,
    /// The connection manager's timeouts and retries (the kernel's by default; shorter
    /// ones let a test see an unreachable peer quickly).
    pub cm_timing: CmTiming,
    /// Bind only this receive queue of the interface (AF_XDP only): an engine of its own,
    /// beside the engines of the other queues, each opened with its own `queue` (one
    /// device, one engine per queue; their QPs are separate). Frames must arrive where
    /// their QP's engine is: on veth, the peer receives on the queue we send from, so
    /// engines on queue k of both ends talk through queue k; on a NIC, steer each flow to
    /// its queue (`ethtool -N`). `None` (the default): every queue, one engine.
    pub queue: Option<u32>,
    /// How the device takes part in congestion control (ECN, CNPs, DCQCN); mlx5's
    /// defaults, DCQCN on.
    pub congestion: roce_transport::congestion::CongestionConfig,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            backend: BackendChoice::Auto,
            progress: Progress::Events,
            spin: default_spin(),
            seed: None,
            pcap: None,
            loss: None,
            async_fd: None,
            cm_timing: CmTiming::default(),
            queue: None,
            congestion: Default::default(),
        }
    }
}
