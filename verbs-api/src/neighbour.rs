//! A neighbour's MAC from the kernel's table, asking the kernel to resolve it when missing.
//!
//! AF_XDP frames bypass the kernel's neighbour code, but the kernel still answers and sends
//! ARP on the same interface (our XDP program passes ARP through), so its table is the truth.

use std::fs;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::device::parse_mac;
use crate::error::Error;

/// How long the kernel gets to resolve an address (it retries ARP every second, 3 times).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(3);

/// The discard port: a datagram there makes the kernel resolve the address and is dropped
/// by the peer (at worst answered with an ICMP port unreachable).
const DISCARD_PORT: u16 = 9;

/// The MAC of `ip` on `interface`, resolving it through the kernel if needed.
pub(crate) fn resolve(ip: Ipv4Addr, interface: &str) -> Result<[u8; 6], Error> {
    if let Some(mac) = lookup(ip, interface)? {
        return Ok(mac);
    }
    // An empty datagram makes the kernel send ARP requests for the address.
    let socket = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))?;
    let _ = socket.send_to(&[], SocketAddrV4::new(ip, DISCARD_PORT));
    let deadline = Instant::now() + RESOLVE_TIMEOUT;
    while Instant::now() < deadline {
        if let Some(mac) = lookup(ip, interface)? {
            return Ok(mac);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(Error::NoNeighbour(ip))
}

/// The MAC of the IPv6 neighbour `ip` on `interface` (index `ifindex`), asking the kernel
/// to run neighbour discovery if needed.
pub(crate) fn resolve6(ip: Ipv6Addr, interface: &str, ifindex: u32) -> Result<[u8; 6], Error> {
    if let Some(mac) = lookup6(ip, interface)? {
        return Ok(mac);
    }
    let socket = UdpSocket::bind(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, 0, 0, 0))?;
    let scope = if ip.is_unicast_link_local() {
        ifindex
    } else {
        0
    };
    let _ = socket.send_to(&[], SocketAddrV6::new(ip, DISCARD_PORT, 0, scope));
    let deadline = Instant::now() + RESOLVE_TIMEOUT;
    while Instant::now() < deadline {
        if let Some(mac) = lookup6(ip, interface)? {
            return Ok(mac);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(Error::NoNeighbour6(ip))
}

/// A usable entry for `ip` on `interface` in the calling thread's IPv6 neighbour table
/// (there is no /proc file for it: ip(8) asks over netlink, in our namespace).
fn lookup6(ip: Ipv6Addr, interface: &str) -> io::Result<Option<[u8; 6]>> {
    let output = Command::new("ip")
        .args(["-6", "neigh", "show", &ip.to_string(), "dev", interface])
        .output()?;
    Ok(parse_neigh(&String::from_utf8_lossy(&output.stdout)))
}

/// `ADDR lladdr MAC STATE` lines of `ip -6 neigh show ADDR dev IFACE`; an entry still
/// being resolved, or that failed, has no usable MAC.
fn parse_neigh(text: &str) -> Option<[u8; 6]> {
    text.lines().find_map(|line| {
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = words.iter().position(|word| *word == "lladdr")?;
        let state = words.last()?;
        if matches!(*state, "INCOMPLETE" | "FAILED" | "NONE") {
            return None;
        }
        parse_mac(words.get(at + 1)?).ok()
    })
}

/// The complete entry of `ip` on `interface` in the calling thread's ARP table, if there
/// is one (/proc/net is the main thread's namespace, /proc/thread-self/net this thread's).
fn lookup(ip: Ipv4Addr, interface: &str) -> io::Result<Option<[u8; 6]>> {
    let table = fs::read_to_string("/proc/thread-self/net/arp")?;
    Ok(parse_arp_table(&table, ip, interface))
}

/// Columns: IP address, HW type, Flags, HW address, Mask, Device. Flags 0x2 = complete.
fn parse_arp_table(table: &str, ip: Ipv4Addr, interface: &str) -> Option<[u8; 6]> {
    let wanted = ip.to_string();
    table.lines().skip(1).find_map(|line| {
        let columns: Vec<&str> = line.split_whitespace().collect();
        let [address, _, flags, mac, _, device] = columns[..] else {
            return None;
        };
        let flags = u32::from_str_radix(flags.trim_start_matches("0x"), 16).ok()?;
        let complete = flags & 0x2 != 0;
        (address == wanted && device == interface && complete)
            .then(|| parse_mac(mac).ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
IP address       HW type     Flags       HW address            Mask     Device
10.88.0.11       0x1         0x2         52:54:00:88:00:11     *        host0
10.88.0.12       0x1         0x0         00:00:00:00:00:00     *        host0
10.0.0.2         0x1         0x2         aa:bb:cc:dd:ee:ff     *        veth1
";

    #[test]
    fn ipv6_neighbours_need_a_resolved_state() {
        let mac = [0x52, 0x54, 0, 0x88, 0, 0x11];
        assert_eq!(
            parse_neigh("fe80::5054:ff:fe88:11 lladdr 52:54:00:88:00:11 REACHABLE\n"),
            Some(mac)
        );
        assert_eq!(
            parse_neigh("fd00::2 lladdr 52:54:00:88:00:11 router STALE\n"),
            Some(mac)
        );
        assert_eq!(parse_neigh("fd00::2 INCOMPLETE\n"), None);
        assert_eq!(
            parse_neigh("fd00::2 lladdr 52:54:00:88:00:11 FAILED\n"),
            None
        );
        assert_eq!(parse_neigh(""), None);
    }

    #[test]
    fn only_complete_entries_of_the_interface_count() {
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(
            parse_arp_table(TABLE, ip("10.88.0.11"), "host0"),
            Some([0x52, 0x54, 0, 0x88, 0, 0x11])
        );
        // Incomplete (ARP pending or failed).
        assert_eq!(parse_arp_table(TABLE, ip("10.88.0.12"), "host0"), None);
        // Known, but on another interface.
        assert_eq!(parse_arp_table(TABLE, ip("10.0.0.2"), "host0"), None);
        assert_eq!(parse_arp_table(TABLE, ip("10.0.0.3"), "veth1"), None);
        assert_eq!(parse_arp_table("", ip("10.0.0.3"), "veth1"), None);
    }
}
