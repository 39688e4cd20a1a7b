//! Immediate data: four opaque bytes delivered in the receive completion.

use core::fmt;

use crate::{read_u32, Result};

mod field {
    use crate::Field;

    pub const DATA: Field = 0..4;
}

fixed_header_packet! {
    4;
    /// A read/write view of an ImmDt header.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The immediate value, as the big-endian integer verbs reports (`imm_data` is `__be32`).
    pub fn immediate(&self) -> u32 {
        read_u32(&self.buffer.as_ref()[field::DATA])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the immediate value.
    pub fn set_immediate(&mut self, value: u32) {
        self.buffer.as_mut()[field::DATA].copy_from_slice(&value.to_be_bytes());
    }
}

/// A parsed ImmDt header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// The immediate value.
    pub immediate: u32,
}

fixed_len_repr!();

impl Repr {
    /// Parses the header (every bit pattern is valid).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        Ok(Repr {
            immediate: packet.immediate(),
        })
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_immediate(self.immediate);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "immdt({:#010x})", self.immediate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static HEADER_BYTES: [u8; 4] = [0xde, 0xad, 0xbe, 0xef];

    const REPR: Repr = Repr {
        immediate: 0xdead_beef,
    };

    #[test]
    fn deconstruct() {
        assert_eq!(
            Packet::new_checked(&HEADER_BYTES[..]).unwrap().immediate(),
            0xdead_beef
        );
    }

    #[test]
    fn construct() {
        let mut bytes = [0; 4];
        Packet::new_unchecked(&mut bytes[..]).set_immediate(0xdead_beef);
        assert_eq!(bytes, HEADER_BYTES);
    }

    parse_emit_tests!(HEADER_BYTES, REPR);
}
