//! roce-wire against real rxe traffic: every captured RoCEv2 frame parses, verifies, and is
//! reproduced byte for byte; corruption and truncation are caught.

use std::collections::{BTreeMap, BTreeSet};

use roce_tests::{capture_files, expected_counts, read_frames};
use roce_wire::{icrc, Frame, FrameError, FrameRepr};

/// A file name and the RoCEv2 frames in it.
fn roce_frames() -> Vec<(String, Vec<Vec<u8>>)> {
    capture_files()
        .iter()
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let frames = read_frames(path)
                .into_iter()
                .filter(|frame| Frame::new_checked(&frame[..]) != Err(FrameError::NotRoce))
                .collect();
            (name, frames)
        })
        .collect()
}

/// Offsets inside `frame` that the ICRC covers without masking.
fn covered_offsets(frame: &[u8]) -> Vec<usize> {
    let checked = Frame::new_checked(frame).unwrap();
    let ip_start = frame.len() - checked.ip_packet().len();
    let masked = [ip_start + 1, ip_start + 8, ip_start + 10, ip_start + 11]
        .into_iter()
        .chain([ip_start + 26, ip_start + 27, ip_start + 32]);
    let masked: BTreeSet<usize> = masked.collect();
    (ip_start..frame.len() - icrc::ICRC_LEN)
        .filter(|offset| !masked.contains(offset))
        .collect()
}

/// One frame per distinct (opcode, length) in each capture: every shape the captures hold.
fn distinct_shapes(frames: &[Vec<u8>]) -> Vec<&Vec<u8>> {
    let mut seen = BTreeSet::new();
    frames
        .iter()
        .filter(|frame| {
            let opcode = Frame::new_checked(&frame[..]).map(|f| f.opcode());
            seen.insert((opcode.ok(), frame.len()))
        })
        .collect()
}

#[test]
fn every_frame_parses_verifies_and_matches_the_readme_counts() {
    let expected = expected_counts();
    let captures = roce_frames();
    assert_eq!(
        captures.len(),
        expected.len(),
        "a pcap is missing from the README or folder"
    );
    for (name, frames) in &captures {
        let mut counts = BTreeMap::new();
        for (index, frame) in frames.iter().enumerate() {
            let checked = Frame::new_checked(&frame[..])
                .unwrap_or_else(|e| panic!("{name} frame {index}: {e}"));
            let repr =
                FrameRepr::parse(&checked).unwrap_or_else(|e| panic!("{name} frame {index}: {e}"));
            *counts.entry(repr.bth.opcode as u8).or_insert(0) += 1;
        }
        let want = &expected[name];
        assert_eq!(counts, want.counts, "{name}: opcode counts");
        for (value, readme_name) in &want.names {
            let opcode = roce_wire::Opcode::try_from(*value).unwrap();
            assert_eq!(opcode.name(), readme_name, "{name}: name of opcode {value}");
        }
    }
}

#[test]
fn parse_then_emit_reproduces_every_frame_byte_for_byte() {
    let mut total = 0;
    for (name, frames) in roce_frames() {
        let mut out = vec![0u8; 10_000];
        for (index, frame) in frames.iter().enumerate() {
            let checked = Frame::new_checked(&frame[..]).unwrap();
            let repr = FrameRepr::parse(&checked).unwrap();
            assert_eq!(repr.buffer_len(), frame.len(), "{name} frame {index}");
            let written = repr.emit(&mut out).unwrap();
            assert_eq!(&out[..written], &frame[..], "{name} frame {index}");
            total += 1;
        }
    }
    let promised: usize = expected_counts()
        .values()
        .flat_map(|e| e.counts.values())
        .sum();
    assert_eq!(total, promised);
}

#[test]
fn flipping_any_covered_byte_fails_verification() {
    for (name, frames) in roce_frames() {
        for frame in distinct_shapes(&frames) {
            for offset in covered_offsets(frame) {
                for flip in [0x01, 0x80, 0xFF] {
                    let mut bad = frame.clone();
                    bad[offset] ^= flip;
                    let verdict = Frame::new_checked(&bad[..])
                        .and_then(|checked| FrameRepr::parse(&checked).map(|_| ()));
                    assert!(
                        verdict.is_err(),
                        "{name}: flip {flip:#x} at {offset} accepted"
                    );
                }
            }
        }
    }
}

#[test]
fn flipping_a_masked_field_keeps_the_icrc() {
    for (name, frames) in roce_frames() {
        for frame in distinct_shapes(&frames) {
            let checked = Frame::new_checked(&frame[..]).unwrap();
            let ip_packet = checked.ip_packet();
            let (covered, trailer) = ip_packet.split_at(ip_packet.len() - icrc::ICRC_LEN);
            let received = icrc::read(trailer.try_into().unwrap());
            // IPv4 TOS, TTL, header checksum; UDP checksum; BTH FECN/BECN/reserved byte.
            for offset in [1, 8, 10, 11, 26, 27, 32] {
                let mut changed = covered.to_vec();
                changed[offset] ^= 0xFF;
                assert_eq!(
                    icrc::compute(&changed),
                    Ok(received),
                    "{name}: offset {offset}"
                );
            }
        }
    }
}

#[test]
fn truncating_at_every_offset_is_an_error_not_a_panic() {
    for (name, frames) in roce_frames() {
        for frame in distinct_shapes(&frames) {
            for len in 0..frame.len() {
                let verdict = Frame::new_checked(&frame[..len])
                    .and_then(|checked| FrameRepr::parse(&checked).map(|_| ()));
                assert!(verdict.is_err(), "{name}: truncated to {len} accepted");
            }
        }
    }
}

/// A kernel UDP socket hides the IP header, and rxe's frames carry non-zero identifications
/// the ICRC covers: the solver must recover exactly the identification and DF flag of every
/// captured frame from the datagram alone, and find none once the datagram is damaged.
#[test]
fn ip_identification_is_recovered_from_the_icrc() {
    let mut checked = 0;
    for (name, frames) in roce_frames() {
        for frame in &frames {
            let checked_frame = Frame::new_checked(&frame[..]).unwrap();
            let ip_packet = checked_frame.ip_packet();
            let (covered, trailer) = ip_packet.split_at(ip_packet.len() - icrc::ICRC_LEN);
            let received = icrc::read(trailer.try_into().unwrap());
            let id = u16::from_be_bytes([covered[4], covered[5]]);
            let df = covered[6] & 0x40 != 0;
            let mut unknown = covered.to_vec();
            unknown[4..6].fill(0);
            unknown[6] &= !0x40;
            let solved = icrc::solve_ipv4_identification(&unknown, received);
            assert_eq!(solved, Some((id, df)), "{name}: id {id:#06x}");
            let last = unknown.len() - 1;
            unknown[last] ^= 0x04;
            assert_eq!(
                icrc::solve_ipv4_identification(&unknown, received),
                None,
                "{name}"
            );
            checked += 1;
        }
    }
    assert!(checked > 7000);
}
