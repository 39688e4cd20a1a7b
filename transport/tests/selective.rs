//! Selective repeat between two endpoints of the simulator: the negotiation (and its
//! fallback to go-back-N when the responder does not answer), and recovery that sends
//! again only what was lost: a request, several, a tail, a READ response.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use common::*;
use roce_transport::congestion::CongestionConfig;
use roce_transport::cq::WcStatus;
use roce_transport::qp_state::{PathMtu, QpType};
use roce_transport::sim::{LinkConfig, Sim};
use roce_transport::wr::SendOp;
use roce_wire::{FrameRepr, Opcode};

/// The reserved BTH bit that offers and answers selective repeat.
const SR: u8 = 0x40;

/// Two nodes, A with `offer` and B with `answer` selective repeat, one RC pair A → B.
fn network(offer: bool, answer: bool) -> (Sim, u32, u32) {
    let mut sim = Sim::new(LinkConfig::default(), 11);
    for enabled in [offer, answer] {
        let node = sim.add_node();
        let now = sim.now;
        let config = CongestionConfig {
            selective_repeat: enabled,
            ..CongestionConfig::default()
        };
        sim.nodes[node].endpoint.set_congestion(now, config);
    }
    let pair = sim.connect(A, B, QpType::Rc, PathMtu::Mtu1024, retry(7, 7));
    (sim, pair.a.1, pair.b.1)
}

/// What crossed the network: (from, opcode, PSN, resv7, dropped).
type Wire = Rc<RefCell<Vec<(usize, Opcode, u32, u8, bool)>>>;

/// Records every frame and drops those `drop` picks, shown (from, opcode, PSN, how many
/// times that PSN went from that node before).
fn tap_wire(
    sim: &mut Sim,
    mut drop: impl FnMut(usize, Opcode, u32, usize) -> bool + 'static,
) -> Wire {
    let wire: Wire = Rc::default();
    let log = wire.clone();
    sim.drop_filter = Some(Box::new(move |from, _to, frame: &FrameRepr<'_>| {
        let psn = frame.bth.psn.value();
        let mut log = log.borrow_mut();
        let before = log
            .iter()
            .filter(|f| f.0 == from && f.1 == frame.bth.opcode && f.2 == psn)
            .count();
        let dropped = drop(from, frame.bth.opcode, psn, before);
        log.push((from, frame.bth.opcode, psn, frame.bth.resv7, dropped));
        dropped
    }));
    wire
}

/// Writes `len` bytes from A to B in one WRITE and waits for it; returns B's region key.
fn write(sim: &mut Sim, qa: u32, len: usize) -> u32 {
    let data = pattern(len, 5);
    let src = sim.reg(A, SRC, &data);
    let dst = sim.reg(B, DST, &vec![0; len]);
    let op = SendOp::RdmaWrite {
        remote_addr: DST,
        rkey: dst,
    };
    sim.post_send(A, qa, &signaled(1, op, sge(SRC, len, src)))
        .unwrap();
    let done = wait_send(sim, A, 1);
    assert_eq!(summary(&done), [(1, WcStatus::Success)]);
    assert_eq!(sim.mr_bytes(B, dst), data, "every byte where it belongs");
    dst
}

fn stats(sim: &Sim, node: usize, qpn: u32) -> roce_transport::qp::QpStats {
    sim.nodes[node].endpoint.qp_stats(qpn).unwrap()
}

fn agreed(sim: &mut Sim, qa: u32) -> bool {
    let now = sim.now;
    sim.nodes[A]
        .endpoint
        .qp_rate(now, qa)
        .unwrap()
        .selective_repeat
}

#[test]
fn two_of_ours_agree_and_only_the_first_round_trip_carries_the_offer() {
    let (mut sim, qa, _) = network(true, true);
    let wire = tap_wire(&mut sim, |_, _, _, _| false);
    write(&mut sim, qa, 4 << 10);
    write(&mut sim, qa, 4 << 10);
    assert!(agreed(&mut sim, qa));
    let frames = wire.borrow();
    let requests: Vec<_> = frames.iter().filter(|f| f.0 == A).collect();
    let responses: Vec<_> = frames.iter().filter(|f| f.0 == B).collect();
    // The offer rides on the requests sent before the first ACK came back; the second
    // WRITE's requests carry nothing.
    assert!(requests[..4].iter().all(|f| f.3 == SR), "{requests:?}");
    assert!(requests[4..].iter().all(|f| f.3 == 0), "{requests:?}");
    // The responder marks every response.
    assert!(!responses.is_empty() && responses.iter().all(|f| f.3 == SR));
}

#[test]
fn a_responder_that_does_not_answer_leaves_go_back_n() {
    // A offers, B (as rxe would) ignores the bit: B's ACKs carry nothing, A stops offering
    // and goes back N when a packet is lost.
    let (mut sim, qa, qb) = network(true, false);
    let wire = tap_wire(&mut sim, |from, _, psn, before| {
        from == A && before == 0 && psn % 64 == 10
    });
    write(&mut sim, qa, 64 << 10);
    assert!(!agreed(&mut sim, qa));
    let frames = wire.borrow();
    assert!(frames.iter().filter(|f| f.0 == B).all(|f| f.3 == 0));
    // Everything from the lost packet on went again.
    let sent_again = stats(&sim, A, qa).retransmits;
    assert!(sent_again > 40, "go-back-N: {sent_again}");
    assert_eq!(stats(&sim, B, qb).naks_sent, 1, "one sequence NAK per gap");
}

#[test]
fn without_an_offer_a_responder_of_ours_goes_back_n_too() {
    let (mut sim, qa, _) = network(false, true);
    let wire = tap_wire(&mut sim, |from, _, psn, before| {
        from == A && before == 0 && psn % 64 == 10
    });
    write(&mut sim, qa, 64 << 10);
    assert!(!agreed(&mut sim, qa));
    assert!(
        wire.borrow().iter().all(|f| f.3 == 0),
        "nobody sets the bit"
    );
    assert!(stats(&sim, A, qa).retransmits > 40);
}

#[test]
fn a_lost_request_is_the_only_one_sent_again() {
    let (mut sim, qa, qb) = network(true, true);
    // The 11th packet of a 64-packet WRITE, once.
    let wire = tap_wire(&mut sim, |from, _, psn, before| {
        from == A && before == 0 && psn % 64 == 10
    });
    write(&mut sim, qa, 64 << 10);
    assert_eq!(stats(&sim, A, qa).retransmits, 1);
    let frames = wire.borrow();
    let lost = frames.iter().find(|f| f.4).unwrap().2;
    let again: Vec<_> = frames
        .iter()
        .filter(|f| f.0 == A && f.2 == lost && !f.4)
        .collect();
    assert_eq!(again.len(), 1, "{frames:?}");
    // B kept what came after the gap and named the gap for each of them.
    let b = stats(&sim, B, qb);
    assert!(b.naks_sent > 1 && b.dropped == 0, "{b:?}");
}

#[test]
fn several_losses_and_a_lost_retransmission() {
    let (mut sim, qa, _) = network(true, true);
    // Three packets of a 256 KiB WRITE lost, and the first of them lost again when it is
    // sent the second time: its recovery waits for the ACK timer.
    let _wire = tap_wire(&mut sim, |from, _, psn, before| {
        from == A
            && ((psn % 256 == 5 && before < 2)
                || ((psn % 256 == 70 || psn % 256 == 200) && before == 0))
    });
    write(&mut sim, qa, 256 << 10);
    let a = stats(&sim, A, qa);
    // Four frames lost, each sent again once, and the probe at the ACK timer (the last
    // packet sent, a duplicate that draws the NAK naming the gap).
    assert_eq!(a.retransmits, 5, "{a:?}");
    assert_eq!(a.timeouts, 1, "{a:?}");
}

#[test]
fn a_lost_tail_is_found_by_the_ack_timer() {
    let (mut sim, qa, _) = network(true, true);
    // Until the first response the requester does not know whether its peer keeps
    // out-of-order requests: a first WRITE agrees on it.
    write(&mut sim, qa, 1024);
    assert!(agreed(&mut sim, qa));
    // The last packet of the next WRITE: nothing comes after it to show the gap.
    let _wire = tap_wire(&mut sim, |from, opcode, _, before| {
        from == A && before == 0 && opcode == Opcode::RcRdmaWriteLast
    });
    write(&mut sim, qa, 64 << 10);
    let a = stats(&sim, A, qa);
    assert_eq!((a.retransmits, a.timeouts), (1, 1), "{a:?}");
}

#[test]
fn a_lost_read_response_is_the_only_one_asked_for_again() {
    let (mut sim, qa, qb) = network(true, true);
    let len = 64 << 10;
    let data = pattern(len, 9);
    let remote = sim.reg(B, DST, &data);
    let local = sim.reg(A, SRC, &vec![0; len]);
    // A WRITE first, so that the pair has agreed before the READ.
    write(&mut sim, qa, 1024);
    let wire = tap_wire(&mut sim, |from, opcode, psn, before| {
        from == B
            && before == 0
            && opcode == Opcode::RcRdmaReadResponseMiddle
            && (psn % 64 == 20 || psn % 64 == 40)
    });
    let op = SendOp::RdmaRead {
        remote_addr: DST,
        rkey: remote,
    };
    sim.post_send(A, qa, &signaled(2, op, sge(SRC, len, local)))
        .unwrap();
    let done = wait_send(&mut sim, A, 1);
    assert_eq!(summary(&done), [(2, WcStatus::Success)]);
    assert_eq!(sim.mr_bytes(A, local), data);
    // Two READ requests for one packet each, two responses sent again.
    assert_eq!(stats(&sim, A, qa).retransmits, 2);
    assert_eq!(stats(&sim, B, qb).responses_resent, 2);
    let frames = wire.borrow();
    let responses = frames
        .iter()
        .filter(|f| f.0 == B && f.1 != Opcode::RcAcknowledge)
        .count();
    assert_eq!(responses, 64 + 2, "{frames:?}");
}
