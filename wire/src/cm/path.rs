//! The 44-byte path description a REQ carries twice (primary and alternate path).

use core::fmt;

use crate::{bits, read_u32, set_bits, Result};

mod field {
    use crate::Field;

    pub const LOCAL_LID: Field = 0..2;
    pub const REMOTE_LID: Field = 2..4;
    pub const LOCAL_GID: Field = 4..20;
    pub const REMOTE_GID: Field = 20..36;
    /// Flow label in the top 20 bits, packet rate in the low 6.
    pub const FLOW_LABEL_RATE: Field = 36..40;
    pub const TRAFFIC_CLASS: usize = 40;
    pub const HOP_LIMIT: usize = 41;
    /// SL in bits 7..4, SubnetLocal in bit 3.
    pub const SL: usize = 42;
    /// Local ACK timeout in bits 7..3.
    pub const ACK_TIMEOUT: usize = 43;
}

fixed_header_packet! {
    44;
    /// A read/write view of a path in a REQ.
}

field_accessors! {
    /// LID of the sender's port; 0xFFFF (permissive) on RoCE across routers.
    local_lid / set_local_lid: u16 @ LOCAL_LID;
    /// LID of the receiver's port.
    remote_lid / set_remote_lid: u16 @ REMOTE_LID;
    /// The sender's GID (on RoCEv2 its IP address, IPv4-mapped for IPv4).
    local_gid / set_local_gid: gid @ LOCAL_GID;
    /// The receiver's GID.
    remote_gid / set_remote_gid: gid @ REMOTE_GID;
    /// Traffic class.
    traffic_class / set_traffic_class: u8 @ TRAFFIC_CLASS;
    /// Hop limit.
    hop_limit / set_hop_limit: u8 @ HOP_LIMIT;
    /// Local ACK timeout exponent (5 bits) the requester's QP should use.
    local_ack_timeout / set_local_ack_timeout: lone_bits(3, 5) @ ACK_TIMEOUT;
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        read_u32(&self.buffer.as_ref()[field::FLOW_LABEL_RATE]) >> 12
    }

    /// Static rate (6 bits, IB rate enum).
    pub fn packet_rate(&self) -> u8 {
        bits(self.buffer.as_ref()[field::FLOW_LABEL_RATE.end - 1], 0, 6)
    }

    /// Service level (4 bits).
    pub fn sl(&self) -> u8 {
        bits(self.buffer.as_ref()[field::SL], 4, 4)
    }

    /// Whether the path stays inside the subnet.
    pub fn subnet_local(&self) -> bool {
        bits(self.buffer.as_ref()[field::SL], 3, 1) == 1
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the flow label (low 20 bits) and the packet rate (low 6 bits), clearing the
    /// reserved bits between them.
    pub fn set_flow_label_and_rate(&mut self, flow_label: u32, rate: u8) {
        let word = ((flow_label & 0xF_FFFF) << 12) | u32::from(rate & 0x3F);
        self.buffer.as_mut()[field::FLOW_LABEL_RATE].copy_from_slice(&word.to_be_bytes());
    }

    /// Sets the SL (low 4 bits) and SubnetLocal, clearing the reserved bits.
    pub fn set_sl(&mut self, sl: u8, subnet_local: bool) {
        let byte = &mut self.buffer.as_mut()[field::SL];
        *byte = 0;
        set_bits(byte, 4, 4, sl);
        set_bits(byte, 3, 1, subnet_local.into());
    }
}

/// A parsed path. A REQ without an alternate path carries one of all zeros
/// ([`Repr::default`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Repr {
    /// Sender's LID.
    pub local_lid: u16,
    /// Receiver's LID.
    pub remote_lid: u16,
    /// Sender's GID.
    pub local_gid: [u8; 16],
    /// Receiver's GID.
    pub remote_gid: [u8; 16],
    /// Flow label, 20 bits.
    pub flow_label: u32,
    /// Packet rate, 6 bits.
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level, 4 bits.
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout exponent, 5 bits.
    pub local_ack_timeout: u8,
}

fixed_len_repr!();

impl Repr {
    /// Parses a path (every bit pattern is valid).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        Ok(Repr {
            local_lid: packet.local_lid(),
            remote_lid: packet.remote_lid(),
            local_gid: packet.local_gid(),
            remote_gid: packet.remote_gid(),
            flow_label: packet.flow_label(),
            packet_rate: packet.packet_rate(),
            traffic_class: packet.traffic_class(),
            hop_limit: packet.hop_limit(),
            sl: packet.sl(),
            subnet_local: packet.subnet_local(),
            local_ack_timeout: packet.local_ack_timeout(),
        })
    }

    /// Writes the path.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_local_lid(self.local_lid);
        packet.set_remote_lid(self.remote_lid);
        packet.set_local_gid(self.local_gid);
        packet.set_remote_gid(self.remote_gid);
        packet.set_flow_label_and_rate(self.flow_label, self.packet_rate);
        packet.set_traffic_class(self.traffic_class);
        packet.set_hop_limit(self.hop_limit);
        packet.set_sl(self.sl, self.subnet_local);
        packet.set_local_ack_timeout(self.local_ack_timeout);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "path({} -> {} tc={} hop={} flow={:#x} ack_timeout={})",
            core::net::Ipv6Addr::from(self.local_gid),
            core::net::Ipv6Addr::from(self.remote_gid),
            self.traffic_class,
            self.hop_limit,
            self.flow_label,
            self.local_ack_timeout
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::tests::capture_message;

    /// The primary path of the REQ in rping_rdmacm.pcap (bytes 52..96 of the message).
    fn header_bytes() -> [u8; HEADER_LEN] {
        capture_message(0)[52..96].try_into().unwrap()
    }

    const LOCAL_GID: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 88, 0, 12];
    const REMOTE_GID: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 88, 0, 11];

    const REPR: Repr = Repr {
        local_lid: 0xFFFF,
        remote_lid: 0xFFFF,
        local_gid: LOCAL_GID,
        remote_gid: REMOTE_GID,
        flow_label: 0x580bb,
        packet_rate: 0,
        traffic_class: 0,
        hop_limit: 64,
        sl: 0,
        subnet_local: false,
        local_ack_timeout: 19,
    };

    #[test]
    fn deconstruct() {
        let bytes = header_bytes();
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(packet.local_lid(), 0xFFFF);
        assert_eq!(packet.remote_lid(), 0xFFFF);
        assert_eq!(packet.local_gid(), LOCAL_GID);
        assert_eq!(packet.remote_gid(), REMOTE_GID);
        assert_eq!(packet.flow_label(), 0x580bb);
        assert_eq!(packet.packet_rate(), 0);
        assert_eq!(packet.traffic_class(), 0);
        assert_eq!(packet.hop_limit(), 64);
        assert_eq!(packet.sl(), 0);
        assert!(!packet.subnet_local());
        assert_eq!(packet.local_ack_timeout(), 19);
    }

    #[test]
    fn construct() {
        let mut bytes = [0xA5; HEADER_LEN];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.set_local_lid(0xFFFF);
        packet.set_remote_lid(0xFFFF);
        packet.set_local_gid(LOCAL_GID);
        packet.set_remote_gid(REMOTE_GID);
        packet.set_flow_label_and_rate(0x580bb, 0);
        packet.set_traffic_class(0);
        packet.set_hop_limit(64);
        packet.set_sl(0, false);
        packet.set_local_ack_timeout(19);
        assert_eq!(bytes, header_bytes());
    }

    parse_emit_tests!(header_bytes(), REPR);

    #[test]
    fn bit_fields_do_not_overlap() {
        let repr = Repr {
            flow_label: 0xF_FFFF,
            packet_rate: 0x3F,
            sl: 0xF,
            subnet_local: true,
            local_ack_timeout: 0x1F,
            ..Repr::default()
        };
        let mut bytes = [0; HEADER_LEN];
        repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes[36..44], [0xFF, 0xFF, 0xF0, 0x3F, 0, 0, 0xF8, 0xF8]);
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Ok(repr)
        );
    }
}
