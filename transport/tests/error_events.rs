//! A QP that goes to ERR on its own says why, as an HCA does: the work request that failed
//! completes with the precise status, and the QP raises the matching async event
//! (`IBV_EVENT_QP_FATAL` with that status on the requester; `IBV_EVENT_QP_REQ_ERR` or
//! `IBV_EVENT_QP_ACCESS_ERR` on a responder a peer's request broke). `modify_qp` to ERR raises
//! nothing.

use roce_transport::cq::WcStatus;
use roce_transport::endpoint::AsyncEvent;
use roce_transport::qp_state::{PathMtu, QpAttr, QpState, QpType};
use roce_transport::sim::Sim;
use roce_transport::wr::SendOp;
use roce_wire::{ExtRepr, Opcode};

mod common;
use common::*;

/// A clean two-node network with one connected RC pair from A to B, MTU 1024.
fn rc_pair(retry_cnt: u8, rnr_retry: u8) -> (Sim, u32, u32) {
    pair(5, QpType::Rc, retry(retry_cnt, rnr_retry))
}

fn events(sim: &mut Sim, node: usize) -> Vec<AsyncEvent> {
    sim.nodes[node].endpoint.take_events()
}

/// Posts one signaled SEND of 100 bytes from A and waits for its completion's status.
fn send_status(sim: &mut Sim, qa: u32) -> WcStatus {
    let key = sim.reg(A, SRC, &pattern(100, 1));
    sim.post_send(A, qa, &signaled(1, SendOp::Send, sge(SRC, 100, key)))
        .unwrap();
    wait_send(sim, A, 1)[0].status
}

#[test]
fn rnr_retries_exhausted_is_qp_fatal_with_rnr_retry_exc_err() {
    let (mut sim, qa, _) = rc_pair(7, 1);
    assert_eq!(send_status(&mut sim, qa), WcStatus::RnrRetryExceeded);
    settle(&mut sim);
    assert_eq!(
        events(&mut sim, A),
        [AsyncEvent::QpFatal {
            qpn: qa,
            status: WcStatus::RnrRetryExceeded
        }]
    );
    // B only answered with RNR NAKs: it stays up and has nothing to report.
    assert_eq!(events(&mut sim, B), []);
}

#[test]
fn retries_exhausted_is_qp_fatal_with_retry_exc_err() {
    let (mut sim, qa, _) = rc_pair(1, 7);
    tap(&mut sim, |frame, _| frame.from == B);
    assert_eq!(send_status(&mut sim, qa), WcStatus::RetryExceeded);
    settle(&mut sim);
    assert_eq!(
        events(&mut sim, A),
        [AsyncEvent::QpFatal {
            qpn: qa,
            status: WcStatus::RetryExceeded
        }]
    );
}

/// A WRITE with a wrong R_Key: REM_ACCESS_ERR and QP fatal at A, an access error at B.
#[test]
fn rkey_violation_is_an_access_error_at_the_responder() {
    let (mut sim, qa, qb) = rc_pair(7, 7);
    let key = sim.reg(A, SRC, &pattern(100, 2));
    let target = sim.reg(B, DST, &[0; 100]);
    let write = SendOp::RdmaWrite {
        remote_addr: DST,
        rkey: target ^ 1,
    };
    sim.post_send(A, qa, &signaled(1, write, sge(SRC, 100, key)))
        .unwrap();
    assert_eq!(wait_send(&mut sim, A, 1)[0].status, WcStatus::RemoteAccess);
    settle(&mut sim);
    let fatal = AsyncEvent::QpFatal {
        qpn: qa,
        status: WcStatus::RemoteAccess,
    };
    assert_eq!(events(&mut sim, A), [fatal]);
    assert_eq!(events(&mut sim, B), [AsyncEvent::QpAccessError { qpn: qb }]);
    assert_eq!(state(&sim, B, qb), QpState::Err);
}

/// A misaligned FETCH_ADD: REM_INV_REQ_ERR and QP fatal at A, a request error at B.
#[test]
fn invalid_request_is_a_request_error_at_the_responder() {
    let (mut sim, qa, qb) = rc_pair(7, 7);
    let result = sim.reg(A, SRC, &[0; 8]);
    let target = sim.reg(B, DST, &[0; 16]);
    let faa = SendOp::FetchAdd {
        remote_addr: DST + 4,
        rkey: target,
        add: 1,
    };
    sim.post_send(A, qa, &signaled(1, faa, sge(SRC, 8, result)))
        .unwrap();
    let status = wait_send(&mut sim, A, 1)[0].status;
    assert_eq!(status, WcStatus::RemoteInvalidRequest);
    settle(&mut sim);
    assert_eq!(
        events(&mut sim, A),
        [AsyncEvent::QpFatal { qpn: qa, status }]
    );
    assert_eq!(
        events(&mut sim, B),
        [AsyncEvent::QpRequestError { qpn: qb }]
    );
}

/// A forged in-window request kills B's QP (the issue: its program saw only WR_FLUSH_ERR):
/// B now reports a request error, once.
#[test]
fn a_forged_request_that_kills_a_qp_says_so() {
    let (mut sim, qa, qb) = rc_pair(7, 7);
    let log = tap(&mut sim, |_, _| false);
    let dst = sim.reg(B, DST, &[0; 200]);
    for wr_id in [8, 9] {
        let at = DST + 100 * (wr_id - 8);
        sim.post_recv(B, qb, &recv_wr(wr_id, sge(at, 100, dst)))
            .unwrap();
    }
    assert_eq!(send_status(&mut sim, qa), WcStatus::Success);
    settle(&mut sim);
    let expected = log.borrow()[0].psn + 1;
    let payload = vec![0xAB; PathMtu::Mtu1024.bytes()];
    let bth = forged_bth(Opcode::RcSendMiddle, qb, expected, payload.len(), false);
    let middle = forged(&sim, A, B, bth, ExtRepr::default(), &payload);
    sim.nodes[B].endpoint.handle_packet(sim.now, &middle);
    assert_eq!(state(&sim, B, qb), QpState::Err);
    assert_eq!(
        events(&mut sim, B),
        [AsyncEvent::QpRequestError { qpn: qb }]
    );
    let recvs = sim.poll_recv(B);
    assert_eq!(
        summary(&recvs),
        [(8, WcStatus::Success), (9, WcStatus::WrFlush)]
    );
}

/// A SEND gathering through a key A never issued: LOC_PROT_ERR and QP fatal at A.
#[test]
fn local_protection_error_is_qp_fatal_with_loc_prot_err() {
    let (mut sim, qa, _) = rc_pair(7, 7);
    let key = sim.reg(A, SRC, &pattern(100, 3));
    sim.post_send(A, qa, &signaled(1, SendOp::Send, sge(SRC, 100, key ^ 1)))
        .unwrap();
    let status = wait_send(&mut sim, A, 1)[0].status;
    assert_eq!(status, WcStatus::LocalProtection);
    assert_eq!(
        events(&mut sim, A),
        [AsyncEvent::QpFatal { qpn: qa, status }]
    );
}

#[test]
fn modify_qp_to_err_raises_nothing() {
    let (mut sim, qa, _) = rc_pair(7, 7);
    let err = QpAttr {
        state: Some(QpState::Err),
        ..QpAttr::default()
    };
    let now = sim.now;
    sim.nodes[A].endpoint.modify_qp(now, qa, &err).unwrap();
    assert_eq!(state(&sim, A, qa), QpState::Err);
    assert_eq!(events(&mut sim, A), []);
}

/// A device lost for good (its switch died): every QP goes to ERR, its outstanding work
/// completes flushed, and one `DeviceFatal` is raised however often it is said.
#[test]
fn a_lost_device_flushes_every_qp_and_says_so_once() {
    let (mut sim, qa, _) = rc_pair(7, 7);
    let key = sim.reg(A, SRC, &pattern(100, 1));
    sim.post_send(A, qa, &signaled(1, SendOp::Send, sge(SRC, 100, key)))
        .unwrap();
    let posted_recv = sim.post_recv(A, qa, &recv_wr(2, sge(SRC, 100, key)));
    assert!(posted_recv.is_ok());
    let now = sim.now;
    sim.nodes[A].endpoint.device_fatal(now);
    sim.nodes[A].endpoint.device_fatal(now);
    assert_eq!(state(&sim, A, qa), QpState::Err);
    assert_eq!(events(&mut sim, A), [AsyncEvent::DeviceFatal]);
    let sent = wait_send(&mut sim, A, 1);
    assert_eq!((sent[0].wr_id, sent[0].status), (1, WcStatus::WrFlush));
    let received = wait_recv(&mut sim, A, 1);
    assert_eq!(
        (received[0].wr_id, received[0].status),
        (2, WcStatus::WrFlush)
    );
}
