//! XRC through the verbs API, over the in-memory wire with engine threads: A's XRC
//! initiator sends into B's XRC domain, each message landing in the XRC SRQ it names and
//! completing in that SRQ's CQ; the calls a program gets wrong fail with rdma-core's errno.

use std::time::Duration;

use roce_provider::memory::memory_pair;
use roce_verbs::{
    AccessFlags, ConnectOptions, Error, PathMtu, QpCaps, QpInitAttr, QpType, RecvWr, SendFlags,
    SendOp, SendWr, SrqAttr, WcStatus,
};

const STALL: Duration = Duration::from_secs(20);
const EINVAL: i32 = 22;
const EBUSY: i32 = 16;

mod common;
use common::context;

#[test]
fn xrc_sends_land_in_the_srq_they_name() {
    let (wire_a, wire_b) = memory_pair();
    let (ctx_a, ctx_b) = (context(wire_a, 1, 2), context(wire_b, 2, 1));
    let pd_a = ctx_a.alloc_pd().unwrap();
    let cq_a = ctx_a.create_cq(16, None).unwrap();
    let ini = pd_a
        .create_qp(&QpInitAttr {
            qp_type: QpType::XrcSend,
            send_cq: &cq_a,
            recv_cq: &cq_a,
            caps: QpCaps::default(),
            sq_sig_all: false,
        })
        .unwrap();
    let xrcd = ctx_b.open_xrcd().unwrap();
    let tgt = xrcd.create_recv_qp().unwrap();
    let attr = SrqAttr {
        max_wr: 8,
        max_sge: 1,
        srq_limit: 0,
    };
    let (pd_b, cq_0, cq_1) = (
        ctx_b.alloc_pd().unwrap(),
        ctx_b.create_cq(16, None).unwrap(),
        ctx_b.create_cq(16, None).unwrap(),
    );
    let srqs = [
        pd_b.create_xrc_srq(attr, &xrcd, &cq_0).unwrap(),
        pd_b.create_xrc_srq(attr, &xrcd, &cq_1).unwrap(),
    ];
    let numbers = srqs.each_ref().map(|srq| srq.number().unwrap());
    assert_ne!(numbers[0], numbers[1]);
    let options = ConnectOptions {
        mtu: PathMtu::Mtu1024,
        ..ConnectOptions::default()
    };
    ini.connect(&tgt.endpoint(1).unwrap(), &options).unwrap();
    tgt.connect(&ini.endpoint(1).unwrap(), &options).unwrap();

    let inbox = pd_b.reg_mr(8192, AccessFlags::LOCAL_WRITE).unwrap();
    for (n, srq) in srqs.iter().enumerate() {
        let recv = RecvWr {
            wr_id: 100 + n as u64,
            sg_list: [inbox.sge(n * 4096, 4096)].into(),
        };
        srq.post_recv([recv]).unwrap();
    }
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    let src = pd_a.reg_mr(data.len(), AccessFlags::all()).unwrap();
    src.write(0, &data).unwrap();
    for (n, &srqn) in numbers.iter().enumerate().rev() {
        let send = SendWr {
            wr_id: n as u64,
            op: SendOp::Send,
            sg_list: [src.sge(0, 1000 * (n as u32 + 2))].into(),
            flags: SendFlags::SIGNALED,
            xrc_srqn: srqn,
            ..SendWr::default()
        };
        ini.post_send([send]).unwrap();
    }
    let sent = cq_a.wait_for(2, STALL).unwrap();
    assert!(
        sent.iter().all(|wc| wc.status == WcStatus::Success),
        "{sent:?}"
    );
    for (n, cq) in [&cq_0, &cq_1].into_iter().enumerate() {
        let got = cq.wait_for(1, STALL).unwrap();
        let len = 1000 * (n as u32 + 2);
        assert_eq!(
            (got[0].wr_id, got[0].status, got[0].byte_len, got[0].qp_num),
            (100 + n as u64, WcStatus::Success, len, tgt.qp_num())
        );
        let mut landed = vec![0; len as usize];
        inbox.read(n * 4096, &mut landed).unwrap();
        assert_eq!(landed, data[..len as usize]);
    }

    let recv = RecvWr {
        wr_id: 1,
        sg_list: [inbox.sge(0, 8)].into(),
    };
    let error = tgt.post_recv([recv]).unwrap_err();
    assert_eq!(error.error.errno(), EINVAL, "post_recv on an XRC target");
    let (xrcd, error) = xrcd.close().expect_err("an SRQ and a QP hold it");
    assert!(matches!(error, Error::Busy(_)));
    assert_eq!(error.errno(), EBUSY);
    drop((tgt, srqs));
    assert!(xrcd.close().is_ok());
}
