//! How fast the transport moves packets when nothing else costs anything:
//!
//! * `endpoints/<op>`: two [`Endpoint`]s driven by hand, with no I/O and no bytes on a wire.
//!   Each iteration posts [`BATCH`] work requests on one side (and as many receives on the
//!   other, for SEND) — the same request each time, by reference, as a program that reposts
//!   one does — then hands every packet one endpoint's `poll_transmit_into` writes (into
//!   one reused `Transmit`, as a provider does) to the other's `handle_packet` as the [`FrameRepr`](roce_wire::FrameRepr) a receiver would parse (fixed Ethernet and
//!   IPv4 fields), until every request has completed. The throughput is request packets:
//!   64 B SEND, 64 B WRITE and 4 KiB WRITE (MTU 4096), one packet per request. What is timed
//!   is requester, responder and completer together (with posting, ACKs and completions), on
//!   one core.
//! * `sim/<op>`: the same batches through [`Sim`] on a link without faults, which adds what
//!   a real receive path pays (emit with ICRC, parse and verify) and the simulator's own
//!   event queue.
//! * `sim/write_1MiB`: one 1 MiB RDMA WRITE (MTU 1024) through [`Sim`], as bytes per second.
//!
//! Run with `cargo bench -p roce-transport --bench transport`.

use std::hint::black_box;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use roce_transport::cq::{WcStatus, WorkCompletion};
use roce_transport::qp_state::{PathMtu, QpType};
use roce_transport::sim::{LinkConfig, RetryConfig, Sim};
use roce_transport::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};
use roce_transport::{Endpoint, Transmit};

#[path = "../tests/common/mod.rs"]
mod common;

use common::received_frame;

/// Work requests posted per iteration: twice the requester's window of unacknowledged
/// PSNs, so the window fills and drains.
const BATCH: usize = 256;

const SRC: u64 = 0x10_0000;
const DST: u64 = 0x20_0000;

/// One benchmarked operation.
#[derive(Clone, Copy)]
struct Case {
    name: &'static str,
    op: Op,
    len: usize,
    mtu: PathMtu,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Send,
    Write,
}

const CASES: [Case; 3] = [
    Case {
        name: "send_64B",
        op: Op::Send,
        len: 64,
        mtu: PathMtu::Mtu1024,
    },
    Case {
        name: "write_64B",
        op: Op::Write,
        len: 64,
        mtu: PathMtu::Mtu1024,
    },
    Case {
        name: "write_4KiB",
        op: Op::Write,
        len: 4096,
        mtu: PathMtu::Mtu4096,
    },
];

/// Two connected RC QPs with a source and a destination region, set up through [`Sim`]
/// (which owns the endpoints); the `endpoints` benchmarks then bypass it.
struct Bench {
    sim: Sim,
    case: Case,
    qa: u32,
    qb: u32,
    send_wr: SendWr,
    recv_wr: RecvWr,
    completions: Vec<WorkCompletion>,
    /// Every packet is built here in turn (as a provider does, to reuse its buffer).
    transmit: Transmit,
}

impl Bench {
    fn new(case: Case) -> Self {
        let mut sim = Sim::new(LinkConfig::default(), 1);
        let (a, b) = (sim.add_node(), sim.add_node());
        let pair = sim.connect(a, b, QpType::Rc, case.mtu, RetryConfig::default());
        let src_key = sim.reg(a, SRC, &vec![0x5A; case.len]);
        let dst_key = sim.reg(b, DST, &vec![0; case.len]);
        let op = match case.op {
            Op::Send => SendOp::Send,
            Op::Write => SendOp::RdmaWrite {
                remote_addr: DST,
                rkey: dst_key,
            },
        };
        let sge = |addr, lkey| Sge {
            addr,
            length: case.len as u32,
            lkey,
        };
        Bench {
            sim,
            case,
            qa: pair.a.1,
            qb: pair.b.1,
            send_wr: SendWr {
                wr_id: 1,
                op,
                sg_list: [sge(SRC, src_key)].into(),
                inline_data: Vec::new(),
                flags: SendFlags::SIGNALED,
                ud: None,
                xrc_srqn: 0,
            },
            recv_wr: RecvWr {
                wr_id: 2,
                sg_list: [sge(DST, dst_key)].into(),
            },
            completions: Vec::with_capacity(BATCH),
            transmit: Transmit::default(),
        }
    }

    /// Request packets one batch sends.
    fn packets(&self) -> u64 {
        (BATCH * self.case.len.div_ceil(self.case.mtu.bytes())) as u64
    }

    fn post_batch(&mut self) {
        for _ in 0..BATCH {
            if self.case.op == Op::Send {
                self.sim
                    .post_recv(1, self.qb, &self.recv_wr)
                    .expect("receive queue has room");
            }
            self.sim
                .post_send(0, self.qa, &self.send_wr)
                .expect("send queue has room");
        }
    }

    /// Takes the batch's completions and checks that every one succeeded.
    fn reap(&mut self) {
        self.completions.clear();
        let cq = self.sim.nodes[0].send_cq;
        self.sim.nodes[0]
            .endpoint
            .cq(cq)
            .poll(usize::MAX, &mut self.completions);
        if self.case.op == Op::Send {
            let cq = self.sim.nodes[1].recv_cq;
            self.sim.nodes[1]
                .endpoint
                .cq(cq)
                .poll(usize::MAX, &mut self.completions);
        }
        let expected = if self.case.op == Op::Send { 2 } else { 1 } * BATCH;
        assert_eq!(self.completions.len(), expected);
        assert!(self
            .completions
            .iter()
            .all(|c| c.status == WcStatus::Success));
    }

    /// One batch, endpoint to endpoint; returns (request packets, acknowledgements).
    fn round_direct(&mut self) -> (u64, u64) {
        self.post_batch();
        let now = self.sim.now;
        let (left, right) = self.sim.nodes.split_at_mut(1);
        let (a, b) = (&mut left[0].endpoint, &mut right[0].endpoint);
        let (mut requests, mut acks) = (0, 0);
        loop {
            let sent = pump(a, b, &mut self.transmit, now, [1, 2]);
            let answered = pump(b, a, &mut self.transmit, now, [2, 1]);
            requests += sent;
            acks += answered;
            if sent == 0 && answered == 0 {
                break;
            }
        }
        self.reap();
        (requests, acks)
    }

    /// One batch through the simulator.
    fn round_sim(&mut self) {
        self.post_batch();
        let mut done = 0;
        let want = BATCH;
        let completed = self.sim.run_until(1_000_000, |sim| {
            let cq = sim.nodes[0].send_cq;
            let mut out = Vec::new();
            done += sim.nodes[0].endpoint.cq(cq).poll(usize::MAX, &mut out);
            done == want
        });
        assert!(completed);
        if self.case.op == Op::Send {
            let cq = self.sim.nodes[1].recv_cq;
            self.completions.clear();
            self.sim.nodes[1]
                .endpoint
                .cq(cq)
                .poll(usize::MAX, &mut self.completions);
        }
    }
}

/// Hands everything `from` has to send to `to`; returns how many packets moved. `hosts`
/// are the last IPv4 octets of the sender and the receiver.
fn pump(
    from: &mut Endpoint,
    to: &mut Endpoint,
    transmit: &mut Transmit,
    now: Instant,
    hosts: [u8; 2],
) -> u64 {
    let mut moved = 0;
    while from.poll_transmit_into(now, transmit) {
        to.handle_packet(now, &received_frame(transmit, hosts));
        moved += 1;
    }
    moved
}

fn endpoints(c: &mut Criterion) {
    let mut group = c.benchmark_group("endpoints");
    for case in CASES {
        let mut bench = Bench::new(case);
        let (requests, acks) = bench.round_direct();
        assert_eq!(requests, bench.packets(), "{}", case.name);
        eprintln!(
            "endpoints/{}: {requests} request packets and {acks} ACKs per batch",
            case.name
        );
        group.throughput(Throughput::Elements(bench.packets()));
        group.bench_function(case.name, |b| b.iter(|| black_box(bench.round_direct())));
    }
    group.finish();
}

fn sim(c: &mut Criterion) {
    let mut group = c.benchmark_group("sim");
    for case in CASES {
        let mut bench = Bench::new(case);
        group.throughput(Throughput::Elements(bench.packets()));
        group.bench_function(case.name, |b| b.iter(|| bench.round_sim()));
    }

    const LEN: usize = 1 << 20;
    let mut sim = Sim::new(LinkConfig::default(), 1);
    let (a, b) = (sim.add_node(), sim.add_node());
    let pair = sim.connect(a, b, QpType::Rc, PathMtu::Mtu1024, RetryConfig::default());
    let src_key = sim.reg(a, SRC, &vec![0x5A; LEN]);
    let dst_key = sim.reg(b, DST, &vec![0; LEN]);
    let write = SendWr {
        wr_id: 1,
        op: SendOp::RdmaWrite {
            remote_addr: DST,
            rkey: dst_key,
        },
        sg_list: [Sge {
            addr: SRC,
            length: LEN as u32,
            lkey: src_key,
        }]
        .into(),
        inline_data: Vec::new(),
        flags: SendFlags::SIGNALED,
        ud: None,
        xrc_srqn: 0,
    };
    group.throughput(Throughput::Bytes(LEN as u64));
    let mut ran = false;
    group.bench_function("write_1MiB", |bencher| {
        ran = true;
        bencher.iter(|| {
            sim.post_send(a, pair.a.1, &write).unwrap();
            let mut completions = Vec::new();
            let done = sim.run_until(1_000_000, |sim| {
                completions.extend(sim.poll_send(a));
                !completions.is_empty()
            });
            assert!(done && completions[0].status == WcStatus::Success);
        })
    });
    group.finish();
    if ran {
        assert_eq!(sim.mr_bytes(b, dst_key), vec![0x5A; LEN]);
    }
}

criterion_group!(benches, endpoints, sim);
criterion_main!(benches);
