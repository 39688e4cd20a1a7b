//! The invariant CRC that ends every RoCEv2 packet.
//!
//! CRC-32 (the Ethernet polynomial, reflected, complemented) over eight 0xFF bytes standing in
//! for the InfiniBand LRH, then the IP header, UDP header, BTH, extension headers and payload,
//! with every field a router may change masked to ones: IPv4 TOS, TTL and header checksum
//! (IPv6 traffic class, flow label and hop limit), the UDP checksum, and BTH byte 4 (FECN,
//! BECN, reserved). It is sent least significant byte first.

use crate::{bth, Error, Result};

/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// CRC-32 of the eight 0xFF bytes that stand in for the LRH (the kernel's starting register
/// 0xDEBB20E3 is its complement). Starting from it saves hashing them for every packet.
const LRH_PLACEHOLDER_CRC: u32 = 0x2144_DF1C;

const UDP_HEADER_LEN: usize = 8;
const UDP_CHECKSUM: usize = 6;
const IPV4_TOS: usize = 1;
const IPV4_TTL: usize = 8;
const IPV4_CHECKSUM: core::ops::Range<usize> = 10..12;
const IPV6_HEADER_LEN: usize = 40;
const IPV6_HOP_LIMIT: usize = 7;
const MAX_IPV4_HEADER_LEN: usize = 60;
/// The longest masked prefix: IPv4 with options, UDP, BTH.
const MAX_MASKED_LEN: usize = MAX_IPV4_HEADER_LEN + UDP_HEADER_LEN + bth::HEADER_LEN;
/// Room for the masked prefix and the longest run of extension headers after it.
const HEAD_COPY_LEN: usize = MAX_MASKED_LEN + 64;

/// Computes the ICRC of `ip_packet`: the bytes from the first byte of the IP header up to,
/// not including, the ICRC. Fails when the bytes cannot hold an IP, UDP and BTH header.
pub fn compute(ip_packet: &[u8]) -> Result<u32> {
    Running::over(ip_packet).map(Running::finish)
}

/// The ICRC of a frame's first covered bytes, to be continued over the rest: a sender
/// starts it over the headers and continues it over the payload in the loop that copies
/// the payload into the frame (rather than reading the frame's freshly written lines back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Running(u32);

impl Running {
    /// Over `ip_packet`, the covered bytes from the first byte of the IP header on, as many
    /// as are written so far (at least the IP, UDP and BTH headers, masked as the ICRC
    /// masks them). Fails when the bytes cannot hold those headers.
    pub fn over(ip_packet: &[u8]) -> Result<Self> {
        let (is_ipv6, ip_header_len) = match ip_packet.first().map(|byte| byte >> 4) {
            Some(4) => (false, usize::from(ip_packet[0] & 0x0F) * 4),
            Some(6) => (true, IPV6_HEADER_LEN),
            _ => return Err(Error),
        };
        let masked_len = ip_header_len + UDP_HEADER_LEN + bth::HEADER_LEN;
        if ip_header_len < 20 || ip_packet.len() < masked_len {
            return Err(Error);
        }
        // The masked copy takes the extension headers after the BTH too when they fit: one
        // CRC call for all of a sender's headers.
        let mut copy = [0u8; HEAD_COPY_LEN];
        let copied = if ip_packet.len() <= HEAD_COPY_LEN {
            ip_packet.len()
        } else {
            masked_len
        };
        let head = &mut copy[..copied];
        head.copy_from_slice(&ip_packet[..copied]);
        if is_ipv6 {
            head[0] |= 0x0F;
            head[1..4].fill(0xFF);
            head[IPV6_HOP_LIMIT] = 0xFF;
        } else {
            head[IPV4_TOS] = 0xFF;
            head[IPV4_TTL] = 0xFF;
            head[IPV4_CHECKSUM].fill(0xFF);
        }
        let udp = ip_header_len;
        head[udp + UDP_CHECKSUM..udp + UDP_CHECKSUM + 2].fill(0xFF);
        head[udp + UDP_HEADER_LEN + bth::ICRC_MASKED_BYTE] = 0xFF;

        let mut hasher = crc32fast::Hasher::new_with_initial(LRH_PLACEHOLDER_CRC);
        hasher.update(head);
        if copied < ip_packet.len() {
            hasher.update(&ip_packet[copied..]);
        }
        Ok(Running(hasher.finalize()))
    }

    /// Continued over the next covered `bytes`.
    #[must_use]
    pub fn update(self, bytes: &[u8]) -> Self {
        let mut hasher = crc32fast::Hasher::new_with_initial(self.0);
        hasher.update(bytes);
        Running(hasher.finalize())
    }

    /// The CRC-32 of the covered bytes so far (behind the LRH placeholder, masked): a
    /// standard CRC-32 value, which any CRC-32 implementation can continue (see
    /// [`from_crc32`](Self::from_crc32)).
    pub fn crc32(self) -> u32 {
        self.0
    }

    /// Resumes from a [`crc32`](Self::crc32) value continued over more covered bytes.
    pub fn from_crc32(crc32: u32) -> Self {
        Running(crc32)
    }

    /// The ICRC of the bytes covered: all of them, from the IP header to the pad.
    pub fn finish(self) -> u32 {
        self.0
    }
}

/// The IPv4 identification and DF flag a frame's ICRC was computed with, for a receiver that
/// sees the datagram but not its IP header (a kernel UDP socket). `ip_packet` holds the
/// covered bytes (IP header to payload end, no ICRC) with identification 0 and DF clear.
///
/// The ICRC covers those 17 bits, and CRC-32 is affine: flipping header bits changes the
/// ICRC by a linear function of them, and the 17 columns of that function are independent.
/// So the bits are the unique solution, if one exists, of 32 linear equations over GF(2).
/// A frame damaged in transit has a solution only with probability 2^-15, so this still
/// checks 15 of the ICRC's 32 bits. Costs a few microseconds (a 32×32 GF(2) matrix power).
pub fn solve_ipv4_identification(ip_packet: &[u8], received: u32) -> Option<(u16, bool)> {
    const ID_AND_FLAGS: usize = 4; // identification (2 bytes), then flags and fragment offset
    const DF: u8 = 0x40;
    let zero_id = compute(ip_packet).ok()?;
    if ip_packet[ID_AND_FLAGS..ID_AND_FLAGS + 2] != [0, 0] || ip_packet[6] & DF != 0 {
        return None;
    }
    // Each unknown bit, as the change it makes to the CRC register over the rest of the packet.
    let after = ip_packet.len() - (ID_AND_FLAGS + 3);
    let advance = zero_bytes_operator(after);
    let mut columns = [0u32; 17];
    for (bit, column) in columns.iter_mut().enumerate() {
        let mut pattern = [0u8; 3];
        if bit < 16 {
            // Bit `bit` of the big-endian identification.
            pattern[1 - bit / 8] = 1 << (bit % 8);
        } else {
            pattern[2] = DF;
        }
        *column = gf2_times(&advance, raw_crc(0, &pattern));
    }
    let solution = solve(&columns, zero_id ^ received)?;
    Some(((solution & 0xFFFF) as u16, solution & 0x1_0000 != 0))
}

/// The reflected CRC-32 polynomial.
const POLYNOMIAL: u32 = 0xEDB8_8320;

/// The CRC register after `bytes`, from `register`, without complementing: the linear part.
fn raw_crc(mut register: u32, bytes: &[u8]) -> u32 {
    for &byte in bytes {
        register ^= u32::from(byte);
        for _ in 0..8 {
            register = (register >> 1) ^ if register & 1 != 0 { POLYNOMIAL } else { 0 };
        }
    }
    register
}

/// `matrix` (one column per register bit) applied to `vector`.
fn gf2_times(matrix: &[u32; 32], vector: u32) -> u32 {
    (0..32)
        .filter(|bit| vector >> bit & 1 != 0)
        .fold(0, |sum, bit| sum ^ matrix[bit])
}

/// The operator that feeds `count` zero bytes through the CRC register.
fn zero_bytes_operator(mut count: usize) -> [u32; 32] {
    let mut power: [u32; 32] = core::array::from_fn(|bit| raw_crc(1 << bit, &[0]));
    let mut result: [u32; 32] = core::array::from_fn(|bit| 1 << bit);
    while count > 0 {
        if count & 1 != 0 {
            result = core::array::from_fn(|bit| gf2_times(&power, result[bit]));
        }
        power = core::array::from_fn(|bit| gf2_times(&power, power[bit]));
        count >>= 1;
    }
    result
}

/// The bits `x` with XOR of `columns[i]` over set bits `i` equal to `target`, if any.
fn solve(columns: &[u32; 17], target: u32) -> Option<u32> {
    // Gaussian elimination into (pivot vector, which unknowns make it) pairs.
    let mut basis: [(u32, u32); 17] = [(0, 0); 17];
    let mut rank = 0;
    for (unknown, &column) in columns.iter().enumerate() {
        let (mut vector, mut made_of) = (column, 1u32 << unknown);
        for &(pivot, pivot_made_of) in &basis[..rank] {
            if vector ^ pivot < vector {
                vector ^= pivot;
                made_of ^= pivot_made_of;
            }
        }
        if vector == 0 {
            return None; // dependent columns: the bits are not recoverable
        }
        basis[rank] = (vector, made_of);
        rank += 1;
        basis[..rank].sort_unstable_by_key(|&(pivot, _)| core::cmp::Reverse(pivot));
    }
    let (mut rest, mut solution) = (target, 0);
    for &(pivot, made_of) in &basis[..rank] {
        if rest ^ pivot < rest {
            rest ^= pivot;
            solution ^= made_of;
        }
    }
    (rest == 0).then_some(solution)
}

/// Reads an ICRC trailer as sent on the wire.
pub fn read(trailer: [u8; ICRC_LEN]) -> u32 {
    u32::from_le_bytes(trailer)
}

/// The wire bytes of an ICRC.
pub fn to_bytes(icrc: u32) -> [u8; ICRC_LEN] {
    icrc.to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An RC_ACKNOWLEDGE from rc_pingpong.pcap, from the IPv4 header to the ICRC.
    static ACK_IP_PACKET: [u8; 48] = [
        0x45, 0x00, 0x00, 0x30, 0x9a, 0xaa, 0x40, 0x00, 0x40, 0x11, 0x8b, 0x4c, 0x0a, 0x58, 0x00,
        0x0b, 0x0a, 0x58, 0x00, 0x0c, 0xc1, 0x21, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00, 0x11, 0x00,
        0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x18, 0xd6, 0xbb, 0x1f, 0x00, 0x00, 0x01, 0x37,
        0xf0, 0x53, 0x3c,
    ];

    #[test]
    fn matches_a_captured_rxe_ack() {
        let (covered, trailer) = ACK_IP_PACKET.split_at(44);
        assert_eq!(compute(covered), Ok(read(trailer.try_into().unwrap())));
    }

    #[test]
    fn placeholder_crc_is_the_crc_of_eight_ff_bytes() {
        assert_eq!(crc32fast::hash(&[0xFF; 8]), LRH_PLACEHOLDER_CRC);
        assert_eq!(!LRH_PLACEHOLDER_CRC, 0xDEBB_20E3);
    }

    #[test]
    fn masked_fields_do_not_matter() {
        let covered = &ACK_IP_PACKET[..44];
        let expected = compute(covered).unwrap();
        for offset in [1, 8, 10, 11, 26, 27, 32] {
            let mut changed = *covered.first_chunk::<44>().unwrap();
            changed[offset] ^= 0x5A;
            assert_eq!(compute(&changed), Ok(expected), "offset {offset}");
        }
    }

    #[test]
    fn identification_of_a_captured_ack_is_recovered() {
        let (covered, trailer) = ACK_IP_PACKET.split_at(44);
        let received = read(trailer.try_into().unwrap());
        let mut unknown = *covered.first_chunk::<44>().unwrap();
        unknown[4..6].fill(0);
        unknown[6] &= !0x40;
        assert_eq!(
            solve_ipv4_identification(&unknown, received),
            Some((0x9aaa, true))
        );
        assert_eq!(solve_ipv4_identification(&unknown, received ^ 1), None);
        assert_eq!(
            solve_ipv4_identification(covered, received),
            None,
            "identification not zeroed"
        );
    }

    /// Continuing over the rest gives the ICRC of the whole, wherever it is split, also
    /// through a CRC-32 computed elsewhere.
    #[test]
    fn a_running_icrc_continues_to_the_whole() {
        let covered = &ACK_IP_PACKET[..44];
        let whole = compute(covered).unwrap();
        for split in 40..=44 {
            let (head, rest) = covered.split_at(split);
            let running = Running::over(head).unwrap();
            assert_eq!(running.update(rest).finish(), whole, "split at {split}");
            let elsewhere = {
                let mut hasher = crc32fast::Hasher::new_with_initial(running.crc32());
                hasher.update(rest);
                hasher.finalize()
            };
            assert_eq!(Running::from_crc32(elsewhere).finish(), whole);
        }
        assert_eq!(
            Running::over(&covered[..39]),
            Err(Error),
            "headers cut short"
        );
    }

    #[test]
    fn too_short_or_not_ip_is_an_error() {
        assert_eq!(compute(&ACK_IP_PACKET[..39]), Err(Error));
        assert_eq!(compute(&[]), Err(Error));
        let mut not_ip = ACK_IP_PACKET;
        not_ip[0] = 0x55;
        assert_eq!(compute(&not_ip), Err(Error));
    }
}
