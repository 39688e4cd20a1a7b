//! The device switch over an in-memory wire, with clients in this process: what it steers
//! where (by QP block, by CM ID, by listened service), what never reaches the wire (frames
//! between clients), what it refuses (another client's identity), a client that stops
//! reading (its frames dropped and counted, the others' all delivered), a client that goes
//! (what it sent last still leaves; its block's frames are dropped and counted), and a
//! switch that goes (the device is lost).
//!
//! The switch listens on an abstract Unix socket of this network namespace, named after a
//! made-up interface unique to each test; nothing touches a network.

use std::io;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use roce_provider::backend::{is_device_lost, Backend};
use roce_provider::memory::{memory_pair, MemoryBackend};
use roce_provider::switch::{
    Identity, Switch, SwitchBackend, SwitchClient, SwitchConfig, SwitchStats,
};
use roce_wire::cm::{attribute, PortSpace, ServiceId, MGMT_CLASS};
use roce_wire::{bth, deth, mad, ExtHeader, ExtRepr, FrameRepr, Opcode, Psn};

const MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const PEER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
const PEER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const OURS: ([u8; 6], Ipv4Addr) = (MAC, IP);
const PEER: ([u8; 6], Ipv4Addr) = (PEER_MAC, PEER_IP);

/// A running switch, the wire's other end, and how to reach it.
struct Running {
    name: String,
    ifindex: u32,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<io::Result<()>>>,
    wire: MemoryBackend,
}

impl Running {
    fn start() -> Running {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let serial = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("sw{}-{serial}", std::process::id());
        let ifindex = 0x7000_0000 + serial;
        let (ours, wire) = memory_pair();
        let config = SwitchConfig {
            interface: name.clone(),
            ifindex,
            identity: Identity {
                mac: MAC,
                gids: vec![IP.to_ipv6_mapped().octets()],
            },
            mode: None,
            on_demand: false,
            lend: false,
            spin: Duration::ZERO,
        };
        let mut switch = Switch::with_backend(config, Box::new(ours)).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || switch.run(&stop))
        };
        Running {
            name,
            ifindex,
            stop,
            thread: Some(thread),
            wire,
        }
    }

    /// A client attached to it, and its backend.
    fn client(&self) -> (Arc<SwitchClient>, SwitchBackend, u8) {
        let client = SwitchClient::new(&self.name, self.ifindex, None, None).unwrap();
        let slot = client.claim().unwrap();
        let backend = SwitchBackend::new(Arc::clone(&client));
        (client, backend, slot)
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap().unwrap();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A RoCEv2 frame from `src` to `dst`: `opcode` to `dest_qpn`, a DETH from `src_qpn`
/// when the opcode has one, then `payload`.
fn frame(
    src: ([u8; 6], Ipv4Addr),
    dst: ([u8; 6], Ipv4Addr),
    opcode: Opcode,
    dest_qpn: u32,
    src_qpn: u32,
    payload: &[u8],
) -> Vec<u8> {
    let mut repr = FrameRepr::ipv4(
        src,
        dst,
        bth::Repr::new(opcode, dest_qpn, Psn::new(7)),
        ExtRepr::default(),
        payload,
    );
    if opcode.info().headers.contains(&ExtHeader::Deth) {
        repr.ext.deth = Some(deth::Repr {
            qkey: mad::GSI_QKEY,
            src_qpn,
        });
    }
    let mut bytes = vec![0; repr.buffer_len()];
    let len = repr.emit(&mut bytes).unwrap();
    bytes.truncate(len);
    bytes
}

/// An RC SEND from the peer to QP `qpn`, its payload tagged with `tag`.
fn from_peer(qpn: u32, tag: u32) -> Vec<u8> {
    frame(PEER, OURS, Opcode::RcSendOnly, qpn, 0, &tag.to_be_bytes())
}

/// A CM MAD with attribute `attr`, our ID `local` first, `remote` next, `service` after.
fn cm_mad(attr: u16, local: u32, remote: u32, service: ServiceId) -> Vec<u8> {
    let mut bytes = vec![0u8; mad::MAD_LEN];
    bytes[..4].copy_from_slice(&[mad::BASE_VERSION, MGMT_CLASS, 2, mad::METHOD_SEND]);
    bytes[16..18].copy_from_slice(&attr.to_be_bytes());
    let data = &mut bytes[mad::HEADER_LEN..];
    data[0..4].copy_from_slice(&local.to_be_bytes());
    data[4..8].copy_from_slice(&remote.to_be_bytes());
    data[8..16].copy_from_slice(&service.0.to_be_bytes());
    bytes
}

/// Every frame `backend` takes within `wait` (until `count` if given).
fn take(backend: &mut dyn Backend, count: Option<usize>, wait: Duration) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + wait;
    let mut frames = Vec::new();
    while Instant::now() < deadline && count.is_none_or(|count| frames.len() < count) {
        let taken = backend
            .receive(256, &mut |frame| frames.push(frame.to_vec()))
            .unwrap();
        if taken == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    frames
}

/// The tags of RC SENDs (the payload's first word).
fn tags(frames: &[Vec<u8>]) -> Vec<u32> {
    frames
        .iter()
        .map(|bytes| {
            let frame = roce_wire::Frame::new_checked(&bytes[..]).unwrap();
            let payload = frame.payload();
            u32::from_be_bytes(payload[..4].try_into().unwrap())
        })
        .collect()
}

/// The switch's counters once `done` holds for them (bounded).
fn stats_when(client: &SwitchClient, done: impl Fn(&SwitchStats) -> bool) -> SwitchStats {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stats = client.stats().expect("attached");
        if done(&stats) || Instant::now() > deadline {
            return stats;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn frames_go_to_the_process_that_owns_their_qp_or_cm_id_or_service() {
    let mut switch = Running::start();
    let (one, mut one_backend, one_slot) = switch.client();
    let (two, mut two_backend, two_slot) = switch.client();
    assert_ne!(one_slot, two_slot);
    let qp = |slot: u8, n: u32| (u32::from(slot) << 16) | (0x11 + n);
    for tag in 0..10 {
        let slot = if tag % 2 == 0 { one_slot } else { two_slot };
        switch.wire.send(&from_peer(qp(slot, tag), tag)).unwrap();
    }
    // A block nobody owns.
    switch.wire.send(&from_peer(qp(77, 0), 99)).unwrap();
    let got_one = take(&mut one_backend, Some(5), Duration::from_secs(5));
    let got_two = take(&mut two_backend, Some(5), Duration::from_secs(5));
    assert_eq!(tags(&got_one), [0, 2, 4, 6, 8]);
    assert_eq!(tags(&got_two), [1, 3, 5, 7, 9]);

    // CM: answers by the ID they answer, requests by the listener of their service.
    let service = ServiceId::rdma_ip(PortSpace::Tcp, 4791);
    two.listen(service.0).unwrap();
    let taken = one.listen(service.0).unwrap_err();
    assert_eq!(taken.raw_os_error(), Some(libc::EADDRINUSE), "one listener");
    let req = cm_mad(attribute::REQ, 0x0800_0001, 0, service);
    let rep = cm_mad(
        attribute::REP,
        0x0800_0002,
        u32::from(one_slot) << 24 | 5,
        service,
    );
    let unheard = cm_mad(attribute::REQ, 0x0800_0003, 0, ServiceId(1));
    let [req, rep, unheard] =
        [&req, &rep, &unheard].map(|mad| frame(PEER, OURS, Opcode::UdSendOnly, 1, 1, mad));
    for frame in [&req, &rep, &unheard] {
        switch.wire.send(frame).unwrap();
    }
    let cm_one = take(&mut one_backend, Some(1), Duration::from_secs(5));
    let cm_two = take(&mut two_backend, Some(1), Duration::from_secs(5));
    assert_eq!(cm_one, [rep], "the REP to one's connection");
    assert_eq!(cm_two, [req], "the REQ to two's service");
    // Nobody listens on the other service: held a while for a listener, then dropped.
    let stats = stats_when(&one, |stats| stats.dropped_no_listener == 1);
    assert_eq!(stats.dropped_no_listener, 1, "{stats:?}");
    assert_eq!(stats.dropped_no_owner, 1, "{stats:?}");
    assert_eq!((stats.steered, stats.clients), (12, 2), "{stats:?}");
    // Nothing went back out, and nothing more came in.
    assert!(take(&mut switch.wire, None, Duration::from_millis(50)).is_empty());
    assert!(take(&mut one_backend, None, Duration::from_millis(50)).is_empty());
    assert!(take(&mut two_backend, None, Duration::from_millis(50)).is_empty());
    switch.stop();
}

#[test]
fn frames_between_processes_never_reach_the_wire_and_nobody_sends_as_another() {
    let mut switch = Running::start();
    let (one, mut one_backend, one_slot) = switch.client();
    let (_two, mut two_backend, two_slot) = switch.client();
    let two_qp = (u32::from(two_slot) << 16) | 0x11;
    let one_qp = (u32::from(one_slot) << 16) | 0x11;
    // To our own MAC: the switch's loopback, into the other's ring.
    let looped = frame(
        OURS,
        OURS,
        Opcode::RcSendOnly,
        two_qp,
        0,
        &42u32.to_be_bytes(),
    );
    one_backend.send(&looped).unwrap();
    let got = take(&mut two_backend, Some(1), Duration::from_secs(5));
    assert_eq!(got, [looped]);
    // UD from the other's QP, or from an address not ours: refused.
    let spoofed = frame(OURS, PEER, Opcode::UdSendOnly, 0x11, two_qp, b"x");
    one_backend.send(&spoofed).unwrap();
    let foreign = frame(
        ([2, 9, 9, 9, 9, 9], IP),
        PEER,
        Opcode::RcSendOnly,
        0x11,
        0,
        b"x",
    );
    one_backend.send(&foreign).unwrap();
    // CM messages carry our own ID, or they are refused.
    let service = ServiceId::rdma_ip(PortSpace::Tcp, 1);
    let other_id = cm_mad(attribute::REQ, u32::from(two_slot) << 24 | 1, 0, service);
    let own_id = cm_mad(attribute::REQ, u32::from(one_slot) << 24 | 1, 0, service);
    for mad in [&other_id, &own_id] {
        one_backend
            .send(&frame(OURS, PEER, Opcode::UdSendOnly, 1, 1, mad))
            .unwrap();
    }
    // Our own UD QP to the peer: out on the wire.
    let mine = frame(OURS, PEER, Opcode::UdSendOnly, 0x11, one_qp, b"ok");
    one_backend.send(&mine).unwrap();
    let out = take(&mut switch.wire, Some(2), Duration::from_secs(5));
    assert_eq!(out.len(), 2, "only the REQ with our ID and our UD SEND");
    assert!(out.contains(&mine));
    let stats = stats_when(&one, |stats| stats.tx_refused == 3);
    assert_eq!(
        (stats.tx_refused, stats.client_refused),
        (3, 3),
        "{stats:?}"
    );
    assert_eq!(
        (stats.looped, stats.wire_tx, stats.wire_rx),
        (1, 2, 0),
        "{stats:?}"
    );
    switch.stop();
}

#[test]
fn a_process_that_stops_reading_loses_its_frames_and_slows_nobody() {
    let mut switch = Running::start();
    let (one, mut one_backend, one_slot) = switch.client();
    let (_stuck, _stuck_backend, stuck_slot) = switch.client();
    let (one_qp, stuck_qp) = (
        (u32::from(one_slot) << 16) | 0x11,
        (u32::from(stuck_slot) << 16) | 0x11,
    );
    // 1 KiB frames: the stuck process's ring (4 MiB) holds fewer than 4,000.
    let big = |qp: u32, tag: u32| {
        let mut payload = vec![0u8; 1024];
        payload[..4].copy_from_slice(&tag.to_be_bytes());
        frame(PEER, OURS, Opcode::RcSendOnly, qp, 0, &payload)
    };
    let (mut sent, mut got) = (0u32, Vec::new());
    let deadline = Instant::now() + Duration::from_secs(20);
    while sent < 6000 && Instant::now() < deadline {
        let frame = if sent % 10 == 0 {
            big(one_qp, sent)
        } else {
            big(stuck_qp, sent)
        };
        match switch.wire.send(&frame) {
            Ok(()) => sent += 1,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
            Err(error) => panic!("{error}"),
        }
        // The reading process keeps up.
        one_backend
            .receive(64, &mut |frame| got.push(frame.to_vec()))
            .unwrap();
    }
    assert_eq!(sent, 6000);
    got.extend(take(
        &mut one_backend,
        Some(600 - got.len()),
        Duration::from_secs(5),
    ));
    let expected: Vec<u32> = (0..6000).step_by(10).collect();
    assert_eq!(
        tags(&got),
        expected,
        "every frame of the process that reads"
    );
    let stats = stats_when(&one, |stats| {
        stats.steered + stats.dropped_ring_full == 6000
    });
    assert!(stats.dropped_ring_full > 1000, "{stats:?}");
    assert_eq!(stats.steered + stats.dropped_ring_full, 6000, "{stats:?}");
    switch.stop();
}

#[test]
fn a_process_that_goes_frees_its_block_and_a_switch_that_goes_loses_the_device() {
    let mut switch = Running::start();
    let (one, mut one_backend, _) = switch.client();
    let (two, mut two_backend, two_slot) = switch.client();
    // What it sent just before it went still leaves (a DREQ before exit), though the
    // switch, asleep, hears of the frame and of the end at once.
    std::thread::sleep(Duration::from_millis(50));
    let last_words = frame(OURS, PEER, Opcode::RcSendOnly, 0x11, 0, b"bye");
    two_backend.send(&last_words).unwrap();
    drop(two_backend);
    drop(two);
    assert_eq!(
        take(&mut switch.wire, Some(1), Duration::from_secs(5)),
        [last_words]
    );
    let stats = stats_when(&one, |stats| stats.clients == 1);
    assert_eq!((stats.clients, stats.clients_lost), (1, 1), "{stats:?}");
    let two_qp = (u32::from(two_slot) << 16) | 0x11;
    switch.wire.send(&from_peer(two_qp, 1)).unwrap();
    let stats = stats_when(&one, |stats| stats.dropped_no_owner == 1);
    assert_eq!(stats.dropped_no_owner, 1, "{stats:?}");
    // A newcomer gets another block: late frames for the gone process find nobody.
    let (_three, _three_backend, three_slot) = switch.client();
    assert_ne!(three_slot, two_slot);

    switch.stop();
    let deadline = Instant::now() + Duration::from_secs(5);
    let lost = loop {
        match one_backend.receive(16, &mut |_| {}) {
            Err(error) => break error,
            Ok(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(_) => panic!("the switch's end was not noticed"),
        }
    };
    assert!(is_device_lost(&lost), "{lost}");
    assert!(one.is_lost());
    // Once: a dark wire from then on, sends go nowhere.
    assert_eq!(one_backend.receive(16, &mut |_| {}).unwrap(), 0);
    one_backend.send(&from_peer(1, 1)).unwrap();
    assert!(one.claim().is_err(), "no switch to claim from");
}
