//! The raw side of `roce conform` and `roce fuzz`: frames we craft byte by byte (any field,
//! any length, a right or wrong ICRC) and the target's answers, read back over a backend
//! that hands us whole Ethernet frames (AF_XDP, or the in-memory wire in tests).

use std::fmt;
use std::io;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use roce_provider::backend::Backend;
use roce_wire::aeth::{NakCode, Syndrome};
use roce_wire::frame::{EthernetRepr, IpRepr, Ipv4Repr, Ipv6Repr};
use roce_wire::icrc::{self, ICRC_LEN};
use roce_wire::opcode::Position;
use roce_wire::{bth, ExtRepr, Frame, FrameError, FrameRepr, Opcode, Psn};

/// Ethernet's header, and the 802.1Q tag that may follow it.
const ETHERNET_LEN: usize = 14;
const VLAN_TAG_LEN: usize = 4;
const UDP_LEN: usize = 8;
const IPV6_LEN: usize = 40;
/// Largest frame we read back (path MTU 4096 and every header, twice over).
const MAX_FRAME: usize = 2 * 4096;

/// A host on the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Station {
    /// Its MAC.
    pub mac: [u8; 6],
    /// Its IP address (both stations of a link have the same family).
    pub ip: IpAddr,
}

/// Where a frame's IP, UDP and BTH headers start: after Ethernet and an optional 802.1Q
/// tag, IPv4 with its options or IPv6 (RoCEv2 puts no extension headers before UDP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offsets {
    /// The IP header.
    pub ip: usize,
    /// The UDP header.
    pub udp: usize,
    /// The BTH.
    pub bth: usize,
    /// Whether the IP header is IPv6's.
    pub ipv6: bool,
}

impl Offsets {
    /// The offsets of `frame`'s headers, if it is IPv4 or IPv6 far enough to tell.
    pub fn of(frame: &[u8]) -> Option<Offsets> {
        let ether_type =
            |at: usize| Some(u16::from_be_bytes([*frame.get(at)?, *frame.get(at + 1)?]));
        let (ip, ether_type) = match ether_type(12)? {
            0x8100 => (ETHERNET_LEN + VLAN_TAG_LEN, ether_type(16)?),
            other => (ETHERNET_LEN, other),
        };
        let (ip_len, ipv6) = match ether_type {
            0x0800 => (usize::from(frame.get(ip)? & 0x0F) * 4, false),
            0x86DD => (IPV6_LEN, true),
            _ => return None,
        };
        let udp = ip + ip_len;
        Some(Offsets {
            ip,
            udp,
            bth: udp + UDP_LEN,
            ipv6,
        })
    }
}

/// One packet to send: the fields of a well-formed frame, then the damage done to its bytes.
#[derive(Debug, Clone)]
pub struct Packet {
    /// BTH fields.
    pub bth: bth::Repr,
    /// Extension headers (must match `bth.opcode` before `damage` applies).
    pub ext: ExtRepr,
    /// Payload, without pad.
    pub payload: Vec<u8>,
    /// Changes made to the emitted bytes, in order; the ICRC is computed after them unless
    /// one of them is [`Damage::Icrc`].
    pub damage: Vec<Damage>,
}

/// A change to a frame's bytes that [`Packet`]'s fields cannot express.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Damage {
    /// The BTH opcode byte, whatever it means.
    Opcode(u8),
    /// The pad count bits, whatever payload there is.
    PadCount(u8),
    /// The transport version bits.
    Tver(u8),
    /// Keep only this many bytes from the start of the BTH (then the ICRC).
    Truncate(usize),
    /// XOR into the ICRC, after it is computed.
    Icrc(u32),
}

impl Packet {
    /// A packet of `opcode` to `dest_qpn` at `psn` with the default P_Key and no payload.
    pub fn new(opcode: Opcode, dest_qpn: u32, psn: Psn) -> Packet {
        Packet {
            bth: bth::Repr {
                opcode,
                solicited: false,
                mig_req: false,
                pad_count: 0,
                pkey: 0xFFFF,
                fecn: false,
                becn: false,
                dest_qpn,
                ack_req: opcode.info().position.ends_message() && opcode.info().is_request,
                resv7: 0,
                psn,
            },
            ext: ExtRepr::default(),
            payload: Vec::new(),
            damage: Vec::new(),
        }
    }

    /// The same packet with `damage` done to its bytes.
    pub fn damaged(mut self, damage: Damage) -> Packet {
        self.damage.push(damage);
        self
    }

    /// The Ethernet frame from `from` to `to`.
    pub fn emit(&self, from: Station, to: Station, udp_src_port: u16) -> io::Result<Vec<u8>> {
        let frame = FrameRepr {
            ethernet: EthernetRepr {
                dst: to.mac,
                src: from.mac,
                vlan: None,
            },
            ip: match (from.ip, to.ip) {
                (IpAddr::V4(src), IpAddr::V4(dst)) => IpRepr::V4(Ipv4Repr::new(src, dst)),
                (IpAddr::V6(src), IpAddr::V6(dst)) => IpRepr::V6(Ipv6Repr {
                    src,
                    dst,
                    traffic_class: 0,
                    flow_label: 0,
                    hop_limit: 64,
                }),
                _ => return Err(io::Error::other("IPv4 and IPv6 stations on one link")),
            },
            udp_src_port,
            udp_checksum: false,
            bth: self.bth,
            ext: self.ext,
            payload: &self.payload,
        };
        let mut bytes = vec![0u8; frame.buffer_len()];
        frame
            .emit(&mut bytes)
            .map_err(|_| io::Error::other(format!("cannot emit {:?}", self.bth.opcode)))?;
        let at = Offsets::of(&bytes).ok_or_else(|| io::Error::other("emitted a non-IP frame"))?;
        let bth = at.bth;
        let mut icrc_mask = 0;
        for damage in &self.damage {
            match *damage {
                Damage::Opcode(byte) => bytes[bth] = byte,
                Damage::PadCount(pad) => {
                    bytes[bth + 1] = (bytes[bth + 1] & !0x30) | ((pad & 3) << 4)
                }
                Damage::Tver(tver) => bytes[bth + 1] = (bytes[bth + 1] & !0x0F) | (tver & 0xF),
                Damage::Truncate(keep) => {
                    let end = (bth + keep).min(bytes.len() - ICRC_LEN);
                    bytes.truncate(end);
                    bytes.extend_from_slice(&[0; ICRC_LEN]);
                }
                Damage::Icrc(mask) => icrc_mask ^= mask,
            }
        }
        fix_lengths(&mut bytes);
        let end = bytes.len() - ICRC_LEN;
        // A BTH too short to mask gets no ICRC at all: the trailer stays zero.
        if let Ok(value) = icrc::compute(&bytes[at.ip..end]) {
            bytes[end..].copy_from_slice(&icrc::to_bytes(value ^ icrc_mask));
        }
        Ok(bytes)
    }
}

/// Rewrites the IP length (IPv4's total length and checksum, or IPv6's payload length) and
/// the UDP length for the frame's size; leaves a frame too short for its headers alone.
pub fn fix_lengths(bytes: &mut [u8]) {
    let Some(at) = Offsets::of(bytes).filter(|at| bytes.len() >= at.bth) else {
        return;
    };
    let udp_len = (bytes.len() - at.udp) as u16;
    bytes[at.udp + 4..at.udp + 6].copy_from_slice(&udp_len.to_be_bytes());
    if at.ipv6 {
        bytes[at.ip + 4..at.ip + 6].copy_from_slice(&udp_len.to_be_bytes());
        return;
    }
    let ip_len = (bytes.len() - at.ip) as u16;
    bytes[at.ip + 2..at.ip + 4].copy_from_slice(&ip_len.to_be_bytes());
    bytes[at.ip + 10..at.ip + 12].fill(0);
    let sum = bytes[at.ip..at.udp]
        .chunks(2)
        .map(|pair| u32::from(u16::from_be_bytes([pair[0], pair[1]])))
        .sum::<u32>();
    let folded = (sum & 0xFFFF) + (sum >> 16);
    let checksum = !(((folded & 0xFFFF) + (folded >> 16)) as u16);
    bytes[at.ip + 10..at.ip + 12].copy_from_slice(&checksum.to_be_bytes());
}

/// One frame the target sent us, decoded as far as it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// An ACK, NAK or RNR NAK (`RC_ACKNOWLEDGE`), or an atomic acknowledgement.
    Ack {
        /// Its PSN.
        psn: Psn,
        /// Its syndrome.
        syndrome: Syndrome,
        /// Its MSN.
        msn: u32,
        /// The original value, for `RC_ATOMIC_ACKNOWLEDGE`.
        original: Option<u64>,
    },
    /// An RDMA READ response packet.
    ReadResponse {
        /// Its PSN.
        psn: Psn,
        /// First, middle, last or only.
        position: Position,
        /// Payload bytes.
        len: usize,
    },
    /// Any other opcode (a request of the target's own).
    Other {
        /// Its opcode.
        opcode: Opcode,
        /// Its PSN.
        psn: Psn,
    },
    /// A frame whose ICRC is wrong.
    BadIcrc,
    /// A frame that is not a well-formed RoCEv2 packet.
    Malformed,
}

impl Answer {
    /// Decodes `bytes` if it is RoCEv2 traffic to `qpn` (`None` for anyone else's).
    pub fn decode(bytes: &[u8], qpn: u32) -> Option<Answer> {
        let repr = match inspect(bytes, Some(qpn))? {
            Ok(repr) => repr,
            Err(FrameError::BadIcrc { .. }) => return Some(Answer::BadIcrc),
            Err(_) => return Some(Answer::Malformed),
        };
        let psn = repr.bth.psn;
        let opcode = repr.bth.opcode;
        Some(match (repr.ext.aeth, opcode) {
            (Some(aeth), Opcode::RcAcknowledge | Opcode::RcAtomicAcknowledge) => Answer::Ack {
                psn,
                syndrome: aeth.syndrome,
                msn: aeth.msn,
                original: repr.ext.atomic_ack_eth.map(|ack| ack.original),
            },
            _ if is_read_response(opcode) => Answer::ReadResponse {
                psn,
                position: opcode.info().position,
                len: repr.payload.len(),
            },
            _ => Answer::Other { opcode, psn },
        })
    }

    /// The PSN it carries, if any.
    pub fn psn(&self) -> Option<Psn> {
        match self {
            Answer::Ack { psn, .. }
            | Answer::ReadResponse { psn, .. }
            | Answer::Other { psn, .. } => Some(*psn),
            Answer::BadIcrc | Answer::Malformed => None,
        }
    }
}

/// What a received frame is to our QP `qpn` (to any QP with `None`): `None` when it is not
/// RoCEv2 or is another QP's; its fields when it is well formed with a right ICRC; else why
/// not ([`FrameError::BadIcrc`] when the ICRC is wrong, whatever else is). A frame that breaks
/// the format counts whoever it is for, since its QP number cannot be trusted.
pub fn inspect(bytes: &[u8], qpn: Option<u32>) -> Option<Result<FrameRepr<'_>, FrameError>> {
    let frame = match Frame::new_checked(bytes) {
        Ok(frame) => frame,
        Err(FrameError::NotRoce) => return None,
        Err(error) => return Some(Err(error)),
    };
    if qpn.is_some_and(|qpn| frame.bth().dest_qpn() != qpn) {
        return None;
    }
    Some(FrameRepr::parse(&frame).map_err(|error| frame.check_icrc().err().unwrap_or(error)))
}

/// Most bytes of a rejected frame [`Rejected`] shows.
const SHOWN_BYTES: usize = 128;

/// A frame we rejected, for the output: why, its length and its first bytes in hex, so a
/// `MALFORMED` or `BAD_ICRC` seen once (under load, in CI) can be read afterwards.
pub struct Rejected<'a> {
    /// Why it was rejected.
    pub error: &'a FrameError,
    /// The frame as received.
    pub bytes: &'a [u8],
}

impl fmt::Display for Rejected<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let len = self.bytes.len();
        write!(f, "rejected frame ({}), {len} bytes:", self.error)?;
        for byte in &self.bytes[..len.min(SHOWN_BYTES)] {
            write!(f, " {byte:02x}")?;
        }
        if len > SHOWN_BYTES {
            f.write_str(" ...")?;
        }
        Ok(())
    }
}

fn is_read_response(opcode: Opcode) -> bool {
    matches!(
        opcode,
        Opcode::RcRdmaReadResponseFirst
            | Opcode::RcRdmaReadResponseMiddle
            | Opcode::RcRdmaReadResponseLast
            | Opcode::RcRdmaReadResponseOnly
    )
}

/// How an answer reads in a result line, its PSN relative to `base`: `ACK@0`, `NAK_SEQ@0`,
/// `RNR@1`, `READ_ONLY@0:64`, `ATOMIC_ACK@0`.
pub struct Shown<'a> {
    /// The answer.
    pub answer: &'a Answer,
    /// The PSN its offset is counted from.
    pub base: Psn,
}

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = |psn: Psn| psn.distance(self.base);
        match self.answer {
            Answer::Ack {
                psn,
                syndrome,
                original,
                ..
            } => {
                let name = match syndrome {
                    Syndrome::Ack(_) if original.is_some() => "ATOMIC_ACK",
                    Syndrome::Ack(_) => "ACK",
                    Syndrome::RnrNak(_) => "RNR",
                    Syndrome::Nak(NakCode::PsnSequenceError) => "NAK_SEQ",
                    Syndrome::Nak(NakCode::InvalidRequest) => "NAK_INV",
                    Syndrome::Nak(NakCode::RemoteAccessError) => "NAK_ACCESS",
                    Syndrome::Nak(NakCode::RemoteOperationalError) => "NAK_OPERR",
                    Syndrome::Nak(NakCode::InvalidRdRequest) => "NAK_RD",
                };
                write!(f, "{name}@{}", at(*psn))
            }
            Answer::ReadResponse { psn, position, len } => {
                let name = match position {
                    Position::First => "READ_FIRST",
                    Position::Middle => "READ_MIDDLE",
                    Position::Last => "READ_LAST",
                    Position::Only => "READ_ONLY",
                };
                write!(f, "{name}@{}:{len}", at(*psn))
            }
            Answer::Other { opcode, psn } => write!(f, "{}@{}", opcode.name(), at(*psn)),
            Answer::BadIcrc => f.write_str("BAD_ICRC"),
            Answer::Malformed => f.write_str("MALFORMED"),
        }
    }
}

/// A backend with who we are and who the target is.
pub struct Link {
    backend: Box<dyn Backend>,
    /// Us.
    pub ours: Station,
    /// The target (its MAC once known).
    pub theirs: Station,
    /// How long to wait for an answer that may not come.
    pub wait: Duration,
    rx: Vec<u8>,
}

impl Link {
    /// Talks through `backend` as `ours` to `theirs`.
    pub fn new(backend: Box<dyn Backend>, ours: Station, theirs: Station, wait: Duration) -> Link {
        Link {
            backend,
            ours,
            theirs,
            wait,
            rx: vec![0; MAX_FRAME],
        }
    }

    /// The frame `packet` makes from our QP `src_qpn` (which picks the UDP source port, as
    /// rxe does).
    pub fn emit(&self, packet: &Packet, src_qpn: u32) -> io::Result<Vec<u8>> {
        let port = 0xC000 | (src_qpn & 0x3FFF) as u16;
        packet.emit(self.ours, self.theirs, port)
    }

    /// Emits and sends `packet` from our QP `src_qpn`.
    pub fn send(&mut self, packet: &Packet, src_qpn: u32) -> io::Result<()> {
        let bytes = self.emit(packet, src_qpn)?;
        self.send_bytes(&bytes)
    }

    /// Sends a frame as it is.
    pub fn send_bytes(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.backend.send(bytes)
    }

    /// Drops whatever is waiting (answers to an earlier step that came too late).
    pub fn drain(&mut self) -> io::Result<()> {
        while self.backend.recv(&mut self.rx)?.is_some() {}
        Ok(())
    }

    /// Collects the answers to our QP `qpn`: waits until `wanted` have come (then a little
    /// longer, for any extra), or [`wait`](Self::wait) has passed.
    pub fn observe(&mut self, qpn: u32, wanted: usize) -> io::Result<Vec<Answer>> {
        let wait = self.wait;
        self.collect(wanted, wait, &mut |frame| Answer::decode(frame, qpn))
    }

    /// Collects what `decode` makes of the frames that arrive (it returns `None` for those
    /// it ignores): waits until `wanted` have come (then a fifth of [`wait`](Self::wait)
    /// longer, for any extra), or `wait` has passed.
    pub fn collect<T>(
        &mut self,
        wanted: usize,
        wait: Duration,
        decode: &mut dyn FnMut(&[u8]) -> Option<T>,
    ) -> io::Result<Vec<T>> {
        let started = Instant::now();
        let mut deadline = started + wait;
        let mut seen = Vec::new();
        loop {
            while let Some(len) = self.backend.recv(&mut self.rx)? {
                let frame = &self.rx[..len];
                if let Some(Err(error)) = inspect(frame, None) {
                    eprintln!(
                        "{}",
                        Rejected {
                            error: &error,
                            bytes: frame
                        }
                    );
                }
                if let Some(item) = decode(frame) {
                    seen.push(item);
                    if seen.len() == wanted && wanted > 0 {
                        // Extras (a second NAK, a duplicate response) come right after.
                        deadline = deadline.min(Instant::now() + self.wait / 5);
                    }
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(seen);
            }
            self.backend
                .wait(Some((deadline - now).min(Duration::from_millis(5))))?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// Station `last` of an IPv4 link, or of an IPv6 one.
    fn station(last: u8, ipv6: bool) -> Station {
        Station {
            mac: [2, 0, 0, 0, 0, last],
            ip: if ipv6 {
                IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(last)))
            } else {
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
            },
        }
    }

    #[test]
    fn damage_keeps_the_frame_consistent_unless_asked_not_to() {
        for (ipv6, bth_at) in [(false, 14 + 20 + 8), (true, 14 + 40 + 8)] {
            let (from, to) = (station(1, ipv6), station(2, ipv6));
            let mut packet = Packet::new(Opcode::RcSendOnly, 0x11, Psn::new(5));
            packet.payload = vec![7; 64];
            let good = packet.emit(from, to, 0xC011).unwrap();
            assert_eq!(
                Offsets::of(&good).map(|at| (at.bth, at.ipv6)),
                Some((bth_at, ipv6))
            );
            let frame = Frame::new_checked(&good[..]).unwrap();
            assert!(frame.check_icrc().is_ok());

            let cut = packet
                .clone()
                .damaged(Damage::Truncate(12 + 10))
                .emit(from, to, 0xC011)
                .unwrap();
            assert_eq!(cut.len(), bth_at + 12 + 10 + ICRC_LEN);
            let frame = Frame::new_checked(&cut[..]).unwrap();
            assert!(
                frame.check_icrc().is_ok(),
                "lengths and ICRC follow the cut"
            );
            assert_eq!(frame.payload().len(), 10);

            let reserved = packet
                .clone()
                .damaged(Damage::Opcode(0x1F))
                .emit(from, to, 0xC011)
                .unwrap();
            assert_eq!(
                reserved[bth_at], 0x1F,
                "the BTH's first byte, for either family"
            );

            let bad = packet
                .damaged(Damage::Icrc(1))
                .emit(from, to, 0xC011)
                .unwrap();
            let frame = Frame::new_checked(&bad[..]).unwrap();
            assert!(frame.check_icrc().is_err());
            assert_eq!(
                Answer::decode(&bad, 0x11),
                Some(Answer::BadIcrc),
                "a bad ICRC is reported as such"
            );
            assert_eq!(Answer::decode(&bad, 0x12), None, "someone else's frame");
        }
        assert!(
            Packet::new(Opcode::RcSendOnly, 0x11, Psn::new(5))
                .emit(station(1, false), station(2, true), 0xC011)
                .is_err(),
            "one family per link"
        );
    }

    #[test]
    fn a_rejected_frame_says_why_and_shows_its_first_bytes() {
        let mut packet = Packet::new(Opcode::RcSendOnly, 0x11, Psn::new(5));
        packet.payload = vec![0xAB; 200];
        let good = packet
            .emit(station(1, false), station(2, false), 0xC011)
            .unwrap();
        let short = &good[..good.len() - 10];
        assert_eq!(Answer::decode(short, 0x11), Some(Answer::Malformed));
        assert_eq!(
            Answer::decode(short, 0x12),
            Some(Answer::Malformed),
            "a broken frame's QP number is not trusted"
        );
        let Some(Err(error)) = inspect(short, None) else {
            panic!("a cut frame is rejected");
        };
        let shown = Rejected {
            error: &error,
            bytes: short,
        }
        .to_string();
        assert!(
            shown.starts_with(&format!(
                "rejected frame (malformed: frame shorter than its IP length), {} bytes: 02 00 00 00 00 02 ",
                short.len()
            )),
            "{shown}"
        );
        let hex = shown.split("bytes:").nth(1).unwrap();
        let shown_bytes = hex
            .split_whitespace()
            .filter(|word| word.len() == 2)
            .count();
        assert_eq!(shown_bytes, SHOWN_BYTES, "{shown}");
        assert!(shown.ends_with(" ab ab ..."), "{shown}");

        let mut bad = good.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let Some(Err(error)) = inspect(&bad, Some(0x11)) else {
            panic!("a bad ICRC is rejected");
        };
        assert!(matches!(error, FrameError::BadIcrc { .. }));
        assert!(inspect(&good, Some(0x11)).is_some_and(|r| r.is_ok()));
        assert!(inspect(&good, Some(0x12)).is_none(), "someone else's frame");
    }
}
