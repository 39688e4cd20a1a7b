//! A whole RoCEv2 frame: Ethernet II (optionally 802.1Q-tagged) → IPv4 or IPv6 → UDP to port
//! 4791 → BTH → extension headers → payload → pad → ICRC.
//!
//! [`Frame::new_checked`] finds every layer and checks every length, so no accessor panics
//! after it; [`FrameRepr`] is the decoded value the transport works with.

use core::fmt;
use core::net::{Ipv4Addr, Ipv6Addr};

use etherparse::{
    EtherType, Ethernet2Header, Ethernet2HeaderSlice, IpDscp, IpEcn, IpFragOffset, IpNumber,
    Ipv4Header, Ipv4HeaderSlice, Ipv4Options, Ipv6FlowLabel, Ipv6Header, Ipv6HeaderSlice,
    SingleVlanHeader, SingleVlanHeaderSlice, UdpHeader, UdpHeaderSlice, VlanId, VlanPcp,
};

use crate::icrc::{self, ICRC_LEN};
use crate::{bth, Error, ExtRepr, Opcode};

/// The UDP destination port IANA assigned to RoCEv2.
pub const ROCEV2_UDP_PORT: u16 = 4791;

const ETHERNET_HEADER_LEN: usize = 14;
const VLAN_TAG_LEN: usize = 4;
const IPV4_HEADER_LEN: usize = 20;
const IPV6_HEADER_LEN: usize = 40;
const UDP_HEADER_LEN: usize = 8;
const UDP_DEST_PORT: core::ops::Range<usize> = 2..4;

/// Why a frame is not a usable RoCEv2 packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// Not IPv4/IPv6 UDP to port 4791: someone else's traffic, not an error of the sender.
    NotRoce,
    /// A RoCEv2 frame whose BTH opcode is reserved or unsupported (rejected before any
    /// length or ICRC arithmetic).
    UnknownOpcode(u8),
    /// A RoCEv2 frame that breaks the format; the text says how.
    Malformed(&'static str),
    /// The ICRC does not match the bytes it covers.
    BadIcrc {
        /// ICRC computed over the frame.
        computed: u32,
        /// ICRC the frame carries.
        received: u32,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::NotRoce => f.write_str("not RoCEv2"),
            FrameError::UnknownOpcode(opcode) => write!(f, "unknown opcode {opcode:#04x}"),
            FrameError::Malformed(why) => write!(f, "malformed: {why}"),
            FrameError::BadIcrc { computed, received } => {
                write!(
                    f,
                    "bad ICRC: computed {computed:#010x}, received {received:#010x}"
                )
            }
        }
    }
}

impl core::error::Error for FrameError {}

/// Offsets of each layer inside a checked frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    ip: usize,
    udp: usize,
    bth: usize,
    ext: usize,
    payload: usize,
    payload_end: usize,
    icrc: usize,
    /// End of the IP packet; Ethernet padding may follow.
    end: usize,
    opcode: Opcode,
}

/// A checked view of a RoCEv2 frame in a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
    layout: Layout,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Locates every layer and checks every length. After `Ok`, no accessor panics.
    /// The ICRC is not checked here: see [`check_icrc`](Self::check_icrc).
    pub fn new_checked(buffer: T) -> Result<Self, FrameError> {
        let layout = locate(buffer.as_ref())?;
        Ok(Frame { buffer, layout })
    }

    /// The BTH opcode.
    pub fn opcode(&self) -> Opcode {
        self.layout.opcode
    }

    /// The whole Ethernet frame, including any padding after the IP packet.
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// From the IP header to the end of the ICRC.
    pub fn ip_packet(&self) -> &[u8] {
        &self.buffer.as_ref()[self.layout.ip..self.layout.end]
    }

    /// A view of the BTH.
    pub fn bth(&self) -> bth::Packet<&[u8]> {
        bth::Packet::new_unchecked(&self.buffer.as_ref()[self.layout.bth..self.layout.ext])
    }

    /// The payload without its pad bytes.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.layout.payload..self.layout.payload_end]
    }

    /// The ICRC the frame carries.
    pub fn received_icrc(&self) -> u32 {
        let trailer = &self.buffer.as_ref()[self.layout.icrc..self.layout.end];
        icrc::read([trailer[0], trailer[1], trailer[2], trailer[3]])
    }

    /// The ICRC of the frame's contents.
    pub fn computed_icrc(&self) -> u32 {
        let covered = &self.buffer.as_ref()[self.layout.ip..self.layout.icrc];
        // `locate` guaranteed IP, UDP and BTH headers are present.
        icrc::compute(covered).unwrap_or(0)
    }

    /// Fails with [`FrameError::BadIcrc`] unless the carried ICRC is right.
    pub fn check_icrc(&self) -> Result<(), FrameError> {
        let (computed, received) = (self.computed_icrc(), self.received_icrc());
        if computed == received {
            Ok(())
        } else {
            Err(FrameError::BadIcrc { computed, received })
        }
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The IP header's ECN field (RFC 3168): [`ECN_NOT_ECT`], [`ECN_ECT1`], [`ECN_ECT0`] or
    /// [`ECN_CE`].
    pub fn ecn(&self) -> u8 {
        let ip = &self.buffer.as_ref()[self.layout.ip..];
        if ip[0] >> 4 == 4 {
            ip[1] & 0x3
        } else {
            (ip[1] >> 4) & 0x3
        }
    }
}

/// ECN field: not ECN-capable.
pub const ECN_NOT_ECT: u8 = 0b00;
/// ECN field: ECN-capable, ECT(1).
pub const ECN_ECT1: u8 = 0b01;
/// ECN field: ECN-capable, ECT(0) (what RoCEv2 senders with DCQCN send).
pub const ECN_ECT0: u8 = 0b10;
/// ECN field: congestion experienced (written by a switch over ECT).
pub const ECN_CE: u8 = 0b11;

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Marks the frame "congestion experienced", as an ECN switch does: an ECN-capable
    /// frame's ECN field becomes CE (with the IPv4 header checksum updated); `false` when
    /// the frame is not ECN-capable or already CE. The ICRC does not cover the field.
    pub fn mark_congestion_experienced(&mut self) -> bool {
        if !matches!(self.ecn(), ECN_ECT0 | ECN_ECT1) {
            return false;
        }
        let ip = self.layout.ip;
        let bytes_ip = &mut self.buffer.as_mut()[ip..];
        if bytes_ip[0] >> 4 == 4 {
            bytes_ip[1] |= ECN_CE;
            bytes_ip[10..12].fill(0);
            let checksum = ipv4_header_checksum(&bytes_ip[..IPV4_HEADER_LEN]);
            bytes_ip[10..12].copy_from_slice(&checksum.to_be_bytes());
        } else {
            bytes_ip[1] |= ECN_CE << 4;
        }
        true
    }
}

/// The IPv4 header checksum of `header` with its checksum field zero; zero for a header
/// whose checksum is right. (Our own: etherparse's rebuilds the header first, which cost
/// the 64 B WRITE rate half a percent of the sender's core.)
fn ipv4_header_checksum(header: &[u8]) -> u16 {
    checksum_of_sum(word_sum(header))
}

/// The sum of `bytes` as big-endian 16-bit words, not yet folded (fewer than 2^16 words).
fn word_sum(bytes: &[u8]) -> u32 {
    bytes
        .chunks_exact(2)
        .map(|pair| u32::from(u16::from_be_bytes([pair[0], pair[1]])))
        .sum()
}

/// The Internet checksum of words whose sum is `sum`: folded to 16 bits, complemented.
fn checksum_of_sum(mut sum: u32) -> u16 {
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

fn locate(bytes: &[u8]) -> Result<Layout, FrameError> {
    use FrameError::{Malformed, NotRoce};

    let ethernet = Ethernet2HeaderSlice::from_slice(bytes).map_err(|_| NotRoce)?;
    let (ether_type, ip) = if ethernet.ether_type() == EtherType::VLAN_TAGGED_FRAME {
        let vlan = SingleVlanHeaderSlice::from_slice(&bytes[ETHERNET_HEADER_LEN..])
            .map_err(|_| NotRoce)?;
        (vlan.ether_type(), ETHERNET_HEADER_LEN + VLAN_TAG_LEN)
    } else {
        (ethernet.ether_type(), ETHERNET_HEADER_LEN)
    };
    let (udp, ip_len) = match ether_type {
        EtherType::IPV4 => locate_ipv4(&bytes[ip..])?,
        EtherType::IPV6 => locate_ipv6(&bytes[ip..])?,
        _ => return Err(NotRoce),
    };
    let udp = ip + udp;
    let end = ip + ip_len;
    let dest_port = bytes.get(udp + UDP_DEST_PORT.start..udp + UDP_DEST_PORT.end);
    if dest_port != Some(&ROCEV2_UDP_PORT.to_be_bytes()[..]) {
        return Err(NotRoce);
    }
    // From here on the frame claims to be RoCEv2: anything wrong is the sender's fault.
    if bytes.len() < end {
        return Err(Malformed("frame shorter than its IP length"));
    }
    if end < udp + UDP_HEADER_LEN {
        return Err(Malformed("IP length shorter than its headers"));
    }
    let udp_len = u16::from_be_bytes([bytes[udp + 4], bytes[udp + 5]]);
    if usize::from(udp_len) != end - udp {
        return Err(Malformed("UDP length disagrees with IP length"));
    }
    check_udp_checksum(bytes, ether_type, ip, udp, end)?;
    let bth = udp + UDP_HEADER_LEN;
    let bth_packet =
        bth::Packet::new_checked(&bytes[bth..end]).map_err(|_| Malformed("no room for a BTH"))?;
    let opcode = Opcode::try_from(bth_packet.opcode())
        .map_err(|_| FrameError::UnknownOpcode(bth_packet.opcode()))?;
    if bth_packet.tver() != 0 {
        return Err(Malformed("BTH transport version is not 0"));
    }
    let info = opcode.info();
    let ext = bth + bth::HEADER_LEN;
    let payload = ext + info.ext_len();
    let icrc = end.checked_sub(ICRC_LEN).filter(|&icrc| icrc >= payload);
    let icrc = icrc.ok_or(Malformed("too short for its opcode's headers and ICRC"))?;
    let pad = usize::from(bth_packet.pad_count());
    if !info.has_payload && icrc != payload {
        return Err(Malformed("payload on an opcode that carries none"));
    }
    let payload_end = icrc
        .checked_sub(pad)
        .filter(|&payload_end| payload_end >= payload);
    let payload_end = payload_end.ok_or(Malformed("pad count exceeds the payload"))?;
    Ok(Layout {
        ip,
        udp,
        bth,
        ext,
        payload,
        payload_end,
        icrc,
        end,
        opcode,
    })
}

/// RoCEv2 senders normally put 0 (none) in the UDP checksum; when one is there, it must be
/// right, since nothing else on the AF_XDP path checks it.
fn check_udp_checksum(
    bytes: &[u8],
    ether_type: EtherType,
    ip: usize,
    udp: usize,
    end: usize,
) -> Result<(), FrameError> {
    let carried = u16::from_be_bytes([bytes[udp + 6], bytes[udp + 7]]);
    if carried == 0 || cfg!(fuzzing) {
        return Ok(());
    }
    let is_ipv4 = ether_type == EtherType::IPV4;
    if udp_checksum(&bytes[..end], is_ipv4, ip, udp) != Ok(carried) {
        return Err(FrameError::Malformed("bad UDP checksum"));
    }
    Ok(())
}

/// The UDP checksum of the datagram at `udp` (to the end of `bytes`), with the pseudo-header
/// from the IP header at `ip`.
fn udp_checksum(bytes: &[u8], is_ipv4: bool, ip: usize, udp: usize) -> Result<u16, FrameError> {
    let header = UdpHeaderSlice::from_slice(&bytes[udp..])
        .map_err(|_| FrameError::Malformed("UDP header"))?
        .to_header();
    let payload = &bytes[udp + UDP_HEADER_LEN..];
    let computed = if is_ipv4 {
        let address = |at: usize| [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]];
        header.calc_checksum_ipv4_raw(address(ip + 12), address(ip + 16), payload)
    } else {
        let address = |at: usize| -> [u8; 16] { core::array::from_fn(|i| bytes[at + i]) };
        header.calc_checksum_ipv6_raw(address(ip + 8), address(ip + 24), payload)
    };
    computed.map_err(|_| FrameError::Malformed("UDP datagram too long"))
}

/// Returns the UDP header's offset and the IP packet's length, both from the IPv4 header.
fn locate_ipv4(bytes: &[u8]) -> Result<(usize, usize), FrameError> {
    use FrameError::{Malformed, NotRoce};

    let header = Ipv4HeaderSlice::from_slice(bytes).map_err(|_| NotRoce)?;
    if header.protocol() != IpNumber::UDP {
        return Err(NotRoce);
    }
    let header_len = header.slice().len();
    let total_len = usize::from(header.total_len());
    if bytes.get(header_len + UDP_DEST_PORT.start..header_len + UDP_DEST_PORT.end)
        != Some(&ROCEV2_UDP_PORT.to_be_bytes()[..])
    {
        return Err(NotRoce);
    }
    if header_len != IPV4_HEADER_LEN {
        return Err(Malformed("IPv4 options (RoCEv2 never sends them)"));
    }
    if total_len < header_len + UDP_HEADER_LEN {
        return Err(Malformed("IPv4 total length shorter than its headers"));
    }
    // The reserved flag bit, or any fragmentation: RoCEv2 relies on DF and never fragments.
    if bytes[6] & 0x80 != 0 || header.more_fragments() || header.fragments_offset().value() != 0 {
        return Err(Malformed("IPv4 fragment or reserved flag"));
    }
    // AF_XDP receives before the kernel's IP layer, so nobody else checks this.
    if !cfg!(fuzzing) && ipv4_header_checksum(header.slice()) != 0 {
        return Err(Malformed("bad IPv4 header checksum"));
    }
    Ok((header_len, total_len))
}

/// Returns the UDP header's offset and the IP packet's length, both from the IPv6 header.
fn locate_ipv6(bytes: &[u8]) -> Result<(usize, usize), FrameError> {
    let header = Ipv6HeaderSlice::from_slice(bytes).map_err(|_| FrameError::NotRoce)?;
    // RoCEv2 puts UDP right after the fixed header; extension headers mean someone else.
    if header.next_header() != IpNumber::UDP {
        return Err(FrameError::NotRoce);
    }
    Ok((
        IPV6_HEADER_LEN,
        IPV6_HEADER_LEN + usize::from(header.payload_length()),
    ))
}

/// An 802.1Q tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VlanTag {
    /// Priority code point (3 bits).
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN identifier (12 bits).
    pub vid: u16,
}

/// The Ethernet header of a RoCEv2 frame; the EtherType follows from the IP version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetRepr {
    /// Destination MAC.
    pub dst: [u8; 6],
    /// Source MAC.
    pub src: [u8; 6],
    /// 802.1Q tag, if any.
    pub vlan: Option<VlanTag>,
}

/// The IPv4 fields a RoCEv2 sender chooses; lengths and checksum are derived on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Repr {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Differentiated services code point (6 bits).
    pub dscp: u8,
    /// Explicit congestion notification (2 bits).
    pub ecn: u8,
    /// Identification.
    pub identification: u16,
    /// Don't-fragment flag (rxe sets it).
    pub dont_fragment: bool,
    /// Time to live.
    pub ttl: u8,
}

impl EthernetRepr {
    /// An Ethernet header without an 802.1Q tag.
    pub const fn untagged(src: [u8; 6], dst: [u8; 6]) -> EthernetRepr {
        EthernetRepr {
            dst,
            src,
            vlan: None,
        }
    }
}

impl Ipv4Repr {
    /// IPv4 as rxe sends RoCEv2 by default: traffic class 0, identification 0, don't
    /// fragment, TTL 64.
    pub const fn new(src: Ipv4Addr, dst: Ipv4Addr) -> Ipv4Repr {
        Ipv4Repr {
            src,
            dst,
            dscp: 0,
            ecn: 0,
            identification: 0,
            dont_fragment: true,
            ttl: 64,
        }
    }
}

/// The IPv6 fields a RoCEv2 sender chooses; the payload length is derived on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Repr {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// Traffic class (DSCP and ECN).
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
}

/// The network layer of a RoCEv2 frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpRepr {
    /// RoCEv2 over IPv4 (GIDs of the form ::ffff:a.b.c.d).
    V4(Ipv4Repr),
    /// RoCEv2 over IPv6.
    V6(Ipv6Repr),
}

impl IpRepr {
    /// Length of the header on the wire.
    pub const fn header_len(&self) -> usize {
        match self {
            IpRepr::V4(_) => IPV4_HEADER_LEN,
            IpRepr::V6(_) => IPV6_HEADER_LEN,
        }
    }

    /// The ECN field (RFC 3168): [`ECN_NOT_ECT`], [`ECN_ECT1`], [`ECN_ECT0`] or [`ECN_CE`].
    #[inline]
    pub const fn ecn(&self) -> u8 {
        match self {
            IpRepr::V4(v4) => v4.ecn,
            IpRepr::V6(v6) => v6.traffic_class & 0x3,
        }
    }
}

/// A decoded RoCEv2 frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRepr<'a> {
    /// Ethernet header.
    pub ethernet: EthernetRepr,
    /// IP header.
    pub ip: IpRepr,
    /// UDP source port (rxe: 0xC000 | hash of the QPN, for ECMP entropy).
    pub udp_src_port: u16,
    /// Whether the UDP checksum is present (verified on parse, computed on emit). RoCEv2
    /// allows none, and rxe and HCAs send none.
    pub udp_checksum: bool,
    /// Base transport header.
    pub bth: bth::Repr,
    /// Extension headers, as `bth.opcode` requires.
    pub ext: ExtRepr,
    /// Payload without pad bytes.
    pub payload: &'a [u8],
}

impl<'a> FrameRepr<'a> {
    /// A frame from `src` to `dst` (each a MAC and an IPv4 address) as rxe sends one by
    /// default: untagged Ethernet, [`Ipv4Repr::new`], UDP source port 0xC000 and no UDP
    /// checksum.
    pub const fn ipv4(
        src: ([u8; 6], Ipv4Addr),
        dst: ([u8; 6], Ipv4Addr),
        bth: bth::Repr,
        ext: ExtRepr,
        payload: &'a [u8],
    ) -> Self {
        FrameRepr {
            ethernet: EthernetRepr::untagged(src.0, dst.0),
            ip: IpRepr::V4(Ipv4Repr::new(src.1, dst.1)),
            udp_src_port: 0xC000,
            udp_checksum: false,
            bth,
            ext,
            payload,
        }
    }

    /// Decodes a checked frame after verifying its ICRC. Under `cfg(fuzzing)` the ICRC is
    /// not checked, so a fuzzer reaches the parsers behind it.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(frame: &Frame<&'a T>) -> Result<Self, FrameError> {
        if !cfg!(fuzzing) {
            frame.check_icrc()?;
        }
        Self::parse_ignoring_icrc(frame)
    }

    /// Decodes a checked frame without looking at its ICRC: for tools that show bad frames.
    pub fn parse_ignoring_icrc<T: AsRef<[u8]> + ?Sized>(
        frame: &Frame<&'a T>,
    ) -> Result<Self, FrameError> {
        let bytes: &'a [u8] = frame.buffer.as_ref();
        let layout = &frame.layout;
        let ethernet = parse_ethernet(bytes);
        let ip = parse_ip(&bytes[layout.ip..layout.udp]);
        let udp = &bytes[layout.udp..layout.bth];
        let bth_packet = bth::Packet::new_unchecked(&bytes[layout.bth..layout.ext]);
        let bth = bth::Repr::parse(&bth_packet).map_err(|_| FrameError::Malformed("BTH"))?;
        let ext = ExtRepr::parse(layout.opcode, &bytes[layout.ext..layout.payload])
            .map_err(|_| FrameError::Malformed("extension header"))?;
        if layout.opcode == Opcode::RcAtomicWrite && layout.payload_end - layout.payload != 8 {
            return Err(FrameError::Malformed("ATOMIC_WRITE payload is not 8 bytes"));
        }
        Ok(FrameRepr {
            ethernet,
            ip,
            udp_src_port: u16::from_be_bytes([udp[0], udp[1]]),
            udp_checksum: udp[6..8] != [0, 0],
            bth,
            ext,
            payload: &bytes[layout.payload..layout.payload_end],
        })
    }

    /// Bytes [`emit`](Self::emit) writes: the frame without Ethernet padding.
    pub fn buffer_len(&self) -> usize {
        self.buffer_len_with(self.payload.len())
    }

    /// Bytes [`emit_with`](Self::emit_with) writes for a payload of `payload_len` bytes.
    pub fn buffer_len_with(&self, payload_len: usize) -> usize {
        self.ip_offset() + self.ip_len(payload_len)
    }

    fn ip_offset(&self) -> usize {
        ETHERNET_HEADER_LEN
            + if self.ethernet.vlan.is_some() {
                VLAN_TAG_LEN
            } else {
                0
            }
    }

    fn ip_len(&self, payload_len: usize) -> usize {
        self.ip.header_len() + udp_len(&self.bth, payload_len)
    }

    /// Writes the whole frame, deriving lengths, the IPv4 checksum and the ICRC. Fails when
    /// `buffer` is too short or the fields are inconsistent (headers that do not match the
    /// opcode, a payload on an opcode without one, a value too wide for its field).
    pub fn emit(&self, buffer: &mut [u8]) -> crate::Result<usize> {
        self.emit_with(self.payload.len(), buffer, |out, icrc| {
            out.copy_from_slice(self.payload);
            Some(icrc.update(out))
        })
    }

    /// [`emit`](Self::emit) with a payload of `payload_len` bytes (`self.payload` is not
    /// used) that `write_payload` writes in place, between the headers and the pad,
    /// continuing the ICRC over it: a sender copies the bytes straight from where they lie
    /// into the frame, and hashes them there. Fails as `emit` does, or when `write_payload`
    /// returns `None`.
    pub fn emit_with(
        &self,
        payload_len: usize,
        buffer: &mut [u8],
        write_payload: impl FnOnce(&mut [u8], icrc::Running) -> Option<icrc::Running>,
    ) -> crate::Result<usize> {
        LinkHeaders::new(self)?.emit_with(&self.bth, &self.ext, payload_len, buffer, write_payload)
    }

    fn emit_ethernet(&self, buffer: &mut [u8]) -> crate::Result<usize> {
        let ip_type = match self.ip {
            IpRepr::V4(_) => EtherType::IPV4,
            IpRepr::V6(_) => EtherType::IPV6,
        };
        let ethernet = Ethernet2Header {
            source: self.ethernet.src,
            destination: self.ethernet.dst,
            ether_type: if self.ethernet.vlan.is_some() {
                EtherType::VLAN_TAGGED_FRAME
            } else {
                ip_type
            },
        };
        buffer[..ETHERNET_HEADER_LEN].copy_from_slice(&ethernet.to_bytes());
        if let Some(tag) = self.ethernet.vlan {
            let vlan = SingleVlanHeader {
                pcp: VlanPcp::try_new(tag.pcp).map_err(|_| Error)?,
                drop_eligible_indicator: tag.dei,
                vlan_id: VlanId::try_new(tag.vid).map_err(|_| Error)?,
                ether_type: ip_type,
            };
            buffer[ETHERNET_HEADER_LEN..ETHERNET_HEADER_LEN + VLAN_TAG_LEN]
                .copy_from_slice(&vlan.to_bytes());
        }
        Ok(self.ip_offset())
    }
}

/// The UDP datagram's length for a packet with `bth` and `payload_len` bytes of payload.
fn udp_len(bth: &bth::Repr, payload_len: usize) -> usize {
    UDP_HEADER_LEN
        + bth::HEADER_LEN
        + ExtRepr::buffer_len(bth.opcode)
        + payload_len
        + usize::from(bth.pad_count)
        + ICRC_LEN
}

/// Longest headers below the BTH: Ethernet with an 802.1Q tag, IPv6, UDP.
const MAX_LINK_HEADERS_LEN: usize =
    ETHERNET_HEADER_LEN + VLAN_TAG_LEN + IPV6_HEADER_LEN + UDP_HEADER_LEN;

/// The headers of a RoCEv2 frame below its BTH (Ethernet with its tag, IP, UDP), emitted
/// once. Every packet of one QP to one destination carries the same ones but for the
/// lengths and the IPv4 checksum over them, so a sender keeps them per flow and only
/// patches those ([`emit_with`](Self::emit_with)) rather than building them per packet.
/// [`FrameRepr::emit_with`] emits through it too: one way to write a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkHeaders {
    bytes: [u8; MAX_LINK_HEADERS_LEN],
    /// Where the IP header starts, and the UDP header.
    ip: usize,
    udp: usize,
    is_ipv4: bool,
    udp_checksum: bool,
    /// The IPv4 header's word sum without its total length and checksum: a packet's
    /// checksum is this plus its length, folded (RFC 1624), not a sum over the header.
    ipv4_sum: u32,
}

impl LinkHeaders {
    /// The headers of `frame` below its BTH (its lengths and its payload are not used).
    /// Fails when a field is too wide for the header it goes in.
    pub fn new(frame: &FrameRepr) -> crate::Result<LinkHeaders> {
        let mut bytes = [0; MAX_LINK_HEADERS_LEN];
        let ip = frame.emit_ethernet(&mut bytes)?;
        // The lengths (and the IPv4 checksum over them) are written per packet.
        let udp = ip + frame.ip.emit(UDP_HEADER_LEN, &mut bytes[ip..])?;
        let udp_header = UdpHeader {
            source_port: frame.udp_src_port,
            destination_port: ROCEV2_UDP_PORT,
            length: 0,
            checksum: 0,
        };
        bytes[udp..udp + UDP_HEADER_LEN].copy_from_slice(&udp_header.to_bytes());
        let is_ipv4 = matches!(frame.ip, IpRepr::V4(_));
        let ipv4_sum = if is_ipv4 {
            let mut header = [0; IPV4_HEADER_LEN];
            header.copy_from_slice(&bytes[ip..ip + IPV4_HEADER_LEN]);
            header[2..4].fill(0);
            header[10..12].fill(0);
            word_sum(&header)
        } else {
            0
        };
        Ok(LinkHeaders {
            bytes,
            ip,
            udp,
            is_ipv4,
            udp_checksum: frame.udp_checksum,
            ipv4_sum,
        })
    }

    /// The destination MAC address.
    pub fn ethernet_dst(&self) -> [u8; 6] {
        let mut dst = [0; 6];
        dst.copy_from_slice(&self.bytes[..6]);
        dst
    }

    /// The UDP source port.
    pub fn udp_src_port(&self) -> u16 {
        u16::from_be_bytes([self.bytes[self.udp], self.bytes[self.udp + 1]])
    }

    /// Bytes [`emit_with`](Self::emit_with) writes for a packet with `bth` and
    /// `payload_len` bytes of payload.
    pub fn buffer_len(&self, bth: &bth::Repr, payload_len: usize) -> usize {
        self.udp + udp_len(bth, payload_len)
    }

    /// Writes a whole frame with these headers, `bth`, `ext` and a payload of
    /// `payload_len` bytes that `write_payload` writes in place, deriving the lengths, the
    /// IPv4 checksum and the ICRC. `write_payload` gets the ICRC of the bytes before the
    /// payload and returns it continued over the payload it wrote (so it can hash them
    /// while copying). Fails when `buffer` is too short, the fields are inconsistent
    /// (headers that do not match the opcode, a payload on an opcode without one, a value
    /// too wide for its field), or `write_payload` returns `None`.
    pub fn emit_with(
        &self,
        bth: &bth::Repr,
        ext: &ExtRepr,
        payload_len: usize,
        buffer: &mut [u8],
        write_payload: impl FnOnce(&mut [u8], icrc::Running) -> Option<icrc::Running>,
    ) -> crate::Result<usize> {
        let (ip, udp) = (self.ip, self.udp);
        let info = bth.opcode.info();
        let udp_len = udp_len(bth, payload_len);
        let len = udp + udp_len;
        let has_payload = payload_len != 0 || bth.pad_count != 0;
        // The IPv4 total length, or the IPv6 payload length, must fit its 16-bit field.
        let length_field = if self.is_ipv4 { len - ip } else { udp_len };
        if buffer.len() < len
            || bth.pad_count > 3
            || (has_payload && !info.has_payload)
            || length_field > usize::from(u16::MAX)
        {
            return Err(Error);
        }
        let buffer = &mut buffer[..len];
        buffer[..udp + UDP_HEADER_LEN].copy_from_slice(&self.bytes[..udp + UDP_HEADER_LEN]);
        let length = length_field as u16;
        if self.is_ipv4 {
            let header = &mut buffer[ip..ip + IPV4_HEADER_LEN];
            header[2..4].copy_from_slice(&length.to_be_bytes());
            let checksum = checksum_of_sum(self.ipv4_sum + u32::from(length));
            header[10..12].copy_from_slice(&checksum.to_be_bytes());
        } else {
            buffer[ip + 4..ip + 6].copy_from_slice(&length.to_be_bytes());
        }
        buffer[udp + 4..udp + 6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        let bth_at = udp + UDP_HEADER_LEN;
        bth.emit(&mut bth::Packet::new_unchecked(&mut buffer[bth_at..]));
        let ext_at = bth_at + bth::HEADER_LEN;
        let payload = ext_at + ext.emit(bth.opcode, &mut buffer[ext_at..])?;
        let pad = payload + payload_len;
        let (before, rest) = buffer.split_at_mut(payload);
        let headers = icrc::Running::over(&before[ip..])?;
        let mut running = write_payload(&mut rest[..payload_len], headers).ok_or(Error)?;
        let icrc = len - ICRC_LEN;
        if pad < icrc {
            buffer[pad..icrc].fill(0);
            running = running.update(&buffer[pad..icrc]);
        }
        let value = running.finish();
        buffer[icrc..].copy_from_slice(&icrc::to_bytes(value));
        // The UDP checksum covers the ICRC, and the ICRC ignores the UDP checksum: last.
        if self.udp_checksum {
            let checksum = udp_checksum(buffer, self.is_ipv4, ip, udp).map_err(|_| Error)?;
            buffer[udp + 6..udp + 8].copy_from_slice(&checksum.to_be_bytes());
        }
        Ok(len)
    }
}

impl IpRepr {
    /// Writes this IP header for a UDP datagram of `udp_len` bytes at the start of `buffer`
    /// (with the IPv4 checksum) and returns its length.
    pub fn emit(&self, udp_len: usize, buffer: &mut [u8]) -> crate::Result<usize> {
        let header_len = self.header_len();
        let total = u16::try_from(header_len + udp_len).map_err(|_| Error)?;
        if buffer.len() < header_len {
            return Err(Error);
        }
        match *self {
            IpRepr::V4(v4) => {
                let header = Ipv4Header {
                    dscp: IpDscp::try_new(v4.dscp).map_err(|_| Error)?,
                    ecn: IpEcn::try_new(v4.ecn).map_err(|_| Error)?,
                    total_len: total,
                    identification: v4.identification,
                    dont_fragment: v4.dont_fragment,
                    more_fragments: false,
                    fragment_offset: IpFragOffset::ZERO,
                    time_to_live: v4.ttl,
                    protocol: IpNumber::UDP,
                    header_checksum: 0,
                    source: v4.src.octets(),
                    destination: v4.dst.octets(),
                    options: Ipv4Options::default(),
                };
                let bytes = &mut buffer[..IPV4_HEADER_LEN];
                bytes.copy_from_slice(&header.to_bytes());
                let checksum = ipv4_header_checksum(bytes);
                bytes[10..12].copy_from_slice(&checksum.to_be_bytes());
            }
            IpRepr::V6(v6) => {
                let header = Ipv6Header {
                    traffic_class: v6.traffic_class,
                    flow_label: Ipv6FlowLabel::try_new(v6.flow_label).map_err(|_| Error)?,
                    payload_length: udp_len as u16,
                    next_header: IpNumber::UDP,
                    hop_limit: v6.hop_limit,
                    source: v6.src.octets(),
                    destination: v6.dst.octets(),
                };
                buffer[..IPV6_HEADER_LEN].copy_from_slice(&header.to_bytes());
            }
        }
        Ok(header_len)
    }
}

/// Decodes the Ethernet header of a frame `locate` accepted.
fn parse_ethernet(bytes: &[u8]) -> EthernetRepr {
    let header = Ethernet2HeaderSlice::from_slice(bytes).map(|slice| slice.to_header());
    let header = header.unwrap_or_default();
    let vlan = (header.ether_type == EtherType::VLAN_TAGGED_FRAME)
        .then(|| SingleVlanHeaderSlice::from_slice(&bytes[ETHERNET_HEADER_LEN..]).ok())
        .flatten()
        .map(|tag| VlanTag {
            pcp: tag.priority_code_point().value(),
            dei: tag.drop_eligible_indicator(),
            vid: tag.vlan_identifier().value(),
        });
    EthernetRepr {
        dst: header.destination,
        src: header.source,
        vlan,
    }
}

/// Decodes the IP header of a frame `locate` accepted.
fn parse_ip(header: &[u8]) -> IpRepr {
    if let Ok(v4) = Ipv4HeaderSlice::from_slice(header) {
        IpRepr::V4(Ipv4Repr {
            src: v4.source_addr(),
            dst: v4.destination_addr(),
            dscp: v4.dcp().value(),
            ecn: v4.ecn().value(),
            identification: v4.identification(),
            dont_fragment: v4.dont_fragment(),
            ttl: v4.ttl(),
        })
    } else {
        let v6 = Ipv6HeaderSlice::from_slice(header).map(|slice| slice.to_header());
        let v6 = v6.unwrap_or_default();
        IpRepr::V6(Ipv6Repr {
            src: Ipv6Addr::from(v6.source),
            dst: Ipv6Addr::from(v6.destination),
            traffic_class: v6.traffic_class,
            flow_label: v6.flow_label.value(),
            hop_limit: v6.hop_limit,
        })
    }
}

impl fmt::Display for FrameRepr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dscp = match self.ip {
            IpRepr::V4(v4) => {
                write!(f, "{} -> {}", v4.src, v4.dst)?;
                v4.dscp
            }
            IpRepr::V6(v6) => {
                write!(f, "{} -> {}", v6.src, v6.dst)?;
                v6.traffic_class >> 2
            }
        };
        if dscp != 0 {
            write!(f, " dscp={dscp}")?;
        }
        match self.ip.ecn() {
            ECN_ECT0 => f.write_str(" ecn=ect0")?,
            ECN_ECT1 => f.write_str(" ecn=ect1")?,
            ECN_CE => f.write_str(" ecn=ce")?,
            _ => {}
        }
        write!(f, " sport={} {}", self.udp_src_port, self.bth)?;
        if self.ext != ExtRepr::default() {
            write!(f, " {}", self.ext)?;
        }
        write!(f, " len={}", self.payload.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{aeth, reth};

    /// An RC_ACKNOWLEDGE from rc_pingpong.pcap (rxe, IPv4, no VLAN).
    static ACK_FRAME: [u8; 62] = [
        0x52, 0x54, 0x00, 0x88, 0x00, 0x0c, 0x52, 0x54, 0x00, 0x88, 0x00, 0x0b, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x30, 0x9a, 0xaa, 0x40, 0x00, 0x40, 0x11, 0x8b, 0x4c, 0x0a, 0x58, 0x00, 0x0b,
        0x0a, 0x58, 0x00, 0x0c, 0xc1, 0x21, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00, 0x11, 0x00, 0xff,
        0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x18, 0xd6, 0xbb, 0x1f, 0x00, 0x00, 0x01, 0x37, 0xf0,
        0x53, 0x3c,
    ];

    fn ack_repr() -> FrameRepr<'static> {
        FrameRepr {
            ethernet: EthernetRepr {
                dst: [0x52, 0x54, 0x00, 0x88, 0x00, 0x0c],
                src: [0x52, 0x54, 0x00, 0x88, 0x00, 0x0b],
                vlan: None,
            },
            ip: IpRepr::V4(Ipv4Repr {
                src: Ipv4Addr::new(10, 88, 0, 11),
                dst: Ipv4Addr::new(10, 88, 0, 12),
                dscp: 0,
                ecn: 0,
                identification: 0x9aaa,
                dont_fragment: true,
                ttl: 64,
            }),
            udp_src_port: 0xc121,
            udp_checksum: false,
            bth: bth::Repr {
                opcode: Opcode::RcAcknowledge,
                solicited: false,
                mig_req: false,
                pad_count: 0,
                pkey: 0xffff,
                fecn: false,
                becn: false,
                dest_qpn: 0x11,
                ack_req: false,
                resv7: 0,
                psn: crate::Psn::new(0x18d6bb),
            },
            ext: ExtRepr {
                aeth: Some(aeth::Repr {
                    syndrome: aeth::Syndrome::Ack(aeth::CreditCount::UNLIMITED),
                    msn: 1,
                }),
                ..ExtRepr::default()
            },
            payload: &[],
        }
    }

    fn parse(bytes: &[u8]) -> Result<FrameRepr<'_>, FrameError> {
        FrameRepr::parse(&Frame::new_checked(bytes)?)
    }

    #[test]
    fn parse_captured_ack() {
        assert_eq!(parse(&ACK_FRAME), Ok(ack_repr()));
    }

    #[test]
    fn emit_captured_ack() {
        let mut bytes = [0u8; 62];
        assert_eq!(ack_repr().emit(&mut bytes), Ok(62));
        assert_eq!(bytes, ACK_FRAME);
    }

    /// A payload written in place by the sender gives the frame `emit` gives: same bytes,
    /// same ICRC; a writer that fails fails the emit.
    #[test]
    fn a_payload_written_in_place_makes_the_same_frame() {
        let payload = [0x5A; 13];
        let mut repr = ack_repr();
        repr.bth.opcode = Opcode::RcRdmaWriteOnly;
        repr.bth.pad_count = 3;
        repr.ext = ExtRepr {
            reth: Some(reth::Repr {
                virtual_address: 0x1000,
                rkey: 0x42,
                dma_length: 13,
            }),
            ..ExtRepr::default()
        };
        repr.payload = &payload;
        let mut copied = [0u8; 200];
        let len = repr.emit(&mut copied).unwrap();
        let lent = FrameRepr {
            payload: &[],
            ..repr
        };
        assert_eq!(lent.buffer_len_with(payload.len()), len);
        let mut written = [0xFFu8; 200];
        let written_len = lent.emit_with(payload.len(), &mut written, |out, icrc| {
            out.copy_from_slice(&payload);
            Some(icrc.update(out))
        });
        assert_eq!(written_len, Ok(len));
        assert_eq!(written[..len], copied[..len]);
        assert_eq!(lent.emit_with(13, &mut written, |_, _| None), Err(Error));
    }

    /// Round trip through every layer variant the captures lack: 802.1Q and IPv6, with pad.
    #[test]
    fn vlan_and_ipv6_round_trip() {
        let payload = [0xAB; 13];
        let mut repr = ack_repr();
        repr.ethernet.vlan = Some(VlanTag {
            pcp: 3,
            dei: true,
            vid: 0x123,
        });
        repr.ip = IpRepr::V6(Ipv6Repr {
            src: Ipv6Addr::new(0xfe80, 0, 0, 0, 0x5054, 0xff, 0xfe88, 0x0b),
            dst: Ipv6Addr::new(0xfe80, 0, 0, 0, 0x5054, 0xff, 0xfe88, 0x0c),
            traffic_class: 0x68,
            flow_label: 0xABCDE,
            hop_limit: 1,
        });
        repr.bth.opcode = Opcode::RcRdmaWriteOnly;
        repr.bth.pad_count = 3;
        repr.ext = ExtRepr {
            reth: Some(reth::Repr {
                virtual_address: 0x1000,
                rkey: 0x42,
                dma_length: 13,
            }),
            ..ExtRepr::default()
        };
        repr.payload = &payload;
        let mut bytes = [0u8; 200];
        let len = repr.emit(&mut bytes).unwrap();
        assert_eq!(len, 14 + 4 + 40 + 8 + 12 + 16 + 13 + 3 + 4);
        assert_eq!(parse(&bytes[..len]), Ok(repr));
        // Ethernet padding after the IP packet is not part of it.
        assert_eq!(parse(&bytes[..len + 10]), Ok(repr));
        // IPv6 masked fields: traffic class, flow label, hop limit.
        let ip = 18;
        for offset in [ip, ip + 1, ip + 2, ip + 3, ip + 7] {
            let mut changed = bytes;
            changed[offset] ^= 0x0F;
            assert!(Frame::new_checked(&changed[..len])
                .unwrap()
                .check_icrc()
                .is_ok());
        }
        let mut changed = bytes;
        changed[ip + 8] ^= 1;
        assert!(matches!(
            parse(&changed[..len]),
            Err(FrameError::BadIcrc { .. })
        ));
    }

    /// rxe once computed lengths for an unknown opcode from a zeroed table entry and read out
    /// of bounds (kernel fix 4c6f86d85d03). Here an unknown opcode is refused as soon as the
    /// BTH is present, whatever follows: nothing after the BTH is even there.
    #[test]
    fn unknown_opcode_is_rejected_before_any_length_arithmetic() {
        let bth_end = 14 + 20 + 8 + 12;
        for value in 0..=u8::MAX {
            if Opcode::try_from(value).is_ok() {
                continue;
            }
            let mut bytes = ACK_FRAME;
            bytes[42] = value;
            for end in [bth_end, ACK_FRAME.len()] {
                let mut frame = bytes[..end].to_vec();
                let ip_len = (end - 14) as u16;
                frame[16..18].copy_from_slice(&ip_len.to_be_bytes());
                frame[38..40].copy_from_slice(&(ip_len - 20).to_be_bytes());
                let checksum = Ipv4HeaderSlice::from_slice(&frame[14..34])
                    .unwrap()
                    .to_header()
                    .calc_header_checksum();
                frame[24..26].copy_from_slice(&checksum.to_be_bytes());
                assert_eq!(
                    Frame::new_checked(&frame[..]),
                    Err(FrameError::UnknownOpcode(value))
                );
            }
        }
    }

    #[test]
    fn other_traffic_is_not_roce() {
        let mut other_port = ACK_FRAME;
        other_port[37] = 0xb8;
        assert_eq!(
            Frame::new_checked(&other_port[..]),
            Err(FrameError::NotRoce)
        );
        let mut arp = ACK_FRAME;
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(Frame::new_checked(&arp[..]), Err(FrameError::NotRoce));
        let mut tcp = ACK_FRAME;
        tcp[23] = 6;
        assert_eq!(Frame::new_checked(&tcp[..]), Err(FrameError::NotRoce));
    }

    #[test]
    fn inconsistent_lengths_are_malformed() {
        let mut udp_len = ACK_FRAME;
        udp_len[39] += 4;
        assert!(matches!(
            Frame::new_checked(&udp_len[..]),
            Err(FrameError::Malformed(_))
        ));
        // Each byte of the header, the checksum's own included, is covered by it.
        for at in 14..34 {
            let mut corrupt = ACK_FRAME;
            corrupt[at] ^= 0x10;
            assert_ne!(Frame::new_checked(&corrupt[..]).err(), None, "byte {at}");
        }
        let mut checksum = ACK_FRAME;
        checksum[25] ^= 1;
        assert_eq!(
            Frame::new_checked(&checksum[..]).err(),
            Some(FrameError::Malformed("bad IPv4 header checksum"))
        );
    }

    /// Found by review: an IPv6 payload length too short for the UDP header once made the
    /// UDP length read run past the IP packet.
    #[test]
    fn ipv6_payload_shorter_than_udp_is_malformed() {
        let mut repr = ack_repr();
        repr.ip = IpRepr::V6(Ipv6Repr {
            src: Ipv6Addr::LOCALHOST,
            dst: Ipv6Addr::LOCALHOST,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 1,
        });
        let mut bytes = [0u8; 100];
        let len = repr.emit(&mut bytes).unwrap();
        for (payload_len, udp_len) in [(0u16, 0u16), (0, 28), (4, 4), (7, 7)] {
            let mut frame = bytes[..len].to_vec();
            frame[18..20].copy_from_slice(&payload_len.to_be_bytes());
            frame[58..60].copy_from_slice(&udp_len.to_be_bytes());
            for end in [54 + payload_len as usize, 58, 60, len] {
                assert!(
                    Frame::new_checked(&frame[..end]).is_err(),
                    "{payload_len} {udp_len} {end}"
                );
            }
        }
    }

    /// The fuzzer's reproducers for the same bug, byte for byte.
    #[test]
    fn fuzz_reproducers_are_errors() {
        const REPRODUCERS: [&str; 3] = [
            "02000000000202000000000186dd60000000000011400000000000000000000000000000000000000000000000000000000000000000c00012b7",
            "02000000000202000000000186dd60000000000011400000000000000000000000000000000000000000000000000000000000000000c00012b700000000",
            "02000000000202000000000186dd60000000000611400000000000000000000000000000000000000000000000000000000000000000c00012b70006",
        ];
        for hex in REPRODUCERS {
            let mut bytes = [0u8; 64];
            let len = hex.len() / 2;
            for (i, byte) in bytes.iter_mut().take(len).enumerate() {
                *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
            }
            assert!(Frame::new_checked(&bytes[..len]).is_err(), "{hex}");
        }
    }

    #[test]
    fn a_udp_checksum_when_present_must_be_right() {
        for ip in [ack_repr().ip, ipv6()] {
            let repr = FrameRepr {
                udp_checksum: true,
                ip,
                ..ack_repr()
            };
            let mut bytes = [0u8; 100];
            let len = repr.emit(&mut bytes).unwrap();
            let udp = len - 28;
            assert_ne!(bytes[udp + 6..udp + 8], [0, 0]);
            assert_eq!(parse(&bytes[..len]), Ok(repr));
            bytes[udp + 7] ^= 1;
            assert_eq!(
                parse(&bytes[..len]),
                Err(FrameError::Malformed("bad UDP checksum"))
            );
        }
    }

    /// One flow's headers, emitted once and reused for packets of other opcodes, lengths
    /// and pads, give each the frame a fresh `emit` gives: the lengths, the IPv4 checksum
    /// and the UDP checksum are the packet's, not those of the packet before.
    #[test]
    fn link_headers_reused_make_each_packet_s_own_frame() {
        let send = bth::Repr::new(Opcode::RcSendOnly, 0x11, crate::Psn::new(7));
        let write = ExtRepr {
            reth: Some(reth::Repr {
                virtual_address: 0x1000,
                rkey: 0x42,
                dma_length: 13,
            }),
            ..ExtRepr::default()
        };
        let padded = bth::Repr {
            pad_count: 3,
            ..bth::Repr::new(Opcode::RcRdmaWriteOnly, 0x11, crate::Psn::new(8))
        };
        let payload = [0xA5u8; 1000];
        let packets: [(bth::Repr, ExtRepr, &[u8]); 4] = [
            (send, ExtRepr::default(), &payload[..]),
            (ack_repr().bth, ack_repr().ext, &[]),
            (padded, write, &payload[..13]),
            (send, ExtRepr::default(), &payload[..64]),
        ];
        let flows = [
            ack_repr(),
            FrameRepr {
                udp_checksum: true,
                ..ack_repr()
            },
            FrameRepr {
                ethernet: EthernetRepr {
                    vlan: Some(VlanTag {
                        pcp: 3,
                        dei: false,
                        vid: 100,
                    }),
                    ..ack_repr().ethernet
                },
                ip: ipv6(),
                ..ack_repr()
            },
        ];
        for flow in flows {
            let headers = LinkHeaders::new(&flow).unwrap();
            for (bth, ext, payload) in packets {
                let fresh = FrameRepr {
                    bth,
                    ext,
                    payload,
                    ..flow
                };
                let mut want = [0; 1200];
                let want_len = fresh.emit(&mut want).unwrap();
                let want = &want[..want_len];
                let mut got = [0xEE; 1200];
                let got = &mut got[..headers.buffer_len(&bth, payload.len())];
                let written = headers.emit_with(&bth, &ext, payload.len(), got, |out, icrc| {
                    out.copy_from_slice(payload);
                    Some(icrc.update(out))
                });
                assert_eq!(written, Ok(want.len()));
                assert_eq!(got, want, "{flow:?} {bth:?}");
                assert_eq!(parse(got).map(|p| p.payload), Ok(payload));
            }
            assert_eq!(headers.ethernet_dst(), flow.ethernet.dst);
            assert_eq!(headers.udp_src_port(), flow.udp_src_port);
        }
    }

    fn ipv6() -> IpRepr {
        IpRepr::V6(Ipv6Repr {
            src: Ipv6Addr::LOCALHOST,
            dst: Ipv6Addr::LOCALHOST,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 1,
        })
    }

    /// Found by review: the length limit applied to the whole Ethernet frame, not to the IP
    /// length fields.
    #[test]
    fn largest_datagrams_emit() {
        let payload = [7u8; 65_535 - 20 - 8 - 12 - 4];
        let repr = FrameRepr {
            payload: &payload,
            ..ack_repr()
        };
        let mut repr = repr;
        repr.bth.opcode = Opcode::RcSendOnly;
        repr.ext = ExtRepr::default();
        let mut bytes = [0u8; 70_000];
        let len = repr.emit(&mut bytes).unwrap();
        assert_eq!(len, 14 + 65_535);
        assert_eq!(parse(&bytes[..len]), Ok(repr));
        let too_long = [7u8; 65_535 - 20 - 8 - 12];
        assert_eq!(
            FrameRepr {
                payload: &too_long,
                ..repr
            }
            .emit(&mut bytes),
            Err(Error)
        );
    }

    #[test]
    fn emit_refuses_inconsistent_reprs() {
        let mut bytes = [0u8; 200];
        let mut payload_on_ack = ack_repr();
        payload_on_ack.payload = &[1, 2, 3, 4];
        assert_eq!(payload_on_ack.emit(&mut bytes), Err(Error));
        let mut missing_aeth = ack_repr();
        missing_aeth.ext = ExtRepr::default();
        assert_eq!(missing_aeth.emit(&mut bytes), Err(Error));
        assert_eq!(ack_repr().emit(&mut bytes[..61]), Err(Error));
    }

    /// A switch's CE mark: the ECN field changes, the IPv4 checksum follows, the ICRC
    /// (which does not cover the field) still holds; frames that are not ECN-capable stay
    /// as they are.
    #[test]
    fn marking_congestion_experienced() {
        extern crate std;
        use std::string::ToString;
        let v6 = IpRepr::V6(Ipv6Repr {
            src: Ipv6Addr::LOCALHOST,
            dst: Ipv6Addr::UNSPECIFIED,
            traffic_class: (26 << 2) | ECN_ECT0,
            flow_label: 0x12345,
            hop_limit: 64,
        });
        let mut v4 = ack_repr();
        if let IpRepr::V4(ip) = &mut v4.ip {
            ip.dscp = 26;
            ip.ecn = ECN_ECT0;
        }
        for repr in [
            v4,
            FrameRepr {
                ip: v6,
                ..ack_repr()
            },
        ] {
            let mut bytes = [0u8; 100];
            let len = repr.emit(&mut bytes).unwrap();
            let mut frame = Frame::new_checked(&mut bytes[..len]).unwrap();
            assert_eq!(frame.ecn(), ECN_ECT0);
            assert!(frame.mark_congestion_experienced());
            assert!(!frame.mark_congestion_experienced(), "already CE");
            let marked = parse(&bytes[..len]).expect("checksum and ICRC still hold");
            assert_eq!(marked.ip.ecn(), ECN_CE);
            let dscp = match marked.ip {
                IpRepr::V4(v4) => v4.dscp,
                IpRepr::V6(v6) => v6.traffic_class >> 2,
            };
            assert_eq!(dscp, 26, "the DSCP is left alone");
            assert_eq!(marked.bth, repr.bth);
            assert!(marked.to_string().contains(" dscp=26 ecn=ce "), "{marked}");
        }
        let mut bytes = [0u8; 100];
        let len = ack_repr().emit(&mut bytes).unwrap();
        let before = bytes;
        let mut frame = Frame::new_checked(&mut bytes[..len]).unwrap();
        assert_eq!(frame.ecn(), ECN_NOT_ECT);
        assert!(!frame.mark_congestion_experienced());
        assert_eq!(bytes, before);
        assert!(!parse(&bytes[..len]).unwrap().to_string().contains("ecn="));
    }

    /// A CNP as the RoCEv2 annex defines it: opcode 0x81, BECN, 16 zero bytes, the ICRC.
    #[test]
    fn cnp_round_trip() {
        let mut repr = ack_repr();
        repr.bth = bth::Repr::new(Opcode::Cnp, 0x12, crate::Psn::new(0));
        repr.bth.becn = true;
        repr.ext = ExtRepr {
            cnp: Some(crate::cnp::Repr),
            ..ExtRepr::default()
        };
        let mut bytes = [0xAAu8; 100];
        let len = repr.emit(&mut bytes).unwrap();
        assert_eq!(len, 14 + 20 + 8 + 12 + 16 + 4);
        let bth_at = 14 + 20 + 8;
        assert_eq!(bytes[bth_at], 0x81);
        assert_eq!(bytes[bth_at + 4], 0x40, "BECN, nothing else");
        assert_eq!(&bytes[bth_at + 12..bth_at + 28], &[0; 16]);
        assert_eq!(parse(&bytes[..len]), Ok(repr));
    }
}
