//! The device limits ([`LIMITS`], what `ibv_query_device` reports) enforced where rdma-core's
//! providers enforce them, each walked at its boundary and one past it, with the errno the
//! verbs layer returns: create_qp (rxe_qp_chk_cap), create_cq (rxe_cq_chk_attr), modify_qp
//! (rxe_qp_chk_attr) and posting (rxe's post path: full queue ENOMEM, the rest EINVAL).

use roce_transport::endpoint::{CreateCqError, CreateQpError};
use roce_transport::errno::{EINVAL, ENOMEM};
use roce_transport::qp::{PostError, QpCaps, QpInit};
use roce_transport::qp_state::{
    connect_attrs, ModifyQpError, PathMtu, Peer, QpAttr, QpState, QpType,
};
use roce_transport::sim::{LinkConfig, RetryConfig, Sim};
use roce_transport::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};
use roce_transport::LIMITS;
use roce_wire::Psn;

mod common;
use common::*;

fn caps_at_limits() -> QpCaps {
    QpCaps {
        max_send_wr: LIMITS.max_qp_wr,
        max_recv_wr: LIMITS.max_qp_wr,
        max_send_sge: LIMITS.max_sge,
        max_recv_sge: LIMITS.max_sge,
        max_inline_data: LIMITS.max_inline_data,
    }
}

fn sim() -> Sim {
    let mut sim = Sim::new(LinkConfig::default(), 3);
    assert_eq!((sim.add_node(), sim.add_node()), (A, B));
    sim
}

fn create(sim: &mut Sim, caps: QpCaps) -> Result<u32, CreateQpError> {
    let node = &mut sim.nodes[A];
    let init = QpInit {
        pd: node.pd,
        qp_type: QpType::Rc,
        caps,
        sq_sig_all: false,
    };
    node.endpoint.create_qp(init, node.send_cq, node.recv_cq)
}

#[test]
fn create_qp_caps_at_the_limit_and_one_past() {
    let mut sim = sim();
    assert!(create(&mut sim, caps_at_limits()).is_ok());
    type Bump = (&'static str, fn(&mut QpCaps));
    let bumps: [Bump; 5] = [
        ("max_send_wr", |c| c.max_send_wr += 1),
        ("max_recv_wr", |c| c.max_recv_wr += 1),
        ("max_send_sge", |c| c.max_send_sge += 1),
        ("max_recv_sge", |c| c.max_recv_sge += 1),
        ("max_inline_data", |c| c.max_inline_data += 1),
    ];
    for (name, bump) in bumps {
        let mut caps = caps_at_limits();
        bump(&mut caps);
        let error = create(&mut sim, caps).unwrap_err();
        assert_eq!(error, CreateQpError::InvalidCap(name));
        assert_eq!(error.errno(), EINVAL);
    }
    let huge = QpCaps {
        max_send_wr: u32::MAX,
        ..caps_at_limits()
    };
    assert!(create(&mut sim, huge).is_err());
}

#[test]
fn cq_depth_at_the_limits_and_past() {
    let mut sim = sim();
    let endpoint = &mut sim.nodes[A].endpoint;
    let max = LIMITS.max_cqe as usize;
    for depth in [1, max] {
        assert!(endpoint.create_cq(depth).is_ok(), "{depth}");
    }
    for depth in [0, max + 1, usize::MAX] {
        let error = endpoint.create_cq(depth).unwrap_err();
        assert_eq!(error, CreateCqError::InvalidDepth(depth));
        assert_eq!(error.errno(), EINVAL);
    }
}

/// Each checked attribute one past its limit is refused with nothing changed; each
/// transition then succeeds with all of them at their limits.
#[test]
fn modify_qp_values_at_the_limit_and_one_past() {
    let mut sim = sim();
    let qpn = create(&mut sim, QpCaps::default()).unwrap();
    let peer = Peer {
        av: sim.av_of(B),
        qpn: 0x11,
        psn: Psn::new(1),
    };
    let [init, rtr, rts] = connect_attrs(
        QpType::Rc,
        peer,
        Psn::new(2),
        PathMtu::Mtu1024,
        RetryConfig::default(),
    );
    let init = QpAttr {
        pkey_index: Some(LIMITS.max_pkeys - 1),
        port_num: Some(1),
        ..init
    };
    let rtr = QpAttr {
        max_dest_rd_atomic: Some(LIMITS.max_qp_rd_atom),
        ..rtr
    };
    let rts = QpAttr {
        max_rd_atomic: Some(LIMITS.max_qp_init_rd_atom),
        timeout: Some(31),
        retry_cnt: Some(7),
        rnr_retry: Some(7),
        ..rts
    };
    let steps = [
        (
            init,
            QpState::Reset,
            vec![
                (
                    "pkey_index",
                    QpAttr {
                        pkey_index: Some(LIMITS.max_pkeys),
                        ..init
                    },
                ),
                (
                    "port_num",
                    QpAttr {
                        port_num: Some(2),
                        ..init
                    },
                ),
            ],
        ),
        (
            rtr,
            QpState::Init,
            vec![(
                "max_dest_rd_atomic",
                QpAttr {
                    max_dest_rd_atomic: Some(LIMITS.max_qp_rd_atom + 1),
                    ..rtr
                },
            )],
        ),
        (
            rts,
            QpState::Rtr,
            vec![
                (
                    "max_rd_atomic",
                    QpAttr {
                        max_rd_atomic: Some(LIMITS.max_qp_init_rd_atom + 1),
                        ..rts
                    },
                ),
                (
                    "timeout",
                    QpAttr {
                        timeout: Some(32),
                        ..rts
                    },
                ),
                (
                    "retry_cnt",
                    QpAttr {
                        retry_cnt: Some(8),
                        ..rts
                    },
                ),
                (
                    "rnr_retry",
                    QpAttr {
                        rnr_retry: Some(8),
                        ..rts
                    },
                ),
            ],
        ),
    ];
    let now = sim.now;
    let endpoint = &mut sim.nodes[A].endpoint;
    for (at_limits, before, past) in steps {
        for (name, attr) in &past {
            let error = endpoint.modify_qp(now, qpn, attr).unwrap_err();
            assert_eq!(error, ModifyQpError::OutOfRange(name));
            assert_eq!(error.errno(), EINVAL);
            assert_eq!(endpoint.qp_state(qpn), Some(before), "{name}");
        }
        endpoint.modify_qp(now, qpn, &at_limits).unwrap();
    }
    assert_eq!(endpoint.qp_state(qpn), Some(QpState::Rts));
}

fn sges(n: u32) -> roce_transport::wr::SgList {
    (0..n)
        .map(|i| Sge {
            addr: u64::from(i),
            length: 1,
            lkey: 1,
        })
        .collect()
}

fn send(wr_id: u64) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send,
        sg_list: Default::default(),
        inline_data: Vec::new(),
        flags: SendFlags::empty(),
        ud: None,
        xrc_srqn: 0,
    }
}

/// A QP created with every cap at the device's limit, in RTS: SGEs and inline data at the
/// limit are accepted and one more is EINVAL; the queues take `max_qp_wr` requests and the
/// next is ENOMEM.
#[test]
fn posts_at_the_limits_and_one_past() {
    let mut sim = sim();
    let qpn = create(&mut sim, caps_at_limits()).unwrap();
    let peer = Peer {
        av: sim.av_of(B),
        qpn: 0x11,
        psn: Psn::new(1),
    };
    let attrs = connect_attrs(
        QpType::Rc,
        peer,
        Psn::new(2),
        PathMtu::Mtu1024,
        RetryConfig::default(),
    );
    for attr in &attrs {
        sim.nodes[A].endpoint.modify_qp(sim.now, qpn, attr).unwrap();
    }
    let fails = |result: Result<(), PostError>, expected: PostError, errno: i32| {
        let error = result.unwrap_err();
        assert_eq!(error, expected);
        assert_eq!(error.errno(), errno);
    };

    let recv = |n| RecvWr {
        wr_id: 0,
        sg_list: sges(n),
    };
    sim.post_recv(A, qpn, &recv(LIMITS.max_sge)).unwrap();
    fails(
        sim.post_recv(A, qpn, &recv(LIMITS.max_sge + 1)),
        PostError::TooManySge,
        EINVAL,
    );
    let with_sges = |n| SendWr {
        sg_list: sges(n),
        ..send(0)
    };
    sim.post_send(A, qpn, &with_sges(LIMITS.max_sge)).unwrap();
    fails(
        sim.post_send(A, qpn, &with_sges(LIMITS.max_sge + 1)),
        PostError::TooManySge,
        EINVAL,
    );
    let inline = |len| SendWr {
        inline_data: vec![7; len],
        flags: SendFlags::INLINE,
        ..send(0)
    };
    sim.post_send(A, qpn, &inline(LIMITS.max_inline_data as usize))
        .unwrap();
    fails(
        sim.post_send(A, qpn, &inline(LIMITS.max_inline_data as usize + 1)),
        PostError::InlineTooLong,
        EINVAL,
    );

    // Two sends and one receive are queued: fill both queues to max_qp_wr.
    for wr_id in 2..u64::from(LIMITS.max_qp_wr) {
        sim.post_send(A, qpn, &send(wr_id)).unwrap();
    }
    for wr_id in 1..u64::from(LIMITS.max_qp_wr) {
        sim.post_recv(A, qpn, &recv(1))
            .map_err(|e| (wr_id, e))
            .unwrap();
    }
    fails(
        sim.post_send(A, qpn, &send(0)),
        PostError::QueueFull,
        ENOMEM,
    );
    fails(
        sim.post_recv(A, qpn, &recv(1)),
        PostError::QueueFull,
        ENOMEM,
    );
    let gate = sim.nodes[A].endpoint.post_gate(qpn).unwrap();
    assert_eq!(gate.sq_len, LIMITS.max_qp_wr as usize);
    assert_eq!(gate.rq_len, LIMITS.max_qp_wr as usize);
}
