//! Datagram extended transport header: the Q_Key and source QP of a UD packet.

use core::fmt;

use crate::{read_u24, write_u24};

mod field {
    use crate::Field;

    pub const QKEY: Field = 0..4;
    pub const RESERVED: usize = 4;
    pub const SRC_QPN: Field = 5..8;
}

fixed_header_packet! {
    8;
    /// A read/write view of a DETH.
}

field_accessors! {
    /// Queue key the destination QP checks.
    qkey / set_qkey: u32 @ QKEY;
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Sending QP (24 bits), reported in the receive completion.
    pub fn src_qpn(&self) -> u32 {
        read_u24(&self.buffer.as_ref()[field::SRC_QPN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the source QPN (low 24 bits), clearing the reserved byte.
    pub fn set_src_qpn(&mut self, qpn: u32) {
        let buffer = self.buffer.as_mut();
        buffer[field::RESERVED] = 0;
        write_u24(&mut buffer[field::SRC_QPN], qpn & 0xFF_FFFF);
    }
}

header_repr! {
    /// A parsed DETH.
    parse: "Parses a DETH (every bit pattern is valid; the reserved byte is ignored).";
    emit: "Writes the header.";
    /// Queue key.
    qkey: u32 = [qkey] / set_qkey,
    /// Source QPN, 24 bits.
    src_qpn: u32 = [src_qpn] / set_src_qpn,
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "deth(qkey={:#010x} src_qpn={:#08x})",
            self.qkey, self.src_qpn
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The DETH of a UD_SEND_ONLY in ud_pingpong.pcap.
    static HEADER_BYTES: [u8; 8] = [0x11, 0x11, 0x11, 0x11, 0x00, 0x00, 0x00, 0x12];

    const REPR: Repr = Repr {
        qkey: 0x1111_1111,
        src_qpn: 0x12,
    };

    #[test]
    fn deconstruct() {
        let packet = Packet::new_checked(&HEADER_BYTES[..]).unwrap();
        assert_eq!(packet.qkey(), 0x1111_1111);
        assert_eq!(packet.src_qpn(), 0x12);
    }

    #[test]
    fn construct() {
        let mut bytes = [0xA5; 8];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.set_qkey(0x1111_1111);
        packet.set_src_qpn(0x12);
        assert_eq!(bytes, HEADER_BYTES);
    }

    parse_emit_tests!(HEADER_BYTES, REPR);
}
