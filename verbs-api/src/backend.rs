//! Backend selection: which backend carries a context's frames, and where its neighbours'
//! MACs come from; and, on a device several processes share, the claim of this process's
//! part of it ([`claim`]).

use std::collections::HashMap;
use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use roce_provider::afxdp::AfXdpBackend;
use roce_provider::backend::Backend;
use roce_provider::capture::PcapRecorder;
use roce_provider::engine::Addressing;
use roce_provider::fault::FaultInjector;
use roce_provider::switch::{switch_program, SwitchBackend, SwitchClient, SwitchStats};
use roce_provider::udp::UdpBackend;
use roce_provider::xdp::XdpMode;
use roce_transport::sim::LinkConfig;

use crate::device::Device;
use crate::error::Error;
use crate::options::{BackendChoice, FrameLoss};
use crate::shared::Shared;

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
    /// AF_XDP through the device's switch, which every process using the device shares
    /// (`roce_provider::switch`): the process holds the sockets itself while it is alone
    /// on the device, its frames go through the switch otherwise.
    Switch(SwitchLink),
}

/// A context's link to its device's switch. It does not keep the device open: once the
/// context's engine is gone, the link is too (every call answers as if detached).
#[derive(Debug, Clone)]
pub struct SwitchLink(Weak<SwitchClient>);

impl PartialEq for SwitchLink {
    /// The same link (the same engine).
    fn eq(&self, other: &SwitchLink) -> bool {
        Weak::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SwitchLink {}

impl SwitchLink {
    fn client(&self) -> io::Result<Arc<SwitchClient>> {
        self.0
            .upgrade()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
    }

    /// Whether this process holds the device's AF_XDP sockets itself now (alone on it).
    pub fn is_direct(&self) -> bool {
        self.client().is_ok_and(|client| client.is_direct())
    }

    /// The switch's counters and this process's (`None` before the first QP or listener,
    /// or once the switch or the context is gone).
    pub fn stats(&self) -> Option<SwitchStats> {
        self.client().ok()?.stats()
    }

    /// Whether the switch died (every QP failed, `IBV_EVENT_DEVICE_FATAL`).
    pub fn is_lost(&self) -> bool {
        self.client().is_ok_and(|client| client.is_lost())
    }

    /// Attaches; this process's block.
    fn claim(&self) -> io::Result<u8> {
        self.client()?.claim()
    }

    /// Asks the switch for a service's requests (`EADDRINUSE`: another process has it).
    pub(crate) fn listen(&self, service_id: u64) -> io::Result<()> {
        self.client()?.listen(service_id)
    }

    /// Gives a service's requests up.
    pub(crate) fn unlisten(&self, service_id: u64) -> io::Result<()> {
        self.client()?.unlisten(service_id)
    }
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

impl BackendKind {
    pub(crate) fn neighbours(&self) -> Neighbours {
        match self {
            BackendKind::AfXdp(_) => Neighbours::Kernel,
            BackendKind::Udp { .. } => Neighbours::NotNeeded,
            BackendKind::Custom => Neighbours::Static,
            BackendKind::Switch(_) => Neighbours::Kernel,
        }
    }

    /// The switch link, for a context on a shared device.
    pub fn switch(&self) -> Option<&SwitchLink> {
        match self {
            BackendKind::Switch(link) => Some(link),
            _ => None,
        }
    }
}

/// Before this process's first QP or CM listener on a device its switch shares: attaches
/// to the switch (starting one if none runs; at once if attached already) and takes this
/// process's block of QP numbers and CM IDs. Nothing for other backends. A program that
/// only queries a device never gets here, and never waits for a switch.
pub(crate) fn claim(shared: &Shared) -> Result<(), Error> {
    let Some(link) = shared.kind.switch() else {
        return Ok(());
    };
    let slot = link.claim()?;
    // Refused once the first QP exists: the block was set by the claim that preceded it.
    shared.lock()?.endpoint().set_id_block(slot);
    Ok(())
}

/// The `roce` executable that starts switches, unless `ROCE_SWITCH=0` asks for the
/// device to be this process's alone (AF_XDP opened directly, as before switches: a second
/// process then cannot have it), or no such executable is found, or we are not root (no
/// AF_XDP).
fn switch_to_use() -> Option<PathBuf> {
    let disabled = std::env::var("ROCE_SWITCH")
        .is_ok_and(|value| matches!(value.as_str(), "0" | "off" | "no"));
    if disabled || !rustix::process::geteuid().is_root() {
        return None;
    }
    switch_program()
}

/// A backend opened on `device` as `choice` says, recording to `pcap` if given and losing
/// frames as `loss` says, with who we are on the link.
pub(crate) fn open(
    device: &Device,
    choice: BackendChoice,
    pcap: Option<&Path>,
    loss: Option<FrameLoss>,
    queue: Option<u32>,
) -> Result<(Box<dyn Backend>, Addressing, BackendKind), Error> {
    // IPv4-mapped GIDs leave from the first IPv4 address; without one, only IPv6 GIDs
    // (and no UDP sockets, which carry IPv4 here).
    let ip = device.ipv4().unwrap_or(Ipv4Addr::UNSPECIFIED);
    let needs_ipv4 =
        || Error::Unsupported("kernel UDP sockets on a device without an IPv4 address");
    let addressing = Addressing {
        mac: device.mac,
        ip,
        neighbours: HashMap::new(),
    };
    // AF_XDP goes through the device's switch (the mode, if given, is the one this
    // process's own sockets take while the switch lends it the device); a context of one
    // receive queue's own opens that queue itself.
    let switched = match (&choice, queue) {
        (BackendChoice::Auto, None) => Some(None),
        (BackendChoice::AfXdp(mode), None) => Some(Some(*mode)),
        _ => None,
    };
    let switch = switched.and_then(|mode| Some((mode, switch_to_use()?)));
    let one_queue = || Error::Unsupported("a receive queue of its own, without AF_XDP");
    let (backend, addressing, kind): (Box<dyn Backend>, _, _) = match (choice, switch) {
        (_, Some((mode, program))) => {
            let client = SwitchClient::new(&device.name, device.ifindex, mode, Some(program))?;
            (
                Box::new(SwitchBackend::new(Arc::clone(&client))),
                addressing,
                BackendKind::Switch(SwitchLink(Arc::downgrade(&client))),
            )
        }
        (choice, None) => match choice {
            BackendChoice::AfXdp(mode) => (
                Box::new(open_afxdp_in(device, mode, queue)?),
                addressing,
                BackendKind::AfXdp(mode),
            ),
            BackendChoice::Udp | BackendChoice::Custom(..) if queue.is_some() => {
                return Err(one_queue())
            }
            BackendChoice::Udp if ip.is_unspecified() => return Err(needs_ipv4()),
            BackendChoice::Udp => (
                Box::new(UdpBackend::bind(ip, device.mac)?),
                addressing,
                BackendKind::Udp { fallback: None },
            ),
            BackendChoice::Auto => match open_afxdp(device, queue) {
                Ok((backend, mode)) => (Box::new(backend), addressing, BackendKind::AfXdp(mode)),
                Err(_) if queue.is_some() => return Err(one_queue()),
                Err(_) if ip.is_unspecified() => return Err(needs_ipv4()),
                Err(error) => (
                    Box::new(UdpBackend::bind(ip, device.mac)?),
                    addressing,
                    BackendKind::Udp {
                        fallback: Some(error.to_string()),
                    },
                ),
            },
            BackendChoice::Custom(backend, addressing) => {
                (backend, addressing, BackendKind::Custom)
            }
        },
    };
    let backend: Box<dyn Backend> = match pcap {
        Some(path) => Box::new(PcapRecorder::create(backend, path).map_err(io::Error::other)?),
        None => backend,
    };
    // Outside the recorder, so that the pcap shows what went on the link.
    let backend: Box<dyn Backend> = match loss {
        Some(loss) => {
            let faults = LinkConfig {
                loss: loss.probability,
                ..LinkConfig::default()
            };
            Box::new(FaultInjector::new(backend, faults, loss.seed))
        }
        None => backend,
    };
    Ok((backend, addressing, kind))
}

/// AF_XDP in native mode, else in generic mode, on every queue or on `queue` alone.
fn open_afxdp(device: &Device, queue: Option<u32>) -> io::Result<(AfXdpBackend, XdpMode)> {
    open_afxdp_in(device, XdpMode::Native, queue)
        .map(|backend| (backend, XdpMode::Native))
        .or_else(|_| {
            open_afxdp_in(device, XdpMode::Generic, queue)
                .map(|backend| (backend, XdpMode::Generic))
        })
}

fn open_afxdp_in(device: &Device, mode: XdpMode, queue: Option<u32>) -> io::Result<AfXdpBackend> {
    match queue {
        Some(queue) => AfXdpBackend::open_queue(&device.name, mode, queue),
        None => AfXdpBackend::open(&device.name, mode),
    }
}
