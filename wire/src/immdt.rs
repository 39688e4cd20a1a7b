//! Immediate data: four opaque bytes delivered in the receive completion.

use core::fmt;

mod field {
    use crate::Field;

    pub const DATA: Field = 0..4;
}

fixed_header_packet! {
    4;
    /// A read/write view of an ImmDt header.
}

field_accessors! {
    /// The immediate value, as the big-endian integer verbs reports (`imm_data` is `__be32`).
    immediate / set_immediate: u32 @ DATA;
}

header_repr! {
    /// A parsed ImmDt header.
    parse: "Parses the header (every bit pattern is valid).";
    emit: "Writes the header.";
    /// The immediate value.
    immediate: u32 = [immediate] / set_immediate,
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
