//! ACK extended transport header: the responder's verdict on a request and its MSN.

use core::fmt;
use core::time::Duration;

use crate::{read_u24, write_u24, Error, Result};

mod field {
    use crate::Field;

    pub const SYNDROME: usize = 0;
    pub const MSN: Field = 1..4;
}

fixed_header_packet! {
    4;
    /// A read/write view of an AETH.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The raw syndrome byte; see [`Syndrome::from_byte`].
    pub fn syndrome(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }

    /// Message sequence number: count of requests completed by the responder.
    pub fn msn(&self) -> u32 {
        read_u24(&self.buffer.as_ref()[field::MSN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the syndrome byte.
    pub fn set_syndrome(&mut self, syndrome: Syndrome) {
        self.buffer.as_mut()[field::SYNDROME] = syndrome.to_byte();
    }

    /// Sets the MSN (low 24 bits).
    pub fn set_msn(&mut self, msn: u32) {
        write_u24(&mut self.buffer.as_mut()[field::MSN], msn & 0xFF_FFFF);
    }
}

const TYPE_MASK: u8 = 0xE0;
const VALUE_MASK: u8 = 0x1F;
const TYPE_ACK: u8 = 0x00;
const TYPE_RNR_NAK: u8 = 0x20;
const TYPE_NAK: u8 = 0x60;

/// The AETH syndrome: ACK, RNR NAK or NAK, with its 5-bit argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syndrome {
    /// Positive acknowledgement with the responder's end-to-end credits.
    Ack(CreditCount),
    /// Receiver not ready: retry after the given time.
    RnrNak(RnrTimer),
    /// Negative acknowledgement.
    Nak(NakCode),
}

impl Syndrome {
    /// Decodes a syndrome byte; reserved types and NAK codes are errors.
    pub fn from_byte(byte: u8) -> Result<Syndrome> {
        let value = byte & VALUE_MASK;
        match byte & TYPE_MASK {
            TYPE_ACK => Ok(Syndrome::Ack(CreditCount(value))),
            TYPE_RNR_NAK => Ok(Syndrome::RnrNak(RnrTimer(value))),
            TYPE_NAK => NakCode::try_from(value).map(Syndrome::Nak),
            _ => Err(Error),
        }
    }

    /// Encodes the syndrome byte.
    pub const fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack(credits) => TYPE_ACK | (credits.0 & VALUE_MASK),
            Syndrome::RnrNak(timer) => TYPE_RNR_NAK | (timer.0 & VALUE_MASK),
            Syndrome::Nak(code) => TYPE_NAK | code as u8,
        }
    }
}

/// The 5-bit end-to-end credit code of an ACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreditCount(u8);

/// Receive WQEs each credit code stands for; code 31 means "credits not tracked".
const CREDITS: [u16; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

impl CreditCount {
    /// "Invalid credit count": the responder does not limit the requester (rxe always sends it).
    pub const UNLIMITED: CreditCount = CreditCount(31);

    /// The largest code whose count does not exceed `available` receive WQEs.
    pub fn encode(available: u32) -> CreditCount {
        let code = CREDITS
            .iter()
            .rposition(|&count| u32::from(count) <= available);
        CreditCount(code.unwrap_or(0) as u8)
    }

    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        self.0
    }

    /// Receive WQEs available, or `None` for [`UNLIMITED`](Self::UNLIMITED).
    pub fn count(self) -> Option<u32> {
        CREDITS
            .get(usize::from(self.0))
            .map(|&count| u32::from(count))
    }
}

/// The 5-bit RNR NAK timer: the minimum wait before the requester retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RnrTimer(u8);

/// The IBTA RNR timer table in microseconds; code 0 is the longest.
const RNR_MICROS: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

impl RnrTimer {
    /// Keeps the low five bits of `code`.
    pub const fn new(code: u8) -> RnrTimer {
        RnrTimer(code & VALUE_MASK)
    }

    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        self.0
    }

    /// How long the requester must wait.
    pub const fn duration(self) -> Duration {
        Duration::from_micros(RNR_MICROS[(self.0 & VALUE_MASK) as usize] as u64)
    }
}

/// Why a responder refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum NakCode {
    /// A PSN gap: the requester resends from the NAK's PSN (go back N).
    PsnSequenceError = 0,
    /// Unsupported or malformed request, or no room for a SEND.
    InvalidRequest = 1,
    /// R_Key, access rights or bounds violation.
    RemoteAccessError = 2,
    /// The responder could not complete a valid request.
    RemoteOperationalError = 3,
    /// Invalid RD request (reliable datagram only).
    InvalidRdRequest = 4,
}

impl TryFrom<u8> for NakCode {
    type Error = Error;

    fn try_from(code: u8) -> Result<NakCode> {
        match code {
            0 => Ok(NakCode::PsnSequenceError),
            1 => Ok(NakCode::InvalidRequest),
            2 => Ok(NakCode::RemoteAccessError),
            3 => Ok(NakCode::RemoteOperationalError),
            4 => Ok(NakCode::InvalidRdRequest),
            _ => Err(Error),
        }
    }
}

impl NakCode {
    /// The spec's name in upper snake case.
    pub const fn name(self) -> &'static str {
        match self {
            NakCode::PsnSequenceError => "PSN_SEQUENCE_ERROR",
            NakCode::InvalidRequest => "INVALID_REQUEST",
            NakCode::RemoteAccessError => "REMOTE_ACCESS_ERROR",
            NakCode::RemoteOperationalError => "REMOTE_OPERATIONAL_ERROR",
            NakCode::InvalidRdRequest => "INVALID_RD_REQUEST",
        }
    }
}

/// A parsed AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// ACK, RNR NAK or NAK.
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

fixed_len_repr!();

impl Repr {
    /// Parses an AETH; reserved syndromes are errors.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        Ok(Repr {
            syndrome: Syndrome::from_byte(packet.syndrome())?,
            msn: packet.msn(),
        })
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_syndrome(self.syndrome);
        packet.set_msn(self.msn);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.syndrome {
            Syndrome::Ack(credits) => match credits.count() {
                Some(count) => write!(f, "aeth(ACK credits={count}")?,
                None => f.write_str("aeth(ACK credits=unlimited")?,
            },
            Syndrome::RnrNak(timer) => write!(
                f,
                "aeth(RNR_NAK timer={} wait={:?}",
                timer.code(),
                timer.duration()
            )?,
            Syndrome::Nak(code) => write!(f, "aeth(NAK {}", code.name())?,
        }
        write!(f, " msn={})", self.msn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AETH of an RC_ACKNOWLEDGE in rc_pingpong.pcap.
    static HEADER_BYTES: [u8; 4] = [0x1f, 0x00, 0x00, 0x01];

    const REPR: Repr = Repr {
        syndrome: Syndrome::Ack(CreditCount::UNLIMITED),
        msn: 1,
    };

    #[test]
    fn deconstruct() {
        let packet = Packet::new_checked(&HEADER_BYTES[..]).unwrap();
        assert_eq!(packet.syndrome(), 0x1f);
        assert_eq!(packet.msn(), 1);
    }

    #[test]
    fn construct() {
        let mut bytes = [0xA5; 4];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.set_syndrome(Syndrome::Ack(CreditCount::UNLIMITED));
        packet.set_msn(1);
        assert_eq!(bytes, HEADER_BYTES);
    }

    parse_emit_tests!(HEADER_BYTES, REPR);

    #[test]
    fn every_syndrome_byte_decodes_or_is_reserved() {
        for byte in 0..=u8::MAX {
            match Syndrome::from_byte(byte) {
                Ok(syndrome) => assert_eq!(syndrome.to_byte(), byte),
                Err(_) => assert!(byte & 0x80 != 0 || byte & 0xE0 == 0x40 || byte >= 0x65),
            }
        }
        assert_eq!(
            Syndrome::from_byte(0x60),
            Ok(Syndrome::Nak(NakCode::PsnSequenceError))
        );
        assert_eq!(
            Syndrome::from_byte(0x62),
            Ok(Syndrome::Nak(NakCode::RemoteAccessError))
        );
        assert_eq!(
            Syndrome::from_byte(0x2c),
            Ok(Syndrome::RnrNak(RnrTimer::new(12)))
        );
    }

    #[test]
    fn rnr_timer_table_ends() {
        assert_eq!(RnrTimer::new(0).duration(), Duration::from_micros(655_360));
        assert_eq!(RnrTimer::new(1).duration(), Duration::from_micros(10));
        assert_eq!(RnrTimer::new(12).duration(), Duration::from_micros(640));
        assert_eq!(RnrTimer::new(31).duration(), Duration::from_micros(491_520));
    }

    #[test]
    fn credit_encoding_rounds_down() {
        assert_eq!(CreditCount::encode(0).count(), Some(0));
        assert_eq!(CreditCount::encode(5).count(), Some(4));
        assert_eq!(CreditCount::encode(100).count(), Some(96));
        assert_eq!(CreditCount::encode(u32::MAX).count(), Some(32768));
        assert_eq!(CreditCount::UNLIMITED.count(), None);
    }
}
