//! The common header of a management datagram (MAD): 24 bytes in front of every 256-byte
//! MAD that QP1 (the GSI) sends, whatever its management class.
//!
//! On RoCEv2 a MAD is the payload of a UD SEND_ONLY from QP1 to QP1 with Q_Key
//! [`GSI_QKEY`]; [`cm`](crate::cm) reads the communication manager's messages that follow.

use core::fmt;

use crate::{read_u32, read_u64, Result};

/// Bytes of the common header.
pub const HEADER_LEN: usize = 24;
/// Bytes of a whole MAD (`IB_MGMT_MAD_SIZE`); UD MADs always have this size.
pub const MAD_LEN: usize = 256;
/// Bytes after the common header (`IB_MGMT_MAD_DATA`).
pub const DATA_LEN: usize = MAD_LEN - HEADER_LEN;
/// The only base version there is.
pub const BASE_VERSION: u8 = 1;
/// Method `Send`, the only one the CM uses (`IB_MGMT_METHOD_SEND`).
pub const METHOD_SEND: u8 = 0x03;
/// QP number of the general services interface.
pub const GSI_QPN: u32 = 1;
/// The well-known Q_Key of QP1 (`IB_QP1_QKEY`).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The default, full-membership partition key QP1 sends with.
pub use crate::bth::DEFAULT_PKEY;

mod field {
    use crate::Field;

    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: Field = 4..6;
    pub const CLASS_SPECIFIC: Field = 6..8;
    pub const TRANSACTION_ID: Field = 8..16;
    pub const ATTRIBUTE_ID: Field = 16..18;
    pub const RESERVED: Field = 18..20;
    pub const ATTRIBUTE_MODIFIER: Field = 20..24;
    pub const DATA: Field = super::HEADER_LEN..super::MAD_LEN;
}

packet_view! {
    MAD_LEN,
    "a MAD (a longer one is fine: a UD payload never carries anything after the MAD, so the \
     excess is ignored)";
    /// A read/write view of a whole MAD: the common header and the class's data.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Base version; 1.
    pub fn base_version(&self) -> u8 {
        self.buffer.as_ref()[field::BASE_VERSION]
    }

    /// Management class, e.g. [`cm::MGMT_CLASS`](crate::cm::MGMT_CLASS).
    pub fn mgmt_class(&self) -> u8 {
        self.buffer.as_ref()[field::MGMT_CLASS]
    }

    /// Version of the class's format.
    pub fn class_version(&self) -> u8 {
        self.buffer.as_ref()[field::CLASS_VERSION]
    }

    /// Method (with the response bit 0x80).
    pub fn method(&self) -> u8 {
        self.buffer.as_ref()[field::METHOD]
    }

    /// Status.
    pub fn status(&self) -> u16 {
        u16::from_be_bytes([
            self.buffer.as_ref()[field::STATUS.start],
            self.buffer.as_ref()[field::STATUS.start + 1],
        ])
    }

    /// Class-specific word.
    pub fn class_specific(&self) -> u16 {
        let bytes = &self.buffer.as_ref()[field::CLASS_SPECIFIC];
        u16::from_be_bytes([bytes[0], bytes[1]])
    }

    /// Transaction ID; a reply carries the ID of the message it answers.
    pub fn transaction_id(&self) -> u64 {
        read_u64(&self.buffer.as_ref()[field::TRANSACTION_ID])
    }

    /// Attribute ID: which message of the class this is.
    pub fn attribute_id(&self) -> u16 {
        let bytes = &self.buffer.as_ref()[field::ATTRIBUTE_ID];
        u16::from_be_bytes([bytes[0], bytes[1]])
    }

    /// Attribute modifier.
    pub fn attribute_modifier(&self) -> u32 {
        read_u32(&self.buffer.as_ref()[field::ATTRIBUTE_MODIFIER])
    }

    /// The class's data after the header.
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::DATA]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the base version.
    pub fn set_base_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::BASE_VERSION] = value;
    }

    /// Sets the management class.
    pub fn set_mgmt_class(&mut self, value: u8) {
        self.buffer.as_mut()[field::MGMT_CLASS] = value;
    }

    /// Sets the class version.
    pub fn set_class_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::CLASS_VERSION] = value;
    }

    /// Sets the method.
    pub fn set_method(&mut self, value: u8) {
        self.buffer.as_mut()[field::METHOD] = value;
    }

    /// Sets the status.
    pub fn set_status(&mut self, value: u16) {
        self.buffer.as_mut()[field::STATUS].copy_from_slice(&value.to_be_bytes());
    }

    /// Sets the class-specific word.
    pub fn set_class_specific(&mut self, value: u16) {
        self.buffer.as_mut()[field::CLASS_SPECIFIC].copy_from_slice(&value.to_be_bytes());
    }

    /// Sets the transaction ID.
    pub fn set_transaction_id(&mut self, value: u64) {
        self.buffer.as_mut()[field::TRANSACTION_ID].copy_from_slice(&value.to_be_bytes());
    }

    /// Sets the attribute ID, clearing the reserved bytes after it.
    pub fn set_attribute_id(&mut self, value: u16) {
        let buffer = self.buffer.as_mut();
        buffer[field::ATTRIBUTE_ID].copy_from_slice(&value.to_be_bytes());
        buffer[field::RESERVED].fill(0);
    }

    /// Sets the attribute modifier.
    pub fn set_attribute_modifier(&mut self, value: u32) {
        self.buffer.as_mut()[field::ATTRIBUTE_MODIFIER].copy_from_slice(&value.to_be_bytes());
    }

    /// The class's data after the header, to fill.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::DATA]
    }
}

/// A parsed common MAD header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Base version.
    pub base_version: u8,
    /// Management class.
    pub mgmt_class: u8,
    /// Class version.
    pub class_version: u8,
    /// Method.
    pub method: u8,
    /// Status.
    pub status: u16,
    /// Class-specific word.
    pub class_specific: u16,
    /// Transaction ID.
    pub transaction_id: u64,
    /// Attribute ID.
    pub attribute_id: u16,
    /// Attribute modifier.
    pub attribute_modifier: u32,
}

impl Repr {
    /// Parses the common header (every bit pattern is valid; the class decides the rest).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        Ok(Repr {
            base_version: packet.base_version(),
            mgmt_class: packet.mgmt_class(),
            class_version: packet.class_version(),
            method: packet.method(),
            status: packet.status(),
            class_specific: packet.class_specific(),
            transaction_id: packet.transaction_id(),
            attribute_id: packet.attribute_id(),
            attribute_modifier: packet.attribute_modifier(),
        })
    }

    /// Bytes [`emit`](Self::emit) writes: the header only.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the common header; the data after it is left alone.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_base_version(self.base_version);
        packet.set_mgmt_class(self.mgmt_class);
        packet.set_class_version(self.class_version);
        packet.set_method(self.method);
        packet.set_status(self.status);
        packet.set_class_specific(self.class_specific);
        packet.set_transaction_id(self.transaction_id);
        packet.set_attribute_id(self.attribute_id);
        packet.set_attribute_modifier(self.attribute_modifier);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "mad(class={:#04x} v{} method={:#04x} status={:#06x} tid={:#018x} attr={:#06x})",
            self.mgmt_class,
            self.class_version,
            self.method,
            self.status,
            self.transaction_id,
            self.attribute_id
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::tests::capture_mad;
    use crate::Error;

    /// The header of the REQ in rping_rdmacm.pcap.
    static HEADER_BYTES: [u8; HEADER_LEN] = [
        0x01, 0x07, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0xa6, 0xc1, 0xd0,
        0x6f, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];

    const REPR: Repr = Repr {
        base_version: 1,
        mgmt_class: 0x07,
        class_version: 2,
        method: METHOD_SEND,
        status: 0,
        class_specific: 0,
        transaction_id: 0x2_a6c1_d06f,
        attribute_id: 0x0010,
        attribute_modifier: 0,
    };

    #[test]
    fn capture_starts_with_header() {
        assert_eq!(capture_mad(0)[..HEADER_LEN], HEADER_BYTES);
    }

    #[test]
    fn deconstruct() {
        let mad = capture_mad(0);
        let packet = Packet::new_checked(&mad[..]).unwrap();
        assert_eq!(packet.base_version(), 1);
        assert_eq!(packet.mgmt_class(), 0x07);
        assert_eq!(packet.class_version(), 2);
        assert_eq!(packet.method(), METHOD_SEND);
        assert_eq!(packet.status(), 0);
        assert_eq!(packet.class_specific(), 0);
        assert_eq!(packet.transaction_id(), 0x2_a6c1_d06f);
        assert_eq!(packet.attribute_id(), 0x0010);
        assert_eq!(packet.attribute_modifier(), 0);
        assert_eq!(packet.data(), &mad[HEADER_LEN..]);
    }

    #[test]
    fn construct() {
        let mut bytes = [0xA5; MAD_LEN];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.set_base_version(1);
        packet.set_mgmt_class(0x07);
        packet.set_class_version(2);
        packet.set_method(METHOD_SEND);
        packet.set_status(0);
        packet.set_class_specific(0);
        packet.set_transaction_id(0x2_a6c1_d06f);
        packet.set_attribute_id(0x0010);
        packet.set_attribute_modifier(0);
        assert_eq!(bytes[..HEADER_LEN], HEADER_BYTES);
        assert!(bytes[HEADER_LEN..].iter().all(|&b| b == 0xA5));
    }

    #[test]
    fn parse() {
        let mad = capture_mad(0);
        let packet = Packet::new_checked(&mad[..]).unwrap();
        assert_eq!(Repr::parse(&packet), Ok(REPR));
    }

    #[test]
    fn emit() {
        let mut bytes = [0xA5; MAD_LEN];
        REPR.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes[..HEADER_LEN], HEADER_BYTES);
    }

    #[test]
    fn short_buffer_is_rejected() {
        assert_eq!(Packet::new_checked(&[0u8; MAD_LEN - 1][..]), Err(Error));
    }
}
