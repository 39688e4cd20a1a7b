//! Invalidate extended transport header: the R_Key a SEND_WITH_INV invalidates.

use core::fmt;

use crate::{read_u32, Result};

mod field {
    use crate::Field;

    pub const RKEY: Field = 0..4;
}

fixed_header_packet! {
    4;
    /// A read/write view of an IETH.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The R_Key the responder must invalidate.
    pub fn rkey(&self) -> u32 {
        read_u32(&self.buffer.as_ref()[field::RKEY])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the R_Key to invalidate.
    pub fn set_rkey(&mut self, rkey: u32) {
        self.buffer.as_mut()[field::RKEY].copy_from_slice(&rkey.to_be_bytes());
    }
}

/// A parsed IETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// The R_Key to invalidate.
    pub rkey: u32,
}

fixed_len_repr!();

impl Repr {
    /// Parses the header (every bit pattern is valid).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        Ok(Repr {
            rkey: packet.rkey(),
        })
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_rkey(self.rkey);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ieth(rkey={:#010x})", self.rkey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static HEADER_BYTES: [u8; 4] = [0x00, 0x00, 0x04, 0x48];

    const REPR: Repr = Repr { rkey: 0x448 };

    #[test]
    fn deconstruct() {
        assert_eq!(
            Packet::new_checked(&HEADER_BYTES[..]).unwrap().rkey(),
            0x448
        );
    }

    #[test]
    fn construct() {
        let mut bytes = [0xA5; 4];
        Packet::new_unchecked(&mut bytes[..]).set_rkey(0x448);
        assert_eq!(bytes, HEADER_BYTES);
    }

    parse_emit_tests!(HEADER_BYTES, REPR);
}
