//! A flood of junk at a device does not stop it: while a third station on the in-memory wire
//! sends B frames as fast as it can (RoCEv2 SENDs to B's QP with a bad ICRC, frames for
//! another MAC, garbage to UDP 4791), A's RDMA WRITEs to B keep completing. The WRITE rate
//! with and without the flood is printed, not asserted.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use roce_provider::backend::Backend;
use roce_provider::engine::Engine;
use roce_provider::memory::{memory_pair, MemoryTap};
use roce_tests::rdma::{connected_pair, engines, signaled, MAC_A, MAC_B};
use roce_transport::cq::WcStatus;
use roce_transport::qp_state::PathMtu;
use roce_transport::wr::{SendOp, Sge};
use roce_transport::CqId;
use roce_wire::{bth, ExtRepr, FrameRepr, Opcode, Psn};

const MESSAGE: usize = 64 << 10;
const SOURCE: u64 = 0x1000_0000;
const TARGET: u64 = 0x2000_0000;

/// Three kinds of junk for B (at `ip_b`, whose QP is `qpn_b`).
fn junk(ip_b: Ipv4Addr, qpn_b: u32) -> Vec<Vec<u8>> {
    let payload = [0x5a; 1024];
    let send = FrameRepr::ipv4(
        ([2, 0, 0, 0, 0, 0xEE], Ipv4Addr::new(10, 9, 0, 99)),
        (MAC_B, ip_b),
        bth::Repr {
            ack_req: true,
            resv7: 0,
            ..bth::Repr::new(Opcode::RcSendOnly, qpn_b, Psn::new(7))
        },
        ExtRepr::default(),
        &payload,
    );
    let mut bad_icrc = vec![0; send.buffer_len()];
    send.emit(&mut bad_icrc).expect("a SEND frame");
    let last = bad_icrc.len() - 1;
    bad_icrc[last] ^= 0xFF;
    let mut not_ours = bad_icrc.clone();
    not_ours[..6].copy_from_slice(&[2, 0, 0, 0, 0, 0x77]);
    let mut garbage = bad_icrc.clone();
    garbage[14 + 20 + 8..].fill(0xA5);
    vec![bad_icrc, not_ours, garbage]
}

/// Sends junk through `tap` as fast as the wire takes it until `stop`.
fn flood(tap: MemoryTap, frames: Vec<Vec<u8>>, stop: Arc<AtomicBool>) -> u64 {
    let mut sent = 0;
    while !stop.load(Ordering::Relaxed) {
        for frame in &frames {
            if tap.send(frame).is_ok() {
                sent += 1;
            }
        }
    }
    sent
}

/// Keeps four 64 KiB WRITEs in flight from A to B for `period`; bytes per second completed.
fn write_rate<A: Backend, B: Backend>(
    a: &mut Engine<A>,
    b: &mut Engine<B>,
    (qpn, cq, lkey, rkey): (u32, CqId, u32, u32),
    period: Duration,
) -> f64 {
    let started = Instant::now();
    let (mut posted, mut completed) = (0u64, 0u64);
    let mut done = Vec::new();
    let source = Sge {
        addr: SOURCE,
        length: MESSAGE as u32,
        lkey,
    };
    let write = SendOp::RdmaWrite {
        remote_addr: TARGET,
        rkey,
    };
    // Bounded in time, and by an end to the WRITEs if completions stop altogether.
    while started.elapsed() < period + Duration::from_secs(30) {
        while posted - completed < 4 && started.elapsed() < period {
            let wr = signaled(posted, write, source);
            a.endpoint()
                .post_send(Instant::now(), qpn, &wr)
                .expect("post");
            posted += 1;
        }
        if posted == completed {
            break;
        }
        a.run_once(Duration::from_micros(100)).expect("engine A");
        b.run_once(Duration::from_micros(100)).expect("engine B");
        done.clear();
        a.endpoint().cq(cq).poll(16, &mut done);
        assert!(
            done.iter().all(|wc| wc.status == WcStatus::Success),
            "{done:?}"
        );
        completed += done.len() as u64;
    }
    assert_eq!(posted, completed, "WRITEs still outstanding");
    (completed * MESSAGE as u64) as f64 / started.elapsed().as_secs_f64()
}

#[test]
fn writes_keep_completing_under_a_flood_of_junk() {
    let (ip_a, ip_b) = (Ipv4Addr::new(10, 9, 0, 1), Ipv4Addr::new(10, 9, 0, 2));
    let (mut side_a, mut side_b) = connected_pair(ip_a, ip_b, PathMtu::Mtu4096);
    let data: Vec<u8> = (0..MESSAGE).map(|i| (i * 13 + i / 509) as u8).collect();
    let lkey = side_a.register(SOURCE, &data);
    let rkey = side_b.register(TARGET, &vec![0; MESSAGE]);
    let qp = (side_a.qpn, side_a.cq, lkey, rkey);
    let frames = junk(ip_b, side_b.qpn);
    let (wire_a, wire_b) = memory_pair();
    let tap = wire_b.tap();
    let (mut a, mut b) = engines(
        (side_a.endpoint, wire_a, MAC_A, ip_a),
        (side_b.endpoint, wire_b, MAC_B, ip_b),
    );
    let period = Duration::from_millis(500);

    let quiet = write_rate(&mut a, &mut b, qp, period);
    let stop = Arc::new(AtomicBool::new(false));
    let flooder = {
        let stop = stop.clone();
        thread::spawn(move || flood(tap, frames, stop))
    };
    let before = b.stats;
    let flooded = write_rate(&mut a, &mut b, qp, period);
    stop.store(true, Ordering::Relaxed);
    let junk_sent = flooder.join().expect("flooder");
    let stats = b.stats;

    eprintln!(
        "64 KiB WRITEs: {:.1} MB/s quiet, {:.1} MB/s under a flood of {junk_sent} junk frames \
         (B dropped {} not addressed to it, rejected {})",
        quiet / 1e6,
        flooded / 1e6,
        stats.rx_not_ours - before.rx_not_ours,
        stats.rx_rejected - before.rx_rejected,
    );
    assert!(flooded > 0.0, "no WRITE completed under the flood");
    assert!(stats.rx_not_ours > before.rx_not_ours && stats.rx_rejected > before.rx_rejected);
    let region = (b.endpoint().mrs().get(rkey)).and_then(|mr| mr.bytes().map(<[u8]>::to_vec));
    assert_eq!(region.as_deref(), Some(&data[..]));
}
