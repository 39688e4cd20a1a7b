//! Seeded fault injection on any backend: lose, reorder, duplicate and corrupt sent frames.

use std::io;
use std::ops::Range;
use std::time::Duration;

use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};
use roce_transport::sim::{chance, LinkConfig};
use roce_wire::frame::IpRepr;
use roce_wire::{Frame, FrameRepr};

use crate::backend::{Backend, Fill, MAX_FRAME};

/// Wraps a backend and damages what it sends, with the simulator's fault model
/// ([`LinkConfig`]'s probabilities; its latency is not used). A reordered frame is held back
/// and sent after the next one (or before the next wait). A frame left alone goes straight
/// into the inner backend's buffer; one to damage, copy or hold is written here first.
pub struct FaultInjector<B> {
    inner: B,
    faults: LinkConfig,
    rng: ChaCha8Rng,
    /// A frame held back to go after the next one, and its flow.
    held: Option<(Vec<u8>, u16)>,
    /// Where a frame to damage, copy or hold is written.
    scratch: Vec<u8>,
    /// What has been done so far.
    pub stats: FaultStats,
}

/// Counts of injected faults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Frames passed to `transmit`.
    pub frames: u64,
    /// Frames dropped.
    pub lost: u64,
    /// Frames held back behind a later one.
    pub reordered: u64,
    /// Frames sent twice.
    pub duplicated: u64,
    /// Frames with a bit flipped.
    pub corrupted: u64,
}

impl<B: Backend> FaultInjector<B> {
    /// Injects `faults` into what `inner` sends, every choice drawn from `seed`.
    pub fn new(inner: B, faults: LinkConfig, seed: u64) -> Self {
        FaultInjector {
            inner,
            faults,
            rng: ChaCha8Rng::seed_from_u64(seed),
            held: None,
            scratch: vec![0; MAX_FRAME],
            stats: FaultStats::default(),
        }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    fn release_held(&mut self) -> io::Result<()> {
        match self.held.take() {
            Some((frame, flow)) => send_copy(&mut self.inner, &frame, flow),
            None => Ok(()),
        }
    }
}

/// Sends a copy of `frame` through `inner`.
fn send_copy(inner: &mut impl Backend, frame: &[u8], flow: u16) -> io::Result<()> {
    inner.transmit(frame.len(), flow, &mut |buffer| {
        buffer.copy_from_slice(frame);
        frame.len()
    })
}

impl<B: Backend> Backend for FaultInjector<B> {
    fn receive(&mut self, budget: usize, handler: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        self.inner.receive(budget, handler)
    }

    fn transmit(&mut self, len: usize, flow: u16, fill: Fill<'_>) -> io::Result<()> {
        self.stats.frames += 1;
        if chance(&mut self.rng, self.faults.loss) {
            self.stats.lost += 1;
            return self.release_held();
        }
        let corrupt = chance(&mut self.rng, self.faults.corrupt);
        let duplicate = chance(&mut self.rng, self.faults.duplicate);
        let reorder = self.held.is_none() && chance(&mut self.rng, self.faults.reorder);
        if !(corrupt || duplicate || reorder) {
            self.inner.transmit(len, flow, fill)?;
            return self.release_held();
        }
        let len = len.min(self.scratch.len());
        let written = fill(&mut self.scratch[..len]).min(len);
        let frame = &mut self.scratch[..written];
        if corrupt {
            self.stats.corrupted += 1;
            flip_covered_bit(frame, &mut self.rng);
        }
        let copies = if duplicate {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        if reorder {
            self.stats.reordered += 1;
            self.held = Some((frame.to_vec(), flow));
            return if copies == 2 {
                send_copy(&mut self.inner, frame, flow)
            } else {
                Ok(())
            };
        }
        for _ in 0..copies {
            send_copy(&mut self.inner, frame, flow)?;
        }
        self.release_held()
    }

    fn submit(&mut self) -> io::Result<()> {
        self.inner.submit()
    }

    fn loops_back(&self) -> bool {
        self.inner.loops_back()
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        // A held frame must not wait for traffic that may never come.
        self.release_held()?;
        self.inner.submit()?;
        self.inner.wait(timeout)
    }
}

/// Flips one bit the receiver must notice: in a RoCEv2 frame (found by parsing it, so any
/// VLAN tag and either IP version), a bit the ICRC covers and does not mask (the masked IP
/// fields, UDP checksum and BTH byte 4 may change on the way and still verify); in any other
/// frame, a bit past the Ethernet header.
fn flip_covered_bit(frame: &mut [u8], rng: &mut impl Rng) {
    let (covered, masked) = layout(frame);
    let unmasked = covered.len() - masked.iter().map(Range::len).sum::<usize>();
    if unmasked == 0 {
        return;
    }
    // Draw among the unmasked bytes, then step over the masked ones before the draw.
    let mut offset = covered.start + (rng.next_u64() % unmasked as u64) as usize;
    for range in masked.iter().filter(|range| !range.is_empty()) {
        if range.start <= offset {
            offset += range.len();
        }
    }
    frame[offset] ^= 1 << (rng.next_u32() % 8);
}

/// The bytes a receiver checks, and the masked ranges inside them (ascending, disjoint).
fn layout(frame: &[u8]) -> (Range<usize>, [Range<usize>; 5]) {
    const ETHERNET: usize = 14;
    let none = || [0..0, 0..0, 0..0, 0..0, 0..0];
    let Ok(checked) = Frame::new_checked(frame) else {
        return (ETHERNET.min(frame.len())..frame.len(), none());
    };
    let Ok(repr) = FrameRepr::parse_ignoring_icrc(&checked) else {
        return (ETHERNET.min(frame.len())..frame.len(), none());
    };
    let ip = ETHERNET + if repr.ethernet.vlan.is_some() { 4 } else { 0 };
    let udp = ip + repr.ip.header_len();
    let (udp_checksum, bth_byte_4) = (udp + 6..udp + 8, udp + 12..udp + 13);
    let masked = match repr.ip {
        IpRepr::V4(_) => [
            ip + 1..ip + 2,
            ip + 8..ip + 9,
            ip + 10..ip + 12,
            udp_checksum,
            bth_byte_4,
        ],
        IpRepr::V6(_) => [ip..ip + 4, ip + 7..ip + 8, udp_checksum, bth_byte_4, 0..0],
    };
    (ip..ip + checked.ip_packet().len(), masked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::memory_pair;

    fn received(backend: &mut impl Backend) -> Vec<Vec<u8>> {
        let mut frames = Vec::new();
        let mut buffer = [0u8; 256];
        while let Some(len) = backend.recv(&mut buffer).unwrap() {
            frames.push(buffer[..len].to_vec());
        }
        frames
    }

    fn frame(tag: u8) -> Vec<u8> {
        vec![tag; 100]
    }

    #[test]
    fn clean_config_changes_nothing() {
        let (a, mut b) = memory_pair();
        let mut faulty = FaultInjector::new(a, LinkConfig::default(), 1);
        for tag in 0..50 {
            faulty.send(&frame(tag)).unwrap();
        }
        assert_eq!(received(&mut b), (0..50).map(frame).collect::<Vec<_>>());
        assert_eq!(
            faulty.stats,
            FaultStats {
                frames: 50,
                ..FaultStats::default()
            }
        );
    }

    #[test]
    fn every_fault_happens_at_about_its_rate_and_is_seeded() {
        let faults = LinkConfig {
            loss: 0.1,
            reorder: 0.1,
            duplicate: 0.1,
            corrupt: 0.1,
            ..LinkConfig::default()
        };
        let run = |seed| {
            let (a, mut b) = memory_pair();
            let mut faulty = FaultInjector::new(a, faults, seed);
            for tag in 0..=255u8 {
                for _ in 0..8 {
                    faulty.send(&frame(tag)).unwrap();
                }
            }
            faulty.wait(Some(Duration::ZERO)).unwrap();
            (faulty.stats, received(&mut b))
        };
        let (stats, frames) = run(7);
        for count in [
            stats.lost,
            stats.reordered,
            stats.duplicated,
            stats.corrupted,
        ] {
            assert!((100..320).contains(&count), "{stats:?}");
        }
        // Corruption is decided after loss, so every corrupted frame arrives (maybe twice).
        let damaged = frames
            .iter()
            .filter(|f| f.iter().any(|&b| b != f[0]))
            .count() as u64;
        assert!(damaged >= stats.corrupted, "{damaged} {stats:?}");
        assert_eq!(
            frames.len() as u64,
            stats.frames - stats.lost + stats.duplicated
        );
        let out_of_order = frames.windows(2).filter(|w| w[1][50] < w[0][50]).count();
        assert!(out_of_order > 0);
        assert_eq!(run(7).1, frames, "same seed, same damage");
        assert_ne!(run(8).1, frames);
    }

    /// A real RoCEv2 SEND from rxe, re-emitted as it was, with an 802.1Q tag, and over IPv6.
    fn layouts() -> Vec<Vec<u8>> {
        let capture = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/captures/rc_pingpong.pcap"
        );
        let frames = crate::capture::read_frames(std::path::Path::new(capture)).unwrap();
        let original = frames
            .iter()
            .find_map(|frame| {
                let checked = Frame::new_checked(&frame.data[..]).ok()?;
                let repr = FrameRepr::parse(&checked).ok()?;
                (repr.payload.len() >= 64).then(|| frame.data.clone())
            })
            .expect("a SEND with payload");
        let checked = Frame::new_checked(&original[..]).unwrap();
        let repr = FrameRepr::parse(&checked).unwrap();
        let mut tagged = repr;
        tagged.ethernet.vlan = Some(roce_wire::frame::VlanTag {
            pcp: 3,
            dei: false,
            vid: 77,
        });
        let mut over_ipv6 = tagged;
        over_ipv6.ip = IpRepr::V6(roce_wire::frame::Ipv6Repr {
            src: "fd00::1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        });
        let emit = |repr: FrameRepr| {
            let mut bytes = vec![0; repr.buffer_len()];
            repr.emit(&mut bytes).unwrap();
            bytes
        };
        vec![original.clone(), emit(tagged), emit(over_ipv6)]
    }

    #[test]
    fn every_flipped_bit_is_caught_whatever_the_layout() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for frame in layouts() {
            let parses = |bytes: &[u8]| {
                Frame::new_checked(bytes).and_then(|checked| FrameRepr::parse(&checked).map(|_| ()))
            };
            assert_eq!(parses(&frame), Ok(()));
            for _ in 0..2000 {
                let mut damaged = frame.clone();
                flip_covered_bit(&mut damaged, &mut rng);
                assert_ne!(damaged, frame);
                assert!(
                    parses(&damaged).is_err(),
                    "an unnoticed flip in {frame:02x?}"
                );
            }
        }
    }
}
