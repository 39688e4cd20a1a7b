//! Invalidate extended transport header: the R_Key a SEND_WITH_INV invalidates.

use core::fmt;

mod field {
    use crate::Field;

    pub const RKEY: Field = 0..4;
}

fixed_header_packet! {
    4;
    /// A read/write view of an IETH.
}

field_accessors! {
    /// The R_Key the responder must invalidate.
    rkey / set_rkey: u32 @ RKEY;
}

header_repr! {
    /// A parsed IETH.
    parse: "Parses the header (every bit pattern is valid).";
    emit: "Writes the header.";
    /// The R_Key to invalidate.
    rkey: u32 = [rkey] / set_rkey,
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
