//! ATOMIC WRITE (IBTA 1.5, RC opcode 0x1D, as rxe carries it): the request is a RETH and
//! 8 bytes of payload, stored at once at an aligned address of a region the QP may write;
//! the answer is a READ response ONLY without data; a duplicate gets the answer again
//! without storing again; a bad address or missing rights fail the request.

use roce_transport::cq::{WcOpcode, WcStatus};
use roce_transport::qp::PostError;
use roce_transport::qp_state::QpType;
use roce_transport::wr::{SendOp, SendWr};
use roce_transport::AccessFlags;
use roce_wire::Opcode;

mod common;
use common::{count, pair, retry, sge, signaled, summary, tap, wait_send, A, B, DST, SRC};

const DATA: [u8; 8] = [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88];

fn atomic_write(wr_id: u64, remote_addr: u64, rkey: u32, data: [u8; 8]) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::AtomicWrite {
            remote_addr,
            rkey,
            data,
        },
        flags: roce_transport::wr::SendFlags::SIGNALED,
        ..SendWr::default()
    }
}

#[test]
fn atomic_write_stores_its_eight_bytes_and_completes_on_an_empty_read_response() {
    let (mut sim, qa, _qb) = pair(1, QpType::Rc, retry(7, 7));
    let log = tap(&mut sim, |_, _| false);
    let target = sim.reg(B, DST, &[0; 24]);
    sim.post_send(A, qa, &atomic_write(5, DST + 8, target, DATA))
        .unwrap();
    let done = wait_send(&mut sim, A, 1);
    assert_eq!(
        (
            done[0].wr_id,
            done[0].status,
            done[0].opcode,
            done[0].byte_len
        ),
        (5, WcStatus::Success, WcOpcode::AtomicWrite, 8)
    );
    let bytes = sim.mr_bytes(B, target);
    assert_eq!(&bytes[8..16], &DATA);
    assert_eq!(&bytes[..8], &[0; 8], "untouched before");
    assert_eq!(&bytes[16..], &[0; 8], "untouched after");
    assert_eq!(count(&log, A, Opcode::RcAtomicWrite), 1);
    assert_eq!(count(&log, B, Opcode::RcRdmaReadResponseOnly), 1);
    assert_eq!(count(&log, B, Opcode::RcAcknowledge), 0);
}

/// The answer to an ATOMIC WRITE is lost; a WRITE to the same word follows and is
/// acknowledged, which tells the requester the answer was lost: it sends both again. The
/// responder answers the duplicate ATOMIC WRITE from its resource without storing its
/// bytes over the WRITE's.
#[test]
fn a_duplicate_atomic_write_is_answered_again_and_not_stored_again() {
    let (mut sim, qa, _qb) = pair(2, QpType::Rc, retry(7, 7));
    let mut dropped = false;
    let log = tap(&mut sim, move |seen, _| {
        let drop = !dropped && seen.from == B && seen.opcode == Opcode::RcRdmaReadResponseOnly;
        dropped |= drop;
        drop
    });
    let target = sim.reg(B, DST, &[0; 8]);
    let later = [0xAB; 8];
    let source = sim.reg(A, SRC, &later);
    sim.post_send(A, qa, &atomic_write(1, DST, target, DATA))
        .unwrap();
    let write = SendOp::RdmaWrite {
        remote_addr: DST,
        rkey: target,
    };
    sim.post_send(A, qa, &signaled(2, write, sge(SRC, 8, source)))
        .unwrap();
    let done = wait_send(&mut sim, A, 2);
    assert_eq!(
        summary(&done),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(sim.mr_bytes(B, target), later, "the WRITE's bytes stay");
    assert_eq!(count(&log, A, Opcode::RcAtomicWrite), 2, "sent again");
    assert_eq!(count(&log, B, Opcode::RcRdmaReadResponseOnly), 2);
    assert!(sim.nodes[B].endpoint.counters().duplicate_request >= 1);
}

/// Fails `wr` at a fresh pair whose responder region (8 bytes at `DST`) grants `access`;
/// the status of its completion.
fn refused(access: AccessFlags, remote_addr: u64) -> WcStatus {
    let (mut sim, qa, _qb) = pair(3, QpType::Rc, retry(7, 7));
    let pd = sim.nodes[B].pd;
    let key = sim.nodes[B]
        .endpoint
        .mrs()
        .reg_mr(pd, DST, 16, access)
        .unwrap();
    sim.post_send(A, qa, &atomic_write(7, remote_addr, key, DATA))
        .unwrap();
    let done = wait_send(&mut sim, A, 1);
    assert_eq!(done[0].wr_id, 7);
    let bytes = sim.mr_bytes(B, key);
    assert_eq!(bytes, [0; 16], "nothing stored");
    done[0].status
}

#[test]
fn an_atomic_write_needs_remote_write_rights_and_an_aligned_address() {
    let atomic_only = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC;
    assert_eq!(refused(atomic_only, DST), WcStatus::RemoteAccess);
    let write = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    assert_eq!(refused(write, DST + 4), WcStatus::RemoteInvalidRequest);
    assert_eq!(
        refused(write, DST + 16),
        WcStatus::RemoteAccess,
        "out of the region"
    );
}

#[test]
fn only_rc_carries_atomic_write() {
    let (mut sim, uc, _) = pair(4, QpType::Uc, retry(7, 7));
    assert_eq!(
        sim.post_send(A, uc, &atomic_write(1, DST, 1, DATA)),
        Err(PostError::UnsupportedOperation),
        "UC"
    );
    let caps = roce_transport::qp::QpCaps::default();
    let ud = sim.create_qp(A, QpType::Ud, caps);
    sim.bring_up_ud(A, ud, 1);
    let mut wr = atomic_write(2, DST, 1, DATA);
    wr.ud = Some(roce_transport::wr::UdDest {
        av: sim.av_of(B),
        remote_qpn: 1,
        remote_qkey: 1,
    });
    assert_eq!(
        sim.post_send(A, ud, &wr),
        Err(PostError::UnsupportedOperation),
        "UD"
    );
}
