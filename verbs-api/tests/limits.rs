//! The device's limits through the verbs API: `Device::query` reports the transport's
//! `LIMITS`, and creating a QP or CQ at a limit works while one past it is refused with
//! rdma-core's errno.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use roce_provider::memory::memory_pair;
use roce_transport::endpoint::CreateQpError;
use roce_transport::errno::EINVAL;
use roce_transport::LIMITS;
use roce_verbs::{
    Addressing, BackendChoice, Context, Device, Error, OpenOptions, Progress, QpCaps, QpInitAttr,
    QpType,
};

#[test]
fn queried_limits_are_the_enforced_ones() {
    let device = Device::in_memory([2, 0, 0, 0, 0, 1], Ipv4Addr::new(10, 0, 0, 1));
    let attr = device.query().limits;
    assert_eq!(
        (attr.max_qp, attr.max_qp_wr, attr.max_sge, attr.max_cqe),
        (
            LIMITS.max_qp,
            LIMITS.max_qp_wr,
            LIMITS.max_sge,
            LIMITS.max_cqe
        )
    );
    assert_eq!(attr.max_mr_size, LIMITS.max_mr_size);
    assert_eq!(attr.max_qp_rd_atom, LIMITS.max_qp_rd_atom);
    assert_eq!(attr.max_qp_init_rd_atom, LIMITS.max_qp_init_rd_atom);

    let (wire, _peer) = memory_pair();
    let addressing = Addressing {
        mac: device.mac,
        ip: Ipv4Addr::new(10, 0, 0, 1),
        neighbours: HashMap::new(),
    };
    let options = OpenOptions {
        backend: BackendChoice::Custom(Box::new(wire), addressing),
        progress: Progress::Caller,
        seed: Some([1; 32]),
        ..OpenOptions::default()
    };
    let ctx = Context::open(&device, options).unwrap();
    let max_cqe = attr.max_cqe as usize;
    let cq = ctx.create_cq(max_cqe, None).unwrap();
    assert!(matches!(
        ctx.create_cq(max_cqe + 1, None),
        Err(Error::InvalidArgument(_))
    ));
    let pd = ctx.alloc_pd().unwrap();
    let at_limits = QpCaps {
        max_send_wr: attr.max_qp_wr,
        max_recv_wr: attr.max_qp_wr,
        max_send_sge: attr.max_sge,
        max_recv_sge: attr.max_sge,
        max_inline_data: LIMITS.max_inline_data,
    };
    let init = |caps| QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: &cq,
        recv_cq: &cq,
        caps,
        sq_sig_all: false,
    };
    assert!(pd.create_qp(&init(at_limits)).is_ok());
    let past = QpCaps {
        max_recv_sge: attr.max_sge + 1,
        ..at_limits
    };
    match pd.create_qp(&init(past)) {
        Err(Error::CreateQp(error)) => {
            assert_eq!(error, CreateQpError::InvalidCap("max_recv_sge"));
            assert_eq!(error.errno(), EINVAL);
        }
        Err(other) => panic!("wrong error: {other}"),
        Ok(_) => panic!("a QP past max_sge was created"),
    }
}
