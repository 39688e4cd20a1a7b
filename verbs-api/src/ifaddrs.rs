//! The calling thread's network interfaces without spawning ip(8): getifaddrs(3) (one
//! rtnetlink dump from a socket the calling thread makes, so in its network namespace, where
//! /sys would show the namespace sysfs was mounted in) and the SIOCGIFMTU ioctl.

// The C calls and the list they return; each block says why it is sound.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::io;
use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr;

/// One interface: its link and its addresses, each family in the kernel's order for the
/// interface (the order of its address list, which `ip addr` and the GID cache walk too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Interface {
    pub name: String,
    pub ifindex: u32,
    /// Zero when the link has no 6-byte hardware address (tun, tunnels).
    pub mac: [u8; 6],
    /// `IFF_*` as the kernel reports them.
    pub flags: u32,
    pub ipv4: Vec<Ipv4Addr>,
    pub ipv6: Vec<Ipv6Addr>,
}

/// What one getifaddrs entry says, copied out of the list.
enum Entry {
    Link {
        name: String,
        flags: u32,
        ifindex: u32,
        mac: [u8; 6],
    },
    V4 {
        name: String,
        ip: Ipv4Addr,
    },
    V6 {
        name: String,
        ip: Ipv6Addr,
    },
}

/// Every interface of the calling thread's namespace, in the kernel's link order.
pub(crate) fn interfaces() -> io::Result<Vec<Interface>> {
    let entries = entries()?;
    let mut interfaces: Vec<Interface> = entries
        .iter()
        .filter_map(|entry| match entry {
            Entry::Link {
                name,
                flags,
                ifindex,
                mac,
            } => Some(Interface {
                name: name.clone(),
                ifindex: *ifindex,
                mac: *mac,
                flags: *flags,
                ipv4: Vec::new(),
                ipv6: Vec::new(),
            }),
            _ => None,
        })
        .collect();
    for entry in &entries {
        let (name, add): (&str, &dyn Fn(&mut Interface)) = match entry {
            Entry::Link { .. } => continue,
            Entry::V4 { name, ip } => (interface_of_label(name), &|i| i.ipv4.push(*ip)),
            Entry::V6 { name, ip } => (name, &|i| i.ipv6.push(*ip)),
        };
        if let Some(interface) = interfaces.iter_mut().find(|i| i.name == name) {
            add(interface);
        }
    }
    Ok(interfaces)
}

/// The interface an IPv4 address's label (`eth0:1`, glibc's name for the entry) belongs to:
/// labels start with the interface's name (ip(8) and ifconfig insist) and names have no ':'.
fn interface_of_label(label: &str) -> &str {
    label.split(':').next().unwrap_or(label)
}

/// The MTU of `name` (not in getifaddrs' entries), from a socket in the calling thread's
/// namespace.
pub(crate) fn mtu(name: &str) -> io::Result<u32> {
    // SAFETY: a plain syscall with no pointers.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data, for which all zeroes is a valid value.
    let mut request: libc::ifreq = unsafe { mem::zeroed() };
    let bytes = name.as_bytes();
    if bytes.len() >= request.ifr_name.len() || bytes.contains(&0) {
        return Err(io::Error::other(format!(
            "Device \"{name}\" does not exist."
        )));
    }
    for (slot, byte) in request.ifr_name.iter_mut().zip(bytes) {
        *slot = *byte as libc::c_char;
    }
    // SAFETY: SIOCGIFMTU reads the NUL-terminated ifr_name and writes ifru_mtu of `request`,
    // which lives across the call.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFMTU, &mut request) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel filled the union's MTU member; any int is a valid value.
    let mtu = unsafe { request.ifr_ifru.ifru_mtu };
    Ok(mtu.max(0) as u32)
}

/// The list getifaddrs returned, freed on drop (so on every path).
struct List(*mut libc::ifaddrs);

impl Drop for List {
    fn drop(&mut self) {
        // SAFETY: the pointer came from a successful getifaddrs and is freed only here.
        unsafe { libc::freeifaddrs(self.0) }
    }
}

/// getifaddrs' entries, copied into owned values.
fn entries() -> io::Result<Vec<Entry>> {
    let mut head = ptr::null_mut();
    // SAFETY: on success getifaddrs stores a list it allocated in `head`; `List` frees it.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let list = List(head);
    let mut entries = Vec::new();
    let mut at = list.0;
    while !at.is_null() {
        // SAFETY: `at` is a node of the list, which stays allocated until `list` drops.
        let node = unsafe { &*at };
        at = node.ifa_next;
        if node.ifa_name.is_null() || node.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(node.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr points to a sockaddr of the family its sa_family names, of that
        // family's full size (glibc allocates sockaddr_ll/_in/_in6 storage per entry).
        let entry = unsafe {
            match i32::from((*node.ifa_addr).sa_family) {
                libc::AF_PACKET => {
                    let link = &*node.ifa_addr.cast::<libc::sockaddr_ll>();
                    let mut mac = [0u8; 6];
                    if link.sll_halen == 6 {
                        mac.copy_from_slice(&link.sll_addr[..6]);
                    }
                    Entry::Link {
                        name,
                        flags: node.ifa_flags,
                        ifindex: link.sll_ifindex.max(0) as u32,
                        mac,
                    }
                }
                libc::AF_INET => {
                    let v4 = &*node.ifa_addr.cast::<libc::sockaddr_in>();
                    Entry::V4 {
                        name,
                        ip: Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr)),
                    }
                }
                libc::AF_INET6 => {
                    let v6 = &*node.ifa_addr.cast::<libc::sockaddr_in6>();
                    Entry::V6 {
                        name,
                        ip: Ipv6Addr::from(v6.sin6_addr.s6_addr),
                    }
                }
                _ => continue,
            }
        };
        entries.push(entry);
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv4_label_names_its_interface() {
        assert_eq!(interface_of_label("eth0:1"), "eth0");
        assert_eq!(interface_of_label("eth0"), "eth0");
    }

    #[test]
    fn loopback_is_listed_with_its_address_and_mtu() {
        let all = interfaces().unwrap();
        let lo = all.iter().find(|i| i.name == "lo").expect("lo");
        assert_eq!(lo.ifindex, 1);
        assert!(lo.ipv4.contains(&Ipv4Addr::LOCALHOST), "{lo:?}");
        assert_eq!(
            lo.flags & libc::IFF_LOOPBACK as u32,
            libc::IFF_LOOPBACK as u32
        );
        assert!(mtu("lo").unwrap() > 0);
        assert!(mtu("no-such-if").is_err());
        assert!(mtu("an-interface-name-too-long").is_err());
    }
}
