//! A peer that repeats a READ request cannot grow the responder's memory: a READ is a
//! resource with a cursor whose response packets are built from the region as they are sent,
//! and a duplicate only moves the cursor back (issue: one 16 MiB READ and 100 forged
//! duplicates of its request used to grow the heap by 1.7 GiB).
//!
//! One test in its own binary, because it counts every allocation of the process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use roce_transport::cq::{WcStatus, WorkCompletion};
use roce_transport::qp_state::{PathMtu, QpType};
use roce_transport::sim::{LinkConfig, RetryConfig, Sim};
use roce_transport::wr::{SendFlags, SendOp, SendWr, Sge};
use roce_transport::{AccessFlags, Endpoint, Transmit};
use roce_wire::opcode::Operation;

mod common;

use common::received_frame;

/// Counts the bytes the process has allocated and not freed, and their high-water mark.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let live = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every call is passed unchanged to the system allocator; the counters only observe.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is the system allocator's.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, which is the system's, with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`, and `new_size` is the caller's to choose.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The READ: all of a 1 GiB region. Both regions are ordinary zeroed allocations, so a
/// 1 GiB region costs 1 GiB of memory on each side while the test runs.
const LEN: usize = 1 << 30;
const MTU: usize = 4096;
const REMOTE: u64 = 0x1000_0000;
const LOCAL: u64 = 0x8000_0000;
const DUPLICATES: usize = 10_000;
/// Responses delivered before the duplicates start, so they restart a READ under way.
const BEFORE_DUPLICATES: usize = 1_000;
/// What the transport may allocate beyond what it held when the duplicates began.
const HEAP_BUDGET: usize = 4 << 20;

/// A region of `LEN` bytes on `node`; `fill` writes each 4 KiB page's contents.
fn region(sim: &mut Sim, node: usize, iova: u64, fill: bool) -> u32 {
    let pd = sim.nodes[node].pd;
    let mrs = sim.nodes[node].endpoint.mrs();
    let key = mrs
        .reg_mr(pd, iova, LEN, AccessFlags::all())
        .expect("a 1 GiB region");
    if fill {
        let bytes = (mrs.get_mut(key).expect("registered").bytes_mut()).expect("owned bytes");
        let page: Vec<u8> = (0..MTU).map(|i| (i * 7 + 3) as u8).collect();
        // Every page differs, so a response placed at the wrong offset shows.
        for (index, chunk) in bytes.chunks_exact_mut(MTU).enumerate() {
            chunk.copy_from_slice(&page);
            chunk[..8].copy_from_slice(&(index as u64).to_le_bytes());
        }
    }
    key
}

/// Sends one packet `from` has to send to `to`; whether there was one.
fn step(from: &mut Endpoint, to: &mut Endpoint, transmit: &mut Transmit, hosts: [u8; 2]) -> bool {
    let now = Instant::now();
    let sent = from.poll_transmit_into(now, transmit);
    if sent {
        to.handle_packet(now, &received_frame(transmit, hosts));
    }
    sent
}

#[test]
fn duplicate_reads_of_a_gigabyte_leave_the_heap_flat_and_the_read_intact() {
    let mut sim = Sim::new(LinkConfig::default(), 11);
    let (a, b) = (sim.add_node(), sim.add_node());
    let pair = sim.connect(a, b, QpType::Rc, PathMtu::Mtu4096, RetryConfig::default());
    let (qa, qb) = (pair.a.1, pair.b.1);
    let remote_key = region(&mut sim, b, REMOTE, true);
    let local_key = region(&mut sim, a, LOCAL, false);
    let read = SendWr {
        wr_id: 1,
        op: SendOp::RdmaRead {
            remote_addr: REMOTE,
            rkey: remote_key,
        },
        sg_list: [Sge {
            addr: LOCAL,
            length: LEN as u32,
            lkey: local_key,
        }]
        .into(),
        inline_data: Vec::new(),
        flags: SendFlags::SIGNALED,
        ud: None,
        xrc_srqn: 0,
    };
    sim.post_send(a, qa, &read).expect("READ posted");

    let (left, right) = sim.nodes.split_at_mut(1);
    let (ea, eb) = (&mut left[0].endpoint, &mut right[0].endpoint);
    let mut transmit = Transmit::default();
    assert!(step(ea, eb, &mut transmit, [1, 2]), "the READ request");
    assert_eq!(
        transmit.packet.bth.opcode.info().operation,
        Operation::ReadRequest
    );
    let request = transmit.clone();
    for _ in 0..BEFORE_DUPLICATES {
        assert!(step(eb, ea, &mut transmit, [2, 1]), "a READ response");
    }

    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let now = Instant::now();
    for sent in 0..DUPLICATES {
        eb.handle_packet(now, &received_frame(&request, [1, 2]));
        // The flood arrives while the responder is sending.
        assert!(step(eb, ea, &mut transmit, [2, 1]), "a response");
        let backlog = eb.responder_backlog(qb).expect("QP exists");
        assert!(backlog.queued <= backlog.bound, "{backlog:?} after {sent}");
        let growth = PEAK.load(Ordering::Relaxed) - base;
        assert!(
            growth < HEAP_BUDGET,
            "{growth} bytes after {sent} duplicates"
        );
    }

    // Bounded: the restarted READ sends its whole message once more, plus a margin.
    let mut responses = 0usize;
    while step(eb, ea, &mut transmit, [2, 1]) {
        responses += 1;
        assert!(responses <= 2 * LEN / MTU, "the responder does not stop");
    }
    while step(ea, eb, &mut transmit, [1, 2]) {}
    let growth = PEAK.load(Ordering::Relaxed) - base;
    assert!(growth < HEAP_BUDGET, "{growth} bytes in all");
    eprintln!("heap high-water mark above the start of the flood: {growth} bytes");

    let cq = sim.nodes[a].send_cq;
    let mut completions: Vec<WorkCompletion> = Vec::new();
    sim.nodes[a]
        .endpoint
        .cq(cq)
        .poll(usize::MAX, &mut completions);
    assert_eq!(completions.len(), 1);
    assert_eq!(completions[0].status, WcStatus::Success);
    assert_eq!(completions[0].byte_len, LEN as u32);
    let (left, right) = sim.nodes.split_at_mut(1);
    let local = left[0].endpoint.mrs().get(local_key).expect("region");
    let remote = right[0].endpoint.mrs().get(remote_key).expect("region");
    // Compared page by page, to name the first wrong one.
    let wrong = local
        .bytes()
        .expect("owned bytes")
        .chunks_exact(MTU)
        .zip(remote.bytes().expect("owned bytes").chunks_exact(MTU))
        .position(|(got, sent)| got != sent);
    assert_eq!(wrong, None, "first page that differs");
}
