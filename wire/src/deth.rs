//! Datagram extended transport header: the Q_Key and source QP of a UD packet.

use core::fmt;

use crate::{read_u24, read_u32, write_u24, Result};

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

impl<T: AsRef<[u8]>> Packet<T> {
    /// Queue key the destination QP checks.
    pub fn qkey(&self) -> u32 {
        read_u32(&self.buffer.as_ref()[field::QKEY])
    }

    /// Sending QP (24 bits), reported in the receive completion.
    pub fn src_qpn(&self) -> u32 {
        read_u24(&self.buffer.as_ref()[field::SRC_QPN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the Q_Key.
    pub fn set_qkey(&mut self, qkey: u32) {
        self.buffer.as_mut()[field::QKEY].copy_from_slice(&qkey.to_be_bytes());
    }

    /// Sets the source QPN (low 24 bits), clearing the reserved byte.
    pub fn set_src_qpn(&mut self, qpn: u32) {
        let buffer = self.buffer.as_mut();
        buffer[field::RESERVED] = 0;
        write_u24(&mut buffer[field::SRC_QPN], qpn & 0xFF_FFFF);
    }
}

/// A parsed DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Queue key.
    pub qkey: u32,
    /// Source QPN, 24 bits.
    pub src_qpn: u32,
}

fixed_len_repr!();

impl Repr {
    /// Parses a DETH (every bit pattern is valid; the reserved byte is ignored).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        Ok(Repr {
            qkey: packet.qkey(),
            src_qpn: packet.src_qpn(),
        })
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_qkey(self.qkey);
        packet.set_src_qpn(self.src_qpn);
    }
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
