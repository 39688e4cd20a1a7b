//! The CM API (rdma_cm) between two of our contexts over the in-memory wire: resolve,
//! connect, exchange data on the connected RC QPs, disconnect from either side; a port
//! nobody listens on and a consumer reject give REJECTED; a peer that never answers gives
//! UNREACHABLE, one that vanishes DISCONNECTED, after the CM's (shortened) retries.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use roce_provider::backend::{Backend, Fill};
use roce_provider::memory::{memory_pair, MemoryBackend};
use roce_verbs::device::link_local_gid;
use roce_verbs::{
    AccessFlags, Addressing, BackendChoice, CmEvent, CmEventKind, CmId, CmTiming, ConnParam,
    Context, Cq, Device, EventChannel, OpenOptions, Pd, Progress, Qp, QpCaps, QpInitAttr, QpState,
    QpType, RecvWr, SendFlags, SendOp, SendWr, WcStatus, RDMA_UDP_QKEY,
};

const STALL: Duration = Duration::from_secs(20);
const IP_A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 0xA];
const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 0xB];
const PORT: u16 = 7471;

/// Two contexts with sleeping engine threads, joined by an in-memory wire.
fn pair() -> (Context, Context) {
    pair_with(CmTiming::default(), &Arc::new(AtomicBool::new(false)), true)
}

/// [`pair`] with A's CM timing `timing`, A's end of the wire cut while `cut` is set, and
/// A's MAC in B's neighbour table or not.
fn pair_with(timing: CmTiming, cut: &Arc<AtomicBool>, b_knows_a: bool) -> (Context, Context) {
    let (wire_a, wire_b) = memory_pair();
    let open = |wire: Box<dyn Backend>, seed: u8, (mac, ip), (peer_mac, peer_ip), cm_timing| {
        let known = ip == IP_A || b_knows_a;
        let addressing = Addressing {
            mac,
            ip,
            neighbours: HashMap::from_iter(known.then_some((peer_ip, peer_mac))),
        };
        let options = OpenOptions {
            backend: BackendChoice::Custom(wire, addressing),
            progress: Progress::Events,
            seed: Some([seed; 32]),
            cm_timing,
            ..OpenOptions::default()
        };
        Context::open(&Device::in_memory(mac, ip), options).expect("open")
    };
    let wire_a = Cuttable {
        wire: wire_a,
        cut: Arc::clone(cut),
    };
    (
        open(Box::new(wire_a), 1, (MAC_A, IP_A), (MAC_B, IP_B), timing),
        open(
            Box::new(wire_b),
            2,
            (MAC_B, IP_B),
            (MAC_A, IP_A),
            CmTiming::default(),
        ),
    )
}

/// A wire end that, while `cut` is set, neither sends nor delivers: its peer vanished.
struct Cuttable {
    wire: MemoryBackend,
    cut: Arc<AtomicBool>,
}

impl Backend for Cuttable {
    fn receive(&mut self, budget: usize, handler: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        if self.cut.load(Ordering::Relaxed) {
            return self.wire.receive(budget, &mut |_| {});
        }
        self.wire.receive(budget, handler)
    }

    fn transmit(&mut self, len: usize, flow: u16, fill: Fill<'_>) -> io::Result<()> {
        if self.cut.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.wire.transmit(len, flow, fill)
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.wire.wait(timeout)
    }
}

/// CM timing that gives up after one resend: a REQ or DREQ is sent twice, 2.2 s apart.
const SHORT: CmTiming = CmTiming {
    response_timeout: 10,
    max_retries: 1,
};

#[test]
fn a_peer_that_never_answers_is_unreachable_after_the_cm_retries() {
    let cut = Arc::new(AtomicBool::new(true));
    let (ctx_a, _ctx_b) = pair_with(SHORT, &cut, true);
    let a = side(&ctx_a);
    let id = resolved(&a, PORT);
    id.connect(&a.qp, &ConnParam::default()).unwrap();
    expect(&a.channel, &id, 7);
}

#[test]
fn a_peer_that_vanishes_is_disconnected_after_the_dreq_retries() {
    let cut = Arc::new(AtomicBool::new(false));
    let (ctx_a, ctx_b) = pair_with(SHORT, &cut, true);
    let (a, b) = (side(&ctx_a), side(&ctx_b));
    let listening = listener(&b);
    let (active, _passive) = connect(&a, &b, &listening);
    cut.store(true, Ordering::Relaxed);
    active.disconnect().unwrap();
    expect(&a.channel, &active, 10);
    assert_eq!(a.qp.state().unwrap(), QpState::Err);
}

struct Side {
    channel: EventChannel,
    pd: Pd,
    cq: Cq,
    qp: Qp,
}

fn side(ctx: &Context) -> Side {
    let channel = ctx.create_event_channel().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            caps: QpCaps::default(),
            sq_sig_all: false,
        })
        .unwrap();
    Side {
        channel,
        pd,
        cq,
        qp,
    }
}

fn next(channel: &EventChannel) -> CmEvent {
    channel.get_cm_event(Some(STALL)).expect("a CM event")
}

fn expect(channel: &EventChannel, id: &CmId, code: u32) -> CmEvent {
    let event = next(channel);
    assert_eq!(
        (event.id, event.kind.code()),
        (id.handle(), code),
        "{event:?}"
    );
    event
}

/// Whether `fd` polls readable now.
fn readable(fd: BorrowedFd) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::event::Timespec::try_from(Duration::ZERO).unwrap();
    rustix::event::poll(&mut fds, Some(&zero)).unwrap() == 1
}

/// A's id with its address and route resolved towards B's `port`.
fn resolved(a: &Side, port: u16) -> CmId {
    let id = a.channel.create_id().unwrap();
    id.resolve_addr(SocketAddr::new(IP_B.into(), port)).unwrap();
    assert!(readable(a.channel.as_fd()), "an event waits");
    expect(&a.channel, &id, 0);
    assert!(!readable(a.channel.as_fd()), "taken");
    id.resolve_route().unwrap();
    expect(&a.channel, &id, 2);
    assert_eq!(id.local_addr().map(|addr| addr.ip()), Some(IP_A.into()));
    id
}

fn listener(b: &Side) -> CmId {
    let id = b.channel.create_id().unwrap();
    id.bind_addr(SocketAddr::new(IP_B.into(), PORT)).unwrap();
    id.listen(4).unwrap();
    id
}

/// Connects A to B's listener; returns A's id and B's connection id.
fn connect(a: &Side, b: &Side, listener: &CmId) -> (CmId, CmId) {
    let active = resolved(a, PORT);
    let param = ConnParam {
        private_data: b"hello from A".to_vec(),
        ..ConnParam::default()
    };
    active.connect(&a.qp, &param).unwrap();
    let event = expect(&b.channel, listener, 4);
    let CmEventKind::ConnectRequest(request) = event.kind else {
        unreachable!("code 4 is a connect request")
    };
    assert_eq!(request.private_data.len(), 56);
    assert_eq!(&request.private_data[..12], b"hello from A");
    assert_eq!(request.remote_qpn, a.qp.qp_num());
    assert_eq!(
        request.id.peer_addr().map(|addr| addr.ip()),
        Some(IP_A.into())
    );
    let passive = request.id;
    passive.accept(&b.qp, &ConnParam::default()).unwrap();
    b.qp.post_recv([RecvWr {
        wr_id: 60,
        sg_list: Default::default(),
    }])
    .unwrap();
    expect(&a.channel, &active, 9);
    // A posts as soon as it hears ESTABLISHED (rping does): its QP is ready by then.
    a.qp.post_send([SendWr {
        wr_id: 51,
        op: SendOp::Send,
        sg_list: Default::default(),
        inline_data: Vec::new(),
        flags: SendFlags::SIGNALED,
        ud: None,
        xrc_srqn: 0,
    }])
    .unwrap();
    expect(&b.channel, &passive, 9);
    assert_eq!(
        a.cq.wait_for(1, STALL).unwrap()[0].status,
        WcStatus::Success
    );
    let received = b.cq.wait_for(1, STALL).unwrap();
    assert_eq!((received[0].wr_id, received[0].byte_len), (60, 0));
    assert_eq!(a.qp.state().unwrap(), QpState::Rts);
    assert_eq!(b.qp.state().unwrap(), QpState::Rts);
    (active, passive)
}

/// A SEND of 5000 bytes from `from` to `to` on their connected QPs.
fn send(from: &Side, to: &Side, seed: u8) {
    let data: Vec<u8> = (0..5000u32)
        .map(|i| (i as u8).wrapping_mul(7) ^ seed)
        .collect();
    let src = from
        .pd
        .reg_mr(data.len(), AccessFlags::LOCAL_WRITE)
        .unwrap();
    src.write(0, &data).unwrap();
    let dst = to.pd.reg_mr(data.len(), AccessFlags::LOCAL_WRITE).unwrap();
    to.qp
        .post_recv([RecvWr {
            wr_id: 2,
            sg_list: [dst.sge(0, 5000)].into(),
        }])
        .unwrap();
    from.qp
        .post_send([SendWr {
            wr_id: 1,
            op: SendOp::Send,
            sg_list: [src.sge(0, 5000)].into(),
            inline_data: Vec::new(),
            flags: SendFlags::SIGNALED,
            ud: None,
            xrc_srqn: 0,
        }])
        .unwrap();
    let sent = from.cq.wait_for(1, STALL).unwrap();
    assert_eq!(sent[0].status, WcStatus::Success);
    let received = to.cq.wait_for(1, STALL).unwrap();
    assert_eq!(
        (received[0].status, received[0].byte_len),
        (WcStatus::Success, 5000)
    );
    assert_eq!(dst.to_vec().unwrap(), data);
}

fn connect_exchange_disconnect(a_disconnects: bool) {
    let (ctx_a, ctx_b) = pair();
    let (mut a, b) = (side(&ctx_a), side(&ctx_b));
    // A's QP as rdma_create_qp makes it: in INIT before the connect.
    let for_qp = a.channel.create_id().unwrap();
    a.qp = for_qp
        .create_qp(
            &a.pd,
            &QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &a.cq,
                recv_cq: &a.cq,
                caps: QpCaps::default(),
                sq_sig_all: false,
            },
        )
        .unwrap();
    assert_eq!(a.qp.state().unwrap(), QpState::Init);
    let listening = listener(&b);
    let (active, passive) = connect(&a, &b, &listening);
    send(&a, &b, 1);
    send(&b, &a, 2);
    if a_disconnects {
        active.disconnect().unwrap();
    } else {
        passive.disconnect().unwrap();
    }
    expect(&a.channel, &active, 10);
    expect(&b.channel, &passive, 10);
    assert_eq!(a.qp.state().unwrap(), QpState::Err);
    assert_eq!(b.qp.state().unwrap(), QpState::Err);
}

#[test]
fn connect_exchange_and_disconnect_from_the_active_side() {
    connect_exchange_disconnect(true);
}

#[test]
fn connect_exchange_and_disconnect_from_the_passive_side() {
    connect_exchange_disconnect(false);
}

#[test]
fn a_port_nobody_listens_on_is_rejected() {
    let (ctx_a, ctx_b) = pair();
    let (a, b) = (side(&ctx_a), side(&ctx_b));
    let _listening = listener(&b);
    let id = resolved(&a, PORT + 1);
    id.connect(&a.qp, &ConnParam::default()).unwrap();
    let event = expect(&a.channel, &id, 8);
    assert!(
        matches!(event.kind, CmEventKind::Rejected { reason: 8, .. }),
        "{event:?}"
    );
    assert!(b.channel.try_get_cm_event().unwrap().is_none());
}

/// B has no neighbour entry for A: it learns A's MAC from the REQ's frame and its REJ
/// reaches A (with short CM timing, A would otherwise hear UNREACHABLE).
#[test]
fn a_req_from_an_unknown_neighbour_is_answered() {
    let (ctx_a, ctx_b) = pair_with(SHORT, &Arc::new(AtomicBool::new(false)), false);
    let (a, _b) = (side(&ctx_a), side(&ctx_b));
    let id = resolved(&a, PORT + 1);
    id.connect(&a.qp, &ConnParam::default()).unwrap();
    let event = expect(&a.channel, &id, 8);
    assert!(
        matches!(event.kind, CmEventKind::Rejected { reason: 8, .. }),
        "{event:?}"
    );
}

#[test]
fn a_consumer_reject_carries_its_private_data() {
    let (ctx_a, ctx_b) = pair();
    let (a, b) = (side(&ctx_a), side(&ctx_b));
    let listening = listener(&b);
    let id = resolved(&a, PORT);
    id.connect(&a.qp, &ConnParam::default()).unwrap();
    let CmEventKind::ConnectRequest(request) = expect(&b.channel, &listening, 4).kind else {
        unreachable!("code 4 is a connect request")
    };
    request.id.reject(b"busy").unwrap();
    let event = expect(&a.channel, &id, 8);
    match event.kind {
        CmEventKind::Rejected {
            reason,
            private_data,
        } => {
            assert_eq!(reason, 28);
            assert_eq!(&private_data[..4], b"busy");
        }
        other => panic!("expected a reject, got {other:?}"),
    }
}

#[test]
fn an_unresolvable_peer_is_an_address_error() {
    let (ctx_a, _ctx_b) = pair();
    let a = side(&ctx_a);
    let id = a.channel.create_id().unwrap();
    // No neighbour entry for this address on the in-memory wire.
    id.resolve_addr(SocketAddr::new(Ipv4Addr::new(10, 0, 0, 9).into(), PORT))
        .unwrap();
    let event = expect(&a.channel, &id, 1);
    assert!(
        matches!(event.kind, CmEventKind::AddrError(errno) if errno < 0),
        "{event:?}"
    );
    id.resolve_route().unwrap();
    expect(&a.channel, &id, 3);
    let error = id.connect(&a.qp, &ConnParam::default()).unwrap_err();
    assert_eq!(error.errno(), 22);
}

/// A channel of no device hears ids of both contexts (as rdma_cm's), and an id migrated to
/// another channel is heard there from then on, its QP still connected by the CM.
#[test]
fn a_channel_spans_devices_and_migrated_ids_report_to_their_new_channel() {
    let (ctx_a, ctx_b) = pair();
    let (a, b) = (side(&ctx_a), side(&ctx_b));
    let shared = EventChannel::new().unwrap();
    let listener = ctx_b.create_id(&shared).unwrap();
    listener
        .bind_addr(SocketAddr::new(IP_B.into(), PORT))
        .unwrap();
    listener.listen(4).unwrap();
    let active = ctx_a.create_id(&shared).unwrap();
    active
        .resolve_addr(SocketAddr::new(IP_B.into(), PORT))
        .unwrap();
    expect(&shared, &active, 0);

    let moved = EventChannel::new().unwrap();
    active.migrate(&moved).unwrap();
    active.resolve_route().unwrap();
    expect(&moved, &active, 2);
    assert!(!readable(shared.as_fd()), "nothing for the old channel");

    active.connect(&a.qp, &ConnParam::default()).unwrap();
    let event = expect(&shared, &listener, 4);
    let CmEventKind::ConnectRequest(request) = event.kind else {
        unreachable!("code 4 is a connect request")
    };
    request.id.accept(&b.qp, &ConnParam::default()).unwrap();
    expect(&moved, &active, 9);
    expect(&shared, &request.id, 9);
    assert_eq!(a.qp.state().unwrap(), QpState::Rts);
}

/// A UD id of A resolved towards B's `port`.
fn resolved_ud(a: &Side, port: u16) -> CmId {
    let id = a.channel.create_ud_id().unwrap();
    id.resolve_addr(SocketAddr::new(IP_B.into(), port)).unwrap();
    expect(&a.channel, &id, 0);
    id.resolve_route().unwrap();
    expect(&a.channel, &id, 2);
    id
}

/// UD ids resolve a service with SIDR: the listener hears a connect request with the
/// private data and answers with its UD QP (moved with the id's own attributes, Q_Key
/// RDMA_UDP_QKEY); the requester hears ESTABLISHED with that QP, its Q_Key and the
/// address to send to. A port nobody listens on, and a reject, are UNREACHABLE with the
/// SIDR_REP's status.
#[test]
fn ud_ids_resolve_a_service_with_sidr() {
    let (ctx_a, ctx_b) = pair();
    let (a, b) = (side(&ctx_a), side(&ctx_b));
    let listener = b.channel.create_ud_id().unwrap();
    listener
        .bind_addr(SocketAddr::new(IP_B.into(), PORT))
        .unwrap();
    listener.listen(4).unwrap();
    let ud_qp =
        b.pd.create_qp(&QpInitAttr {
            qp_type: QpType::Ud,
            send_cq: &b.cq,
            recv_cq: &b.cq,
            caps: QpCaps::default(),
            sq_sig_all: false,
        })
        .unwrap();

    let active = resolved_ud(&a, PORT);
    active.connect_ud(b"udp hello").unwrap();
    let event = expect(&b.channel, &listener, 4);
    let CmEventKind::ConnectRequest(request) = event.kind else {
        panic!("{event:?}")
    };
    assert!(request.id.is_ud());
    assert!(request.private_data.starts_with(b"udp hello"));
    for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
        let attr = request.id.qp_attr(state).unwrap();
        if state == QpState::Init {
            assert_eq!(attr.qkey, Some(RDMA_UDP_QKEY));
        }
        ud_qp.modify(&attr).unwrap();
    }
    request
        .id
        .accept_ud(ud_qp.qp_num(), b"udp welcome")
        .unwrap();
    let event = expect(&a.channel, &active, 9);
    let CmEventKind::UdEstablished(param) = event.kind else {
        panic!("{event:?}")
    };
    assert_eq!((param.qp_num, param.qkey), (ud_qp.qp_num(), RDMA_UDP_QKEY));
    assert!(param.private_data.starts_with(b"udp welcome"));
    let to = active.ud_address().unwrap();
    assert_eq!(to.dgid, IP_B.to_ipv6_mapped().octets());

    let nobody = resolved_ud(&a, PORT + 1);
    nobody.connect_ud(&[]).unwrap();
    let event = expect(&a.channel, &nobody, 7);
    assert!(
        matches!(event.kind, CmEventKind::UdUnreachable(1)),
        "{event:?}"
    );

    let refused = resolved_ud(&a, PORT);
    refused.connect_ud(&[]).unwrap();
    let CmEventKind::ConnectRequest(request) = expect(&b.channel, &listener, 4).kind else {
        panic!("a request")
    };
    request.id.reject(&[]).unwrap();
    let event = expect(&a.channel, &refused, 7);
    assert!(
        matches!(event.kind, CmEventKind::UdUnreachable(2)),
        "{event:?}"
    );
}

/// [`pair`] whose devices have two IPv6 GIDs each besides rxe's first two: fd00::a and
/// fd01::a on A, fd00::b and fd01::b on B, each side knowing the other's MAC for them.
fn pair_with_ipv6() -> (Context, Context) {
    let (wire_a, wire_b) = memory_pair();
    let open = |wire, seed: u8, (mac, ip, host), (peer_mac, peer_host)| {
        let mut device = Device::in_memory(mac, ip);
        for net in ["fd00", "fd01"] {
            let ours: Ipv6Addr = format!("{net}::{host}").parse().unwrap();
            device.gids.push(ours.octets());
        }
        let addressing = Addressing {
            mac,
            ip,
            neighbours: HashMap::new(),
        };
        let options = OpenOptions {
            backend: BackendChoice::Custom(Box::new(wire), addressing),
            progress: Progress::Events,
            seed: Some([seed; 32]),
            ..OpenOptions::default()
        };
        let context = Context::open(&device, options).expect("open");
        for net in ["fd00", "fd01"] {
            let peer = format!("{net}::{peer_host}").parse().unwrap();
            context.add_neighbour6(peer, peer_mac).unwrap();
        }
        context
    };
    (
        open(wire_a, 1, (MAC_A, IP_A, "a"), (MAC_B, "b")),
        open(wire_b, 2, (MAC_B, IP_B, "b"), (MAC_A, "a")),
    )
}

fn v6(text: &str) -> Ipv6Addr {
    text.parse().unwrap()
}

/// An id of A's resolved towards `dst` (address and route).
fn resolved_to(a: &Side, id: &CmId, dst: &str) {
    id.resolve_addr(dst.parse().unwrap()).unwrap();
    expect(&a.channel, id, 0);
    id.resolve_route().unwrap();
    expect(&a.channel, id, 2);
}

#[test]
fn ipv6_ids_use_their_addresses_gids_and_listeners_take_their_families() {
    let (ctx_a, ctx_b) = pair_with_ipv6();
    let (a, b) = (side(&ctx_a), side(&ctx_b));
    // B listens on the IPv6 wildcard.
    let listening = b.channel.create_id().unwrap();
    listening.bind_addr("[::]:7471".parse().unwrap()).unwrap();
    listening.listen(4).unwrap();
    // A binds its second IPv6 address: its GID is that address, not the first IPv6 GID.
    let active = a.channel.create_id().unwrap();
    active.bind_addr("[fd01::a]:0".parse().unwrap()).unwrap();
    resolved_to(&a, &active, "[fd01::b]:7471");
    let (sgid, dgid) = (v6("fd01::a").octets(), v6("fd01::b").octets());
    assert_eq!(active.gids(), Some((sgid, dgid)));
    active.connect(&a.qp, &ConnParam::default()).unwrap();
    let CmEventKind::ConnectRequest(request) = expect(&b.channel, &listening, 4).kind else {
        unreachable!("code 4 is a connect request")
    };
    // The passive id's addresses come from rdma_cm's header, its GIDs from the REQ's path.
    assert_eq!(
        request.id.local_addr(),
        Some("[fd01::b]:7471".parse().unwrap())
    );
    assert_eq!(
        request.id.peer_addr().map(|addr| addr.ip()),
        Some(v6("fd01::a").into())
    );
    assert_eq!(request.id.gids(), Some((dgid, sgid)));
    let passive = request.id;
    passive.accept(&b.qp, &ConnParam::default()).unwrap();
    expect(&a.channel, &active, 9);
    expect(&b.channel, &passive, 9);
    send(&a, &b, 1);
    send(&b, &a, 2);

    // Unbound, A's source is its address sharing the destination's prefix (fd00::a).
    let unbound = a.channel.create_id().unwrap();
    resolved_to(&a, &unbound, "[fd00::b]:7471");
    assert_eq!(
        unbound.gids(),
        Some((v6("fd00::a").octets(), v6("fd00::b").octets()))
    );
    assert_eq!(
        unbound.local_addr().map(|addr| addr.ip()),
        Some(v6("fd00::a").into())
    );

    // A link-local address names its interface (ifindex 1 here), as the kernel insists.
    let link_local = Ipv6Addr::from(link_local_gid(MAC_A));
    let scoped = a.channel.create_id().unwrap();
    assert!(scoped
        .bind_addr(SocketAddr::V6(SocketAddrV6::new(link_local, 0, 0, 0)))
        .is_err());
    assert!(scoped
        .bind_addr(SocketAddr::V6(SocketAddrV6::new(link_local, 0, 0, 2)))
        .is_err());
    scoped
        .bind_addr(SocketAddr::V6(SocketAddrV6::new(link_local, 0, 0, 1)))
        .unwrap();

    // A listener on the IPv4 wildcard rejects an IPv6 request, consumer defined (28), as
    // the kernel's rdma_cm does.
    let ipv4_only = b.channel.create_id().unwrap();
    ipv4_only
        .bind_addr(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 7472))
        .unwrap();
    ipv4_only.listen(4).unwrap();
    let refused = a.channel.create_id().unwrap();
    resolved_to(&a, &refused, "[fd00::b]:7472");
    let qp =
        a.pd.create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &a.cq,
            recv_cq: &a.cq,
            caps: QpCaps::default(),
            sq_sig_all: false,
        })
        .unwrap();
    refused.connect(&qp, &ConnParam::default()).unwrap();
    // The REJ leaves when B takes its events, and B's program hears nothing of it.
    let deadline = std::time::Instant::now() + STALL;
    let event = loop {
        assert!(b.channel.try_get_cm_event().unwrap().is_none());
        if let Some(event) = a.channel.try_get_cm_event().unwrap() {
            break event;
        }
        assert!(std::time::Instant::now() < deadline, "no reject");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(event.id, refused.handle());
    assert!(
        matches!(event.kind, CmEventKind::Rejected { reason: 28, .. }),
        "{event:?}"
    );
}
