//! UD multicast through the verbs API and the CM API, between two of our contexts over the
//! in-memory wire: attaching and detaching as uverbs and rxe answer; a datagram sent
//! through an address handle to a group reaching each attached QP of the other context;
//! rdma_cm's join reporting the group's address vector, QPN 0xFFFFFF and the Q_Key, and
//! making our own datagrams to the group loop back until the group is left.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use roce_provider::memory::memory_pair;
use roce_verbs::device::link_local_gid;
use roce_verbs::{
    AccessFlags, AddressVector, Addressing, BackendChoice, CmEvent, CmEventKind, CmId, Context, Cq,
    Device, EventChannel, McastJoin, Mr, OpenOptions, Pd, Progress, Qp, QpCaps, QpInitAttr, QpType,
    RecvWr, SendFlags, SendOp, SendWr, WcStatus, RDMA_UDP_QKEY,
};

const STALL: Duration = Duration::from_secs(20);
/// Long enough for a datagram that is coming to have come.
const QUIET: Duration = Duration::from_millis(300);
const IP_A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const GROUP: Ipv4Addr = Ipv4Addr::new(239, 7, 7, 7);
const LEN: usize = 200;
/// A receive's room: the GRH area and the datagram.
const ROOM: usize = 40 + LEN;

fn gid(ip: Ipv4Addr) -> [u8; 16] {
    ip.to_ipv6_mapped().octets()
}

fn context(wire: roce_provider::memory::MemoryBackend, last: u8, ip: Ipv4Addr) -> Context {
    let mac = [2, 0, 0, 0, 0, last];
    let device = Device {
        name: "mem".into(),
        ifindex: 1,
        mac,
        netdev_mtu: 1500,
        up: true,
        gids: vec![link_local_gid(mac), gid(ip)],
    };
    let options = OpenOptions {
        backend: BackendChoice::Custom(
            Box::new(wire),
            Addressing {
                mac,
                ip,
                neighbours: HashMap::new(),
            },
        ),
        progress: Progress::Events,
        seed: Some([last; 32]),
        ..OpenOptions::default()
    };
    Context::open(&device, options).expect("open")
}

/// One context's objects: a PD, a send and a receive CQ, and UD QPs at RTS with
/// rdma_cm's Q_Key.
struct Side {
    ctx: Context,
    pd: Pd,
    send_cq: Cq,
    recv_cq: Cq,
}

impl Side {
    fn new(ctx: Context) -> Side {
        let pd = ctx.alloc_pd().unwrap();
        let send_cq = ctx.create_cq(64, None).unwrap();
        let recv_cq = ctx.create_cq(64, None).unwrap();
        Side {
            ctx,
            pd,
            send_cq,
            recv_cq,
        }
    }

    fn qp(&self, qp_type: QpType) -> Qp {
        let qp = self
            .pd
            .create_qp(&QpInitAttr {
                qp_type,
                send_cq: &self.send_cq,
                recv_cq: &self.recv_cq,
                caps: QpCaps::default(),
                sq_sig_all: false,
            })
            .unwrap();
        if qp_type == QpType::Ud {
            qp.ready_ud(RDMA_UDP_QKEY).unwrap();
        }
        qp
    }

    /// A receive on `qp` into a region of its own, which is returned (dropping it
    /// deregisters it).
    #[must_use]
    fn receive(&self, qp: &Qp) -> Mr {
        let mr = self.pd.reg_mr(ROOM, AccessFlags::LOCAL_WRITE).unwrap();
        qp.post_recv([RecvWr {
            wr_id: u64::from(qp.qp_num()),
            sg_list: [mr.sge(0, ROOM as u32)].into(),
        }])
        .unwrap();
        mr
    }

    /// Sends `seed`'s bytes from `qp` to the group through an address handle for `av`.
    fn send(&self, qp: &Qp, av: AddressVector, seed: u8) {
        let ah = self.pd.create_ah(av).unwrap();
        qp.post_send([SendWr {
            wr_id: 1,
            op: SendOp::Send,
            sg_list: Default::default(),
            inline_data: payload(seed),
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
            ud: Some(ah.dest(0xFF_FFFF, RDMA_UDP_QKEY)),
            xrc_srqn: 0,
        }])
        .unwrap();
        let sent = self.send_cq.wait_for(1, STALL).unwrap();
        assert_eq!(sent[0].status, WcStatus::Success);
    }

    /// The QP numbers of the receives completed within [`QUIET`].
    fn received(&self) -> Vec<u32> {
        std::thread::sleep(QUIET);
        let mut qpns: Vec<u32> = self
            .recv_cq
            .poll(64)
            .unwrap()
            .iter()
            .map(|wc| {
                assert_eq!(
                    (wc.status, wc.byte_len),
                    (WcStatus::Success, ROOM as u32),
                    "{wc:?}"
                );
                wc.qp_num
            })
            .collect();
        qpns.sort_unstable();
        qpns
    }
}

fn payload(seed: u8) -> Vec<u8> {
    (0..LEN)
        .map(|i| (i as u8).wrapping_mul(13) ^ seed)
        .collect()
}

fn pair() -> (Side, Side) {
    let (wire_a, wire_b) = memory_pair();
    (
        Side::new(context(wire_a, 0xA, IP_A)),
        Side::new(context(wire_b, 0xB, IP_B)),
    )
}

fn to_group(sgid_index: u8) -> AddressVector {
    AddressVector {
        dgid: gid(GROUP),
        sgid_index,
        hop_limit: 64,
        traffic_class: 0,
        flow_label: 0,
    }
}

fn errno<T: std::fmt::Debug>(result: Result<T, roce_verbs::Error>) -> i32 {
    result.unwrap_err().errno()
}

/// uverbs' and rxe's answers: `EINVAL` for an RC QP, a GID that is no group, detaching what
/// is not attached (a pair of GID and LID); attaching a pair twice is no change; the
/// attachments are counted until detached; the limits are rxe's.
#[test]
fn attach_and_detach_answer_as_rdma_core() {
    let (a, _b) = pair();
    let ud = a.qp(QpType::Ud);
    let rc = a.qp(QpType::Rc);
    assert_eq!(errno(rc.attach_mcast(gid(GROUP), 0)), 22);
    assert_eq!(errno(ud.attach_mcast(gid(IP_B), 0)), 22);
    assert_eq!(errno(ud.detach_mcast(gid(GROUP), 0)), 22);
    ud.attach_mcast(gid(GROUP), 0).unwrap();
    ud.attach_mcast(gid(GROUP), 0).unwrap();
    assert_eq!(ud.mcast_attachments(), 1);
    // Another LID names another attachment of the same group.
    ud.attach_mcast(gid(GROUP), 0xC001).unwrap();
    assert_eq!(ud.mcast_attachments(), 2);
    ud.detach_mcast(gid(GROUP), 0xC001).unwrap();
    assert_eq!(errno(ud.detach_mcast(gid(GROUP), 0xC001)), 22);
    // rxe's group is by GID: the QP left it with the first detach, so the second pair's
    // detach finds it gone.
    assert_eq!(errno(ud.detach_mcast(gid(GROUP), 0)), 22);
    assert_eq!(ud.mcast_attachments(), 0);
    let limits = a.ctx.device().query().limits;
    assert_eq!(
        (
            limits.max_mcast_grp,
            limits.max_mcast_qp_attach,
            limits.max_total_mcast_qp_attach
        ),
        (8192, 56, 0x70000)
    );
}

/// Two QPs of B attached to the group both receive A's datagram (sent through an address
/// handle, with no neighbour to resolve); a QP of B not attached does not, nor A's own
/// attached QP (the host is not a member); after a detach only the other QP does.
#[test]
fn a_datagram_reaches_each_attached_qp_of_the_other_side() {
    let (a, b) = pair();
    let sender = a.qp(QpType::Ud);
    let own = a.qp(QpType::Ud);
    own.attach_mcast(gid(GROUP), 0).unwrap();
    let _own_region = a.receive(&own);
    let (first, second, bystander) = (b.qp(QpType::Ud), b.qp(QpType::Ud), b.qp(QpType::Ud));
    first.attach_mcast(gid(GROUP), 0).unwrap();
    second.attach_mcast(gid(GROUP), 0).unwrap();
    let regions: Vec<Mr> = [&first, &first, &second, &second, &bystander]
        .into_iter()
        .map(|qp| b.receive(qp))
        .collect();

    a.send(&sender, to_group(1), 5);
    assert_eq!(b.received(), [first.qp_num(), second.qp_num()]);
    assert!(a.received().is_empty());
    for mr in [&regions[0], &regions[2]] {
        let bytes = mr.to_vec().unwrap();
        assert_eq!(&bytes[40..], &payload(5)[..]);
        assert_eq!(&bytes[20 + 12..20 + 16], &IP_A.octets());
        assert_eq!(&bytes[20 + 16..40], &GROUP.octets());
    }

    first.detach_mcast(gid(GROUP), 0).unwrap();
    a.send(&sender, to_group(1), 6);
    assert_eq!(b.received(), [second.qp_num()]);
    drop(second);
    a.send(&sender, to_group(1), 7);
    assert!(b.received().is_empty());
}

fn event(channel: &EventChannel) -> CmEvent {
    channel.get_cm_event(Some(STALL)).expect("a CM event")
}

/// A UD id of A bound to A's address and resolved towards the group.
fn resolved(channel: &EventChannel) -> CmId {
    let id = channel.create_ud_id().unwrap();
    id.bind_addr(SocketAddr::new(IP_A.into(), 0)).unwrap();
    id.resolve_addr(SocketAddr::new(GROUP.into(), 0)).unwrap();
    let resolved = event(channel);
    assert_eq!((resolved.id, resolved.kind.code()), (id.handle(), 0));
    id
}

fn joined(channel: &EventChannel, id: &CmId) -> McastJoin {
    let heard = event(channel);
    assert_eq!(heard.id, id.handle());
    match heard.kind {
        CmEventKind::MulticastJoin(join) => join,
        other => panic!("{other:?}"),
    }
}

/// rdma_cm's join: the event's address vector is the group's GID from our IPv4 GID (at
/// index 1) with hop limit 64, QPN 0xFFFFFF and RDMA_UDP_QKEY; a full member's own
/// datagrams come back to its attached QP, and reach B's; after the leave they no longer
/// come back. A send-only member's do not.
#[test]
fn a_full_members_join_reports_the_group_and_loops_its_datagrams_back() {
    let (a, b) = pair();
    let channel = a.ctx.create_event_channel().unwrap();
    let id = resolved(&channel);
    let number = id
        .join_multicast(SocketAddr::new(GROUP.into(), 0), false)
        .unwrap();
    let join = joined(&channel, &id);
    assert_eq!(join.join, number);
    assert_eq!(join.ah, to_group(1));
    assert_eq!(
        (join.qp_num, join.qkey, join.send_only),
        (0xFF_FFFF, RDMA_UDP_QKEY, false)
    );
    let qp = a.qp(QpType::Ud);
    qp.attach_mcast(join.ah.dgid, 0).unwrap();
    let remote = b.qp(QpType::Ud);
    remote.attach_mcast(gid(GROUP), 0).unwrap();
    let _regions = (a.receive(&qp), b.receive(&remote));
    a.send(&qp, join.ah, 1);
    assert_eq!(a.received(), [qp.qp_num()]);
    assert_eq!(b.received(), [remote.qp_num()]);

    qp.detach_mcast(join.ah.dgid, 0).unwrap();
    id.leave_multicast(number).unwrap();
    qp.attach_mcast(join.ah.dgid, 0).unwrap();
    let _regions = (a.receive(&qp), b.receive(&remote));
    a.send(&qp, join.ah, 2);
    assert!(a.received().is_empty(), "no member, no loopback");
    assert_eq!(b.received(), [remote.qp_num()]);

    let send_only = resolved(&channel);
    send_only
        .join_multicast(SocketAddr::new(GROUP.into(), 0), true)
        .unwrap();
    assert!(joined(&channel, &send_only).send_only);
    let _regions = (a.receive(&qp), b.receive(&remote));
    a.send(&qp, join.ah, 3);
    assert!(a.received().is_empty(), "a send-only member is no member");
    b.received();
}

/// The kernel's refusals: a join on an RC id, an id with no address of its own, after the
/// route is resolved, or to the wildcard is `EINVAL`; an IPv6 group on RoCEv2 `ENOTSUPP`
/// (524). A leave before the join's event was taken drops the event.
#[test]
fn joins_answer_as_the_kernels_rdma_cm() {
    let (a, _b) = pair();
    let channel = a.ctx.create_event_channel().unwrap();
    let group = SocketAddr::new(GROUP.into(), 0);
    let rc = channel.create_id().unwrap();
    rc.bind_addr(SocketAddr::new(IP_A.into(), 0)).unwrap();
    assert_eq!(errno(rc.join_multicast(group, false)), 22);
    let unbound = channel.create_ud_id().unwrap();
    assert_eq!(errno(unbound.join_multicast(group, false)), 22);
    let routed = resolved(&channel);
    routed.resolve_route().unwrap();
    assert_eq!(event(&channel).kind.code(), 2);
    assert_eq!(errno(routed.join_multicast(group, false)), 22);
    let id = resolved(&channel);
    let wildcard = SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0);
    assert_eq!(errno(id.join_multicast(wildcard, false)), 22);
    let ff12: Ipv6Addr = "ff12::1234".parse().unwrap();
    assert_eq!(
        errno(id.join_multicast(SocketAddr::new(ff12.into(), 0), false)),
        524
    );

    let number = id.join_multicast(group, false).unwrap();
    assert_eq!(id.multicast_joins(), [(number, group)]);
    id.leave_multicast(number).unwrap();
    assert!(id.multicast_joins().is_empty());
    assert!(channel.try_get_cm_event().unwrap().is_none());
    assert_eq!(errno(id.leave_multicast(number)), 22);
}
