//! Proves accepted frames re-emit to the same `FrameRepr` and bytes, bar derived or reserved bits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roce_wire::frame::IpRepr;
use roce_wire::{bth, Frame, FrameRepr};
use roce_wire_fuzz::{assert_same_bits, ext_reserved, BTH_RESERVED};

fuzz_target!(|data: &[u8]| {
    let Ok(frame) = Frame::new_checked(data) else {
        return;
    };
    let Ok(repr) = FrameRepr::parse(&frame) else {
        return;
    };
    let len = repr.buffer_len();
    // Not zero-filled, so that a byte emit forgets to write shows up below.
    let mut out = vec![0xA5; len];
    assert_eq!(repr.emit(&mut out), Ok(len), "emit refused {repr}");
    let emitted = Frame::new_checked(&out[..]).expect("emitted frame rejected");
    assert_eq!(emitted.check_icrc(), Ok(()));
    assert_eq!(FrameRepr::parse(&emitted), Ok(repr));
    let ip = if repr.ethernet.vlan.is_some() { 18 } else { 14 };
    if let IpRepr::V4(_) = repr.ip {
        assert_eq!(
            ones_complement_sum(&out[ip..ip + 20]),
            0xFFFF,
            "IPv4 checksum"
        );
    }
    assert_same_bits(data, &out, &ignored_bits(&repr, ip, len));
});

/// Bits emit may change: the IPv4 checksum and ICRC (both checked above), the UDP checksum
/// (recomputed when present; not verified under `cfg(fuzzing)`), reserved bits and pad bytes. Ethernet padding after the IP packet lies beyond `buffer_len`.
fn ignored_bits(repr: &FrameRepr, ip: usize, len: usize) -> Vec<u8> {
    let mut mask = vec![0; len];
    let udp = match repr.ip {
        IpRepr::V4(_) => {
            mask[ip + 10..ip + 12].fill(0xFF);
            ip + 20
        }
        IpRepr::V6(_) => ip + 40,
    };
    mask[udp + 6..udp + 8].fill(0xFF);
    let bth = udp + 8;
    mask[bth..bth + bth::HEADER_LEN].copy_from_slice(&BTH_RESERVED);
    let mut at = bth + bth::HEADER_LEN;
    for &header in repr.bth.opcode.info().headers {
        mask[at..at + header.wire_len()].copy_from_slice(ext_reserved(header));
        at += header.wire_len();
    }
    mask[at + repr.payload.len()..].fill(0xFF);
    mask
}

/// The ones' complement sum of 16-bit words: 0xFFFF over a header with a valid checksum.
fn ones_complement_sum(header: &[u8]) -> u32 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|pair| u32::from(u16::from_be_bytes([pair[0], pair[1]])))
        .sum();
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    sum
}
