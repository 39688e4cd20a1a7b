//! The CM between two instances over a simulated, seeded, lossy link with a simulated clock,
//! and against the kernel CM's bytes in rping_rdmacm.pcap.

use std::time::{Duration, Instant};

use rand_chacha::ChaCha12Rng;
use rand_core::{Rng, SeedableRng};
use roce_transport::cm::{
    AcceptParams, Cm, CmConfig, CmError, CmEvent, ConnId, ConnState, ConnectParams, Gid, QpAttrs,
    SidrReply, UNLISTENED_RESEND,
};
use roce_transport::qp_state::{PathMtu, QpState};
use roce_wire::cm::rej::RejectReason;
use roce_wire::cm::req::ServiceType;
use roce_wire::cm::sidr_rep::SidrStatus;
use roce_wire::cm::{self as wire_cm, Message, PortSpace, ServiceId};
use roce_wire::{mad, Frame, Opcode, Psn};

const A: usize = 0;
const B: usize = 1;
const SERVICE: ServiceId = ServiceId::rdma_ip(PortSpace::Tcp, 7174);
const UDP_SERVICE: ServiceId = ServiceId::rdma_ip(PortSpace::Udp, 7174);
const QPN: [u32; 2] = [0x11, 0x22];

fn gid(last: u8) -> Gid {
    let mut gid = [0; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12..].copy_from_slice(&[10, 0, 0, last]);
    gid
}

fn config(side: usize) -> CmConfig {
    CmConfig {
        local_ca_guid: 0x0200_00ff_fe00_0001 + side as u64,
        seed: [side as u8 + 1; 32],
        ..CmConfig::default()
    }
}

fn connect_params() -> ConnectParams {
    ConnectParams {
        service_id: SERVICE,
        local_gid: gid(1),
        sgid_index: 1,
        remote_gid: gid(2),
        qpn: QPN[A],
        service_type: ServiceType::Rc,
        path_mtu: PathMtu::Mtu1024,
        responder_resources: 4,
        initiator_depth: 2,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: false,
        flow_control: true,
        traffic_class: 0,
        hop_limit: 64,
        flow_label: 0,
    }
}

fn accept_params() -> AcceptParams {
    AcceptParams {
        qpn: QPN[B],
        sgid_index: 1,
        responder_resources: 2,
        initiator_depth: 4,
        rnr_retry_count: 6,
        srq: false,
        flow_control: true,
    }
}

/// What the passive side does with a REQ.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OnRequest {
    Accept,
    Reject,
    Wait,
}

/// Two CMs joined by a link with a fixed latency and seeded loss per direction.
struct Pair {
    cms: [Cm; 2],
    gids: [Gid; 2],
    start: Instant,
    now: Instant,
    latency: Duration,
    /// Percent of MADs lost, by sending side.
    loss: [u32; 2],
    rng: ChaCha12Rng,
    in_flight: Vec<(Instant, usize, [u8; mad::MAD_LEN])>,
    /// Every MAD each side sent, parsed, with its time since the start.
    sent: [Vec<(Duration, wire_cm::Repr)>; 2],
    /// Every event each side raised, with its time since the start.
    events: [Vec<(Duration, CmEvent)>; 2],
    on_request: OnRequest,
    /// The QP attributes each side was given.
    qp: [Option<QpAttrs>; 2],
    conn: [Option<ConnId>; 2],
}

impl Pair {
    fn new(seed: u64, loss: [u32; 2]) -> Pair {
        let start = Instant::now();
        let mut cms = [Cm::new(config(A)), Cm::new(config(B))];
        cms[B].listen(SERVICE, 16).unwrap();
        Pair {
            cms,
            gids: [gid(1), gid(2)],
            start,
            now: start,
            latency: Duration::from_millis(1),
            loss,
            rng: ChaCha12Rng::seed_from_u64(seed),
            in_flight: Vec::new(),
            sent: [Vec::new(), Vec::new()],
            events: [Vec::new(), Vec::new()],
            on_request: OnRequest::Accept,
            qp: [None, None],
            conn: [None, None],
        }
    }

    fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    fn connect(&mut self) -> ConnId {
        let conn = self.cms[A]
            .connect(self.now, &connect_params(), b"hello")
            .unwrap();
        self.conn[A] = Some(conn);
        self.flush();
        conn
    }

    /// Moves what both CMs want to send onto the link and reacts to their events.
    fn flush(&mut self) {
        loop {
            let mut progressed = false;
            for side in [A, B] {
                while let Some(transmit) = self.cms[side].poll_transmit() {
                    progressed = true;
                    assert_eq!(transmit.local_gid, self.gids[side]);
                    assert_eq!(transmit.remote_gid, self.gids[1 - side]);
                    let repr =
                        wire_cm::Repr::parse(&mad::Packet::new_checked(&transmit.mad[..]).unwrap())
                            .unwrap();
                    self.sent[side].push((self.elapsed(), repr));
                    if self.rng.next_u32() % 100 >= self.loss[side] {
                        self.in_flight
                            .push((self.now + self.latency, 1 - side, transmit.mad));
                    }
                }
                while let Some(event) = self.cms[side].poll_event() {
                    progressed = true;
                    self.events[side].push((self.elapsed(), event));
                    self.react(side, event);
                }
            }
            if !progressed {
                return;
            }
        }
    }

    fn react(&mut self, side: usize, event: CmEvent) {
        match event {
            CmEvent::ConnectRequest { conn, .. } => {
                self.conn[side] = Some(conn);
                match self.on_request {
                    OnRequest::Accept => self.accept(),
                    OnRequest::Reject => {
                        self.cms[side].reject(self.now, conn, b"no thanks").unwrap()
                    }
                    OnRequest::Wait => {}
                }
            }
            CmEvent::ConnectResponse { conn, qp, .. } => {
                self.qp[side] = Some(qp);
                self.cms[side].establish(conn).unwrap();
            }
            _ => {}
        }
    }

    fn accept(&mut self) {
        let conn = self.conn[B].unwrap();
        self.qp[B] = Some(
            self.cms[B]
                .accept(self.now, conn, &accept_params(), b"welcome")
                .unwrap(),
        );
    }

    /// Delivers the next MAD or fires the next timeout; false when nothing is left to do.
    fn step(&mut self) -> bool {
        let next_delivery = self.in_flight.iter().map(|(at, ..)| *at).min();
        let next_timeout = self.cms.iter().filter_map(Cm::poll_timeout).min();
        let Some(next) = [next_delivery, next_timeout].into_iter().flatten().min() else {
            return false;
        };
        self.now = self.now.max(next);
        let (due, later): (Vec<_>, Vec<_>) = self
            .in_flight
            .drain(..)
            .partition(|(at, ..)| *at <= self.now);
        self.in_flight = later;
        for (_, to, mad) in due {
            let (local, remote) = (self.gids[to], self.gids[1 - to]);
            self.cms[to].handle_mad(self.now, local, remote, &mad);
        }
        for cm in &mut self.cms {
            cm.handle_timeout(self.now);
        }
        self.flush();
        true
    }

    /// Steps until `done` holds, within `limit` of simulated time and a bounded step count.
    fn drive_until(&mut self, limit: Duration, done: impl Fn(&Pair) -> bool) -> bool {
        for _ in 0..100_000 {
            if done(self) {
                return true;
            }
            if self.elapsed() > limit || !self.step() {
                return done(self);
            }
        }
        false
    }

    fn saw(&self, side: usize, wanted: fn(&CmEvent) -> bool) -> bool {
        self.events[side].iter().any(|(_, event)| wanted(event))
    }

    fn event_names(&self, side: usize) -> Vec<&'static str> {
        self.events[side]
            .iter()
            .map(|(_, event)| match event {
                CmEvent::ConnectRequest { .. } => "ConnectRequest",
                CmEvent::ConnectResponse { .. } => "ConnectResponse",
                CmEvent::Established { .. } => "Established",
                CmEvent::Rejected { .. } => "Rejected",
                CmEvent::Unreachable { .. } => "Unreachable",
                CmEvent::Disconnected { .. } => "Disconnected",
                CmEvent::TimewaitExit { .. } => "TimewaitExit",
                CmEvent::SidrRequest { .. } => "SidrRequest",
                CmEvent::SidrResolved { .. } => "SidrResolved",
                CmEvent::SidrRejected { .. } => "SidrRejected",
                _ => "other",
            })
            .collect()
    }

    fn sent_names(&self, side: usize) -> Vec<&'static str> {
        self.sent[side]
            .iter()
            .map(|(_, repr)| repr.message.name())
            .collect()
    }

    fn both_established(&self) -> bool {
        [A, B]
            .iter()
            .all(|&side| self.saw(side, |e| matches!(e, CmEvent::Established { .. })))
    }

    fn both_closed(&self) -> bool {
        [A, B]
            .iter()
            .all(|&side| self.saw(side, |e| matches!(e, CmEvent::TimewaitExit { .. })))
    }
}

const MINUTE: Duration = Duration::from_secs(60);

/// `rdma_init_qp_attr` for a program that moves its own QP: what each step of the
/// exchange settles, the same the CM itself hands out, and the two sides' PSNs crossed.
#[test]
fn qp_attributes_can_be_asked_for_at_each_step() {
    let mut pair = Pair::new(12, [0, 0]);
    pair.on_request = OnRequest::Wait;
    let conn = pair.connect();
    let init = pair.cms[A].qp_attr(conn, QpState::Init, 1).unwrap();
    assert_eq!(init.state, Some(QpState::Init));
    assert_eq!(init.access_flags.map(|a| a.bits()), Some(0b1110));
    assert!(matches!(
        pair.cms[A].qp_attr(conn, QpState::Rtr, 1),
        Err(CmError::InvalidState(ConnState::ReqSent))
    ));
    assert!(pair.drive_until(MINUTE, |p| p.conn[B].is_some()));
    let passive = pair.conn[B].unwrap();
    let asked = [QpState::Init, QpState::Rtr, QpState::Rts]
        .map(|state| pair.cms[B].qp_attr(passive, state, 1).unwrap());
    // Before the accept the REQ's depths are granted crosswise: its initiator depth 2 is
    // our responder's, its responder resources 4 our initiator depth.
    assert_eq!(asked[1].max_dest_rd_atomic, Some(2));
    assert_eq!(asked[2].max_rd_atomic, Some(4));
    assert!(matches!(
        pair.cms[B].qp_attr(passive, QpState::Sqd, 1),
        Err(CmError::UnsupportedQpState(QpState::Sqd))
    ));
    pair.accept();
    let accepted = pair.qp[B].unwrap();
    // The REP carries the PSN drawn when the attributes were first asked for.
    assert_eq!(asked[1].rq_psn, accepted.rtr.rq_psn);
    assert_eq!(accepted.rtr.max_dest_rd_atomic, Some(2));
    pair.flush();
    assert!(pair.drive_until(MINUTE, Pair::both_established));
    let active = pair.qp[A].unwrap();
    for (state, expected) in [
        (QpState::Init, active.init),
        (QpState::Rtr, active.rtr),
        (QpState::Rts, active.rts),
    ] {
        assert_eq!(pair.cms[A].qp_attr(conn, state, 1).unwrap(), expected);
    }
    assert_eq!(active.rtr.rq_psn, accepted.rts.sq_psn);
    assert_eq!(active.rts.sq_psn, accepted.rtr.rq_psn);
    assert_eq!(active.rtr.dest_qp_num, Some(QPN[B]));
    assert_eq!(accepted.rtr.dest_qp_num, Some(QPN[A]));
}

#[test]
fn connect_then_active_side_disconnects() {
    let mut pair = Pair::new(1, [0, 0]);
    pair.connect();
    assert!(pair.drive_until(MINUTE, Pair::both_established));
    let [qa, qb] = pair.qp.map(Option::unwrap);
    // Each side's RTR expects the other's first PSN and names the other's QP.
    assert_eq!(qa.rtr.dest_qp_num, Some(QPN[B]));
    assert_eq!(qb.rtr.dest_qp_num, Some(QPN[A]));
    assert_eq!(qa.rtr.rq_psn, qb.rts.sq_psn);
    assert_eq!(qb.rtr.rq_psn, qa.rts.sq_psn);
    // A offered responder resources 4 / initiator depth 2; B answered 2 / 4.
    assert_eq!(
        (qa.rtr.max_dest_rd_atomic, qa.rts.max_rd_atomic),
        (Some(4), Some(2))
    );
    assert_eq!(
        (qb.rtr.max_dest_rd_atomic, qb.rts.max_rd_atomic),
        (Some(2), Some(4))
    );
    // A's RNR retry is the one B asked for, B's the one A's REQ carried.
    assert_eq!((qa.rts.rnr_retry, qb.rts.rnr_retry), (Some(6), Some(7)));
    assert_eq!((qa.rts.retry_cnt, qb.rts.retry_cnt), (Some(7), Some(7)));
    assert_eq!(qa.rtr.path_mtu, Some(PathMtu::Mtu1024));
    assert_eq!(qb.rtr.path_mtu, Some(PathMtu::Mtu1024));
    assert_eq!((qa.rts.timeout, qb.rts.timeout), (Some(19), Some(19)));
    assert_eq!(qa.rtr.av.unwrap().dgid, gid(2));
    assert_eq!(qb.rtr.av.unwrap().dgid, gid(1));
    assert!(qa
        .init
        .access_flags
        .unwrap()
        .contains(roce_transport::AccessFlags::REMOTE_READ));

    let conn = pair.conn[A].unwrap();
    pair.cms[A].disconnect(pair.now, conn, &[]).unwrap();
    pair.flush();
    assert!(pair.drive_until(MINUTE * 2, Pair::both_closed));
    assert_eq!(
        pair.event_names(A),
        [
            "ConnectResponse",
            "Established",
            "Disconnected",
            "TimewaitExit"
        ]
    );
    assert_eq!(
        pair.event_names(B),
        [
            "ConnectRequest",
            "Established",
            "Disconnected",
            "TimewaitExit"
        ]
    );
    assert_eq!(pair.sent_names(A), ["CM_REQ", "CM_RTU", "CM_DREQ"]);
    assert_eq!(pair.sent_names(B), ["CM_REP", "CM_DREP"]);
    assert_eq!(
        pair.cms[A].connection_count() + pair.cms[B].connection_count(),
        0
    );

    // The private data crossed: the REQ's and the REP's.
    let (_, CmEvent::ConnectRequest { request, .. }) = pair.events[B][0] else {
        unreachable!()
    };
    assert_eq!(&request.req.private_data[..5], b"hello");
    let (_, CmEvent::ConnectResponse { private_data, .. }) = pair.events[A][0] else {
        unreachable!()
    };
    assert_eq!(&private_data[..7], b"welcome");
}

#[test]
fn passive_side_disconnects() {
    let mut pair = Pair::new(2, [0, 0]);
    pair.connect();
    assert!(pair.drive_until(MINUTE, Pair::both_established));
    let conn = pair.conn[B].unwrap();
    pair.cms[B].disconnect(pair.now, conn, &[]).unwrap();
    pair.flush();
    assert!(pair.drive_until(MINUTE * 2, Pair::both_closed));
    assert_eq!(pair.sent_names(B), ["CM_REP", "CM_DREQ"]);
    assert_eq!(pair.sent_names(A), ["CM_REQ", "CM_RTU", "CM_DREP"]);
    assert!(pair.saw(A, |e| matches!(e, CmEvent::Disconnected { .. })));
}

#[test]
fn both_sides_disconnect_at_once() {
    let mut pair = Pair::new(3, [0, 0]);
    pair.connect();
    assert!(pair.drive_until(MINUTE, Pair::both_established));
    for side in [A, B] {
        let conn = pair.conn[side].unwrap();
        pair.cms[side].disconnect(pair.now, conn, &[]).unwrap();
    }
    pair.flush();
    assert!(pair.drive_until(MINUTE * 2, Pair::both_closed));
    for side in [A, B] {
        let disconnects = pair.events[side]
            .iter()
            .filter(|(_, e)| matches!(e, CmEvent::Disconnected { .. }))
            .count();
        assert_eq!(disconnects, 1, "side {side}");
    }
}

#[test]
fn consumer_reject_reaches_the_requester() {
    let mut pair = Pair::new(4, [0, 0]);
    pair.on_request = OnRequest::Reject;
    pair.connect();
    assert!(pair.drive_until(MINUTE, |p| p
        .saw(A, |e| matches!(e, CmEvent::Rejected { .. }))));
    let (
        _,
        CmEvent::Rejected {
            reason,
            private_data,
            ..
        },
    ) = pair.events[A][0]
    else {
        panic!("{:?}", pair.events[A]);
    };
    assert_eq!(reason, RejectReason::CONSUMER_DEFINED);
    assert_eq!(&private_data[..9], b"no thanks");
    assert_eq!(pair.cms[A].connection_count(), 0);
    // The rejecting side forgets the request after its time-wait, without telling anyone.
    assert!(pair.drive_until(MINUTE, |p| p.cms[B].connection_count() == 0));
    assert_eq!(pair.event_names(B), ["ConnectRequest"]);
}

#[test]
fn nobody_listening_is_rejected_with_invalid_service_id_after_the_hold() {
    let mut pair = Pair::new(5, [0, 0]);
    pair.cms[A] = Cm::new(CmConfig {
        unlistened_retry: Duration::ZERO,
        ..config(A)
    });
    pair.cms[B].stop_listening(SERVICE);
    pair.connect();
    assert!(pair.drive_until(MINUTE, |p| !p.events[A].is_empty()));
    let (at, event) = pair.events[A][0];
    assert!(matches!(
        event,
        CmEvent::Rejected {
            reason: RejectReason::INVALID_SERVICE_ID,
            ..
        }
    ));
    // The REQ waited for a listener, between its arrival and the REJ's.
    let hold = CmConfig::default().unlistened_hold;
    assert!(at >= hold && at <= hold + pair.latency * 2, "{at:?}");
    assert_eq!(pair.cms[B].connection_count(), 0);
    assert_eq!(pair.cms[B].stats().no_listener, 1);
    assert!(pair.events[B].is_empty());
    assert_eq!(pair.cms[B].poll_timeout(), None);
}

/// A peer that rejects at once (the kernel's CM) while nobody listens, and listens a
/// moment later (perftest `-R`'s server opening its second listener): our REQ goes again
/// every `UNLISTENED_RESEND` and is taken; the application never hears of the REJs.
#[test]
fn a_req_rejected_because_nobody_listens_yet_is_sent_again_until_the_listener_comes() {
    let mut pair = Pair::new(8, [0, 0]);
    pair.cms[B] = Cm::new(CmConfig {
        unlistened_hold: Duration::ZERO,
        ..config(B)
    });
    pair.connect();
    // REQs at 0, 102 and 204 ms are rejected 2 ms later; the fourth is sent at 306 ms.
    let listening = Duration::from_millis(250);
    assert!(pair.drive_until(MINUTE, |p| p.elapsed() >= listening));
    assert!(pair.events[A].is_empty(), "{:?}", pair.event_names(A));
    let reqs = pair.sent_names(A);
    assert_eq!(reqs, ["CM_REQ"; 4], "{reqs:?}");
    assert_eq!(
        pair.sent[A][3].0,
        (UNLISTENED_RESEND + pair.latency * 2) * 3
    );
    assert_eq!(pair.cms[B].stats().no_listener, 3);
    pair.cms[B].listen(SERVICE, 4).unwrap();
    assert!(pair.drive_until(MINUTE, Pair::both_established));
    assert_eq!(pair.event_names(A), ["ConnectResponse", "Established"]);
    assert_eq!(pair.cms[A].stats().unlistened_retries, 3);
    assert_eq!(pair.cms[A].stats().retransmits, 3);
    // Every REQ is the same one: same communication ID and transaction ID.
    let first = &pair.sent[A][0].1;
    assert!(pair.sent[A]
        .iter()
        .filter(|(_, repr)| repr.message.name() == "CM_REQ")
        .all(|(_, repr)| repr == first));
}

/// Nobody ever listens: the REJ is reported once `unlistened_retry` has passed since the
/// first, and the resends did not use up the REQ's own retries (more were sent than
/// `max_cm_retries` allows).
#[test]
fn nobody_listening_at_all_is_rejected_after_the_retry_window() {
    let mut pair = Pair::new(9, [0, 0]);
    pair.cms[B] = Cm::new(CmConfig {
        unlistened_hold: Duration::ZERO,
        ..config(B)
    });
    pair.connect();
    assert!(pair.drive_until(MINUTE, |p| !p.events[A].is_empty()));
    assert_eq!(pair.event_names(A), ["Rejected"]);
    let (at, _) = pair.events[A][0];
    let window = CmConfig::default().unlistened_retry;
    let first_rej = pair.latency * 2;
    assert!(
        at >= first_rej + window && at <= first_rej + window + pair.latency * 2,
        "{at:?}"
    );
    let reqs = pair.sent_names(A).len() as u64;
    assert!(
        reqs > u64::from(CmConfig::default().max_cm_retries) + 1,
        "{reqs}"
    );
    assert_eq!(pair.cms[A].stats().unlistened_retries, reqs - 1);
    assert_eq!(pair.cms[B].stats().no_listener, reqs);
    assert_eq!(pair.cms[A].connection_count(), 0);
    assert_eq!(pair.cms[A].poll_timeout(), None);
}

#[test]
fn a_req_that_comes_just_before_the_listener_is_offered_to_it() {
    let mut pair = Pair::new(6, [0, 0]);
    pair.cms[B].stop_listening(SERVICE);
    pair.connect();
    // The REQ arrives with nobody listening ...
    let arrived = pair.now + pair.latency;
    assert!(pair.drive_until(MINUTE, |p| p.now >= arrived));
    assert_eq!(pair.cms[B].stats().no_listener, 0);
    // ... and the listener that comes within the hold gets it: no REJ, no resent REQ.
    pair.cms[B].listen(SERVICE, 4).unwrap();
    pair.flush();
    assert!(pair.drive_until(MINUTE, Pair::both_established));
    assert_eq!(pair.sent_names(A), ["CM_REQ", "CM_RTU"]);
    assert_eq!(pair.sent_names(B), ["CM_REP"]);
    assert_eq!(pair.cms[B].stats().no_listener, 0);
}

#[test]
fn without_a_hold_or_a_retry_nobody_listening_is_rejected_at_once() {
    let mut pair = Pair::new(7, [0, 0]);
    pair.cms[A] = Cm::new(CmConfig {
        unlistened_retry: Duration::ZERO,
        ..config(A)
    });
    pair.cms[B] = Cm::new(CmConfig {
        unlistened_hold: Duration::ZERO,
        ..config(B)
    });
    pair.connect();
    assert!(pair.drive_until(MINUTE, |p| !p.events[A].is_empty()));
    assert_eq!(pair.events[A][0].0, pair.latency * 2);
    assert_eq!(pair.event_names(A), ["Rejected"]);
}

#[test]
fn connects_and_disconnects_under_loss() {
    let mut retransmits = 0;
    for seed in 0..40 {
        let mut pair = Pair::new(seed, [30, 30]);
        pair.connect();
        assert!(
            pair.drive_until(MINUTE * 10, Pair::both_established),
            "seed {seed}: A {:?} B {:?}",
            pair.event_names(A),
            pair.event_names(B)
        );
        let conn = pair.conn[A].unwrap();
        pair.cms[A].disconnect(pair.now, conn, &[]).unwrap();
        pair.flush();
        assert!(
            pair.drive_until(pair.elapsed() + MINUTE * 10, Pair::both_closed),
            "seed {seed}: A {:?} B {:?}",
            pair.event_names(A),
            pair.event_names(B)
        );
        for side in [A, B] {
            assert_eq!(
                pair.event_names(side).last(),
                Some(&"TimewaitExit"),
                "seed {seed}"
            );
        }
        retransmits += pair.cms[A].stats().retransmits + pair.cms[B].stats().retransmits;
    }
    assert!(
        retransmits > 20,
        "{retransmits} retransmits: the loss did not bite"
    );
}

#[test]
fn a_silent_peer_is_unreachable_after_the_kernels_retries() {
    let mut pair = Pair::new(6, [100, 0]);
    pair.connect();
    assert!(pair.drive_until(MINUTE * 5, |p| !p.events[A].is_empty()));
    assert_eq!(pair.event_names(A), ["Unreachable"]);
    // One REQ and 15 retries, every 2 × 2^(18-8) + 2^(20-8) ms.
    assert_eq!(pair.sent_names(A), ["CM_REQ"; 16]);
    assert_eq!(pair.events[A][0].0, Duration::from_millis(16 * 6144));
    for (index, (at, _)) in pair.sent[A].iter().enumerate() {
        assert_eq!(*at, Duration::from_millis(index as u64 * 6144));
    }
    assert_eq!(pair.cms[A].connection_count(), 0);
}

#[test]
fn lost_replies_make_both_sides_unreachable() {
    // Only B → A is cut: B sees the REQ and accepts, A never sees the REP.
    let mut pair = Pair::new(7, [0, 100]);
    pair.connect();
    assert!(pair.drive_until(MINUTE * 5, |p| {
        p.saw(A, |e| matches!(e, CmEvent::Unreachable { .. }))
            && p.saw(B, |e| matches!(e, CmEvent::Unreachable { .. }))
    }));
    // B resent its REP every 2^(20-8) ms, as often as the REQ's MaxCMRetries (15) allows;
    // A's duplicate REQs meanwhile did not make B create a second connection.
    let (b_gave_up, CmEvent::Unreachable { .. }) = pair.events[B][1] else {
        panic!("{:?}", pair.event_names(B))
    };
    assert_eq!(b_gave_up, Duration::from_millis(1 + 16 * 4096));
    let reps_before = pair.sent[B]
        .iter()
        .filter(|(at, _)| *at < b_gave_up)
        .count();
    assert_eq!(reps_before, 16);
    assert_eq!(pair.event_names(B)[..2], ["ConnectRequest", "Unreachable"]);
}

#[test]
fn slow_acceptor_sends_mra_and_the_requester_waits() {
    let mut pair = Pair::new(8, [0, 0]);
    pair.on_request = OnRequest::Wait;
    pair.connect();
    // The first resent REQ finds B undecided: B answers with an MRA.
    assert!(pair.drive_until(MINUTE, |p| p.sent_names(B).contains(&"CM_MRA")));
    let Message::Mra(mra) = pair.sent[B][0].1.message else {
        panic!()
    };
    assert_eq!(mra.service_timeout, 24);
    // A now waits 2^(24-8) + 2^(19-8) ms before resending instead of 6144 ms.
    let mra_at = pair.elapsed();
    assert!(pair.drive_until(MINUTE * 3, |p| p.sent_names(B).len() == 2));
    assert_eq!(pair.sent_names(A), ["CM_REQ"; 3]);
    let third_req_at = pair.sent[A][2].0;
    assert_eq!(
        third_req_at - mra_at,
        Duration::from_millis(1 + 65536 + 2048)
    );
    // That REQ got the MRA again; accepting now completes the connection.
    assert_eq!(pair.sent_names(B), ["CM_MRA", "CM_MRA"]);
    pair.accept();
    pair.flush();
    assert!(pair.drive_until(pair.elapsed() + MINUTE, Pair::both_established));
}

#[test]
fn a_repeated_req_during_timewait_is_stale() {
    let mut pair = Pair::new(9, [0, 0]);
    pair.connect();
    assert!(pair.drive_until(MINUTE, Pair::both_established));
    let conn = pair.conn[A].unwrap();
    pair.cms[A].disconnect(pair.now, conn, &[]).unwrap();
    pair.flush();
    assert!(
        pair.drive_until(MINUTE, |p| p.cms[B].state(p.conn[B].unwrap())
            == Some(ConnState::TimeWait))
    );
    // A's original REQ, replayed to B while B still remembers the connection.
    let (_, old_req) = pair.sent[A][0];
    let mut bytes = [0; mad::MAD_LEN];
    old_req.emit(&mut mad::Packet::new_unchecked(&mut bytes[..]));
    let (local, remote) = (pair.gids[B], pair.gids[A]);
    pair.cms[B].handle_mad(pair.now, local, remote, &bytes);
    let reply = pair.cms[B].poll_transmit().unwrap();
    let repr = wire_cm::Repr::parse(&mad::Packet::new_checked(&reply.mad[..]).unwrap()).unwrap();
    let Message::Rej(rej) = repr.message else {
        panic!("{repr}")
    };
    assert_eq!(rej.reason, RejectReason::STALE_CONNECTION);
    let Message::Req(req) = old_req.message else {
        panic!()
    };
    assert_eq!(rej.remote_comm_id, req.local_comm_id);
    assert_eq!(pair.cms[B].stats().stale, 1);
    assert!(pair.cms[B].poll_event().is_none());
}

#[test]
fn a_req_from_a_qp_still_connected_is_stale() {
    let mut pair = Pair::new(10, [0, 0]);
    pair.connect();
    assert!(pair.drive_until(MINUTE, Pair::both_established));
    // The same QP of A asks again under a new communication ID (A lost its state).
    let (_, old_req) = pair.sent[A][0];
    let Message::Req(mut req) = old_req.message else {
        panic!()
    };
    req.local_comm_id ^= 0x5555;
    let mut bytes = [0; mad::MAD_LEN];
    wire_cm::Repr {
        transaction_id: 7,
        message: Message::Req(req),
    }
    .emit(&mut mad::Packet::new_unchecked(&mut bytes[..]));
    let (local, remote) = (pair.gids[B], pair.gids[A]);
    pair.cms[B].handle_mad(pair.now, local, remote, &bytes);
    let reply = pair.cms[B].poll_transmit().unwrap();
    let repr = wire_cm::Repr::parse(&mad::Packet::new_checked(&reply.mad[..]).unwrap()).unwrap();
    assert!(
        matches!(repr.message, Message::Rej(rej) if rej.reason == RejectReason::STALE_CONNECTION)
    );
    assert_eq!(repr.transaction_id, 7);
}

#[test]
fn sidr_resolves_a_ud_service_and_reports_a_missing_one() {
    for loss in [0, 30] {
        let mut pair = Pair::new(11 + u64::from(loss), [loss, loss]);
        pair.cms[B].listen(UDP_SERVICE, 4).unwrap();
        let conn = pair.cms[A]
            .resolve_service(pair.now, UDP_SERVICE, gid(1), gid(2), b"udp")
            .unwrap();
        pair.flush();
        assert!(pair.drive_until(MINUTE, |p| p
            .saw(B, |e| matches!(e, CmEvent::SidrRequest { .. }))));
        let (
            _,
            CmEvent::SidrRequest {
                conn: request,
                service_id,
                local_gid,
                remote_gid,
                private_data,
            },
        ) = pair.events[B][0]
        else {
            panic!()
        };
        assert_eq!(service_id, UDP_SERVICE);
        assert_eq!((local_gid, remote_gid), (gid(2), gid(1)));
        assert_eq!(&private_data[..3], b"udp");
        let reply = SidrReply {
            status: SidrStatus::SUCCESS,
            qpn: 0x42,
            qkey: 0x0123_4567,
        };
        pair.cms[B]
            .sidr_reply(pair.now, request, &reply, b"ok")
            .unwrap();
        pair.flush();
        assert!(
            pair.drive_until(MINUTE * 5, |p| !p.events[A].is_empty()),
            "loss {loss}"
        );
        let (
            _,
            CmEvent::SidrResolved {
                conn: resolved,
                qpn,
                qkey,
                ..
            },
        ) = pair.events[A][0]
        else {
            panic!("{:?}", pair.events[A])
        };
        assert_eq!((resolved, qpn, qkey), (conn, 0x42, 0x0123_4567));
        assert_eq!(
            pair.event_names(B),
            ["SidrRequest"],
            "loss {loss}: one request despite resends"
        );
    }

    let mut pair = Pair::new(13, [0, 0]);
    pair.cms[A]
        .resolve_service(pair.now, UDP_SERVICE, gid(1), gid(2), &[])
        .unwrap();
    pair.flush();
    assert!(pair.drive_until(MINUTE, |p| !p.events[A].is_empty()));
    assert!(matches!(
        pair.events[A][0].1,
        CmEvent::SidrRejected {
            status: SidrStatus::UNSUPPORTED,
            ..
        }
    ));
}

#[test]
fn private_data_longer_than_the_field_is_refused_before_anything_is_sent() {
    let now = Instant::now();
    let mut cm = Cm::new(config(A));
    let longest = [7; wire_cm::req::PRIVATE_DATA_LEN];
    assert_eq!(
        cm.connect(
            now,
            &connect_params(),
            &[7; wire_cm::req::PRIVATE_DATA_LEN + 1]
        ),
        Err(CmError::PrivateDataTooLong)
    );
    assert_eq!(
        cm.resolve_service(
            now,
            UDP_SERVICE,
            gid(1),
            gid(2),
            &[7; wire_cm::sidr_req::PRIVATE_DATA_LEN + 1]
        ),
        Err(CmError::PrivateDataTooLong)
    );
    assert_eq!(cm.connection_count(), 0);
    assert!(cm.poll_transmit().is_none());
    assert!(cm.connect(now, &connect_params(), &longest).is_ok());
    assert_eq!(cm.connection_count(), 1);
    let sent = cm.poll_transmit().expect("the REQ");
    let Message::Req(req) = parse(&sent.mad).message else {
        panic!("not a REQ");
    };
    assert_eq!(req.private_data, longest);
}

#[test]
fn hostile_input_is_counted_and_bounded() {
    let mut cm = Cm::new(CmConfig {
        max_connections: 64,
        ..config(B)
    });
    cm.listen(SERVICE, 8).unwrap();
    let now = Instant::now();
    let mut rng = ChaCha12Rng::seed_from_u64(99);
    // Noise of every length, and MADs with a CM header and random contents.
    for len in 0..600 {
        let mut bytes = vec![0; len % 300];
        rng.fill_bytes(&mut bytes);
        if bytes.len() >= mad::MAD_LEN && len % 2 == 0 {
            bytes[..4].copy_from_slice(&[1, wire_cm::MGMT_CLASS, wire_cm::CLASS_VERSION, 3]);
            bytes[16..18].copy_from_slice(&(0x10 + (len % 9) as u16).to_be_bytes());
        }
        cm.handle_mad(now, gid(2), gid(1), &bytes);
        cm.handle_timeout(now);
    }
    // A flood of REQs with distinct communication IDs and QPs: the backlog holds 8.
    let req = rping_mad(0);
    for index in 0..1000u32 {
        let mut bytes = req;
        bytes[24..28].copy_from_slice(&index.to_be_bytes());
        bytes[56..59].copy_from_slice(&index.to_be_bytes()[1..]);
        cm.handle_mad(now, gid(2), gid(1), &bytes);
    }
    let requests = std::iter::from_fn(|| cm.poll_event())
        .filter(|e| matches!(e, CmEvent::ConnectRequest { .. }))
        .count();
    assert_eq!(requests, 8);
    assert_eq!(cm.connection_count(), 8);
    assert_eq!(cm.stats().dropped_full, 1000 - 8);
    assert!(cm.stats().malformed > 0);
    // The table bound holds when the backlog is larger than the table.
    let mut cm = Cm::new(CmConfig {
        max_connections: 64,
        ..config(B)
    });
    cm.listen(SERVICE, 1000).unwrap();
    for index in 0..1000u32 {
        let mut bytes = req;
        bytes[24..28].copy_from_slice(&index.to_be_bytes());
        bytes[56..59].copy_from_slice(&index.to_be_bytes()[1..]);
        cm.handle_mad(now, gid(2), gid(1), &bytes);
    }
    assert_eq!(cm.connection_count(), 64);
    assert_eq!(cm.stats().dropped_full, 1000 - 64);
}

/// The `index`-th MAD of rping_rdmacm.pcap (0 REQ, 1 REP, 2 RTU, 3 DREQ, 4 DREP), its ICRC
/// checked.
fn rping_mad(index: usize) -> [u8; mad::MAD_LEN] {
    static PCAP: &[u8] = include_bytes!("../../tests/captures/rping_rdmacm.pcap");
    let mut offset = 24;
    let mut found = 0;
    while offset + 16 <= PCAP.len() {
        let len = u32::from_le_bytes(PCAP[offset + 8..offset + 12].try_into().unwrap()) as usize;
        let frame_bytes = &PCAP[offset + 16..offset + 16 + len];
        offset += 16 + len;
        match Frame::new_checked(frame_bytes) {
            Ok(frame) if frame.opcode() == Opcode::UdSendOnly => {
                frame.check_icrc().unwrap();
                if found == index {
                    return frame.payload().try_into().unwrap();
                }
                found += 1;
            }
            _ => {}
        }
    }
    panic!("no MAD {index}");
}

fn parse(bytes: &[u8]) -> wire_cm::Repr {
    wire_cm::Repr::parse(&mad::Packet::new_checked(bytes).unwrap()).unwrap()
}

/// rxe's GIDs in the capture: the client 10.88.0.12 sent the REQ to the server 10.88.0.11.
fn capture_gid(last: u8) -> Gid {
    let mut gid = [0; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12..].copy_from_slice(&[10, 88, 0, last]);
    gid
}

#[test]
fn the_kernels_req_gets_a_rep_like_the_kernels() {
    let (client, server) = (capture_gid(12), capture_gid(11));
    let mut cm = Cm::new(CmConfig {
        local_ca_guid: 0x5054_00ff_fe88_000b,
        ..config(B)
    });
    cm.listen(ServiceId::rdma_ip(PortSpace::Tcp, 7174), 4)
        .unwrap();
    let now = Instant::now();
    cm.handle_mad(now, server, client, &rping_mad(0));
    let Some(CmEvent::ConnectRequest { conn, request }) = cm.poll_event() else {
        panic!()
    };
    assert_eq!((request.local_gid, request.remote_gid), (server, client));
    assert_eq!(request.req.local_qpn, 0x1c);

    // rping's server accepts with the parameters the kernel's REP shows.
    let params = AcceptParams {
        qpn: 0x1c,
        sgid_index: 1,
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        srq: false,
        flow_control: false,
    };
    let qp = cm.accept(now, conn, &params, &[]).unwrap();
    let transmit = cm.poll_transmit().unwrap();
    assert_eq!((transmit.local_gid, transmit.remote_gid), (server, client));
    let ours = parse(&transmit.mad);
    let kernels = parse(&rping_mad(1));
    assert_eq!(ours.transaction_id, kernels.transaction_id);
    let (Message::Rep(ours), Message::Rep(mut kernels)) = (ours.message, kernels.message) else {
        panic!()
    };
    // Everything but our own communication ID and starting PSN is what the kernel sent.
    kernels.local_comm_id = ours.local_comm_id;
    kernels.starting_psn = ours.starting_psn;
    assert_eq!(ours, kernels);

    // The QP attributes the kernel CM would set on the server's QP.
    assert_eq!(qp.rtr.dest_qp_num, Some(0x1c));
    // In the capture the server sends from the REQ's starting PSN (its READ is 0x709d4f)
    // and receives from its REP's (the client's first SEND is the REP's PSN).
    assert_eq!(qp.rtr.rq_psn, Some(ours.starting_psn));
    assert_eq!(qp.rtr.path_mtu, Some(PathMtu::Mtu1024));
    assert_eq!(qp.rtr.max_dest_rd_atomic, Some(1));
    let av = qp.rtr.av.unwrap();
    assert_eq!(
        (av.dgid, av.hop_limit, av.flow_label),
        (client, 64, 0x580bb)
    );
    assert_eq!(qp.rts.sq_psn, Some(Psn::new(0x709d4f)));
    assert_eq!(
        (qp.rts.timeout, qp.rts.retry_cnt, qp.rts.rnr_retry),
        (Some(19), Some(7), Some(7))
    );
    assert_eq!(qp.rts.max_rd_atomic, Some(1));

    // The capture's RTU and DREQ, addressed to our communication ID, finish the exchange.
    for index in [2, 3] {
        let mut bytes = rping_mad(index);
        bytes[28..32].copy_from_slice(&conn.0.to_be_bytes());
        cm.handle_mad(now, server, client, &bytes);
    }
    assert_eq!(cm.poll_event(), Some(CmEvent::Established { conn }));
    assert_eq!(cm.poll_event(), Some(CmEvent::Disconnected { conn }));
    let drep = parse(&cm.poll_transmit().unwrap().mad);
    let Message::Drep(drep) = drep.message else {
        panic!()
    };
    assert_eq!(
        (drep.local_comm_id, drep.remote_comm_id),
        (conn.0, 0x6fd0_c1a6)
    );
}

#[test]
fn our_req_is_the_kernels_but_for_identifiers() {
    let mut cm = Cm::new(config(A));
    let params = ConnectParams {
        service_id: ServiceId::rdma_ip(PortSpace::Tcp, 7174),
        local_gid: capture_gid(12),
        remote_gid: capture_gid(11),
        qpn: 0x1c,
        responder_resources: 1,
        initiator_depth: 1,
        flow_control: false,
        flow_label: 0x580bb,
        ..connect_params()
    };
    let kernels = parse(&rping_mad(0));
    let Message::Req(kernels) = kernels.message else {
        panic!()
    };
    cm.connect(Instant::now(), &params, &kernels.private_data)
        .unwrap();
    let Message::Req(ours) = parse(&cm.poll_transmit().unwrap().mad).message else {
        panic!()
    };
    let expected = wire_cm::req::Repr {
        local_comm_id: ours.local_comm_id,
        local_ca_guid: ours.local_ca_guid,
        starting_psn: ours.starting_psn,
        ..kernels
    };
    assert_eq!(ours, expected);
}

#[test]
fn destroying_ids_tells_the_peer() {
    // An unanswered request: the requester is rejected, as by rdma_destroy_id in the kernel.
    let mut pair = Pair::new(14, [0, 0]);
    pair.on_request = OnRequest::Wait;
    pair.connect();
    assert!(pair.drive_until(MINUTE, |p| p.conn[B].is_some()));
    let conn = pair.conn[B].unwrap();
    pair.cms[B].destroy(conn);
    pair.flush();
    assert_eq!(pair.cms[B].connection_count(), 0);
    assert!(pair.drive_until(MINUTE, |p| !p.events[A].is_empty()));
    assert!(matches!(
        pair.events[A][0].1,
        CmEvent::Rejected {
            reason: RejectReason::CONSUMER_DEFINED,
            ..
        }
    ));
    let Message::Rej(rej) = pair.sent[B][0].1.message else {
        panic!()
    };
    assert_eq!(
        rej.local_comm_id, 0,
        "the kernel gives no ID before the answer"
    );

    // An established connection: the peer gets a DREQ and is disconnected.
    let mut pair = Pair::new(15, [0, 0]);
    pair.connect();
    assert!(pair.drive_until(MINUTE, Pair::both_established));
    let conn = pair.conn[A].unwrap();
    pair.cms[A].destroy(conn);
    pair.flush();
    assert!(pair.drive_until(MINUTE, |p| p
        .saw(B, |e| matches!(e, CmEvent::Disconnected { .. }))));
    assert_eq!(pair.sent_names(A).last(), Some(&"CM_DREQ"));
    // A forgot the connection; its DREP is still answered, and nothing is raised on A.
    assert!(pair.drive_until(MINUTE, |p| p.cms[A].stats().unexpected == 1));
    assert_eq!(pair.event_names(A), ["ConnectResponse", "Established"]);
}

#[test]
fn first_packet_establishes_when_the_rtu_is_lost() {
    let mut pair = Pair::new(16, [0, 0]);
    pair.connect();
    // Lose everything A sends from now on: the RTU never arrives.
    assert!(pair.drive_until(MINUTE, |p| p
        .saw(B, |e| matches!(e, CmEvent::ConnectRequest { .. }))));
    pair.loss[A] = 100;
    assert!(pair.drive_until(MINUTE, |p| p
        .saw(A, |e| matches!(e, CmEvent::Established { .. }))));
    let conn = pair.conn[B].unwrap();
    assert_eq!(pair.cms[B].state(conn), Some(ConnState::RepSent));
    // B's QP got its first packet from A's: the verbs layer reports it.
    pair.cms[B].notify_comm_established(conn);
    pair.flush();
    assert_eq!(pair.cms[B].state(conn), Some(ConnState::Established));
    assert_eq!(pair.event_names(B), ["ConnectRequest", "Established"]);
    // And the REP is not resent any more (a resend would be a step within the minute).
    let reps = pair.sent_names(B).len();
    let later = pair.elapsed() + MINUTE;
    pair.drive_until(later, |_| false);
    assert_eq!(pair.sent_names(B).len(), reps);
}

#[test]
fn ipv6_gids_work_as_well() {
    let mut pair = Pair::new(17, [0, 0]);
    let v6 = |last: u8| {
        let mut gid: Gid = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        gid[15] = last;
        gid
    };
    pair.gids = [v6(1), v6(2)];
    let params = ConnectParams {
        local_gid: v6(1),
        remote_gid: v6(2),
        ..connect_params()
    };
    let conn = pair.cms[A].connect(pair.now, &params, &[]).unwrap();
    pair.conn[A] = Some(conn);
    pair.flush();
    assert!(pair.drive_until(MINUTE, Pair::both_established));
    assert_eq!(pair.qp[A].unwrap().rtr.av.unwrap().dgid, v6(2));
    assert_eq!(pair.qp[B].unwrap().rtr.av.unwrap().dgid, v6(1));
}
