//! Devices (`ibv_get_device_list`): one per network interface we can drive, with rxe's GID
//! table, and what `ibv_query_device`/`ibv_query_port` report about it.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::process::Command;

use roce_transport::qp_state::PathMtu;
use roce_transport::{DeviceLimits, LIMITS};

/// A 16-byte GID (an IPv6 address on RoCEv2).
pub type Gid = [u8; 16];

/// A network interface seen as an RDMA device with one port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// The interface name, which is also the device name (`-d` of the tools).
    pub name: String,
    /// The interface's index (the scope of its link-local addresses).
    pub ifindex: u32,
    /// The interface's MAC.
    pub mac: [u8; 6],
    /// The interface's MTU in bytes.
    pub netdev_mtu: u32,
    /// Whether the interface is up.
    pub up: bool,
    /// The GID table, as the kernel's GID cache fills rxe's when the device is added
    /// (`roce_gid_mgmt.c`: the default GID, then `enum_netdev_ipv4_ips`, then
    /// `enum_netdev_ipv6_ips`, an address already in the table not added again): index 0 the
    /// link-local GID made from the MAC, then the IPv4-mapped GID of each IPv4 address (so
    /// index 1 on a one-address interface), then each IPv6 address in the interface's order
    /// (larger scope first, the newest first within a scope), the IPv6 address as the GID.
    pub gids: Vec<Gid>,
}

/// What `ibv_query_device` reports: the node GUID and the limits this software device
/// enforces (the transport's [`LIMITS`], which creating, modifying and posting check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAttr {
    /// The node GUID, EUI-64 from the MAC (as rxe).
    pub node_guid: u64,
    /// The limits, one definition with the transport's.
    pub limits: DeviceLimits,
}

/// Whether a port can carry traffic (`ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// The interface is down.
    Down,
    /// The interface is up.
    Active,
}

/// What `ibv_query_port` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// Up or down.
    pub state: PortState,
    /// The largest path MTU that fits the interface's MTU, as rxe computes it.
    pub active_mtu: PathMtu,
    /// The largest path MTU there is.
    pub max_mtu: PathMtu,
    /// Entries in the GID table: rxe's 1024 ([`DeviceLimits::gid_tbl_len`]), of which those
    /// past the interface's addresses are empty.
    pub gid_tbl_len: usize,
}

/// What rxe subtracts from the interface MTU before picking the path MTU
/// (`RXE_MAX_HDR_LENGTH` in `eth_mtu_int_to_enum`): room for every header and the ICRC.
const HEADERS: u32 = 80;

impl Device {
    /// The device of the interface `name`, in the calling thread's network namespace
    /// (asked through ip(8), whose process inherits the thread's namespace: /sys would show
    /// the namespace sysfs was mounted in).
    pub fn by_name(name: &str) -> io::Result<Device> {
        let link = ip(&["-o", "link", "show", "dev", name])?;
        let (mac, netdev_mtu, up) = parse_link(&link)
            .ok_or_else(|| io::Error::other(format!("unexpected ip(8) output: {link:?}")))?;
        let ifindex = link
            .split(':')
            .next()
            .and_then(|index| index.trim().parse().ok())
            .ok_or_else(|| io::Error::other(format!("unexpected ip(8) output: {link:?}")))?;
        let mut gids = vec![link_local_gid(mac)];
        gids.extend(
            ipv4_addresses(name)?
                .iter()
                .map(|ip| ip.to_ipv6_mapped().octets()),
        );
        for ip in ipv6_addresses(name)? {
            if !gids.contains(&ip.octets()) {
                gids.push(ip.octets());
            }
        }
        Ok(Device {
            name: name.to_owned(),
            ifindex,
            mac,
            netdev_mtu,
            up,
            gids,
        })
    }

    /// A device with no interface behind it, for a backend of the caller's
    /// ([`BackendChoice::Custom`](crate::BackendChoice::Custom), such as the in-memory
    /// wire): station `ip` with `mac`, up, MTU 9000, its link-local and IPv4 GIDs.
    pub fn in_memory(mac: [u8; 6], ip: Ipv4Addr) -> Device {
        Device {
            name: "mem".into(),
            ifindex: 1,
            mac,
            netdev_mtu: 9000,
            up: true,
            gids: vec![link_local_gid(mac), ip.to_ipv6_mapped().octets()],
        }
    }

    /// The GID at `index`.
    pub fn gid(&self, index: usize) -> Option<Gid> {
        self.gids.get(index).copied()
    }

    /// The first IPv4 address (the one our packets leave from).
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        self.gids
            .iter()
            .find_map(|gid| Ipv6Addr::from(*gid).to_ipv4_mapped())
    }

    /// `ibv_query_device`.
    pub fn query(&self) -> DeviceAttr {
        let m = self.mac;
        let eui64 = [m[0] ^ 2, m[1], m[2], 0xFF, 0xFE, m[3], m[4], m[5]];
        DeviceAttr {
            node_guid: u64::from_be_bytes(eui64),
            limits: LIMITS,
        }
    }

    /// `ibv_query_port` of the one port.
    pub fn query_port(&self) -> PortAttr {
        let payload = self.netdev_mtu.saturating_sub(HEADERS);
        let active_mtu = [
            PathMtu::Mtu4096,
            PathMtu::Mtu2048,
            PathMtu::Mtu1024,
            PathMtu::Mtu512,
        ]
        .into_iter()
        .find(|mtu| mtu.bytes() as u32 <= payload)
        .unwrap_or(PathMtu::Mtu256);
        PortAttr {
            state: if self.up {
                PortState::Active
            } else {
                PortState::Down
            },
            active_mtu,
            max_mtu: PathMtu::Mtu4096,
            gid_tbl_len: self.gids.len().max(LIMITS.gid_tbl_len as usize),
        }
    }
}

/// Every interface but loopback in the calling thread's network namespace, sorted by
/// name, as `ibv_get_device_list` (the first is the tools' default device, as rdma-core
/// takes the first).
pub fn devices() -> io::Result<Vec<Device>> {
    let links = ip(&["-o", "link", "show"])?;
    let mut names: Vec<&str> = links
        .lines()
        .filter_map(|line| line.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name))
        .filter(|name| *name != "lo")
        .collect();
    names.sort_unstable();
    names.iter().map(|name| Device::by_name(name)).collect()
}

/// Runs ip(8) and returns its output, or its error message as the error.
fn ip(args: &[&str]) -> io::Result<String> {
    let output = Command::new("ip").args(args).output()?;
    if !output.status.success() {
        let why = String::from_utf8_lossy(&output.stderr);
        return Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            why.trim()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// MAC, MTU and whether it is up, from one line of `ip -o link show`.
fn parse_link(line: &str) -> Option<([u8; 6], u32, bool)> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |key: &str| {
        let at = words.iter().position(|word| *word == key)?;
        words.get(at + 1).copied()
    };
    let mtu = after("mtu")?.parse().ok()?;
    // veth and tap say UP; loopback and some virtual devices UNKNOWN while working.
    let up = matches!(after("state")?, "UP" | "UNKNOWN");
    let mac = words
        .iter()
        .position(|word| word.starts_with("link/"))
        .and_then(|at| words.get(at + 1))
        .and_then(|mac| parse_mac(mac).ok())
        .unwrap_or([0; 6]);
    Some((mac, mtu, up))
}

/// The link-local IPv6 address made from a MAC (modified EUI-64), rxe's GID 0.
pub fn link_local_gid(mac: [u8; 6]) -> Gid {
    let m = mac;
    [
        0xFE,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        m[0] ^ 2,
        m[1],
        m[2],
        0xFF,
        0xFE,
        m[3],
        m[4],
        m[5],
    ]
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(text: &str) -> io::Result<[u8; 6]> {
    let bad = || io::Error::other(format!("bad MAC {text:?}"));
    let mut mac = [0u8; 6];
    let mut parts = text.trim().split(':');
    for byte in &mut mac {
        let part = parts.next().ok_or_else(bad)?;
        *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
    }
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok(mac)
}

/// The interface's IPv4 addresses, from iproute2 (the kernel has no file that lists them).
fn ipv4_addresses(interface: &str) -> io::Result<Vec<Ipv4Addr>> {
    let text = ip(&["-o", "-4", "addr", "show", "dev", interface])?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace().skip_while(|word| *word != "inet");
            words.nth(1)?.split('/').next()?.parse().ok()
        })
        .collect())
}

/// The interface's IPv6 addresses in the kernel's order for it (`ip -6 addr` walks the
/// interface's address list, as the GID cache does; /proc/net/if_inet6 is in hash order).
fn ipv6_addresses(interface: &str) -> io::Result<Vec<Ipv6Addr>> {
    Ok(parse_inet6(&ip(&[
        "-o", "-6", "addr", "show", "dev", interface,
    ])?))
}

/// The `inet6 ADDR/LEN` of each line of `ip -o -6 addr show` (none with IPv6 disabled).
fn parse_inet6(text: &str) -> Vec<Ipv6Addr> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace().skip_while(|word| *word != "inet6");
            words.nth(1)?.split('/').next()?.parse().ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_local_gid_is_modified_eui64() {
        let gid = link_local_gid([0x52, 0x54, 0, 0x88, 0, 0x11]);
        let ip: Ipv6Addr = "fe80::5054:ff:fe88:11".parse().unwrap();
        assert_eq!(gid, ip.octets());
    }

    #[test]
    fn ipv6_addresses_keep_the_interface_order() {
        let text = "2: ca    inet6 fd85::1/64 scope global nodad \\       valid_lft forever preferred_lft forever
2: ca    inet6 fe80::e877:b3ff:fea9:907e/64 scope link \\       valid_lft forever preferred_lft forever
";
        let ip = |s: &str| s.parse::<Ipv6Addr>().unwrap();
        assert_eq!(
            parse_inet6(text),
            vec![ip("fd85::1"), ip("fe80::e877:b3ff:fea9:907e")]
        );
        assert!(parse_inet6("").is_empty());
    }

    #[test]
    fn mac_parsing_rejects_junk() {
        assert_eq!(
            parse_mac("52:54:00:88:00:0b\n").unwrap(),
            [0x52, 0x54, 0, 0x88, 0, 0x0b]
        );
        for bad in [
            "",
            "52:54:00:88:00",
            "52:54:00:88:00:0b:01",
            "zz:54:00:88:00:0b",
        ] {
            assert!(parse_mac(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn active_mtu_follows_the_netdev_mtu_as_rxe() {
        let device = |netdev_mtu| Device {
            name: "x".into(),
            ifindex: 1,
            mac: [2, 0, 0, 0, 0, 1],
            netdev_mtu,
            up: true,
            gids: vec![],
        };
        // rxe: 1500 → 1024, 9000 → 4096; 4096 of payload needs more than 4096 of netdev.
        assert_eq!(device(1500).query_port().active_mtu, PathMtu::Mtu1024);
        assert_eq!(device(9000).query_port().active_mtu, PathMtu::Mtu4096);
        assert_eq!(device(4096).query_port().active_mtu, PathMtu::Mtu2048);
        assert_eq!(
            device(4096 + HEADERS).query_port().active_mtu,
            PathMtu::Mtu4096
        );
        assert_eq!(device(600).query_port().active_mtu, PathMtu::Mtu512);
        assert_eq!(device(300).query_port().active_mtu, PathMtu::Mtu256);
    }

    #[test]
    fn ip_link_lines_parse() {
        let veth = "7: xb@if8: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc noqueue state UP mode DEFAULT group default qlen 1000\\    link/ether 52:54:00:88:00:0b brd ff:ff:ff:ff:ff:ff link-netns a";
        assert_eq!(
            parse_link(veth),
            Some(([0x52, 0x54, 0, 0x88, 0, 0x0b], 9000, true))
        );
        let down = "3: eth1: <BROADCAST,MULTICAST> mtu 1500 qdisc noop state DOWN mode DEFAULT group default qlen 1000\\    link/ether 02:00:00:00:00:01 brd ff:ff:ff:ff:ff:ff";
        assert_eq!(parse_link(down), Some(([2, 0, 0, 0, 0, 1], 1500, false)));
        assert_eq!(parse_link("garbage"), None);
    }

    #[test]
    fn loopback_is_not_a_device() {
        let list = devices().expect("sysfs");
        assert!(list.iter().all(|device| device.name != "lo"));
        let lo = Device::by_name("lo").expect("lo exists");
        assert_eq!(lo.ifindex, 1);
        // GID 0 from the (all-zero) MAC, GID 1 the IPv4-mapped 127.0.0.1.
        assert_eq!(
            lo.gid(1),
            Some(Ipv4Addr::LOCALHOST.to_ipv6_mapped().octets())
        );
        assert_eq!(lo.ipv4(), Some(Ipv4Addr::LOCALHOST));
    }
}
