//! Shared receive queues through the verbs API, over the in-memory wire with engine
//! threads: two RC QPs on one SRQ receive SENDs into its WQEs, the armed limit arrives as an
//! async event naming the SRQ, and the calls a program gets wrong fail with rdma-core's
//! errno (post_recv on an SRQ QP, a full SRQ, destroying an SRQ a QP uses).

use std::collections::HashMap;
use std::time::Duration;

use roce_provider::memory::memory_pair;
use roce_verbs::{
    AccessFlags, AsyncEvent, ConnectOptions, Error, PathMtu, QpCaps, QpInitAttr, QpType, RecvWr,
    SendFlags, SendOp, SendWr, SrqAttr, SrqModify, WcStatus,
};

const STALL: Duration = Duration::from_secs(20);
const SLOT: usize = 2048;
const EINVAL: i32 = 22;
const ENOMEM: i32 = 12;
const EBUSY: i32 = 16;

mod common;
use common::context;

#[test]
fn two_rc_qps_share_an_srq_and_its_limit_event() {
    let (wire_a, wire_b) = memory_pair();
    let (ctx_a, ctx_b) = (context(wire_a, 1, 2), context(wire_b, 2, 1));
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (
        ctx_a.create_cq(64, None).unwrap(),
        ctx_b.create_cq(64, None).unwrap(),
    );
    let max = ctx_b.device().query().limits;
    assert!(max.max_srq > 0 && max.max_srq_wr >= 8 && max.max_srq_sge >= 1);
    let srq = pd_b
        .create_srq(SrqAttr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let init = |cq| QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        caps: QpCaps::default(),
        sq_sig_all: false,
    };
    let options = ConnectOptions {
        mtu: PathMtu::Mtu1024,
        ..ConnectOptions::default()
    };
    let mut pairs = Vec::new();
    for _ in 0..2 {
        let qp_a = pd_a.create_qp(&init(&cq_a)).unwrap();
        let qp_b = pd_b.create_qp_with_srq(&init(&cq_b), &srq).unwrap();
        qp_a.connect(&qp_b.endpoint(1).unwrap(), &options).unwrap();
        qp_b.connect(&qp_a.endpoint(1).unwrap(), &options).unwrap();
        pairs.push((qp_a, qp_b));
    }
    let inbox = pd_b.reg_mr(8 * SLOT, AccessFlags::all()).unwrap();
    let recv = |wr_id: u64| RecvWr {
        wr_id,
        sg_list: [inbox.sge(wr_id as usize * SLOT, SLOT as u32)].into(),
    };
    srq.post_recv((0..6).map(recv)).unwrap();
    let error = pairs[0].1.post_recv([recv(7)]).unwrap_err();
    assert_eq!(error.error.errno(), EINVAL, "post_recv on a QP on an SRQ");
    let arm = SrqModify {
        srq_limit: Some(3),
        ..SrqModify::default()
    };
    srq.modify(&arm).unwrap();
    assert_eq!(srq.query().unwrap().srq_limit, 3);

    let data: Vec<u8> = (0..1500u32).map(|i| (i * 7) as u8).collect();
    let src = pd_a.reg_mr(data.len(), AccessFlags::all()).unwrap();
    src.write(0, &data).unwrap();
    for (n, (qp_a, _)) in pairs.iter().chain(&pairs).enumerate() {
        let send = SendWr {
            wr_id: n as u64,
            op: SendOp::Send,
            sg_list: [src.sge(0, data.len() as u32)].into(),
            inline_data: Vec::new(),
            flags: SendFlags::SIGNALED,
            ud: None,
            xrc_srqn: 0,
        };
        qp_a.post_send([send]).unwrap();
    }
    let sends = cq_a.wait_for(4, STALL).unwrap();
    assert!(
        sends.iter().all(|wc| wc.status == WcStatus::Success),
        "{sends:?}"
    );
    let recvs = cq_b.wait_for(4, STALL).unwrap();
    let mut per_qp = HashMap::<u32, usize>::new();
    for wc in &recvs {
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 1500));
        *per_qp.entry(wc.qp_num).or_default() += 1;
        let at = wc.wr_id as usize * SLOT;
        let mut got = vec![0; data.len()];
        inbox.read(at, &mut got).unwrap();
        assert_eq!(got, data, "WQE {}", wc.wr_id);
    }
    assert_eq!(per_qp.len(), 2);
    assert!(per_qp.values().all(|&n| n == 2));
    // Four taken from six: two left, below the limit of 3.
    let event = ctx_b.get_async_event(Some(STALL)).unwrap();
    assert_eq!(event, AsyncEvent::SrqLimitReached { srq: srq.id() });
    assert_eq!(srq.query().unwrap().srq_limit, 0, "disarmed");
    assert_eq!(ctx_b.try_get_async_event().unwrap(), None);

    // Two left of eight: six more fit, the seventh does not.
    let error = srq.post_recv((0..7).map(recv)).unwrap_err();
    assert_eq!((error.index, error.error.errno()), (6, ENOMEM));

    let (srq, error) = srq.destroy().expect_err("QPs use it");
    assert!(matches!(error, Error::Busy(_)));
    assert_eq!(error.errno(), EBUSY);
    drop(pairs);
    assert!(srq.destroy().is_ok());
}

/// Two RC QPs, each on an SRQ of its own, send 64 KiB messages (64 packets at MTU 1024) to
/// each other at once: while a message arrives, the SRQ's receive it lands in sits in its
/// QP's receive queue, and the engine publishing what the QP retired (it has sends
/// outstanding) counts it as none of the QP's own (it underflowed: the engine thread
/// panicked, as under UCX's rc_verbs).
#[test]
fn qps_on_srqs_send_multi_packet_messages_both_ways() {
    const SIZE: usize = 64 * 1024;
    const ROUNDS: u64 = 16;
    let (wire_a, wire_b) = memory_pair();
    let sides: Vec<_> = [(wire_a, 1, 2), (wire_b, 2, 1)]
        .into_iter()
        .map(|(wire, me, peer)| {
            let ctx = context(wire, me, peer);
            let pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(4 * ROUNDS as usize, None).unwrap();
            let srq = pd
                .create_srq(SrqAttr {
                    max_wr: ROUNDS as u32,
                    max_sge: 1,
                    srq_limit: 0,
                })
                .unwrap();
            let init = QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                caps: QpCaps::default(),
                sq_sig_all: false,
            };
            let qp = pd.create_qp_with_srq(&init, &srq).unwrap();
            let mr = pd.reg_mr(2 * SIZE, AccessFlags::all()).unwrap();
            (ctx, pd, cq, srq, qp, mr)
        })
        .collect();
    let options = ConnectOptions {
        mtu: PathMtu::Mtu1024,
        ..ConnectOptions::default()
    };
    let (a, b) = (&sides[0], &sides[1]);
    a.4.connect(&b.4.endpoint(1).unwrap(), &options).unwrap();
    b.4.connect(&a.4.endpoint(1).unwrap(), &options).unwrap();
    for (n, (_, _, _, srq, _, mr)) in sides.iter().enumerate() {
        let data: Vec<u8> = (0..SIZE).map(|i| (i * 7 + n) as u8).collect();
        mr.write(0, &data).unwrap();
        let recv = |wr_id| RecvWr {
            wr_id,
            sg_list: [mr.sge(SIZE, SIZE as u32)].into(),
        };
        srq.post_recv((0..ROUNDS).map(recv)).unwrap();
    }
    for (_, _, _, _, qp, mr) in &sides {
        let sends = (0..ROUNDS).map(|wr_id| SendWr {
            wr_id,
            op: SendOp::Send,
            sg_list: [mr.sge(0, SIZE as u32)].into(),
            inline_data: Vec::new(),
            flags: SendFlags::SIGNALED,
            ud: None,
            xrc_srqn: 0,
        });
        qp.post_send(sends).unwrap();
    }
    for (n, (_, _, cq, _, _, mr)) in sides.iter().enumerate() {
        let done = cq.wait_for(2 * ROUNDS as usize, STALL).unwrap();
        assert!(
            done.iter().all(
                |wc| wc.status == WcStatus::Success && matches!(wc.byte_len as usize, 0 | SIZE)
            ),
            "{done:?}"
        );
        let mut got = vec![0; SIZE];
        mr.read(SIZE, &mut got).unwrap();
        let sent: Vec<u8> = (0..SIZE).map(|i| (i * 7 + (1 - n)) as u8).collect();
        assert!(got == sent, "side {n} received other bytes");
    }
}
