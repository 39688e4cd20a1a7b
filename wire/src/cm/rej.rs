//! REJ: a connection refused (IBTA Table 108).

use core::fmt;

use super::common::{length_within, CommIds, MessageKind};
use crate::{bits, read_u16, set_lone_bits, Result};

/// Bytes of private data.
pub const PRIVATE_DATA_LEN: usize = 148;
/// Bytes of additional rejection information (ARI).
pub const ARI_LEN: usize = 72;

mod field {
    use crate::Field;

    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    /// Message rejected in bits 7..6.
    pub const MESSAGE_REJECTED: usize = 8;
    /// Rejected info length in bits 7..1.
    pub const ARI_LENGTH: usize = 9;
    pub const REASON: Field = 10..12;
    pub const ARI: Field = 12..84;
    pub const PRIVATE_DATA: Field = 84..232;
}

cm_message_packet!("a REJ");

comm_id_accessors!(
    "The sender's communication ID (0 when it has none, e.g. no listener).",
    "The receiver's communication ID."
);

/// Why a connection was refused (`enum ib_cm_rej_reason`); unknown codes are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RejectReason(pub u16);

impl RejectReason {
    /// No QP available.
    pub const NO_QP: RejectReason = RejectReason(1);
    /// No resources.
    pub const NO_RESOURCES: RejectReason = RejectReason(3);
    /// The sender timed out waiting (e.g. for an RTU).
    pub const TIMEOUT: RejectReason = RejectReason(4);
    /// Unsupported request.
    pub const UNSUPPORTED: RejectReason = RejectReason(5);
    /// The communication ID is not known.
    pub const INVALID_COMM_ID: RejectReason = RejectReason(6);
    /// Nobody listens on the service ID.
    pub const INVALID_SERVICE_ID: RejectReason = RejectReason(8);
    /// Transport type not supported.
    pub const INVALID_TRANSPORT_TYPE: RejectReason = RejectReason(9);
    /// A connection from the same remote is still in time-wait or connected.
    pub const STALE_CONNECTION: RejectReason = RejectReason(10);
    /// The receiver's GID is not one of ours.
    pub const INVALID_GID: RejectReason = RejectReason(12);
    /// Path MTU not supported.
    pub const INVALID_MTU: RejectReason = RejectReason(26);
    /// The application refused (`rdma_reject`).
    pub const CONSUMER_DEFINED: RejectReason = RejectReason(28);
    /// Invalid class version.
    pub const INVALID_CLASS_VERSION: RejectReason = RejectReason(31);
}

field_accessors! {
    /// Bytes of ARI that are meaningful (7 bits).
    ari_length / set_ari_length: lone_bits(1, 7) @ ARI_LENGTH;
}

byte_array_accessors!(
    "Additional rejection information, all 72 bytes",
    ari / ari_mut / ari_array / set_ari: ARI, ARI_LEN
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The raw 2-bit code of the message rejected.
    pub fn message_rejected(&self) -> u8 {
        bits(self.buffer.as_ref()[field::MESSAGE_REJECTED], 6, 2)
    }

    /// The message rejected; the reserved code 3 is an error.
    fn message_kind(&self) -> Result<MessageKind> {
        MessageKind::from_bits(self.message_rejected())
    }

    /// The ARI length; over 72 is an error.
    fn checked_ari_length(&self) -> Result<u8> {
        length_within(self.ari_length(), ARI_LEN)
    }

    /// The reason.
    pub fn reason(&self) -> RejectReason {
        RejectReason(read_u16(&self.buffer.as_ref()[field::REASON]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the message rejected, clearing the reserved bits of its byte.
    pub fn set_message_rejected(&mut self, value: MessageKind) {
        set_lone_bits(
            &mut self.buffer.as_mut()[field::MESSAGE_REJECTED],
            6,
            2,
            value as u8,
        );
    }

    /// Sets the reason.
    pub fn set_reason(&mut self, value: RejectReason) {
        self.buffer.as_mut()[field::REASON].copy_from_slice(&value.0.to_be_bytes());
    }
}

cm_message_repr! {
    /// A parsed REJ.
    parse: "Parses a REJ; a reserved message code or an ARI length over 72 is an error.";
    emit: "Writes the REJ.";
    comm_ids;
    /// The message rejected.
    message_rejected: MessageKind = [message_kind?] / set_message_rejected,
    /// The reason.
    reason: RejectReason = [reason] / set_reason,
    /// Meaningful bytes of `ari`, at most [`ARI_LEN`].
    ari_length: u8 = [checked_ari_length?] / set_ari_length,
    /// Additional rejection information.
    ari: [u8; ARI_LEN] = [ari_array] / set_ari,
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} rejected={:?} reason={}",
            CommIds(self.local_comm_id, self.remote_comm_id),
            self.message_rejected,
            self.reason.0
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    /// The capture has no REJ: this one is laid out by hand from Table 108, as the kernel
    /// sends it to a REQ for a port nobody listens on (its local ID is the REQ's reserved
    /// word, zero; reason 8, invalid service ID).
    fn header_bytes() -> [u8; HEADER_LEN] {
        let mut bytes = [0; HEADER_LEN];
        bytes[..12].copy_from_slice(&[
            0x00, 0x00, 0x00, 0x00, 0x6f, 0xd0, 0xc1, 0xa6, 0x00, 0x04, 0x00, 0x08,
        ]);
        bytes[12] = 0x42;
        bytes[13] = 0x43;
        bytes[84] = 0x7e;
        bytes
    }

    fn repr() -> Repr {
        let mut ari = [0; ARI_LEN];
        ari[..2].copy_from_slice(&[0x42, 0x43]);
        let mut private_data = [0; PRIVATE_DATA_LEN];
        private_data[0] = 0x7e;
        Repr {
            local_comm_id: 0,
            remote_comm_id: 0x6fd0_c1a6,
            message_rejected: MessageKind::Req,
            reason: RejectReason::INVALID_SERVICE_ID,
            ari_length: 2,
            ari,
            private_data,
        }
    }

    #[test]
    fn deconstruct() {
        let bytes = header_bytes();
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(packet.local_comm_id(), 0);
        assert_eq!(packet.remote_comm_id(), 0x6fd0_c1a6);
        assert_eq!(packet.message_rejected(), 0);
        assert_eq!(packet.ari_length(), 2);
        assert_eq!(packet.reason(), RejectReason::INVALID_SERVICE_ID);
        assert_eq!(&packet.ari()[..3], &[0x42, 0x43, 0]);
        assert_eq!(packet.private_data()[0], 0x7e);
    }

    #[test]
    fn construct() {
        let expected = repr();
        let mut bytes = [0xA5; HEADER_LEN];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.set_local_comm_id(0);
        packet.set_remote_comm_id(0x6fd0_c1a6);
        packet.set_message_rejected(MessageKind::Req);
        packet.set_ari_length(2);
        packet.set_reason(RejectReason::INVALID_SERVICE_ID);
        packet.ari_mut().copy_from_slice(&expected.ari);
        packet
            .private_data_mut()
            .copy_from_slice(&expected.private_data);
        assert_eq!(bytes, header_bytes());
    }

    parse_emit_tests!(header_bytes(), repr());

    #[test]
    fn overlong_ari_is_refused() {
        let mut bytes = header_bytes();
        bytes[9] = 73 << 1;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Err(Error)
        );
    }
}
