//! Backend selection: which backend carries a context's frames, and where its neighbours'
//! MACs come from.

use std::collections::HashMap;
use std::io;
use std::net::Ipv4Addr;
use std::path::Path;

use roce_provider::afxdp::AfXdpBackend;
use roce_provider::backend::Backend;
use roce_provider::capture::PcapRecorder;
use roce_provider::engine::Addressing;
use roce_provider::fault::FaultInjector;
use roce_provider::udp::UdpBackend;
use roce_provider::xdp::XdpMode;
use roce_transport::sim::LinkConfig;

use crate::device::Device;
use crate::error::Error;
use crate::options::{BackendChoice, FrameLoss};

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

impl BackendKind {
    pub(crate) fn neighbours(&self) -> Neighbours {
        match self {
            BackendKind::AfXdp(_) => Neighbours::Kernel,
            BackendKind::Udp { .. } => Neighbours::NotNeeded,
            BackendKind::Custom => Neighbours::Static,
        }
    }
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
    let one_queue = || Error::Unsupported("a receive queue of its own, without AF_XDP");
    let (backend, addressing, kind): (Box<dyn Backend>, _, _) = match choice {
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
        BackendChoice::Custom(backend, addressing) => (backend, addressing, BackendKind::Custom),
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
