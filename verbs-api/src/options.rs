//! What [`Context::open`](crate::Context::open) is asked for: the backend and what drives
//! the engine.

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
    /// A background thread that sleeps in poll(2) until a frame, a timer or a post.
    Events,
    /// No thread: posting and polling a CQ drive the engine (one thread per context).
    Caller,
}

/// Options of [`Context::open`](crate::Context::open).
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
