//! Whether a network interface can carry traffic, as rxe's port state follows its netdev
//! (`rxe_port_up`/`rxe_port_down`): administratively up and running (carrier on).
//!
//! Asked with one `SIOCGIFFLAGS` ioctl on a datagram socket, which answers in the namespace
//! the socket was made in (/sys would answer for the namespace sysfs was mounted in).

use std::ffi::c_char;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use rustix::net::{socket, AddressFamily, SocketType};

/// An interface whose state can be asked cheaply and repeatedly.
#[derive(Debug)]
pub struct Link {
    socket: OwnedFd,
    name: [c_char; libc::IFNAMSIZ],
}

impl Link {
    /// The interface `name` in the calling thread's network namespace.
    pub fn new(name: &str) -> io::Result<Link> {
        if name.len() >= libc::IFNAMSIZ || name.bytes().any(|byte| byte == 0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("not an interface name: {name:?}"),
            ));
        }
        let mut raw = [0; libc::IFNAMSIZ];
        for (to, from) in raw.iter_mut().zip(name.bytes()) {
            *to = from as c_char;
        }
        Ok(Link {
            socket: socket(AddressFamily::INET, SocketType::DGRAM, None)?,
            name: raw,
        })
    }

    /// Whether the interface is up and running now.
    pub fn is_up(&self) -> io::Result<bool> {
        // SAFETY: ifreq is plain data (a name and a union of integers), valid all zero.
        let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
        request.ifr_name = self.name;
        // SAFETY: SIOCGIFFLAGS reads the NUL-terminated name and writes the flags into the
        // request, which lives across the call; the socket is open.
        let done = unsafe {
            libc::ioctl(
                self.socket.as_raw_fd(),
                libc::SIOCGIFFLAGS,
                &raw mut request,
            )
        };
        if done < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: SIOCGIFFLAGS filled the union's flags member.
        let flags = i32::from(unsafe { request.ifr_ifru.ifru_flags });
        let up = libc::IFF_UP | libc::IFF_RUNNING;
        Ok(flags & up == up)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_up_and_a_missing_interface_is_an_error() {
        assert!(Link::new("lo").unwrap().is_up().unwrap());
        let missing = Link::new("roce-no-such0").unwrap().is_up().unwrap_err();
        assert_eq!(missing.raw_os_error(), Some(libc::ENODEV));
        assert!(Link::new("a-name-longer-than-ifnamsiz").is_err());
    }
}
