//! Regions over the caller's own memory through the verbs API, between two contexts joined by
//! the in-memory wire with engine threads: WRITE, READ and atomics reach memory the program
//! keeps and uses through its own pointers; remote atomics race correctly with the
//! program's own; a buffer the region took is handed back on deregistration; a deregistered
//! region's rkey is a remote access error.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use roce_provider::memory::memory_pair;
use roce_transport::wr::signaled;
use roce_verbs::{
    AccessFlags, Addressing, BackendChoice, ConnectOptions, Context, Cq, Device, OpenOptions,
    PathMtu, Pd, Progress, Qp, QpCaps, QpInitAttr, QpType, RetryConfig, SendOp, WcStatus,
};

const STALL: Duration = Duration::from_secs(20);

fn open(wire: roce_provider::memory::MemoryBackend, me: u8, peer: u8) -> Context {
    let mac = |n| [2, 0, 0, 0, 0, n];
    let ip = |n| Ipv4Addr::new(10, 0, 0, n);
    let device = Device::in_memory(mac(me), ip(me));
    let addressing = Addressing {
        mac: mac(me),
        ip: ip(me),
        neighbours: HashMap::from([(ip(peer), mac(peer))]),
    };
    let options = OpenOptions {
        backend: BackendChoice::Custom(Box::new(wire), addressing),
        progress: Progress::Events,
        seed: Some([me; 32]),
        ..OpenOptions::default()
    };
    Context::open(&device, options).expect("open")
}

/// Two contexts with one connected RC QP each.
struct Pair {
    pd: (Pd, Pd),
    cq_a: Cq,
    qp_a: Qp,
    _qp_b: Qp,
    _cq_b: Cq,
    _ctx: (Context, Context),
}

fn pair() -> Pair {
    let (wire_a, wire_b) = memory_pair();
    let (ctx_a, ctx_b) = (open(wire_a, 1, 2), open(wire_b, 2, 1));
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    let cq_a = ctx_a.create_cq(4096, None).unwrap();
    let cq_b = ctx_b.create_cq(16, None).unwrap();
    let attr = |cq| QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        caps: QpCaps {
            max_send_wr: 4096,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let qp_a = pd_a.create_qp(&attr(&cq_a)).unwrap();
    let qp_b = pd_b.create_qp(&attr(&cq_b)).unwrap();
    let options = ConnectOptions {
        mtu: PathMtu::Mtu1024,
        retry: RetryConfig {
            timeout: 12,
            ..RetryConfig::default()
        },
        ..ConnectOptions::default()
    };
    qp_a.connect(&qp_b.endpoint(1).unwrap(), &options).unwrap();
    qp_b.connect(&qp_a.endpoint(1).unwrap(), &options).unwrap();
    Pair {
        pd: (pd_a, pd_b),
        cq_a,
        qp_a,
        _qp_b: qp_b,
        _cq_b: cq_b,
        _ctx: (ctx_a, ctx_b),
    }
}

/// Memory the program keeps and reaches only through its raw pointer, as a C program's.
struct Raw {
    base: *mut u64,
    words: usize,
}

impl Raw {
    fn new(len: usize) -> Raw {
        let words = len.div_ceil(8);
        Raw {
            base: Box::into_raw(vec![0u64; words].into_boxed_slice()).cast(),
            words,
        }
    }

    fn ptr(&self) -> *mut u8 {
        self.base.cast()
    }

    fn len(&self) -> usize {
        self.words * 8
    }

    fn fill(&self, data: &[u8]) {
        assert!(data.len() <= self.len());
        // SAFETY: inside the buffer; no transfer touches it meanwhile.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), self.ptr(), data.len()) };
    }

    fn read(&self) -> Vec<u8> {
        let mut out = vec![0; self.len()];
        // SAFETY: inside the buffer; read after the transfers' completions.
        unsafe { ptr::copy_nonoverlapping(self.ptr(), out.as_mut_ptr(), out.len()) };
        out
    }

    /// Registers all of it with every right.
    fn register(&self, pd: &Pd) -> roce_verbs::Mr {
        // SAFETY: every test deregisters (drops) its regions before the `Raw` behind them,
        // and reads the memory only after the completions of the transfers into it.
        unsafe { pd.reg_mr_raw(self.ptr(), self.len(), AccessFlags::all()) }.unwrap()
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: `base` came from `Box::into_raw` of `words` words.
        drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(self.base, self.words)) });
    }
}

fn statuses(pair: &Pair, n: usize) -> Vec<(u64, WcStatus)> {
    let done = pair.cq_a.wait_for(n, STALL).expect("completions");
    done.iter().map(|wc| (wc.wr_id, wc.status)).collect()
}

/// A WRITEs 64 KiB from its own memory to B's, READs it back into a buffer the region owns,
/// and does both atomics on B's memory; B's program then sees the bytes through its pointer,
/// and deregistering the owned buffer hands it back with the READ's bytes.
#[test]
fn write_read_and_atomics_reach_the_programs_memory() {
    const LEN: usize = 64 * 1024;
    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + i / 251) as u8).collect();
    let (source, target, results, counter) =
        (Raw::new(LEN), Raw::new(LEN), Raw::new(16), Raw::new(8));
    source.fill(&data);
    counter.fill(&40u64.to_ne_bytes());
    let pair = pair();
    let (pd_a, pd_b) = &pair.pd;
    let source_mr = source.register(pd_a);
    assert_eq!(source_mr.addr(), source.ptr() as u64, "iova = address");
    let results_mr = results.register(pd_a);
    let back = pd_a
        .reg_mr_buffer(vec![0u8; LEN], AccessFlags::all())
        .unwrap();
    let target_mr = target.register(pd_b);
    // An explicit iova, as ibv_reg_mr_iova2.
    // SAFETY: deregistered (dropped) before `counter`.
    let counter_mr =
        unsafe { pd_b.reg_mr_iova(counter.ptr(), 8, 0x7000_0000, AccessFlags::all()) }.unwrap();
    assert_eq!(counter_mr.addr(), 0x7000_0000);

    let (rkey, remote_addr) = (target_mr.rkey(), target_mr.addr());
    let (counter_key, counter_addr) = (counter_mr.rkey(), counter_mr.addr());
    pair.qp_a
        .post_send([
            signaled(
                1,
                SendOp::RdmaWrite { remote_addr, rkey },
                source_mr.sge(0, LEN as u32),
            ),
            signaled(
                2,
                SendOp::RdmaRead { remote_addr, rkey },
                back.sge(0, LEN as u32),
            ),
            signaled(
                3,
                SendOp::FetchAdd {
                    remote_addr: counter_addr,
                    rkey: counter_key,
                    add: 2,
                },
                results_mr.sge(0, 8),
            ),
            signaled(
                4,
                SendOp::CompareSwap {
                    remote_addr: counter_addr,
                    rkey: counter_key,
                    compare: 42,
                    swap: 7,
                },
                results_mr.sge(8, 8),
            ),
        ])
        .unwrap();
    let ok = WcStatus::Success;
    assert_eq!(statuses(&pair, 4), [(1, ok), (2, ok), (3, ok), (4, ok)]);
    assert_eq!(target.read(), data);
    assert_eq!(counter.read(), 7u64.to_ne_bytes());
    let originals = results.read();
    assert_eq!(originals[..8], 40u64.to_ne_bytes());
    assert_eq!(originals[8..], 42u64.to_ne_bytes());
    // The copying calls work on the caller's memory too; the borrowing ones cannot.
    assert_eq!(target_mr.to_vec().unwrap(), data);
    assert!(target_mr.with_bytes(|_| ()).is_err());
    assert_eq!(back.dereg().unwrap().as_deref(), Some(&data[..]));
    assert_eq!(target_mr.dereg().unwrap(), None);
}

/// B's program adds 1 to a word of its memory over and over while A's FETCH_ADDs (run by
/// B's engine thread) add 2^32 to it: no update is lost either way.
#[test]
fn remote_atomics_race_correctly_with_the_programs_atomics() {
    const REMOTE_ADDS: u64 = 2000;
    const STEP: u64 = 1 << 32;
    let word = Arc::new(AtomicU64::new(0));
    let results = Raw::new(8 * REMOTE_ADDS as usize);
    let pair = pair();
    let (pd_a, pd_b) = &pair.pd;
    let results_mr = results.register(pd_a);
    let word_ptr = Arc::as_ptr(&word).cast_mut().cast::<u8>();
    // SAFETY: `word` outlives the region (the `Arc` is held past the drop of `pair` and of
    // the region), and every access to it is atomic.
    let word_mr = unsafe { pd_b.reg_mr_raw(word_ptr, 8, AccessFlags::all()) }.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let cpu = {
        let (word, stop) = (Arc::clone(&word), Arc::clone(&stop));
        thread::spawn(move || {
            let mut adds = 0u64;
            while !stop.load(Ordering::Relaxed) && adds < 1 << 31 {
                word.fetch_add(1, Ordering::SeqCst);
                adds += 1;
            }
            adds
        })
    };
    let work = (0..REMOTE_ADDS).map(|i| {
        let add = SendOp::FetchAdd {
            remote_addr: word_mr.addr(),
            rkey: word_mr.rkey(),
            add: STEP,
        };
        signaled(i, add, results_mr.sge(8 * i as usize, 8))
    });
    pair.qp_a.post_send(work).unwrap();
    let done = statuses(&pair, REMOTE_ADDS as usize);
    stop.store(true, Ordering::Relaxed);
    let cpu_adds = cpu.join().unwrap();
    assert!(done.iter().all(|(_, status)| *status == WcStatus::Success));
    assert_eq!(
        word.load(Ordering::SeqCst),
        cpu_adds + REMOTE_ADDS * STEP,
        "{cpu_adds} CPU adds"
    );
    drop(word_mr);
}

/// A region deregistered while the peer still holds its rkey: the peer's WRITE completes
/// with a remote access error and the memory, the program's again, is untouched.
#[test]
fn a_deregistered_regions_rkey_is_a_remote_access_error() {
    let (source, target) = (Raw::new(64), Raw::new(64));
    source.fill(&[0xAB; 64]);
    let pair = pair();
    let (pd_a, pd_b) = &pair.pd;
    let source_mr = source.register(pd_a);
    let target_mr = target.register(pd_b);
    let (remote_addr, rkey) = (target_mr.addr(), target_mr.rkey());
    assert_eq!(target_mr.dereg().unwrap(), None);
    let write = SendOp::RdmaWrite { remote_addr, rkey };
    pair.qp_a
        .post_send([signaled(1, write, source_mr.sge(0, 64))])
        .unwrap();
    assert_eq!(statuses(&pair, 1), [(1, WcStatus::RemoteAccess)]);
    assert_eq!(target.read(), [0; 64]);
}
