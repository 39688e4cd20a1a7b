//! Regions over the caller's own memory, between two simulated endpoints: WRITE, READ and
//! both atomics land in (and come from) memory the test owns and reaches only through raw
//! pointers, as a C program's buffers are; remote atomics race correctly with the CPU's own;
//! a deregistered region is a remote access error.

use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use roce_transport::cq::WcStatus;
use roce_transport::mr::{AtomicOp, MrError};
use roce_transport::qp_state::{PathMtu, QpState, QpType};
use roce_transport::sim::{LinkConfig, RetryConfig, Sim};
use roce_transport::wr::{SendOp, Sge};
use roce_transport::{AccessFlags, CallerMemory};

mod common;
use common::*;

/// Memory the test allocates and then touches only through its raw pointer, as the memory
/// of a C program registered with `ibv_reg_mr`. 8-byte aligned.
struct CallerBuffer {
    base: *mut u64,
    words: usize,
}

impl CallerBuffer {
    fn new(len: usize) -> CallerBuffer {
        let words = len.div_ceil(8);
        let boxed = vec![0u64; words].into_boxed_slice();
        CallerBuffer {
            base: Box::into_raw(boxed).cast::<u64>(),
            words,
        }
    }

    fn with(contents: &[u8]) -> CallerBuffer {
        let buffer = CallerBuffer::new(contents.len());
        // SAFETY: the buffer holds at least `contents.len()` bytes and nothing else uses it.
        unsafe { ptr::copy_nonoverlapping(contents.as_ptr(), buffer.ptr(0), contents.len()) };
        buffer
    }

    fn ptr(&self, offset: usize) -> *mut u8 {
        self.base.cast::<u8>().wrapping_add(offset)
    }

    /// Registers `len` bytes from `offset` on `node`, addressed from `iova`.
    fn register(&self, sim: &mut Sim, node: usize, iova: u64, offset: usize, len: usize) -> u32 {
        assert!(offset + len <= self.words * 8);
        // SAFETY: the buffer outlives the simulator in every test (declared before it, so
        // dropped after), and the test reads it only while the simulator is not running.
        let memory = unsafe { CallerMemory::new(self.ptr(offset), len, true) }.unwrap();
        let pd = sim.nodes[node].pd;
        sim.nodes[node]
            .endpoint
            .mrs()
            .reg_mr_caller(pd, iova, memory, AccessFlags::all())
            .expect("valid region")
    }

    fn read(&self, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        // SAFETY: `len` is within the buffer; nothing writes it while the test reads.
        unsafe { ptr::copy_nonoverlapping(self.ptr(0), out.as_mut_ptr(), len) };
        out
    }
}

impl Drop for CallerBuffer {
    fn drop(&mut self) {
        // SAFETY: `base` came from `Box::into_raw` of a slice of `words` words.
        drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(self.base, self.words)) });
    }
}

fn pair() -> (Sim, u32, u32) {
    let mut sim = Sim::new(LinkConfig::default(), 11);
    assert_eq!((sim.add_node(), sim.add_node()), (A, B));
    let pair = sim.connect(A, B, QpType::Rc, PathMtu::Mtu1024, RetryConfig::default());
    (sim, pair.a.1, pair.b.1)
}

/// A WRITEs 10 KiB (ten packets) from its memory into B's, READs it back into other memory
/// of its own, then does both atomics on a word of B's: every byte and result is where the
/// transport says, in memory the regions never owned.
#[test]
fn write_read_and_atomics_over_caller_memory() {
    const LEN: usize = 10 * 1024;
    let data = pattern(LEN, 3);
    let source = CallerBuffer::with(&data);
    let back = CallerBuffer::new(LEN);
    let results = CallerBuffer::new(16);
    let target = CallerBuffer::new(LEN);
    let counter = CallerBuffer::with(&40u64.to_ne_bytes());
    let (mut sim, qa, _qb) = pair();
    let source_key = source.register(&mut sim, A, SRC, 0, LEN);
    let back_key = back.register(&mut sim, A, SRC + 0x10_0000, 0, LEN);
    let results_key = results.register(&mut sim, A, SRC + 0x20_0000, 0, 16);
    let target_key = target.register(&mut sim, B, DST, 0, LEN);
    let counter_key = counter.register(&mut sim, B, DST2, 0, 8);

    let write = SendOp::RdmaWrite {
        remote_addr: DST,
        rkey: target_key,
    };
    let read = SendOp::RdmaRead {
        remote_addr: DST,
        rkey: target_key,
    };
    let add = SendOp::FetchAdd {
        remote_addr: DST2,
        rkey: counter_key,
        add: 2,
    };
    let swap = SendOp::CompareSwap {
        remote_addr: DST2,
        rkey: counter_key,
        compare: 42,
        swap: 7,
    };
    let work = [
        signaled(1, write, sge(SRC, LEN, source_key)),
        signaled(2, read, sge(SRC + 0x10_0000, LEN, back_key)),
        signaled(3, add, sge(SRC + 0x20_0000, 8, results_key)),
        signaled(4, swap, sge(SRC + 0x20_0008, 8, results_key)),
    ];
    for wr in &work {
        sim.post_send(A, qa, wr).unwrap();
    }
    let done = summary(&wait_send(&mut sim, A, 4));
    assert_eq!(
        done,
        [1, 2, 3, 4].map(|id| (id, WcStatus::Success)),
        "every request succeeds"
    );
    assert_eq!(target.read(LEN), data, "the WRITE landed in B's memory");
    assert_eq!(back.read(LEN), data, "the READ landed in A's memory");
    assert_eq!(counter.read(8), 7u64.to_ne_bytes(), "40 + 2, then swapped");
    let originals = results.read(16);
    assert_eq!(originals[..8], 40u64.to_ne_bytes());
    assert_eq!(originals[8..], 42u64.to_ne_bytes());
}

/// The CPU adds 1 to a word over and over on another thread while the peer's FETCH_ADDs add
/// 2^32 to the same word: neither loses an update, so the total is exactly both counts.
#[test]
fn remote_atomics_race_correctly_with_cpu_atomics() {
    const REMOTE_ADDS: u64 = 4000;
    const REMOTE_STEP: u64 = 1 << 32;
    let word = Arc::new(AtomicU64::new(0));
    let results = CallerBuffer::new(8 * REMOTE_ADDS as usize);
    let (mut sim, qa, _qb) = pair();
    // SAFETY: `word` is kept alive by the `Arc` held to the end of the test, after the
    // simulator is gone; every access to it, ours and the transport's, is atomic.
    let memory = unsafe { CallerMemory::new(Arc::as_ptr(&word).cast_mut().cast(), 8, true) };
    let pd = sim.nodes[B].pd;
    let rkey = sim.nodes[B]
        .endpoint
        .mrs()
        .reg_mr_caller(pd, DST, memory.unwrap(), AccessFlags::all())
        .unwrap();
    let results_key = results.register(&mut sim, A, SRC, 0, 8 * REMOTE_ADDS as usize);

    let stop = Arc::new(AtomicBool::new(false));
    let cpu = {
        let (word, stop) = (Arc::clone(&word), Arc::clone(&stop));
        thread::spawn(move || {
            let mut adds = 0u64;
            // Bounded: the main thread stops it long before this.
            while !stop.load(Ordering::Relaxed) && adds < 1 << 31 {
                word.fetch_add(1, Ordering::SeqCst);
                adds += 1;
            }
            adds
        })
    };
    for i in 0..REMOTE_ADDS {
        let add = SendOp::FetchAdd {
            remote_addr: DST,
            rkey,
            add: REMOTE_STEP,
        };
        let local = sge(SRC + 8 * i, 8, results_key);
        sim.post_send(A, qa, &signaled(i, add, local)).unwrap();
    }
    let completions = wait_send(&mut sim, A, REMOTE_ADDS as usize);
    stop.store(true, Ordering::Relaxed);
    let cpu_adds = cpu.join().unwrap();
    assert!(completions.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(
        word.load(Ordering::SeqCst),
        cpu_adds + REMOTE_ADDS * REMOTE_STEP,
        "no update lost ({cpu_adds} CPU adds)"
    );
    // The peer saw its own adds in order, each exactly once.
    let originals = results.read(8 * REMOTE_ADDS as usize);
    for (i, original) in originals.chunks_exact(8).enumerate() {
        let original = u64::from_ne_bytes(original.try_into().unwrap());
        assert_eq!(original / REMOTE_STEP, i as u64);
    }
}

/// A region deregistered while the peer still holds its rkey: the peer's WRITE is a remote
/// access error, and the memory (still the caller's) is not touched.
#[test]
fn deregistered_caller_memory_is_a_remote_access_error() {
    let source = CallerBuffer::with(&pattern(64, 5));
    let target = CallerBuffer::new(64);
    let (mut sim, qa, qb) = pair();
    let source_key = source.register(&mut sim, A, SRC, 0, 64);
    let rkey = target.register(&mut sim, B, DST, 0, 64);
    let mrs = sim.nodes[B].endpoint.mrs();
    assert_eq!(
        mrs.dereg_mr(rkey),
        Ok(None),
        "caller memory is not handed back"
    );
    assert_eq!(mrs.dereg_mr(rkey), Err(MrError::UnknownKey));
    let write = SendOp::RdmaWrite {
        remote_addr: DST,
        rkey,
    };
    sim.post_send(A, qa, &signaled(1, write, sge(SRC, 64, source_key)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::RemoteAccess)]
    );
    assert_eq!(target.read(64), [0; 64]);
    assert_eq!(state(&sim, B, qb), QpState::Err);
}

/// An atomic whose target is aligned in the region's addresses (iova) but not in the
/// process's memory cannot be one atomic instruction: it is refused as a misaligned atomic
/// (REM_INV_REQ_ERR), and the memory is not touched.
#[test]
fn atomic_on_a_misaligned_caller_address_is_refused() {
    let result = CallerBuffer::new(8);
    let target = CallerBuffer::new(24);
    let (mut sim, qa, _qb) = pair();
    let result_key = result.register(&mut sim, A, SRC, 0, 8);
    let rkey = target.register(&mut sim, B, DST, 4, 16);
    let add = SendOp::FetchAdd {
        remote_addr: DST,
        rkey,
        add: 1,
    };
    sim.post_send(A, qa, &signaled(1, add, sge(SRC, 8, result_key)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::RemoteInvalidRequest)]
    );
    assert_eq!(target.read(24), [0; 24]);
}

/// The region table's own calls over a caller's memory, without a network: copies, both
/// kinds of atomics, gather and scatter land in the caller's bytes; nothing outside the
/// region is touched; memory not given as writable cannot be registered for writes.
#[test]
fn region_table_calls_reach_caller_memory() {
    let buffer = CallerBuffer::new(40);
    let mut sim = Sim::new(LinkConfig::default(), 1);
    sim.add_node();
    let key = buffer.register(&mut sim, A, 0x5000, 8, 32);
    let pd = sim.nodes[A].pd;
    let all = AccessFlags::all();
    let mrs = sim.nodes[A].endpoint.mrs();
    assert_eq!(mrs.get(key).map(|mr| mr.bytes().is_none()), Some(true));
    mrs.write(pd, key, 0x5008, &7u64.to_ne_bytes(), all)
        .unwrap();
    assert_eq!(mrs.atomic(pd, key, 0x5008, AtomicOp::FetchAdd(5)), Ok(7));
    let swap = AtomicOp::CompareSwap {
        compare: 12,
        swap: 13,
    };
    assert_eq!(mrs.atomic(pd, key, 0x5008, swap), Ok(12));
    let sg = [Sge {
        addr: 0x5008,
        length: 8,
        lkey: key,
    }];
    let mut out = Vec::new();
    mrs.gather(pd, &sg, 0, 8, &mut out).unwrap();
    assert_eq!(out, 13u64.to_ne_bytes());
    mrs.scatter(pd, &sg, 4, &[0xFF; 4]).unwrap();
    assert_eq!(
        mrs.write(pd, key, 0x5020, &[1], all),
        Err(MrError::OutOfBounds)
    );
    let expected = [0, 0, 13 | 0xFFFF_FFFF_u64 << 32, 0, 0];
    let expected: Vec<u8> = expected.iter().flat_map(|w| w.to_ne_bytes()).collect();
    assert_eq!(mrs.get(key).unwrap().to_vec(), Ok(expected[8..40].to_vec()));
    assert_eq!(buffer.read(40), expected[..40]);
    // SAFETY: refused before anything is touched.
    let read_only = unsafe { CallerMemory::new(buffer.ptr(0), 8, false) }.unwrap();
    assert_eq!(
        mrs.reg_mr_caller(pd, 0, read_only, all),
        Err(MrError::InvalidAccess)
    );
}
