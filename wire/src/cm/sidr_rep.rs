//! SIDR_REP: the UD QP behind a service ID, or why there is none (IBTA Table 120).

use core::fmt;

use super::common::length_within;
use super::ServiceId;
use crate::{read_u24, write_u24, Result};

/// Bytes of private data.
pub const PRIVATE_DATA_LEN: usize = 136;
/// Bytes of additional information.
pub const INFO_LEN: usize = 72;

mod field {
    use crate::Field;

    pub const REQUEST_ID: Field = 0..4;
    pub const STATUS: usize = 4;
    pub const INFO_LENGTH: usize = 5;
    pub const RESERVED: Field = 6..8;
    pub const QPN: Field = 8..11;
    pub const RESERVED_AFTER_QPN: usize = 11;
    pub const SERVICE_ID: Field = 12..20;
    pub const QKEY: Field = 20..24;
    pub const INFO: Field = 24..96;
    pub const PRIVATE_DATA: Field = 96..232;
}

cm_message_packet!("a SIDR_REP");

/// The outcome of a SIDR_REQ (`enum ib_cm_sidr_status`); unknown codes are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrStatus(pub u8);

impl SidrStatus {
    /// The QPN and Q_Key are valid.
    pub const SUCCESS: SidrStatus = SidrStatus(0);
    /// Nobody serves the service ID.
    pub const UNSUPPORTED: SidrStatus = SidrStatus(1);
    /// The service refused.
    pub const REJECT: SidrStatus = SidrStatus(2);
    /// No QP available.
    pub const NO_QP: SidrStatus = SidrStatus(3);
    /// Ask elsewhere (the information says where).
    pub const REDIRECT: SidrStatus = SidrStatus(4);
    /// Class version not supported.
    pub const UNSUPPORTED_VERSION: SidrStatus = SidrStatus(5);
}

field_accessors! {
    /// The request ID of the SIDR_REQ answered.
    request_id / set_request_id: u32 @ REQUEST_ID;
    /// The service ID answered.
    service_id / set_service_id: service_id @ SERVICE_ID;
    /// The Q_Key to send with.
    qkey / set_qkey: u32 @ QKEY;
}

byte_array_accessors!(
    "Additional information, all 72 bytes",
    info / info_mut / info_array / set_info: INFO, INFO_LEN
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Status.
    pub fn status(&self) -> SidrStatus {
        SidrStatus(self.buffer.as_ref()[field::STATUS])
    }

    /// Meaningful bytes of the additional information.
    pub fn info_length(&self) -> u8 {
        self.buffer.as_ref()[field::INFO_LENGTH]
    }

    /// The information length; over 72 is an error.
    fn checked_info_length(&self) -> Result<u8> {
        length_within(self.info_length(), INFO_LEN)
    }

    /// The service's UD QPN (24 bits).
    pub fn qpn(&self) -> u32 {
        read_u24(&self.buffer.as_ref()[field::QPN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the status.
    pub fn set_status(&mut self, value: SidrStatus) {
        self.buffer.as_mut()[field::STATUS] = value.0;
    }

    /// Sets the information length, clearing the reserved (vendor) bytes after it.
    pub fn set_info_length(&mut self, value: u8) {
        let buffer = self.buffer.as_mut();
        buffer[field::INFO_LENGTH] = value;
        buffer[field::RESERVED].fill(0);
    }

    /// Sets the QPN (low 24 bits), clearing the byte after it.
    pub fn set_qpn(&mut self, value: u32) {
        let buffer = self.buffer.as_mut();
        write_u24(&mut buffer[field::QPN], value & 0xFF_FFFF);
        buffer[field::RESERVED_AFTER_QPN] = 0;
    }
}

cm_message_repr! {
    /// A parsed SIDR_REP.
    parse: "Parses a SIDR_REP; an information length over 72 is an error.";
    emit: "Writes the SIDR_REP.";
    /// Request ID answered.
    request_id: u32 = [request_id] / set_request_id,
    /// Status.
    status: SidrStatus = [status] / set_status,
    /// Meaningful bytes of `info`, at most [`INFO_LEN`].
    info_length: u8 = [checked_info_length?] / set_info_length,
    /// The service's QPN, 24 bits.
    qpn: u32 = [qpn] / set_qpn,
    /// The service ID.
    service_id: ServiceId = [service_id] / set_service_id,
    /// The Q_Key.
    qkey: u32 = [qkey] / set_qkey,
    /// Additional information.
    info: [u8; INFO_LEN] = [info_array] / set_info,
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "request_id={:#010x} status={} qpn={:#08x} qkey={:#010x} sid={}",
            self.request_id, self.status.0, self.qpn, self.qkey, self.service_id
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::PortSpace;
    use crate::Error;

    /// The capture has no SIDR: this SIDR_REP is laid out by hand from Table 120, as the
    /// answer to the SIDR_REQ of `sidr_req`'s tests (QPN 0x11, Q_Key `RDMA_UDP_QKEY`).
    fn header_bytes() -> [u8; HEADER_LEN] {
        let mut bytes = [0; HEADER_LEN];
        bytes[..24].copy_from_slice(&[
            0x12, 0x34, 0x56, 0x78, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x11, 0x00, 0, 0, 0, 0,
            0x01, 0x11, 0x1c, 0x06, 0x01, 0x23, 0x45, 0x67,
        ]);
        bytes[96] = 0x99;
        bytes
    }

    fn repr() -> Repr {
        let mut private_data = [0; PRIVATE_DATA_LEN];
        private_data[0] = 0x99;
        Repr {
            request_id: 0x1234_5678,
            status: SidrStatus::SUCCESS,
            info_length: 0,
            qpn: 0x11,
            service_id: ServiceId::rdma_ip(PortSpace::Udp, 7174),
            qkey: 0x0123_4567,
            info: [0; INFO_LEN],
            private_data,
        }
    }

    #[test]
    fn deconstruct() {
        let bytes = header_bytes();
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(packet.request_id(), 0x1234_5678);
        assert_eq!(packet.status(), SidrStatus::SUCCESS);
        assert_eq!(packet.info_length(), 0);
        assert_eq!(packet.qpn(), 0x11);
        assert_eq!(packet.service_id(), ServiceId(0x0111_1c06));
        assert_eq!(packet.qkey(), 0x0123_4567);
        assert_eq!(packet.info(), &[0; INFO_LEN][..]);
        assert_eq!(packet.private_data()[0], 0x99);
    }

    #[test]
    fn construct() {
        let mut bytes = [0xA5; HEADER_LEN];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.set_request_id(0x1234_5678);
        packet.set_status(SidrStatus::SUCCESS);
        packet.set_info_length(0);
        packet.set_qpn(0x11);
        packet.set_service_id(ServiceId(0x0111_1c06));
        packet.set_qkey(0x0123_4567);
        packet.info_mut().fill(0);
        packet
            .private_data_mut()
            .copy_from_slice(&repr().private_data);
        assert_eq!(bytes, header_bytes());
    }

    parse_emit_tests!(header_bytes(), repr());

    #[test]
    fn overlong_info_is_refused() {
        let mut bytes = header_bytes();
        bytes[5] = 73;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Err(Error)
        );
    }
}
