//! Atomic acknowledge extended transport header: the value the target held before the atomic.

use core::fmt;

mod field {
    use crate::Field;

    pub const ORIGINAL: Field = 0..8;
}

fixed_header_packet! {
    8;
    /// A read/write view of an AtomicAckETH.
}

field_accessors! {
    /// The original remote value.
    original / set_original: u64 @ ORIGINAL;
}

header_repr! {
    /// A parsed AtomicAckETH.
    parse: "Parses the header (every bit pattern is valid).";
    emit: "Writes the header.";
    /// The original remote value.
    original: u64 = [original] / set_original,
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
