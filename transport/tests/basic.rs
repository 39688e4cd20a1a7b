//! Every RC operation once, over a clean and over a lossy simulated link.

use roce_transport::cq::{WcOpcode, WcStatus};
use roce_transport::qp_state::{PathMtu, QpType};
use roce_transport::sim::{LinkConfig, RetryConfig, Sim};
use roce_transport::wr::{RecvWr, SendOp, Sge};
use roce_transport::Transmit;
use roce_wire::Opcode;

mod common;
use common::{pattern, recv_wr, sge, signaled};

fn lossy() -> LinkConfig {
    LinkConfig {
        loss: 0.05,
        reorder: 0.05,
        duplicate: 0.01,
        corrupt: 0.01,
        ..LinkConfig::default()
    }
}

/// SEND, WRITE, READ and both atomics over RC; every byte checked, and the bytes around
/// the targets untouched.
fn rc_all_operations(link: LinkConfig, mtu: PathMtu, seed: u64) {
    let mut sim = Sim::new(link, seed);
    let (a, b) = (sim.add_node(), sim.add_node());
    let pair = sim.connect(a, b, QpType::Rc, mtu, RetryConfig::default());
    let (qa, qb) = (pair.a.1, pair.b.1);
    let len = 300_000;
    let src = pattern(len, 1);
    let src_key = sim.reg(a, 0x10_0000, &src);
    let dst_key = sim.reg(b, 0x20_0000, &vec![0; len]);
    let dst = Sge {
        addr: 0x20_0000,
        length: len as u32,
        lkey: dst_key,
    };
    sim.post_recv(
        b,
        qb,
        &RecvWr {
            wr_id: 77,
            sg_list: [dst].into(),
        },
    )
    .unwrap();
    let whole = Sge {
        addr: 0x10_0000,
        length: len as u32,
        lkey: src_key,
    };
    sim.post_send(a, qa, &signaled(1, SendOp::Send, whole))
        .unwrap();
    let mut recv = Vec::new();
    assert!(sim.run_until(1_000_000, |sim| {
        recv.extend(sim.poll_recv(b));
        !recv.is_empty()
    }));
    assert_eq!(recv.len(), 1);
    assert_eq!(
        (recv[0].wr_id, recv[0].status, recv[0].byte_len),
        (77, WcStatus::Success, len as u32)
    );
    assert_eq!(sim.mr_bytes(b, dst_key), src);

    // WRITE the source into the second half of a fresh region, READ it back elsewhere.
    let target = sim.reg(b, 0x40_0000, &vec![0; 2 * len]);
    let write = SendOp::RdmaWrite {
        remote_addr: 0x40_0000 + len as u64,
        rkey: target,
    };
    sim.post_send(a, qa, &signaled(2, write, whole)).unwrap();
    let back_key = sim.reg(a, 0x80_0000, &vec![0; len]);
    let read = SendOp::RdmaRead {
        remote_addr: 0x40_0000 + len as u64,
        rkey: target,
    };
    let back = Sge {
        addr: 0x80_0000,
        length: len as u32,
        lkey: back_key,
    };
    sim.post_send(a, qa, &signaled(3, read, back)).unwrap();
    // Atomics on an 8-byte counter at the start of `target`.
    let result_key = sim.reg(a, 0x90_0000, &[0; 16]);
    let faa = SendOp::FetchAdd {
        remote_addr: 0x40_0000,
        rkey: target,
        add: 5,
    };
    let first_result = Sge {
        addr: 0x90_0000,
        length: 8,
        lkey: result_key,
    };
    sim.post_send(a, qa, &signaled(4, faa, first_result))
        .unwrap();
    let cas = SendOp::CompareSwap {
        remote_addr: 0x40_0000,
        rkey: target,
        compare: 5,
        swap: 99,
    };
    let second_result = Sge {
        addr: 0x90_0008,
        length: 8,
        lkey: result_key,
    };
    sim.post_send(a, qa, &signaled(5, cas, second_result))
        .unwrap();

    let mut sends = Vec::new();
    let done = sim.run_until(2_000_000, |sim| {
        sends.extend(sim.poll_send(a));
        sends.len() == 5
    });
    assert!(done, "completions: {sends:?}, stats {:?}", sim.stats);
    let statuses: Vec<_> = sends
        .iter()
        .map(|c| (c.wr_id, c.status, c.opcode))
        .collect();
    assert_eq!(
        statuses,
        [
            (1, WcStatus::Success, WcOpcode::Send),
            (2, WcStatus::Success, WcOpcode::RdmaWrite),
            (3, WcStatus::Success, WcOpcode::RdmaRead),
            (4, WcStatus::Success, WcOpcode::FetchAdd),
            (5, WcStatus::Success, WcOpcode::CompareSwap),
        ]
    );
    let target_bytes = sim.mr_bytes(b, target);
    assert_eq!(&target_bytes[len..], &src[..]);
    assert_eq!(&target_bytes[8..len], &vec![0; len - 8][..], "untouched");
    assert_eq!(
        u64::from_ne_bytes(target_bytes[..8].try_into().unwrap()),
        99
    );
    assert_eq!(sim.mr_bytes(a, back_key), src);
    let results = sim.mr_bytes(a, result_key);
    assert_eq!(
        u64::from_ne_bytes(results[..8].try_into().unwrap()),
        0,
        "FETCH_ADD saw 0"
    );
    assert_eq!(
        u64::from_ne_bytes(results[8..].try_into().unwrap()),
        5,
        "CMP_SWAP saw 5"
    );
    assert_eq!(sim.stats.corrupt_accepted, 0);
}

#[test]
fn rc_operations_on_a_clean_link() {
    rc_all_operations(LinkConfig::default(), PathMtu::Mtu1024, 1);
}

#[test]
fn rc_operations_on_a_lossy_link() {
    for seed in 0..5 {
        rc_all_operations(lossy(), PathMtu::Mtu4096, seed);
    }
}

/// UC SEND and WRITE (with immediate) on a clean link: data arrives, requester completes at
/// transmit.
#[test]
fn uc_send_and_write_with_immediate() {
    let mut sim = Sim::new(LinkConfig::default(), 3);
    let (a, b) = (sim.add_node(), sim.add_node());
    let pair = sim.connect(a, b, QpType::Uc, PathMtu::Mtu256, RetryConfig::default());
    let (qa, qb) = (pair.a.1, pair.b.1);
    let src = pattern(1000, 9);
    let src_key = sim.reg(a, 0x1000, &src);
    let recv_key = sim.reg(b, 0x8000, &[0; 1000]);
    let target_key = sim.reg(b, 0x9000, &[0; 1000]);
    for wr_id in [10, 11] {
        let sge = Sge {
            addr: 0x8000,
            length: 1000,
            lkey: recv_key,
        };
        sim.post_recv(
            b,
            qb,
            &RecvWr {
                wr_id,
                sg_list: [sge].into(),
            },
        )
        .unwrap();
    }
    let whole = Sge {
        addr: 0x1000,
        length: 1000,
        lkey: src_key,
    };
    sim.post_send(a, qa, &signaled(1, SendOp::SendWithImm(0xfeed), whole))
        .unwrap();
    let write = SendOp::RdmaWriteWithImm {
        remote_addr: 0x9000,
        rkey: target_key,
        imm: 7,
    };
    sim.post_send(a, qa, &signaled(2, write, whole)).unwrap();
    let mut recv = Vec::new();
    assert!(sim.run_until(10_000, |sim| {
        recv.extend(sim.poll_recv(b));
        recv.len() == 2
    }));
    let got: Vec<_> = recv
        .iter()
        .map(|c| (c.wr_id, c.status, c.opcode, c.byte_len, c.imm_data))
        .collect();
    assert_eq!(
        got,
        [
            (10, WcStatus::Success, WcOpcode::Recv, 1000, Some(0xfeed)),
            (
                11,
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                1000,
                Some(7)
            ),
        ]
    );
    assert_eq!(sim.mr_bytes(b, recv_key), src);
    assert_eq!(sim.mr_bytes(b, target_key), src);
    let sends: Vec<_> = sim
        .poll_send(a)
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(sends, [(1, WcStatus::Success), (2, WcStatus::Success)]);
}

/// UD SEND: the GRH area, the source QP and the data.
#[test]
fn ud_send_delivers_with_grh() {
    use roce_transport::wr::UdDest;
    let mut sim = Sim::new(LinkConfig::default(), 4);
    let (a, b) = (sim.add_node(), sim.add_node());
    let caps = roce_transport::qp::QpCaps::default();
    let qa = sim.create_qp(a, QpType::Ud, caps);
    let qb = sim.create_qp(b, QpType::Ud, caps);
    sim.bring_up_ud(a, qa, 0x1111_1111);
    sim.bring_up_ud(b, qb, 0x1111_1111);
    let src = pattern(512, 5);
    let src_key = sim.reg(a, 0x1000, &src);
    let recv_key = sim.reg(b, 0x8000, &[0; 40 + 512]);
    let sge = Sge {
        addr: 0x8000,
        length: 552,
        lkey: recv_key,
    };
    sim.post_recv(
        b,
        qb,
        &RecvWr {
            wr_id: 5,
            sg_list: [sge].into(),
        },
    )
    .unwrap();
    let mut wr = signaled(
        1,
        SendOp::Send,
        Sge {
            addr: 0x1000,
            length: 512,
            lkey: src_key,
        },
    );
    wr.ud = Some(UdDest {
        av: sim.av_of(b),
        remote_qpn: qb,
        remote_qkey: 0x1111_1111,
    });
    sim.post_send(a, qa, &wr).unwrap();
    let mut recv = Vec::new();
    assert!(sim.run_until(1_000, |sim| {
        recv.extend(sim.poll_recv(b));
        !recv.is_empty()
    }));
    assert_eq!(
        (recv[0].status, recv[0].byte_len, recv[0].src_qp),
        (WcStatus::Success, 552, qa)
    );
    let got = sim.mr_bytes(b, recv_key);
    assert_eq!(&got[40..], &src[..]);
    // IPv4: the last 20 bytes of the GRH area hold the IPv4 header, from node a.
    assert_eq!(got[20] >> 4, 4);
    assert_eq!(&got[20 + 12..20 + 16], &sim.nodes[a].ip.octets());
}

/// Everything two endpoints send each other for a WRITE of three packets, a READ of two and
/// a SEND, handed straight from one to the other, recording every packet: with
/// `reuse`, through one `Transmit` that `poll_transmit_into` refills.
fn exchange(reuse: bool) -> Vec<Transmit> {
    let mut sim = Sim::new(LinkConfig::default(), 9);
    let (a, b) = (sim.add_node(), sim.add_node());
    let pair = sim.connect(a, b, QpType::Rc, PathMtu::Mtu1024, RetryConfig::default());
    let (qa, qb) = (pair.a.1, pair.b.1);
    let src_key = sim.reg(a, 0x10_0000, &pattern(3000, 1));
    let dst_key = sim.reg(b, 0x20_0000, &pattern(3000, 2));
    let source = sge(0x10_0000, 3000, src_key);
    let write = SendOp::RdmaWrite {
        remote_addr: 0x20_0000,
        rkey: dst_key,
    };
    let read = SendOp::RdmaRead {
        remote_addr: 0x20_0000,
        rkey: dst_key,
    };
    sim.post_send(a, qa, &signaled(1, write, source)).unwrap();
    sim.post_send(a, qa, &signaled(2, read, sge(0x10_0000, 2048, src_key)))
        .unwrap();
    sim.post_recv(b, qb, &recv_wr(3, sge(0x20_0000, 100, dst_key)))
        .unwrap();
    sim.post_send(
        a,
        qa,
        &signaled(3, SendOp::Send, sge(0x10_0000, 100, src_key)),
    )
    .unwrap();
    let ips = [sim.nodes[a].ip, sim.nodes[b].ip];
    let now = sim.now;
    let mut sent = Vec::new();
    let mut transmit = Transmit::default();
    for _round in 0..10 {
        for from in [a, b] {
            loop {
                let next = if reuse {
                    sim.nodes[from]
                        .endpoint
                        .poll_transmit_into(now, &mut transmit)
                        .then(|| transmit.clone())
                } else {
                    sim.nodes[from].endpoint.poll_transmit(now)
                };
                let Some(next) = next else { break };
                let frame = next.frame([2; 6], ips[from].into(), [2; 6]).unwrap();
                sim.nodes[1 - from].endpoint.handle_packet(now, &frame);
                sent.push(next);
            }
        }
    }
    sent
}

/// A reused `Transmit` carries exactly what fresh ones do: an ACK after a data packet has
/// no payload left over, and READ responses carry theirs.
#[test]
fn reused_transmit_matches_fresh_ones() {
    let fresh = exchange(false);
    let opcodes: Vec<Opcode> = fresh.iter().map(|t| t.packet.bth.opcode).collect();
    for expected in [
        Opcode::RcRdmaWriteFirst,
        Opcode::RcRdmaWriteLast,
        Opcode::RcAcknowledge,
        Opcode::RcRdmaReadResponseLast,
        Opcode::RcSendOnly,
    ] {
        assert!(opcodes.contains(&expected), "{expected:?} in {opcodes:?}");
    }
    assert_eq!(exchange(true), fresh);
}

/// Destroying a QP leaves the others reachable by number (packets find them) and taking
/// turns to send; the destroyed one is gone for good.
#[test]
fn destroyed_qp_leaves_the_others_working_in_turn() {
    let mut sim = Sim::new(LinkConfig::default(), 3);
    let (a, b) = (sim.add_node(), sim.add_node());
    let pairs: Vec<_> = (0..3)
        .map(|_| sim.connect(a, b, QpType::Rc, PathMtu::Mtu1024, RetryConfig::default()))
        .collect();
    let src_key = sim.reg(a, 0x10_0000, &pattern(64, 1));
    let dst_key = sim.reg(b, 0x20_0000, &[0; 64]);
    let write = SendOp::RdmaWrite {
        remote_addr: 0x20_0000,
        rkey: dst_key,
    };
    let gone = pairs[0].a.1;
    assert!(sim.nodes[a].endpoint.destroy_qp(gone));
    assert!(!sim.nodes[a].endpoint.destroy_qp(gone));
    assert_eq!(sim.nodes[a].endpoint.qp_state(gone), None);
    let live = [pairs[1].a.1, pairs[2].a.1];
    for (wr_id, &qpn) in live.iter().chain(&live).enumerate() {
        let wr = signaled(wr_id as u64, write, sge(0x10_0000, 64, src_key));
        sim.post_send(a, qpn, &wr).unwrap();
    }
    let now = sim.now;
    let order: Vec<u32> = std::iter::from_fn(|| sim.nodes[a].endpoint.poll_transmit(now))
        .map(|transmit| transmit.src_qpn)
        .collect();
    assert_eq!(order.len(), 4);
    assert_ne!(order[0], order[1], "QPs take turns: {order:?}");
    assert_eq!(order[..2], order[2..], "QPs take turns: {order:?}");

    // Everything again, through the link this time: both QPs complete.
    for (wr_id, &qpn) in live.iter().enumerate() {
        let wr = signaled(10 + wr_id as u64, write, sge(0x10_0000, 64, src_key));
        sim.post_send(a, qpn, &wr).unwrap();
    }
    let mut done = Vec::new();
    assert!(sim.run_until(10_000, |sim| {
        done.extend(sim.poll_send(a));
        done.iter().filter(|c| c.wr_id >= 10).count() == 2
    }));
    assert!(done.iter().all(|c| c.status == WcStatus::Success));
}
