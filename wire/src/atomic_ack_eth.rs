//! Atomic acknowledge extended transport header: the value the target held before the atomic.

use core::fmt;

use crate::{read_u64, Result};

mod field {
    use crate::Field;

    pub const ORIGINAL: Field = 0..8;
}

fixed_header_packet! {
    8;
    /// A read/write view of an AtomicAckETH.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The original remote value.
    pub fn original(&self) -> u64 {
        read_u64(&self.buffer.as_ref()[field::ORIGINAL])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the original remote value.
    pub fn set_original(&mut self, value: u64) {
        self.buffer.as_mut()[field::ORIGINAL].copy_from_slice(&value.to_be_bytes());
    }
}

/// A parsed AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// The original remote value.
    pub original: u64,
}

fixed_len_repr!();

impl Repr {
    /// Parses the header (every bit pattern is valid).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        Ok(Repr {
            original: packet.original(),
        })
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_original(self.original);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "atomicacketh(orig={:#x})", self.original)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AtomicAckETH of an RC_ATOMIC_ACKNOWLEDGE in atomic_bw_cswap.pcap.
    static HEADER_BYTES: [u8; 8] = [0x76, 0x4f, 0xb8, 0x8d, 0xbd, 0xf1, 0x2c, 0x9e];

    const REPR: Repr = Repr {
        original: 0x764f_b88d_bdf1_2c9e,
    };

    #[test]
    fn deconstruct() {
        let packet = Packet::new_checked(&HEADER_BYTES[..]).unwrap();
        assert_eq!(packet.original(), 0x764f_b88d_bdf1_2c9e);
    }

    #[test]
    fn construct() {
        let mut bytes = [0; 8];
        Packet::new_unchecked(&mut bytes[..]).set_original(0x764f_b88d_bdf1_2c9e);
        assert_eq!(bytes, HEADER_BYTES);
    }

    parse_emit_tests!(HEADER_BYTES, REPR);
}
