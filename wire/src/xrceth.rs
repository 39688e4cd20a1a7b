//! XRC extended transport header: the XRC shared receive queue an XRC request is for (IBTA
//! Annex A14). It follows the BTH of every XRC request packet, before any other extension
//! header.

use core::fmt;

use crate::{read_u24, write_u24};

mod field {
    use crate::Field;

    pub const RESERVED: usize = 0;
    pub const XRC_SRQ: Field = 1..4;
}

fixed_header_packet! {
    4;
    /// A read/write view of an XRCETH.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The destination XRC SRQ's number (24 bits).
    pub fn xrc_srq(&self) -> u32 {
        read_u24(&self.buffer.as_ref()[field::XRC_SRQ])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the XRC SRQ number (low 24 bits), clearing the reserved byte.
    pub fn set_xrc_srq(&mut self, srqn: u32) {
        let buffer = self.buffer.as_mut();
        buffer[field::RESERVED] = 0;
        write_u24(&mut buffer[field::XRC_SRQ], srqn & 0xFF_FFFF);
    }
}

header_repr! {
    /// A parsed XRCETH.
    parse: "Parses the header (every bit pattern is valid; the reserved byte is ignored).";
    emit: "Writes the header.";
    /// The XRC SRQ number, 24 bits.
    srqn: u32 = [xrc_srq] / set_xrc_srq,
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "xrceth(srqn={:#08x})", self.srqn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static HEADER_BYTES: [u8; 4] = [0x00, 0x02, 0x00, 0x41];

    const REPR: Repr = Repr { srqn: 0x20041 };

    #[test]
    fn deconstruct() {
        let packet = Packet::new_checked(&HEADER_BYTES[..]).unwrap();
        assert_eq!(packet.xrc_srq(), 0x20041);
        // The reserved byte is not part of the number.
        let reserved = [0xFF, 0x02, 0x00, 0x41];
        assert_eq!(
            Packet::new_checked(&reserved[..]).unwrap().xrc_srq(),
            0x20041
        );
    }

    #[test]
    fn construct() {
        let mut bytes = [0xA5; 4];
        Packet::new_unchecked(&mut bytes[..]).set_xrc_srq(0xFF02_0041);
        assert_eq!(bytes, HEADER_BYTES);
    }

    parse_emit_tests!(HEADER_BYTES, REPR);
}
