//! The InfiniBand communication manager's messages (IBTA Vol 1 ch. 12, management class 0x07),
//! as the Linux kernel CM sends them over RoCEv2, and the rdma_cm conventions carried in them.
//!
//! Each message is the 232 bytes after the [common MAD header](crate::mad); each has a
//! `Packet` view and a `Repr` in its own module, with field offsets counted from the end of the
//! MAD header as in the IBTA tables (and the kernel's `ibta_vol1_c12.h`). Private data is held
//! by value at its full wire length: the wire carries no length, so the receiver always sees
//! every byte (zero-padded by the sender). [`Repr`] ties a message to its MAD header.
//!
//! rdma_cm adds two conventions: the [service ID](service_id) built from a port space and a
//! port, and a [36-byte header](cma) at the start of a REQ's or SIDR_REQ's private data.
//! Reserved bits are ignored by `parse` and written as zero by `emit`; the ECE vendor ID of
//! kernels from 5.9 on is kept for a REQ and left zero in the other messages.

use core::fmt;

use crate::mad;
use crate::{Error, Result};

pub mod cma;
mod comm_ids;
mod common;
pub mod drep;
pub mod dreq;
pub mod mra;
pub mod path;
pub mod rej;
pub mod rep;
pub mod req;
pub mod rtu;
pub mod service_id;
pub mod sidr_rep;
pub mod sidr_req;

pub use common::MessageKind;
pub use service_id::{PortSpace, ServiceId};

/// Management class of the communication manager (`IB_MGMT_CLASS_CM`).
pub const MGMT_CLASS: u8 = 0x07;
/// Class version the kernel CM speaks and requires (`IB_CM_CLASS_VERSION`).
pub const CLASS_VERSION: u8 = 2;

/// Attribute IDs (`include/rdma/ib_cm.h`).
pub mod attribute {
    /// Connection request.
    pub const REQ: u16 = 0x0010;
    /// Message receipt acknowledgement (more time needed).
    pub const MRA: u16 = 0x0011;
    /// Reject.
    pub const REJ: u16 = 0x0012;
    /// Reply to a REQ.
    pub const REP: u16 = 0x0013;
    /// Ready to use.
    pub const RTU: u16 = 0x0014;
    /// Disconnection request.
    pub const DREQ: u16 = 0x0015;
    /// Disconnection reply.
    pub const DREP: u16 = 0x0016;
    /// Service ID resolution request (UD).
    pub const SIDR_REQ: u16 = 0x0017;
    /// Service ID resolution reply.
    pub const SIDR_REP: u16 = 0x0018;
    /// Load alternate path (not supported).
    pub const LAP: u16 = 0x0019;
    /// Alternate path response (not supported).
    pub const APR: u16 = 0x001A;
}

/// Converts a CM time exponent (4.096 µs × 2^`exponent`) to whole milliseconds the way the
/// kernel does (`cm_convert_to_ms`): 2^(exponent − 8), at least 1.
pub const fn time_to_ms(exponent: u8) -> u64 {
    1 << exponent.saturating_sub(8)
}

/// Copies `data` into private data of the field's length `N`, zero-padded.
/// Fails when `data` is longer than the field.
pub fn private_data<const N: usize>(data: &[u8]) -> Result<[u8; N]> {
    let mut field = [0; N];
    field
        .get_mut(..data.len())
        .ok_or(Error)?
        .copy_from_slice(data);
    Ok(field)
}

/// One CM message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    /// Connection request.
    Req(req::Repr),
    /// More time needed.
    Mra(mra::Repr),
    /// Reject.
    Rej(rej::Repr),
    /// Reply.
    Rep(rep::Repr),
    /// Ready to use.
    Rtu(rtu::Repr),
    /// Disconnection request.
    Dreq(dreq::Repr),
    /// Disconnection reply.
    Drep(drep::Repr),
    /// Service ID resolution request.
    SidrReq(sidr_req::Repr),
    /// Service ID resolution reply.
    SidrRep(sidr_rep::Repr),
}

impl Message {
    /// The MAD attribute ID of this message.
    pub const fn attribute_id(&self) -> u16 {
        match self {
            Message::Req(_) => attribute::REQ,
            Message::Mra(_) => attribute::MRA,
            Message::Rej(_) => attribute::REJ,
            Message::Rep(_) => attribute::REP,
            Message::Rtu(_) => attribute::RTU,
            Message::Dreq(_) => attribute::DREQ,
            Message::Drep(_) => attribute::DREP,
            Message::SidrReq(_) => attribute::SIDR_REQ,
            Message::SidrRep(_) => attribute::SIDR_REP,
        }
    }

    /// The IBTA name, as `roce dump` prints it.
    pub const fn name(&self) -> &'static str {
        match self {
            Message::Req(_) => "CM_REQ",
            Message::Mra(_) => "CM_MRA",
            Message::Rej(_) => "CM_REJ",
            Message::Rep(_) => "CM_REP",
            Message::Rtu(_) => "CM_RTU",
            Message::Dreq(_) => "CM_DREQ",
            Message::Drep(_) => "CM_DREP",
            Message::SidrReq(_) => "CM_SIDR_REQ",
            Message::SidrRep(_) => "CM_SIDR_REP",
        }
    }

    fn parse(attribute_id: u16, data: &[u8]) -> Result<Message> {
        Ok(match attribute_id {
            attribute::REQ => Message::Req(req::Repr::parse(&req::Packet::new_checked(data)?)?),
            attribute::MRA => Message::Mra(mra::Repr::parse(&mra::Packet::new_checked(data)?)?),
            attribute::REJ => Message::Rej(rej::Repr::parse(&rej::Packet::new_checked(data)?)?),
            attribute::REP => Message::Rep(rep::Repr::parse(&rep::Packet::new_checked(data)?)?),
            attribute::RTU => Message::Rtu(rtu::Repr::parse(&rtu::Packet::new_checked(data)?)?),
            attribute::DREQ => Message::Dreq(dreq::Repr::parse(&dreq::Packet::new_checked(data)?)?),
            attribute::DREP => Message::Drep(drep::Repr::parse(&drep::Packet::new_checked(data)?)?),
            attribute::SIDR_REQ => Message::SidrReq(sidr_req::Repr::parse(
                &sidr_req::Packet::new_checked(data)?,
            )?),
            attribute::SIDR_REP => Message::SidrRep(sidr_rep::Repr::parse(
                &sidr_rep::Packet::new_checked(data)?,
            )?),
            _ => return Err(Error),
        })
    }

    fn emit(&self, data: &mut [u8]) {
        match self {
            Message::Req(repr) => repr.emit(&mut req::Packet::new_unchecked(data)),
            Message::Mra(repr) => repr.emit(&mut mra::Packet::new_unchecked(data)),
            Message::Rej(repr) => repr.emit(&mut rej::Packet::new_unchecked(data)),
            Message::Rep(repr) => repr.emit(&mut rep::Packet::new_unchecked(data)),
            Message::Rtu(repr) => repr.emit(&mut rtu::Packet::new_unchecked(data)),
            Message::Dreq(repr) => repr.emit(&mut dreq::Packet::new_unchecked(data)),
            Message::Drep(repr) => repr.emit(&mut drep::Packet::new_unchecked(data)),
            Message::SidrReq(repr) => repr.emit(&mut sidr_req::Packet::new_unchecked(data)),
            Message::SidrRep(repr) => repr.emit(&mut sidr_rep::Packet::new_unchecked(data)),
        }
    }
}

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())?;
        match self {
            Message::Req(repr) => write!(f, " {repr}"),
            Message::Mra(repr) => write!(f, " {repr}"),
            Message::Rej(repr) => write!(f, " {repr}"),
            Message::Rep(repr) => write!(f, " {repr}"),
            Message::Rtu(repr) => write!(f, " {repr}"),
            Message::Dreq(repr) => write!(f, " {repr}"),
            Message::Drep(repr) => write!(f, " {repr}"),
            Message::SidrReq(repr) => write!(f, " {repr}"),
            Message::SidrRep(repr) => write!(f, " {repr}"),
        }
    }
}

/// A whole CM MAD: the transaction ID of its header and the message after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Transaction ID. The kernel answers with the ID of the message it answers.
    pub transaction_id: u64,
    /// The message.
    pub message: Message,
}

impl Repr {
    /// Parses a CM MAD. Fails for another class, version or method, an unknown or
    /// unsupported attribute (LAP, APR), or a field value the format does not allow.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &mad::Packet<&T>) -> Result<Repr> {
        let header = mad::Repr::parse(packet)?;
        if header.base_version != mad::BASE_VERSION
            || header.mgmt_class != MGMT_CLASS
            || header.class_version != CLASS_VERSION
            || header.method != mad::METHOD_SEND
        {
            return Err(Error);
        }
        Ok(Repr {
            transaction_id: header.transaction_id,
            message: Message::parse(header.attribute_id, packet.data())?,
        })
    }

    /// Bytes [`emit`](Self::emit) writes: a whole MAD.
    pub const fn buffer_len(&self) -> usize {
        mad::MAD_LEN
    }

    /// Writes the MAD header and the message (the buffer must hold a whole MAD).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut mad::Packet<T>) {
        mad::Repr {
            base_version: mad::BASE_VERSION,
            mgmt_class: MGMT_CLASS,
            class_version: CLASS_VERSION,
            method: mad::METHOD_SEND,
            status: 0,
            class_specific: 0,
            transaction_id: self.transaction_id,
            attribute_id: self.message.attribute_id(),
            attribute_modifier: 0,
        }
        .emit(packet);
        self.message.emit(packet.data_mut());
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} tid={:#x}", self.message, self.transaction_id)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{Frame, Opcode};

    static RPING_PCAP: &[u8] = include_bytes!("../../../tests/captures/rping_rdmacm.pcap");

    /// The `index`-th MAD of rping_rdmacm.pcap, a real kernel rdma_cm exchange: 0 REQ, 1 REP,
    /// 2 RTU, 3 DREQ, 4 DREP. Each frame's ICRC is checked on the way.
    pub(crate) fn capture_mad(index: usize) -> [u8; mad::MAD_LEN] {
        // Classic little-endian pcap: a 24-byte file header, then 16-byte record headers.
        let mut offset = 24;
        let mut found = 0;
        while offset + 16 <= RPING_PCAP.len() {
            let header = &RPING_PCAP[offset..offset + 16];
            let len = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
            let frame_bytes = &RPING_PCAP[offset + 16..offset + 16 + len as usize];
            offset += 16 + len as usize;
            let Ok(frame) = Frame::new_checked(frame_bytes) else {
                continue;
            };
            if frame.opcode() != Opcode::UdSendOnly {
                continue;
            }
            frame.check_icrc().unwrap();
            if found == index {
                return frame.payload().try_into().unwrap();
            }
            found += 1;
        }
        panic!("rping_rdmacm.pcap has no MAD {index}");
    }

    /// The message part of the `index`-th MAD.
    pub(crate) fn capture_message(index: usize) -> [u8; mad::DATA_LEN] {
        capture_mad(index)[mad::HEADER_LEN..].try_into().unwrap()
    }

    #[test]
    fn capture_parses_as_the_kernel_exchange() {
        let names: [&str; 5] = core::array::from_fn(|index| {
            let mad = capture_mad(index);
            let repr = Repr::parse(&mad::Packet::new_checked(&mad[..]).unwrap()).unwrap();
            assert_eq!(repr.transaction_id, 0x2_a6c1_d06f);
            repr.message.name()
        });
        assert_eq!(names, ["CM_REQ", "CM_REP", "CM_RTU", "CM_DREQ", "CM_DREP"]);
    }

    #[test]
    fn whole_mads_round_trip() {
        for index in 0..5 {
            let mad = capture_mad(index);
            let repr = Repr::parse(&mad::Packet::new_checked(&mad[..]).unwrap()).unwrap();
            let mut bytes = [0xA5; mad::MAD_LEN];
            repr.emit(&mut mad::Packet::new_unchecked(&mut bytes[..]));
            assert_eq!(bytes, mad, "MAD {index}");
        }
    }

    #[test]
    fn other_classes_and_methods_are_refused() {
        let mad = capture_mad(0);
        for (offset, value) in [(0, 2), (1, 0x81), (2, 1), (3, 0x81), (16, 1), (17, 0x19)] {
            let mut bytes = mad;
            bytes[offset] = value;
            let packet = mad::Packet::new_checked(&bytes[..]).unwrap();
            assert_eq!(
                Repr::parse(&packet),
                Err(Error),
                "byte {offset} = {value:#x}"
            );
        }
    }

    #[test]
    fn private_data_pads_and_refuses_overlong() {
        assert_eq!(private_data::<4>(&[1, 2]), Ok([1, 2, 0, 0]));
        assert_eq!(private_data::<2>(&[1, 2, 3]), Err(Error));
    }

    #[test]
    fn time_conversion_matches_the_kernel() {
        assert_eq!(time_to_ms(20), 4096);
        assert_eq!(time_to_ms(18), 1024);
        assert_eq!(time_to_ms(3), 1);
    }
}
