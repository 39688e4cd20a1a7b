//! Shared by the fuzz targets: which bits `emit` may legitimately write differently from the
//! bytes a `Repr` was parsed from, and the check that every other bit came through unchanged.

use roce_wire::{bth, ExtHeader};

/// BTH bits that `bth::Repr` drops and `emit` zeroes: the reserved bits after FECN and BECN
/// (byte 4) and after AckReq (byte 8).
pub const BTH_RESERVED: [u8; bth::HEADER_LEN] = [0, 0, 0, 0, 0x3F, 0, 0, 0, 0x7F, 0, 0, 0];

const NONE_RESERVED: [u8; 28] = [0; 28];

/// Bits of an extension header that its `Repr` drops and `emit` zeroes.
pub fn ext_reserved(header: ExtHeader) -> &'static [u8] {
    match header {
        // The byte between the Q_Key and the source QPN.
        ExtHeader::Deth => &[0, 0, 0, 0, 0xFF, 0, 0, 0],
        // Bits 31–6 above the selectivity level and placement type.
        ExtHeader::Feth => &[0xFF, 0xFF, 0xFF, 0xC0],
        // A CNP body is 16 reserved bytes.
        ExtHeader::Cnp => &[0xFF; 16],
        // The byte before the XRC SRQ number.
        ExtHeader::XrcEth => &[0xFF, 0, 0, 0],
        other => &NONE_RESERVED[..other.wire_len()],
    }
}

/// Asserts that `emitted` equals the front of `input` in every bit not set in `ignored`.
pub fn assert_same_bits(input: &[u8], emitted: &[u8], ignored: &[u8]) {
    assert_eq!(emitted.len(), ignored.len());
    assert!(
        input.len() >= emitted.len(),
        "emit wrote more than was parsed"
    );
    for (i, ((a, b), m)) in input.iter().zip(emitted).zip(ignored).enumerate() {
        assert_eq!(
            (a ^ b) & !m,
            0,
            "byte {i}: input {a:#04x}, emitted {b:#04x}"
        );
    }
}
