//! Review findings against the IBTA transport rules and Linux rxe's behaviour: one small test
//! per bug, each failing on the code as reviewed (all fixed since).

use roce_transport::cq::WcStatus;
use roce_transport::qp_state::{PathMtu, QpAttr, QpState, QpType};
use roce_transport::sim::{LinkConfig, RetryConfig, Sim};
use roce_transport::wr::SendOp;
use roce_wire::aeth::{NakCode, Syndrome};
use roce_wire::{feth, reth, ExtRepr, Opcode, Psn};

mod common;
use common::*;

const C: usize = 2;
const SRC2: u64 = 0x2_0000;

/// Three nodes (A, B and a stranger C), one connected pair A -> B.
fn pair(qp_type: QpType) -> (Sim, u32, u32) {
    let mut sim = Sim::new(LinkConfig::default(), 7);
    assert_eq!((sim.add_node(), sim.add_node(), sim.add_node()), (A, B, C));
    let pair = sim.connect(A, B, qp_type, PathMtu::Mtu1024, RetryConfig::default());
    (sim, pair.a.1, pair.b.1)
}

fn to_state(sim: &mut Sim, node: usize, qpn: u32, to: QpState) {
    let attr = QpAttr {
        state: Some(to),
        ..QpAttr::default()
    };
    sim.nodes[node]
        .endpoint
        .modify_qp(sim.now, qpn, &attr)
        .unwrap();
}

fn first_psn(log: &Log, from: usize, opcode: Opcode) -> Psn {
    log.borrow()
        .iter()
        .find(|s| s.from == from && s.opcode == opcode)
        .map(|s| s.psn)
        .expect("frame seen")
}

fn reth_ext(virtual_address: u64, rkey: u32, dma_length: u32) -> ExtRepr {
    ExtRepr {
        reth: Some(reth::Repr {
            virtual_address,
            rkey,
            dma_length,
        }),
        ..ExtRepr::default()
    }
}

/// An 8-byte WRITE from A to B at `DST`, so the test learns A's next PSN; returns
/// (PSN the WRITE used, B's target key).
fn prime(sim: &mut Sim, log: &Log, qa: u32) -> (Psn, u32) {
    let key = sim.reg(A, SRC, &pattern(8, 1));
    let target = sim.reg(B, DST, &[0; 4096]);
    let write = SendOp::RdmaWrite {
        remote_addr: DST,
        rkey: target,
    };
    sim.post_send(A, qa, &signaled(100, write, sge(SRC, 8, key)))
        .unwrap();
    assert_eq!(summary(&wait_send(sim, A, 1)), [(100, WcStatus::Success)]);
    (first_psn(log, A, Opcode::RcRdmaWriteOnly), target)
}

// ---------------------------------------------------------------------------------------

/// IBTA 10.3.1 (SQD) and rxe's `req_next_wqe` (QP_STATE_DRAIN): a QP in SQD finishes what it
/// has started but starts no new work request until it is back in RTS.
#[test]
fn sqd_starts_no_new_work_request() {
    let (mut sim, qa, qb) = pair(QpType::Rc);
    let log = tap(&mut sim, |_, _| false);
    let key = sim.reg(A, SRC, &pattern(64, 2));
    let target = sim.reg(B, DST, &[0; 64]);
    to_state(&mut sim, A, qa, QpState::Sqd);
    let write = SendOp::RdmaWrite {
        remote_addr: DST,
        rkey: target,
    };
    sim.post_send(A, qa, &signaled(1, write, sge(SRC, 64, key)))
        .unwrap();
    settle(&mut sim);
    assert_eq!(count(&log, A, Opcode::RcRdmaWriteOnly), 0, "sent in SQD");
    assert!(sim.poll_send(A).is_empty());
    assert_eq!(sim.mr_bytes(B, target), [0; 64]);
    // Back in RTS it goes.
    to_state(&mut sim, A, qa, QpState::Rts);
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::Success)]
    );
    let _ = qb;
}

/// A UC SEND too long for the receive buffer is dropped, but the receive WQE it took must not
/// vanish: rxe (class D1) resets it for the next message; at the latest ERR must flush it.
#[test]
fn uc_failed_send_does_not_lose_the_receive() {
    let (mut sim, qa, qb) = pair(QpType::Uc);
    let key = sim.reg(A, SRC, &pattern(100, 3));
    let dst = sim.reg(B, DST, &[0; 64]);
    sim.post_recv(B, qb, &recv_wr(1, sge(DST, 16, dst)))
        .unwrap();
    sim.post_send(A, qa, &signaled(10, SendOp::Send, sge(SRC, 100, key)))
        .unwrap();
    settle(&mut sim);
    let mut recvs = sim.poll_recv(B);
    to_state(&mut sim, B, qb, QpState::Err);
    recvs.extend(sim.poll_recv(B));
    assert_eq!(
        recvs.iter().filter(|c| c.wr_id == 1).count(),
        1,
        "receive 1 was never completed nor flushed: {recvs:?}"
    );
}

/// A duplicate WRITE that arrives after a READ was executed is re-acknowledged with
/// `epsn - 1`, which is the READ's PSN. rxe acknowledges duplicates with `ack_psn - 1`, which
/// never names a READ, and an rxe requester whose READ is still pending treats a plain ACK
/// carrying the READ's last PSN as completing it (rxe_comp.c COMPST_WRITE_SEND ->
/// COMPST_COMP_ACK): the READ reports success with its data never written.
#[test]
fn duplicate_write_ack_never_names_a_read_psn() {
    let (mut sim, qa, _qb) = pair(QpType::Rc);
    // Lose B's first two answers: the ACK of the WRITE and the READ response.
    let log = tap(&mut sim, |frame, before| {
        frame.from == B && before.iter().filter(|s| s.from == B).count() < 2
    });
    let src = sim.reg(A, SRC, &pattern(64, 4));
    let back = sim.reg(A, SRC2, &[0; 64]);
    let target = sim.reg(B, DST, &[0; 64]);
    let source = sim.reg(B, DST2, &pattern(64, 5));
    let write = SendOp::RdmaWrite {
        remote_addr: DST,
        rkey: target,
    };
    let read = SendOp::RdmaRead {
        remote_addr: DST2,
        rkey: source,
    };
    sim.post_send(A, qa, &signaled(1, write, sge(SRC, 64, src)))
        .unwrap();
    sim.post_send(A, qa, &signaled(2, read, sge(SRC2, 64, back)))
        .unwrap();
    let sends = wait_send(&mut sim, A, 2);
    assert_eq!(
        summary(&sends),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let read_psn = first_psn(&log, A, Opcode::RcRdmaReadRequest);
    let ack_psns: Vec<Psn> = log
        .borrow()
        .iter()
        .filter(|s| {
            s.from == B
                && s.opcode == Opcode::RcAcknowledge
                && matches!(s.syndrome, Some(Syndrome::Ack(_)))
        })
        .map(|s| s.psn)
        .collect();
    assert!(
        !ack_psns.contains(&read_psn),
        "plain ACK for READ PSN {read_psn:?}: {ack_psns:?}"
    );
}

/// rxe's check_addr: a packet for a connected (RC/UC) QP whose IP source is not the QP's
/// peer is dropped. Here a third host writes into B's memory through A's connection.
#[test]
fn connected_qp_ignores_a_stranger() {
    let (mut sim, qa, qb) = pair(QpType::Rc);
    let log = tap(&mut sim, |_, _| false);
    let (psn, target) = prime(&mut sim, &log, qa);
    let payload = [0xEE; 8];
    let frame = forged(
        &sim,
        C,
        B,
        forged_bth(Opcode::RcRdmaWriteOnly, qb, psn + 1, 8, true),
        reth_ext(DST + 32, target, 8),
        &payload,
    );
    sim.nodes[B].endpoint.handle_packet(sim.now, &frame);
    settle(&mut sim);
    assert_eq!(&sim.mr_bytes(B, target)[32..40], [0; 8], "stranger wrote");
}

/// rxe's check_keys: a request whose P_Key does not match the QP's (default 0xFFFF) is
/// dropped.
#[test]
fn foreign_pkey_dropped() {
    let (mut sim, qa, qb) = pair(QpType::Rc);
    let log = tap(&mut sim, |_, _| false);
    let (psn, target) = prime(&mut sim, &log, qa);
    let payload = [0xEE; 8];
    let mut bth = forged_bth(Opcode::RcRdmaWriteOnly, qb, psn + 1, 8, true);
    bth.pkey = 0x1234;
    let frame = forged(&sim, A, B, bth, reth_ext(DST + 32, target, 8), &payload);
    sim.nodes[B].endpoint.handle_packet(sim.now, &frame);
    settle(&mut sim);
    assert_eq!(
        &sim.mr_bytes(B, target)[32..40],
        [0; 8],
        "wrong P_Key accepted"
    );
}

/// RC_FLUSH (0x1C) parses as a request, and the responder takes it for a SEND: it consumes a
/// receive WQE and completes it successfully (or RNR NAKs without one). It must be executed
/// (rxe answers with a zero-length RDMA READ RESPONSE ONLY) or refused with NAK Invalid
/// Request, never delivered as a message.
#[test]
fn flush_is_not_a_send() {
    let (mut sim, qa, qb) = pair(QpType::Rc);
    let log = tap(&mut sim, |_, _| false);
    let (psn, target) = prime(&mut sim, &log, qa);
    let dst = sim.reg(B, DST2, &[0; 64]);
    sim.post_recv(B, qb, &recv_wr(7, sge(DST2, 64, dst)))
        .unwrap();
    let ext = ExtRepr {
        feth: Some(feth::Repr {
            selectivity_level: 0,
            placement_type: 1,
        }),
        ..reth_ext(DST, target, 64)
    };
    let frame = forged(
        &sim,
        A,
        B,
        forged_bth(Opcode::RcFlush, qb, psn + 1, 0, true),
        ext,
        &[],
    );
    sim.nodes[B].endpoint.handle_packet(sim.now, &frame);
    settle(&mut sim);
    // Refused with a NAK, which moves B to ERR: its receive is flushed, never delivered.
    let recvs = sim.poll_recv(B);
    assert!(
        recvs.iter().all(|c| c.status == WcStatus::WrFlush),
        "FLUSH completed a receive: {recvs:?}"
    );
}

/// A LAST packet must carry 1..=PMTU bytes (rxe check_length: RESPST_ERR_LENGTH, NAK Invalid
/// Request). An empty SEND LAST after a full FIRST is accepted here as a 1024-byte message.
#[test]
fn empty_last_packet_is_invalid() {
    let (mut sim, qa, qb) = pair(QpType::Rc);
    let log = tap(&mut sim, |_, _| false);
    let (psn, _) = prime(&mut sim, &log, qa);
    let dst = sim.reg(B, DST2, &[0; 2048]);
    sim.post_recv(B, qb, &recv_wr(7, sge(DST2, 2048, dst)))
        .unwrap();
    let full = pattern(1024, 6);
    let first_bth = forged_bth(Opcode::RcSendFirst, qb, psn + 1, 1024, false);
    let first = forged(&sim, A, B, first_bth, ExtRepr::default(), &full);
    sim.nodes[B].endpoint.handle_packet(sim.now, &first);
    let last = forged(
        &sim,
        A,
        B,
        forged_bth(Opcode::RcSendLast, qb, psn + 2, 0, true),
        ExtRepr::default(),
        &[],
    );
    sim.nodes[B].endpoint.handle_packet(sim.now, &last);
    settle(&mut sim);
    let naks = log
        .borrow()
        .iter()
        .filter(|s| s.from == B && s.syndrome == Some(Syndrome::Nak(NakCode::InvalidRequest)))
        .count();
    assert_eq!(
        naks,
        1,
        "no NAK Invalid Request; receives: {:?}",
        sim.poll_recv(B)
    );
    assert_eq!(state(&sim, B, qb), QpState::Err);
}

/// A duplicate READ may only ask again for (part of) what the original asked (rxe
/// duplicate_request: same R_Key, range inside the original, else drop). Here a duplicate of
/// a 100-byte READ at DST2 is answered with bytes from DST2 + 2000.
#[test]
fn duplicate_read_limited_to_original_range() {
    let (mut sim, qa, qb) = pair(QpType::Rc);
    let log = tap(&mut sim, |_, _| false);
    let back = sim.reg(A, SRC, &[0; 100]);
    let source = sim.reg(B, DST2, &pattern(4096, 7));
    let read = SendOp::RdmaRead {
        remote_addr: DST2,
        rkey: source,
    };
    sim.post_send(A, qa, &signaled(1, read, sge(SRC, 100, back)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::Success)]
    );
    let read_psn = first_psn(&log, A, Opcode::RcRdmaReadRequest);
    let frame = forged(
        &sim,
        A,
        B,
        forged_bth(Opcode::RcRdmaReadRequest, qb, read_psn, 0, true),
        reth_ext(DST2 + 2000, source, 100),
        &[],
    );
    sim.nodes[B].endpoint.handle_packet(sim.now, &frame);
    settle(&mut sim);
    assert_eq!(
        count(&log, B, Opcode::RcRdmaReadResponseOnly),
        1,
        "answered a duplicate READ outside the original range"
    );
}
