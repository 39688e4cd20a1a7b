//! Memory windows through the verbs API, over the in-memory wire with engine threads: a
//! type 1 window bound with `Qp::bind_mw` grants A its range of B's region (which grants
//! nothing itself) and nothing after a zero-length bind; a type 2 window bound by a posted
//! `SendOp::BindMw` is freed by A's SEND with invalidate; and the calls a program gets wrong
//! fail with rdma-core's errno.

use std::time::Duration;

use roce_provider::memory::memory_pair;
use roce_verbs::{
    inc_rkey, AccessFlags, ConnectOptions, MwBindInfo, MwType, PathMtu, QpCaps, QpInitAttr, QpType,
    RecvWr, SendFlags, SendOp, SendWr, WcOpcode, WcStatus,
};

const STALL: Duration = Duration::from_secs(20);
const EINVAL: i32 = 22;

mod common;
use common::context;

#[test]
fn windows_bind_grant_and_invalidate_through_the_verbs_api() {
    let (wire_a, wire_b) = memory_pair();
    let (ctx_a, ctx_b) = (context(wire_a, 1, 2), context(wire_b, 2, 1));
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (
        ctx_a.create_cq(64, None).unwrap(),
        ctx_b.create_cq(64, None).unwrap(),
    );
    let init = |cq| QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        caps: QpCaps::default(),
        sq_sig_all: false,
    };
    let (qp_a, qp_b) = (
        pd_a.create_qp(&init(&cq_a)).unwrap(),
        pd_b.create_qp(&init(&cq_b)).unwrap(),
    );
    let options = ConnectOptions {
        mtu: PathMtu::Mtu1024,
        ..ConnectOptions::default()
    };
    qp_a.connect(&qp_b.endpoint(1).unwrap(), &options).unwrap();
    qp_b.connect(&qp_a.endpoint(1).unwrap(), &options).unwrap();

    let data: Vec<u8> = (0..256u32).map(|i| (i * 13) as u8).collect();
    let src = pd_a.reg_mr(data.len(), AccessFlags::all()).unwrap();
    src.write(0, &data).unwrap();
    let bindable = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
    let target = pd_b.reg_mr(4096, bindable).unwrap();
    let write = |wr_id, rkey, at: u64| SendWr {
        wr_id,
        op: SendOp::RdmaWrite {
            remote_addr: target.addr() + at,
            rkey,
        },
        sg_list: [src.sge(0, 64)].into(),
        flags: SendFlags::SIGNALED,
        ..SendWr::default()
    };

    // Type 1: bound with ibv_bind_mw's call, to 256 bytes from offset 1024.
    let one = pd_b.alloc_mw(MwType::One).unwrap();
    let first = one.rkey();
    let info = MwBindInfo {
        mr: Some(&target),
        addr: target.addr() + 1024,
        len: 256,
        access: AccessFlags::REMOTE_WRITE,
    };
    let rkey = qp_b.bind_mw(&one, &info, 70, SendFlags::SIGNALED).unwrap();
    assert_eq!((rkey, one.rkey()), (inc_rkey(first), inc_rkey(first)));
    let bound = cq_b.wait_for(1, STALL).unwrap();
    assert_eq!(
        (bound[0].wr_id, bound[0].opcode, bound[0].status),
        (70, WcOpcode::BindMw, WcStatus::Success)
    );
    assert_eq!(one.current_rkey().unwrap(), rkey);
    assert_eq!(target.windows_bound().unwrap(), 1);
    qp_a.post_send([write(1, rkey, 1024 + 16)]).unwrap();
    assert_eq!(
        cq_a.wait_for(1, STALL).unwrap()[0].status,
        WcStatus::Success
    );
    let mut landed = vec![0; 64];
    target.read(1024 + 16, &mut landed).unwrap();
    assert_eq!(landed, data[..64]);

    // Unbound by a bind to nothing: its key grants nothing (and the pair is broken).
    let none = MwBindInfo {
        mr: None,
        addr: 0,
        len: 0,
        access: AccessFlags::empty(),
    };
    let unbound = qp_b.bind_mw(&one, &none, 71, SendFlags::SIGNALED).unwrap();
    assert_eq!(
        cq_b.wait_for(1, STALL).unwrap()[0].status,
        WcStatus::Success
    );
    assert!(!one.is_bound().unwrap());
    assert_eq!(target.windows_bound().unwrap(), 0);

    // Type 2: bound by a posted work request, freed by A's SEND with invalidate.
    let two = pd_b.alloc_mw(MwType::Two).unwrap();
    let error = qp_b
        .bind_mw(&two, &info, 0, SendFlags::SIGNALED)
        .unwrap_err();
    assert_eq!(error.errno(), EINVAL, "ibv_bind_mw on a type 2 window");
    let key2 = inc_rkey(two.rkey());
    let bind = SendWr {
        wr_id: 72,
        op: SendOp::BindMw(two.bind_to(
            &target,
            target.addr(),
            512,
            AccessFlags::REMOTE_WRITE,
            key2,
        )),
        flags: SendFlags::SIGNALED,
        ..SendWr::default()
    };
    qp_b.post_send([bind]).unwrap();
    assert_eq!(
        cq_b.wait_for(1, STALL).unwrap()[0].status,
        WcStatus::Success
    );
    assert_eq!(two.current_rkey().unwrap(), key2);
    let inbox = pd_b.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    qp_b.post_recv([RecvWr {
        wr_id: 80,
        sg_list: [inbox.sge(0, 64)].into(),
    }])
    .unwrap();
    let send = SendWr {
        wr_id: 2,
        op: SendOp::SendWithInv(key2),
        sg_list: [src.sge(0, 8)].into(),
        flags: SendFlags::SIGNALED,
        ..SendWr::default()
    };
    qp_a.post_send([send]).unwrap();
    assert_eq!(
        cq_a.wait_for(1, STALL).unwrap()[0].status,
        WcStatus::Success
    );
    let received = cq_b.wait_for(1, STALL).unwrap();
    assert_eq!(
        (received[0].status, received[0].invalidated_rkey),
        (WcStatus::Success, Some(key2))
    );
    assert!(!two.is_bound().unwrap());
    qp_a.post_send([write(3, unbound, 1024)]).unwrap();
    assert_eq!(
        cq_a.wait_for(1, STALL).unwrap()[0].status,
        WcStatus::RemoteAccess
    );
    two.dealloc().unwrap();
    drop(one);
    assert!(target.dereg().is_ok());
}
