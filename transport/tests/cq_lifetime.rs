//! `Endpoint::destroy_cq`: refused while a QP completes into the CQ (rdma-core's `EBUSY`),
//! and then frees the CQ's slots.

use roce_transport::qp::{QpCaps, QpInit};
use roce_transport::qp_state::QpType;
use roce_transport::Endpoint;

#[test]
fn a_cq_is_destroyed_only_once_no_qp_uses_it() {
    let mut endpoint = Endpoint::new([7; 32]);
    let pd = endpoint.mrs().alloc_pd();
    let (send_cq, recv_cq) = (endpoint.create_cq(64), endpoint.create_cq(64));
    let init = QpInit {
        pd,
        qp_type: QpType::Rc,
        caps: QpCaps::default(),
        sq_sig_all: false,
    };
    let qpn = endpoint.create_qp(init, send_cq, recv_cq).unwrap();
    assert!(!endpoint.destroy_cq(send_cq), "the QP's send CQ");
    assert!(!endpoint.destroy_cq(recv_cq), "the QP's receive CQ");
    assert_eq!(endpoint.cq(send_cq).depth(), 64);
    assert!(endpoint.destroy_qp(qpn));
    assert!(endpoint.destroy_cq(send_cq));
    assert!(endpoint.destroy_cq(recv_cq));
    assert_eq!(endpoint.cq(send_cq).depth(), 0, "its slots are gone");
}
