//! Base transport header: the 12 bytes every RoCEv2 packet carries after UDP.

use core::fmt;

use crate::{read_u24, write_u24, Error, Opcode, Psn, Result};

mod field {
    use crate::Field;

    pub const OPCODE: usize = 0;
    /// Solicited event (bit 7), MigReq (6), PadCnt (5–4), TVer (3–0).
    pub const FLAGS: usize = 1;
    pub const PKEY: Field = 2..4;
    /// FECN (bit 7), BECN (6), reserved (5–0). Masked to ones in the ICRC.
    pub const CONGESTION: usize = 4;
    pub const DEST_QPN: Field = 5..8;
    /// AckReq (bit 7), reserved (6–0).
    pub const ACK_REQ: usize = 8;
    pub const PSN: Field = 9..12;
}

/// Offset of the byte the ICRC masks to all ones (FECN, BECN and reserved bits).
pub const ICRC_MASKED_BYTE: usize = field::CONGESTION;

fixed_header_packet! {
    12;
    /// A read/write view of a BTH.
}

const SOLICITED: u8 = 0x80;
const MIG_REQ: u8 = 0x40;
const PAD_SHIFT: u8 = 4;
const PAD_MASK: u8 = 0x30;
const TVER_MASK: u8 = 0x0F;
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
const ACK_REQ: u8 = 0x80;

impl<T: AsRef<[u8]>> Packet<T> {
    /// The raw opcode byte; see [`Opcode::try_from`].
    pub fn opcode(&self) -> u8 {
        self.buffer.as_ref()[field::OPCODE]
    }

    /// Whether the requester asks for a solicited event at the receiver.
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & SOLICITED != 0
    }

    /// The path migration request bit.
    pub fn mig_req(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & MIG_REQ != 0
    }

    /// Number of pad bytes (0–3) that end the payload.
    pub fn pad_count(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] & PAD_MASK) >> PAD_SHIFT
    }

    /// Transport header version; only 0 exists.
    pub fn tver(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & TVER_MASK
    }

    /// Partition key.
    pub fn pkey(&self) -> u16 {
        let raw = &self.buffer.as_ref()[field::PKEY];
        u16::from_be_bytes([raw[0], raw[1]])
    }

    /// Forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::CONGESTION] & FECN != 0
    }

    /// Backward explicit congestion notification.
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::CONGESTION] & BECN != 0
    }

    /// Destination queue pair number (24 bits).
    pub fn dest_qpn(&self) -> u32 {
        read_u24(&self.buffer.as_ref()[field::DEST_QPN])
    }

    /// Whether the requester asks for an acknowledgement of this packet.
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK_REQ] & ACK_REQ != 0
    }

    /// The seven reserved bits after AckReq (sent as zero by IBTA senders; roce-xdp uses
    /// one of them to offer selective repeat to its own kind, see `docs/interop.md`).
    pub fn resv7(&self) -> u8 {
        self.buffer.as_ref()[field::ACK_REQ] & !ACK_REQ
    }

    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(read_u24(&self.buffer.as_ref()[field::PSN]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the opcode byte.
    pub fn set_opcode(&mut self, opcode: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = opcode as u8;
    }

    /// Sets SE, MigReq and PadCnt, with TVer 0.
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad_count: u8) {
        let mut flags = (pad_count << PAD_SHIFT) & PAD_MASK;
        if solicited {
            flags |= SOLICITED;
        }
        if mig_req {
            flags |= MIG_REQ;
        }
        self.buffer.as_mut()[field::FLAGS] = flags;
    }

    /// Sets the partition key.
    pub fn set_pkey(&mut self, pkey: u16) {
        self.buffer.as_mut()[field::PKEY].copy_from_slice(&pkey.to_be_bytes());
    }

    /// Sets FECN and BECN, clearing the reserved bits.
    pub fn set_congestion(&mut self, fecn: bool, becn: bool) {
        self.buffer.as_mut()[field::CONGESTION] =
            if fecn { FECN } else { 0 } | if becn { BECN } else { 0 };
    }

    /// Sets the destination QPN (low 24 bits).
    pub fn set_dest_qpn(&mut self, qpn: u32) {
        write_u24(&mut self.buffer.as_mut()[field::DEST_QPN], qpn & 0xFF_FFFF);
    }

    /// Sets the AckReq bit, clearing the reserved bits.
    pub fn set_ack_req(&mut self, ack_req: bool) {
        self.set_ack_req_resv7(ack_req, 0);
    }

    /// Sets the AckReq bit and the seven reserved bits after it.
    pub fn set_ack_req_resv7(&mut self, ack_req: bool, resv7: u8) {
        self.buffer.as_mut()[field::ACK_REQ] =
            if ack_req { ACK_REQ } else { 0 } | (resv7 & !ACK_REQ);
    }

    /// Sets the PSN.
    pub fn set_psn(&mut self, psn: Psn) {
        write_u24(&mut self.buffer.as_mut()[field::PSN], psn.value());
    }
}

/// A parsed BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// What the packet is; decides which extension headers follow.
    pub opcode: Opcode,
    /// Solicited event requested.
    pub solicited: bool,
    /// Path migration request.
    pub mig_req: bool,
    /// Pad bytes (0–3) after the payload.
    pub pad_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Forward congestion notification (set by ECN-marking switches' receivers).
    pub fecn: bool,
    /// Backward congestion notification (set in CNPs).
    pub becn: bool,
    /// Destination QPN, 24 bits.
    pub dest_qpn: u32,
    /// Acknowledgement requested.
    pub ack_req: bool,
    /// The seven reserved bits after AckReq, kept as received (0 from IBTA senders).
    pub resv7: u8,
    /// Packet sequence number.
    pub psn: Psn,
}

fixed_len_repr!();

/// The default, full-membership partition key (`0xFFFF`), the one a RoCE port's P_Key table
/// holds by default.
pub const DEFAULT_PKEY: u16 = 0xFFFF;

impl Repr {
    /// A BTH with the fields most packets leave at their defaults: no solicited event, no
    /// migration request, no pad, [`DEFAULT_PKEY`], no congestion marks and no AckReq.
    pub const fn new(opcode: Opcode, dest_qpn: u32, psn: Psn) -> Repr {
        Repr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qpn,
            ack_req: false,
            resv7: 0,
            psn,
        }
    }

    /// Parses a BTH, rejecting unknown opcodes and transport versions other than 0.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        let opcode = Opcode::try_from(packet.opcode())?;
        if packet.tver() != 0 {
            return Err(Error);
        }
        Ok(Repr {
            opcode,
            solicited: packet.solicited(),
            mig_req: packet.mig_req(),
            pad_count: packet.pad_count(),
            pkey: packet.pkey(),
            fecn: packet.fecn(),
            becn: packet.becn(),
            dest_qpn: packet.dest_qpn(),
            ack_req: packet.ack_req(),
            resv7: packet.resv7(),
            psn: packet.psn(),
        })
    }

    /// Writes the header; reserved bits other than `resv7` are written as zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_opcode(self.opcode);
        packet.set_flags(self.solicited, self.mig_req, self.pad_count);
        packet.set_pkey(self.pkey);
        packet.set_congestion(self.fecn, self.becn);
        packet.set_dest_qpn(self.dest_qpn);
        packet.set_ack_req_resv7(self.ack_req, self.resv7);
        packet.set_psn(self.psn);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} qpn={:#08x} psn={} ack={}",
            self.opcode, self.dest_qpn, self.psn, self.ack_req as u8
        )?;
        if self.solicited {
            f.write_str(" se=1")?;
        }
        if self.mig_req {
            f.write_str(" m=1")?;
        }
        if self.pad_count != 0 {
            write!(f, " pad={}", self.pad_count)?;
        }
        if self.pkey != 0xFFFF {
            write!(f, " pkey={:#06x}", self.pkey)?;
        }
        if self.fecn {
            f.write_str(" fecn=1")?;
        }
        if self.becn {
            f.write_str(" becn=1")?;
        }
        if self.resv7 != 0 {
            write!(f, " resv7={:#04x}", self.resv7)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The BTH of an RC_SEND_LAST in rc_pingpong.pcap (AckReq set).
    static HEADER_BYTES: [u8; 12] = [
        0x02, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x18, 0xd6, 0xbb,
    ];

    const REPR: Repr = Repr {
        opcode: Opcode::RcSendLast,
        solicited: false,
        mig_req: false,
        pad_count: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qpn: 0x11,
        ack_req: true,
        resv7: 0,
        psn: Psn::new(0x18_d6bb),
    };

    #[test]
    fn deconstruct() {
        let packet = Packet::new_checked(&HEADER_BYTES[..]).unwrap();
        assert_eq!(packet.opcode(), 0x02);
        assert!(!packet.solicited() && !packet.mig_req());
        assert_eq!((packet.pad_count(), packet.tver()), (0, 0));
        assert_eq!(packet.pkey(), 0xffff);
        assert!(!packet.fecn() && !packet.becn());
        assert_eq!(packet.dest_qpn(), 0x11);
        assert!(packet.ack_req());
        assert_eq!(packet.psn(), Psn::new(0x18_d6bb));
    }

    #[test]
    fn construct() {
        let mut bytes = [0xA5; 12];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.set_opcode(Opcode::RcSendLast);
        packet.set_flags(false, false, 0);
        packet.set_pkey(0xffff);
        packet.set_congestion(false, false);
        packet.set_dest_qpn(0x11);
        packet.set_ack_req(true);
        packet.set_psn(Psn::new(0x18_d6bb));
        assert_eq!(bytes, HEADER_BYTES);
    }

    parse_emit_tests!(HEADER_BYTES, REPR);

    #[test]
    fn every_flag_round_trips() {
        let repr = Repr {
            solicited: true,
            mig_req: true,
            pad_count: 3,
            fecn: true,
            becn: true,
            ..REPR
        };
        let mut bytes = [0; 12];
        repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes[1], 0xF0);
        assert_eq!(bytes[4], 0xC0);
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Ok(repr)
        );
    }

    #[test]
    fn unknown_opcode_and_nonzero_tver_are_rejected() {
        let mut bytes = HEADER_BYTES;
        bytes[0] = 0x15;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Err(Error)
        );
        let mut bytes = HEADER_BYTES;
        bytes[1] |= 0x01;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Err(Error)
        );
        assert!(Packet::new_checked(&HEADER_BYTES[..11]).is_err());
    }

    /// The reserved bits after AckReq survive parse and emit, and show in the text.
    #[test]
    fn resv7_round_trip() {
        let mut bytes = HEADER_BYTES;
        bytes[8] = 0x80 | 0x40;
        let repr = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert!(repr.ack_req);
        assert_eq!(repr.resv7, 0x40);
        let mut out = [0u8; 12];
        repr.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        extern crate std;
        use std::string::ToString;
        assert!(repr.to_string().ends_with(" resv7=0x40"), "{repr}");
        let plain = Repr::parse(&Packet::new_checked(&HEADER_BYTES[..]).unwrap()).unwrap();
        assert_eq!(plain.resv7, 0);
        assert!(!plain.to_string().contains("resv7"));
    }
}
