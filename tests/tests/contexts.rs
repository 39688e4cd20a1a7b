//! Two contexts of one device in one process (as rdma-core's Python tests open one per side):
//! both drive the one engine the first opened (AF_XDP, not a fallback beside it), with one
//! QP number space, so their QPs reach each other; the engine lives while either context
//! does, and the interface is free again once both are gone. A context in another network
//! namespace is another device. Needs root (CI is root).

use std::thread;
use std::time::Duration;

use roce_provider::netns::{self, needs_root, veth, Netns};
use roce_transport::wr::signaled;
use roce_verbs::{
    devices, AccessFlags, BackendKind, ConnectOptions, Context, Cq, Mr, OpenOptions, Pd, Qp,
    QpCaps, QpInitAttr, QpType, SendOp, WcStatus, XdpMode,
};

const STALL: Duration = Duration::from_secs(20);

fn rc_qp(pd: &Pd, cq: &Cq) -> Qp {
    let attr = QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        caps: QpCaps::default(),
        sq_sig_all: false,
    };
    pd.create_qp(&attr).unwrap()
}

/// WRITEs 4 KiB from `from`'s region into `to`'s through `qp`, and checks it landed.
fn write(qp: &Qp, cq: &Cq, from: &Mr, to: &Mr, seed: u8) {
    let data: Vec<u8> = (0..4096)
        .map(|i| (i as u8).wrapping_mul(7) ^ seed)
        .collect();
    from.write(0, &data).unwrap();
    let op = SendOp::RdmaWrite {
        remote_addr: to.addr(),
        rkey: to.rkey(),
    };
    qp.post_send([signaled(u64::from(seed), op, from.sge(0, 4096))])
        .unwrap();
    let done = cq.wait_for(1, STALL).unwrap();
    assert_eq!(
        (done[0].wr_id, done[0].status),
        (u64::from(seed), WcStatus::Success)
    );
    assert_eq!(to.to_vec().unwrap(), data);
}

#[test]
fn two_contexts_of_a_device_share_its_engine_and_reach_each_other() {
    if !needs_root("two_contexts_of_a_device_share_its_engine_and_reach_each_other") {
        return;
    }
    let a = Netns::create("roce-ctx-a").unwrap();
    let b = Netns::create("roce-ctx-b").unwrap();
    veth((&a, "ca", "10.86.0.1/24"), (&b, "cb", "10.86.0.2/24"), 1500).unwrap();
    let name = a.name.clone();
    let other = b.name.clone();
    let run = thread::spawn(move || {
        netns::enter(&name).unwrap();
        let device = devices().unwrap().remove(0);
        let first = Context::open(&device, OpenOptions::default()).unwrap();
        let second = Context::open(&device, OpenOptions::default()).unwrap();
        assert!(af_xdp(first.backend_kind()), "{:?}", first.backend_kind());
        assert_eq!(
            second.backend_kind(),
            first.backend_kind(),
            "the same engine, not a fallback"
        );

        let (pd1, pd2) = (first.alloc_pd().unwrap(), second.alloc_pd().unwrap());
        let (cq1, cq2) = (
            first.create_cq(8, None).unwrap(),
            second.create_cq(8, None).unwrap(),
        );
        let (qp1, qp2) = (rc_qp(&pd1, &cq1), rc_qp(&pd2, &cq2));
        assert_ne!(qp1.qp_num(), qp2.qp_num(), "one QP number space");
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let (mr1, mr2) = (
            pd1.reg_mr(4096, access).unwrap(),
            pd2.reg_mr(4096, access).unwrap(),
        );
        let options = ConnectOptions {
            mtu: device.query_port().active_mtu,
            sgid_index: 1,
            ..ConnectOptions::default()
        };
        qp1.connect(&qp2.endpoint(1).unwrap(), &options).unwrap();
        qp2.connect(&qp1.endpoint(1).unwrap(), &options).unwrap();
        write(&qp1, &cq1, &mr1, &mr2, 1);
        write(&qp2, &cq2, &mr2, &mr1, 2);

        // The first context goes; the engine stays for the second.
        drop((qp1, mr1, cq1, pd1, first));
        let qp3 = rc_qp(&pd2, &cq2);
        let mr3 = pd2.reg_mr(4096, access).unwrap();
        drop(qp2);
        let qp4 = rc_qp(&pd2, &cq2);
        qp3.connect(&qp4.endpoint(1).unwrap(), &options).unwrap();
        qp4.connect(&qp3.endpoint(1).unwrap(), &options).unwrap();
        write(&qp3, &cq2, &mr2, &mr3, 3);

        // All gone: the interface is free, and a new context takes AF_XDP again.
        drop((qp3, qp4, mr2, mr3, cq2, pd2, second));
        let again = Context::open(&device, OpenOptions::default()).unwrap();
        assert!(af_xdp(again.backend_kind()));

        // A context in another namespace is another device's, with an engine of its own.
        let here = thread::spawn(move || {
            netns::enter(&other).unwrap();
            let device = devices().unwrap().remove(0);
            let ctx = Context::open(&device, OpenOptions::default()).unwrap();
            ctx.backend_kind().clone()
        });
        assert!(af_xdp(&here.join().unwrap()));
    });
    run.join().expect("the contexts' thread");
}

/// Native AF_XDP, opened by this process itself or through the device's switch (which
/// lends it the device while it is the only process on it).
fn af_xdp(kind: &BackendKind) -> bool {
    matches!(
        kind,
        BackendKind::AfXdp(XdpMode::Native) | BackendKind::Switch(_)
    )
}
