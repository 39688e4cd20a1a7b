//! DREQ: a request to disconnect (IBTA Table 112).

use core::fmt;

use super::common::CommIds;
use crate::{read_u24, write_u24};

/// Bytes of private data.
pub const PRIVATE_DATA_LEN: usize = 220;

mod field {
    use crate::Field;

    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    pub const REMOTE_QPN: Field = 8..11;
    pub const RESERVED: usize = 11;
    pub const PRIVATE_DATA: Field = 12..232;
}

cm_message_packet!("a DREQ");

comm_id_accessors!();

impl<T: AsRef<[u8]>> Packet<T> {
    /// The receiver's QPN (24 bits), which the receiver checks.
    pub fn remote_qpn(&self) -> u32 {
        read_u24(&self.buffer.as_ref()[field::REMOTE_QPN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the remote QPN (low 24 bits), clearing the reserved byte after it.
    pub fn set_remote_qpn(&mut self, value: u32) {
        let buffer = self.buffer.as_mut();
        write_u24(&mut buffer[field::REMOTE_QPN], value & 0xFF_FFFF);
        buffer[field::RESERVED] = 0;
    }
}

cm_message_repr! {
    /// A parsed DREQ.
    parse: "Parses a DREQ (every bit pattern is valid).";
    emit: "Writes the DREQ.";
    comm_ids;
    /// The receiver's QPN, 24 bits.
    remote_qpn: u32 = [remote_qpn] / set_remote_qpn,
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} remote_qpn={:#08x}",
            CommIds(self.local_comm_id, self.remote_comm_id),
            self.remote_qpn
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::tests::capture_message;

    /// rping's DREQ in rping_rdmacm.pcap (the active side disconnects).
    fn header_bytes() -> [u8; HEADER_LEN] {
        capture_message(3)
    }

    const REPR: Repr = Repr {
        local_comm_id: 0x6fd0_c1a6,
        remote_comm_id: 0x0322_dfd9,
        remote_qpn: 0x1c,
        private_data: [0; PRIVATE_DATA_LEN],
    };

    #[test]
    fn deconstruct() {
        let bytes = header_bytes();
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(packet.local_comm_id(), 0x6fd0_c1a6);
        assert_eq!(packet.remote_comm_id(), 0x0322_dfd9);
        assert_eq!(packet.remote_qpn(), 0x1c);
        assert_eq!(packet.private_data(), &[0; PRIVATE_DATA_LEN][..]);
    }

    #[test]
    fn construct() {
        let mut bytes = [0xA5; HEADER_LEN];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.set_local_comm_id(0x6fd0_c1a6);
        packet.set_remote_comm_id(0x0322_dfd9);
        packet.set_remote_qpn(0x1c);
        packet.private_data_mut().fill(0);
        assert_eq!(bytes, header_bytes());
    }

    parse_emit_tests!(header_bytes(), REPR);
}
