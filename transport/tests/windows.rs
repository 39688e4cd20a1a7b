//! Memory windows between two simulated endpoints, as rxe runs them: binds posted as work
//! requests (type 1 and type 2), remote access through a window (its range, rights, PD and
//! QP), the key byte of each bind, LOCAL_INV and SEND with invalidate, the completions of
//! binds rxe refuses, and a SEND with invalidate naming a key it may not invalidate (NAKed,
//! counted, the receive failed, the QP in ERR).

use roce_transport::cq::{WcOpcode, WcStatus, WorkCompletion};
use roce_transport::mr::{MrError, MwType, PdId};
use roce_transport::qp_state::{PathMtu, QpState, QpType};
use roce_transport::sim::{RetryConfig, Sim};
use roce_transport::wr::{MwBind, MwId, SendFlags, SendOp, SendWr};
use roce_transport::AccessFlags;
use roce_wire::Opcode;

mod common;
use common::*;

const WINDOW: u64 = DST + 0x100;
const WINDOW_LEN: u64 = 0x200;
const REGION_LEN: usize = 0x1000;
/// What a window is bound with unless a test says otherwise.
const RW: AccessFlags = AccessFlags::REMOTE_WRITE.union(AccessFlags::REMOTE_READ);
/// A region that grants no remote access of its own: only windows reach it.
const BINDABLE: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::MW_BIND);

/// Two nodes with an RC pair (A's QP, B's QP), a source region at A and at B a region at
/// `DST` that only windows reach.
struct Setup {
    sim: Sim,
    qa: u32,
    qb: u32,
    src: u32,
    target: u32,
}

fn setup() -> Setup {
    let (mut sim, qa, qb) = pair(5, QpType::Rc, RetryConfig::default());
    let src = sim.reg(A, SRC, &pattern(REGION_LEN, 1));
    let pd = sim.nodes[B].pd;
    let target = (sim.nodes[B].endpoint.mrs())
        .reg_mr(pd, DST, REGION_LEN, BINDABLE)
        .unwrap();
    Setup {
        sim,
        qa,
        qb,
        src,
        target,
    }
}

impl Setup {
    fn alloc(&mut self, kind: MwType) -> MwId {
        let pd = self.sim.nodes[B].pd;
        self.sim.nodes[B].endpoint.mrs().alloc_mw(pd, kind).unwrap()
    }

    fn rkey(&mut self, mw: MwId) -> u32 {
        self.sim.nodes[B].endpoint.mrs().mw_rkey(mw).unwrap()
    }

    /// B binds `mw` on its QP with `bind`'s range and rights; the completion.
    fn bind(&mut self, bind: MwBind) -> WorkCompletion {
        let wr = SendWr {
            wr_id: 7,
            op: SendOp::BindMw(bind),
            flags: SendFlags::SIGNALED,
            ..SendWr::default()
        };
        self.sim.post_send(B, self.qb, &wr).unwrap();
        let done = wait_send(&mut self.sim, B, 1);
        assert_eq!(done[0].opcode, WcOpcode::BindMw);
        done[0]
    }

    /// The bind of the whole window range with `RW`, its key byte one past the current.
    fn window(&mut self, mw: MwId) -> MwBind {
        let rkey = self.rkey(mw);
        MwBind {
            mw,
            rkey: inc_rkey(rkey),
            mr_lkey: self.target,
            addr: WINDOW,
            length: WINDOW_LEN,
            access: RW,
            zero_based: false,
        }
    }

    /// A WRITEs `len` bytes of its pattern to `addr` through `rkey`; the completion status.
    fn write(&mut self, rkey: u32, addr: u64, len: usize) -> WcStatus {
        let op = SendOp::RdmaWrite {
            remote_addr: addr,
            rkey,
        };
        self.sim
            .post_send(A, self.qa, &signaled(1, op, sge(SRC, len, self.src)))
            .unwrap();
        wait_send(&mut self.sim, A, 1)[0].status
    }

    fn target_bytes(&mut self) -> Vec<u8> {
        let key = self.target;
        self.sim.mr_bytes(B, key)
    }
}

/// `ibv_inc_rkey`: the key byte plus one.
fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xFF) | (rkey.wrapping_add(1) & 0xFF)
}

#[test]
fn a_type1_window_grants_its_range_and_rights_only() {
    let mut s = setup();
    let mw = s.alloc(MwType::One);
    let first = s.rkey(mw);
    let bind = s.window(mw);
    let done = s.bind(bind);
    assert_eq!(done.status, WcStatus::Success);
    let rkey = s.rkey(mw);
    assert_eq!(rkey, inc_rkey(first), "the bind set the key byte");
    assert_eq!(rkey >> 8, first >> 8, "and kept the index");

    assert_eq!(s.write(rkey, WINDOW + 0x10, 0x40), WcStatus::Success);
    let bytes = s.target_bytes();
    let at = (WINDOW - DST) as usize + 0x10;
    assert_eq!(bytes[at..at + 0x40], pattern(REGION_LEN, 1)[..0x40]);
    assert!(bytes[..at].iter().all(|&b| b == 0), "nothing outside it");

    // A READ through the window comes back.
    let read = SendOp::RdmaRead {
        remote_addr: WINDOW + 0x10,
        rkey,
    };
    (s.sim)
        .post_send(A, s.qa, &signaled(2, read, sge(SRC + 0x800, 0x40, s.src)))
        .unwrap();
    assert_eq!(wait_send(&mut s.sim, A, 1)[0].status, WcStatus::Success);
}

/// Each way past a window fails the access with a remote access error (a fresh pair for
/// each: the error moves both QPs to ERR).
#[test]
fn access_outside_a_window_is_a_remote_access_error() {
    /// From the window's key and the region's: the key, address and length to write.
    type Access = fn(u32, u32) -> (u32, u64, usize);
    let cases: [(&str, Access); 5] = [
        ("before it", |rkey, _| (rkey, WINDOW - 8, 16)),
        ("past its end", |rkey, _| {
            (rkey, WINDOW + WINDOW_LEN - 8, 16)
        }),
        ("a stale key byte", |rkey, _| (rkey ^ 1, WINDOW, 8)),
        ("the region's own key", |_, mr| (mr, WINDOW, 8)),
        ("an unknown index", |rkey, _| (rkey ^ 0x100, WINDOW, 8)),
    ];
    for (what, access) in cases {
        let mut s = setup();
        let mw = s.alloc(MwType::One);
        let bind = s.window(mw);
        assert_eq!(s.bind(bind).status, WcStatus::Success);
        let (rkey, addr, len) = access(s.rkey(mw), s.target);
        assert_eq!(s.write(rkey, addr, len), WcStatus::RemoteAccess, "{what}");
        assert_eq!(state(&s.sim, B, s.qb), QpState::Err, "{what}");
        assert!(
            s.target_bytes().iter().all(|&b| b == 0),
            "{what}: nothing written"
        );
    }
    // Rights the window does not grant: an atomic through a read/write window.
    let mut s = setup();
    let mw = s.alloc(MwType::One);
    let bind = s.window(mw);
    s.bind(bind);
    let add = SendOp::FetchAdd {
        remote_addr: WINDOW,
        rkey: s.rkey(mw),
        add: 1,
    };
    (s.sim)
        .post_send(A, s.qa, &signaled(3, add, sge(SRC, 8, s.src)))
        .unwrap();
    assert_eq!(
        wait_send(&mut s.sim, A, 1)[0].status,
        WcStatus::RemoteAccess
    );
}

/// A type 1 bind of length 0 unbinds the window: its key grants nothing.
#[test]
fn a_zero_length_bind_unbinds_a_type1_window() {
    let mut s = setup();
    let mw = s.alloc(MwType::One);
    let bind = s.window(mw);
    s.bind(bind);
    let unbind = MwBind {
        length: 0,
        addr: 0,
        access: AccessFlags::empty(),
        ..s.window(mw)
    };
    assert_eq!(s.bind(unbind).status, WcStatus::Success);
    let mrs = s.sim.nodes[B].endpoint.mrs();
    assert_eq!(mrs.mw_is_bound(mw), Some(false));
    let rkey = s.rkey(mw);
    assert_eq!(s.write(rkey, WINDOW, 8), WcStatus::RemoteAccess);
}

/// A type 2 window answers only the QP that bound it: another QP of the same PD between
/// the same nodes gets a remote access error.
#[test]
fn a_type2_window_answers_only_the_qp_that_bound_it() {
    let mut s = setup();
    let mw = s.alloc(MwType::Two);
    let bind = s.window(mw);
    assert_eq!(s.bind(bind).status, WcStatus::Success);
    let rkey = s.rkey(mw);
    assert_eq!(s.write(rkey, WINDOW, 0x20), WcStatus::Success);

    let other = s
        .sim
        .connect(A, B, QpType::Rc, PathMtu::Mtu1024, RetryConfig::default());
    let op = SendOp::RdmaWrite {
        remote_addr: WINDOW,
        rkey,
    };
    (s.sim)
        .post_send(A, other.a.1, &signaled(9, op, sge(SRC, 8, s.src)))
        .unwrap();
    assert_eq!(
        wait_send(&mut s.sim, A, 1)[0].status,
        WcStatus::RemoteAccess
    );
    assert_eq!(state(&s.sim, B, other.b.1), QpState::Err);
    assert_eq!(
        state(&s.sim, B, s.qb),
        QpState::Rts,
        "the binder is untouched"
    );
}

/// LOCAL_INV frees a type 2 window: its key is dead, and it binds again, with a new key.
#[test]
fn local_invalidate_frees_a_type2_window() {
    let mut s = setup();
    let mw = s.alloc(MwType::Two);
    let bind = s.window(mw);
    s.bind(bind);
    let rkey = s.rkey(mw);
    let inv = SendWr {
        wr_id: 8,
        op: SendOp::LocalInv(rkey),
        flags: SendFlags::SIGNALED,
        ..SendWr::default()
    };
    s.sim.post_send(B, s.qb, &inv).unwrap();
    let done = wait_send(&mut s.sim, B, 1);
    assert_eq!(
        (done[0].opcode, done[0].status),
        (WcOpcode::LocalInv, WcStatus::Success)
    );
    assert_eq!(s.sim.nodes[B].endpoint.mrs().mw_is_bound(mw), Some(false));
    // Bound again with the next key byte; the old key stays dead.
    let again = s.window(mw);
    assert_eq!(s.bind(again).status, WcStatus::Success);
    let fresh = s.rkey(mw);
    assert_ne!(fresh, rkey);
    assert_eq!(s.write(fresh, WINDOW, 8), WcStatus::Success);
    assert_eq!(s.write(rkey, WINDOW, 8), WcStatus::RemoteAccess);
}

/// A's SEND with invalidate frees B's window: B's receive reports the key, and the key
/// grants nothing afterwards.
#[test]
fn send_with_invalidate_frees_the_responders_window() {
    let mut s = setup();
    let mw = s.alloc(MwType::Two);
    let bind = s.window(mw);
    s.bind(bind);
    let rkey = s.rkey(mw);
    let inbox = s.sim.reg(B, DST2, &[0; 64]);
    s.sim
        .post_recv(B, s.qb, &recv_wr(40, sge(DST2, 64, inbox)))
        .unwrap();
    let send = signaled(4, SendOp::SendWithInv(rkey), sge(SRC, 16, s.src));
    s.sim.post_send(A, s.qa, &send).unwrap();
    assert_eq!(wait_send(&mut s.sim, A, 1)[0].status, WcStatus::Success);
    let received = wait_recv(&mut s.sim, B, 1)[0];
    assert_eq!(
        (
            received.status,
            received.invalidated_rkey,
            received.byte_len
        ),
        (WcStatus::Success, Some(rkey), 16)
    );
    assert_eq!(s.sim.nodes[B].endpoint.mrs().mw_is_bound(mw), Some(false));
    assert_eq!(s.write(rkey, WINDOW, 8), WcStatus::RemoteAccess);
}

/// A SEND with invalidate whose key B may not invalidate (a region's, a type 1 window's,
/// an unbound or stale one, another PD's): B NAKs it as an invalid request (counted), its
/// receive fails with `REM_INV_REQ_ERR`, its QP enters ERR, and no window changes.
#[test]
fn send_with_invalidate_of_a_foreign_key_is_naked() {
    let cases: [&str; 5] = ["region", "type 1", "unbound", "stale", "other pd"];
    for case in cases {
        let mut s = setup();
        let type2 = s.alloc(MwType::Two);
        let bind = s.window(type2);
        s.bind(bind);
        let rkey = match case {
            "region" => s.target,
            "type 1" => {
                let one = s.alloc(MwType::One);
                let bind = s.window(one);
                s.bind(bind);
                s.rkey(one)
            }
            "unbound" => {
                let free = s.alloc(MwType::Two);
                s.rkey(free)
            }
            "stale" => s.rkey(type2) ^ 0x80,
            _ => {
                let mrs = s.sim.nodes[B].endpoint.mrs();
                let pd: PdId = mrs.alloc_pd();
                let alien = mrs.alloc_mw(pd, MwType::Two).unwrap();
                mrs.mw_rkey(alien).unwrap()
            }
        };
        let inbox = s.sim.reg(B, DST2, &[0; 64]);
        s.sim
            .post_recv(B, s.qb, &recv_wr(41, sge(DST2, 64, inbox)))
            .unwrap();
        let log = tap(&mut s.sim, |_, _| false);
        let naks_before = s.sim.nodes[B].endpoint.qp_stats(s.qb).unwrap().naks_sent;
        let send = signaled(5, SendOp::SendWithInv(rkey), sge(SRC, 16, s.src));
        s.sim.post_send(A, s.qa, &send).unwrap();
        let sent = wait_send(&mut s.sim, A, 1);
        assert_eq!(sent[0].status, WcStatus::RemoteInvalidRequest, "{case}");
        let received = wait_recv(&mut s.sim, B, 1);
        assert_eq!(
            summary(&received),
            [(41, WcStatus::RemoteInvalidRequest)],
            "{case}"
        );
        assert_eq!(state(&s.sim, B, s.qb), QpState::Err, "{case}");
        let naks = s.sim.nodes[B].endpoint.qp_stats(s.qb).unwrap().naks_sent;
        assert_eq!(naks, naks_before + 1, "{case}: counted");
        assert_eq!(count(&log, B, Opcode::RcAcknowledge), 1, "{case}: one NAK");
        let nak = log.borrow().iter().find(|f| f.from == B).unwrap().syndrome;
        assert_eq!(
            nak,
            Some(roce_wire::aeth::Syndrome::Nak(
                roce_wire::aeth::NakCode::InvalidRequest
            )),
            "{case}"
        );
        let mrs = s.sim.nodes[B].endpoint.mrs();
        assert_eq!(mrs.mw_is_bound(type2), Some(true), "{case}: still bound");
    }
}

/// The binds rxe refuses complete with `IBV_WC_MW_BIND_ERR` and move the QP to ERR; the
/// window keeps what it had.
#[test]
fn refused_binds_complete_with_mw_bind_err() {
    type Case = (&'static str, fn(&mut Setup, MwId) -> MwBind);
    let cases: [(MwType, Case); 9] = [
        (
            MwType::Two,
            ("a bound type 2", |s, mw| {
                let bind = s.window(mw);
                s.bind(bind);
                s.window(mw)
            }),
        ),
        (
            MwType::Two,
            ("a type 2 of length 0", |s, mw| MwBind {
                length: 0,
                ..s.window(mw)
            }),
        ),
        (
            MwType::One,
            ("a zero-based type 1", |s, mw| MwBind {
                zero_based: true,
                ..s.window(mw)
            }),
        ),
        (
            MwType::Two,
            ("a region without MW_BIND", |s, mw| {
                let pd = s.sim.nodes[B].pd;
                let plain = s.sim.nodes[B].endpoint.mrs();
                let key = plain
                    .reg_mr(pd, DST2, 0x1000, AccessFlags::LOCAL_WRITE)
                    .unwrap();
                MwBind {
                    mr_lkey: key,
                    addr: DST2,
                    ..s.window(mw)
                }
            }),
        ),
        (
            MwType::Two,
            ("a writable window over a read-only region", |s, mw| {
                let pd = s.sim.nodes[B].pd;
                let mrs = s.sim.nodes[B].endpoint.mrs();
                let key = mrs.reg_mr(pd, DST2, 0x1000, AccessFlags::MW_BIND).unwrap();
                MwBind {
                    mr_lkey: key,
                    addr: DST2,
                    ..s.window(mw)
                }
            }),
        ),
        (
            MwType::Two,
            ("a range past the region", |s, mw| MwBind {
                addr: DST + REGION_LEN as u64 - 8,
                ..s.window(mw)
            }),
        ),
        (
            MwType::Two,
            ("a region of another PD", |s, mw| {
                let mrs = s.sim.nodes[B].endpoint.mrs();
                let pd = mrs.alloc_pd();
                let key = mrs.reg_mr(pd, DST2, 0x1000, BINDABLE).unwrap();
                MwBind {
                    mr_lkey: key,
                    addr: DST2,
                    ..s.window(mw)
                }
            }),
        ),
        (
            MwType::One,
            ("an unknown region key", |s, mw| MwBind {
                mr_lkey: s.target ^ 0x55,
                ..s.window(mw)
            }),
        ),
        (
            MwType::Two,
            ("a deallocated window", |s, mw| {
                let bind = s.window(mw);
                s.sim.nodes[B].endpoint.mrs().dealloc_mw(mw).unwrap();
                bind
            }),
        ),
    ];
    for (kind, (what, make)) in cases {
        let mut s = setup();
        let mw = s.alloc(kind);
        let bind = make(&mut s, mw);
        let before = s.sim.nodes[B].endpoint.mrs().mw_rkey(mw);
        let done = s.bind(bind);
        assert_eq!(done.status, WcStatus::MwBind, "{what}");
        assert_eq!(state(&s.sim, B, s.qb), QpState::Err, "{what}");
        assert_eq!(s.sim.nodes[B].endpoint.mrs().mw_rkey(mw), before, "{what}");
    }
}

/// A bind on a QP of another PD than the window's is refused too.
#[test]
fn a_bind_on_a_qp_of_another_pd_is_refused() {
    let mut s = setup();
    let mw = s.alloc(MwType::One);
    let bind = s.window(mw);
    let other_pd = s.sim.nodes[B].endpoint.mrs().alloc_pd();
    let home = std::mem::replace(&mut s.sim.nodes[B].pd, other_pd);
    let pair = s
        .sim
        .connect(A, B, QpType::Rc, PathMtu::Mtu1024, RetryConfig::default());
    s.sim.nodes[B].pd = home;
    let wr = SendWr {
        wr_id: 3,
        op: SendOp::BindMw(bind),
        flags: SendFlags::SIGNALED,
        ..SendWr::default()
    };
    s.sim.post_send(B, pair.b.1, &wr).unwrap();
    assert_eq!(wait_send(&mut s.sim, B, 1)[0].status, WcStatus::MwBind);
}

/// LOCAL_INV of what is not a bound type 2 window of the QP's PD fails with
/// `IBV_WC_LOC_QP_OP_ERR`.
#[test]
fn refused_local_invalidations_complete_with_loc_qp_op_err() {
    for case in ["region", "type 1", "unbound"] {
        let mut s = setup();
        let rkey = match case {
            "region" => s.target,
            "type 1" => {
                let mw = s.alloc(MwType::One);
                let bind = s.window(mw);
                s.bind(bind);
                s.rkey(mw)
            }
            _ => {
                let mw = s.alloc(MwType::Two);
                s.rkey(mw)
            }
        };
        let inv = SendWr {
            wr_id: 6,
            op: SendOp::LocalInv(rkey),
            flags: SendFlags::SIGNALED,
            ..SendWr::default()
        };
        s.sim.post_send(B, s.qb, &inv).unwrap();
        let done = wait_send(&mut s.sim, B, 1);
        assert_eq!(done[0].status, WcStatus::LocalQpOperation, "{case}");
        assert_eq!(state(&s.sim, B, s.qb), QpState::Err, "{case}");
    }
}

/// A region with windows bound stays registered; deallocating the window frees it. A PD
/// with a window cannot go.
#[test]
fn windows_hold_their_region_and_pd() {
    let mut s = setup();
    let mw = s.alloc(MwType::Two);
    let bind = s.window(mw);
    s.bind(bind);
    let pd = s.sim.nodes[B].pd;
    let target = s.target;
    let mrs = s.sim.nodes[B].endpoint.mrs();
    assert_eq!(mrs.dereg_mr(target).err(), Some(MrError::WindowsBound));
    mrs.dealloc_mw(mw).unwrap();
    assert!(mrs.dereg_mr(target).is_ok());
    let spare = mrs.alloc_mw(pd, MwType::One).unwrap();
    assert_eq!(mrs.dealloc_pd(pd), Err(MrError::PdBusy));
    mrs.dealloc_mw(spare).unwrap();
    assert_eq!(mrs.dealloc_mw(spare), Err(MrError::UnknownWindow));
}

/// Sends and binds complete in the order posted, and going back N after a loss passes a
/// bind that ran by without running it again (a type 2 window binds only while free, so a
/// second run would fail).
#[test]
fn binds_run_once_and_complete_in_order_through_go_back_n() {
    let mut s = setup();
    let mw = s.alloc(MwType::Two);
    let bind = s.window(mw);
    let inbox = s.sim.reg(B, DST2, &[0; 256]);
    for wr_id in [50, 51] {
        let wr = recv_wr(wr_id, sge(DST2, 128, inbox));
        s.sim.post_recv(B, s.qb, &wr).unwrap();
    }
    // The first SEND from B is lost once: B goes back past its bind.
    let mut dropped = false;
    let _log = tap(&mut s.sim, move |seen, _| {
        let first = seen.from == B && seen.opcode == Opcode::RcSendOnly && !dropped;
        dropped |= first;
        first
    });
    let wrs = [
        signaled(10, SendOp::Send, sge(DST2 + 128, 8, inbox)),
        SendWr {
            wr_id: 11,
            op: SendOp::BindMw(bind),
            flags: SendFlags::SIGNALED,
            ..SendWr::default()
        },
        signaled(12, SendOp::Send, sge(DST2 + 128, 8, inbox)),
    ];
    let a_pd = s.sim.nodes[A].pd;
    let a_inbox = (s.sim.nodes[A].endpoint.mrs())
        .reg_mr(a_pd, DST2, 256, AccessFlags::all())
        .unwrap();
    for wr_id in [60, 61] {
        let wr = recv_wr(wr_id, sge(DST2, 128, a_inbox));
        s.sim.post_recv(A, s.qa, &wr).unwrap();
    }
    for wr in &wrs {
        s.sim.post_send(B, s.qb, wr).unwrap();
    }
    let done = wait_send(&mut s.sim, B, 3);
    assert_eq!(
        summary(&done),
        [
            (10, WcStatus::Success),
            (11, WcStatus::Success),
            (12, WcStatus::Success)
        ]
    );
    assert_eq!(done[1].opcode, WcOpcode::BindMw);
    assert!(s.sim.nodes[B].endpoint.qp_stats(s.qb).unwrap().retransmits > 0);
    let rkey = s.rkey(mw);
    assert_eq!(s.write(rkey, WINDOW, 8), WcStatus::Success);
}

/// A bind alone on an idle QP completes at once (nothing before it to wait for), and one
/// posted unsignaled completes silently.
#[test]
fn a_bind_alone_completes_at_once() {
    let mut s = setup();
    let mw = s.alloc(MwType::One);
    let bind = s.window(mw);
    let quiet = SendWr {
        wr_id: 1,
        op: SendOp::BindMw(bind),
        ..SendWr::default()
    };
    s.sim.post_send(B, s.qb, &quiet).unwrap();
    settle(&mut s.sim);
    assert!(s.sim.poll_send(B).is_empty());
    assert_eq!(s.sim.nodes[B].endpoint.mrs().mw_is_bound(mw), Some(true));
    let rebind = s.window(mw);
    assert_eq!(s.bind(rebind).status, WcStatus::Success);
}
