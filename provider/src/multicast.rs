//! An interface's part in multicast, as the kernel plays it for rxe. Two things, both the
//! kernel's own (AF_XDP frames bypass its IP stack, but not its interfaces), both held by a
//! socket, so that the kernel undoes them when the socket closes, however the process ends:
//!
//! - **The MAC filter** ([`MacFilter`]): the group's MAC added to the interface's multicast
//!   list (`dev_mc_add`, what rxe does when a group gets its first QP), so a NIC that
//!   filters passes the group's frames up to our XDP program. An `AF_PACKET` socket's
//!   `PACKET_ADD_MEMBERSHIP` does exactly that; the socket has no protocol, so it receives
//!   nothing.
//! - **IP membership** ([`IpGroup`]): the host joined to the group on the interface, through
//!   a kernel UDP socket's `IP_ADD_MEMBERSHIP`. The kernel then does what it does for
//!   rdma_cm's join (`cma_igmp_send` → `ip_mc_inc_group`, the same call a socket's join
//!   makes): sends the IGMP reports, answers queries, adds the group's MAC to the filter;
//!   closing the socket leaves the group, and the kernel sends the leave. The socket is
//!   bound to no port and receives nothing (datagrams to UDP 4791 are ours, by XDP).
//!
//! Each works in the network namespace it was made in.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};

use rustix::net::{socket, sockopt, AddressFamily, SocketType};

/// MACs added to one interface's multicast list while this lives.
#[derive(Debug)]
pub struct MacFilter {
    socket: OwnedFd,
    ifindex: u32,
}

impl MacFilter {
    /// The filter of the interface `ifindex` in the calling thread's network namespace
    /// (an `AF_PACKET` socket: needs `CAP_NET_RAW`).
    pub fn new(ifindex: u32) -> io::Result<MacFilter> {
        Ok(MacFilter {
            socket: socket(AddressFamily::PACKET, SocketType::RAW, None)?,
            ifindex,
        })
    }

    /// Adds `mac` to the interface's multicast list; a MAC added twice is held twice.
    pub fn add(&self, mac: [u8; 6]) -> io::Result<()> {
        self.change(libc::PACKET_ADD_MEMBERSHIP, mac)
    }

    /// Undoes one [`add`](Self::add) of `mac` (no change if there was none).
    pub fn remove(&self, mac: [u8; 6]) -> io::Result<()> {
        self.change(libc::PACKET_DROP_MEMBERSHIP, mac)
    }

    fn change(&self, option: libc::c_int, mac: [u8; 6]) -> io::Result<()> {
        let mut address = [0; 8];
        address[..6].copy_from_slice(&mac);
        let request = libc::packet_mreq {
            mr_ifindex: i32::try_from(self.ifindex).map_err(|_| io::ErrorKind::InvalidInput)?,
            mr_type: libc::PACKET_MR_MULTICAST as u16,
            mr_alen: 6,
            mr_address: address,
        };
        // SAFETY: the socket is open; the option reads a `packet_mreq` of the size passed,
        // which lives across the call.
        let done = unsafe {
            libc::setsockopt(
                self.socket.as_raw_fd(),
                libc::SOL_PACKET,
                option,
                (&raw const request).cast(),
                std::mem::size_of::<libc::packet_mreq>() as libc::socklen_t,
            )
        };
        if done < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// The host's membership of one IPv4 group on one interface, held while this lives.
#[derive(Debug)]
pub struct IpGroup {
    /// Dropping it closes it, which leaves the group (`ip_mc_drop_socket`).
    _socket: OwnedFd,
}

impl IpGroup {
    /// Joins `group` on the interface `ifindex` (in the calling thread's namespace): the
    /// kernel sends the reports for it at once if the host was not a member yet.
    pub fn join(group: Ipv4Addr, ifindex: u32) -> io::Result<IpGroup> {
        let socket = socket(AddressFamily::INET, SocketType::DGRAM, None)?;
        sockopt::set_ip_add_membership_with_ifindex(
            &socket,
            &group,
            &Ipv4Addr::UNSPECIFIED,
            ifindex,
        )?;
        Ok(IpGroup { _socket: socket })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netns::{needs_root, veth, Netns};
    use std::fs;

    /// Whether `/proc/thread-self/net/igmp` lists `group` under the interface `ifindex`
    /// (groups are printed as the hex of the address's bytes read as a native-endian u32).
    fn kernel_lists(ifindex: u32, group: Ipv4Addr) -> bool {
        let table = fs::read_to_string("/proc/thread-self/net/igmp").unwrap();
        let wanted = format!("{:08X}", u32::from_ne_bytes(group.octets()));
        let mut current = None;
        table.lines().skip(1).any(|line| {
            if !line.starts_with('\t') {
                current = line.split_whitespace().next().and_then(|n| n.parse().ok());
                return false;
            }
            current == Some(ifindex) && line.split_whitespace().next() == Some(wanted.as_str())
        })
    }

    /// Whether `ip maddr show dev IFACE` in `ns` lists `mac` as a link-layer entry.
    fn filter_lists(ns: &Netns, interface: &str, mac: &str) -> bool {
        let output = ns.ip(&["maddr", "show", "dev", interface]).unwrap();
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .any(|line| line.split_whitespace().take(2).eq(["link", mac]))
    }

    /// In a namespace: a MAC added to a veth's filter is listed until removed or until the
    /// filter is dropped; a joined group is listed (with its MAC) while the membership
    /// lives.
    #[test]
    fn the_kernel_holds_what_we_add_while_we_hold_it() {
        if !needs_root("the_kernel_holds_what_we_add_while_we_hold_it") {
            return;
        }
        let a = Netns::create("roce-mcast-a").unwrap();
        let b = Netns::create("roce-mcast-b").unwrap();
        veth(
            (&a, "mca", "10.86.0.1/24"),
            (&b, "mcb", "10.86.0.2/24"),
            1500,
        )
        .unwrap();
        let ifindex = a.ifindex("mca").unwrap();
        let name = a.name.clone();
        std::thread::spawn(move || {
            crate::netns::enter(&name).unwrap();
            let filter = MacFilter::new(ifindex).unwrap();
            let mac = [0x01, 0x00, 0x5E, 0x2A, 0x11, 0x03];
            filter.add(mac).unwrap();
            let ns = Netns { name: name.clone() };
            assert!(filter_lists(&ns, "mca", "01:00:5e:2a:11:03"));
            filter.remove(mac).unwrap();
            assert!(!filter_lists(&ns, "mca", "01:00:5e:2a:11:03"));
            // Removing what is not there is no change, as the kernel answers it.
            filter.remove(mac).unwrap();
            // Closing the socket undoes what it added (a process that dies leaves nothing).
            filter.add(mac).unwrap();
            drop(filter);
            assert!(!filter_lists(&ns, "mca", "01:00:5e:2a:11:03"));

            let group = Ipv4Addr::new(239, 42, 17, 3);
            let membership = IpGroup::join(group, ifindex).unwrap();
            assert!(kernel_lists(ifindex, group));
            assert!(filter_lists(&ns, "mca", "01:00:5e:2a:11:03"));
            drop(membership);
            assert!(!kernel_lists(ifindex, group));
            let unicast = IpGroup::join(Ipv4Addr::new(10, 1, 2, 3), ifindex).unwrap_err();
            assert_eq!(unicast.raw_os_error(), Some(libc::EINVAL));
            std::mem::forget(ns); // `a` deletes it
        })
        .join()
        .unwrap();
    }
}
