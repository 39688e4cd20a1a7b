//! The scenario engine against in-memory responders: our transport behind an [`Engine`] on
//! the in-memory wire, honest or made wrong on purpose by a backend wrapper, so that what
//! the engine reports can be checked against what the responder is known to do.

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use roce_provider::backend::Backend;
use roce_provider::engine::{Addressing, Engine};
use roce_provider::memory::memory_pair;
use roce_transport::qp::{QpCaps, QpInit};
use roce_transport::qp_state::{connect_attrs, AddressVector, PathMtu, Peer, QpType, RetryConfig};
use roce_transport::wr::{RecvWr, Sge};
use roce_transport::{AccessFlags, Endpoint};
use roce_wire::icrc::{self, ICRC_LEN};
use roce_wire::{Frame, Opcode, Psn};

use super::conduct::run_suite;
use super::link::{Link, Offsets, Station};
use super::scenarios::{Scenario, SCENARIOS};
use super::target::{Local, Options, Remote, Service, Session, Target};
use super::verdict::Summary;

const OUR_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const THEIR_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const OURS: Station = Station {
    mac: [2, 0, 0, 0, 0, 1],
    ip: IpAddr::V4(OUR_IP),
};
const THEIRS: Station = Station {
    mac: [2, 0, 0, 0, 0, 2],
    ip: IpAddr::V4(THEIR_IP),
};
const BUFFER_AT: u64 = 0x7F00_0000_0000;
const SEND_SIZE: usize = 64;
const RECEIVES: usize = 5;

type Shared = Arc<Mutex<Engine<Box<dyn Backend>>>>;

/// Our transport as the target, driven by a thread, its QPs made on demand.
struct MemoryTarget {
    engine: Shared,
    stop: Arc<AtomicBool>,
    driver: Option<JoinHandle<()>>,
}

impl MemoryTarget {
    /// A target whose wire end is `wrap`ped, and the link to it.
    fn start(wrap: impl FnOnce(Box<dyn Backend>) -> Box<dyn Backend>) -> (MemoryTarget, Link) {
        let (ours, theirs) = memory_pair();
        let addressing = Addressing {
            mac: THEIRS.mac,
            ip: THEIR_IP,
            neighbours: HashMap::from([(OUR_IP, OURS.mac)]),
        };
        let mut endpoint = Endpoint::new([7; 32]);
        endpoint.set_port_mtu(PathMtu::Mtu1024);
        let engine: Shared = Arc::new(Mutex::new(Engine::new(
            endpoint,
            wrap(Box::new(theirs)),
            addressing,
        )));
        let stop = Arc::new(AtomicBool::new(false));
        let driver = {
            let (engine, stop) = (engine.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(mut engine) = engine.lock() {
                        let _ = engine.poll();
                    }
                    thread::sleep(Duration::from_micros(200));
                }
            })
        };
        let ours = DrivesTheTarget {
            inner: Box::new(ours),
            engine: engine.clone(),
        };
        let link = Link::new(Box::new(ours), OURS, THEIRS, Duration::from_millis(40));
        let target = MemoryTarget {
            engine,
            stop,
            driver: Some(driver),
        };
        (target, link)
    }

    fn suite(
        wrap: impl FnOnce(Box<dyn Backend>) -> Box<dyn Backend>,
        scenarios: &[&Scenario],
    ) -> (Summary, String) {
        let (mut target, mut link) = MemoryTarget::start(wrap);
        let options = Options {
            send_size: SEND_SIZE,
            check: None,
        };
        let mut out = Vec::new();
        let summary = run_suite(&mut target, &mut link, scenarios, &options, &mut out).unwrap();
        (summary, String::from_utf8(out).unwrap())
    }
}

impl Drop for MemoryTarget {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(driver) = self.driver.take() {
            let _ = driver.join();
        }
    }
}

impl Target for MemoryTarget {
    fn connect(&mut self, service: Service, local: &Local) -> io::Result<Box<dyn Session>> {
        if service == Service::Ud {
            return Err(io::Error::other("no UD QP in memory"));
        }
        let mut engine = self
            .engine
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?;
        let endpoint = engine.endpoint();
        let pd = endpoint.mrs().alloc_pd();
        let cq = endpoint.create_cq(64).map_err(io::Error::other)?;
        let init = QpInit {
            pd,
            qp_type: QpType::Rc,
            caps: QpCaps {
                max_send_wr: 16,
                max_recv_wr: 16,
                ..QpCaps::default()
            },
            sq_sig_all: false,
        };
        let qpn = endpoint.create_qp(init, cq, cq).map_err(io::Error::other)?;
        let key = endpoint
            .mrs()
            .reg_mr(pd, BUFFER_AT, 4096, AccessFlags::all())
            .map_err(io::Error::other)?;
        let sq_psn = Psn::new(0xFF_FFF0 ^ local.psn.value());
        let peer = Peer {
            av: AddressVector {
                dgid: local.gid,
                sgid_index: 1,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: 0,
            },
            qpn: local.qpn,
            psn: local.psn,
        };
        let now = Instant::now();
        for attr in connect_attrs(
            QpType::Rc,
            peer,
            sq_psn,
            PathMtu::Mtu256,
            RetryConfig::RC_PINGPONG,
        ) {
            endpoint
                .modify_qp(now, qpn, &attr)
                .map_err(io::Error::other)?;
        }
        if service == Service::Send {
            for wr_id in 0..RECEIVES as u64 {
                let wr = RecvWr {
                    wr_id,
                    sg_list: [Sge {
                        addr: BUFFER_AT,
                        length: SEND_SIZE as u32,
                        lkey: key,
                    }]
                    .into(),
                };
                endpoint
                    .post_recv(now, qpn, &wr)
                    .map_err(io::Error::other)?;
            }
        }
        Ok(Box::new(MemorySession {
            engine: self.engine.clone(),
            remote: Remote {
                qpn,
                psn: sq_psn,
                rkey: key,
                vaddr: BUFFER_AT,
                mtu: 256,
            },
        }))
    }
}

struct MemorySession {
    engine: Shared,
    remote: Remote,
}

impl Session for MemorySession {
    fn remote(&self) -> Remote {
        self.remote
    }

    fn close(self: Box<Self>) -> io::Result<()> {
        let mut engine = self
            .engine
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?;
        engine.endpoint().destroy_qp(self.remote.qpn);
        Ok(())
    }
}

/// Turns the target's engine at most this many times per look for answers (each turn takes
/// up to a budget of frames in and out; a scenario sends a handful).
const TURNS_PER_LOOK: usize = 16;

/// Our end of the wire, which lets the target process everything sent to it before each
/// look for its answers: what the link sees then depends on what was sent, not on when the
/// target's thread got the CPU (the thread still serves timers in between).
struct DrivesTheTarget {
    inner: Box<dyn Backend>,
    engine: Shared,
}

impl Backend for DrivesTheTarget {
    fn receive(&mut self, budget: usize, handler: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        {
            let mut engine = self
                .engine
                .lock()
                .map_err(|_| io::Error::other("poisoned"))?;
            for _ in 0..TURNS_PER_LOOK {
                engine.poll()?;
                // Work left for the next turn shows as a poll timeout that is already due.
                if engine.poll_timeout().is_none_or(|at| at > Instant::now()) {
                    break;
                }
            }
        }
        self.inner.receive(budget, handler)
    }

    fn transmit(
        &mut self,
        len: usize,
        flow: u16,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> io::Result<()> {
        self.inner.transmit(len, flow, fill)
    }

    fn submit(&mut self) -> io::Result<()> {
        self.inner.submit()
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.inner.wait(timeout)
    }
}

/// The PSN and opcode of a RoCEv2 frame, if it is one.
fn bth(frame: &[u8]) -> Option<(Opcode, Psn)> {
    let frame = Frame::new_checked(frame).ok()?;
    Some((frame.opcode(), frame.bth().psn()))
}

/// Rewrites a frame's PSN and its ICRC to match.
fn set_psn(frame: &mut [u8], psn: Psn) {
    let Some(at) = Offsets::of(frame) else {
        return;
    };
    frame[at.bth + 9..at.bth + 12].copy_from_slice(&psn.value().to_be_bytes()[1..]);
    let end = frame.len() - ICRC_LEN;
    if let Ok(value) = icrc::compute(&frame[at.ip..end]) {
        frame[end..].copy_from_slice(&icrc::to_bytes(value));
    }
}

/// A responder that executes a duplicate atomic again instead of returning the saved
/// result: it moves the duplicate to the PSN the responder expects (so it runs as a new
/// request), and moves the answer back.
struct ReexecutesDuplicateAtomics {
    inner: Box<dyn Backend>,
    atomics_seen: HashSet<u32>,
    next: Option<Psn>,
    moved: HashMap<u32, Psn>,
}

impl Backend for ReexecutesDuplicateAtomics {
    fn transmit(
        &mut self,
        len: usize,
        flow: u16,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> io::Result<()> {
        let moved = &mut self.moved;
        self.inner.transmit(len, flow, &mut |buffer| {
            let len = fill(buffer);
            let frame = &mut buffer[..len];
            if let Some((Opcode::RcAtomicAcknowledge, psn)) = bth(frame) {
                if let Some(original) = moved.remove(&psn.value()) {
                    set_psn(frame, original);
                }
            }
            len
        })
    }

    fn submit(&mut self) -> io::Result<()> {
        self.inner.submit()
    }

    fn receive(&mut self, budget: usize, handler: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let (seen, next, moved) = (&mut self.atomics_seen, &mut self.next, &mut self.moved);
        self.inner.receive(budget, &mut |frame| {
            let mut frame = frame.to_vec();
            match bth(&frame) {
                Some((Opcode::RcFetchAdd | Opcode::RcCompareSwap, psn)) => match *next {
                    Some(expected) if !seen.insert(psn.value()) => {
                        moved.insert(expected.value(), psn);
                        set_psn(&mut frame, expected);
                        *next = Some(expected + 1);
                    }
                    _ => *next = Some(psn + 1),
                },
                Some((opcode, psn)) if opcode.info().is_request => *next = Some(psn + 1),
                _ => {}
            }
            handler(&frame);
        })
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.inner.wait(timeout)
    }
}

/// A responder that answers nothing from the `left`th frame it receives on.
struct DiesAfter {
    inner: Box<dyn Backend>,
    left: usize,
}

impl Backend for DiesAfter {
    fn transmit(
        &mut self,
        len: usize,
        flow: u16,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> io::Result<()> {
        if self.left == 0 {
            // Built and thrown away: the target has died.
            fill(&mut vec![0; len]);
            return Ok(());
        }
        self.inner.transmit(len, flow, fill)
    }

    fn submit(&mut self) -> io::Result<()> {
        self.inner.submit()
    }

    fn receive(&mut self, budget: usize, handler: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let left = &mut self.left;
        self.inner.receive(budget, &mut |frame| {
            *left = left.saturating_sub(1);
            handler(frame);
        })
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.inner.wait(timeout)
    }
}

fn named(names: &[&str]) -> Vec<&'static Scenario> {
    names
        .iter()
        .map(|name| SCENARIOS.iter().find(|s| s.name == *name).unwrap())
        .collect()
}

fn verdict_of<'a>(out: &'a str, name: &str) -> &'a str {
    let line = out
        .lines()
        .find(|line| line.starts_with(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no line for {name}:\n{out}"));
    line.split(' ').nth(3).unwrap()
}

#[test]
fn our_transport_in_memory_passes_all_but_the_documented_deviations() {
    // The UD scenarios need a pingpong server's UD QP, which this target does not play
    // (tools/tests/conform.rs runs them against `roce pingpong --ud`).
    let all: Vec<&Scenario> = SCENARIOS
        .iter()
        .filter(|scenario| scenario.service != Service::Ud)
        .collect();
    let (summary, out) = MemoryTarget::suite(|backend| backend, &all);
    assert_eq!(summary.scenarios, all.len(), "{out}");
    assert_eq!(summary.broke, 0, "{out}");
    for scenario in all {
        let expected = if scenario.name.starts_with("reserved_opcode") {
            "DEVIATES"
        } else {
            "PASS"
        };
        assert_eq!(verdict_of(&out, scenario.name), expected, "{out}");
    }
}

#[test]
fn a_responder_that_reexecutes_duplicate_atomics_is_reported_as_deviating() {
    let wrong = |inner| -> Box<dyn Backend> {
        Box::new(ReexecutesDuplicateAtomics {
            inner,
            atomics_seen: HashSet::new(),
            next: None,
            moved: HashMap::new(),
        })
    };
    let scenarios = named(&["fetch_add", "duplicate_atomic", "compare_swap"]);
    let (summary, out) = MemoryTarget::suite(wrong, &scenarios);
    assert_eq!(verdict_of(&out, "fetch_add"), "PASS", "{out}");
    assert_eq!(verdict_of(&out, "compare_swap"), "PASS", "{out}");
    assert!(
        out.contains(
            "duplicate_atomic expected=ATOMIC_ACK@0=o,ATOMIC_ACK@0=o,ATOMIC_ACK@1=o+1 \
             observed=ATOMIC_ACK@0=o,ATOMIC_ACK@0=o+1,ATOMIC_ACK@1=o+1 DEVIATES"
        ),
        "the second answer is a second add:\n{out}"
    );
    assert_eq!((summary.deviate, summary.broke), (1, 0), "{out}");
}

#[test]
fn a_responder_that_stops_answering_is_reported_broken_and_the_suite_stops() {
    // The first scenario and its liveness probe send one frame each; the third one kills.
    let dies = |inner| -> Box<dyn Backend> { Box::new(DiesAfter { inner, left: 3 }) };
    let scenarios = named(&["write_only", "psn_ahead", "duplicate_write"]);
    let (summary, out) = MemoryTarget::suite(dies, &scenarios);
    assert_eq!(verdict_of(&out, "write_only"), "PASS", "{out}");
    assert!(
        out.contains(
            "psn_ahead expected=NAK_SEQ@0,ACK@0 observed=none,none BROKE after=write_only:none"
        ),
        "{out}"
    );
    assert!(
        !out.contains("duplicate_write"),
        "stops at the first BROKE:\n{out}"
    );
    assert_eq!(
        summary,
        Summary {
            scenarios: 2,
            pass: 1,
            deviate: 0,
            broke: 1
        }
    );
}

fn fuzz_config(seed: u64, packets: u64, findings: &std::path::Path) -> super::fuzz::Config {
    super::fuzz::Config {
        seed,
        packets,
        duration: None,
        batch: 25,
        services: vec![
            Service::Write,
            Service::Read,
            Service::Atomic,
            Service::Send,
        ],
        options: Options {
            send_size: SEND_SIZE,
            check: None,
        },
        findings: findings.to_path_buf(),
    }
}

#[test]
fn fuzzing_our_transport_in_memory_finds_nothing() {
    let (mut target, mut link) = MemoryTarget::start(|backend| backend);
    link.wait = Duration::from_millis(5);
    let dir = tempfile::tempdir().unwrap();
    let mut updates = 0;
    let report = super::fuzz::fuzz(
        &mut target,
        &mut link,
        &fuzz_config(7, 400, dir.path()),
        &mut |_| updates += 1,
    )
    .unwrap();
    assert_eq!(report.packets, 400);
    assert_eq!(report.findings, 0, "{report}");
    assert_eq!(report.connections, 400 / 25, "full batches");
    assert_eq!(updates, 400, "progress after every packet");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn a_finding_is_saved_with_its_anchor_and_replays_on_a_fresh_connection() {
    // Dies in the middle of the first batch: the liveness check after it fails.
    let dies = |inner| -> Box<dyn Backend> { Box::new(DiesAfter { inner, left: 10 }) };
    let (mut target, mut link) = MemoryTarget::start(dies);
    link.wait = Duration::from_millis(5);
    let dir = tempfile::tempdir().unwrap();
    let report = super::fuzz::fuzz(
        &mut target,
        &mut link,
        &fuzz_config(3, 400, dir.path()),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!((report.findings, report.connections), (1, 1), "{report}");
    let path = dir.path().join("finding-3-1.pcap");
    let frames: Vec<Vec<u8>> = roce_provider::capture::read_frames(&path)
        .unwrap()
        .into_iter()
        .map(|frame| frame.data)
        .collect();
    assert_eq!(frames.len(), 1 + 25, "the anchor and the batch");
    let anchor = super::fuzz::Anchor::of(&frames[0]).unwrap();
    assert_eq!(anchor.service, Service::Write, "the first service");

    // On an honest target, the same frames leave it working.
    let (mut honest, mut link) = MemoryTarget::start(|backend| backend);
    link.wait = Duration::from_millis(5);
    let options = Options {
        send_size: SEND_SIZE,
        check: None,
    };
    let mut out = Vec::new();
    let alive = super::fuzz::replay(&mut honest, &mut link, &frames, &options, &mut out).unwrap();
    let out = String::from_utf8(out).unwrap();
    assert!(alive, "{out}");
    assert!(
        out.starts_with("0 answers=ACK@0\n"),
        "the anchor works again:\n{out}"
    );
    assert!(out.ends_with("replayed=26 status=ok\n"), "{out}");
}

#[test]
fn retargeting_moves_the_connection_and_keeps_a_wrong_icrc_wrong() {
    let (_target, link) = MemoryTarget::start(|backend| backend);
    let from = super::fuzz::Anchor {
        service: Service::Write,
        qpn: 0x11,
        psn: Psn::new(100),
        memory: Some((0xAAAA, 0x1000)),
    };
    let to = super::fuzz::Anchor {
        service: Service::Write,
        qpn: 0x22,
        psn: Psn::new(0xFF_FFFE),
        memory: Some((0xBBBB, 0x9000)),
    };
    let mut packet = super::link::Packet::new(Opcode::RcRdmaWriteOnly, 0x11, Psn::new(103));
    packet.ext.reth = Some(roce_wire::reth::Repr {
        virtual_address: 0x1008,
        rkey: 0xAAAA ^ 4,
        dma_length: 0,
    });
    let good = link.emit(&packet, 1).unwrap();
    let bad = link
        .emit(&packet.clone().damaged(super::link::Damage::Icrc(0x10)), 1)
        .unwrap();
    for (frame, right) in [(good, true), (bad, false)] {
        let moved = super::fuzz::retarget(&frame, &from, &to, &link);
        let checked = Frame::new_checked(&moved[..]).unwrap();
        assert_eq!(checked.bth().dest_qpn(), 0x22);
        assert_eq!(checked.bth().psn(), Psn::new(1), "3 after 0xFFFFFE");
        assert_eq!(checked.check_icrc().is_ok(), right);
        let repr = roce_wire::FrameRepr::parse_ignoring_icrc(&checked).unwrap();
        let reth = repr.ext.reth.unwrap();
        assert_eq!((reth.virtual_address, reth.rkey), (0x9008, 0xBBBB ^ 4));
        if !right {
            assert_eq!(checked.computed_icrc() ^ checked.received_icrc(), 0x10);
        }
    }
}
