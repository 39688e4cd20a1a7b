//! The verbs layer's own cost per message, without a kernel or a second thread: two
//! caller-driven contexts over the in-memory wire, in one thread, so that a run is the same
//! instructions every time. Run it under callgrind and divide by the messages:
//!
//! ```text
//! cargo build --release -p roce-verbs --example hot_path
//! valgrind --tool=callgrind target/release/examples/hot_path rate 20000
//! valgrind --tool=callgrind target/release/examples/hot_path pingpong 5000
//! ```
//!
//! `rate N`: N 64-byte WRITEs, each signaled, 64 in flight, one request per `post_send`
//! (as perftest posts), A's CQ polled between bursts and B's to move B's engine.
//! `pingpong N`: N 64-byte SENDs from A, each answered by a SEND from B.
//! `read N`: N 64 KiB READs from A (16 responses of 4 KiB each), 4 in flight, as `roce
//! demo` reads: the responder's cost per response packet.
//! `write N`: N 64 KiB WRITEs from A (16 packets of 4 KiB each), 4 in flight, as `roce
//! demo` writes: the requester's cost per packet.
//! Only the public API is used, so the same file measures another revision.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use roce_provider::memory::memory_pair;
use roce_verbs::{
    AccessFlags, Addressing, BackendChoice, ConnectOptions, Context, Cq, Device, OpenOptions,
    PathMtu, Progress, QpCaps, QpInitAttr, QpType, RecvWr, SendFlags, SendOp, SendWr, WcStatus,
    WorkCompletion,
};

const IP_A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 0xA];
const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 0xB];
const IN_FLIGHT: u64 = 64;
const BULK_LEN: usize = 64 * 1024;
const BULK_IN_FLIGHT: u64 = 4;
/// Polls without progress before giving up: the wire is in memory, so nothing is late.
const STALL: u32 = 1_000_000;

fn open(
    wire: roce_provider::memory::MemoryBackend,
    (mac, ip): ([u8; 6], Ipv4Addr),
    (peer_mac, peer_ip): ([u8; 6], Ipv4Addr),
) -> Context {
    let device = Device::in_memory(mac, ip);
    let addressing = Addressing {
        mac,
        ip,
        neighbours: HashMap::from([(peer_ip, peer_mac)]),
    };
    let options = OpenOptions {
        backend: BackendChoice::Custom(Box::new(wire), addressing),
        progress: Progress::Caller,
        seed: Some([7; 32]),
        ..OpenOptions::default()
    };
    Context::open(&device, options).expect("open")
}

fn check(completions: &[WorkCompletion]) {
    assert!(completions.iter().all(|wc| wc.status == WcStatus::Success));
}

fn main() {
    let mut args = std::env::args().skip(1);
    let test = args.next().unwrap_or_else(|| "rate".into());
    let n: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(20_000);
    let (wire_a, wire_b) = memory_pair();
    let ctx_a = open(wire_a, (MAC_A, IP_A), (MAC_B, IP_B));
    let ctx_b = open(wire_b, (MAC_B, IP_B), (MAC_A, IP_A));
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (
        ctx_a.create_cq(1024, None).unwrap(),
        ctx_b.create_cq(1024, None).unwrap(),
    );
    fn attr(cq: &Cq) -> QpInitAttr<'_> {
        let caps = QpCaps {
            max_send_wr: 256,
            max_recv_wr: 256,
            ..QpCaps::default()
        };
        QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            caps,
            sq_sig_all: false,
        }
    }
    let (qp_a, qp_b) = (
        pd_a.create_qp(&attr(&cq_a)).unwrap(),
        pd_b.create_qp(&attr(&cq_b)).unwrap(),
    );
    let options = ConnectOptions {
        mtu: PathMtu::Mtu4096,
        ..ConnectOptions::default()
    };
    qp_a.connect(&qp_b.endpoint(1).unwrap(), &options).unwrap();
    qp_b.connect(&qp_a.endpoint(1).unwrap(), &options).unwrap();
    let all = AccessFlags::all();
    let (mr_a, mr_b) = (
        pd_a.reg_mr(BULK_LEN, all).unwrap(),
        pd_b.reg_mr(BULK_LEN, all).unwrap(),
    );
    let send = |wr_id, op, sge| SendWr {
        wr_id,
        op,
        sg_list: [sge].into(),
        inline_data: Vec::new(),
        flags: SendFlags::SIGNALED,
        ud: None,
        xrc_srqn: 0,
    };
    let mut seen = Vec::new();
    // Posts `n` requests with `post`, at most `in_flight` of them outstanding: A's CQ
    // polled between bursts and B's to move B's engine.
    let mut in_windows = |n: u64, in_flight: u64, post: &mut dyn FnMut(u64)| {
        let (mut posted, mut done, mut idle) = (0, 0, 0);
        while done < n {
            while posted < n && posted - done < in_flight {
                post(posted);
                posted += 1;
            }
            seen.clear();
            let got = cq_a.poll_into(16, &mut seen).unwrap();
            check(&seen);
            cq_b.poll_into(16, &mut seen).unwrap();
            done += got as u64;
            idle = if got == 0 { idle + 1 } else { 0 };
            assert!(idle < STALL, "stalled at {done}");
        }
    };
    match test.as_str() {
        "rate" => {
            let op = SendOp::RdmaWrite {
                remote_addr: mr_b.addr(),
                rkey: mr_b.rkey(),
            };
            in_windows(n, IN_FLIGHT, &mut |i| {
                qp_a.post_send([send(i, op, mr_a.sge(0, 64))]).unwrap();
            });
        }
        "pingpong" => {
            let recv = |mr: &roce_verbs::Mr| RecvWr {
                wr_id: 9,
                sg_list: [mr.sge(64, 64)].into(),
            };
            for i in 0..n {
                qp_b.post_recv([recv(&mr_b)]).unwrap();
                qp_a.post_recv([recv(&mr_a)]).unwrap();
                qp_a.post_send([send(i, SendOp::Send, mr_a.sge(0, 64))])
                    .unwrap();
                // B answers its receive; A waits for its send and the answer.
                let mut idle = 0;
                let (mut a_done, mut b_replied) = (0, false);
                while a_done < 2 {
                    seen.clear();
                    cq_b.poll_into(4, &mut seen).unwrap();
                    check(&seen);
                    for wc in &seen {
                        if wc.wr_id == 9 && !b_replied {
                            b_replied = true;
                            let reply = send(i, SendOp::Send, mr_b.sge(0, 64));
                            qp_b.post_send([reply]).unwrap();
                        }
                    }
                    seen.clear();
                    a_done += cq_a.poll_into(4, &mut seen).unwrap();
                    check(&seen);
                    idle += 1;
                    assert!(idle < STALL, "stalled at {i}");
                }
            }
        }
        "read" | "write" => {
            let (remote_addr, rkey) = (mr_b.addr(), mr_b.rkey());
            let op = if test == "read" {
                SendOp::RdmaRead { remote_addr, rkey }
            } else {
                SendOp::RdmaWrite { remote_addr, rkey }
            };
            in_windows(n, BULK_IN_FLIGHT, &mut |i| {
                let sge = mr_a.sge(0, BULK_LEN as u32);
                qp_a.post_send([send(i, op, sge)]).unwrap();
            });
        }
        other => panic!("unknown test {other}: rate, pingpong, read or write"),
    }
    println!("{test} {n} done");
}
