//! REQ: the active side's connection request (IBTA Table 106).

use core::fmt;

use super::{bits, path, read_u16, set_bits, ServiceId};
use crate::{read_u24, read_u32, read_u64, write_u24, Psn, Result};

/// Bytes of private data (`IB_CM_REQ_PRIVATE_DATA_SIZE`).
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

shared_byte_accessors!();

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

impl<T: AsRef<[u8]>> Packet<T> {
    /// The sender's communication ID for this connection.
    pub fn local_comm_id(&self) -> u32 {
        read_u32(&self.buffer.as_ref()[field::LOCAL_COMM_ID])
    }

    /// ECE vendor ID (24 bits); zero when unused.
    pub fn vendor_id(&self) -> u32 {
        read_u24(&self.buffer.as_ref()[field::VENDOR_ID])
    }

    /// The service the sender wants to reach.
    pub fn service_id(&self) -> ServiceId {
        ServiceId(read_u64(&self.buffer.as_ref()[field::SERVICE_ID]))
    }

    /// The sender's channel adapter GUID.
    pub fn local_ca_guid(&self) -> u64 {
        read_u64(&self.buffer.as_ref()[field::LOCAL_CA_GUID])
    }

    /// The sender's Q_Key (UD/RD only).
    pub fn local_qkey(&self) -> u32 {
        read_u32(&self.buffer.as_ref()[field::LOCAL_QKEY])
    }

    /// The sender's QP number (24 bits).
    pub fn local_qpn(&self) -> u32 {
        read_u24(&self.buffer.as_ref()[field::LOCAL_QPN])
    }

    /// RDMA READs and atomics the sender accepts at once as responder.
    pub fn responder_resources(&self) -> u8 {
        self.byte(field::RESPONDER_RESOURCES)
    }

    /// RDMA READs and atomics the sender issues at once as requester.
    pub fn initiator_depth(&self) -> u8 {
        self.byte(field::INITIATOR_DEPTH)
    }

    /// Exponent of the time the receiver may take to answer (5 bits).
    pub fn remote_cm_response_timeout(&self) -> u8 {
        bits(self.byte(field::BYTE_43), 3, 5)
    }

    /// Transport service type.
    pub fn service_type(&self) -> ServiceType {
        ServiceType::from_bits(bits(self.byte(field::BYTE_43), 1, 2))
    }

    /// End-to-end flow control.
    pub fn flow_control(&self) -> bool {
        bits(self.byte(field::BYTE_43), 0, 1) == 1
    }

    /// The sender's first send PSN, the receiver's expected PSN.
    pub fn starting_psn(&self) -> Psn {
        Psn::new(read_u24(&self.buffer.as_ref()[field::STARTING_PSN]))
    }

    /// Exponent of the time the sender takes to answer (5 bits).
    pub fn local_cm_response_timeout(&self) -> u8 {
        bits(self.byte(field::BYTE_47), 3, 5)
    }

    /// Transport retry count (3 bits).
    pub fn retry_count(&self) -> u8 {
        bits(self.byte(field::BYTE_47), 0, 3)
    }

    /// Partition key.
    pub fn pkey(&self) -> u16 {
        read_u16(&self.buffer.as_ref()[field::PKEY])
    }

    /// Path MTU (4 bits, IB enum: 1 = 256 … 5 = 4096).
    pub fn path_mtu(&self) -> u8 {
        bits(self.byte(field::BYTE_50), 4, 4)
    }

    /// RNR retry count (3 bits; 7 is infinite).
    pub fn rnr_retry_count(&self) -> u8 {
        bits(self.byte(field::BYTE_50), 0, 3)
    }

    /// How often the sender resends a CM message before giving up (4 bits).
    pub fn max_cm_retries(&self) -> u8 {
        bits(self.byte(field::BYTE_51), 4, 4)
    }

    /// Whether the sender's QP uses a shared receive queue.
    pub fn srq(&self) -> bool {
        bits(self.byte(field::BYTE_51), 3, 1) == 1
    }

    /// Extended transport type (3 bits; 1 is XRC).
    pub fn extended_transport_type(&self) -> u8 {
        bits(self.byte(field::BYTE_51), 0, 3)
    }

    /// The primary path.
    pub fn primary_path(&self) -> path::Packet<&[u8]> {
        path::Packet::new_unchecked(&self.buffer.as_ref()[field::PRIMARY_PATH])
    }

    /// The alternate path; all zero when there is none.
    pub fn alternate_path(&self) -> path::Packet<&[u8]> {
        path::Packet::new_unchecked(&self.buffer.as_ref()[field::ALTERNATE_PATH])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the local communication ID.
    pub fn set_local_comm_id(&mut self, value: u32) {
        self.buffer.as_mut()[field::LOCAL_COMM_ID].copy_from_slice(&value.to_be_bytes());
    }

    /// Sets the ECE vendor ID (low 24 bits).
    pub fn set_vendor_id(&mut self, value: u32) {
        write_u24(
            &mut self.buffer.as_mut()[field::VENDOR_ID],
            value & 0xFF_FFFF,
        );
    }

    /// Sets the service ID.
    pub fn set_service_id(&mut self, value: ServiceId) {
        self.buffer.as_mut()[field::SERVICE_ID].copy_from_slice(&value.0.to_be_bytes());
    }

    /// Sets the local CA GUID.
    pub fn set_local_ca_guid(&mut self, value: u64) {
        self.buffer.as_mut()[field::LOCAL_CA_GUID].copy_from_slice(&value.to_be_bytes());
    }

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

    /// Sets the responder resources.
    pub fn set_responder_resources(&mut self, value: u8) {
        *self.byte_mut(field::RESPONDER_RESOURCES) = value;
    }

    /// Sets the initiator depth.
    pub fn set_initiator_depth(&mut self, value: u8) {
        *self.byte_mut(field::INITIATOR_DEPTH) = value;
    }

    /// Sets the remote CM response timeout (low 5 bits).
    pub fn set_remote_cm_response_timeout(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_43), 3, 5, value);
    }

    /// Sets the transport service type.
    pub fn set_service_type(&mut self, value: ServiceType) {
        set_bits(self.byte_mut(field::BYTE_43), 1, 2, value as u8);
    }

    /// Sets end-to-end flow control.
    pub fn set_flow_control(&mut self, value: bool) {
        set_bits(self.byte_mut(field::BYTE_43), 0, 1, value.into());
    }

    /// Sets the starting PSN.
    pub fn set_starting_psn(&mut self, value: Psn) {
        write_u24(
            &mut self.buffer.as_mut()[field::STARTING_PSN],
            value.value(),
        );
    }

    /// Sets the local CM response timeout (low 5 bits).
    pub fn set_local_cm_response_timeout(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_47), 3, 5, value);
    }

    /// Sets the retry count (low 3 bits).
    pub fn set_retry_count(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_47), 0, 3, value);
    }

    /// Sets the partition key.
    pub fn set_pkey(&mut self, value: u16) {
        self.buffer.as_mut()[field::PKEY].copy_from_slice(&value.to_be_bytes());
    }

    /// Sets the path MTU (low 4 bits).
    pub fn set_path_mtu(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_50), 4, 4, value);
    }

    /// Sets the RNR retry count (low 3 bits).
    pub fn set_rnr_retry_count(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_50), 0, 3, value);
    }

    /// Sets the maximum CM retries (low 4 bits).
    pub fn set_max_cm_retries(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_51), 4, 4, value);
    }

    /// Sets the SRQ flag.
    pub fn set_srq(&mut self, value: bool) {
        set_bits(self.byte_mut(field::BYTE_51), 3, 1, value.into());
    }

    /// Sets the extended transport type (low 3 bits).
    pub fn set_extended_transport_type(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_51), 0, 3, value);
    }

    /// The primary path, to fill.
    pub fn primary_path_mut(&mut self) -> path::Packet<&mut [u8]> {
        path::Packet::new_unchecked(&mut self.buffer.as_mut()[field::PRIMARY_PATH])
    }

    /// The alternate path, to fill.
    pub fn alternate_path_mut(&mut self) -> path::Packet<&mut [u8]> {
        path::Packet::new_unchecked(&mut self.buffer.as_mut()[field::ALTERNATE_PATH])
    }
}

/// A parsed REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// ECE vendor ID, 24 bits.
    pub vendor_id: u32,
    /// The requested service.
    pub service_id: ServiceId,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// The sender's Q_Key.
    pub local_qkey: u32,
    /// The sender's QPN, 24 bits.
    pub local_qpn: u32,
    /// The sender's responder resources.
    pub responder_resources: u8,
    /// The sender's initiator depth.
    pub initiator_depth: u8,
    /// Remote CM response timeout exponent, 5 bits.
    pub remote_cm_response_timeout: u8,
    /// Transport service type.
    pub service_type: ServiceType,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// The sender's starting PSN.
    pub starting_psn: Psn,
    /// Local CM response timeout exponent, 5 bits.
    pub local_cm_response_timeout: u8,
    /// Retry count, 3 bits.
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU (IB enum), 4 bits.
    pub path_mtu: u8,
    /// RNR retry count, 3 bits.
    pub rnr_retry_count: u8,
    /// Max CM retries, 4 bits.
    pub max_cm_retries: u8,
    /// The sender uses an SRQ.
    pub srq: bool,
    /// Extended transport type, 3 bits.
    pub extended_transport_type: u8,
    /// Primary path.
    pub primary_path: path::Repr,
    /// Alternate path (all zero: none).
    pub alternate_path: path::Repr,
    /// Private data; rdma_cm puts its [header](super::cma) first.
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

fixed_len_repr!();

impl Repr {
    /// Parses a REQ (every bit pattern is valid; reserved bits are ignored).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        Ok(Repr {
            local_comm_id: packet.local_comm_id(),
            vendor_id: packet.vendor_id(),
            service_id: packet.service_id(),
            local_ca_guid: packet.local_ca_guid(),
            local_qkey: packet.local_qkey(),
            local_qpn: packet.local_qpn(),
            responder_resources: packet.responder_resources(),
            initiator_depth: packet.initiator_depth(),
            remote_cm_response_timeout: packet.remote_cm_response_timeout(),
            service_type: packet.service_type(),
            flow_control: packet.flow_control(),
            starting_psn: packet.starting_psn(),
            local_cm_response_timeout: packet.local_cm_response_timeout(),
            retry_count: packet.retry_count(),
            pkey: packet.pkey(),
            path_mtu: packet.path_mtu(),
            rnr_retry_count: packet.rnr_retry_count(),
            max_cm_retries: packet.max_cm_retries(),
            srq: packet.srq(),
            extended_transport_type: packet.extended_transport_type(),
            primary_path: path::Repr::parse(&packet.primary_path())?,
            alternate_path: path::Repr::parse(&packet.alternate_path())?,
            private_data: packet.private_data_array(),
        })
    }

    /// Writes the REQ, zeroing the reserved bits.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.clear();
        packet.set_local_comm_id(self.local_comm_id);
        packet.set_vendor_id(self.vendor_id);
        packet.set_service_id(self.service_id);
        packet.set_local_ca_guid(self.local_ca_guid);
        packet.set_local_qkey(self.local_qkey);
        packet.set_local_qpn(self.local_qpn);
        packet.set_responder_resources(self.responder_resources);
        packet.set_initiator_depth(self.initiator_depth);
        packet.set_remote_cm_response_timeout(self.remote_cm_response_timeout);
        packet.set_service_type(self.service_type);
        packet.set_flow_control(self.flow_control);
        packet.set_starting_psn(self.starting_psn);
        packet.set_local_cm_response_timeout(self.local_cm_response_timeout);
        packet.set_retry_count(self.retry_count);
        packet.set_pkey(self.pkey);
        packet.set_path_mtu(self.path_mtu);
        packet.set_rnr_retry_count(self.rnr_retry_count);
        packet.set_max_cm_retries(self.max_cm_retries);
        packet.set_srq(self.srq);
        packet.set_extended_transport_type(self.extended_transport_type);
        self.primary_path.emit(&mut packet.primary_path_mut());
        self.alternate_path.emit(&mut packet.alternate_path_mut());
        packet.set_private_data(&self.private_data);
    }
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
