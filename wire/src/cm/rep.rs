//! REP: the passive side's reply to a REQ (IBTA Table 110).

use core::fmt;

use super::common::CommIds;
use crate::Psn;

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
clear_method!();

field_accessors! {
    /// The sender's Q_Key.
    local_qkey / set_local_qkey: u32 @ LOCAL_QKEY;
    /// The sender's QPN (24 bits).
    local_qpn / set_local_qpn: u24 @ LOCAL_QPN;
    /// The sender's starting PSN.
    starting_psn / set_starting_psn: psn @ STARTING_PSN;
    /// The sender's responder resources.
    responder_resources / set_responder_resources: u8 @ RESPONDER_RESOURCES;
    /// The sender's initiator depth.
    initiator_depth / set_initiator_depth: u8 @ INITIATOR_DEPTH;
    /// The sender's CA ACK delay exponent (5 bits).
    target_ack_delay / set_target_ack_delay: bits(3, 5) @ BYTE_26;
    /// Failover accepted (2 bits).
    failover_accepted / set_failover_accepted: bits(1, 2) @ BYTE_26;
    /// End-to-end flow control.
    flow_control / set_flow_control: flag(0) @ BYTE_26;
    /// RNR retry count (3 bits).
    rnr_retry_count / set_rnr_retry_count: bits(5, 3) @ BYTE_27;
    /// Whether the sender's QP uses an SRQ.
    srq / set_srq: flag(4) @ BYTE_27;
    /// The sender's CA GUID.
    local_ca_guid / set_local_ca_guid: u64 @ LOCAL_CA_GUID;
}

cm_message_repr! {
    /// A parsed REP.
    parse: "Parses a REP (every bit pattern is valid; reserved bits are ignored).";
    emit: "Writes the REP, zeroing the reserved bits.", clear first;
    comm_ids;
    /// The sender's Q_Key.
    local_qkey: u32 = [local_qkey] / set_local_qkey,
    /// The sender's QPN, 24 bits.
    local_qpn: u32 = [local_qpn] / set_local_qpn,
    /// The sender's starting PSN.
    starting_psn: Psn = [starting_psn] / set_starting_psn,
    /// The sender's responder resources.
    responder_resources: u8 = [responder_resources] / set_responder_resources,
    /// The sender's initiator depth.
    initiator_depth: u8 = [initiator_depth] / set_initiator_depth,
    /// The sender's CA ACK delay exponent, 5 bits.
    target_ack_delay: u8 = [target_ack_delay] / set_target_ack_delay,
    /// Failover accepted, 2 bits.
    failover_accepted: u8 = [failover_accepted] / set_failover_accepted,
    /// End-to-end flow control.
    flow_control: bool = [flow_control] / set_flow_control,
    /// RNR retry count, 3 bits.
    rnr_retry_count: u8 = [rnr_retry_count] / set_rnr_retry_count,
    /// The sender uses an SRQ.
    srq: bool = [srq] / set_srq,
    /// The sender's CA GUID.
    local_ca_guid: u64 = [local_ca_guid] / set_local_ca_guid,
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
