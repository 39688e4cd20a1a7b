//! Atomic extended transport header: target and operands of COMPARE_SWAP and FETCH_ADD.

use core::fmt;

mod field {
    use crate::Field;

    pub const VIRTUAL_ADDRESS: Field = 0..8;
    pub const RKEY: Field = 8..12;
    pub const SWAP_ADD: Field = 12..20;
    pub const COMPARE: Field = 20..28;
}

fixed_header_packet! {
    28;
    /// A read/write view of an AtomicETH.
}

remote_address_accessors!("Remote address of the 8-byte target.");

field_accessors! {
    /// The value to swap in (COMPARE_SWAP) or to add (FETCH_ADD).
    swap_add / set_swap_add: u64 @ SWAP_ADD;
    /// The value to compare with (COMPARE_SWAP only).
    compare / set_compare: u64 @ COMPARE;
}

header_repr! {
    /// A parsed AtomicETH.
    parse: "Parses the header (every bit pattern is valid here; alignment is the responder's check).";
    emit: "Writes the header.";
    /// Remote address (the responder checks 8-byte alignment).
    virtual_address: u64 = [virtual_address] / set_virtual_address,
    /// Remote key.
    rkey: u32 = [rkey] / set_rkey,
    /// Swap or add operand.
    swap_add: u64 = [swap_add] / set_swap_add,
    /// Compare operand.
    compare: u64 = [compare] / set_compare,
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "atomiceth(va={:#x} rkey={:#010x} swap_add={:#x} compare={:#x})",
            self.virtual_address, self.rkey, self.swap_add, self.compare
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AtomicETH of an RC_FETCH_ADD in atomic_bw_fadd.pcap.
    static HEADER_BYTES: [u8; 28] = [
        0x00, 0x00, 0x56, 0x0d, 0x46, 0x2e, 0x40, 0x00, 0x00, 0x00, 0x07, 0x4d, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];

    const REPR: Repr = Repr {
        virtual_address: 0x560d_462e_4000,
        rkey: 0x74d,
        swap_add: 1,
        compare: 0,
    };

    #[test]
    fn deconstruct() {
        let packet = Packet::new_checked(&HEADER_BYTES[..]).unwrap();
        assert_eq!(packet.virtual_address(), 0x560d_462e_4000);
        assert_eq!(packet.rkey(), 0x74d);
        assert_eq!(packet.swap_add(), 1);
        assert_eq!(packet.compare(), 0);
    }

    #[test]
    fn construct() {
        let mut bytes = [0xA5; 28];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.set_virtual_address(0x560d_462e_4000);
        packet.set_rkey(0x74d);
        packet.set_swap_add(1);
        packet.set_compare(0);
        assert_eq!(bytes, HEADER_BYTES);
    }

    parse_emit_tests!(HEADER_BYTES, REPR);
}
