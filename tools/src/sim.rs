//! `roce sim`: moves data between endpoints of the deterministic simulator in
//! `roce_transport::sim`, over a link that loses, reorders, duplicates and corrupts frames,
//! and checks every byte that arrives.
//!
//! By default two endpoints face each other over a link without a speed. With `--incast N`,
//! N senders write to one receiver through a switch (`roce_transport::sim::SwitchConfig`):
//! links of `--link-rate`, a shared egress queue to the receiver of `--buffer` bytes that
//! marks ECN-capable frames CE between `--kmin` and `--kmax` (probability up to `--pmax`)
//! and drops what does not fit. The senders run DCQCN (`--dcqcn off` makes them ignore
//! CNPs).
//!
//! Each RC QP pair owns a window of [`SLOTS`] slots of [`MESSAGE`] bytes on each side,
//! reused message after message, so memory stays near 2 MiB per pair whatever `--bytes` is.
//! Message k of a pair uses slot k mod [`SLOTS`]; before it is posted, its source is filled
//! with bytes unique to (seed, pair, k) and its destination with a canary, and when it has
//! completed the destination must hold exactly those bytes and the canary after them (up to
//! the next slot) must be intact. Atomics act on two counters per pair at the responder: every
//! FETCH_ADD and CMP_SWAP must return the value the counter held at that point of the pair's
//! request order, and at the end the FETCH_ADD counter must hold the sum of every add.
//!
//! The last line of stdout is `verified=BYTES ops=N retransmits=R naks=K drops=D
//! utilisation=U fairness=F lost=L status=ok`, or the same with `status=FAIL reason="..."`
//! after the first failed check: D frames the switch dropped, U the share of the time the
//! switch's port to the receiver was sending (`-` without a switch), F Jain's fairness
//! index over the QP pairs' throughputs, L frames the links lost (`--loss`). The exit
//! status is 0 for ok, 1 for FAIL and 2 for arguments that cannot be run.

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use roce_transport::congestion::{CongestionConfig, DcqcnParams, QpRate, Rate};
use roce_transport::cq::{WcOpcode, WcStatus, WorkCompletion};
use roce_transport::qp::QpStats;
use roce_transport::qp_state::{PathMtu, QpType};
use roce_transport::sim::{LinkConfig, QpPair, RetryConfig, Sim, SwitchConfig};
use roce_transport::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};

use crate::progress::Tenths;
use crate::workload::{Counter, Pattern, Slots, CANARY};

/// Bytes of a data message (SEND, WRITE, READ); the last one of a run may be shorter.
const MESSAGE: usize = 64 * 1024;
/// Messages in flight per QP pair, each in its own slot: a 1 MiB window per side.
const SLOTS: usize = 16;
/// Canary bytes after every slot and before the first, which no operation addresses.
const GUARD: usize = 256;
/// Each side's window of a QP pair.
const WINDOW: Slots = Slots {
    size: MESSAGE,
    count: SLOTS,
    guard: GUARD,
};
/// Simulator steps allowed without a single message completing before the run is stuck.
const STALL_STEPS: u64 = 1_000_000;
/// Runs shorter than this print no progress.
const QUIET_FOR: Duration = Duration::from_secs(1);

/// Arguments of `roce sim`.
#[derive(clap::Args)]
pub struct Args {
    /// Operations to use in turn, one message each (an atomic alternates FETCH_ADD and
    /// CMP_SWAP) [default: send,write,read,atomic; with --incast: write].
    #[arg(long, value_enum, value_delimiter = ',')]
    ops: Vec<Op>,
    /// Bytes to move and verify in total, with an optional K, M or G suffix (KiB, MiB, GiB).
    /// SEND, WRITE and READ move 64 KiB per message (the last one may be shorter); an atomic
    /// moves 8 bytes.
    #[arg(long, value_name = "SIZE", default_value = "16M", value_parser = crate::args::parse_size)]
    bytes: u64,
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096.
    #[arg(long, value_name = "BYTES", default_value = "1024", value_parser = crate::args::parse_mtu)]
    mtu: PathMtu,
    /// Frames lost, in percent (`--loss 5` is 5 %, `--loss 0.5` is 0.5 %).
    #[arg(long, value_name = "PERCENT", default_value = "0", value_parser = crate::args::parse_percent)]
    loss: f64,
    /// Frames delayed by one to three extra link latencies, so later ones overtake them,
    /// in percent.
    #[arg(long, value_name = "PERCENT", default_value = "0", value_parser = crate::args::parse_percent)]
    reorder: f64,
    /// Frames delivered twice, in percent.
    #[arg(long, value_name = "PERCENT", default_value = "0", value_parser = crate::args::parse_percent)]
    dup: f64,
    /// Frames with one bit flipped after the Ethernet header, in percent (the receiver's
    /// ICRC check must reject every one).
    #[arg(long, value_name = "PERCENT", default_value = "0", value_parser = crate::args::parse_percent)]
    corrupt: f64,
    /// Seed of every random choice: the same arguments replay the same run.
    #[arg(long, value_name = "N", default_value_t = 1)]
    seed: u64,
    /// RC QP pairs between the two endpoints (with --incast: from each sender); messages
    /// go to them in turn.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    qps: u16,
    /// N senders to one receiver through a switch, instead of two endpoints face to face.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    incast: Option<u16>,
    /// DCQCN's reaction point on every endpoint (off: CNPs are still sent, and ignored).
    #[arg(long, value_enum, default_value = "on")]
    dcqcn: OnOff,
    /// Offer selective repeat on every endpoint (they all accept it): only what was lost
    /// is sent again, instead of going back N.
    #[arg(long)]
    selective_repeat: bool,
    /// A DCQCN knob, by mlx5's name (`--dcqcn-param rp_ai_rate=40`; repeatable).
    #[arg(long, value_name = "NAME=VALUE")]
    dcqcn_param: Vec<String>,
    /// With --incast: the speed of every link, in Gb/s [default: 10].
    #[arg(long, value_name = "GBPS", value_parser = clap::value_parser!(u32).range(1..=800))]
    link_rate: Option<u32>,
    /// With --incast: one-way delay of every link, in µs [default: 1].
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    link_latency: Option<u32>,
    /// With --incast: bytes the switch's egress queue holds before it drops [default: 512K].
    #[arg(long, value_name = "SIZE", value_parser = crate::args::parse_size)]
    buffer: Option<u64>,
    /// With --incast: queue length from which ECN-capable frames may be marked CE
    /// [default: 5000].
    #[arg(long, value_name = "SIZE", value_parser = crate::args::parse_size)]
    kmin: Option<u64>,
    /// With --incast: queue length from which every ECN-capable frame is marked CE
    /// [default: 50000].
    #[arg(long, value_name = "SIZE", value_parser = crate::args::parse_size)]
    kmax: Option<u64>,
    /// With --incast: marking probability just below --kmax, in percent [default: 50].
    #[arg(long, value_name = "PERCENT", value_parser = crate::args::parse_percent)]
    pmax: Option<f64>,
    /// Every US µs of simulated time, print the queue to the receiver and each sending QP's
    /// DCQCN state (current rate/target rate in Mb/s/α of 1024) on stderr.
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u32).range(1..))]
    trace: Option<u32>,
}

/// `on` or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum OnOff {
    On,
    Off,
}

impl Args {
    /// The operations to use in turn.
    fn ops(&self) -> Vec<Op> {
        match (self.ops.is_empty(), self.incast) {
            (false, _) => self.ops.clone(),
            (true, Some(_)) => vec![Op::Write],
            (true, None) => vec![Op::Send, Op::Write, Op::Read, Op::Atomic],
        }
    }

    /// The switch, with --incast.
    fn switch(&self) -> Option<SwitchConfig> {
        let model = SwitchConfig::default();
        self.incast.map(|_| SwitchConfig {
            rate: self
                .link_rate
                .map_or(model.rate, |gbps| Rate::gbps(u64::from(gbps))),
            latency: self
                .link_latency
                .map_or(model.latency, |us| Duration::from_micros(u64::from(us))),
            buffer: self.buffer.unwrap_or(model.buffer),
            kmin: self.kmin.unwrap_or(model.kmin),
            kmax: self.kmax.unwrap_or(model.kmax),
            pmax: self.pmax.unwrap_or(model.pmax),
        })
    }

    /// How every endpoint takes part in congestion control.
    fn congestion(&self) -> Result<CongestionConfig, String> {
        let mut dcqcn = DcqcnParams::default();
        for setting in &self.dcqcn_param {
            let (name, value) = setting
                .split_once('=')
                .ok_or_else(|| format!("--dcqcn-param {setting}: NAME=VALUE expected"))?;
            let value = value
                .trim()
                .parse()
                .map_err(|_| format!("--dcqcn-param {setting}: {value} is not a number"))?;
            dcqcn.set(name.trim(), value)?;
        }
        let mut config = CongestionConfig {
            rp: self.dcqcn == OnOff::On,
            dcqcn,
            selective_repeat: self.selective_repeat,
            ..CongestionConfig::default()
        };
        if let Some(switch) = self.switch() {
            config.line_rate = switch.rate;
        }
        Ok(config)
    }
}

/// An operation `--ops` can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Op {
    Send,
    Write,
    Read,
    Atomic,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Send => "send",
            Op::Write => "write",
            Op::Read => "read",
            Op::Atomic => "atomic",
        })
    }
}

/// One posted work request and what has come back for it.
#[derive(Debug, Clone, Copy)]
struct Message {
    seq: u64,
    work: Work,
    /// Bytes it moves (8 for an atomic).
    len: usize,
    /// The send completion arrived.
    sent: bool,
    /// The receive completion arrived (always true for anything but a SEND).
    received: bool,
}

impl Message {
    fn slot(&self) -> usize {
        (self.seq % SLOTS as u64) as usize
    }
}

/// What a message does, with what an atomic must return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    Send,
    Write,
    Read,
    FetchAdd {
        add: u64,
        original: u64,
    },
    CompareSwap {
        compare: u64,
        swap: u64,
        original: u64,
    },
}

impl Work {
    fn opcode(&self) -> WcOpcode {
        match self {
            Work::Send => WcOpcode::Send,
            Work::Write => WcOpcode::RdmaWrite,
            Work::Read => WcOpcode::RdmaRead,
            Work::FetchAdd { .. } => WcOpcode::FetchAdd,
            Work::CompareSwap { .. } => WcOpcode::CompareSwap,
        }
    }
}

impl fmt::Display for Work {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Work::Send => "SEND",
            Work::Write => "WRITE",
            Work::Read => "READ",
            Work::FetchAdd { .. } => "FETCH_ADD",
            Work::CompareSwap { .. } => "CMP_SWAP",
        })
    }
}

/// One QP pair and its windows.
struct Lane {
    pair: QpPair,
    /// Key of the window on the requester.
    local: u32,
    /// Key of the window on the responder.
    remote: u32,
    /// Key of the responder's atomic counters.
    counters: u32,
    in_flight: VecDeque<Message>,
    next_seq: u64,
    /// Index in `--ops` of this pair's next operation: every pair takes every operation.
    next_op: usize,
    atomics: u64,
    /// The FETCH_ADD counter once every atomic posted so far has run.
    sum: Counter,
    /// The same for the CMP_SWAP word.
    word: Counter,
    /// Bytes of this pair's messages that arrived and were checked.
    verified: u64,
    /// When (in simulated time) its last checked message completed.
    last_done: Option<Instant>,
}

/// Where windows live in each node's address space; pair i's is `i` × `WINDOW_SPACING` on.
const WINDOW_IOVA: u64 = 0x1000_0000;
const WINDOW_SPACING: u64 = 0x100_0000;
/// The responder's atomic counters: a guard, the FETCH_ADD counter, the CMP_SWAP word, a guard.
const COUNTERS_IOVA: u64 = 0x8000_0000;
const COUNTERS_LEN: usize = GUARD + 16 + GUARD;

fn window_iova(lane: usize) -> u64 {
    WINDOW_IOVA + lane as u64 * WINDOW_SPACING
}

fn counters_iova(lane: usize) -> u64 {
    COUNTERS_IOVA + lane as u64 * WINDOW_SPACING
}

fn wr_id(lane: usize, seq: u64) -> u64 {
    (lane as u64) << 48 | seq
}

fn split_wr_id(wr_id: u64) -> (usize, u64) {
    ((wr_id >> 48) as usize, wr_id & ((1 << 48) - 1))
}

/// The mutable bytes of a region.
fn region(sim: &mut Sim, node: usize, key: u32) -> &mut [u8] {
    sim.nodes[node]
        .endpoint
        .mrs()
        .get_mut(key)
        .expect("the run registered this region")
        .bytes_mut()
        .expect("the run's regions own their bytes")
}

impl Lane {
    /// What the requester posts for `work` on pair `lane`, whose slot is at `addr`.
    fn send_op(&self, lane: usize, work: Work, addr: u64) -> SendOp {
        let counter_addr = counters_iova(lane) + GUARD as u64;
        match work {
            Work::Send => SendOp::Send,
            Work::Write => SendOp::RdmaWrite {
                remote_addr: addr,
                rkey: self.remote,
            },
            Work::Read => SendOp::RdmaRead {
                remote_addr: addr,
                rkey: self.remote,
            },
            Work::FetchAdd { add, .. } => SendOp::FetchAdd {
                remote_addr: counter_addr,
                rkey: self.counters,
                add,
            },
            Work::CompareSwap { compare, swap, .. } => SendOp::CompareSwap {
                remote_addr: counter_addr + 8,
                rkey: self.counters,
                compare,
                swap,
            },
        }
    }

    /// The windows (node, key) a message's bytes come from and go to; an atomic's come from
    /// the counters.
    fn ends(&self, work: Work) -> (Option<(usize, u32)>, (usize, u32)) {
        let (a, b) = (self.pair.a.0, self.pair.b.0);
        match work {
            Work::Send | Work::Write => (Some((a, self.local)), (b, self.remote)),
            Work::Read => (Some((b, self.remote)), (a, self.local)),
            Work::FetchAdd { .. } | Work::CompareSwap { .. } => (None, (a, self.local)),
        }
    }
}

/// Everything the run has posted and checked.
struct Run {
    seed: u64,
    ops: Vec<Op>,
    target: u64,
    lanes: Vec<Lane>,
    /// Bytes posted so far.
    posted: u64,
    /// Bytes that arrived and were checked.
    verified: u64,
    /// Messages that completed and were checked.
    done: u64,
    /// Pair to post the next message on.
    next_lane: usize,
    /// Scratch space for the bytes a message should have delivered.
    expected: Vec<u8>,
    /// The nodes that post (every pair's `a` side).
    senders: Vec<usize>,
    /// The node every pair's `b` side is on.
    receiver: usize,
    /// When (in simulated time) the first message was posted.
    started: Instant,
}

impl Run {
    /// Connects the pairs (`--qps` from each of `senders` to `receiver`) and registers
    /// their windows.
    fn new(args: &Args, sim: &mut Sim, senders: Vec<usize>, receiver: usize) -> Self {
        let blank = WINDOW.blank();
        let mut counters = vec![CANARY; COUNTERS_LEN];
        counters[GUARD..GUARD + 16].fill(0);
        let pairs: Vec<(usize, usize)> = senders
            .iter()
            .flat_map(|&sender| (0..usize::from(args.qps)).map(move |_| sender))
            .enumerate()
            .collect();
        let lanes = pairs
            .into_iter()
            .map(|(lane, a)| {
                let b = receiver;
                let pair = sim.connect(a, b, QpType::Rc, args.mtu, RetryConfig::default());
                Lane {
                    pair,
                    local: sim.reg(a, window_iova(lane), &blank),
                    remote: sim.reg(b, window_iova(lane), &blank),
                    counters: sim.reg(b, counters_iova(lane), &counters),
                    in_flight: VecDeque::with_capacity(SLOTS),
                    next_seq: 0,
                    next_op: 0,
                    atomics: 0,
                    sum: Counter::default(),
                    word: Counter::default(),
                    verified: 0,
                    last_done: None,
                }
            })
            .collect();
        Run {
            senders,
            receiver,
            started: sim.now,
            seed: args.seed,
            ops: args.ops(),
            target: args.bytes,
            lanes,
            posted: 0,
            verified: 0,
            done: 0,
            next_lane: 0,
            expected: vec![0; MESSAGE],
        }
    }

    fn finished(&self) -> bool {
        self.posted == self.target && self.lanes.iter().all(|l| l.in_flight.is_empty())
    }

    fn in_flight(&self) -> usize {
        self.lanes.iter().map(|l| l.in_flight.len()).sum()
    }

    /// Posts messages until every window is full or every byte is posted.
    fn refill(&mut self, sim: &mut Sim) -> Result<(), String> {
        let lanes = self.lanes.len();
        while self.posted < self.target {
            let Some(lane) = (0..lanes)
                .map(|i| (self.next_lane + i) % lanes)
                .find(|&i| self.lanes[i].in_flight.len() < SLOTS)
            else {
                break;
            };
            self.next_lane = (lane + 1) % lanes;
            let op = self.take_op(lane);
            self.post(sim, lane, op)?;
        }
        Ok(())
    }

    /// A pair's next operation in turn that fits in the bytes left: an atomic needs 8.
    fn take_op(&mut self, lane: usize) -> Op {
        let left = self.target - self.posted;
        let next = &mut self.lanes[lane].next_op;
        for _ in 0..self.ops.len() {
            let op = self.ops[*next];
            *next = (*next + 1) % self.ops.len();
            if op != Op::Atomic || left >= 8 {
                return op;
            }
        }
        unreachable!("`check_args` refuses sizes that no chosen operation can end on")
    }

    /// The next atomic of a pair, with the value it must return: FETCH_ADD, CMP_SWAP that
    /// swaps, FETCH_ADD, CMP_SWAP whose compare fails.
    fn next_atomic(&mut self, lane: usize, key: u64) -> Work {
        let l = &mut self.lanes[lane];
        let k = l.atomics;
        l.atomics += 1;
        match k % 4 {
            0 | 2 => {
                let add = (key >> 40) + 1;
                let original = l.sum.fetch_add(add);
                Work::FetchAdd { add, original }
            }
            1 => {
                let compare = l.word.value;
                let swap = if key == compare { !key } else { key };
                let original = l.word.compare_swap(compare, swap);
                Work::CompareSwap {
                    compare,
                    swap,
                    original,
                }
            }
            _ => {
                let compare = !l.word.value;
                let original = l.word.compare_swap(compare, key);
                Work::CompareSwap {
                    compare,
                    swap: key,
                    original,
                }
            }
        }
    }

    /// Prepares a slot and posts one message (and, for a SEND, its receive).
    fn post(&mut self, sim: &mut Sim, lane: usize, op: Op) -> Result<(), String> {
        let seq = self.lanes[lane].next_seq;
        self.lanes[lane].next_seq += 1;
        let pattern = Pattern::for_message(self.seed, lane, seq);
        let left = self.target - self.posted;
        let data_len = (MESSAGE as u64).min(left) as usize;
        let (work, len) = match op {
            Op::Send => (Work::Send, data_len),
            Op::Write => (Work::Write, data_len),
            Op::Read => (Work::Read, data_len),
            Op::Atomic => (self.next_atomic(lane, pattern.key()), 8),
        };
        let message = Message {
            seq,
            work,
            len,
            sent: false,
            received: work != Work::Send,
        };
        let l = &self.lanes[lane];
        let (qp_a, qp_b) = (l.pair.a.1, l.pair.b.1);
        let offset = WINDOW.offset(message.slot());
        // Both windows of a pair sit at the same address on their node.
        let addr = window_iova(lane) + offset as u64;
        // The source gets this message's bytes, the destination the canary.
        let (source, (node, window)) = l.ends(work);
        if let Some((node, window)) = source {
            pattern.fill(0, &mut region(sim, node, window)[offset..offset + len]);
        }
        region(sim, node, window)[offset..offset + MESSAGE].fill(CANARY);
        if work == Work::Send {
            let receive = RecvWr {
                wr_id: wr_id(lane, seq),
                sg_list: [Sge {
                    addr,
                    length: MESSAGE as u32,
                    lkey: l.remote,
                }]
                .into(),
            };
            sim.post_recv(l.pair.b.0, qp_b, &receive)
                .map_err(|e| format!("post_recv on QP {qp_b:#x}: {e}"))?;
        }
        let wr = SendWr {
            wr_id: wr_id(lane, seq),
            op: l.send_op(lane, work, addr),
            sg_list: [Sge {
                addr,
                length: len as u32,
                lkey: l.local,
            }]
            .into(),
            inline_data: Vec::new(),
            flags: SendFlags::SIGNALED,
            ud: None,
            xrc_srqn: 0,
        };
        sim.post_send(l.pair.a.0, qp_a, &wr)
            .map_err(|e| format!("post_send on QP {qp_a:#x}: {e}"))?;
        self.lanes[lane].in_flight.push_back(message);
        self.posted += len as u64;
        Ok(())
    }

    /// Takes every completion, and checks and retires the messages that are complete.
    /// Returns how many were retired.
    fn collect(&mut self, sim: &mut Sim) -> Result<usize, String> {
        for index in 0..self.senders.len() {
            for completion in sim.poll_send(self.senders[index]) {
                self.on_send_completion(&completion)?;
            }
        }
        for completion in sim.poll_recv(self.receiver) {
            self.on_recv_completion(&completion)?;
        }
        let mut retired = 0;
        for lane in 0..self.lanes.len() {
            while let Some(&message) = self.lanes[lane].in_flight.front() {
                if !(message.sent && message.received) {
                    break;
                }
                self.check(sim, lane, &message)?;
                let l = &mut self.lanes[lane];
                l.in_flight.pop_front();
                l.verified += message.len as u64;
                l.last_done = Some(sim.now);
                self.verified += message.len as u64;
                self.done += 1;
                retired += 1;
            }
        }
        Ok(retired)
    }

    /// The in-flight message a completion names.
    fn find(&self, completion: &WorkCompletion) -> Result<(usize, usize), String> {
        let (lane, seq) = split_wr_id(completion.wr_id);
        let index = self
            .lanes
            .get(lane)
            .and_then(|l| Some(seq.checked_sub(l.in_flight.front()?.seq)? as usize))
            .filter(|&index| index < self.lanes[lane].in_flight.len())
            .ok_or_else(|| {
                format!(
                    "a completion for wr_id {:#x} that is not in flight",
                    completion.wr_id
                )
            })?;
        Ok((lane, index))
    }

    fn on_send_completion(&mut self, completion: &WorkCompletion) -> Result<(), String> {
        let (lane, index) = self.find(completion)?;
        let l = &mut self.lanes[lane];
        let message = l.in_flight[index];
        let qpn = l.pair.a.1;
        let name = || format!("QP {qpn:#x} message {} ({})", message.seq, message.work);
        if completion.status != WcStatus::Success {
            return Err(format!("{} completed with {:?}", name(), completion.status));
        }
        if completion.opcode != message.work.opcode() || completion.qp_num != qpn {
            return Err(format!("{} completed as {completion:?}", name()));
        }
        // RC completes a send queue in order.
        if message.sent || l.in_flight.iter().take(index).any(|m| !m.sent) {
            return Err(format!("{} completed out of order", name()));
        }
        l.in_flight[index].sent = true;
        Ok(())
    }

    fn on_recv_completion(&mut self, completion: &WorkCompletion) -> Result<(), String> {
        let (lane, index) = self.find(completion)?;
        let l = &mut self.lanes[lane];
        let message = l.in_flight[index];
        let qpn = l.pair.b.1;
        let name = || format!("QP {qpn:#x} receive {}", message.seq);
        if completion.status != WcStatus::Success {
            return Err(format!("{} completed with {:?}", name(), completion.status));
        }
        let expected = (WcOpcode::Recv, message.len as u32, qpn);
        let got = (completion.opcode, completion.byte_len, completion.qp_num);
        if message.work != Work::Send || message.received || got != expected {
            return Err(format!("{} completed as {completion:?}", name()));
        }
        l.in_flight[index].received = true;
        Ok(())
    }

    /// Checks a completed message: its destination holds its bytes and canary after them,
    /// and its source still holds its bytes.
    fn check(&mut self, sim: &mut Sim, lane: usize, message: &Message) -> Result<(), String> {
        let l = &self.lanes[lane];
        let qpn = l.pair.a.1;
        let name = || format!("QP {qpn:#x} message {} ({})", message.seq, message.work);
        let (source, (node, window)) = l.ends(message.work);
        let want = &mut self.expected[..message.len];
        match message.work {
            Work::FetchAdd { original, .. } | Work::CompareSwap { original, .. } => {
                want.copy_from_slice(&original.to_ne_bytes());
            }
            _ => Pattern::for_message(self.seed, lane, message.seq).fill(0, want),
        }
        let offset = WINDOW.offset(message.slot());
        WINDOW
            .check(region(sim, node, window), message.slot(), want)
            .map_err(|e| format!("{}: {e}", name()))?;
        if let Some((node, window)) = source {
            let sent = &region(sim, node, window)[offset..offset + want.len()];
            if sent != &want[..] {
                return Err(format!("{}: its source changed", name()));
            }
        }
        Ok(())
    }

    /// Checks what only the end of a run can: the counters' final values, and that no guard
    /// was ever written.
    fn check_end(&self, sim: &mut Sim) -> Result<(), String> {
        for (lane, l) in self.lanes.iter().enumerate() {
            let qpn = l.pair.a.1;
            let counters = region(sim, l.pair.b.0, l.counters);
            let value = |at: usize| u64::from_ne_bytes(counters[at..at + 8].try_into().unwrap());
            let (sum, word) = (value(GUARD), value(GUARD + 8));
            if (sum, word) != (l.sum.value, l.word.value) {
                return Err(format!(
                    "QP {qpn:#x}: FETCH_ADD counter {sum:#x} and CMP_SWAP word {word:#x}, \
                     expected {:#x} (the sum of every add) and {:#x}",
                    l.sum.value, l.word.value
                ));
            }
            let guards = [&counters[..GUARD], &counters[GUARD + 16..]];
            if guards.iter().any(|g| g.iter().any(|&b| b != CANARY)) {
                return Err(format!(
                    "QP {qpn:#x}: a guard around the counters was written"
                ));
            }
            for (node, key) in [(l.pair.a.0, l.local), (l.pair.b.0, l.remote)] {
                if let Some(at) = WINDOW.damaged_guard(region(sim, node, key)) {
                    return Err(format!(
                        "QP {qpn:#x}: the guard at offset {at} of pair {lane}'s window on node \
                         {node} was written"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Prints, on stderr, the simulated time, the queue to the receiver, and each sending QP's
/// DCQCN state (`RC/RT/α`, rates in Mb/s, `-` while DCQCN does not limit it).
fn trace(sim: &mut Sim, run: &Run) {
    let now = sim.now;
    let queued = sim.port_stats(run.receiver).queued;
    let qps: Vec<String> = run
        .lanes
        .iter()
        .map(|lane| {
            let (node, qpn) = lane.pair.a;
            let rate = sim.nodes[node].endpoint.qp_rate(now, qpn);
            match rate.unwrap_or_default() {
                QpRate {
                    dcqcn_current: Some(rc),
                    dcqcn_target: Some(rt),
                    alpha: Some(alpha),
                    ..
                } => format!("{}/{}/{alpha}", rc.kbps() / 1000, rt.kbps() / 1000),
                _ => "-".into(),
            }
        })
        .collect();
    eprintln!(
        "t={:.1}us queue={queued} drops={} {}",
        (now - run.started).as_secs_f64() * 1e6,
        sim.stats.dropped,
        qps.join(" ")
    );
}

/// Runs the simulator until every byte is verified or a check fails.
fn drive(
    sim: &mut Sim,
    run: &mut Run,
    progress: &mut Tenths,
    trace_every: Option<Duration>,
) -> Result<(), String> {
    let mut next_trace = sim.now;
    run.refill(sim)?;
    while !run.finished() {
        let mut failure = None;
        let mut calls = 0u64;
        let moved = sim.run_until(STALL_STEPS, |sim| {
            calls += 1;
            if let Some(every) = trace_every.filter(|_| sim.now >= next_trace) {
                next_trace = sim.now + every;
                trace(sim, run);
            }
            match run.collect(sim) {
                Ok(retired) => retired > 0,
                Err(reason) => {
                    failure = Some(reason);
                    true
                }
            }
        });
        if let Some(reason) = failure {
            return Err(reason);
        }
        if !moved {
            return Err(if calls > STALL_STEPS {
                format!("no message completed in {STALL_STEPS} simulator steps (run_until bound)")
            } else {
                format!(
                    "the network went idle with {} messages in flight",
                    run.in_flight()
                )
            });
        }
        if sim.stats.corrupt_accepted > 0 {
            return Err(format!(
                "{} corrupted frames passed the receiver's checks",
                sim.stats.corrupt_accepted
            ));
        }
        for node in 0..sim.nodes.len() {
            if let Some(event) = sim.nodes[node].endpoint.take_events().first() {
                return Err(format!("node {node}: {event:?}"));
            }
        }
        let (verified, target) = (run.verified, run.target);
        progress.update(verified, target, |elapsed| {
            format!(" ({verified} of {target} bytes verified, {elapsed:.1?})")
        });
        run.refill(sim)?;
    }
    run.check_end(sim)
}

/// Arguments clap cannot check alone.
fn check_args(args: &Args) -> Result<(), String> {
    args.congestion()?;
    let lanes = usize::from(args.incast.unwrap_or(1)) * usize::from(args.qps);
    if lanes > 256 {
        return Err(format!(
            "{lanes} QP pairs (--incast × --qps): at most 256, each holds 2 MiB of windows"
        ));
    }
    if args
        .switch()
        .is_some_and(|switch| switch.kmin > switch.kmax)
    {
        return Err("--kmin must not exceed --kmax".into());
    }
    if args.ops().iter().all(|&op| op == Op::Atomic) && !args.bytes.is_multiple_of(8) {
        return Err(
            "atomics move 8 bytes each: with --ops atomic, --bytes must be a multiple \
                    of 8"
                .into(),
        );
    }
    Ok(())
}

/// Counters of every QP of both nodes, added up.
fn total_stats(sim: &Sim, run: &Run) -> QpStats {
    let mut total = QpStats::default();
    for lane in &run.lanes {
        for (node, qpn) in [lane.pair.a, lane.pair.b] {
            let stats = sim.nodes[node].endpoint.qp_stats(qpn).unwrap_or_default();
            total.retransmits += stats.retransmits;
            total.timeouts += stats.timeouts;
            total.naks_sent += stats.naks_sent;
            total.naks_received += stats.naks_received;
            total.dropped += stats.dropped;
            total.responses_resent += stats.responses_resent;
        }
    }
    total
}

fn percent(probability: f64) -> String {
    format!("{}%", probability * 100.0)
}

/// Jain's fairness index of `rates`: 1 when all are equal, 1/n when one has everything.
fn jain(rates: &[f64]) -> f64 {
    let sum: f64 = rates.iter().sum();
    let squares: f64 = rates.iter().map(|rate| rate * rate).sum();
    if squares == 0.0 {
        return 1.0;
    }
    sum * sum / (rates.len() as f64 * squares)
}

/// Each QP pair's throughput in bytes per simulated second: what it verified over the
/// time to its last message.
fn lane_rates(run: &Run) -> Vec<f64> {
    run.lanes
        .iter()
        .map(|lane| match lane.last_done {
            Some(done) if done > run.started => {
                lane.verified as f64 / (done - run.started).as_secs_f64()
            }
            _ => 0.0,
        })
        .collect()
}

fn report(
    out: &mut impl Write,
    args: &Args,
    sim: &mut Sim,
    run: &Run,
    simulated: Duration,
    wall: Duration,
    outcome: &Result<(), String>,
) -> io::Result<()> {
    let ops: Vec<String> = args.ops().iter().map(Op::to_string).collect();
    writeln!(
        out,
        "qps={} mtu={} message={MESSAGE} ops={} bytes={} seed={} loss={} reorder={} dup={} \
         corrupt={}",
        args.qps,
        args.mtu.bytes(),
        ops.join(","),
        args.bytes,
        args.seed,
        percent(sim.link.loss),
        percent(sim.link.reorder),
        percent(sim.link.duplicate),
        percent(sim.link.corrupt),
    )?;
    if let Some(switch) = sim.switch() {
        let port = sim.port_stats(run.receiver);
        writeln!(
            out,
            "switch senders={} rate={} buffer={} kmin={} kmax={} pmax={} dcqcn={} \
             max_queue={} marked={} dropped={}",
            run.senders.len(),
            switch.rate,
            switch.buffer,
            switch.kmin,
            switch.kmax,
            percent(switch.pmax),
            if args.dcqcn == OnOff::On { "on" } else { "off" },
            port.max_queue,
            port.marked,
            port.dropped,
        )?;
    }
    let net = sim.stats;
    writeln!(
        out,
        "frames sent={} delivered={} lost={} corrupted={} corrupt_rejected={} \
         corrupt_accepted={}",
        net.sent,
        net.delivered,
        net.lost,
        net.corrupted,
        net.corrupt_rejected,
        net.corrupt_accepted
    )?;
    let mut congestion = roce_transport::Counters::default();
    for node in &sim.nodes {
        let counters = node.endpoint.counters();
        congestion.np_cnp_sent += counters.np_cnp_sent;
        congestion.np_ecn_marked_roce_packets += counters.np_ecn_marked_roce_packets;
        congestion.rp_cnp_handled += counters.rp_cnp_handled;
        congestion.rp_cnp_ignored += counters.rp_cnp_ignored;
        congestion.rp_rate_cuts += counters.rp_rate_cuts;
    }
    writeln!(
        out,
        "congestion np_ecn_marked_roce_packets={} np_cnp_sent={} rp_cnp_handled={} \
         rp_cnp_ignored={} rp_rate_cuts={}",
        congestion.np_ecn_marked_roce_packets,
        congestion.np_cnp_sent,
        congestion.rp_cnp_handled,
        congestion.rp_cnp_ignored,
        congestion.rp_rate_cuts,
    )?;
    let rates = lane_rates(run);
    let now = sim.now;
    for (lane, rate) in run.lanes.iter().zip(&rates) {
        let stats =
            |(node, qpn): (usize, u32)| sim.nodes[node].endpoint.qp_stats(qpn).unwrap_or_default();
        let (a, b) = (stats(lane.pair.a), stats(lane.pair.b));
        let (node, qpn) = lane.pair.a;
        let qp_rate = sim.nodes[node]
            .endpoint
            .qp_rate(now, qpn)
            .unwrap_or_default();
        let paced = qp_rate
            .current
            .map_or_else(|| "line".to_string(), |rate| rate.to_string());
        writeln!(
            out,
            "qp {:#x}->{:#x} retransmits={} responses_resent={} timeouts={} naks_sent={} \
             naks_received={} dropped={} goodput_mbps={:.0} rate={paced} rate_cuts={} \
             selective_repeat={}",
            lane.pair.a.1,
            lane.pair.b.1,
            a.retransmits + b.retransmits,
            a.responses_resent + b.responses_resent,
            a.timeouts + b.timeouts,
            a.naks_sent + b.naks_sent,
            a.naks_received + b.naks_received,
            a.dropped + b.dropped,
            rate * 8.0 / 1e6,
            qp_rate.cuts,
            if qp_rate.selective_repeat {
                "on"
            } else {
                "off"
            },
        )?;
    }
    let total = total_stats(sim, run);
    writeln!(
        out,
        "recovery retransmits={} responses_resent={} lost={} per_loss={:.2}",
        total.retransmits,
        total.responses_resent,
        net.lost,
        total.retransmits as f64 / net.lost.max(1) as f64,
    )?;
    let mib_per_s = run.verified as f64 / (1 << 20) as f64 / wall.as_secs_f64().max(1e-9);
    writeln!(
        out,
        "simulated={simulated:.3?} wall={wall:.3?} ({mib_per_s:.1} MiB/s verified)"
    )?;
    let utilisation = match sim.switch() {
        Some(switch) => format!(
            "{:.3}",
            sim.port_stats(run.receiver).utilisation(switch.rate)
        ),
        None => "-".into(),
    };
    write!(
        out,
        "verified={} ops={} retransmits={} naks={} drops={} utilisation={utilisation} \
         fairness={:.3} lost={} ",
        run.verified,
        run.done,
        total.retransmits,
        total.naks_received,
        net.dropped,
        jain(&rates),
        net.lost,
    )?;
    match outcome {
        Ok(()) => writeln!(out, "status=ok"),
        Err(reason) => writeln!(out, "status=FAIL reason=\"{}\"", reason.replace('"', "'")),
    }
}

/// Runs `roce sim`.
pub fn run(args: &Args) -> ExitCode {
    let congestion = match check_args(args).and_then(|()| args.congestion()) {
        Ok(congestion) => congestion,
        Err(error) => {
            eprintln!("roce sim: {error}");
            return ExitCode::from(2);
        }
    };
    let link = LinkConfig {
        loss: args.loss,
        reorder: args.reorder,
        duplicate: args.dup,
        corrupt: args.corrupt,
        ..LinkConfig::default()
    };
    let started = Instant::now();
    let mut sim = Sim::new(link, args.seed);
    sim.set_switch(args.switch());
    let senders = usize::from(args.incast.unwrap_or(1));
    for _ in 0..=senders {
        let node = sim.add_node();
        let now = sim.now;
        sim.nodes[node].endpoint.set_congestion(now, congestion);
    }
    let sim_start = sim.now;
    let mut run = Run::new(args, &mut sim, (0..senders).collect(), senders);
    let mut progress = Tenths::new("roce sim:", QUIET_FOR);
    let trace_every = args.trace.map(|us| Duration::from_micros(u64::from(us)));
    let outcome = drive(&mut sim, &mut run, &mut progress, trace_every);
    let simulated = sim.now - sim_start;
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let written = report(
        &mut out,
        args,
        &mut sim,
        &run,
        simulated,
        started.elapsed(),
        &outcome,
    )
    .and_then(|()| out.flush());
    match (written, outcome) {
        (Ok(()), Ok(())) => ExitCode::SUCCESS,
        (Ok(()), Err(_)) => ExitCode::FAILURE,
        (Err(error), _) if error.kind() == io::ErrorKind::BrokenPipe => ExitCode::from(141),
        (Err(error), _) => {
            eprintln!("roce sim: {error}");
            ExitCode::from(2)
        }
    }
}
