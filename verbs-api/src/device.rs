//! Devices (`ibv_get_device_list`): one per network interface we can drive, with rxe's GID
//! table, and what `ibv_query_device`/`ibv_query_port` report about it.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};

use roce_transport::qp_state::PathMtu;
use roce_transport::{DeviceLimits, LIMITS};

use crate::ifaddrs::{self, Interface};

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
    /// Entries in the GID table.
    pub gid_tbl_len: usize,
}

/// What rxe subtracts from the interface MTU before picking the path MTU
/// (`RXE_MAX_HDR_LENGTH` in `eth_mtu_int_to_enum`): room for every header and the ICRC.
const HEADERS: u32 = 80;

impl Device {
    /// The device of the interface `name`, in the calling thread's network namespace.
    pub fn by_name(name: &str) -> io::Result<Device> {
        let interface = ifaddrs::interfaces()?
            .into_iter()
            .find(|interface| interface.name == name)
            .ok_or_else(|| io::Error::other(format!("Device \"{name}\" does not exist.")))?;
        Device::of(interface)
    }

    /// The device of `interface`, with its GID table as rxe's.
    fn of(interface: Interface) -> io::Result<Device> {
        let netdev_mtu = ifaddrs::mtu(&interface.name)?;
        let mut gids = vec![link_local_gid(interface.mac)];
        gids.extend(interface.ipv4.iter().map(|ip| ip.to_ipv6_mapped().octets()));
        for ip in &interface.ipv6 {
            if !gids.contains(&ip.octets()) {
                gids.push(ip.octets());
            }
        }
        // rxe's rule for its port (netif_running and netif_carrier_ok): IFF_UP and
        // IFF_LOWER_UP. ip(8)'s `state UP`/`UNKNOWN` (operstate, what IFF_RUNNING reflects)
        // says the same but for dormant or testing links, and for the moment after a carrier
        // change that linkwatch has yet to apply: up to a second, in which a fresh veth
        // would be down (and the C tools would find no device).
        let up_and_carrier = (libc::IFF_UP | libc::IFF_LOWER_UP) as u32;
        let up = interface.flags & up_and_carrier == up_and_carrier;
        Ok(Device {
            name: interface.name,
            ifindex: interface.ifindex,
            mac: interface.mac,
            netdev_mtu,
            up,
            gids,
        })
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
            gid_tbl_len: self.gids.len(),
        }
    }
}

/// Every interface but loopback in the calling thread's network namespace, sorted by
/// name, as `ibv_get_device_list` (the first is the tools' default device, as rdma-core
/// takes the first).
pub fn devices() -> io::Result<Vec<Device>> {
    let mut interfaces = ifaddrs::interfaces()?;
    interfaces.retain(|interface| interface.name != "lo");
    interfaces.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    interfaces.into_iter().map(Device::of).collect()
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
    fn loopback_is_not_a_device() {
        let list = devices().expect("the interface list");
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
