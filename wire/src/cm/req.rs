//! REQ: the active side's connection request (IBTA Table 106).

use core::fmt;

use super::{path, ServiceId};
use crate::{bits, set_bits, Psn, Result};

/// Bytes of private data (`IB_CM_REQ_PRIVATE_DATA_SIZE`); rdma_cm puts its [header](super::cma) first.
pub const PRIVATE_DATA_LEN: usize = 92;

mod field {
    use crate::Field;

    pub const LOCAL_COMM_ID: Field = 0..4;
    /// ECE vendor ID (kernels from 5.9 on); byte 4 is reserved.
    pub const VENDOR_ID: Field = 5..8;
    pub const SERVICE_ID: Field = 8..16;
    pub const LOCAL_CA_GUID: Field = 16..24;
    pub const LOCAL_QKEY: Field = 28..32;
    pub const LOCAL_QPN: Field = 32..35;
    pub const RESPONDER_RESOURCES: usize = 35;
    pub const INITIATOR_DEPTH: usize = 39;
    /// Remote CM response timeout (7..3), transport service type (2..1), flow control (0).
    pub const BYTE_43: usize = 43;
    pub const STARTING_PSN: Field = 44..47;
    /// Local CM response timeout (7..3), retry count (2..0).
    pub const BYTE_47: usize = 47;
    pub const PKEY: Field = 48..50;
    /// Path MTU (7..4), RDC exists (3), RNR retry count (2..0).
    pub const BYTE_50: usize = 50;
    /// Max CM retries (7..4), SRQ (3), extended transport type (2..0).
    pub const BYTE_51: usize = 51;
    pub const PRIMARY_PATH: Field = 52..96;
    pub const ALTERNATE_PATH: Field = 96..140;
    pub const PRIVATE_DATA: Field = 140..232;
}

cm_message_packet!("a REQ");

clear_method!();

/// The transport service type of the requested connection (2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServiceType {
    /// Reliable connection.
    Rc = 0,
    /// Unreliable connection.
    Uc = 1,
    /// Reliable datagram.
    Rd = 2,
    /// See the extended transport type (XRC).
    Extended = 3,
}

impl ServiceType {
    const fn from_bits(bits: u8) -> ServiceType {
        match bits & 3 {
            0 => ServiceType::Rc,
            1 => ServiceType::Uc,
            2 => ServiceType::Rd,
            _ => ServiceType::Extended,
        }
    }
}

field_accessors! {
    /// The sender's communication ID for this connection.
    local_comm_id / set_local_comm_id: u32 @ LOCAL_COMM_ID;
    /// ECE vendor ID (24 bits); zero when unused.
    vendor_id / set_vendor_id: u24 @ VENDOR_ID;
    /// The service the sender wants to reach.
    service_id / set_service_id: service_id @ SERVICE_ID;
    /// The sender's channel adapter GUID.
    local_ca_guid / set_local_ca_guid: u64 @ LOCAL_CA_GUID;
    /// The sender's Q_Key (UD/RD only).
    local_qkey / set_local_qkey: u32 @ LOCAL_QKEY;
    /// The sender's QP number (24 bits).
    local_qpn / set_local_qpn: u24 @ LOCAL_QPN;
    /// RDMA READs and atomics the sender accepts at once as responder.
    responder_resources / set_responder_resources: u8 @ RESPONDER_RESOURCES;
    /// RDMA READs and atomics the sender issues at once as requester.
    initiator_depth / set_initiator_depth: u8 @ INITIATOR_DEPTH;
    /// Exponent of the time the receiver may take to answer (5 bits).
    remote_cm_response_timeout / set_remote_cm_response_timeout: bits(3, 5) @ BYTE_43;
    /// End-to-end flow control.
    flow_control / set_flow_control: flag(0) @ BYTE_43;
    /// The sender's first send PSN, the receiver's expected PSN.
    starting_psn / set_starting_psn: psn @ STARTING_PSN;
    /// Exponent of the time the sender takes to answer (5 bits).
    local_cm_response_timeout / set_local_cm_response_timeout: bits(3, 5) @ BYTE_47;
    /// Transport retry count (3 bits).
    retry_count / set_retry_count: bits(0, 3) @ BYTE_47;
    /// Partition key.
    pkey / set_pkey: u16 @ PKEY;
    /// Path MTU (4 bits, IB enum: 1 = 256 … 5 = 4096).
    path_mtu / set_path_mtu: bits(4, 4) @ BYTE_50;
    /// RNR retry count (3 bits; 7 is infinite).
    rnr_retry_count / set_rnr_retry_count: bits(0, 3) @ BYTE_50;
    /// How often the sender resends a CM message before giving up (4 bits).
    max_cm_retries / set_max_cm_retries: bits(4, 4) @ BYTE_51;
    /// Whether the sender's QP uses a shared receive queue.
    srq / set_srq: flag(3) @ BYTE_51;
    /// Extended transport type (3 bits; 1 is XRC).
    extended_transport_type / set_extended_transport_type: bits(0, 3) @ BYTE_51;
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Transport service type.
    pub fn service_type(&self) -> ServiceType {
        ServiceType::from_bits(bits(self.buffer.as_ref()[field::BYTE_43], 1, 2))
    }

    /// The primary path.
    pub fn primary_path(&self) -> path::Packet<&[u8]> {
        path::Packet::new_unchecked(&self.buffer.as_ref()[field::PRIMARY_PATH])
    }

    /// The alternate path; all zero when there is none.
    pub fn alternate_path(&self) -> path::Packet<&[u8]> {
        path::Packet::new_unchecked(&self.buffer.as_ref()[field::ALTERNATE_PATH])
    }

    fn primary_path_repr(&self) -> Result<path::Repr> {
        path::Repr::parse(&self.primary_path())
    }

    fn alternate_path_repr(&self) -> Result<path::Repr> {
        path::Repr::parse(&self.alternate_path())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the transport service type.
    pub fn set_service_type(&mut self, value: ServiceType) {
        set_bits(&mut self.buffer.as_mut()[field::BYTE_43], 1, 2, value as u8);
    }

    /// The primary path, to fill.
    pub fn primary_path_mut(&mut self) -> path::Packet<&mut [u8]> {
        path::Packet::new_unchecked(&mut self.buffer.as_mut()[field::PRIMARY_PATH])
    }

    /// The alternate path, to fill.
    pub fn alternate_path_mut(&mut self) -> path::Packet<&mut [u8]> {
        path::Packet::new_unchecked(&mut self.buffer.as_mut()[field::ALTERNATE_PATH])
    }

    fn set_primary_path_repr(&mut self, value: path::Repr) {
        value.emit(&mut self.primary_path_mut());
    }

    fn set_alternate_path_repr(&mut self, value: path::Repr) {
        value.emit(&mut self.alternate_path_mut());
    }
}

cm_message_repr! {
    /// A parsed REQ.
    parse: "Parses a REQ (every bit pattern is valid; reserved bits are ignored).";
    emit: "Writes the REQ, zeroing the reserved bits.", clear first;
    /// The sender's communication ID.
    local_comm_id: u32 = [local_comm_id] / set_local_comm_id,
    /// ECE vendor ID, 24 bits.
    vendor_id: u32 = [vendor_id] / set_vendor_id,
    /// The requested service.
    service_id: ServiceId = [service_id] / set_service_id,
    /// The sender's CA GUID.
    local_ca_guid: u64 = [local_ca_guid] / set_local_ca_guid,
    /// The sender's Q_Key.
    local_qkey: u32 = [local_qkey] / set_local_qkey,
    /// The sender's QPN, 24 bits.
    local_qpn: u32 = [local_qpn] / set_local_qpn,
    /// The sender's responder resources.
    responder_resources: u8 = [responder_resources] / set_responder_resources,
    /// The sender's initiator depth.
    initiator_depth: u8 = [initiator_depth] / set_initiator_depth,
    /// Remote CM response timeout exponent, 5 bits.
    remote_cm_response_timeout: u8 = [remote_cm_response_timeout] / set_remote_cm_response_timeout,
    /// Transport service type.
    service_type: ServiceType = [service_type] / set_service_type,
    /// End-to-end flow control.
    flow_control: bool = [flow_control] / set_flow_control,
    /// The sender's starting PSN.
    starting_psn: Psn = [starting_psn] / set_starting_psn,
    /// Local CM response timeout exponent, 5 bits.
    local_cm_response_timeout: u8 = [local_cm_response_timeout] / set_local_cm_response_timeout,
    /// Retry count, 3 bits.
    retry_count: u8 = [retry_count] / set_retry_count,
    /// Partition key.
    pkey: u16 = [pkey] / set_pkey,
    /// Path MTU (IB enum), 4 bits.
    path_mtu: u8 = [path_mtu] / set_path_mtu,
    /// RNR retry count, 3 bits.
    rnr_retry_count: u8 = [rnr_retry_count] / set_rnr_retry_count,
    /// Max CM retries, 4 bits.
    max_cm_retries: u8 = [max_cm_retries] / set_max_cm_retries,
    /// The sender uses an SRQ.
    srq: bool = [srq] / set_srq,
    /// Extended transport type, 3 bits.
    extended_transport_type: u8 = [extended_transport_type] / set_extended_transport_type,
    /// Primary path.
    primary_path: path::Repr = [primary_path_repr?] / set_primary_path_repr,
    /// Alternate path (all zero: none).
    alternate_path: path::Repr = [alternate_path_repr?] / set_alternate_path_repr,
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "local_id={:#010x} sid={} qpn={:#08x} psn={:#08x} mtu={} rres={} idepth={} retry={} rnr_retry={} ack_timeout={}",
            self.local_comm_id,
            self.service_id,
            self.local_qpn,
            self.starting_psn.value(),
            self.path_mtu,
            self.responder_resources,
            self.initiator_depth,
            self.retry_count,
            self.rnr_retry_count,
            self.primary_path.local_ack_timeout
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::tests::capture_message;
    use crate::cm::PortSpace;

    /// rping's REQ in rping_rdmacm.pcap: the message after the MAD header.
    fn header_bytes() -> [u8; HEADER_LEN] {
        capture_message(0)
    }

    fn repr() -> Repr {
        let bytes = header_bytes();
        let primary_path =
            path::Repr::parse(&path::Packet::new_checked(&bytes[52..96]).unwrap()).unwrap();
        let mut private_data = [0; PRIVATE_DATA_LEN];
        private_data[..36].copy_from_slice(&[
            0x00, 0x40, 0xb0, 0xab, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 88, 0, 12, 0, 0, 0, 0,
            0, 0, 0, 0, 0, 0, 0, 0, 10, 88, 0, 11,
        ]);
        Repr {
            local_comm_id: 0x6fd0_c1a6,
            vendor_id: 0,
            service_id: ServiceId::rdma_ip(PortSpace::Tcp, 7174),
            local_ca_guid: 0x5054_00ff_fe88_000c,
            local_qkey: 0,
            local_qpn: 0x1c,
            responder_resources: 1,
            initiator_depth: 1,
            remote_cm_response_timeout: 20,
            service_type: ServiceType::Rc,
            flow_control: false,
            starting_psn: Psn::new(0x709d4f),
            local_cm_response_timeout: 20,
            retry_count: 7,
            pkey: 0xFFFF,
            path_mtu: 3,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: false,
            extended_transport_type: 0,
            primary_path,
            alternate_path: path::Repr::default(),
            private_data,
        }
    }

    #[test]
    fn deconstruct() {
        let bytes = header_bytes();
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(packet.local_comm_id(), 0x6fd0_c1a6);
        assert_eq!(packet.vendor_id(), 0);
        assert_eq!(packet.service_id(), ServiceId(0x0106_1c06));
        assert_eq!(packet.local_ca_guid(), 0x5054_00ff_fe88_000c);
        assert_eq!(packet.local_qkey(), 0);
        assert_eq!(packet.local_qpn(), 0x1c);
        assert_eq!(packet.responder_resources(), 1);
        assert_eq!(packet.initiator_depth(), 1);
        assert_eq!(packet.remote_cm_response_timeout(), 20);
        assert_eq!(packet.service_type(), ServiceType::Rc);
        assert!(!packet.flow_control());
        assert_eq!(packet.starting_psn(), Psn::new(0x709d4f));
        assert_eq!(packet.local_cm_response_timeout(), 20);
        assert_eq!(packet.retry_count(), 7);
        assert_eq!(packet.pkey(), 0xFFFF);
        assert_eq!(packet.path_mtu(), 3);
        assert_eq!(packet.rnr_retry_count(), 7);
        assert_eq!(packet.max_cm_retries(), 15);
        assert!(!packet.srq());
        assert_eq!(packet.extended_transport_type(), 0);
        assert_eq!(packet.primary_path().hop_limit(), 64);
        assert_eq!(packet.primary_path().local_ack_timeout(), 19);
        assert_eq!(packet.alternate_path().into_inner(), &[0; 44][..]);
        assert_eq!(packet.private_data()[..4], [0x00, 0x40, 0xb0, 0xab]);
    }

    #[test]
    fn construct() {
        let reference = header_bytes();
        let expected = repr();
        let mut bytes = [0xA5; HEADER_LEN];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.clear();
        packet.set_local_comm_id(0x6fd0_c1a6);
        packet.set_vendor_id(0);
        packet.set_service_id(ServiceId(0x0106_1c06));
        packet.set_local_ca_guid(0x5054_00ff_fe88_000c);
        packet.set_local_qkey(0);
        packet.set_local_qpn(0x1c);
        packet.set_responder_resources(1);
        packet.set_initiator_depth(1);
        packet.set_remote_cm_response_timeout(20);
        packet.set_service_type(ServiceType::Rc);
        packet.set_flow_control(false);
        packet.set_starting_psn(Psn::new(0x709d4f));
        packet.set_local_cm_response_timeout(20);
        packet.set_retry_count(7);
        packet.set_pkey(0xFFFF);
        packet.set_path_mtu(3);
        packet.set_rnr_retry_count(7);
        packet.set_max_cm_retries(15);
        packet.set_srq(false);
        packet.set_extended_transport_type(0);
        expected.primary_path.emit(&mut packet.primary_path_mut());
        packet
            .private_data_mut()
            .copy_from_slice(&expected.private_data);
        assert_eq!(bytes, reference);
    }

    parse_emit_tests!(header_bytes(), repr());
}
