//! When a requester asks for an ACK (BTH AckReq): at the end of the last message it can send
//! now, and at least every 32 packets within a burst; the responder answers only those.
//! Asking at every message's end (as rxe does) makes a stream of small WRITEs cost an ACK
//! frame per few WRITEs.

use roce_transport::cq::WcStatus;
use roce_transport::qp_state::{QpAttr, QpState, QpType};
use roce_transport::sim::{RetryConfig, Sim};
use roce_transport::wr::SendOp;
use roce_wire::Opcode;

mod common;
use common::{pair, sge, signaled, tap, Log, A, B};

/// A pair whose frames are logged, and a poster of 64-byte signaled WRITEs from A to B
/// (`wr_id`).
fn writer(retry: RetryConfig) -> (Sim, u32, Log, impl Fn(&mut Sim, u64)) {
    let (mut sim, qa, _) = pair(7, QpType::Rc, retry);
    let log = tap(&mut sim, |_, _| false);
    let src = sim.reg(A, 0x1000, &[0x5a; 64]);
    let dst = sim.reg(B, 0x8000, &[0; 64]);
    let write = SendOp::RdmaWrite {
        remote_addr: 0x8000,
        rkey: dst,
    };
    let post = move |sim: &mut Sim, wr_id: u64| {
        sim.post_send(A, qa, &signaled(wr_id, write, sge(0x1000, 64, src)))
            .unwrap();
    };
    (sim, qa, log, post)
}

/// Posts `count` 64-byte WRITEs from A at once (or, with `one_by_one`, each after the one
/// before completed); the PSN offsets (from the first) of the WRITEs that asked for an
/// ACK, and how many ACKs B sent.
fn writes(count: u64, one_by_one: bool) -> (Vec<u32>, usize) {
    let (mut sim, _, log, post) = writer(RetryConfig::default());
    let mut done = Vec::new();
    for wr_id in 0..count {
        post(&mut sim, wr_id);
        if one_by_one {
            assert!(sim.run_until(10_000, |sim| {
                done.extend(sim.poll_send(A));
                done.len() as u64 == wr_id + 1
            }));
        }
    }
    assert!(sim.run_until(100_000, |sim| {
        done.extend(sim.poll_send(A));
        done.len() as u64 == count
    }));
    assert!(done.iter().all(|wc| wc.status == WcStatus::Success));
    let log = log.borrow();
    let first = log
        .iter()
        .find(|seen| seen.opcode == Opcode::RcRdmaWriteOnly)
        .unwrap()
        .psn;
    let asked = log
        .iter()
        .filter(|seen| seen.from == A && seen.opcode == Opcode::RcRdmaWriteOnly && seen.ack_req)
        .map(|seen| seen.psn.distance(first) as u32)
        .collect();
    let acks = log
        .iter()
        .filter(|seen| seen.from == B && seen.opcode == Opcode::RcAcknowledge)
        .count();
    (asked, acks)
}

#[test]
fn a_burst_of_writes_asks_for_one_ack_at_its_end() {
    assert_eq!(writes(20, false), (vec![19], 1));
}

#[test]
fn a_long_burst_asks_every_32_packets_so_the_window_never_closes() {
    let (asked, acks) = writes(100, false);
    assert_eq!(asked, [31, 63, 95, 99]);
    // B may coalesce those that arrive together.
    assert!((1..=4).contains(&acks), "{acks}");
}

#[test]
fn a_write_with_nothing_behind_it_asks_at_once() {
    let (asked, acks) = writes(5, true);
    assert_eq!(asked, [0, 1, 2, 3, 4]);
    assert_eq!(acks, 5);
}

#[test]
fn reads_and_atomics_ask_even_with_packets_behind_them() {
    let (mut sim, qa, _) = pair(7, QpType::Rc, RetryConfig::default());
    let log = tap(&mut sim, |_, _| false);
    let local = sim.reg(A, 0x1000, &[0; 64]);
    let remote = sim.reg(B, 0x8000, &[0; 64]);
    let ops = [
        SendOp::FetchAdd {
            remote_addr: 0x8000,
            rkey: remote,
            add: 1,
        },
        SendOp::RdmaRead {
            remote_addr: 0x8000,
            rkey: remote,
        },
        SendOp::RdmaWrite {
            remote_addr: 0x8000,
            rkey: remote,
        },
    ];
    for (wr_id, op) in ops.into_iter().enumerate() {
        let len = if wr_id == 0 { 8 } else { 64 };
        sim.post_send(A, qa, &signaled(wr_id as u64, op, sge(0x1000, len, local)))
            .unwrap();
    }
    let mut done = Vec::new();
    assert!(sim.run_until(100_000, |sim| {
        done.extend(sim.poll_send(A));
        done.len() == 3
    }));
    let asked: Vec<_> = log
        .borrow()
        .iter()
        .filter(|seen| seen.from == A)
        .map(|seen| (seen.opcode, seen.ack_req))
        .collect();
    assert_eq!(
        asked,
        [
            (Opcode::RcFetchAdd, true),
            (Opcode::RcRdmaReadRequest, true),
            (Opcode::RcRdmaWriteOnly, true),
        ]
    );
}

/// A burst cut after its first packet (a full ring), then the QP drained (SQD): the packet
/// sent asked for no ACK, and draining sends nothing new that would. With no ACK timeout
/// (0: wait for ever) nothing else would ever complete it.
#[test]
fn draining_after_a_burst_cut_short_still_gets_its_ack() {
    let retry = RetryConfig {
        timeout: 0,
        ..RetryConfig::default()
    };
    let (mut sim, qa, log, post) = writer(retry);
    for wr_id in 0..2 {
        post(&mut sim, wr_id);
    }
    // The first packet leaves alone, as if the ring had room for one; it is lost (so the
    // one resent is what B answers), and the QP goes to SQD.
    let now = sim.now;
    let mut transmit = roce_transport::Transmit::default();
    assert!(sim.nodes[A].endpoint.poll_transmit_lent(now, &mut transmit));
    assert!(
        !transmit.packet.bth.ack_req,
        "another packet follows it at once"
    );
    let sqd = QpAttr {
        state: Some(QpState::Sqd),
        ..QpAttr::default()
    };
    sim.nodes[A].endpoint.modify_qp(now, qa, &sqd).unwrap();
    let mut done = Vec::new();
    assert!(sim.run_until(10_000, |sim| {
        done.extend(sim.poll_send(A));
        !done.is_empty()
    }));
    assert_eq!((done[0].wr_id, done[0].status), (0, WcStatus::Success));
    // Draining started nothing new.
    let writes = log
        .borrow()
        .iter()
        .filter(|seen| seen.from == A && seen.opcode == Opcode::RcRdmaWriteOnly)
        .map(|seen| seen.psn)
        .collect::<Vec<_>>();
    assert_eq!(writes, [transmit.packet.bth.psn]);
}
