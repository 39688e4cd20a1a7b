//! Congestion control between endpoints of the simulator: ECT(0) on what connected QPs
//! send, CNPs for CE marks (their format and their rate), DCQCN slowing a sender down and
//! letting it recover, the rate limit's pacing, and the switches that turn each off.

mod common;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use common::*;
use roce_transport::congestion::{CongestionConfig, DcqcnParams, Rate, RateLimit};
use roce_transport::qp_state::{PathMtu, QpType};
use roce_transport::sim::{LinkConfig, Sim, SwitchConfig};
use roce_transport::wr::SendOp;
use roce_wire::frame::IpRepr;
use roce_wire::{FrameRepr, Opcode};

/// A switch that marks every ECN-capable frame it forwards CE (the queue holds at least
/// the frame itself, which is at `kmax`).
fn marking_everything() -> SwitchConfig {
    SwitchConfig {
        kmin: 0,
        kmax: 0,
        ..SwitchConfig::default()
    }
}

/// Two nodes through `switch` (none: face to face), both configured with `config`, one RC
/// pair from A to B.
fn network(switch: Option<SwitchConfig>, config: CongestionConfig) -> (Sim, u32, u32) {
    let mut sim = Sim::new(LinkConfig::default(), 7);
    sim.set_switch(switch);
    for _ in 0..2 {
        let node = sim.add_node();
        let now = sim.now;
        sim.nodes[node].endpoint.set_congestion(now, config);
    }
    let pair = sim.connect(A, B, QpType::Rc, PathMtu::Mtu1024, retry(7, 7));
    (sim, pair.a.1, pair.b.1)
}

/// Writes `len` bytes from A to B in messages of 64 KiB, all posted at once, and runs until
/// all have completed.
fn write(sim: &mut Sim, qa: u32, len: usize) {
    let data = pattern(len, 3);
    let src = sim.reg(A, SRC, &data);
    let dst = sim.reg(B, DST, &vec![0; len]);
    let chunk = 64 << 10;
    let messages = len.div_ceil(chunk);
    for k in 0..messages {
        let at = k * chunk;
        let size = chunk.min(len - at);
        let op = SendOp::RdmaWrite {
            remote_addr: DST + at as u64,
            rkey: dst,
        };
        let wr = signaled(k as u64, op, sge(SRC + at as u64, size, src));
        sim.post_send(A, qa, &wr).unwrap();
    }
    let done = wait_send(sim, A, messages);
    assert!(done
        .iter()
        .all(|c| c.status == roce_transport::cq::WcStatus::Success));
    assert_eq!(sim.mr_bytes(B, dst), data);
}

/// What a frame's IP header says about ECN and DSCP.
fn ecn_dscp(frame: &FrameRepr) -> (u8, u8) {
    let dscp = match frame.ip {
        IpRepr::V4(v4) => v4.dscp,
        IpRepr::V6(v6) => v6.traffic_class >> 2,
    };
    (frame.ip.ecn(), dscp)
}

/// Every frame handed to the network: sender, opcode, (ECN, DSCP), BECN, destination QP,
/// PSN, payload length and whether it carries a CNP body.
type Wire = Rc<RefCell<Vec<(usize, Opcode, (u8, u8), bool, u32, u32, usize, bool)>>>;

fn watch(sim: &mut Sim) -> Wire {
    let wire: Wire = Rc::default();
    let log = wire.clone();
    sim.drop_filter = Some(Box::new(move |from, _to, frame: &FrameRepr<'_>| {
        log.borrow_mut().push((
            from,
            frame.bth.opcode,
            ecn_dscp(frame),
            frame.bth.becn,
            frame.bth.dest_qpn,
            frame.bth.psn.value(),
            frame.payload.len(),
            frame.ext.cnp.is_some(),
        ));
        false
    }));
    wire
}

#[test]
fn connected_qps_send_ect0_unless_ecn_is_off() {
    let (mut sim, qa, _) = network(None, CongestionConfig::default());
    let wire = watch(&mut sim);
    write(&mut sim, qa, 256 << 10);
    let frames = wire.borrow();
    assert!(frames
        .iter()
        .any(|f| f.0 == B && f.1 == Opcode::RcAcknowledge));
    assert!(
        frames.iter().all(|f| f.2 == (0b10, 0)),
        "requests and ACKs ECT(0): {frames:?}"
    );
    let off = CongestionConfig {
        ecn: false,
        ..CongestionConfig::default()
    };
    let (mut sim, qa, _) = network(None, off);
    let wire = watch(&mut sim);
    write(&mut sim, qa, 64 << 10);
    assert!(
        wire.borrow().iter().all(|f| f.2 == (0, 0)),
        "the traffic class as given"
    );
}

#[test]
fn the_traffic_class_keeps_its_dscp_under_ect0() {
    let mut sim = Sim::new(LinkConfig::default(), 3);
    sim.add_node();
    sim.add_node();
    let (qa, qb) = (
        sim.create_qp(A, QpType::Rc, Default::default()),
        sim.create_qp(B, QpType::Rc, Default::default()),
    );
    let mut av_b = sim.av_of(B);
    av_b.traffic_class = (26 << 2) | 0b01;
    let mut av_a = sim.av_of(A);
    av_a.traffic_class = 26 << 2;
    let psn = roce_wire::Psn::new(100);
    let peer = |av, qpn| roce_transport::qp_state::Peer { av, qpn, psn };
    for (node, qpn, attrs) in [
        (
            A,
            qa,
            roce_transport::qp_state::connect_attrs(
                QpType::Rc,
                peer(av_b, qb),
                psn,
                PathMtu::Mtu1024,
                retry(7, 7),
            ),
        ),
        (
            B,
            qb,
            roce_transport::qp_state::connect_attrs(
                QpType::Rc,
                peer(av_a, qa),
                psn,
                PathMtu::Mtu1024,
                retry(7, 7),
            ),
        ),
    ] {
        for attr in attrs {
            sim.nodes[node]
                .endpoint
                .modify_qp(sim.now, qpn, &attr)
                .unwrap();
        }
    }
    let wire = watch(&mut sim);
    write(&mut sim, qa, 4096);
    let frames = wire.borrow();
    assert!(!frames.is_empty());
    assert!(
        frames.iter().all(|f| f.2 == (0b10, 26)),
        "DSCP 26 with ECT(0), whatever ECN bits the AV had: {frames:?}"
    );
}

#[test]
fn ce_marks_draw_cnps_at_most_one_per_interval_and_the_sender_slows_down() {
    let params = DcqcnParams {
        np_min_time_between_cnps: 50,
        ..DcqcnParams::default()
    };
    let config = CongestionConfig {
        dcqcn: params,
        line_rate: Rate::gbps(10),
        ..CongestionConfig::default()
    };
    let (mut sim, qa, qb) = network(Some(marking_everything()), config);
    let wire = watch(&mut sim);
    let start = sim.now;
    write(&mut sim, qa, 1 << 20);
    let elapsed = sim.now - start;
    let (a, b) = (
        sim.nodes[A].endpoint.counters(),
        sim.nodes[B].endpoint.counters(),
    );
    // Every request reached B marked (and every ACK reached A marked).
    let requests = wire
        .borrow()
        .iter()
        .filter(|f| f.0 == A && f.1 == Opcode::RcRdmaWriteMiddle)
        .count() as u64;
    assert!(b.np_ecn_marked_roce_packets > requests, "{b:?}");
    assert!(a.np_ecn_marked_roce_packets > 0, "{a:?}");
    // One CNP per 50 µs at most while marked packets kept coming.
    let most = elapsed.as_micros() as u64 / 50 + 1;
    assert!(
        b.np_cnp_sent >= 2 && b.np_cnp_sent <= most,
        "{b:?} in {elapsed:?}"
    );
    // The CNPs on the wire: opcode 0x81 to A's QP, BECN, PSN 0, 16 zero bytes (the CNP
    // body, no payload), DSCP 48, not ECN-capable.
    let cnps: Vec<_> = wire
        .borrow()
        .iter()
        .filter(|f| f.1 == Opcode::Cnp)
        .cloned()
        .collect();
    assert_eq!(cnps.len() as u64, b.np_cnp_sent);
    for cnp in &cnps {
        assert_eq!(*cnp, (B, Opcode::Cnp, (0, 48), true, qa, 0, 0, true));
    }
    // A acted on each: DCQCN cut its rate, which its pacer applies.
    assert_eq!(a.rp_cnp_handled, b.np_cnp_sent);
    assert_eq!(
        a.rp_rate_cuts, a.rp_cnp_handled,
        "CNPs 50 µs apart each cut"
    );
    let now = sim.now;
    let rate = sim.nodes[A].endpoint.qp_rate(now, qa).unwrap();
    assert!(rate.dcqcn_current.unwrap() < Rate::gbps(10), "{rate:?}");
    assert_eq!(rate.current, rate.dcqcn_current);
    assert_eq!(rate.cuts, a.rp_rate_cuts);
    // B's own QP sent nothing but ACKs and CNPs, and was never slowed down.
    assert_eq!(sim.nodes[B].endpoint.qp_rate(now, qb).unwrap().cuts, 0);
}

#[test]
fn without_cnps_dcqcn_recovers_to_line_rate_and_lets_go() {
    let config = CongestionConfig {
        line_rate: Rate::gbps(10),
        ..CongestionConfig::default()
    };
    let (mut sim, qa, _) = network(Some(marking_everything()), config);
    write(&mut sim, qa, 256 << 10);
    let now = sim.now;
    let cut = sim.nodes[A].endpoint.qp_rate(now, qa).unwrap();
    assert!(cut.dcqcn_current.is_some(), "{cut:?}");
    // Idle: the timer raises the rate every rp_time_reset (300 µs) until it is back.
    sim.set_switch(None);
    settle(&mut sim);
    let now = sim.now;
    let back = sim.nodes[A].endpoint.qp_rate(now, qa).unwrap();
    assert_eq!(back.current, None, "no pacer once DCQCN is done: {back:?}");
    assert_eq!(back.dcqcn_current, None);
    assert_eq!(back.cuts, cut.cuts);
    assert!(
        sim.nodes[A].endpoint.poll_timeout().is_none(),
        "no timer left"
    );
}

#[test]
fn cnps_are_counted_and_ignored_with_the_reaction_point_off() {
    let config = CongestionConfig {
        rp: false,
        ..CongestionConfig::default()
    };
    let (mut sim, qa, _) = network(Some(marking_everything()), config);
    write(&mut sim, qa, 256 << 10);
    let (a, b) = (
        sim.nodes[A].endpoint.counters(),
        sim.nodes[B].endpoint.counters(),
    );
    assert!(b.np_cnp_sent > 0);
    assert_eq!(a.rp_cnp_ignored, b.np_cnp_sent);
    assert_eq!((a.rp_cnp_handled, a.rp_rate_cuts), (0, 0));
    let now = sim.now;
    assert_eq!(
        sim.nodes[A].endpoint.qp_rate(now, qa).unwrap().current,
        None
    );
}

#[test]
fn no_cnps_with_the_notification_point_off() {
    let config = CongestionConfig {
        np: false,
        ..CongestionConfig::default()
    };
    let (mut sim, qa, _) = network(Some(marking_everything()), config);
    let wire = watch(&mut sim);
    write(&mut sim, qa, 128 << 10);
    let b = sim.nodes[B].endpoint.counters();
    assert!(b.np_ecn_marked_roce_packets > 0);
    assert_eq!(b.np_cnp_sent, 0);
    assert!(!wire.borrow().iter().any(|f| f.1 == Opcode::Cnp));
}

/// A forged CNP to a QP from a stranger, or to a UD QP, changes nothing.
#[test]
fn cnps_from_strangers_are_dropped() {
    let (mut sim, qa, _) = network(None, CongestionConfig::default());
    let mut sim3 = Sim::new(LinkConfig::default(), 1);
    for _ in 0..3 {
        sim3.add_node();
    }
    let mut bth = forged_bth(Opcode::Cnp, qa, roce_wire::Psn::new(0), 0, false);
    bth.becn = true;
    let ext = roce_wire::ExtRepr {
        cnp: Some(roce_wire::cnp::Repr),
        ..roce_wire::ExtRepr::default()
    };
    // From node 2's address, which A's QP is not connected to.
    let stranger = FrameRepr::ipv4(
        ([2, 0, 0, 0, 0, 3], sim3.nodes[2].ip),
        ([2, 0, 0, 0, 0, 1], sim.nodes[A].ip),
        bth,
        ext,
        &[],
    );
    let now = sim.now;
    sim.nodes[A].endpoint.handle_packet(now, &stranger);
    assert_eq!(sim.nodes[A].endpoint.counters().rp_cnp_handled, 0);
    assert_eq!(sim.nodes[A].endpoint.qp_rate(now, qa).unwrap().cuts, 0);
    // From B, it is handled.
    let from_b = forged(&sim, B, A, bth, ext, &[]);
    sim.nodes[A].endpoint.handle_packet(now, &from_b);
    assert_eq!(sim.nodes[A].endpoint.counters().rp_cnp_handled, 1);
    assert_eq!(sim.nodes[A].endpoint.qp_rate(now, qa).unwrap().cuts, 1);
}

/// The rate limit: a WRITE of 1 MiB at 100 Mb/s takes the time its frames take at
/// that rate; unlimited it takes a fraction of it; a limit of 0 removes it.
#[test]
fn a_rate_limit_paces_the_requester() {
    let limit = |rate| Some(RateLimit { rate, max_burst: 0 });
    let len = 1 << 20;
    let mut took = Vec::new();
    for rate in [Rate::mbps(100), Rate(0)] {
        let (mut sim, qa, _) = network(None, CongestionConfig::default());
        let now = sim.now;
        let endpoint = &mut sim.nodes[A].endpoint;
        endpoint
            .set_rate_limit(now, qa, limit(Rate::mbps(100)))
            .unwrap();
        endpoint.set_rate_limit(now, qa, limit(rate)).unwrap();
        let current = sim.nodes[A].endpoint.qp_rate(now, qa).unwrap();
        assert_eq!(current.limit, (rate.kbps() > 0).then_some(rate));
        let start = sim.now;
        write(&mut sim, qa, len);
        took.push(sim.now - start);
    }
    // 1024 packets of 1024 bytes, each with 58 bytes of headers and 16 of RETH on the
    // first of each message: at 100 Mb/s about 86.6 ms.
    let frames = 1024 * (1024 + 58) + 16 * 16;
    let paced = Rate::mbps(100).time_for(frames as u64);
    let slack = Duration::from_millis(1);
    assert!(
        took[0] + slack >= paced && took[0] <= paced + slack,
        "{:?} against {paced:?}",
        took[0]
    );
    assert!(took[1] * 20 < took[0], "unlimited: {:?}", took[1]);
}

#[test]
fn a_rate_limit_is_taken_where_the_qp_sends() {
    let (mut sim, qa, _) = network(None, CongestionConfig::default());
    let mut fresh = Sim::new(LinkConfig::default(), 1);
    fresh.add_node();
    let qp = fresh.create_qp(A, QpType::Rc, Default::default());
    let limit = Some(RateLimit {
        rate: Rate::mbps(10),
        max_burst: 4096,
    });
    // A QP in RESET (or INIT, or ERR) takes no rate limit: IBV_QP_RATE_LIMIT is an
    // attribute of RTR → RTS and RTS → RTS.
    let now = fresh.now;
    assert!(fresh.nodes[A]
        .endpoint
        .set_rate_limit(now, qp, limit)
        .is_err());
    assert!(fresh.nodes[A]
        .endpoint
        .set_rate_limit(now, 999, limit)
        .is_err());
    let now = sim.now;
    sim.nodes[A]
        .endpoint
        .set_rate_limit(now, qa, limit)
        .unwrap();
    let rate = sim.nodes[A].endpoint.qp_rate(now, qa).unwrap();
    assert_eq!(
        (rate.limit, rate.current),
        (Some(Rate::mbps(10)), Some(Rate::mbps(10)))
    );
}

/// An engine that wakes late (a loaded machine) finds the pacer's timer and the ACK timer
/// due at once: the ACK timer then restarts rather than send anything again, since the
/// pacer, not the peer, held back what was not acknowledged. Every wake-up of the sender
/// here comes 4 ms (eight ACK timeouts) late, and runs as the engine does: frames in,
/// timers, frames out; the network and the receiver are on time.
#[test]
fn a_late_wake_up_of_a_paced_requester_is_not_a_silent_peer() {
    let (mut sim, qa, _) = network(None, CongestionConfig::default());
    let now = sim.now;
    let limit = RateLimit {
        rate: Rate::mbps(10),
        max_burst: 0,
    };
    (sim.nodes[A].endpoint)
        .set_rate_limit(now, qa, Some(limit))
        .unwrap();
    let len = 32 << 10;
    let data = pattern(len, 5);
    let src = sim.reg(A, SRC, &data);
    let dst = sim.reg(B, DST, &vec![0; len]);
    let op = SendOp::RdmaWrite {
        remote_addr: DST,
        rkey: dst,
    };
    sim.post_send(A, qa, &signaled(1, op, sge(SRC, len, src)))
        .unwrap();
    let mut done = Vec::new();
    for _ in 0..1000 {
        done.extend(sim.poll_send(A));
        if !done.is_empty() {
            break;
        }
        let late = sim.now + Duration::from_millis(4);
        sim.round_at(late);
        // The packet just sent reaches B, and B's answer A, in time.
        sim.step();
        sim.step();
    }
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].status, roce_transport::cq::WcStatus::Success);
    assert_eq!(sim.mr_bytes(B, dst), data);
    let stats = sim.nodes[A].endpoint.qp_stats(qa).unwrap();
    assert_eq!((stats.timeouts, stats.retransmits), (0, 0), "{stats:?}");
}
