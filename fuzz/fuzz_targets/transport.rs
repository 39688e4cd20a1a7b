//! Hostile traffic against the transport's state machines: two endpoints with a connected RC
//! pair, a connected UC pair and a UD QP each exchange real packets, and the fuzzer decides
//! the path MTU and retry settings, what is posted on which QP, which packets arrive, when
//! time passes, and which real packets come back with a byte changed (as a hostile or broken
//! peer would send them; the ICRC is not checked under `cfg(fuzzing)`). Nothing may panic,
//! no work request may complete twice, and no responder's queued output may exceed its
//! bound (replays of real READ requests are duplicates that ask for responses again).
#![no_main]

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use roce_transport::cq::WorkCompletion;
use roce_transport::qp::QpCaps;
use roce_transport::qp_state::{PathMtu, QpAttr, QpState, QpType};
use roce_transport::sim::{LinkConfig, RetryConfig, Sim};
use roce_transport::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest};
use roce_wire::aeth::RnrTimer;
use roce_wire::{Frame, FrameRepr};

/// Bytes of the region each side registers.
const REGION: u64 = 64 * 1024;
const BASE: u64 = 0x10_0000;
/// Real packets kept to replay with a change.
const KEPT: usize = 16;

/// How the two endpoints are set up.
#[derive(Arbitrary, Debug)]
struct Setup {
    mtu: u8,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    min_rnr_timer: u8,
}

#[derive(Arbitrary, Debug)]
enum Action {
    /// A signaled send work request on one side's QP (RC, UC or UD by `qp`).
    Post {
        from_b: bool,
        qp: u8,
        op: u8,
        len: u16,
        local: u16,
        remote: u16,
    },
    /// A receive on one side's QP.
    Receive {
        on_b: bool,
        qp: u8,
        len: u16,
        at: u16,
    },
    /// One packet one side has to send: delivered to the other, or lost.
    Step { from_b: bool, deliver: bool },
    /// A packet seen before, with one byte changed, to either side.
    Replay {
        to_b: bool,
        which: u8,
        at: u16,
        xor: u8,
    },
    /// Time passes; timers run.
    Tick { micros: u32 },
    /// A side's QP goes to ERR (flushing its work).
    Fail { on_b: bool, qp: u8 },
    /// A side's QP is asked to go to any state, with no further attributes (most such
    /// transitions are refused; some, like to RESET or SQD, are not).
    Modify { on_b: bool, qp: u8, state: u8 },
    /// A side's QP is destroyed: what still arrives for it is for a QP that does not exist.
    Destroy { on_b: bool, qp: u8 },
}

/// QPs per side: RC, UC, UD.
const QPS: usize = 3;
const UD_QKEY: u32 = 0x1111;

struct World {
    sim: Sim,
    /// QP numbers by side and kind (RC, UC, UD).
    qpn: [[u32; QPS]; 2],
    key: [u32; 2],
    kept: Vec<Vec<u8>>,
    next_id: u64,
    seen: [HashSet<(u64, bool)>; 2],
}

impl World {
    fn new(setup: &Setup) -> World {
        let mut sim = Sim::new(LinkConfig::default(), 7);
        let (a, b) = (sim.add_node(), sim.add_node());
        let mtu = [
            PathMtu::Mtu256,
            PathMtu::Mtu512,
            PathMtu::Mtu1024,
            PathMtu::Mtu2048,
            PathMtu::Mtu4096,
        ][usize::from(setup.mtu % 5)];
        let retry = RetryConfig {
            timeout: setup.timeout % 32,
            retry_cnt: setup.retry_cnt % 8,
            rnr_retry: setup.rnr_retry % 8,
            min_rnr_timer: RnrTimer::new(setup.min_rnr_timer % 32),
        };
        let rc = sim.connect(a, b, QpType::Rc, mtu, retry);
        let uc = sim.connect(a, b, QpType::Uc, mtu, retry);
        let caps = QpCaps::default();
        let (ud_a, ud_b) = (
            sim.create_qp(a, QpType::Ud, caps),
            sim.create_qp(b, QpType::Ud, caps),
        );
        sim.bring_up_ud(a, ud_a, UD_QKEY);
        sim.bring_up_ud(b, ud_b, UD_QKEY);
        let key_a = sim.reg(a, BASE, &vec![0x5A; REGION as usize]);
        let key_b = sim.reg(b, BASE, &vec![0xA5; REGION as usize]);
        World {
            sim,
            qpn: [[rc.a.1, uc.a.1, ud_a], [rc.b.1, uc.b.1, ud_b]],
            key: [key_a, key_b],
            kept: Vec::new(),
            next_id: 1,
            seen: [HashSet::new(), HashSet::new()],
        }
    }

    fn act(&mut self, action: Action) {
        match action {
            Action::Post {
                from_b,
                qp,
                op,
                len,
                local,
                remote,
            } => self.post(
                usize::from(from_b),
                usize::from(qp) % QPS,
                op,
                len,
                local,
                remote,
            ),
            Action::Receive { on_b, qp, len, at } => {
                self.receive(usize::from(on_b), usize::from(qp) % QPS, len, at)
            }
            Action::Step { from_b, deliver } => self.step(usize::from(from_b), deliver),
            Action::Replay {
                to_b,
                which,
                at,
                xor,
            } => self.replay(usize::from(to_b), which, at, xor),
            Action::Tick { micros } => {
                self.sim.now += Duration::from_micros(u64::from(micros % 2_000_000));
                let now = self.sim.now;
                for node in &mut self.sim.nodes {
                    node.endpoint.handle_timeout(now);
                }
            }
            Action::Fail { on_b, qp } => {
                self.modify(usize::from(on_b), usize::from(qp) % QPS, QpState::Err)
            }
            Action::Modify { on_b, qp, state } => {
                let states = [
                    QpState::Reset,
                    QpState::Init,
                    QpState::Rtr,
                    QpState::Rts,
                    QpState::Sqd,
                    QpState::Sqe,
                    QpState::Err,
                ];
                let state = states[usize::from(state) % states.len()];
                self.modify(usize::from(on_b), usize::from(qp) % QPS, state)
            }
            Action::Destroy { on_b, qp } => {
                let (side, kind) = (usize::from(on_b), usize::from(qp) % QPS);
                self.sim.nodes[side]
                    .endpoint
                    .destroy_qp(self.qpn[side][kind]);
            }
        }
        self.check_completions();
        self.check_backlog();
    }

    /// A signaled send work request of operation `op % 8` on `side`'s QP of `kind`.
    fn post(&mut self, side: usize, kind: usize, op: u8, len: u16, local: u16, remote: u16) {
        let remote_addr = BASE + u64::from(remote);
        let rkey = self.key[1 - side];
        let op = match op % 8 {
            0 => SendOp::Send,
            1 => SendOp::SendWithImm(u32::from(len)),
            2 => SendOp::RdmaWrite { remote_addr, rkey },
            3 => SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm: 7,
            },
            4 => SendOp::RdmaRead { remote_addr, rkey },
            5 => SendOp::FetchAdd {
                remote_addr,
                rkey,
                add: 1,
            },
            6 => SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare: 0,
                swap: 1,
            },
            _ => SendOp::AtomicWrite {
                remote_addr,
                rkey,
                data: [7; 8],
            },
        };
        let length = if op.is_atomic() {
            8
        } else {
            u32::from(len) % 8192
        };
        let wr = SendWr {
            wr_id: self.next_id,
            op,
            sg_list: [Sge {
                addr: BASE + u64::from(local),
                length,
                lkey: self.key[side],
            }]
            .into(),
            inline_data: Vec::new(),
            flags: SendFlags::SIGNALED,
            ud: (kind == 2).then(|| UdDest {
                av: self.sim.av_of(1 - side),
                remote_qpn: self.qpn[1 - side][2],
                remote_qkey: UD_QKEY,
            }),
            xrc_srqn: 0,
        };
        self.next_id += 1;
        let now = self.sim.now;
        let _ = self.sim.nodes[side]
            .endpoint
            .post_send(now, self.qpn[side][kind], &wr);
    }

    /// A receive on `side`'s QP of `kind`.
    fn receive(&mut self, side: usize, kind: usize, len: u16, at: u16) {
        let wr = RecvWr {
            wr_id: self.next_id,
            sg_list: [Sge {
                addr: BASE + u64::from(at),
                length: u32::from(len) % 8192,
                lkey: self.key[side],
            }]
            .into(),
        };
        self.next_id += 1;
        let now = self.sim.now;
        let _ = self.sim.nodes[side]
            .endpoint
            .post_recv(now, self.qpn[side][kind], &wr);
    }

    /// One packet `side` has to send, delivered to the other side or lost, and kept.
    fn step(&mut self, side: usize, deliver: bool) {
        let now = self.sim.now;
        let Some(transmit) = self.sim.nodes[side].endpoint.poll_transmit(now) else {
            return;
        };
        let ip = |n: usize| Ipv4Addr::new(10, 0, 0, n as u8 + 1);
        let mac = |n: usize| [2, 0, 0, 0, 0, n as u8 + 1];
        let Some(repr) = transmit.frame(mac(side), ip(side).into(), mac(1 - side)) else {
            return;
        };
        let mut bytes = vec![0u8; repr.buffer_len()];
        if repr.emit(&mut bytes).is_err() {
            return;
        }
        if deliver {
            self.deliver(1 - side, &bytes);
        }
        if self.kept.len() == KEPT {
            self.kept.remove(0);
        }
        self.kept.push(bytes);
    }

    /// A kept packet with one byte changed, to `side`.
    fn replay(&mut self, side: usize, which: u8, at: u16, xor: u8) {
        if self.kept.is_empty() {
            return;
        }
        let mut bytes = self.kept[usize::from(which) % self.kept.len()].clone();
        let at = usize::from(at) % bytes.len();
        bytes[at] ^= xor;
        self.deliver(side, &bytes);
    }

    /// `side`'s QP of `kind` asked to go to `state`, with no further attributes.
    fn modify(&mut self, side: usize, kind: usize, state: QpState) {
        let attr = QpAttr {
            state: Some(state),
            ..QpAttr::default()
        };
        let now = self.sim.now;
        let _ = self.sim.nodes[side]
            .endpoint
            .modify_qp(now, self.qpn[side][kind], &attr);
    }

    /// What a responder has queued to send stays within its bound, which the number of
    /// READ/atomic resources sets, whatever was asked of it (duplicate READs included).
    fn check_backlog(&self) {
        for side in 0..2 {
            for qpn in self.qpn[side] {
                let Some(backlog) = self.sim.nodes[side].endpoint.responder_backlog(qpn) else {
                    continue;
                };
                assert!(
                    backlog.queued <= backlog.bound,
                    "responder of QP {qpn} holds {backlog:?}"
                );
            }
        }
    }

    fn deliver(&mut self, side: usize, bytes: &[u8]) {
        let now = self.sim.now;
        if let Ok(repr) = Frame::new_checked(bytes).and_then(|frame| FrameRepr::parse(&frame)) {
            self.sim.nodes[side].endpoint.handle_packet(now, &repr);
        }
    }

    /// Every work request completes at most once (its id, on its side's send or receive
    /// queue).
    fn check_completions(&mut self) {
        for side in 0..2 {
            let done: Vec<(WorkCompletion, bool)> = self
                .sim
                .poll_send(side)
                .into_iter()
                .map(|wc| (wc, true))
                .chain(self.sim.poll_recv(side).into_iter().map(|wc| (wc, false)))
                .collect();
            for (wc, send) in done {
                assert!(
                    self.seen[side].insert((wc.wr_id, send)),
                    "work request {} completed twice: {wc:?}",
                    wc.wr_id
                );
            }
        }
    }
}

fuzz_target!(|input: (Setup, Vec<Action>)| {
    let (setup, actions) = input;
    let mut world = World::new(&setup);
    for action in actions.into_iter().take(512) {
        world.act(action);
    }
});
