//! `Endpoint::destroy_cq`: refused (EBUSY) while a QP uses the CQ, then done; a destroyed
//! CQ cannot be used again, and the other CQs keep working.

use roce_transport::cq::WcStatus;
use roce_transport::endpoint::{CreateQpError, DestroyCqError};
use roce_transport::errno::{EBUSY, EINVAL};
use roce_transport::qp::{QpCaps, QpInit};
use roce_transport::qp_state::{PathMtu, QpType};
use roce_transport::sim::{LinkConfig, RetryConfig, Sim};
use roce_transport::wr::SendOp;

mod common;
use common::*;

#[test]
fn a_cq_is_destroyed_only_once_no_qp_uses_it() {
    let mut sim = Sim::new(LinkConfig::default(), 9);
    assert_eq!((sim.add_node(), sim.add_node()), (A, B));
    let pd = sim.nodes[A].pd;
    let endpoint = &mut sim.nodes[A].endpoint;
    let send_cq = endpoint.create_cq(4).unwrap();
    let recv_cq = endpoint.create_cq(4).unwrap();
    let init = QpInit {
        pd,
        qp_type: QpType::Rc,
        caps: QpCaps::default(),
        sq_sig_all: false,
    };
    let qpn = endpoint.create_qp(init, send_cq, recv_cq).unwrap();
    for cq in [send_cq, recv_cq] {
        let error = endpoint.destroy_cq(cq).unwrap_err();
        assert_eq!(error, DestroyCqError::InUse);
        assert_eq!(error.errno(), EBUSY);
    }
    assert!(endpoint.destroy_qp(qpn));
    endpoint.destroy_cq(send_cq).unwrap();
    let error = endpoint.destroy_cq(send_cq).unwrap_err();
    assert_eq!(error, DestroyCqError::UnknownCq);
    assert_eq!(error.errno(), EINVAL);
    assert_eq!(
        endpoint.create_qp(init, send_cq, recv_cq),
        Err(CreateQpError::UnknownCq)
    );
    // The other CQ is still there and usable.
    let qpn = endpoint.create_qp(init, recv_cq, recv_cq).unwrap();
    assert!(endpoint.destroy_qp(qpn));
    endpoint.destroy_cq(recv_cq).unwrap();

    // The node's own CQs, created before the destroyed ones, still carry completions.
    let pair = sim.connect(A, B, QpType::Rc, PathMtu::Mtu1024, RetryConfig::default());
    let src = sim.reg(A, SRC, &pattern(100, 1));
    let dst = sim.reg(B, DST, &[0; 100]);
    let write = SendOp::RdmaWrite {
        remote_addr: DST,
        rkey: dst,
    };
    sim.post_send(A, pair.a.1, &signaled(1, write, sge(SRC, 100, src)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::Success)]
    );
    assert_eq!(sim.mr_bytes(B, dst), pattern(100, 1));
}
