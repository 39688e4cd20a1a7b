//! MRA: "message received, more time needed" (IBTA Table 107).

use core::fmt;

use super::common::{CommIds, MessageKind};
use crate::{bits, set_lone_bits, Result};

/// Bytes of private data.
pub const PRIVATE_DATA_LEN: usize = 222;

mod field {
    use crate::Field;

    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    /// Message MRAed in bits 7..6.
    pub const MESSAGE_MRAED: usize = 8;
    /// Service timeout in bits 7..3.
    pub const SERVICE_TIMEOUT: usize = 9;
    pub const PRIVATE_DATA: Field = 10..232;
}

cm_message_packet!("an MRA");

comm_id_accessors!();

field_accessors! {
    /// Exponent of the extra time the sender needs (5 bits).
    service_timeout / set_service_timeout: lone_bits(3, 5) @ SERVICE_TIMEOUT;
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The raw 2-bit code of the message this MRA acknowledges.
    pub fn message_mraed(&self) -> u8 {
        bits(self.buffer.as_ref()[field::MESSAGE_MRAED], 6, 2)
    }

    /// The message acknowledged; the reserved code 3 is an error.
    fn message_kind(&self) -> Result<MessageKind> {
        MessageKind::from_bits(self.message_mraed())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the message MRAed, clearing the reserved bits of its byte.
    pub fn set_message_mraed(&mut self, value: MessageKind) {
        set_lone_bits(
            &mut self.buffer.as_mut()[field::MESSAGE_MRAED],
            6,
            2,
            value as u8,
        );
    }
}

cm_message_repr! {
    /// A parsed MRA.
    parse: "Parses an MRA; the reserved message code 3 is an error.";
    emit: "Writes the MRA.";
    comm_ids;
    /// The message acknowledged.
    message_mraed: MessageKind = [message_kind?] / set_message_mraed,
    /// Service timeout exponent, 5 bits.
    service_timeout: u8 = [service_timeout] / set_service_timeout,
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} mraed={:?} service_timeout={}",
            CommIds(self.local_comm_id, self.remote_comm_id),
            self.message_mraed,
            self.service_timeout
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    /// The capture has no MRA: this one is laid out by hand from Table 107, as the kernel's
    /// rdma_cm sends it for a REQ its user has not answered yet (service timeout 24).
    fn header_bytes() -> [u8; HEADER_LEN] {
        let mut bytes = [0; HEADER_LEN];
        bytes[..10].copy_from_slice(&[0x03, 0x22, 0xdf, 0xd9, 0x6f, 0xd0, 0xc1, 0xa6, 0x00, 0xc0]);
        bytes[10..13].copy_from_slice(b"mra");
        bytes
    }

    fn repr() -> Repr {
        let mut private_data = [0; PRIVATE_DATA_LEN];
        private_data[..3].copy_from_slice(b"mra");
        Repr {
            local_comm_id: 0x0322_dfd9,
            remote_comm_id: 0x6fd0_c1a6,
            message_mraed: MessageKind::Req,
            service_timeout: 24,
            private_data,
        }
    }

    #[test]
    fn deconstruct() {
        let bytes = header_bytes();
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(packet.local_comm_id(), 0x0322_dfd9);
        assert_eq!(packet.remote_comm_id(), 0x6fd0_c1a6);
        assert_eq!(packet.message_mraed(), 0);
        assert_eq!(packet.service_timeout(), 24);
        assert_eq!(&packet.private_data()[..4], b"mra\0");
    }

    #[test]
    fn construct() {
        let mut bytes = [0xA5; HEADER_LEN];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.set_local_comm_id(0x0322_dfd9);
        packet.set_remote_comm_id(0x6fd0_c1a6);
        packet.set_message_mraed(MessageKind::Req);
        packet.set_service_timeout(24);
        packet
            .private_data_mut()
            .copy_from_slice(&repr().private_data);
        assert_eq!(bytes, header_bytes());
    }

    parse_emit_tests!(header_bytes(), repr());

    #[test]
    fn reserved_message_code_is_refused() {
        let mut bytes = header_bytes();
        bytes[8] = 0xC0;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Err(Error)
        );
    }
}
