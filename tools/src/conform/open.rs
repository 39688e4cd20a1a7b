//! Opening the link towards the target: AF_XDP on the interface it is reached through, and
//! both stations' addresses.

use std::io;
use std::net::IpAddr;
use std::process::Command;
use std::time::Duration;

use roce_provider::afxdp::AfXdpBackend;
use roce_provider::backend::Backend;
use roce_provider::capture::PcapRecorder;
use roce_verbs::{devices, XdpMode};

use super::link::{Link, Station};
use super::target::{gid_of, Perftest, Service};

/// Opens AF_XDP on the interface towards the target, and learns both stations (a TCP
/// connection to `service`'s server says which address we leave from, and fills the ARP
/// entry of the target's MAC; the server sees a client that hung up and starts again).
pub fn open_link(
    target: &Perftest,
    service: Service,
    device: Option<&str>,
    pcap: Option<&std::path::Path>,
    wait: Duration,
) -> io::Result<Link> {
    let ours = target.local_address(service)?;
    link_between(ours, target.host, target.roce_addr, device, pcap, wait)
}

/// Opens AF_XDP on the interface with address `ours` (or `device`), towards `theirs`, whose
/// MAC the kernel's neighbour table must already hold (a TCP connection with it fills it);
/// the frames go to `roce_addr` instead of `theirs` when given (see [`Reach::roce_addr`](super::target::Reach::roce_addr)).
pub fn link_between(
    ours: IpAddr,
    theirs: IpAddr,
    roce_addr: Option<IpAddr>,
    device: Option<&str>,
    pcap: Option<&std::path::Path>,
    wait: Duration,
) -> io::Result<Link> {
    let device = devices()?
        .into_iter()
        .find(|d| match device {
            Some(name) => d.name == name,
            None => d.gids.contains(&gid_of(ours)),
        })
        .ok_or_else(|| io::Error::other(format!("no interface with address {ours}")))?;
    let their_mac = neighbour_mac(theirs, &device.name)?;
    let (ours, theirs) = match roce_addr {
        Some(roce_addr) => (our_roce_addr(&device, roce_addr)?, roce_addr),
        None => (ours, theirs),
    };
    let afxdp = AfXdpBackend::open(&device.name, XdpMode::Native)
        .or_else(|_| AfXdpBackend::open(&device.name, XdpMode::Generic))?;
    let backend: Box<dyn Backend> = match pcap {
        Some(path) => Box::new(PcapRecorder::create(afxdp, path).map_err(io::Error::other)?),
        None => Box::new(afxdp),
    };
    Ok(Link::new(
        backend,
        Station {
            mac: device.mac,
            ip: ours,
        },
        Station {
            mac: their_mac,
            ip: theirs,
        },
        wait,
    ))
}

/// The target's MAC from the kernel's ARP or IPv6 neighbour table (the TCP connection has
/// just filled it).
fn neighbour_mac(ip: IpAddr, interface: &str) -> io::Result<[u8; 6]> {
    let missing = || io::Error::other(format!("no neighbour entry for {ip} on {interface}"));
    if ip.is_ipv6() {
        // No /proc file for it: ip(8) asks over netlink, in this thread's namespace.
        let output = Command::new("ip")
            .args(["-6", "neigh", "show", &ip.to_string(), "dev", interface])
            .output()?;
        return String::from_utf8_lossy(&output.stdout)
            .lines()
            .find_map(|line| {
                let words: Vec<&str> = line.split_whitespace().collect();
                let at = words.iter().position(|word| *word == "lladdr")?;
                roce_verbs::device::parse_mac(words.get(at + 1)?).ok()
            })
            .ok_or_else(missing);
    }
    let table = std::fs::read_to_string("/proc/thread-self/net/arp")?;
    let wanted = ip.to_string();
    table
        .lines()
        .skip(1)
        .find_map(|line| {
            let columns: Vec<&str> = line.split_whitespace().collect();
            match columns[..] {
                [address, _, _, mac, _, dev] if address == wanted && dev == interface => {
                    roce_verbs::device::parse_mac(mac).ok()
                }
                _ => None,
            }
        })
        .ok_or_else(missing)
}

/// Our address on `device` of the kind of the target's RoCE address `theirs`: IPv4, IPv6
/// link-local (the GID our stack derives from the MAC, as the kernel does), or another IPv6.
fn our_roce_addr(device: &roce_verbs::Device, theirs: IpAddr) -> io::Result<IpAddr> {
    let ours = match theirs {
        IpAddr::V4(_) => device.ipv4().map(IpAddr::V4),
        IpAddr::V6(theirs) => device
            .gids
            .iter()
            .map(|gid| std::net::Ipv6Addr::from(*gid))
            .find(|gid| {
                gid.to_ipv4_mapped().is_none()
                    && gid.is_unicast_link_local() == theirs.is_unicast_link_local()
            })
            .map(IpAddr::V6),
    };
    ours.ok_or_else(|| {
        io::Error::other(format!(
            "no address of {}'s kind on {}",
            theirs, device.name
        ))
    })
}
