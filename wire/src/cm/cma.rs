//! The rdma_cm header (`struct cma_hdr` in the kernel's cma.c): 36 bytes at the start of the
//! private data of a REQ or SIDR_REQ that rdma_cm sends, naming the IP endpoints the
//! connection is for. The application's own private data follows it.

use core::fmt;
use core::net::{Ipv4Addr, Ipv6Addr};

use crate::{Error, Result};

/// The only header version (`CMA_VERSION`).
pub const CMA_VERSION: u8 = 0;

mod field {
    use crate::Field;

    pub const CMA_VERSION: usize = 0;
    /// IP version in bits 7..4.
    pub const IP_VERSION: usize = 1;
    pub const PORT: Field = 2..4;
    pub const SRC_ADDR: Field = 4..20;
    pub const DST_ADDR: Field = 20..36;
}

fixed_header_packet! {
    36;
    /// A read/write view of an rdma_cm header.
}

/// Both endpoints' addresses, of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Addresses {
    /// IPv4: on the wire 12 zero bytes and the address (not `::ffff:` mapped).
    V4 {
        /// The active side's address.
        src: Ipv4Addr,
        /// The passive side's address.
        dst: Ipv4Addr,
    },
    /// IPv6: the full 16 bytes.
    V6 {
        /// The active side's address.
        src: Ipv6Addr,
        /// The passive side's address.
        dst: Ipv6Addr,
    },
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Header version; 0.
    pub fn cma_version(&self) -> u8 {
        self.buffer.as_ref()[field::CMA_VERSION]
    }

    /// IP version, 4 or 6.
    pub fn ip_version(&self) -> u8 {
        self.buffer.as_ref()[field::IP_VERSION] >> 4
    }

    /// The active side's source port.
    pub fn port(&self) -> u16 {
        let bytes = &self.buffer.as_ref()[field::PORT];
        u16::from_be_bytes([bytes[0], bytes[1]])
    }

    /// Source address field, all 16 bytes.
    pub fn src_addr(&self) -> [u8; 16] {
        let mut addr = [0; 16];
        addr.copy_from_slice(&self.buffer.as_ref()[field::SRC_ADDR]);
        addr
    }

    /// Destination address field, all 16 bytes.
    pub fn dst_addr(&self) -> [u8; 16] {
        let mut addr = [0; 16];
        addr.copy_from_slice(&self.buffer.as_ref()[field::DST_ADDR]);
        addr
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the header version.
    pub fn set_cma_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::CMA_VERSION] = value;
    }

    /// Sets the IP version (low 4 bits), clearing the low bits of its byte.
    pub fn set_ip_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::IP_VERSION] = value << 4;
    }

    /// Sets the source port.
    pub fn set_port(&mut self, value: u16) {
        self.buffer.as_mut()[field::PORT].copy_from_slice(&value.to_be_bytes());
    }

    /// Sets the source address field.
    pub fn set_src_addr(&mut self, value: [u8; 16]) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&value);
    }

    /// Sets the destination address field.
    pub fn set_dst_addr(&mut self, value: [u8; 16]) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&value);
    }
}

/// A parsed rdma_cm header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The active side's source port.
    pub src_port: u16,
    /// The addresses.
    pub addresses: Addresses,
}

fn v4_field(addr: Ipv4Addr) -> [u8; 16] {
    let mut field = [0; 16];
    field[12..].copy_from_slice(&addr.octets());
    field
}

fn v4_of_field(field: [u8; 16]) -> Ipv4Addr {
    Ipv4Addr::new(field[12], field[13], field[14], field[15])
}

fixed_len_repr!();

impl Repr {
    /// Parses the header; another version or an IP version other than 4 or 6 is an error.
    /// For IPv4 the 12 bytes in front of each address are ignored, as the kernel does.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        if packet.cma_version() != CMA_VERSION {
            return Err(Error);
        }
        let addresses = match packet.ip_version() {
            4 => Addresses::V4 {
                src: v4_of_field(packet.src_addr()),
                dst: v4_of_field(packet.dst_addr()),
            },
            6 => Addresses::V6 {
                src: Ipv6Addr::from(packet.src_addr()),
                dst: Ipv6Addr::from(packet.dst_addr()),
            },
            _ => return Err(Error),
        };
        Ok(Repr {
            src_port: packet.port(),
            addresses,
        })
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_cma_version(CMA_VERSION);
        packet.set_port(self.src_port);
        match self.addresses {
            Addresses::V4 { src, dst } => {
                packet.set_ip_version(4);
                packet.set_src_addr(v4_field(src));
                packet.set_dst_addr(v4_field(dst));
            }
            Addresses::V6 { src, dst } => {
                packet.set_ip_version(6);
                packet.set_src_addr(src.octets());
                packet.set_dst_addr(dst.octets());
            }
        }
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addresses {
            Addresses::V4 { src, dst } => write!(f, "cma({src}:{} -> {dst})", self.src_port),
            Addresses::V6 { src, dst } => write!(f, "cma([{src}]:{} -> [{dst}])", self.src_port),
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use std::string::ToString;

    use super::*;
    use crate::cm::tests::capture_message;

    /// The header at the start of the REQ's private data in rping_rdmacm.pcap.
    fn header_bytes() -> [u8; HEADER_LEN] {
        capture_message(0)[140..176].try_into().unwrap()
    }

    const REPR: Repr = Repr {
        src_port: 0xb0ab,
        addresses: Addresses::V4 {
            src: Ipv4Addr::new(10, 88, 0, 12),
            dst: Ipv4Addr::new(10, 88, 0, 11),
        },
    };

    #[test]
    fn deconstruct() {
        let bytes = header_bytes();
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(packet.cma_version(), 0);
        assert_eq!(packet.ip_version(), 4);
        assert_eq!(packet.port(), 0xb0ab);
        assert_eq!(packet.src_addr(), v4_field(Ipv4Addr::new(10, 88, 0, 12)));
        assert_eq!(packet.dst_addr(), v4_field(Ipv4Addr::new(10, 88, 0, 11)));
    }

    #[test]
    fn construct() {
        let mut bytes = [0xA5; HEADER_LEN];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.set_cma_version(0);
        packet.set_ip_version(4);
        packet.set_port(0xb0ab);
        packet.set_src_addr(v4_field(Ipv4Addr::new(10, 88, 0, 12)));
        packet.set_dst_addr(v4_field(Ipv4Addr::new(10, 88, 0, 11)));
        assert_eq!(bytes, header_bytes());
    }

    parse_emit_tests!(header_bytes(), REPR);

    #[test]
    fn ipv6_round_trip() {
        let repr = Repr {
            src_port: 40000,
            addresses: Addresses::V6 {
                src: "fd00::1".parse().unwrap(),
                dst: "fd00::2".parse().unwrap(),
            },
        };
        let mut bytes = [0; HEADER_LEN];
        repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes[1], 0x60);
        assert_eq!(bytes[19], 1);
        assert_eq!(bytes[35], 2);
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Ok(repr)
        );
    }

    /// The header of the REQ the rxe VM's kernel rdma_cm sent from fd88::11 (rping's
    /// client, source port 0x8506) to fd88::1 (captured on the VM's bridge).
    const KERNEL_IPV6: [u8; HEADER_LEN] = [
        0x00, 0x60, 0x85, 0x06, 0xfd, 0x88, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x11, 0xfd,
        0x88, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01,
    ];

    #[test]
    fn the_kernels_ipv6_header_parses_and_is_what_we_emit() {
        let repr = Repr {
            src_port: 0x8506,
            addresses: Addresses::V6 {
                src: "fd88::11".parse().unwrap(),
                dst: "fd88::1".parse().unwrap(),
            },
        };
        assert_eq!(
            Repr::parse(&Packet::new_checked(&KERNEL_IPV6[..]).unwrap()),
            Ok(repr)
        );
        let mut bytes = [0xA5; HEADER_LEN];
        repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, KERNEL_IPV6);
        assert_eq!(repr.to_string(), "cma([fd88::11]:34054 -> [fd88::1])");
    }

    #[test]
    fn unknown_versions_are_refused() {
        let mut bytes = header_bytes();
        bytes[1] = 0x50;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Err(Error)
        );
        let mut bytes = header_bytes();
        bytes[0] = 1;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Err(Error)
        );
    }
}
