//! Helpers shared by the simulator tests: work requests, waits bounded in steps, a frame tap,
//! and forged frames for `Endpoint::handle_packet`.

// Each test binary includes this module and uses a different part of it.
#![allow(dead_code)]

use std::cell::RefCell;
use std::net::Ipv4Addr;
use std::rc::Rc;

use roce_transport::cq::{WcStatus, WorkCompletion};
use roce_transport::qp_state::{PathMtu, QpState, QpType};
use roce_transport::sim::{LinkConfig, RetryConfig, Sim};
#[allow(unused_imports)] // as dead_code above: not every test binary posts
pub use roce_transport::wr::signaled;
use roce_transport::wr::{RecvWr, SendOp, Sge};
use roce_transport::Transmit;
use roce_wire::aeth::Syndrome;
use roce_wire::{bth, ExtRepr, FrameRepr, Opcode, Psn};

/// The requester's node (node indices are fixed by the order of `add_node`).
pub const A: usize = 0;
/// The responder's node.
pub const B: usize = 1;
/// Step bound of every wait: far more than any scenario needs.
pub const STEPS: u64 = 200_000;
/// Where test data lives at A.
pub const SRC: u64 = 0x1_0000;
/// Where targets and receive buffers live at B.
pub const DST: u64 = 0x10_0000;
/// A second buffer at B.
pub const DST2: u64 = 0x20_0000;

/// Bytes that differ from their neighbours and between seeds, so misplaced data shows.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// One scatter/gather entry (lengths given as `usize` to save casts at call sites).
pub fn sge(addr: u64, length: usize, lkey: u32) -> Sge {
    Sge {
        addr,
        length: length as u32,
        lkey,
    }
}

/// A receive work request with one SGE.
pub fn recv_wr(wr_id: u64, sge: Sge) -> RecvWr {
    RecvWr {
        wr_id,
        sg_list: [sge].into(),
    }
}

/// The QP's current state.
pub fn state(sim: &Sim, node: usize, qpn: u32) -> QpState {
    sim.nodes[node].endpoint.qp_state(qpn).expect("QP exists")
}

/// (wr_id, status) of each completion, for compact assertions.
pub fn summary(completions: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    completions.iter().map(|c| (c.wr_id, c.status)).collect()
}

/// Runs until `node`'s send CQ has given `n` completions; fails the test if it never does.
pub fn wait_send(sim: &mut Sim, node: usize, n: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let done = sim.run_until(STEPS, |sim| {
        out.extend(sim.poll_send(node));
        out.len() >= n
    });
    assert!(done, "waited for {n} send completions, got {out:?}");
    out
}

/// Runs until `node`'s receive CQ has given `n` completions; fails the test if it never does.
pub fn wait_recv(sim: &mut Sim, node: usize, n: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let done = sim.run_until(STEPS, |sim| {
        out.extend(sim.poll_recv(node));
        out.len() >= n
    });
    assert!(done, "waited for {n} receive completions, got {out:?}");
    out
}

/// Runs until nothing is left to happen, or for `STEPS` steps if something keeps going.
pub fn settle(sim: &mut Sim) {
    sim.run_until(STEPS, |_| false);
}

/// What the network was handed: one frame, as the drop filter saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub from: usize,
    pub opcode: Opcode,
    pub psn: Psn,
    pub syndrome: Option<Syndrome>,
    pub ack_req: bool,
    pub dropped: bool,
}

pub type Log = Rc<RefCell<Vec<Seen>>>;

/// Records every frame and drops those `drop` picks; `drop` is shown the frame and every
/// frame before it.
pub fn tap(sim: &mut Sim, mut drop: impl FnMut(&Seen, &[Seen]) -> bool + 'static) -> Log {
    let log: Log = Rc::default();
    let writer = log.clone();
    sim.drop_filter = Some(Box::new(move |from, _to, frame: &FrameRepr<'_>| {
        let mut seen = Seen {
            from,
            opcode: frame.bth.opcode,
            psn: frame.bth.psn,
            syndrome: frame.ext.aeth.map(|aeth| aeth.syndrome),
            ack_req: frame.bth.ack_req,
            dropped: false,
        };
        let mut log = writer.borrow_mut();
        seen.dropped = drop(&seen, &log);
        log.push(seen.clone());
        seen.dropped
    }));
    log
}

/// Frames in `log` sent by `from` with `opcode`.
pub fn count(log: &Log, from: usize, opcode: Opcode) -> usize {
    log.borrow()
        .iter()
        .filter(|s| s.from == from && s.opcode == opcode)
        .count()
}

/// The frame a receiver would have parsed for `transmit` from host `src` to host `dst`
/// (10.0.0.x, as the simulator numbers its nodes).
pub fn received_frame(transmit: &Transmit, [src, dst]: [u8; 2]) -> FrameRepr<'_> {
    FrameRepr {
        udp_src_port: 0xC000 | (transmit.src_qpn as u16 & 0x3FFF),
        ..FrameRepr::ipv4(
            ([0x02, 0, 0, 0, 0, src], Ipv4Addr::new(10, 0, 0, src)),
            ([0x02, 0, 0, 0, 0, dst], Ipv4Addr::new(10, 0, 0, dst)),
            transmit.packet.bth,
            transmit.packet.ext,
            &transmit.packet.payload,
        )
    }
}

/// A frame from `from` to `to` that no QP sent, for `Endpoint::handle_packet`.
pub fn forged<'a>(
    sim: &Sim,
    from: usize,
    to: usize,
    bth: bth::Repr,
    ext: ExtRepr,
    payload: &'a [u8],
) -> FrameRepr<'a> {
    FrameRepr::ipv4(
        ([2, 0, 0, 0, 0, from as u8 + 1], sim.nodes[from].ip),
        ([2, 0, 0, 0, 0, to as u8 + 1], sim.nodes[to].ip),
        bth,
        ext,
        payload,
    )
}

/// A BTH for a forged frame: default P_Key, the pad `payload_len` needs, and `ack_req` as
/// given.
pub fn forged_bth(
    opcode: Opcode,
    dest_qpn: u32,
    psn: Psn,
    payload_len: usize,
    ack_req: bool,
) -> bth::Repr {
    bth::Repr {
        pad_count: ((4 - payload_len % 4) % 4) as u8,
        ack_req,
        ..bth::Repr::new(opcode, dest_qpn, psn)
    }
}

/// A [`RetryConfig`] with these retry counts, the rest default.
pub fn retry(retry_cnt: u8, rnr_retry: u8) -> RetryConfig {
    RetryConfig {
        retry_cnt,
        rnr_retry,
        ..RetryConfig::default()
    }
}

/// A clean two-node network (simulator seed `seed`) with one connected pair of `qp_type`
/// from A to B, path MTU 1024: the simulator, A's QP and B's. Losses come from a [`tap`].
pub fn pair(seed: u64, qp_type: QpType, retry: RetryConfig) -> (Sim, u32, u32) {
    let mut sim = Sim::new(LinkConfig::default(), seed);
    assert_eq!((sim.add_node(), sim.add_node()), (A, B));
    let pair = sim.connect(A, B, qp_type, PathMtu::Mtu1024, retry);
    (sim, pair.a.1, pair.b.1)
}

/// Posts a receive (wr_id 9) of `len` bytes at B's `DST` and a signaled SEND (wr_id 1) of
/// `len` pattern bytes (`seed`) from A's `SRC`: the bytes sent and B's region.
pub fn post_send_into_recv(
    sim: &mut Sim,
    (qa, qb): (u32, u32),
    len: usize,
    seed: u8,
) -> (Vec<u8>, u32) {
    let data = pattern(len, seed);
    let key = sim.reg(A, SRC, &data);
    let dst = sim.reg(B, DST, &vec![0; len]);
    sim.post_recv(B, qb, &recv_wr(9, sge(DST, len, dst)))
        .unwrap();
    sim.post_send(A, qa, &signaled(1, SendOp::Send, sge(SRC, len, key)))
        .unwrap();
    (data, dst)
}
