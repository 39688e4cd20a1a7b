//! FLUSH extended transport header (IBTA memory placement extensions): what to make
//! persistent or globally visible.

use core::fmt;

use crate::{read_u32, Result};

mod field {
    use crate::Field;

    /// Reserved (31–6), selectivity level (5–4), placement type (3–0), big-endian.
    pub const BITS: Field = 0..4;
}

fixed_header_packet! {
    4;
    /// A read/write view of a FETH.
}

const PLACEMENT_MASK: u32 = 0x0F;
const SELECTIVITY_SHIFT: u32 = 4;
const SELECTIVITY_MASK: u32 = 0x30;

impl<T: AsRef<[u8]>> Packet<T> {
    /// Placement type bits: 1 = global visibility, 2 = persistence.
    pub fn placement_type(&self) -> u8 {
        (read_u32(&self.buffer.as_ref()[field::BITS]) & PLACEMENT_MASK) as u8
    }

    /// Selectivity level: 0 = the addressed range, 1 = the whole memory region.
    pub fn selectivity_level(&self) -> u8 {
        ((read_u32(&self.buffer.as_ref()[field::BITS]) & SELECTIVITY_MASK) >> SELECTIVITY_SHIFT)
            as u8
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets both fields, clearing the reserved bits.
    pub fn set_fields(&mut self, selectivity_level: u8, placement_type: u8) {
        let bits = ((u32::from(selectivity_level) << SELECTIVITY_SHIFT) & SELECTIVITY_MASK)
            | (u32::from(placement_type) & PLACEMENT_MASK);
        self.buffer.as_mut()[field::BITS].copy_from_slice(&bits.to_be_bytes());
    }
}

/// A parsed FETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Selectivity level (2 bits).
    pub selectivity_level: u8,
    /// Placement type (4 bits).
    pub placement_type: u8,
}

fixed_len_repr!();

impl Repr {
    /// Parses the header; reserved bits are ignored.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        Ok(Repr {
            selectivity_level: packet.selectivity_level(),
            placement_type: packet.placement_type(),
        })
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_fields(self.selectivity_level, self.placement_type);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "feth(sel={} plt={})",
            self.selectivity_level, self.placement_type
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory-region selectivity, persistence placement (as rxe's feth_init writes it).
    static HEADER_BYTES: [u8; 4] = [0x00, 0x00, 0x00, 0x12];

    const REPR: Repr = Repr {
        selectivity_level: 1,
        placement_type: 2,
    };

    #[test]
    fn deconstruct() {
        let packet = Packet::new_checked(&HEADER_BYTES[..]).unwrap();
        assert_eq!(packet.selectivity_level(), 1);
        assert_eq!(packet.placement_type(), 2);
    }

    #[test]
    fn construct() {
        let mut bytes = [0xA5; 4];
        Packet::new_unchecked(&mut bytes[..]).set_fields(1, 2);
        assert_eq!(bytes, HEADER_BYTES);
    }

    parse_emit_tests!(HEADER_BYTES, REPR);
}
