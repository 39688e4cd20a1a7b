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
    /// No thread: posting and polling a CQ drive the engine (one thread per context).
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
    /// The eventfd [`Context::async_fd`](crate::Context::async_fd) is to be (a C ABI hands
    /// out its fd before the engine starts); `None` makes a fresh one.
    pub async_fd: Option<OwnedFd>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            backend: BackendChoice::Auto,
            progress: Progress::Events,
            spin: default_spin(),
            seed: None,
            pcap: None,
            async_fd: None,
        }
    }
}
