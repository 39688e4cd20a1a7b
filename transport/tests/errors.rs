//! One test per error scenario of the IBTA transport (rxe as the reference peer): RNR and
//! transport retries, local ACK timeouts, remote access and invalid-request NAKs, ghost and
//! bad responses, flushing in ERR, duplicates, CQ overflow, and the UC and UD drop rules.
//!
//! Particular packets are lost with the simulator's `drop_filter`; packets no correct peer
//! would send are forged and fed to `Endpoint::handle_packet` directly.

use std::cell::Cell;
use std::net::Ipv4Addr;
use std::rc::Rc;
use std::time::Duration;

use roce_transport::cq::{NetworkHeader, WcOpcode, WcStatus};
use roce_transport::endpoint::AsyncEvent;
use roce_transport::qp::{QpCaps, QpStats};
use roce_transport::qp_state::{PathMtu, QpAttr, QpState, QpType};
use roce_transport::sim::{LinkConfig, RetryConfig, Sim};
use roce_transport::wr::{SendOp, SendWr, Sge, UdDest};
use roce_transport::AccessFlags;
use roce_wire::aeth::{self, CreditCount, NakCode, Syndrome};
use roce_wire::{ExtRepr, Opcode, Psn};

mod common;
use common::*;

fn stats(sim: &Sim, node: usize, qpn: u32) -> QpStats {
    sim.nodes[node].endpoint.qp_stats(qpn).expect("QP exists")
}

/// Drops the first `n` frames B sends (its ACKs and responses).
fn drop_first_responses(n: usize) -> impl FnMut(&Seen, &[Seen]) -> bool {
    move |frame, before| frame.from == B && before.iter().filter(|s| s.from == B).count() < n
}

fn ack_ext(syndrome: Syndrome) -> ExtRepr {
    ExtRepr {
        aeth: Some(aeth::Repr { syndrome, msn: 0 }),
        ..ExtRepr::default()
    }
}

// ---------------------------------------------------------------------------------------
// RNR NAKs

/// No receive ever posted, rnr_retry 2: three RNR NAKs, then RNR_RETRY_EXC_ERR, ERR, flushes.
#[test]
fn rnr_retry_exhausted() {
    let (mut sim, qa, qb) = pair(7, QpType::Rc, retry(7, 2));
    let log = tap(&mut sim, |_, _| false);
    let key = sim.reg(A, SRC, &pattern(100, 1));
    for wr_id in [1, 2] {
        sim.post_send(A, qa, &signaled(wr_id, SendOp::Send, sge(SRC, 100, key)))
            .unwrap();
    }
    let sends = wait_send(&mut sim, A, 2);
    assert_eq!(
        summary(&sends),
        [(1, WcStatus::RnrRetryExceeded), (2, WcStatus::WrFlush)]
    );
    // The first attempt and rnr_retry = 2 retries, each answered with an RNR NAK (SEND 2,
    // behind it, also draws a PSN sequence NAK each time, which A must shrug off).
    let rnr_naks: Vec<Psn> = log
        .borrow()
        .iter()
        .filter(|s| matches!(s.syndrome, Some(Syndrome::RnrNak(_))))
        .map(|s| s.psn)
        .collect();
    let first = log.borrow()[0].psn;
    assert_eq!(rnr_naks, [first; 3]);
    assert!(stats(&sim, A, qa).naks_received >= 3);
    assert_eq!(state(&sim, A, qa), QpState::Err);
    assert_eq!(state(&sim, B, qb), QpState::Rts, "RNR is not an error at B");
    sim.post_send(A, qa, &signaled(3, SendOp::Send, sge(SRC, 100, key)))
        .unwrap();
    assert_eq!(summary(&sim.poll_send(A)), [(3, WcStatus::WrFlush)]);
    settle(&mut sim);
    assert!(sim.poll_recv(B).is_empty());
}

/// A receive posted after two RNR NAKs, within rnr_retry 3: the SEND succeeds with its data.
#[test]
fn rnr_retry_not_exhausted() {
    let (mut sim, qa, qb) = pair(7, QpType::Rc, retry(7, 3));
    let data = pattern(1000, 2);
    let key = sim.reg(A, SRC, &data);
    let dst = sim.reg(B, DST, &[0; 1000]);
    sim.post_send(A, qa, &signaled(1, SendOp::Send, sge(SRC, 1000, key)))
        .unwrap();
    assert!(sim.run_until(STEPS, |sim| stats(sim, B, qb).naks_sent >= 2));
    assert!(sim.poll_send(A).is_empty(), "still retrying");
    sim.post_recv(B, qb, &recv_wr(9, sge(DST, 1000, dst)))
        .unwrap();
    let sends = wait_send(&mut sim, A, 1);
    assert_eq!(summary(&sends), [(1, WcStatus::Success)]);
    let recvs = wait_recv(&mut sim, B, 1);
    assert_eq!(
        (recvs[0].wr_id, recvs[0].status, recvs[0].byte_len),
        (9, WcStatus::Success, 1000)
    );
    assert_eq!(sim.mr_bytes(B, dst), data);
    let naks = stats(&sim, B, qb).naks_sent;
    assert!((2..=3).contains(&naks), "{naks} RNR NAKs");
    assert_eq!(stats(&sim, A, qa).naks_received, naks);
    assert_eq!(state(&sim, A, qa), QpState::Rts);
}

/// rnr_retry 7 is infinite: 300 RNR NAKs over ~6 ms, no error, then success once a receive comes.
#[test]
fn rnr_retry_7_is_infinite() {
    let (mut sim, qa, qb) = pair(7, QpType::Rc, retry(3, 7));
    let data = pattern(64, 3);
    let key = sim.reg(A, SRC, &data);
    let dst = sim.reg(B, DST, &[0; 64]);
    sim.post_send(A, qa, &signaled(1, SendOp::Send, sge(SRC, 64, key)))
        .unwrap();
    let start = sim.now;
    let mut early = Vec::new();
    assert!(sim.run_until(STEPS, |sim| {
        early.extend(sim.poll_send(A));
        !early.is_empty() || stats(sim, B, qb).naks_sent >= 300
    }));
    assert!(early.is_empty(), "gave up: {early:?}");
    let ack_timeout = Duration::from_nanos(4096 << RetryConfig::default().timeout);
    assert!(sim.now - start > 5 * ack_timeout, "long enough to matter");
    assert_eq!(state(&sim, A, qa), QpState::Rts);
    sim.post_recv(B, qb, &recv_wr(9, sge(DST, 64, dst)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::Success)]
    );
    assert_eq!(sim.mr_bytes(B, dst), data);
}

// ---------------------------------------------------------------------------------------
// Transport retries: PSN sequence errors and local ACK timeouts

/// Middle packet always lost, retry_cnt 2: sequence NAK, lost PSN sent 1 + 2 times, RETRY_EXC_ERR.
#[test]
fn psn_sequence_retry_exhausted() {
    let (mut sim, qa, qb) = pair(7, QpType::Rc, retry(2, 7));
    let log = tap(&mut sim, |frame, _| frame.opcode == Opcode::RcSendMiddle);
    let key = sim.reg(A, SRC, &pattern(3000, 4));
    let dst = sim.reg(B, DST, &[0; 3000]);
    sim.post_recv(B, qb, &recv_wr(9, sge(DST, 3000, dst)))
        .unwrap();
    sim.post_send(A, qa, &signaled(1, SendOp::Send, sge(SRC, 3000, key)))
        .unwrap();
    sim.post_send(A, qa, &signaled(2, SendOp::Send, sge(SRC, 10, key)))
        .unwrap();
    let sends = wait_send(&mut sim, A, 2);
    assert_eq!(
        summary(&sends),
        [(1, WcStatus::RetryExceeded), (2, WcStatus::WrFlush)]
    );
    assert_eq!(count(&log, A, Opcode::RcSendMiddle), 3);
    let seq_naks = log
        .borrow()
        .iter()
        .filter(|s| s.syndrome == Some(Syndrome::Nak(NakCode::PsnSequenceError)))
        .count();
    assert!(seq_naks >= 1, "B NAKed the gap");
    assert!(stats(&sim, A, qa).naks_received >= 1);
    assert_eq!(state(&sim, A, qa), QpState::Err);
    settle(&mut sim);
    assert!(
        sim.poll_recv(B).is_empty(),
        "the message never arrived whole"
    );
}

/// Middle packet lost once: exactly one sequence NAK, go-back-N resend, success with no timeout.
#[test]
fn psn_sequence_retry_not_exhausted() {
    let (mut sim, qa, qb) = pair(7, QpType::Rc, retry(2, 7));
    let log = tap(&mut sim, |frame, before| {
        frame.opcode == Opcode::RcSendMiddle && !before.iter().any(|s| s.dropped)
    });
    let (data, dst) = post_send_into_recv(&mut sim, (qa, qb), 3000, 5);
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::Success)]
    );
    let recvs = wait_recv(&mut sim, B, 1);
    assert_eq!(
        (recvs[0].status, recvs[0].byte_len),
        (WcStatus::Success, 3000)
    );
    assert_eq!(sim.mr_bytes(B, dst), data);
    assert_eq!(count(&log, A, Opcode::RcSendMiddle), 2);
    let seq_naks: Vec<Psn> = log
        .borrow()
        .iter()
        .filter(|s| s.syndrome == Some(Syndrome::Nak(NakCode::PsnSequenceError)))
        .map(|s| s.psn)
        .collect();
    let middle_psn = log.borrow().iter().find(|s| s.dropped).unwrap().psn;
    assert_eq!(seq_naks, [middle_psn], "one NAK, for the lost PSN");
    let a = stats(&sim, A, qa);
    assert_eq!((a.naks_received, a.timeouts), (1, 0));
}

/// Every ACK lost, retry_cnt 3: 4 timeouts and sends, RETRY_EXC_ERR; B executed the SEND once.
#[test]
fn local_ack_timeout_retry_exhausted() {
    let (mut sim, qa, qb) = pair(7, QpType::Rc, retry(3, 7));
    let log = tap(&mut sim, |frame, _| frame.from == B);
    let data = pattern(100, 6);
    let key = sim.reg(A, SRC, &data);
    let dst = sim.reg(B, DST, &[0; 200]);
    sim.post_recv(B, qb, &recv_wr(8, sge(DST, 100, dst)))
        .unwrap();
    sim.post_recv(B, qb, &recv_wr(9, sge(DST + 100, 100, dst)))
        .unwrap();
    sim.post_send(A, qa, &signaled(1, SendOp::Send, sge(SRC, 100, key)))
        .unwrap();
    let start = sim.now;
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::RetryExceeded)]
    );
    let ack_timeout = Duration::from_nanos(4096 << RetryConfig::default().timeout);
    assert!(sim.now - start >= 4 * ack_timeout);
    assert_eq!(stats(&sim, A, qa).timeouts, 4);
    assert_eq!(count(&log, A, Opcode::RcSendOnly), 4);
    assert_eq!(state(&sim, A, qa), QpState::Err);
    settle(&mut sim);
    let recvs = sim.poll_recv(B);
    assert_eq!(summary(&recvs), [(8, WcStatus::Success)], "executed once");
    assert_eq!(&sim.mr_bytes(B, dst)[..100], &data[..]);
}

/// The first two ACKs lost, retry_cnt 3: two timeouts, two resends, success.
#[test]
fn local_ack_timeout_retry_not_exhausted() {
    let (mut sim, qa, qb) = pair(7, QpType::Rc, retry(3, 7));
    let log = tap(&mut sim, drop_first_responses(2));
    let (data, dst) = post_send_into_recv(&mut sim, (qa, qb), 100, 7);
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::Success)]
    );
    assert_eq!(stats(&sim, A, qa).timeouts, 2);
    assert_eq!(count(&log, A, Opcode::RcSendOnly), 3);
    assert_eq!(
        summary(&wait_recv(&mut sim, B, 1)),
        [(9, WcStatus::Success)]
    );
    assert_eq!(sim.mr_bytes(B, dst), data);
    assert_eq!(state(&sim, A, qa), QpState::Rts);
}

// ---------------------------------------------------------------------------------------
// Remote access and invalid requests

/// A WRITE with a wrong R_Key: REM_ACCESS_ERR at A, B's QP in ERR, B's memory untouched.
#[test]
fn rkey_violation() {
    let (mut sim, qa, qb) = pair(7, QpType::Rc, retry(7, 7));
    let log = tap(&mut sim, |_, _| false);
    let key = sim.reg(A, SRC, &pattern(100, 8));
    let target = sim.reg(B, DST, &[0; 100]);
    let scratch = sim.reg(B, DST2, &[0; 100]);
    sim.post_recv(B, qb, &recv_wr(9, sge(DST2, 100, scratch)))
        .unwrap();
    let write = SendOp::RdmaWrite {
        remote_addr: DST,
        rkey: target ^ 1,
    };
    sim.post_send(A, qa, &signaled(1, write, sge(SRC, 100, key)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::RemoteAccess)]
    );
    assert_eq!(count(&log, B, Opcode::RcAcknowledge), 1);
    assert_eq!(
        log.borrow().iter().find(|s| s.from == B).unwrap().syndrome,
        Some(Syndrome::Nak(NakCode::RemoteAccessError))
    );
    assert_eq!(sim.mr_bytes(B, target), [0; 100]);
    assert_eq!(state(&sim, A, qa), QpState::Err);
    assert_eq!(state(&sim, B, qb), QpState::Err);
    assert_eq!(summary(&sim.poll_recv(B)), [(9, WcStatus::WrFlush)]);
}

/// A WRITE into a region registered without REMOTE_WRITE: REM_ACCESS_ERR, memory untouched.
#[test]
fn region_without_remote_write() {
    let (mut sim, qa, qb) = pair(7, QpType::Rc, retry(7, 7));
    let key = sim.reg(A, SRC, &pattern(100, 9));
    let pd = sim.nodes[B].pd;
    let target = sim.nodes[B]
        .endpoint
        .mrs()
        .reg_mr(
            pd,
            DST,
            100,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    let write = SendOp::RdmaWrite {
        remote_addr: DST,
        rkey: target,
    };
    sim.post_send(A, qa, &signaled(1, write, sge(SRC, 100, key)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::RemoteAccess)]
    );
    assert_eq!(sim.mr_bytes(B, target), [0; 100]);
    assert_eq!(state(&sim, B, qb), QpState::Err);
}

/// A READ at a QP whose access flags lack REMOTE_READ: REM_ACCESS_ERR, nothing read.
#[test]
fn qp_without_remote_read() {
    let (mut sim, qa, qb) = pair(7, QpType::Rc, retry(7, 7));
    let back = sim.reg(A, SRC, &[0; 100]);
    let source = sim.reg(B, DST, &pattern(100, 10));
    let only_write = QpAttr {
        access_flags: Some(AccessFlags::REMOTE_WRITE),
        ..QpAttr::default()
    };
    sim.nodes[B]
        .endpoint
        .modify_qp(sim.now, qb, &only_write)
        .unwrap();
    let read = SendOp::RdmaRead {
        remote_addr: DST,
        rkey: source,
    };
    sim.post_send(A, qa, &signaled(1, read, sge(SRC, 100, back)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::RemoteAccess)]
    );
    assert_eq!(sim.mr_bytes(A, back), [0; 100]);
    assert_eq!(state(&sim, B, qb), QpState::Err);
}

/// A two-packet WRITE that runs past the end of its region: REM_ACCESS_ERR, nothing written.
#[test]
fn out_of_bounds_write() {
    let (mut sim, qa, qb) = pair(7, QpType::Rc, retry(7, 7));
    let key = sim.reg(A, SRC, &pattern(2000, 11));
    let target = sim.reg(B, DST, &[0; 4096]);
    let write = SendOp::RdmaWrite {
        remote_addr: DST + 3000,
        rkey: target,
    };
    sim.post_send(A, qa, &signaled(1, write, sge(SRC, 2000, key)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::RemoteAccess)]
    );
    assert_eq!(sim.mr_bytes(B, target), vec![0; 4096]);
    assert_eq!(state(&sim, B, qb), QpState::Err);
}

/// A READ that runs past the end of its region: REM_ACCESS_ERR, nothing read.
#[test]
fn out_of_bounds_read() {
    let (mut sim, qa, qb) = pair(7, QpType::Rc, retry(7, 7));
    let back = sim.reg(A, SRC, &[0; 200]);
    let source = sim.reg(B, DST, &pattern(4096, 12));
    let read = SendOp::RdmaRead {
        remote_addr: DST + 4000,
        rkey: source,
    };
    sim.post_send(A, qa, &signaled(1, read, sge(SRC, 200, back)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::RemoteAccess)]
    );
    assert_eq!(sim.mr_bytes(A, back), [0; 200]);
    assert_eq!(state(&sim, B, qb), QpState::Err);
}

/// A FETCH_ADD at an address that is not 8-byte aligned: REM_INV_REQ_ERR, target untouched.
#[test]
fn misaligned_atomic() {
    let (mut sim, qa, qb) = pair(7, QpType::Rc, retry(7, 7));
    let result = sim.reg(A, SRC, &[0; 8]);
    let target = sim.reg(B, DST, &[0; 16]);
    let faa = SendOp::FetchAdd {
        remote_addr: DST + 4,
        rkey: target,
        add: 1,
    };
    sim.post_send(A, qa, &signaled(1, faa, sge(SRC, 8, result)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::RemoteInvalidRequest)]
    );
    assert_eq!(sim.mr_bytes(B, target), [0; 16]);
    assert_eq!(state(&sim, B, qb), QpState::Err);
}

// ---------------------------------------------------------------------------------------
// Forged packets: ghost ACKs, unexpected opcodes, bad responses

/// An ACK for a PSN A never sent is dropped: no completion, counted, and traffic goes on.
#[test]
fn ghost_ack_ignored() {
    let (mut sim, qa, qb) = pair(7, QpType::Rc, retry(7, 7));
    let block = Rc::new(Cell::new(true));
    let blocked = block.clone();
    let log = tap(&mut sim, move |frame, _| frame.from == B && blocked.get());
    let data = pattern(200, 13);
    let key = sim.reg(A, SRC, &data);
    let dst = sim.reg(B, DST, &[0; 200]);
    sim.post_recv(B, qb, &recv_wr(8, sge(DST, 100, dst)))
        .unwrap();
    sim.post_recv(B, qb, &recv_wr(9, sge(DST + 100, 100, dst)))
        .unwrap();
    sim.post_send(A, qa, &signaled(1, SendOp::Send, sge(SRC, 100, key)))
        .unwrap();
    assert!(sim.run_until(STEPS, |_| count(&log, A, Opcode::RcSendOnly) == 1));
    let sent = log.borrow()[0].psn;

    let dropped = stats(&sim, A, qa).dropped;
    let ack = Syndrome::Ack(CreditCount::UNLIMITED);
    let ghost_bth = forged_bth(Opcode::RcAcknowledge, qa, sent + 3, 0, false);
    let ghost = forged(&sim, B, A, ghost_bth, ack_ext(ack), &[]);
    sim.nodes[A].endpoint.handle_packet(sim.now, &ghost);
    assert_eq!(stats(&sim, A, qa).dropped, dropped + 1);
    assert!(sim.poll_send(A).is_empty(), "a ghost completes nothing");
    assert_eq!(state(&sim, A, qa), QpState::Rts);

    block.set(false);
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::Success)]
    );
    sim.post_send(A, qa, &signaled(2, SendOp::Send, sge(SRC + 100, 100, key)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(2, WcStatus::Success)]
    );
    let recvs = wait_recv(&mut sim, B, 2);
    assert_eq!(
        summary(&recvs),
        [(8, WcStatus::Success), (9, WcStatus::Success)]
    );
    assert_eq!(sim.mr_bytes(B, dst), data);
}

/// SEND_MIDDLE at the expected PSN with no message in progress: NAK invalid request, B in ERR.
#[test]
fn unexpected_opcode_naks_invalid_request() {
    let (mut sim, qa, qb) = pair(7, QpType::Rc, retry(7, 7));
    let log = tap(&mut sim, |_, _| false);
    let key = sim.reg(A, SRC, &pattern(100, 14));
    let dst = sim.reg(B, DST, &[0; 200]);
    sim.post_recv(B, qb, &recv_wr(8, sge(DST, 100, dst)))
        .unwrap();
    sim.post_recv(B, qb, &recv_wr(9, sge(DST + 100, 100, dst)))
        .unwrap();
    sim.post_send(A, qa, &signaled(1, SendOp::Send, sge(SRC, 100, key)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::Success)]
    );
    assert_eq!(
        summary(&wait_recv(&mut sim, B, 1)),
        [(8, WcStatus::Success)]
    );
    settle(&mut sim);
    let expected = log.borrow()[0].psn + 1;

    let payload = vec![0xAB; PathMtu::Mtu1024.bytes()];
    let middle_bth = forged_bth(Opcode::RcSendMiddle, qb, expected, payload.len(), false);
    let middle = forged(&sim, A, B, middle_bth, ExtRepr::default(), &payload);
    sim.nodes[B].endpoint.handle_packet(sim.now, &middle);
    let mut out = Vec::new();
    while let Some(transmit) = sim.nodes[B].endpoint.poll_transmit(sim.now) {
        out.push(transmit.packet);
    }
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].bth.opcode, Opcode::RcAcknowledge);
    assert_eq!((out[0].bth.psn, out[0].bth.dest_qpn), (expected, qa));
    assert_eq!(
        out[0].ext.aeth.map(|aeth| aeth.syndrome),
        Some(Syndrome::Nak(NakCode::InvalidRequest))
    );
    assert_eq!(state(&sim, B, qb), QpState::Err);
    assert_eq!(summary(&sim.poll_recv(B)), [(9, WcStatus::WrFlush)]);
    assert_eq!(sim.mr_bytes(B, dst)[100..], [0; 100], "nothing scattered");
}

/// A READ response answering a SEND: BAD_RESP_ERR and ERR at the requester.
#[test]
fn read_response_to_a_send_is_bad_response() {
    let (mut sim, qa, qb) = pair(7, QpType::Rc, retry(7, 7));
    let log = tap(&mut sim, |frame, _| frame.from == B);
    post_send_into_recv(&mut sim, (qa, qb), 100, 15);
    assert!(sim.run_until(STEPS, |_| count(&log, A, Opcode::RcSendOnly) == 1));
    let psn = log.borrow()[0].psn;

    let payload = [7u8; 8];
    let response_bth = forged_bth(
        Opcode::RcRdmaReadResponseOnly,
        qa,
        psn,
        payload.len(),
        false,
    );
    let ack = ack_ext(Syndrome::Ack(CreditCount::UNLIMITED));
    let response = forged(&sim, B, A, response_bth, ack, &payload);
    sim.nodes[A].endpoint.handle_packet(sim.now, &response);
    assert_eq!(summary(&sim.poll_send(A)), [(1, WcStatus::BadResponse)]);
    assert_eq!(state(&sim, A, qa), QpState::Err);
}

/// A READ response with fewer bytes than the READ asked for: BAD_RESP_ERR, nothing written.
#[test]
fn read_response_of_wrong_length_is_bad_response() {
    let (mut sim, qa, _qb) = pair(7, QpType::Rc, retry(7, 7));
    let log = tap(&mut sim, |frame, _| frame.from == B);
    let back = sim.reg(A, SRC, &[0; 100]);
    let source = sim.reg(B, DST, &pattern(100, 16));
    let read = SendOp::RdmaRead {
        remote_addr: DST,
        rkey: source,
    };
    sim.post_send(A, qa, &signaled(1, read, sge(SRC, 100, back)))
        .unwrap();
    assert!(sim.run_until(STEPS, |_| count(&log, A, Opcode::RcRdmaReadRequest) == 1));
    let psn = log.borrow()[0].psn;

    let payload = [7u8; 50];
    let response_bth = forged_bth(
        Opcode::RcRdmaReadResponseOnly,
        qa,
        psn,
        payload.len(),
        false,
    );
    let ack = ack_ext(Syndrome::Ack(CreditCount::UNLIMITED));
    let response = forged(&sim, B, A, response_bth, ack, &payload);
    sim.nodes[A].endpoint.handle_packet(sim.now, &response);
    assert_eq!(summary(&sim.poll_send(A)), [(1, WcStatus::BadResponse)]);
    assert_eq!(state(&sim, A, qa), QpState::Err);
    assert_eq!(sim.mr_bytes(A, back), [0; 100]);
}

// ---------------------------------------------------------------------------------------
// ERR

/// ERR flushes posted sends (one in flight) and receives in order; later posts flush at once.
#[test]
fn err_flushes_everything_in_order() {
    let (mut sim, qa, _qb) = pair(7, QpType::Rc, retry(7, 7));
    let log = tap(&mut sim, |_, _| false);
    let key = sim.reg(A, SRC, &[0; 300]);
    let remote = sim.reg(B, DST, &[0; 300]);
    for wr_id in [11, 12, 13] {
        sim.post_recv(A, qa, &recv_wr(wr_id, sge(SRC + 200, 100, key)))
            .unwrap();
    }
    sim.post_send(A, qa, &signaled(1, SendOp::Send, sge(SRC, 100, key)))
        .unwrap();
    sim.step();
    assert_eq!(count(&log, A, Opcode::RcSendOnly), 1, "in flight");
    let write = SendOp::RdmaWrite {
        remote_addr: DST,
        rkey: remote,
    };
    sim.post_send(A, qa, &signaled(2, write, sge(SRC, 100, key)))
        .unwrap();
    let read = SendOp::RdmaRead {
        remote_addr: DST,
        rkey: remote,
    };
    sim.post_send(A, qa, &signaled(3, read, sge(SRC + 100, 100, key)))
        .unwrap();
    let to_err = QpAttr {
        state: Some(QpState::Err),
        ..QpAttr::default()
    };
    sim.nodes[A]
        .endpoint
        .modify_qp(sim.now, qa, &to_err)
        .unwrap();
    let sent_before = log.borrow().iter().filter(|s| s.from == A).count();

    let sends = sim.poll_send(A);
    let flushed: Vec<_> = sends
        .iter()
        .map(|c| (c.wr_id, c.status, c.opcode))
        .collect();
    assert_eq!(
        flushed,
        [
            (1, WcStatus::WrFlush, WcOpcode::Send),
            (2, WcStatus::WrFlush, WcOpcode::RdmaWrite),
            (3, WcStatus::WrFlush, WcOpcode::RdmaRead),
        ]
    );
    assert_eq!(
        summary(&sim.poll_recv(A)),
        [
            (11, WcStatus::WrFlush),
            (12, WcStatus::WrFlush),
            (13, WcStatus::WrFlush)
        ]
    );
    sim.post_send(A, qa, &signaled(4, SendOp::Send, sge(SRC, 100, key)))
        .unwrap();
    sim.post_recv(A, qa, &recv_wr(14, sge(SRC + 200, 100, key)))
        .unwrap();
    assert_eq!(summary(&sim.poll_send(A)), [(4, WcStatus::WrFlush)]);
    assert_eq!(summary(&sim.poll_recv(A)), [(14, WcStatus::WrFlush)]);
    settle(&mut sim);
    assert!(
        sim.poll_send(A).is_empty(),
        "the late ACK completes nothing"
    );
    let sent_after = log.borrow().iter().filter(|s| s.from == A).count();
    assert_eq!(sent_after, sent_before, "nothing sent in ERR");
}

// ---------------------------------------------------------------------------------------
// Duplicates

/// A SEND resent after its ACK was lost consumes one receive; the next message gets the next.
#[test]
fn duplicate_send_received_once() {
    let (mut sim, qa, qb) = pair(7, QpType::Rc, retry(7, 7));
    let log = tap(&mut sim, drop_first_responses(1));
    let first = pattern(100, 17);
    let second = pattern(60, 18);
    let key = sim.reg(A, SRC, &[first.clone(), second.clone()].concat());
    let dst = sim.reg(B, DST, &[0; 100]);
    let dst2 = sim.reg(B, DST2, &[0; 100]);
    sim.post_recv(B, qb, &recv_wr(8, sge(DST, 100, dst)))
        .unwrap();
    sim.post_recv(B, qb, &recv_wr(9, sge(DST2, 100, dst2)))
        .unwrap();
    sim.post_send(A, qa, &signaled(1, SendOp::Send, sge(SRC, 100, key)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::Success)]
    );
    assert_eq!(count(&log, A, Opcode::RcSendOnly), 2, "delivered twice");
    settle(&mut sim);
    assert_eq!(summary(&sim.poll_recv(B)), [(8, WcStatus::Success)]);
    assert_eq!(sim.mr_bytes(B, dst), first);

    sim.post_send(A, qa, &signaled(2, SendOp::Send, sge(SRC + 100, 60, key)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(2, WcStatus::Success)]
    );
    let recvs = wait_recv(&mut sim, B, 1);
    assert_eq!(
        (recvs[0].wr_id, recvs[0].byte_len),
        (9, 60),
        "the next message takes the next receive"
    );
    assert_eq!(sim.mr_bytes(B, dst2)[..60], second[..]);
}

/// A WRITE resent after its ACK was lost is not re-executed: bytes B changed meanwhile stay.
#[test]
fn duplicate_write_not_executed_twice() {
    let (mut sim, qa, _qb) = pair(7, QpType::Rc, retry(7, 7));
    let log = tap(&mut sim, drop_first_responses(1));
    let key = sim.reg(A, SRC, &pattern(200, 19));
    let target = sim.reg(B, DST, &[0; 200]);
    let write = SendOp::RdmaWrite {
        remote_addr: DST,
        rkey: target,
    };
    sim.post_send(A, qa, &signaled(1, write, sge(SRC, 200, key)))
        .unwrap();
    assert!(sim.run_until(STEPS, |sim| sim.stats.filtered == 1));
    assert_eq!(sim.mr_bytes(B, target), pattern(200, 19), "executed once");
    let mr = sim.nodes[B].endpoint.mrs().get_mut(target).unwrap();
    mr.bytes_mut().unwrap().fill(0xEE);
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::Success)]
    );
    assert_eq!(
        count(&log, A, Opcode::RcRdmaWriteOnly),
        2,
        "delivered twice"
    );
    assert_eq!(sim.mr_bytes(B, target), [0xEE; 200]);
}

/// A READ resent after its response was lost is executed again, on memory as it is now.
#[test]
fn duplicate_read_re_executed() {
    let (mut sim, qa, _qb) = pair(7, QpType::Rc, retry(7, 7));
    let log = tap(&mut sim, drop_first_responses(1));
    let back = sim.reg(A, SRC, &[0; 200]);
    let source = sim.reg(B, DST, &pattern(200, 20));
    let read = SendOp::RdmaRead {
        remote_addr: DST,
        rkey: source,
    };
    sim.post_send(A, qa, &signaled(1, read, sge(SRC, 200, back)))
        .unwrap();
    assert!(sim.run_until(STEPS, |sim| sim.stats.filtered == 1));
    let now = pattern(200, 21);
    let mr = sim.nodes[B].endpoint.mrs().get_mut(source).unwrap();
    mr.write(0, &now).unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::Success)]
    );
    assert_eq!(count(&log, A, Opcode::RcRdmaReadRequest), 2);
    assert_eq!(count(&log, B, Opcode::RcRdmaReadResponseOnly), 2);
    assert_eq!(sim.mr_bytes(A, back), now);
}

/// A FETCH_ADD resent after its response was lost is answered from cache: added once, old value.
#[test]
fn duplicate_atomic_answered_from_cache() {
    let (mut sim, qa, _qb) = pair(7, QpType::Rc, retry(7, 7));
    let log = tap(&mut sim, drop_first_responses(1));
    let result = sim.reg(A, SRC, &[0; 8]);
    let target = sim.reg(B, DST, &40u64.to_ne_bytes());
    let faa = SendOp::FetchAdd {
        remote_addr: DST,
        rkey: target,
        add: 2,
    };
    sim.post_send(A, qa, &signaled(1, faa, sge(SRC, 8, result)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::Success)]
    );
    assert_eq!(count(&log, A, Opcode::RcFetchAdd), 2, "delivered twice");
    assert_eq!(count(&log, B, Opcode::RcAtomicAcknowledge), 2);
    assert_eq!(sim.mr_bytes(B, target), 42u64.to_ne_bytes());
    assert_eq!(sim.mr_bytes(A, result), 40u64.to_ne_bytes());
}

// ---------------------------------------------------------------------------------------
// CQ overflow

/// A send CQ of depth 2 given 3 completions: CqOverflow event, CQ overflowed, QP in ERR, 2 kept.
#[test]
fn cq_overflow_reported() {
    let mut sim = Sim::new(LinkConfig::default(), 7);
    assert_eq!((sim.add_node(), sim.add_node()), (A, B));
    let tiny = sim.nodes[A].endpoint.create_cq(2).unwrap();
    sim.nodes[A].send_cq = tiny;
    let pair = sim.connect(A, B, QpType::Rc, PathMtu::Mtu1024, retry(7, 7));
    let (qa, qb) = (pair.a.1, pair.b.1);
    let key = sim.reg(A, SRC, &pattern(100, 22));
    let dst = sim.reg(B, DST, &[0; 300]);
    for wr_id in [1, 2, 3] {
        let at = DST + 100 * (wr_id - 1);
        sim.post_recv(B, qb, &recv_wr(wr_id, sge(at, 100, dst)))
            .unwrap();
        sim.post_send(A, qa, &signaled(wr_id, SendOp::Send, sge(SRC, 100, key)))
            .unwrap();
    }
    let mut events = Vec::new();
    assert!(sim.run_until(STEPS, |sim| {
        events.extend(sim.nodes[A].endpoint.take_events());
        !events.is_empty()
    }));
    // Named by the CQ that overflowed (the send CQ, not the receive CQ) and the QP.
    let overflow = AsyncEvent::CqOverflow { cq: tiny, qpn: qa };
    assert!(events.contains(&overflow), "{events:?}");
    assert!(events.iter().all(|e| *e == overflow), "{events:?}");
    assert_eq!(state(&sim, A, qa), QpState::Err);
    let cq = sim.nodes[A].endpoint.cq(tiny);
    assert!(cq.is_overflowed());
    let mut kept = Vec::new();
    cq.poll(usize::MAX, &mut kept);
    assert_eq!(
        summary(&kept),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
}

// ---------------------------------------------------------------------------------------
// UC and UD

/// UC: a lost middle packet drops that message silently; its receive takes the next message.
#[test]
fn uc_lost_middle_packet_drops_the_message() {
    let (mut sim, qa, qb) = pair(7, QpType::Uc, RetryConfig::default());
    let log = tap(&mut sim, |frame, before| {
        frame.opcode == Opcode::UcSendMiddle && !before.iter().any(|s| s.dropped)
    });
    let first = pattern(3000, 23);
    let second = pattern(2000, 24);
    let third = pattern(500, 25);
    let key = sim.reg(A, SRC, &[first, second.clone(), third.clone()].concat());
    let dst = sim.reg(B, DST, &[0; 3000]);
    let dst2 = sim.reg(B, DST2, &[0; 3000]);
    sim.post_recv(B, qb, &recv_wr(8, sge(DST, 3000, dst)))
        .unwrap();
    sim.post_recv(B, qb, &recv_wr(9, sge(DST2, 3000, dst2)))
        .unwrap();
    sim.post_send(A, qa, &signaled(1, SendOp::Send, sge(SRC, 3000, key)))
        .unwrap();
    sim.post_send(
        A,
        qa,
        &signaled(2, SendOp::Send, sge(SRC + 3000, 2000, key)),
    )
    .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 2)),
        [(1, WcStatus::Success), (2, WcStatus::Success)],
        "UC completes on sending"
    );
    settle(&mut sim);
    assert_eq!(sim.stats.filtered, 1);
    assert_eq!(count(&log, A, Opcode::UcSendMiddle), 1, "never resent");
    let recvs = sim.poll_recv(B);
    assert_eq!(recvs.len(), 1, "{recvs:?}");
    assert_eq!(
        (recvs[0].wr_id, recvs[0].status, recvs[0].byte_len),
        (8, WcStatus::Success, 2000)
    );
    assert_eq!(sim.mr_bytes(B, dst)[..2000], second[..]);
    assert!(stats(&sim, B, qb).dropped >= 1);

    sim.post_send(A, qa, &signaled(3, SendOp::Send, sge(SRC + 5000, 500, key)))
        .unwrap();
    let recvs = wait_recv(&mut sim, B, 1);
    assert_eq!((recvs[0].wr_id, recvs[0].byte_len), (9, 500));
    assert_eq!(sim.mr_bytes(B, dst2)[..500], third[..]);
}

/// Two UD QPs on A and B, B's with Q_Key 0x2222.
fn ud_pair() -> (Sim, u32, u32) {
    let mut sim = Sim::new(LinkConfig::default(), 7);
    assert_eq!((sim.add_node(), sim.add_node()), (A, B));
    let qa = sim.create_qp(A, QpType::Ud, QpCaps::default());
    let qb = sim.create_qp(B, QpType::Ud, QpCaps::default());
    sim.bring_up_ud(A, qa, 0x1111);
    sim.bring_up_ud(B, qb, 0x2222);
    (sim, qa, qb)
}

fn ud_send(sim: &Sim, wr_id: u64, sge: Sge, qb: u32, qkey: u32) -> SendWr {
    SendWr {
        ud: Some(UdDest {
            av: sim.av_of(B),
            remote_qpn: qb,
            remote_qkey: qkey,
        }),
        ..signaled(wr_id, SendOp::Send, sge)
    }
}

/// UD: a wrong Q_Key is dropped without using a receive; the right one then lands in it.
#[test]
fn ud_wrong_qkey_dropped() {
    let (mut sim, qa, qb) = ud_pair();
    let wrong = pattern(100, 26);
    let right = pattern(100, 27);
    let key = sim.reg(A, SRC, &[wrong, right.clone()].concat());
    let dst = sim.reg(B, DST, &[0; 140]);
    sim.post_recv(B, qb, &recv_wr(9, sge(DST, 140, dst)))
        .unwrap();
    let bad = ud_send(&sim, 1, sge(SRC, 100, key), qb, 0x3333);
    sim.post_send(A, qa, &bad).unwrap();
    settle(&mut sim);
    assert!(sim.poll_recv(B).is_empty());
    assert_eq!(stats(&sim, B, qb).dropped, 1);
    let good = ud_send(&sim, 2, sge(SRC + 100, 100, key), qb, 0x2222);
    sim.post_send(A, qa, &good).unwrap();
    let recvs = wait_recv(&mut sim, B, 1);
    assert_eq!((recvs[0].wr_id, recvs[0].status), (9, WcStatus::Success));
    assert_eq!(sim.mr_bytes(B, dst)[40..], right[..]);
    assert_eq!(
        summary(&sim.poll_send(A)),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
}

/// UD: buffer = 40-byte GRH area (IPv4 header in its last 20) + data, byte_len 40 + len, src_qp.
#[test]
fn ud_receive_has_grh_and_source_qp() {
    let (mut sim, qa, qb) = ud_pair();
    let data = pattern(100, 28);
    let key = sim.reg(A, SRC, &data);
    let dst = sim.reg(B, DST, &[0xAA; 200]);
    sim.post_recv(B, qb, &recv_wr(9, sge(DST, 200, dst)))
        .unwrap();
    let send = ud_send(&sim, 1, sge(SRC, 100, key), qb, 0x2222);
    sim.post_send(A, qa, &send).unwrap();
    let recvs = wait_recv(&mut sim, B, 1);
    let c = recvs[0];
    assert_eq!(
        (c.wr_id, c.status, c.opcode),
        (9, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!((c.byte_len, c.src_qp, c.qp_num), (140, qa, qb));
    // What mlx5 reports in `sl` and UCX reads to find the IPv4 destination in the GRH area.
    assert_eq!(c.network_header, Some(NetworkHeader::Ipv4));
    assert_eq!(c.roce_packet_type(), 0x8 | 0x2);
    let buffer = sim.mr_bytes(B, dst);
    assert_eq!(
        buffer[20] >> 4,
        4,
        "an IPv4 header in the last 20 bytes of the GRH"
    );
    let ip = |at: usize| Ipv4Addr::new(buffer[at], buffer[at + 1], buffer[at + 2], buffer[at + 3]);
    assert_eq!((ip(32), ip(36)), (sim.nodes[A].ip, sim.nodes[B].ip));
    assert_eq!(buffer[40..140], data[..]);
    assert_eq!(buffer[140..], [0xAA; 60], "nothing past byte_len");
}
