//! Shared receive queues: several QPs (RC, UC, UD) taking their receives from one SRQ,
//! multi-packet messages interleaved between them, the limit event, RNR while the SRQ is
//! empty, and the errno of every refused SRQ call as rxe gives it (rxe_srq_chk_init,
//! rxe_srq_chk_attr, its post_srq_recv, ib_destroy_srq's EBUSY).

use std::collections::HashMap;

use roce_transport::cq::{WcOpcode, WcStatus};
use roce_transport::endpoint::{AsyncEvent, CreateQpError};
use roce_transport::errno::{EBUSY, EINVAL, ENOMEM};
use roce_transport::qp::{PostError, QpCaps, QpInit};
use roce_transport::qp_state::{PathMtu, QpAttr, QpState, QpType};
use roce_transport::sim::{LinkConfig, RetryConfig, Sim};
use roce_transport::srq::{SrqAttr, SrqError, SrqModify};
use roce_transport::wr::{RecvWr, SendOp, Sge, UdDest};
use roce_transport::{SrqId, LIMITS};
use roce_wire::Opcode;

mod common;
use common::*;

/// Bytes of each receive buffer: a two-packet SEND at MTU 1024 fits, with the GRH for UD.
const SLOT: usize = 2048;

fn sim() -> Sim {
    let mut sim = Sim::new(LinkConfig::default(), 13);
    assert_eq!((sim.add_node(), sim.add_node()), (A, B));
    sim
}

fn srq_attr(max_wr: u32) -> SrqAttr {
    SrqAttr {
        max_wr,
        max_sge: 1,
        srq_limit: 0,
    }
}

/// A QP of `qp_type` on B that takes its receives from `srq`.
fn qp_on_srq(sim: &mut Sim, qp_type: QpType, srq: SrqId) -> u32 {
    let node = &mut sim.nodes[B];
    let init = QpInit {
        pd: node.pd,
        qp_type,
        caps: QpCaps::default(),
        sq_sig_all: false,
    };
    node.endpoint
        .create_qp_with_srq(init, node.send_cq, node.recv_cq, srq)
        .unwrap()
}

/// A QP on A connected to a new QP on B that takes its receives from `srq`.
fn connect_on_srq(sim: &mut Sim, qp_type: QpType, srq: SrqId, retry: RetryConfig) -> (u32, u32) {
    let qa = sim.create_qp(A, qp_type, QpCaps::default());
    let qb = qp_on_srq(sim, qp_type, srq);
    sim.connect_qps((A, qa), (B, qb), qp_type, PathMtu::Mtu1024, retry);
    (qa, qb)
}

/// Posts `count` receives to the SRQ, wr_id `first..`, each into its own `SLOT` of the
/// region `key` at `DST`.
fn post_slots(sim: &mut Sim, srq: SrqId, key: u32, first: u64, count: u64) {
    for wr_id in first..first + count {
        let wr = recv_wr(wr_id, sge(DST + wr_id * SLOT as u64, SLOT, key));
        sim.nodes[B].endpoint.post_srq_recv(srq, &wr).unwrap();
    }
}

/// The region at `DST` on B with room for `slots` receive buffers.
fn receive_region(sim: &mut Sim, slots: usize) -> u32 {
    sim.reg(B, DST, &vec![0; SLOT * slots])
}

fn send(sim: &mut Sim, qpn: u32, wr_id: u64, key: u32, offset: u64, len: usize) {
    sim.post_send(
        A,
        qpn,
        &signaled(wr_id, SendOp::Send, sge(SRC + offset, len, key)),
    )
    .unwrap();
}

fn events(sim: &mut Sim, node: usize) -> Vec<AsyncEvent> {
    sim.nodes[node].endpoint.take_events()
}

/// Four RC QPs on one SRQ receive 1500-byte SENDs (two packets each) that the requester
/// interleaves packet by packet: each message lands whole in one SRQ WQE, each WQE is used
/// once, and each QP's messages complete in its own order.
#[test]
fn four_rc_qps_share_one_srq() {
    let mut sim = sim();
    const PER_QP: u64 = 10;
    const LEN: usize = 1500;
    let srq = sim.nodes[B].endpoint.create_srq(srq_attr(64)).unwrap();
    let key = receive_region(&mut sim, 64);
    post_slots(&mut sim, srq, key, 0, 4 * PER_QP);
    let qps: Vec<(u32, u32)> = (0..4)
        .map(|_| connect_on_srq(&mut sim, QpType::Rc, srq, RetryConfig::default()))
        .collect();
    let messages: Vec<Vec<u8>> = (0..4 * PER_QP)
        .map(|n| pattern(LEN, (n as u8).wrapping_mul(7) + 1))
        .collect();
    let src = sim.reg(A, SRC, &messages.concat());
    // Message n goes on QP n % 4, so every QP has a message in flight at once.
    for (n, _) in messages.iter().enumerate() {
        let (qa, _) = qps[n % 4];
        send(&mut sim, qa, n as u64, src, (n * LEN) as u64, LEN);
    }
    let sends = wait_send(&mut sim, A, messages.len());
    assert!(
        sends.iter().all(|c| c.status == WcStatus::Success),
        "{sends:?}"
    );
    let recvs = wait_recv(&mut sim, B, messages.len());
    let received = sim.mr_bytes(B, key);
    let mut next_of_qp: HashMap<u32, usize> = HashMap::new();
    let mut used = vec![false; messages.len()];
    for completion in &recvs {
        assert_eq!(
            (completion.status, completion.opcode, completion.byte_len),
            (WcStatus::Success, WcOpcode::Recv, LEN as u32)
        );
        let qp = qps
            .iter()
            .position(|&(_, qb)| qb == completion.qp_num)
            .unwrap();
        let turn = next_of_qp.entry(completion.qp_num).or_default();
        let message = *turn * 4 + qp;
        *turn += 1;
        let slot = completion.wr_id as usize;
        assert!(
            !std::mem::replace(&mut used[slot], true),
            "WQE {slot} used twice"
        );
        let at = (completion.wr_id * SLOT as u64) as usize;
        assert_eq!(
            received[at..at + LEN],
            messages[message],
            "message {message}"
        );
    }
    assert!(used.iter().all(|&used| used));
    assert!(events(&mut sim, B).is_empty());
}

/// A two-packet SEND takes one WQE from the SRQ, not one per packet: with two WQEs, a
/// message to each of two QPs lands, the second in the WQE the first left.
#[test]
fn a_multi_packet_message_takes_one_wqe() {
    let mut sim = sim();
    let srq = sim.nodes[B].endpoint.create_srq(srq_attr(2)).unwrap();
    let key = receive_region(&mut sim, 2);
    post_slots(&mut sim, srq, key, 0, 2);
    let (qa1, qb1) = connect_on_srq(&mut sim, QpType::Rc, srq, RetryConfig::default());
    let (qa2, qb2) = connect_on_srq(&mut sim, QpType::Rc, srq, RetryConfig::default());
    let src = sim.reg(A, SRC, &pattern(1500, 8));
    send(&mut sim, qa1, 1, src, 0, 1500);
    let first = wait_recv(&mut sim, B, 1);
    send(&mut sim, qa2, 2, src, 0, 1500);
    let second = wait_recv(&mut sim, B, 1);
    let got: Vec<(u64, u32, WcStatus)> = first
        .iter()
        .chain(&second)
        .map(|c| (c.wr_id, c.qp_num, c.status))
        .collect();
    assert_eq!(
        got,
        [(0, qb1, WcStatus::Success), (1, qb2, WcStatus::Success)]
    );
}

/// Armed at 5 with 10 WQEs queued: the event comes when a take leaves 4, once, and the
/// limit reads 0 afterwards; armed again, it fires again.
#[test]
fn the_limit_event_fires_once_when_armed() {
    let mut sim = sim();
    let srq = sim.nodes[B].endpoint.create_srq(srq_attr(16)).unwrap();
    let key = receive_region(&mut sim, 16);
    post_slots(&mut sim, srq, key, 0, 10);
    let (qa, _) = connect_on_srq(&mut sim, QpType::Rc, srq, RetryConfig::default());
    let arm = |limit| SrqModify {
        srq_limit: Some(limit),
        ..SrqModify::default()
    };
    sim.nodes[B].endpoint.modify_srq(srq, &arm(5)).unwrap();
    assert_eq!(sim.nodes[B].endpoint.query_srq(srq).unwrap().srq_limit, 5);
    let src = sim.reg(A, SRC, &pattern(64, 2));
    let mut sent = 0;
    let mut send_one = |sim: &mut Sim| {
        sent += 1;
        send(sim, qa, sent, src, 0, 64);
        wait_recv(sim, B, 1);
        sim.nodes[B].endpoint.take_events()
    };
    // 10 → 5 queued: not below the limit.
    for _ in 0..5 {
        assert!(send_one(&mut sim).is_empty());
    }
    assert_eq!(send_one(&mut sim), [AsyncEvent::SrqLimitReached { srq }]);
    assert_eq!(sim.nodes[B].endpoint.query_srq(srq).unwrap().srq_limit, 0);
    assert!(send_one(&mut sim).is_empty(), "disarmed after firing");
    // 3 left; armed at 3, the next take leaves 2.
    sim.nodes[B].endpoint.modify_srq(srq, &arm(3)).unwrap();
    assert_eq!(send_one(&mut sim), [AsyncEvent::SrqLimitReached { srq }]);
    assert!(send_one(&mut sim).is_empty());
}

/// create, modify, post and destroy refusals, each with rxe's errno; a resize keeps the
/// queued WQEs and lets more in.
#[test]
fn srq_calls_refused_as_rxe_refuses_them() {
    let mut sim = sim();
    let endpoint = &mut sim.nodes[B].endpoint;
    for attr in [
        srq_attr(0),
        srq_attr(LIMITS.max_srq_wr + 1),
        SrqAttr {
            max_sge: LIMITS.max_srq_sge + 1,
            ..srq_attr(4)
        },
    ] {
        let error = endpoint.create_srq(attr).unwrap_err();
        assert!(matches!(error, SrqError::InvalidAttr(_)), "{attr:?}");
        assert_eq!(error.errno(), EINVAL);
    }
    let srq = endpoint.create_srq(srq_attr(4)).unwrap();
    let key = receive_region(&mut sim, 8);
    let endpoint = &mut sim.nodes[B].endpoint;
    let wr = |wr_id| recv_wr(wr_id, sge(DST, SLOT, key));
    let two_sges = RecvWr {
        wr_id: 5,
        sg_list: [sge(DST, 8, key), sge(DST + 8, 8, key)]
            .into_iter()
            .collect(),
    };
    let error = endpoint.post_srq_recv(srq, &two_sges).unwrap_err();
    assert_eq!((error, error.errno()), (SrqError::TooManySge, EINVAL));
    for wr_id in 0..4 {
        endpoint.post_srq_recv(srq, &wr(wr_id)).unwrap();
    }
    let full = endpoint.post_srq_recv(srq, &wr(4)).unwrap_err();
    assert_eq!((full, full.errno()), (SrqError::QueueFull, ENOMEM));

    let modify = |max_wr: Option<u32>, srq_limit: Option<u32>| SrqModify { max_wr, srq_limit };
    let refused = [
        modify(Some(3), None),                     // below the 4 queued
        modify(Some(0), None),                     // zero
        modify(Some(LIMITS.max_srq_wr + 1), None), // beyond the device
        modify(None, Some(5)),                     // limit beyond max_wr
        modify(Some(8), Some(9)),                  // limit beyond the new max_wr
    ];
    for change in refused {
        let error = endpoint.modify_srq(srq, &change).unwrap_err();
        assert_eq!(error.errno(), EINVAL, "{change:?}");
    }
    assert_eq!(
        endpoint.query_srq(srq).unwrap(),
        srq_attr(4),
        "nothing changed"
    );
    endpoint.modify_srq(srq, &modify(Some(8), Some(6))).unwrap();
    let error = endpoint
        .modify_srq(srq, &modify(Some(5), None))
        .unwrap_err();
    assert_eq!(error.errno(), EINVAL, "below the armed limit");
    for wr_id in 4..8 {
        endpoint.post_srq_recv(srq, &wr(wr_id)).unwrap();
    }
    assert_eq!(
        endpoint.post_srq_recv(srq, &wr(8)),
        Err(SrqError::QueueFull)
    );
    assert_eq!(
        endpoint.query_srq(srq).unwrap(),
        SrqAttr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 6
        }
    );

    // A QP on the SRQ: its own post_recv is EINVAL, and the SRQ cannot go while it exists.
    let qb = qp_on_srq(&mut sim, QpType::Rc, srq);
    let endpoint = &mut sim.nodes[B].endpoint;
    let attr = QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(1),
        access_flags: Some(roce_transport::AccessFlags::empty()),
        ..QpAttr::default()
    };
    endpoint.modify_qp(sim.now, qb, &attr).unwrap();
    let error = endpoint.post_recv(sim.now, qb, &wr(9)).unwrap_err();
    assert_eq!((error, error.errno()), (PostError::UsesSrq, EINVAL));
    let error = endpoint.destroy_srq(srq).unwrap_err();
    assert_eq!((error, error.errno()), (SrqError::InUse, EBUSY));
    assert!(endpoint.destroy_qp(qb));
    endpoint.destroy_srq(srq).unwrap();
    let gone = endpoint.destroy_srq(srq).unwrap_err();
    assert_eq!((gone, gone.errno()), (SrqError::UnknownSrq, EINVAL));
    assert_eq!(
        endpoint.post_srq_recv(srq, &wr(10)),
        Err(SrqError::UnknownSrq)
    );
    let node = &mut sim.nodes[B];
    let init = QpInit {
        pd: node.pd,
        qp_type: QpType::Rc,
        caps: QpCaps::default(),
        sq_sig_all: false,
    };
    let error = node
        .endpoint
        .create_qp_with_srq(init, node.send_cq, node.recv_cq, srq)
        .unwrap_err();
    assert_eq!((error, error.errno()), (CreateQpError::UnknownSrq, EINVAL));
}

/// One QP on the SRQ goes to ERR while it holds the WQE of a half-received message: that
/// WQE is flushed, the SRQ's own WQEs are not, the QP reports its last WQE, and the other
/// QP receives into the WQEs that are left.
#[test]
fn an_error_leaves_the_srqs_wqes_to_the_other_qps() {
    let mut sim = sim();
    let srq = sim.nodes[B].endpoint.create_srq(srq_attr(8)).unwrap();
    let key = receive_region(&mut sim, 8);
    post_slots(&mut sim, srq, key, 0, 4);
    let (qa1, qb1) = connect_on_srq(&mut sim, QpType::Rc, srq, RetryConfig::default());
    let (qa2, qb2) = connect_on_srq(&mut sim, QpType::Rc, srq, RetryConfig::default());
    // The last packet of QP 1's message never arrives: B holds WQE 0 for it.
    let log = tap(&mut sim, move |seen, _| seen.opcode == Opcode::RcSendLast);
    let src = sim.reg(A, SRC, &pattern(1500, 4));
    send(&mut sim, qa1, 1, src, 0, 1500);
    assert!(sim.run_until(STEPS, |_| count(&log, A, Opcode::RcSendLast) >= 2));
    sim.drop_filter = None;
    let to_err = QpAttr {
        state: Some(QpState::Err),
        ..QpAttr::default()
    };
    sim.nodes[B]
        .endpoint
        .modify_qp(sim.now, qb1, &to_err)
        .unwrap();
    assert_eq!(summary(&sim.poll_recv(B)), [(0, WcStatus::WrFlush)]);
    assert_eq!(
        events(&mut sim, B),
        [AsyncEvent::QpLastWqeReached { qpn: qb1 }]
    );
    for wr_id in 10..13 {
        send(&mut sim, qa2, wr_id, src, 0, 1500);
    }
    let recvs = wait_recv(&mut sim, B, 3);
    let got: Vec<(u64, u32, WcStatus)> = recvs
        .iter()
        .map(|c| (c.wr_id, c.qp_num, c.status))
        .collect();
    assert_eq!(got, [1, 2, 3].map(|wr_id| (wr_id, qb2, WcStatus::Success)));
    assert_eq!(state(&sim, B, qb2), QpState::Rts);
}

/// An RC SEND to a QP whose SRQ is empty draws RNR NAKs, as with an empty receive queue;
/// once a WQE is posted to the SRQ, the retried SEND lands in it.
#[test]
fn rnr_while_the_srq_is_empty_then_success() {
    let mut sim = sim();
    let srq = sim.nodes[B].endpoint.create_srq(srq_attr(8)).unwrap();
    let key = receive_region(&mut sim, 8);
    let (qa, qb) = connect_on_srq(&mut sim, QpType::Rc, srq, RetryConfig::RC_PINGPONG);
    let data = pattern(1500, 5);
    let src = sim.reg(A, SRC, &data);
    send(&mut sim, qa, 1, src, 0, data.len());
    let naks = |sim: &Sim| sim.nodes[B].endpoint.qp_stats(qb).unwrap().naks_sent;
    assert!(sim.run_until(STEPS, |sim| naks(sim) >= 2));
    assert!(sim.poll_send(A).is_empty(), "still retrying");
    post_slots(&mut sim, srq, key, 3, 1);
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::Success)]
    );
    let recvs = wait_recv(&mut sim, B, 1);
    assert_eq!((recvs[0].wr_id, recvs[0].byte_len), (3, 1500));
    let at = 3 * SLOT;
    assert_eq!(sim.mr_bytes(B, key)[at..at + data.len()], data);
}

/// UD and UC QPs on one SRQ: each message takes the next WQE (UD with the GRH area in
/// front); a UD message to the QP while the SRQ is empty is dropped, not queued.
#[test]
fn ud_and_uc_qps_take_from_the_srq() {
    let mut sim = sim();
    let srq = sim.nodes[B].endpoint.create_srq(srq_attr(8)).unwrap();
    let key = receive_region(&mut sim, 8);
    let ud_a = sim.create_qp(A, QpType::Ud, QpCaps::default());
    let ud_b = qp_on_srq(&mut sim, QpType::Ud, srq);
    sim.bring_up_ud(A, ud_a, 0x11);
    sim.bring_up_ud(B, ud_b, 0x11);
    let (uc_a, uc_b) = connect_on_srq(&mut sim, QpType::Uc, srq, RetryConfig::default());
    let data = pattern(1000, 6);
    let src = sim.reg(A, SRC, &data);
    let ud_send = |sim: &mut Sim, wr_id| {
        let mut wr = signaled(
            wr_id,
            SendOp::Send,
            Sge {
                addr: SRC,
                length: 500,
                lkey: src,
            },
        );
        wr.ud = Some(UdDest {
            av: sim.av_of(B),
            remote_qpn: ud_b,
            remote_qkey: 0x11,
        });
        sim.post_send(A, ud_a, &wr).unwrap();
    };
    ud_send(&mut sim, 1);
    wait_send(&mut sim, A, 1);
    settle(&mut sim);
    assert!(sim.poll_recv(B).is_empty(), "dropped: the SRQ was empty");
    post_slots(&mut sim, srq, key, 0, 2);
    ud_send(&mut sim, 2);
    send(&mut sim, uc_a, 3, src, 0, 1000);
    let mut recvs = wait_recv(&mut sim, B, 2);
    recvs.sort_by_key(|c| c.qp_num);
    let got: Vec<(u32, u32)> = recvs.iter().map(|c| (c.qp_num, c.byte_len)).collect();
    assert_eq!(got, [(ud_b, 540), (uc_b, 1000)]);
    let received = sim.mr_bytes(B, key);
    for completion in &recvs {
        let at = completion.wr_id as usize * SLOT;
        if completion.qp_num == ud_b {
            assert_eq!(completion.src_qp, ud_a);
            assert_eq!(received[at + 40..at + 540], data[..500]);
        } else {
            assert_eq!(received[at..at + 1000], data[..]);
        }
    }
}

/// A QP on an SRQ has no receive queue of its own: the SRQ's WQE a message is arriving into
/// is not one of the QP's posted receives, so the post gate (what the verbs layer counts the
/// QP's retired receives from) shows none outstanding at any step of two-packet SENDs, also
/// while a lost second packet holds a message half-received.
#[test]
fn a_qp_on_an_srq_shows_no_receive_of_its_own_while_a_message_arrives() {
    let link = LinkConfig {
        loss: 0.3,
        ..LinkConfig::default()
    };
    let mut sim = Sim::new(link, 13);
    assert_eq!((sim.add_node(), sim.add_node()), (A, B));
    let srq = sim.nodes[B].endpoint.create_srq(srq_attr(32)).unwrap();
    let (qa, qb) = connect_on_srq(&mut sim, QpType::Rc, srq, RetryConfig::default());
    const MESSAGES: u64 = 16;
    let key = receive_region(&mut sim, MESSAGES as usize);
    post_slots(&mut sim, srq, key, 0, MESSAGES);
    let src = sim.reg(A, SRC, &[0x5A; 1500]);
    for wr_id in 0..MESSAGES {
        send(&mut sim, qa, wr_id, src, 0, 1500);
    }
    let mut received = Vec::new();
    for step in 0..100_000 {
        if !sim.step() {
            break;
        }
        let gate = sim.nodes[B].endpoint.post_gate(qb).unwrap();
        assert_eq!(gate.rq_len, 0, "step {step}");
        received.extend(sim.poll_recv(B));
    }
    assert_eq!(received.len(), MESSAGES as usize, "{received:?}");
    assert!(received
        .iter()
        .all(|wc| wc.status == WcStatus::Success && wc.byte_len == 1500));
}
