//! The CM behind each endpoint's QP 1 on the simulated network: MADs travel as UD SEND_ONLY
//! packets from QP 1 to QP 1, the CM's timers are the endpoint's, and the QP attributes it
//! hands out connect two RC QPs that then carry data and are torn down from either side.

mod common;

use std::time::{Duration, Instant};

use common::{pattern, recv_wr, sge, signaled, wait_recv, wait_send, A, B, STEPS};
use roce_transport::cm::{
    AcceptParams, Cm, CmConfig, CmEvent, ConnId, ConnState, ConnectParams, Gid, QpAttrs,
};
use roce_transport::cq::WcStatus;
use roce_transport::qp::QpCaps;
use roce_transport::qp_state::{PathMtu, QpAttr, QpState, QpType};
use roce_transport::sim::{LinkConfig, Sim};
use roce_transport::wr::SendOp;
use roce_wire::cm::rej::RejectReason;
use roce_wire::cm::req::ServiceType;
use roce_wire::cm::{PortSpace, ServiceId};
use roce_wire::{mad, Opcode};

const SERVICE: ServiceId = ServiceId::rdma_ip(PortSpace::Tcp, 7174);
const OTHER_SERVICE: ServiceId = ServiceId::rdma_ip(PortSpace::Tcp, 7175);

fn config(node: usize) -> CmConfig {
    CmConfig {
        local_ca_guid: 0x0200_00ff_fe00_0001 + node as u64,
        seed: [node as u8 + 1; 32],
        ..CmConfig::default()
    }
}

fn gid_of(sim: &Sim, node: usize) -> Gid {
    sim.nodes[node].ip.to_ipv6_mapped().octets()
}

fn cm(sim: &mut Sim, node: usize) -> &mut Cm {
    sim.nodes[node].endpoint.cm().expect("the CM is enabled")
}

/// Two nodes with a CM each (B's only if `b_has_cm`) and an RC QP each, in RESET.
fn setup(b_has_cm: bool) -> (Sim, [u32; 2]) {
    let mut sim = Sim::new(LinkConfig::default(), 7);
    for node in [A, B] {
        sim.add_node();
        if node == A || b_has_cm {
            sim.nodes[node].endpoint.enable_cm(config(node));
        }
    }
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        ..QpCaps::default()
    };
    let qpns = [A, B].map(|node| sim.create_qp(node, QpType::Rc, caps));
    (sim, qpns)
}

fn connect_params(sim: &Sim, service_id: ServiceId, qpn: u32) -> ConnectParams {
    ConnectParams {
        service_id,
        local_gid: gid_of(sim, A),
        sgid_index: 0,
        remote_gid: gid_of(sim, B),
        qpn,
        service_type: ServiceType::Rc,
        path_mtu: PathMtu::Mtu1024,
        responder_resources: 4,
        initiator_depth: 4,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: false,
        flow_control: true,
        traffic_class: 0,
        hop_limit: 64,
        flow_label: 0,
    }
}

fn apply(sim: &mut Sim, node: usize, qpn: u32, attrs: &QpAttrs) {
    let now = sim.now;
    for attr in [attrs.init, attrs.rtr, attrs.rts] {
        sim.nodes[node]
            .endpoint
            .modify_qp(now, qpn, &attr)
            .expect("the CM's attributes fit the QP");
    }
}

fn to_error(sim: &mut Sim, node: usize, qpn: u32) {
    let now = sim.now;
    let attr = QpAttr {
        state: Some(QpState::Err),
        ..QpAttr::default()
    };
    sim.nodes[node]
        .endpoint
        .modify_qp(now, qpn, &attr)
        .expect("any state may go to ERR");
}

/// Runs the network, answering the CMs' events as rdma_cm would (A establishes on the REP,
/// B accepts every request, either side moves its QP to ERR when disconnected), until
/// `done` holds for the events seen so far. Returns every event, by node.
fn run(
    sim: &mut Sim,
    qpns: [u32; 2],
    mut done: impl FnMut(&[Vec<CmEvent>; 2]) -> bool,
) -> [Vec<CmEvent>; 2] {
    let mut seen: [Vec<CmEvent>; 2] = Default::default();
    let finished = sim.run_until(STEPS, |sim| {
        for node in [A, B] {
            while let Some(event) = sim.nodes[node].endpoint.cm().and_then(Cm::poll_event) {
                answer(sim, node, qpns[node], &event);
                seen[node].push(event);
            }
        }
        done(&seen)
    });
    assert!(finished, "the CMs did not get there: {seen:?}");
    seen
}

fn answer(sim: &mut Sim, node: usize, qpn: u32, event: &CmEvent) {
    let now = sim.now;
    match *event {
        CmEvent::ConnectRequest { conn, .. } => {
            let params = AcceptParams {
                qpn,
                sgid_index: 0,
                responder_resources: 4,
                initiator_depth: 4,
                rnr_retry_count: 7,
                srq: false,
                flow_control: true,
            };
            let attrs = cm(sim, node).accept(now, conn, &params, b"ok").unwrap();
            apply(sim, node, qpn, &attrs);
        }
        CmEvent::ConnectResponse { conn, qp, .. } => {
            apply(sim, node, qpn, &qp);
            cm(sim, node).establish(conn).unwrap();
        }
        CmEvent::Disconnected { .. } => to_error(sim, node, qpn),
        _ => {}
    }
}

fn established(events: &[CmEvent]) -> Option<ConnId> {
    events.iter().find_map(|event| match event {
        CmEvent::Established { conn } => Some(*conn),
        _ => None,
    })
}

fn disconnected(events: &[CmEvent]) -> bool {
    events
        .iter()
        .any(|event| matches!(event, CmEvent::Disconnected { .. }))
}

/// Connects A's QP to B's through the CMs; returns each side's connection.
fn connect(sim: &mut Sim, qpns: [u32; 2]) -> [ConnId; 2] {
    cm(sim, B).listen(SERVICE, 8).unwrap();
    let params = connect_params(sim, SERVICE, qpns[A]);
    let now = sim.now;
    let active = cm(sim, A).connect(now, &params, b"hello").unwrap();
    let seen = run(sim, qpns, |seen| {
        established(&seen[A]).is_some() && established(&seen[B]).is_some()
    });
    assert_eq!(established(&seen[A]), Some(active));
    let passive = established(&seen[B]).unwrap();
    [active, passive]
}

/// A SEND of 3000 bytes (three packets at MTU 1024) from `from` to the other side.
fn send_data(sim: &mut Sim, qpns: [u32; 2], from: usize, seed: u8) {
    let to = 1 - from;
    let data = pattern(3000, seed);
    let src_key = sim.reg(from, 0x1_0000 * (seed as u64 + 1), &data);
    let dst_key = sim.reg(to, 0x100_0000 * (seed as u64 + 1), &[0; 3000]);
    let dst = sge(0x100_0000 * (seed as u64 + 1), 3000, dst_key);
    sim.post_recv(to, qpns[to], &recv_wr(9, dst)).unwrap();
    let src = sge(0x1_0000 * (seed as u64 + 1), 3000, src_key);
    sim.post_send(from, qpns[from], &signaled(1, SendOp::Send, src))
        .unwrap();
    let sent = wait_send(sim, from, 1);
    assert_eq!(sent[0].status, WcStatus::Success);
    let received = wait_recv(sim, to, 1);
    assert_eq!(
        (received[0].status, received[0].byte_len),
        (WcStatus::Success, 3000)
    );
    assert_eq!(sim.mr_bytes(to, dst_key), data);
}

fn connect_exchange_disconnect(disconnecting: usize) {
    let (mut sim, qpns) = setup(true);
    let conns = connect(&mut sim, qpns);
    for node in [A, B] {
        assert_eq!(
            sim.nodes[node].endpoint.qp_state(qpns[node]),
            Some(QpState::Rts)
        );
    }
    send_data(&mut sim, qpns, A, 1);
    send_data(&mut sim, qpns, B, 2);

    let now = sim.now;
    cm(&mut sim, disconnecting)
        .disconnect(now, conns[disconnecting], b"bye")
        .unwrap();
    run(&mut sim, qpns, |seen| {
        disconnected(&seen[A]) && disconnected(&seen[B])
    });
    for node in [A, B] {
        assert_eq!(
            sim.nodes[node].endpoint.qp_state(qpns[node]),
            Some(QpState::Err)
        );
        assert_ne!(
            cm(&mut sim, node).state(conns[node]),
            Some(ConnState::Established)
        );
        assert_eq!(sim.nodes[node].endpoint.gsi_drops, 0);
    }
}

#[test]
fn connect_exchange_and_disconnect_from_the_active_side() {
    connect_exchange_disconnect(A);
}

#[test]
fn connect_exchange_and_disconnect_from_the_passive_side() {
    connect_exchange_disconnect(B);
}

#[test]
fn a_service_nobody_listens_on_is_rejected() {
    let (mut sim, qpns) = setup(true);
    cm(&mut sim, B).listen(SERVICE, 8).unwrap();
    let params = connect_params(&sim, OTHER_SERVICE, qpns[A]);
    let now = sim.now;
    let conn = cm(&mut sim, A).connect(now, &params, b"").unwrap();
    let seen = run(&mut sim, qpns, |seen| !seen[A].is_empty());
    assert!(
        matches!(
            seen[A][0],
            CmEvent::Rejected { conn: c, reason, .. }
                if c == conn && reason == RejectReason::INVALID_SERVICE_ID
        ),
        "{seen:?}"
    );
    assert!(seen[B].is_empty());
    // Each REJ but the last made A send its REQ again (`CmConfig::unlistened_retry`).
    let resent = cm(&mut sim, A).stats().unlistened_retries;
    assert!(resent > 0);
    assert_eq!(cm(&mut sim, B).stats().no_listener, 1 + resent);
}

#[test]
fn a_peer_without_a_cm_is_unreachable_after_the_retries() {
    let (mut sim, qpns) = setup(false);
    let start: Instant = sim.now;
    let params = connect_params(&sim, SERVICE, qpns[A]);
    let conn = cm(&mut sim, A).connect(start, &params, b"").unwrap();
    let seen = run(&mut sim, qpns, |seen| !seen[A].is_empty());
    assert_eq!(seen[A], [CmEvent::Unreachable { conn }]);
    // The REQ and its 15 resends reached B's QP 1, which has no CM to take them.
    let retries = u64::from(CmConfig::default().max_cm_retries);
    assert_eq!(sim.nodes[B].endpoint.unknown_qp_drops, 1 + retries);
    // Each wait: 2 × packet lifetime (2^18 × 4.096 µs) + response time (2^20 × 4.096 µs),
    // 6.144 s in the kernel's millisecond rounding; 16 of them.
    assert_eq!(sim.now - start, Duration::from_millis(16 * 6144));
}

#[test]
fn a_cm_mad_leaves_qp1_for_qp1_and_qp1_takes_only_cm_mads() {
    let (mut sim, qpns) = setup(true);
    cm(&mut sim, B).listen(SERVICE, 8).unwrap();
    let params = connect_params(&sim, SERVICE, qpns[A]);
    let now = sim.now;
    cm(&mut sim, A).connect(now, &params, b"").unwrap();
    let req = sim.nodes[A].endpoint.poll_transmit(now).expect("the REQ");
    assert_eq!(req.src_qpn, mad::GSI_QPN);
    let packet = &req.packet;
    assert_eq!(
        (packet.bth.opcode, packet.bth.dest_qpn, packet.bth.pkey),
        (Opcode::UdSendOnly, mad::GSI_QPN, mad::DEFAULT_PKEY)
    );
    let deth = packet.ext.deth.expect("a UD packet has a DETH");
    assert_eq!((deth.qkey, deth.src_qpn), (mad::GSI_QKEY, mad::GSI_QPN));
    assert_eq!(packet.payload.len(), mad::MAD_LEN);
    assert_eq!(req.ipv4_destination(), Some(sim.nodes[B].ip));

    let mut other_class = packet.payload.clone();
    other_class[1] = 0x04; // performance management
    let wrong_qkey = Some(roce_wire::deth::Repr {
        qkey: 0x1111_1111,
        src_qpn: mad::GSI_QPN,
    });
    let cases: [(Opcode, _, &[u8]); 4] = [
        (Opcode::UdSendOnly, wrong_qkey, &packet.payload),
        (
            Opcode::UdSendOnlyWithImmediate,
            packet.ext.deth,
            &packet.payload,
        ),
        (Opcode::UdSendOnly, packet.ext.deth, &packet.payload[..100]),
        (Opcode::UdSendOnly, packet.ext.deth, &other_class),
    ];
    for (opcode, deth, payload) in cases {
        let bth = common::forged_bth(opcode, mad::GSI_QPN, packet.bth.psn, payload.len(), false);
        let ext = roce_wire::ExtRepr {
            deth,
            immdt: (opcode == Opcode::UdSendOnlyWithImmediate)
                .then_some(roce_wire::immdt::Repr { immediate: 0 }),
            ..roce_wire::ExtRepr::default()
        };
        let frame = common::forged(&sim, A, B, bth, ext, payload);
        sim.nodes[B].endpoint.handle_packet(now, &frame);
    }
    assert_eq!(sim.nodes[B].endpoint.gsi_drops, 4);
    assert_eq!(cm(&mut sim, B).poll_event(), None);
    assert_eq!(cm(&mut sim, B).stats().malformed, 0);

    let frame = common::forged(&sim, A, B, packet.bth, packet.ext, &packet.payload);
    sim.nodes[B].endpoint.handle_packet(now, &frame);
    match cm(&mut sim, B).poll_event() {
        Some(CmEvent::ConnectRequest { request, .. }) => {
            assert_eq!(request.service_id, SERVICE);
            assert_eq!(request.remote_gid, gid_of(&sim, A));
            assert_eq!(request.local_gid, gid_of(&sim, B));
        }
        other => panic!("expected the connect request, got {other:?}"),
    }
}

/// Two endpoints each owning a block of a shared device's identifiers (A block 5, set
/// before its CM; B block 0, after): every QP number and every communication ID they
/// hand out carries the block in its top bits, the first QPN of block 0 is still 0x11,
/// a block cannot be changed once a QP exists, and the two connect and carry data.
#[test]
fn endpoints_with_id_blocks_hand_out_their_blocks_only() {
    let mut sim = Sim::new(LinkConfig::default(), 7);
    for _ in [A, B] {
        sim.add_node();
    }
    assert!(sim.nodes[A].endpoint.set_id_block(5));
    sim.nodes[A].endpoint.enable_cm(config(A));
    sim.nodes[B].endpoint.enable_cm(config(B));
    assert!(sim.nodes[B].endpoint.set_id_block(0));
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        ..QpCaps::default()
    };
    let qpns = [A, B].map(|node| sim.create_qp(node, QpType::Rc, caps));
    assert_eq!(qpns, [0x05_0000, 0x11]);
    assert_eq!(sim.create_qp(A, QpType::Ud, caps), 0x05_0001);
    assert!(!sim.nodes[A].endpoint.set_id_block(6), "QPs exist");
    // Every CM message's sender's ID (REQ, REP, RTU: the first word of the message).
    let ids: std::rc::Rc<std::cell::RefCell<Vec<(usize, u32)>>> = Default::default();
    let writer = ids.clone();
    sim.drop_filter = Some(Box::new(
        move |from, _to, frame: &roce_wire::FrameRepr<'_>| {
            if frame.bth.dest_qpn == mad::GSI_QPN {
                let mad = mad::Packet::new_checked(frame.payload).expect("a MAD");
                let data = mad.data();
                let id = u32::from_be_bytes([data[0], data[1], data[2], data[3]]);
                writer.borrow_mut().push((from, id));
            }
            false
        },
    ));
    connect(&mut sim, qpns);
    send_data(&mut sim, qpns, A, 1);
    let ids = ids.borrow();
    assert!(ids.len() >= 3, "REQ, REP, RTU: {ids:x?}");
    for &(from, id) in ids.iter() {
        let block = if from == A { 5 } else { 0 };
        assert_eq!(id >> 24, block, "{ids:x?}");
        assert_ne!(id, 0);
    }
}
