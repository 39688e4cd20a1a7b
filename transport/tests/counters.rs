//! rxe's hardware counters, counted as rxe counts them, in scenarios whose every packet is
//! known: chosen packets are lost with the simulator's drop filter and the frames on the
//! wire are logged, so each count is checked against what happened.

use roce_transport::cq::WcStatus;
use roce_transport::qp_state::QpType;
use roce_transport::sim::{RetryConfig, Sim};
use roce_transport::wr::SendOp;
use roce_transport::Counters;
use roce_wire::aeth::{NakCode, Syndrome};
use roce_wire::Opcode;

mod common;
use common::*;

/// A clean two-node network with one connected RC pair from A to B, MTU 1024.
fn rc_pair(retry: RetryConfig) -> (Sim, u32, u32) {
    pair(11, QpType::Rc, retry)
}

fn counters(sim: &Sim, node: usize) -> Counters {
    sim.nodes[node].endpoint.counters()
}

/// Frames `from` handed to the network, and how many of them the network delivered.
fn sent_and_delivered(log: &Log, from: usize) -> (u64, u64) {
    let log = log.borrow();
    let sent = log.iter().filter(|s| s.from == from);
    let delivered = sent.clone().filter(|s| !s.dropped).count();
    (sent.count() as u64, delivered as u64)
}

/// A four-packet SEND whose third packet and B's first ACK are lost: B NAKs the gap once
/// (out_of_seq_request), A takes the NAK as a sequence error inside the message
/// (rcvd_seq_err) and goes back (completer_retry_err); the lost ACK makes A time out and send
/// the last two packets again, which B sees as duplicates.
#[test]
fn loss_counts_sequence_errors_retries_and_duplicates() {
    let (mut sim, qa, qb) = rc_pair(retry(7, 7));
    let mut third_dropped = false;
    let mut ack_dropped = false;
    let log = tap(&mut sim, move |frame, before| {
        let a_sent = before.iter().filter(|s| s.from == A).count();
        if frame.from == A && a_sent == 2 && !third_dropped {
            third_dropped = true;
            return true;
        }
        let is_ack = frame.from == B && matches!(frame.syndrome, Some(Syndrome::Ack(_)));
        if is_ack && !ack_dropped {
            ack_dropped = true;
            return true;
        }
        false
    });
    let (data, dst) = post_send_into_recv(&mut sim, (qa, qb), 4096, 3);
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::Success)]
    );
    settle(&mut sim);
    assert_eq!(summary(&sim.poll_recv(B)), [(9, WcStatus::Success)]);
    assert_eq!(sim.mr_bytes(B, dst), data);

    let seq_naks = log
        .borrow()
        .iter()
        .filter(|s| s.syndrome == Some(Syndrome::Nak(NakCode::PsnSequenceError)))
        .count();
    assert_eq!(seq_naks, 1);
    // Four first sends, two resent after the NAK, the same two again after the timeout.
    assert_eq!(count(&log, A, Opcode::RcSendMiddle), 2 + 1 + 1);
    assert_eq!(count(&log, A, Opcode::RcSendLast), 1 + 1 + 1);

    let (a, b) = (counters(&sim, A), counters(&sim, B));
    let (a_sent, a_delivered) = sent_and_delivered(&log, A);
    let (b_sent, b_delivered) = sent_and_delivered(&log, B);
    assert_eq!((a.sent_pkts, b.sent_pkts), (a_sent, b_sent));
    assert_eq!((a.rcvd_pkts, b.rcvd_pkts), (b_delivered, a_delivered));
    assert_eq!(b.out_of_seq_request, 1);
    assert_eq!(
        b.duplicate_request, 2,
        "the two packets resent after the timeout"
    );
    assert_eq!(
        a.rcvd_seq_err, 1,
        "the NAK acknowledged two packets of the SEND"
    );
    assert_eq!(a.completer_retry_err, 2, "one NAK, one timeout");
    assert_eq!((a.rdma_sends, b.rdma_recvs), (1, 1));
    assert_eq!((a.rdma_recvs, b.rdma_sends), (0, 0));
    let counted = [
        "sent_pkts",
        "rcvd_pkts",
        "rcvd_seq_err",
        "completer_retry_err",
        "rdma_sends",
    ];
    let mut others = a.iter().filter(|(name, _)| !counted.contains(name));
    assert!(
        others.all(|(_, value)| value == 0),
        "nothing else at A: {a:?}"
    );
}

/// A NAK for the first PSN of a message acknowledges nothing inside it: rxe counts the retry
/// but not a sequence error.
#[test]
fn a_nak_at_a_message_boundary_is_only_a_retry() {
    let (mut sim, qa, qb) = rc_pair(retry(7, 7));
    let mut dropped = false;
    tap(&mut sim, move |frame, before| {
        let second = frame.from == A && before.iter().filter(|s| s.from == A).count() == 1;
        let drop = second && !dropped;
        dropped |= drop;
        drop
    });
    let key = sim.reg(A, SRC, &pattern(300, 4));
    let dst = sim.reg(B, DST, &[0; 300]);
    for wr_id in 0..3 {
        let offset = wr_id * 100;
        sim.post_recv(B, qb, &recv_wr(wr_id, sge(DST + offset, 100, dst)))
            .unwrap();
        let wr = signaled(wr_id, SendOp::Send, sge(SRC + offset, 100, key));
        sim.post_send(A, qa, &wr).unwrap();
    }
    assert_eq!(wait_send(&mut sim, A, 3).len(), 3);
    settle(&mut sim);
    let (a, b) = (counters(&sim, A), counters(&sim, B));
    assert_eq!(b.out_of_seq_request, 1);
    assert_eq!((a.rcvd_seq_err, a.completer_retry_err), (0, 1));
    assert_eq!((a.rdma_sends, b.rdma_recvs), (3, 3));
}

/// No receive posted until B has sent two RNR NAKs: A counts them received, B sent.
#[test]
fn rnr_naks_are_counted_on_both_sides() {
    let (mut sim, qa, qb) = rc_pair(retry(7, 7));
    let log = tap(&mut sim, |_, _| false);
    let key = sim.reg(A, SRC, &pattern(100, 5));
    let dst = sim.reg(B, DST, &[0; 100]);
    sim.post_send(A, qa, &signaled(1, SendOp::Send, sge(SRC, 100, key)))
        .unwrap();
    let rnr_naks = |log: &Log| {
        log.borrow()
            .iter()
            .filter(|s| matches!(s.syndrome, Some(Syndrome::RnrNak(_))))
            .count()
    };
    let reached = sim.run_until(STEPS, |_| rnr_naks(&log) >= 2);
    assert!(reached, "B never sent two RNR NAKs");
    sim.post_recv(B, qb, &recv_wr(9, sge(DST, 100, dst)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::Success)]
    );
    let (a, b) = (counters(&sim, A), counters(&sim, B));
    let naks = rnr_naks(&log) as u64;
    assert!(naks >= 2);
    assert_eq!((a.rcvd_rnr_err, b.send_rnr_err), (naks, naks));
    assert_eq!(
        a.completer_retry_err, 0,
        "RNR waits are not transport retries"
    );
    assert_eq!(a.retry_rnr_exceeded_err, 0);
}

/// rnr_retry 1 and no receive ever: the second RNR NAK fails the SEND.
#[test]
fn rnr_retry_exhaustion_is_counted() {
    let (mut sim, qa, _) = rc_pair(retry(7, 1));
    let key = sim.reg(A, SRC, &pattern(100, 6));
    sim.post_send(A, qa, &signaled(1, SendOp::Send, sge(SRC, 100, key)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::RnrRetryExceeded)]
    );
    let (a, b) = (counters(&sim, A), counters(&sim, B));
    assert_eq!((a.rcvd_rnr_err, b.send_rnr_err), (2, 2));
    assert_eq!((a.retry_rnr_exceeded_err, a.retry_exceeded_err), (1, 0));
    assert_eq!(a.rdma_sends, 1, "rxe counts a SEND that failed too");
}

/// Every ACK lost, retry_cnt 3: three timeouts retried, the fourth fails the SEND with
/// RETRY_EXC_ERR; B saw the three resends as duplicates.
#[test]
fn retry_exhaustion_is_counted() {
    let (mut sim, qa, qb) = rc_pair(retry(3, 7));
    tap(&mut sim, |frame, _| frame.from == B);
    post_send_into_recv(&mut sim, (qa, qb), 100, 7);
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::RetryExceeded)]
    );
    settle(&mut sim);
    let (a, b) = (counters(&sim, A), counters(&sim, B));
    assert_eq!((a.completer_retry_err, a.retry_exceeded_err), (3, 1));
    assert_eq!((a.sent_pkts, a.rcvd_pkts), (4, 0));
    assert_eq!((b.rcvd_pkts, b.duplicate_request, b.rdma_recvs), (4, 3, 1));
}
