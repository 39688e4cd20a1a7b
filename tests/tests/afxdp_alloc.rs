//! The AF_XDP data path allocates nothing per packet in steady state: 64 KiB RDMA WRITEs
//! between two namespaces (path MTU 4096, two-buffer frames) counted by a global allocator
//! over 100,000 data packets. Needs root (CI is root).

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use roce_provider::backend::Backend;
use roce_provider::engine::Engine;
use roce_provider::netns::needs_root;
use roce_provider::netns::{veth, Netns};
use roce_provider::xdp::XdpMode;
use roce_tests::afxdp_in;
use roce_tests::rdma::{connected_pair, engines, signaled};
use roce_transport::cq::{WcStatus, WorkCompletion};
use roce_transport::qp_state::PathMtu;
use roce_transport::wr::{SendOp, Sge};
use roce_transport::CqId;

/// Counts every allocation and reallocation of the process.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's guarantees, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's guarantees, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's guarantees, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const MESSAGE: u32 = 64 << 10;
const SOURCE: u64 = 0x1000_0000;
const TARGET: u64 = 0x2000_0000;

/// Keeps eight WRITEs in flight until A has sent `packets` more frames; panics on a failed
/// completion or a stall.
fn write_packets<A: Backend, B: Backend>(
    a: &mut Engine<A>,
    b: &mut Engine<B>,
    (qpn, cq, lkey, rkey): (u32, CqId, u32, u32),
    packets: u64,
    done: &mut Vec<WorkCompletion>,
) {
    let goal = a.stats.tx_frames + packets;
    let source = Sge {
        addr: SOURCE,
        length: MESSAGE,
        lkey,
    };
    let write = SendOp::RdmaWrite {
        remote_addr: TARGET,
        rkey,
    };
    let mut outstanding = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while a.stats.tx_frames < goal || outstanding > 0 {
        assert!(
            Instant::now() < deadline,
            "stalled: {:?} {:?}",
            a.stats,
            b.stats
        );
        while outstanding < 8 && a.stats.tx_frames < goal {
            let wr = signaled(1, write, source);
            a.endpoint()
                .post_send(Instant::now(), qpn, &wr)
                .expect("post");
            outstanding += 1;
        }
        a.poll().expect("engine A");
        b.poll().expect("engine B");
        done.clear();
        a.endpoint().cq(cq).poll(16, done);
        assert!(
            done.iter().all(|wc| wc.status == WcStatus::Success),
            "{done:?}"
        );
        outstanding -= done.len();
    }
}

#[test]
fn af_xdp_path_allocates_nothing_per_packet() {
    if !needs_root("af_xdp_path_allocates_nothing_per_packet") {
        return;
    }
    let ns_a = Netns::create("roce-alloc-a").unwrap();
    let ns_b = Netns::create("roce-alloc-b").unwrap();
    veth(
        (&ns_a, "xa", "10.76.0.1/24"),
        (&ns_b, "xb", "10.76.0.2/24"),
        9000,
    )
    .unwrap();
    let (mac_a, mac_b) = (ns_a.mac("xa").unwrap(), ns_b.mac("xb").unwrap());
    let backend_a = afxdp_in(&ns_a, "xa", XdpMode::Native);
    let backend_b = afxdp_in(&ns_b, "xb", XdpMode::Native);
    let (ip_a, ip_b) = (Ipv4Addr::new(10, 76, 0, 1), Ipv4Addr::new(10, 76, 0, 2));
    let (mut side_a, mut side_b) = connected_pair(ip_a, ip_b, PathMtu::Mtu4096);
    let lkey = side_a.register(SOURCE, &vec![0x3c; MESSAGE as usize]);
    let rkey = side_b.register(TARGET, &vec![0; MESSAGE as usize]);
    let qp = (side_a.qpn, side_a.cq, lkey, rkey);
    let (mut a, mut b) = engines(
        (side_a.endpoint, backend_a, mac_a, ip_a),
        (side_b.endpoint, backend_b, mac_b, ip_b),
    );
    let mut done = Vec::with_capacity(16);

    // Warm up: every queue, table and buffer reaches its working size.
    write_packets(&mut a, &mut b, qp, 20_000, &mut done);
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let (sent, received) = (a.stats.tx_frames, b.stats.rx_frames);
    write_packets(&mut a, &mut b, qp, 100_000, &mut done);
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
    let (sent, received) = (a.stats.tx_frames - sent, b.stats.rx_frames - received);

    eprintln!("{allocations} allocations over {sent} packets sent, {received} received by B");
    assert!(received >= 100_000, "{:?}", b.stats);
    assert!(
        allocations < 100,
        "{allocations} allocations over {sent} packets"
    );
}
