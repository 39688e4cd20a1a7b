//! SIDR_REQ: resolve a service ID to a UD QP (IBTA Table 119; rdma_cm's RDMA_PS_UDP).

use core::fmt;

use super::ServiceId;
use crate::read_u16;

/// Bytes of private data; rdma_cm puts its [header](super::cma) first.
pub const PRIVATE_DATA_LEN: usize = 216;

mod field {
    use crate::Field;

    pub const REQUEST_ID: Field = 0..4;
    pub const PKEY: Field = 4..6;
    pub const RESERVED: Field = 6..8;
    pub const SERVICE_ID: Field = 8..16;
    pub const PRIVATE_DATA: Field = 16..232;
}

cm_message_packet!("a SIDR_REQ");

field_accessors! {
    /// The sender's ID for this request; the reply carries it back.
    request_id / set_request_id: u32 @ REQUEST_ID;
    /// The service to resolve.
    service_id / set_service_id: service_id @ SERVICE_ID;
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Partition key.
    pub fn pkey(&self) -> u16 {
        read_u16(&self.buffer.as_ref()[field::PKEY])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the partition key, clearing the reserved bytes after it.
    pub fn set_pkey(&mut self, value: u16) {
        let buffer = self.buffer.as_mut();
        buffer[field::PKEY].copy_from_slice(&value.to_be_bytes());
        buffer[field::RESERVED].fill(0);
    }
}

cm_message_repr! {
    /// A parsed SIDR_REQ.
    parse: "Parses a SIDR_REQ (every bit pattern is valid).";
    emit: "Writes the SIDR_REQ.";
    /// Request ID.
    request_id: u32 = [request_id] / set_request_id,
    /// Partition key.
    pkey: u16 = [pkey] / set_pkey,
    /// The service to resolve.
    service_id: ServiceId = [service_id] / set_service_id,
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "request_id={:#010x} sid={} pkey={:#06x}",
            self.request_id, self.service_id, self.pkey
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::PortSpace;

    /// The capture has no SIDR: this SIDR_REQ is laid out by hand from Table 119, as udaddy
    /// sends it to port 7174 with an IPv4 rdma_cm header in front of its private data.
    fn header_bytes() -> [u8; HEADER_LEN] {
        let mut bytes = [0; HEADER_LEN];
        bytes[..16].copy_from_slice(&[
            0x12, 0x34, 0x56, 0x78, 0xff, 0xff, 0x00, 0x00, 0, 0, 0, 0, 0x01, 0x11, 0x1c, 0x06,
        ]);
        bytes[16..20].copy_from_slice(&[0x00, 0x40, 0xb0, 0xab]);
        bytes
    }

    fn repr() -> Repr {
        let mut private_data = [0; PRIVATE_DATA_LEN];
        private_data[..4].copy_from_slice(&[0x00, 0x40, 0xb0, 0xab]);
        Repr {
            request_id: 0x1234_5678,
            pkey: 0xFFFF,
            service_id: ServiceId::rdma_ip(PortSpace::Udp, 7174),
            private_data,
        }
    }

    #[test]
    fn deconstruct() {
        let bytes = header_bytes();
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(packet.request_id(), 0x1234_5678);
        assert_eq!(packet.pkey(), 0xFFFF);
        assert_eq!(packet.service_id(), ServiceId(0x0111_1c06));
        assert_eq!(packet.private_data()[..4], [0x00, 0x40, 0xb0, 0xab]);
    }

    #[test]
    fn construct() {
        let mut bytes = [0xA5; HEADER_LEN];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.set_request_id(0x1234_5678);
        packet.set_pkey(0xFFFF);
        packet.set_service_id(ServiceId(0x0111_1c06));
        packet
            .private_data_mut()
            .copy_from_slice(&repr().private_data);
        assert_eq!(bytes, header_bytes());
    }

    parse_emit_tests!(header_bytes(), repr());
}
