//! UD multicast in the transport: a datagram to a group reaches every QP of the receiving
//! endpoint attached to it, each checking its own state and Q_Key; detaching, destroying a
//! QP and groups nobody joined; the sender's own attached QPs hear it only when its host is
//! a member of the group; ib_core's and rxe's refusals.

use roce_transport::cq::{WcStatus, WorkCompletion};
use roce_transport::errno;
use roce_transport::mcast::McastError;
use roce_transport::qp::QpCaps;
use roce_transport::qp_state::{AddressVector, QpType};
use roce_transport::sim::{LinkConfig, Sim};
use roce_transport::wr::{SendOp, UdDest};
use roce_wire::multicast::MULTICAST_QPN;
use roce_wire::{ExtRepr, Opcode, Psn};

mod common;
use common::*;

/// 239.1.2.3 as a GID.
const GROUP: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 239, 1, 2, 3];
const QKEY: u32 = 0x0123_4567;
const LEN: usize = 300;
/// Each receiving QP's buffer: the GRH area, then the datagram.
const RECV_LEN: usize = 40 + LEN;

/// A UD QP on `node` at RTS with `qkey`, a receive posted into a buffer of its own at
/// `buffer` (its key returned with it).
fn receiver(sim: &mut Sim, node: usize, qkey: u32, buffer: u64) -> (u32, u32) {
    let qpn = sim.create_qp(node, QpType::Ud, QpCaps::default());
    sim.bring_up_ud(node, qpn, qkey);
    let key = sim.reg(node, buffer, &[0; RECV_LEN]);
    sim.post_recv(
        node,
        qpn,
        &recv_wr(u64::from(qpn), sge(buffer, RECV_LEN, key)),
    )
    .unwrap();
    (qpn, key)
}

/// Sends `payload` from the UD QP `qpn` of `node` to the group, with `qkey`.
fn send_to_group(sim: &mut Sim, node: usize, qpn: u32, payload: &[u8], qkey: u32) {
    let key = sim.reg(node, SRC, payload);
    let mut wr = signaled(1, SendOp::Send, sge(SRC, payload.len(), key));
    wr.ud = Some(UdDest {
        av: AddressVector {
            dgid: GROUP,
            sgid_index: 1,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
        },
        remote_qpn: MULTICAST_QPN,
        remote_qkey: qkey,
    });
    sim.post_send(node, qpn, &wr).unwrap();
}

/// Runs until nothing is left to happen; every receive completion of `node`.
fn received(sim: &mut Sim, node: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    sim.run_until(STEPS, |sim| {
        out.extend(sim.poll_recv(node));
        false
    });
    out
}

fn sorted_qpns(completions: &[WorkCompletion]) -> Vec<u32> {
    let mut qpns: Vec<u32> = completions.iter().map(|wc| wc.qp_num).collect();
    qpns.sort_unstable();
    qpns
}

/// A sender on A; on B two attached QPs with the right Q_Key, one attached with another
/// Q_Key and one with the right Q_Key not attached: the two get the same datagram, the GRH
/// area naming the group as destination, and the datagram counts once.
#[test]
fn a_datagram_reaches_every_attached_qp_whose_qkey_matches() {
    let mut sim = Sim::new(LinkConfig::default(), 21);
    assert_eq!((sim.add_node(), sim.add_node()), (A, B));
    let sender = sim.create_qp(A, QpType::Ud, QpCaps::default());
    sim.bring_up_ud(A, sender, QKEY);
    let (first, first_key) = receiver(&mut sim, B, QKEY, DST);
    let (second, second_key) = receiver(&mut sim, B, QKEY, DST2);
    let (wrong_qkey, _) = receiver(&mut sim, B, 0x1111, 0x30_0000);
    let (unattached, _) = receiver(&mut sim, B, QKEY, 0x40_0000);
    for qpn in [first, second, wrong_qkey] {
        assert_eq!(
            sim.nodes[B].endpoint.attach_mcast(qpn, GROUP),
            Ok(qpn == first)
        );
    }
    let before = sim.nodes[B].endpoint.counters();

    let payload = pattern(LEN, 7);
    send_to_group(&mut sim, A, sender, &payload, QKEY);
    let got = received(&mut sim, B);
    assert_eq!(sorted_qpns(&got), [first, second], "{got:?}");
    for wc in &got {
        assert_eq!(
            (wc.status, wc.byte_len, wc.src_qp),
            (WcStatus::Success, RECV_LEN as u32, sender)
        );
    }
    for key in [first_key, second_key] {
        let bytes = sim.mr_bytes(B, key);
        assert_eq!(&bytes[40..], &payload[..]);
        // The IPv4 header in the last 20 bytes of the GRH area: to 239.1.2.3.
        assert_eq!(&bytes[20 + 16..40], &GROUP[12..]);
    }
    let after = sim.nodes[B].endpoint.counters();
    assert_eq!(after.rcvd_pkts - before.rcvd_pkts, 1);
    let _ = (wrong_qkey, unattached);
    assert_eq!(sim.nodes[B].endpoint.unknown_group_drops, 0);
}

/// Detaching one QP leaves the other; once the last is detached the group is gone and its
/// datagrams are counted as for no group; a destroyed QP leaves its groups.
#[test]
fn detached_and_destroyed_qps_hear_nothing_more() {
    let mut sim = Sim::new(LinkConfig::default(), 22);
    assert_eq!((sim.add_node(), sim.add_node()), (A, B));
    let sender = sim.create_qp(A, QpType::Ud, QpCaps::default());
    sim.bring_up_ud(A, sender, QKEY);
    let (first, _) = receiver(&mut sim, B, QKEY, DST);
    let (second, _) = receiver(&mut sim, B, QKEY, DST2);
    let endpoint = &mut sim.nodes[B].endpoint;
    endpoint.attach_mcast(first, GROUP).unwrap();
    endpoint.attach_mcast(second, GROUP).unwrap();
    assert_eq!(endpoint.detach_mcast(first, GROUP), Ok(false));

    send_to_group(&mut sim, A, sender, &pattern(LEN, 1), QKEY);
    assert_eq!(sorted_qpns(&received(&mut sim, B)), [second]);

    let endpoint = &mut sim.nodes[B].endpoint;
    assert!(endpoint.destroy_qp(second));
    assert_eq!(endpoint.mcast_groups().count(), 0);
    send_to_group(&mut sim, A, sender, &pattern(LEN, 2), QKEY);
    assert!(received(&mut sim, B).is_empty());
    assert_eq!(sim.nodes[B].endpoint.unknown_group_drops, 1);
}

/// The sender's own attached QP hears the sender's datagram only while the host is a
/// member of the group at the IP level, as the kernel loops it back to rxe.
#[test]
fn the_senders_own_qps_hear_it_only_while_the_host_is_a_member() {
    let mut sim = Sim::new(LinkConfig::default(), 23);
    assert_eq!((sim.add_node(), sim.add_node()), (A, B));
    let sender = sim.create_qp(A, QpType::Ud, QpCaps::default());
    sim.bring_up_ud(A, sender, QKEY);
    let (local, _) = receiver(&mut sim, A, QKEY, DST);
    let (remote, _) = receiver(&mut sim, B, QKEY, DST);
    sim.nodes[A].endpoint.attach_mcast(local, GROUP).unwrap();
    sim.nodes[B].endpoint.attach_mcast(remote, GROUP).unwrap();

    send_to_group(&mut sim, A, sender, &pattern(LEN, 3), QKEY);
    assert_eq!(sorted_qpns(&received(&mut sim, B)), [remote]);
    assert!(received(&mut sim, A).is_empty());

    sim.nodes[A].endpoint.set_mcast_loopback(GROUP, true);
    assert!(sim.nodes[A].endpoint.mcast_loopback(&GROUP));
    send_to_group(&mut sim, A, sender, &pattern(LEN, 4), QKEY);
    assert_eq!(sorted_qpns(&received(&mut sim, A)), [local]);
}

/// ib_core's checks (`EINVAL`: a GID that is no group, a QP that is not UD or does not
/// exist, detaching what is not attached) and rxe's attaching twice (no change).
#[test]
fn bad_attachments_are_refused_with_rdma_cores_errno() {
    let mut sim = Sim::new(LinkConfig::default(), 24);
    sim.add_node();
    let ud = sim.create_qp(A, QpType::Ud, QpCaps::default());
    let rc = sim.create_qp(A, QpType::Rc, QpCaps::default());
    let endpoint = &mut sim.nodes[A].endpoint;
    let unicast = std::net::Ipv4Addr::new(10, 0, 0, 9)
        .to_ipv6_mapped()
        .octets();
    let refusals = [
        (endpoint.attach_mcast(ud, unicast), McastError::NotMulticast),
        (endpoint.attach_mcast(rc, GROUP), McastError::NotUd),
        (endpoint.attach_mcast(0xABCD, GROUP), McastError::UnknownQp),
        (endpoint.detach_mcast(ud, GROUP), McastError::NotAttached),
    ];
    for (result, error) in refusals {
        assert_eq!(result, Err(error));
        assert_eq!(error.errno(), errno::EINVAL);
    }
    assert_eq!(endpoint.attach_mcast(ud, GROUP), Ok(true));
    assert_eq!(endpoint.attach_mcast(ud, GROUP), Ok(false));
    assert_eq!(endpoint.detach_mcast(ud, GROUP), Ok(true));
    assert_eq!(
        endpoint.detach_mcast(ud, GROUP),
        Err(McastError::NotAttached)
    );
}

/// A forged RC request to the multicast QPN and the group reaches no attached QP: only UD
/// datagrams are delivered to a group.
#[test]
fn only_ud_datagrams_reach_a_group() {
    let mut sim = Sim::new(LinkConfig::default(), 25);
    assert_eq!((sim.add_node(), sim.add_node()), (A, B));
    let (qpn, _) = receiver(&mut sim, B, QKEY, DST);
    sim.nodes[B].endpoint.attach_mcast(qpn, GROUP).unwrap();
    let bth = forged_bth(Opcode::RcSendOnly, MULTICAST_QPN, Psn::new(0), 4, false);
    let mut frame = forged(&sim, A, B, bth, ExtRepr::default(), &[1, 2, 3, 4]);
    if let roce_wire::frame::IpRepr::V4(v4) = &mut frame.ip {
        v4.dst = std::net::Ipv4Addr::new(239, 1, 2, 3);
    }
    let now = sim.now;
    sim.nodes[B].endpoint.handle_packet(now, &frame);
    assert!(sim.poll_recv(B).is_empty());
    assert_eq!(sim.nodes[B].endpoint.unknown_group_drops, 1);
}
