//! Benchmarks behind `CRC_BENCH.md`:
//!
//! * `icrc/<impl>/<bytes>`: plain CRC-32 (IEEE/zlib, reflected: the ICRC polynomial) over
//!   64 B, 1 KiB and 4 KiB buffers with crc32fast (PCLMULQDQ via std run-time detection) and
//!   the `crc` crate's slice-by-16 and one-table implementations.
//! * `frame/parse_verify/<frame bytes>` and `frame/emit/<frame bytes>`: one RoCEv2 frame over
//!   IPv4 per size: an RC_ACKNOWLEDGE (62 B) and RC_SEND_ONLYs of 1022 B and 4094 B, through
//!   `Frame::new_checked` + `FrameRepr::parse` (which verifies the ICRC), or `FrameRepr::emit`
//!   (which computes it).
//!
//! Run with `cargo bench -p roce-wire --bench wire`.

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use roce_wire::aeth::{self, CreditCount, Syndrome};
use roce_wire::frame::{IpRepr, Ipv4Repr};
use roce_wire::{bth, ExtRepr, Frame, FrameRepr, Opcode, Psn};

const CRC_SIZES: [usize; 3] = [64, 1024, 4096];

/// Ethernet, IPv4, UDP and BTH headers plus the ICRC: the frame bytes around the payload.
const SEND_ONLY_OVERHEAD: usize = 14 + 20 + 8 + 12 + 4;

/// Deterministic, incompressible-looking test bytes (xorshift64).
fn test_bytes(len: usize) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

fn crc_benches(c: &mut Criterion) {
    let slice16 = crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISO_HDLC);
    let table1 = crc::Crc::<u32, crc::Table<1>>::new(&crc::CRC_32_ISO_HDLC);

    // The three must agree before their speeds mean anything.
    assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
    for len in (0..=4096).step_by(7).chain(CRC_SIZES) {
        let data = test_bytes(len);
        let expected = crc32fast::hash(&data);
        assert_eq!(slice16.checksum(&data), expected, "slice-by-16, {len} B");
        assert_eq!(table1.checksum(&data), expected, "one table, {len} B");
    }

    let mut group = c.benchmark_group("icrc");
    for size in CRC_SIZES {
        let data = test_bytes(size);
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("crc32fast", size), &data, |b, data| {
            b.iter(|| crc32fast::hash(black_box(data)))
        });
        group.bench_with_input(BenchmarkId::new("crc_slice16", size), &data, |b, data| {
            b.iter(|| slice16.checksum(black_box(data)))
        });
        group.bench_with_input(BenchmarkId::new("crc_table1", size), &data, |b, data| {
            b.iter(|| table1.checksum(black_box(data)))
        });
    }
    group.finish();
}

fn frame_template(payload: &[u8]) -> FrameRepr<'_> {
    let (src, dst) = (Ipv4Addr::new(10, 88, 0, 11), Ipv4Addr::new(10, 88, 0, 12));
    FrameRepr {
        ip: IpRepr::V4(Ipv4Repr {
            dscp: 26,
            ecn: 0b10,
            identification: 0x9aaa,
            ..Ipv4Repr::new(src, dst)
        }),
        udp_src_port: 0xC121,
        ..FrameRepr::ipv4(
            ([0x02, 0x00, 0x00, 0x00, 0x00, 0x0b], src),
            ([0x02, 0x00, 0x00, 0x00, 0x00, 0x0c], dst),
            bth::Repr {
                ack_req: true,
                resv7: 0,
                ..bth::Repr::new(Opcode::RcSendOnly, 0x11, Psn::new(0x18_d6bb))
            },
            ExtRepr::default(),
            payload,
        )
    }
}

/// The benchmarked frames: a 62-byte RC_ACKNOWLEDGE and an RC_SEND_ONLY per payload.
fn frames(payloads: &[Vec<u8>; 2]) -> [FrameRepr<'_>; 3] {
    let ack = FrameRepr {
        bth: bth::Repr {
            opcode: Opcode::RcAcknowledge,
            ack_req: false,
            resv7: 0,
            ..frame_template(&[]).bth
        },
        ext: ExtRepr {
            aeth: Some(aeth::Repr {
                syndrome: Syndrome::Ack(CreditCount::UNLIMITED),
                msn: 1,
            }),
            ..ExtRepr::default()
        },
        ..frame_template(&[])
    };
    [
        ack,
        frame_template(&payloads[0]),
        frame_template(&payloads[1]),
    ]
}

fn frame_benches(c: &mut Criterion) {
    // Payloads stay multiples of 4 so no pad is needed: frames of 1022 B and 4094 B.
    let payloads = [
        test_bytes(1024 - SEND_ONLY_OVERHEAD - 2),
        test_bytes(4096 - SEND_ONLY_OVERHEAD - 2),
    ];
    let frames = frames(&payloads);
    let expected_lens = [62, 1022, 4094];

    let mut group = c.benchmark_group("frame");
    for (repr, expected_len) in frames.iter().zip(expected_lens) {
        let len = repr.buffer_len();
        assert_eq!(len, expected_len);
        let mut bytes = vec![0u8; len];
        assert_eq!(repr.emit(&mut bytes), Ok(len));
        // Check outside timing that the frame is valid and round-trips.
        let frame = Frame::new_checked(&bytes[..]).expect("emitted frame is well formed");
        assert_eq!(frame.check_icrc(), Ok(()));
        assert_eq!(FrameRepr::parse(&frame).as_ref(), Ok(repr));

        let name = match repr.bth.opcode {
            Opcode::RcAcknowledge => "ack",
            _ => "send_only",
        };
        group.throughput(Throughput::Elements(1));
        group.bench_with_input(
            BenchmarkId::new("parse_verify", format!("{len}_{name}")),
            &bytes,
            |b, bytes| {
                b.iter(|| {
                    let frame = Frame::new_checked(black_box(&bytes[..])).unwrap();
                    FrameRepr::parse(&frame).unwrap().bth.psn
                })
            },
        );
        let mut out = vec![0u8; len];
        group.bench_function(BenchmarkId::new("emit", format!("{len}_{name}")), |b| {
            b.iter(|| black_box(repr).emit(black_box(&mut out)).unwrap())
        });
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = crc_benches, frame_benches
}
criterion_main!(benches);
