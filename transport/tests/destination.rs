//! Receive checks the destination: a packet whose IP destination is not one of the
//! endpoint's GIDs (another host's address, broadcast) is dropped and counted, never
//! answered, as rxe drops it.

use std::net::{Ipv4Addr, Ipv6Addr};

use roce_transport::cq::WcStatus;
use roce_transport::qp_state::{PathMtu, QpType};
use roce_transport::sim::{LinkConfig, RetryConfig, Sim};
use roce_transport::wr::SendOp;
use roce_wire::frame::{IpRepr, Ipv6Repr};
use roce_wire::{reth, ExtRepr, Opcode};

mod common;
use common::*;

/// What B sends in answer to `frame` (handled directly, bypassing the network), and the
/// misaddressed-drop count it leaves.
fn answers(sim: &mut Sim, frame: &roce_wire::FrameRepr) -> (Vec<Opcode>, u64) {
    let now = sim.now;
    let endpoint = &mut sim.nodes[B].endpoint;
    endpoint.handle_packet(now, frame);
    let mut sent = Vec::new();
    for _ in 0..1000 {
        let Some(transmit) = endpoint.poll_transmit(now) else {
            break;
        };
        sent.push(transmit.packet.bth.opcode);
    }
    (sent, endpoint.misaddressed_drops)
}

/// A completed 4 KiB READ, then forged duplicates of its request: to B's own address one
/// is answered again (so the forgery is a valid duplicate), to another host's IPv4 address,
/// to 255.255.255.255 and to an IPv6 address that is not B's none is.
#[test]
fn duplicate_reads_to_other_addresses_get_no_answer() {
    let mut sim = Sim::new(LinkConfig::default(), 5);
    assert_eq!((sim.add_node(), sim.add_node()), (A, B));
    let pair = sim.connect(A, B, QpType::Rc, PathMtu::Mtu1024, RetryConfig::default());
    let (qa, qb) = (pair.a.1, pair.b.1);
    let log = tap(&mut sim, |_, _| false);
    let back = sim.reg(A, SRC, &[0; 4096]);
    let source = sim.reg(B, DST, &pattern(4096, 9));
    let read = SendOp::RdmaRead {
        remote_addr: DST,
        rkey: source,
    };
    sim.post_send(A, qa, &signaled(1, read, sge(SRC, 4096, back)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::Success)]
    );
    let psn = log
        .borrow()
        .iter()
        .find(|seen| seen.opcode == Opcode::RcRdmaReadRequest)
        .map(|seen| seen.psn)
        .expect("the READ request was sent");
    let ext = ExtRepr {
        reth: Some(reth::Repr {
            virtual_address: DST,
            rkey: source,
            dma_length: 4096,
        }),
        ..ExtRepr::default()
    };
    let bth = forged_bth(Opcode::RcRdmaReadRequest, qb, psn, 0, true);
    let to_b = forged(&sim, A, B, bth, ext, &[]);

    let (sent, drops) = answers(&mut sim, &to_b);
    assert_eq!(sent.len(), 4, "a duplicate READ to B is answered: {sent:?}");
    assert_eq!(drops, 0);

    let with_ipv4 = |dst: Ipv4Addr| {
        let mut frame = to_b;
        if let IpRepr::V4(v4) = &mut frame.ip {
            v4.dst = dst;
        }
        frame
    };
    let other_host = with_ipv4(Ipv4Addr::new(10, 0, 0, 77));
    assert_eq!(answers(&mut sim, &other_host), (vec![], 1));
    let broadcast = with_ipv4(Ipv4Addr::BROADCAST);
    assert_eq!(answers(&mut sim, &broadcast), (vec![], 2));
    let mut ipv6 = to_b;
    ipv6.ip = IpRepr::V6(Ipv6Repr {
        src: sim.nodes[A].ip.to_ipv6_mapped(),
        dst: "fe80::1".parse::<Ipv6Addr>().unwrap(),
        traffic_class: 0,
        flow_label: 0,
        hop_limit: 64,
    });
    assert_eq!(answers(&mut sim, &ipv6), (vec![], 3));
    // Nothing reached the QP: its drop counter did not move either.
    assert_eq!(sim.nodes[B].endpoint.qp_stats(qb).unwrap().dropped, 0);
}
