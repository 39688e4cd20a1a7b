//! REP: the passive side's reply to a REQ (IBTA Table 110).

use core::fmt;

use super::{bits, set_bits, CommIds};
use crate::{read_u24, read_u32, read_u64, write_u24, Psn, Result};

/// Bytes of private data (`IB_CM_REP_PRIVATE_DATA_SIZE`).
pub const PRIVATE_DATA_LEN: usize = 196;

mod field {
    use crate::Field;

    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    pub const LOCAL_QKEY: Field = 8..12;
    pub const LOCAL_QPN: Field = 12..15;
    pub const STARTING_PSN: Field = 20..23;
    pub const RESPONDER_RESOURCES: usize = 24;
    pub const INITIATOR_DEPTH: usize = 25;
    /// Target ACK delay (7..3), failover accepted (2..1), flow control (0).
    pub const BYTE_26: usize = 26;
    /// RNR retry count (7..5), SRQ (4).
    pub const BYTE_27: usize = 27;
    pub const LOCAL_CA_GUID: Field = 28..36;
    pub const PRIVATE_DATA: Field = 36..232;
}

cm_message_packet!("a REP");

comm_id_accessors!(
    "The sender's communication ID.",
    "The receiver's communication ID (from its REQ)."
);
shared_byte_accessors!();

impl<T: AsRef<[u8]>> Packet<T> {
    /// The sender's Q_Key.
    pub fn local_qkey(&self) -> u32 {
        read_u32(&self.buffer.as_ref()[field::LOCAL_QKEY])
    }

    /// The sender's QPN (24 bits).
    pub fn local_qpn(&self) -> u32 {
        read_u24(&self.buffer.as_ref()[field::LOCAL_QPN])
    }

    /// The sender's starting PSN.
    pub fn starting_psn(&self) -> Psn {
        Psn::new(read_u24(&self.buffer.as_ref()[field::STARTING_PSN]))
    }

    /// The sender's responder resources.
    pub fn responder_resources(&self) -> u8 {
        self.byte(field::RESPONDER_RESOURCES)
    }

    /// The sender's initiator depth.
    pub fn initiator_depth(&self) -> u8 {
        self.byte(field::INITIATOR_DEPTH)
    }

    /// The sender's CA ACK delay exponent (5 bits).
    pub fn target_ack_delay(&self) -> u8 {
        bits(self.byte(field::BYTE_26), 3, 5)
    }

    /// Failover accepted (2 bits).
    pub fn failover_accepted(&self) -> u8 {
        bits(self.byte(field::BYTE_26), 1, 2)
    }

    /// End-to-end flow control.
    pub fn flow_control(&self) -> bool {
        bits(self.byte(field::BYTE_26), 0, 1) == 1
    }

    /// RNR retry count (3 bits).
    pub fn rnr_retry_count(&self) -> u8 {
        bits(self.byte(field::BYTE_27), 5, 3)
    }

    /// Whether the sender's QP uses an SRQ.
    pub fn srq(&self) -> bool {
        bits(self.byte(field::BYTE_27), 4, 1) == 1
    }

    /// The sender's CA GUID.
    pub fn local_ca_guid(&self) -> u64 {
        read_u64(&self.buffer.as_ref()[field::LOCAL_CA_GUID])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the local Q_Key.
    pub fn set_local_qkey(&mut self, value: u32) {
        self.buffer.as_mut()[field::LOCAL_QKEY].copy_from_slice(&value.to_be_bytes());
    }

    /// Sets the local QPN (low 24 bits).
    pub fn set_local_qpn(&mut self, value: u32) {
        write_u24(
            &mut self.buffer.as_mut()[field::LOCAL_QPN],
            value & 0xFF_FFFF,
        );
    }

    /// Sets the starting PSN.
    pub fn set_starting_psn(&mut self, value: Psn) {
        write_u24(
            &mut self.buffer.as_mut()[field::STARTING_PSN],
            value.value(),
        );
    }

    /// Sets the responder resources.
    pub fn set_responder_resources(&mut self, value: u8) {
        *self.byte_mut(field::RESPONDER_RESOURCES) = value;
    }

    /// Sets the initiator depth.
    pub fn set_initiator_depth(&mut self, value: u8) {
        *self.byte_mut(field::INITIATOR_DEPTH) = value;
    }

    /// Sets the target ACK delay (low 5 bits).
    pub fn set_target_ack_delay(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_26), 3, 5, value);
    }

    /// Sets failover accepted (low 2 bits).
    pub fn set_failover_accepted(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_26), 1, 2, value);
    }

    /// Sets end-to-end flow control.
    pub fn set_flow_control(&mut self, value: bool) {
        set_bits(self.byte_mut(field::BYTE_26), 0, 1, value.into());
    }

    /// Sets the RNR retry count (low 3 bits).
    pub fn set_rnr_retry_count(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_27), 5, 3, value);
    }

    /// Sets the SRQ flag.
    pub fn set_srq(&mut self, value: bool) {
        set_bits(self.byte_mut(field::BYTE_27), 4, 1, value.into());
    }

    /// Sets the local CA GUID.
    pub fn set_local_ca_guid(&mut self, value: u64) {
        self.buffer.as_mut()[field::LOCAL_CA_GUID].copy_from_slice(&value.to_be_bytes());
    }
}

/// A parsed REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The sender's Q_Key.
    pub local_qkey: u32,
    /// The sender's QPN, 24 bits.
    pub local_qpn: u32,
    /// The sender's starting PSN.
    pub starting_psn: Psn,
    /// The sender's responder resources.
    pub responder_resources: u8,
    /// The sender's initiator depth.
    pub initiator_depth: u8,
    /// The sender's CA ACK delay exponent, 5 bits.
    pub target_ack_delay: u8,
    /// Failover accepted, 2 bits.
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// RNR retry count, 3 bits.
    pub rnr_retry_count: u8,
    /// The sender uses an SRQ.
    pub srq: bool,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

fixed_len_repr!();

impl Repr {
    /// Parses a REP (every bit pattern is valid; reserved bits are ignored).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        Ok(Repr {
            local_comm_id: packet.local_comm_id(),
            remote_comm_id: packet.remote_comm_id(),
            local_qkey: packet.local_qkey(),
            local_qpn: packet.local_qpn(),
            starting_psn: packet.starting_psn(),
            responder_resources: packet.responder_resources(),
            initiator_depth: packet.initiator_depth(),
            target_ack_delay: packet.target_ack_delay(),
            failover_accepted: packet.failover_accepted(),
            flow_control: packet.flow_control(),
            rnr_retry_count: packet.rnr_retry_count(),
            srq: packet.srq(),
            local_ca_guid: packet.local_ca_guid(),
            private_data: packet.private_data_array(),
        })
    }

    /// Writes the REP, zeroing the reserved bits.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.clear();
        packet.set_comm_ids(self.local_comm_id, self.remote_comm_id);
        packet.set_local_qkey(self.local_qkey);
        packet.set_local_qpn(self.local_qpn);
        packet.set_starting_psn(self.starting_psn);
        packet.set_responder_resources(self.responder_resources);
        packet.set_initiator_depth(self.initiator_depth);
        packet.set_target_ack_delay(self.target_ack_delay);
        packet.set_failover_accepted(self.failover_accepted);
        packet.set_flow_control(self.flow_control);
        packet.set_rnr_retry_count(self.rnr_retry_count);
        packet.set_srq(self.srq);
        packet.set_local_ca_guid(self.local_ca_guid);
        packet.set_private_data(&self.private_data);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} qpn={:#08x} psn={:#08x} rres={} idepth={} ack_delay={} rnr_retry={}",
            CommIds(self.local_comm_id, self.remote_comm_id),
            self.local_qpn,
            self.starting_psn.value(),
            self.responder_resources,
            self.initiator_depth,
            self.target_ack_delay,
            self.rnr_retry_count
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::tests::capture_message;

    /// The kernel's REP in rping_rdmacm.pcap.
    fn header_bytes() -> [u8; HEADER_LEN] {
        capture_message(1)
    }

    const REPR: Repr = Repr {
        local_comm_id: 0x0322_dfd9,
        remote_comm_id: 0x6fd0_c1a6,
        local_qkey: 0,
        local_qpn: 0x1c,
        starting_psn: Psn::new(0x94e955),
        responder_resources: 1,
        initiator_depth: 1,
        target_ack_delay: 15,
        failover_accepted: 0,
        flow_control: false,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 0x5054_00ff_fe88_000b,
        private_data: [0; PRIVATE_DATA_LEN],
    };

    #[test]
    fn deconstruct() {
        let bytes = header_bytes();
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(packet.local_comm_id(), 0x0322_dfd9);
        assert_eq!(packet.remote_comm_id(), 0x6fd0_c1a6);
        assert_eq!(packet.local_qkey(), 0);
        assert_eq!(packet.local_qpn(), 0x1c);
        assert_eq!(packet.starting_psn(), Psn::new(0x94e955));
        assert_eq!(packet.responder_resources(), 1);
        assert_eq!(packet.initiator_depth(), 1);
        assert_eq!(packet.target_ack_delay(), 15);
        assert_eq!(packet.failover_accepted(), 0);
        assert!(!packet.flow_control());
        assert_eq!(packet.rnr_retry_count(), 7);
        assert!(!packet.srq());
        assert_eq!(packet.local_ca_guid(), 0x5054_00ff_fe88_000b);
        assert_eq!(packet.private_data(), &[0; PRIVATE_DATA_LEN][..]);
    }

    #[test]
    fn construct() {
        let mut bytes = [0xA5; HEADER_LEN];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.clear();
        packet.set_local_comm_id(0x0322_dfd9);
        packet.set_remote_comm_id(0x6fd0_c1a6);
        packet.set_local_qkey(0);
        packet.set_local_qpn(0x1c);
        packet.set_starting_psn(Psn::new(0x94e955));
        packet.set_responder_resources(1);
        packet.set_initiator_depth(1);
        packet.set_target_ack_delay(15);
        packet.set_failover_accepted(0);
        packet.set_flow_control(false);
        packet.set_rnr_retry_count(7);
        packet.set_srq(false);
        packet.set_local_ca_guid(0x5054_00ff_fe88_000b);
        assert_eq!(bytes, header_bytes());
    }

    parse_emit_tests!(header_bytes(), REPR);
}
