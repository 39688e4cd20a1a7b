//! The kernel UDP-socket backend: RoCEv2 through an ordinary socket on port 4791. No root,
//! no AF_XDP, slower; it also talks to rxe, since RoCEv2 is UDP.
//!
//! The engine speaks Ethernet frames, so this backend translates: on send it takes the UDP
//! payload (BTH to ICRC) out of the frame and lets the kernel add UDP and IP; on receive it
//! rebuilds a frame around the datagram.
//!
//! The ICRC covers the IPv4 identification and DF flag and the UDP source port, which a
//! socket does not let us choose (the source port is the bound 4791) and does not show us.
//! Measured on this kernel (6.18): an unconnected socket with `IP_PMTUDISC_DO` sends DF with
//! identification 0, so every frame is sent with its ICRC re-computed for exactly the header
//! the kernel will write. On receive the two are recovered from the ICRC itself
//! ([`icrc::solve_ipv4_identification`]), which also checks 15 of its 32 bits; a frame with
//! no solution is passed on with identification 0 and fails the engine's ICRC check.
//!
//! Datagrams leave with no UDP checksum (0), as rxe's and HCAs' do (`SO_NO_CHECK`). With
//! one, the kernel leaves the sum to the device, and a veth never computes it: the frame
//! reaches the peer's XDP program, and an AF_XDP receiver, with only the pseudo-header's sum
//! in the field, a checksum that is wrong on the wire (our parser rejects such a frame).

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use roce_wire::frame::{IpRepr, Ipv4Repr, ROCEV2_UDP_PORT};
use roce_wire::icrc::{self, ICRC_LEN};
use roce_wire::Frame;
use rustix::net::sockopt::{set_ip_mtu_discover, Ipv4PathMtuDiscovery};

use crate::backend::{fill_frame, poll_readable, Backend, Fill, MAX_FRAME};

const ETHERNET_HEADER_LEN: usize = 14;
const IPV4_HEADER_LEN: usize = 20;
const UDP_HEADER_LEN: usize = 8;
const HEADERS: usize = ETHERNET_HEADER_LEN + IPV4_HEADER_LEN + UDP_HEADER_LEN;
const IDENTIFICATION: usize = ETHERNET_HEADER_LEN + 4;
const FLAGS: usize = ETHERNET_HEADER_LEN + 6;
const DF: u8 = 0x40;

/// A UDP socket on `address:4791` posing as an Ethernet port.
pub struct UdpBackend {
    socket: UdpSocket,
    address: Ipv4Addr,
    mac: [u8; 6],
    /// Where an outgoing frame is written, then given the ICRC of the header the kernel
    /// will send.
    outgoing: Vec<u8>,
    /// Where a received datagram is put, behind room for the headers rebuilt around it.
    incoming: Vec<u8>,
}

impl UdpBackend {
    /// Binds `address:4791`. `mac` is what received frames give as their destination (the
    /// engine's own MAC); the kernel does the real addressing.
    pub fn bind(address: Ipv4Addr, mac: [u8; 6]) -> io::Result<Self> {
        let socket = UdpSocket::bind(SocketAddrV4::new(address, ROCEV2_UDP_PORT))?;
        socket.set_nonblocking(true)?;
        set_ip_mtu_discover(&socket, Ipv4PathMtuDiscovery::DO)?;
        send_without_checksum(&socket)?;
        Ok(UdpBackend {
            socket,
            address,
            mac,
            outgoing: vec![0; MAX_FRAME],
            incoming: vec![0; MAX_FRAME],
        })
    }

    /// The bound address.
    pub fn address(&self) -> Ipv4Addr {
        self.address
    }
}

/// Makes the kernel send `socket`'s IPv4 datagrams with UDP checksum 0 (`SO_NO_CHECK`).
fn send_without_checksum(socket: &UdpSocket) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: `socket` is an open UDP socket for the call; the option value is a c_int that
    // lives across it, of the length given.
    #[allow(unsafe_code)]
    let result = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NO_CHECK,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn invalid(why: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, why)
}

impl UdpBackend {
    /// Sends the `len`-byte frame in `self.outgoing` as a datagram from its BTH on, with
    /// the ICRC recomputed for the header the kernel will write (identification 0, DF,
    /// source port 4791).
    fn send_outgoing(&mut self, len: usize) -> io::Result<()> {
        let frame = &mut self.outgoing[..len];
        let checked = Frame::new_checked(&*frame).map_err(|_| invalid("not a RoCEv2 frame"))?;
        let ip_start = len - checked.ip_packet().len();
        let ip = &mut frame[ip_start..];
        if ip.first() != Some(&0x45) {
            return Err(invalid("the UDP backend sends IPv4 without options only"));
        }
        let destination = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
        ip[4..6].fill(0);
        ip[6] |= DF;
        let source_port = IPV4_HEADER_LEN..IPV4_HEADER_LEN + 2;
        ip[source_port].copy_from_slice(&ROCEV2_UDP_PORT.to_be_bytes());
        let end = ip.len() - ICRC_LEN;
        let value = icrc::compute(&ip[..end]).map_err(|_| invalid("short"))?;
        ip[end..].copy_from_slice(&icrc::to_bytes(value));
        let datagram = &ip[IPV4_HEADER_LEN + UDP_HEADER_LEN..];
        self.socket
            .send_to(datagram, SocketAddrV4::new(destination, ROCEV2_UDP_PORT))?;
        Ok(())
    }
}

impl Backend for UdpBackend {
    fn receive(&mut self, budget: usize, handler: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        for delivered in 0..budget {
            let (len, source) = match self.socket.recv_from(&mut self.incoming[HEADERS..]) {
                Ok(received) => received,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(delivered),
                Err(error) => return Err(error),
            };
            let SocketAddr::V4(source) = source else {
                continue;
            };
            let frame_len = rebuild_frame(&mut self.incoming, len, source, self.address, self.mac);
            handler(&self.incoming[..frame_len]);
        }
        Ok(budget)
    }

    fn transmit(&mut self, len: usize, _flow: u16, fill: Fill<'_>) -> io::Result<()> {
        let len = len.min(self.outgoing.len());
        let Some(written) = fill_frame(&mut self.outgoing[..len], fill) else {
            return Ok(());
        };
        self.send_outgoing(written)
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        poll_readable(&[self.socket.as_fd()], timeout)
    }

    fn readiness_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(self.socket.as_fd())
    }
}

/// Writes Ethernet, IPv4 and UDP headers in front of the `len`-byte datagram at
/// `buffer[HEADERS..]` and returns the frame's length.
fn rebuild_frame(
    buffer: &mut [u8],
    len: usize,
    source: SocketAddrV4,
    local: Ipv4Addr,
    mac: [u8; 6],
) -> usize {
    let udp_len = UDP_HEADER_LEN + len;
    let header = |identification, dont_fragment| {
        IpRepr::V4(Ipv4Repr {
            src: *source.ip(),
            dst: local,
            dscp: 0,
            ecn: 0,
            identification,
            dont_fragment,
            ttl: 64,
        })
    };
    buffer[..6].copy_from_slice(&mac);
    buffer[6..12].fill(0);
    buffer[12..14].copy_from_slice(&[0x08, 0x00]);
    let udp = ETHERNET_HEADER_LEN + IPV4_HEADER_LEN;
    buffer[udp..udp + 2].copy_from_slice(&source.port().to_be_bytes());
    buffer[udp + 2..udp + 4].copy_from_slice(&ROCEV2_UDP_PORT.to_be_bytes());
    buffer[udp + 4..udp + 6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    buffer[udp + 6..udp + 8].fill(0);
    let frame_len = HEADERS + len;
    let _ = header(0, false).emit(udp_len, &mut buffer[ETHERNET_HEADER_LEN..]);
    if len >= ICRC_LEN {
        let trailer = &buffer[frame_len - ICRC_LEN..frame_len];
        let received = icrc::read([trailer[0], trailer[1], trailer[2], trailer[3]]);
        let covered = &buffer[ETHERNET_HEADER_LEN..frame_len - ICRC_LEN];
        if let Some((identification, dont_fragment)) =
            icrc::solve_ipv4_identification(covered, received)
        {
            let _ = header(identification, dont_fragment)
                .emit(udp_len, &mut buffer[ETHERNET_HEADER_LEN..]);
            debug_assert_eq!(
                u16::from_be_bytes([buffer[IDENTIFICATION], buffer[IDENTIFICATION + 1]]),
                identification
            );
            debug_assert_eq!(buffer[FLAGS] & DF != 0, dont_fragment);
        }
    }
    frame_len
}
