//! The verbs API over real interfaces: two programs' worth of verbs calls, each in its own
//! network namespace on one veth pair (MTU 9000), over AF_XDP (found by
//! `BackendChoice::Auto`) and over kernel UDP sockets, over a veth with four queues (a
//! multi-queue NIC: flows spread over queues, and every queue must reach us), and over
//! IPv6 GIDs. Nothing is
//! given by hand but the interface name: the device, its GIDs and path MTU come from the
//! system, and the peer's MAC from a real ARP exchange. Needs root (CI is root).

use std::sync::mpsc::{self, Receiver, Sender};
use std::thread;
use std::time::Duration;

use roce_provider::netns::{self, needs_root, veth_with_queues, Netns};
use roce_transport::wr::signaled;
use roce_verbs::{
    devices, AccessFlags, BackendChoice, BackendKind, ConnectOptions, Context, OpenOptions,
    PathMtu, Progress, QpCaps, QpEndpoint, QpInitAttr, QpType, RecvWr, RetryConfig, SendOp,
    WcOpcode, WcStatus,
};

const STALL: Duration = Duration::from_secs(20);
const LEN: usize = 1 << 20;

fn data(qp: usize) -> Vec<u8> {
    (0..LEN)
        .map(|i| (i * 31 + i / 4099 + qp * 7) as u8)
        .collect()
}

/// What the two sides tell each other, per QP: its endpoint, the target region's address
/// and key.
type Offer = Vec<(QpEndpoint, u64, u32)>;

struct Link {
    tx: Sender<Offer>,
    rx: Receiver<Offer>,
}

fn link() -> (Link, Link) {
    let (a_tx, b_rx) = mpsc::channel();
    let (b_tx, a_rx) = mpsc::channel();
    (Link { tx: a_tx, rx: a_rx }, Link { tx: b_tx, rx: b_rx })
}

/// What a side reports back: its backend, and the frames each receive queue delivered.
type Report = (BackendKind, Vec<u64>);

/// How a run is set up.
#[derive(Clone, Copy)]
struct Setup {
    backend: fn() -> BackendChoice,
    queues: u32,
    qps: usize,
    /// Address both sides over IPv6 (a ULA on each veth end) instead of IPv4.
    ipv6: bool,
}

/// One side, inside namespace `ns`: opens the only device there is, connects `qps` QPs, and
/// either WRITEs 1 MiB and SENDs 4 KiB on each (`active`) or receives and checks.
fn side(ns: String, setup: Setup, active: bool, link: Link) -> Report {
    let (backend, qps) = (setup.backend, setup.qps);
    netns::enter(&ns).unwrap();
    let list = devices().unwrap();
    assert_eq!(list.len(), 1, "one veth end in the namespace: {list:?}");
    let device = &list[0];
    let port = device.query_port();
    // rxe's table: IPv4-mapped at 1; the ULA after it.
    let gid_index = if setup.ipv6 {
        let ula = device
            .gids
            .iter()
            .position(|gid| gid[0] == 0xFD)
            .expect("the ULA's GID");
        ula as u8
    } else {
        1
    };
    assert_eq!(port.active_mtu, PathMtu::Mtu4096, "veth MTU 9000");
    let options = OpenOptions {
        backend: backend(),
        progress: Progress::Events,
        seed: None,
        ..OpenOptions::default()
    };
    let ctx = Context::open(device, options).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16 * qps, None).unwrap();
    let attr = QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: &cq,
        recv_cq: &cq,
        caps: QpCaps::default(),
        sq_sig_all: false,
    };
    let all: Vec<_> = (0..qps)
        .map(|qp| {
            let region = pd.reg_mr(LEN, AccessFlags::all()).unwrap();
            let inbox = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
            if active {
                region.write(0, &data(qp)).unwrap();
            }
            (pd.create_qp(&attr).unwrap(), region, inbox)
        })
        .collect();
    let offer = all
        .iter()
        .map(|(qp, region, _)| {
            let endpoint = qp.endpoint(gid_index).unwrap();
            (endpoint, region.addr(), region.rkey())
        })
        .collect();
    link.tx.send(offer).unwrap();
    let peer = link.rx.recv().unwrap();
    let options = ConnectOptions {
        mtu: port.active_mtu,
        retry: RetryConfig {
            timeout: 12,
            ..RetryConfig::default()
        },
        sgid_index: gid_index,
        ..ConnectOptions::default()
    };
    for ((qp, _, inbox), (remote, _, _)) in all.iter().zip(&peer) {
        // Resolves the peer's MAC through the kernel (ARP, or neighbour discovery).
        qp.connect(remote, &options).unwrap();
        if !active {
            qp.post_recv([RecvWr {
                wr_id: 7,
                sg_list: [inbox.sge(0, 4096)].into(),
            }])
            .unwrap();
        }
    }
    // Both connected (and the receives posted) before anything is sent.
    link.tx.send(Vec::new()).unwrap();
    link.rx.recv().unwrap();
    if active {
        for ((qp, region, _), &(_, peer_addr, peer_rkey)) in all.iter().zip(&peer) {
            let write = SendOp::RdmaWrite {
                remote_addr: peer_addr,
                rkey: peer_rkey,
            };
            qp.post_send([
                signaled(1, write, region.sge(0, LEN as u32)),
                signaled(2, SendOp::Send, region.sge(0, 4096)),
            ])
            .unwrap();
        }
        let done = cq.wait_for(2 * qps, STALL).unwrap();
        assert!(
            done.iter().all(|wc| wc.status == WcStatus::Success),
            "{done:?}"
        );
        // Keep the QPs until the peer has checked everything.
        link.rx.recv().ok();
    } else {
        let got = cq.wait_for(qps, STALL).unwrap();
        for wc in &got {
            assert_eq!(
                (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
                (7, WcStatus::Success, WcOpcode::Recv, 4096)
            );
        }
        // Each QP's WRITE came before its SEND: it is all there.
        for (qp, (_, region, inbox)) in all.iter().enumerate() {
            assert_eq!(region.to_vec().unwrap(), data(qp), "QP {qp}");
            assert_eq!(inbox.to_vec().unwrap(), data(qp)[..4096], "QP {qp}");
        }
        link.tx.send(Vec::new()).unwrap();
    }
    assert_eq!(ctx.stats().unwrap().rx_rejected, 0);
    let counters = ctx.counters().unwrap();
    let (sends, recvs) = if active { (qps, 0) } else { (0, qps) };
    assert_eq!(
        (counters.rdma_sends, counters.rdma_recvs),
        (sends as u64, recvs as u64),
        "{counters:?}"
    );
    assert!(
        counters.sent_pkts > 0 && counters.rcvd_pkts > 0,
        "{counters:?}"
    );
    let per_queue = ctx
        .with_backend(|backend| backend.received_per_queue())
        .unwrap();
    (ctx.backend_kind().clone(), per_queue)
}

fn run_pair(setup: Setup) -> (Report, Report) {
    let a = Netns::create("roce-verbs-a").unwrap();
    let b = Netns::create("roce-verbs-b").unwrap();
    let ends = ((&a, "va", "10.79.0.1/24"), (&b, "vb", "10.79.0.2/24"));
    veth_with_queues(ends.0, ends.1, 9000, setup.queues).unwrap();
    if setup.ipv6 {
        // No duplicate address detection: usable at once.
        a.ip(&["addr", "add", "fd00:79::1/64", "dev", "va", "nodad"])
            .unwrap();
        b.ip(&["addr", "add", "fd00:79::2/64", "dev", "vb", "nodad"])
            .unwrap();
    }
    let (link_a, link_b) = link();
    let (name_a, name_b) = (a.name.clone(), b.name.clone());
    let active = thread::spawn(move || side(name_a, setup, true, link_a));
    let passive = thread::spawn(move || side(name_b, setup, false, link_b));
    let reports = (active.join(), passive.join());
    // The namespaces go on drop, even after a failed side.
    (reports.0.expect("side A"), reports.1.expect("side B"))
}

#[test]
fn verbs_over_af_xdp_with_arp() {
    if !needs_root("verbs_over_af_xdp_with_arp") {
        return;
    }
    let ((a, _), (b, _)) = run_pair(Setup {
        backend: || BackendChoice::Auto,
        queues: 1,
        qps: 1,
        ipv6: false,
    });
    // veth has native XDP: Auto takes it (itself, or through the device's switch, which
    // lends the device to a process alone on it).
    for kind in [a, b] {
        assert!(af_xdp(&kind), "{kind:?}");
    }
}

#[test]
fn verbs_over_kernel_udp_sockets() {
    if !needs_root("verbs_over_kernel_udp_sockets") {
        return;
    }
    let ((a, _), (b, _)) = run_pair(Setup {
        backend: || BackendChoice::Udp,
        queues: 1,
        qps: 1,
        ipv6: false,
    });
    let udp = BackendKind::Udp { fallback: None };
    assert_eq!((a, b), (udp.clone(), udp));
}

#[test]
fn verbs_over_every_queue_of_a_multi_queue_interface() {
    if !needs_root("verbs_over_every_queue_of_a_multi_queue_interface") {
        return;
    }
    let (_, (_, per_queue)) = run_pair(Setup {
        backend: || BackendChoice::Auto,
        queues: 4,
        qps: 4,
        ipv6: false,
    });
    // One socket per queue, and the four QPs' flows arrived on all four of them.
    assert_eq!(per_queue.len(), 4, "{per_queue:?}");
    assert!(per_queue.iter().all(|&frames| frames > 0), "{per_queue:?}");
}

#[test]
fn verbs_over_ipv6_gids() {
    if !needs_root("verbs_over_ipv6_gids") {
        return;
    }
    // Two QPs: RoCEv2 over IPv6 from the ULA GIDs, peers found by neighbour discovery.
    let ((a, _), (b, _)) = run_pair(Setup {
        backend: || BackendChoice::Auto,
        queues: 1,
        qps: 2,
        ipv6: true,
    });
    for kind in [a, b] {
        assert!(af_xdp(&kind), "{kind:?}");
    }
}

/// Native AF_XDP, opened by this process itself or through the device's switch.
fn af_xdp(kind: &BackendKind) -> bool {
    matches!(
        kind,
        BackendKind::AfXdp(roce_verbs::XdpMode::Native) | BackendKind::Switch(_)
    )
}

/// One side of [`an_engine_per_queue_talks_through_its_own_queue`]: a context of its own on
/// each of the two queues, a QP on each, connected to the peer's QP on the same queue; the
/// active side WRITEs 64 KiB on each, the passive side checks them. Reports the frames each
/// context's one socket received.
fn queue_side(ns: String, active: bool, link: Link) -> Vec<Vec<u64>> {
    netns::enter(&ns).unwrap();
    let device = devices().unwrap().remove(0);
    let open = |queue| {
        let options = OpenOptions {
            backend: BackendChoice::AfXdp(roce_verbs::XdpMode::Native),
            queue: Some(queue),
            ..OpenOptions::default()
        };
        Context::open(&device, options).unwrap()
    };
    let contexts = [open(0), open(1)];
    // Both queues are bound by engines of their own: the whole device is not free (at the
    // latest when its data path is claimed, at its first QP, as through the device's switch).
    let whole = OpenOptions {
        backend: BackendChoice::AfXdp(roce_verbs::XdpMode::Native),
        ..OpenOptions::default()
    };
    let whole = Context::open(&device, whole).and_then(|ctx| {
        let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(1, None)?);
        let attr = QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            caps: QpCaps::default(),
            sq_sig_all: false,
        };
        pd.create_qp(&attr).map(drop)
    });
    assert!(whole.is_err(), "a queue bound twice in one process");
    let len = 64 * 1024;
    let sides: Vec<_> = contexts
        .iter()
        .map(|ctx| {
            let pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(16, None).unwrap();
            let attr = QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                caps: QpCaps::default(),
                sq_sig_all: false,
            };
            let qp = pd.create_qp(&attr).unwrap();
            let region = pd.reg_mr(len, AccessFlags::all()).unwrap();
            (pd, cq, qp, region)
        })
        .collect();
    let offer = sides
        .iter()
        .map(|(_, _, qp, region)| (qp.endpoint(1).unwrap(), region.addr(), region.rkey()))
        .collect();
    link.tx.send(offer).unwrap();
    let peer = link.rx.recv().unwrap();
    let options = ConnectOptions {
        mtu: PathMtu::Mtu4096,
        ..ConnectOptions::default()
    };
    for ((_, _, qp, _), (remote, _, _)) in sides.iter().zip(&peer) {
        qp.connect(remote, &options).unwrap();
    }
    link.tx.send(Vec::new()).unwrap();
    link.rx.recv().unwrap();
    if active {
        for (queue, ((_, cq, qp, region), &(_, addr, rkey))) in sides.iter().zip(&peer).enumerate()
        {
            region.write(0, &data(queue)[..len]).unwrap();
            let write = SendOp::RdmaWrite {
                remote_addr: addr,
                rkey,
            };
            qp.post_send([signaled(1, write, region.sge(0, len as u32))])
                .unwrap();
            let done = cq.wait_for(1, STALL).unwrap();
            assert_eq!(done[0].status, WcStatus::Success, "queue {queue}");
        }
        link.tx.send(Vec::new()).unwrap();
    } else {
        link.rx.recv().unwrap();
        for (queue, (_, _, _, region)) in sides.iter().enumerate() {
            assert_eq!(
                region.to_vec().unwrap(),
                data(queue)[..len],
                "queue {queue}"
            );
        }
    }
    contexts
        .iter()
        .map(|ctx| {
            ctx.with_backend(|backend| backend.received_per_queue())
                .unwrap()
        })
        .collect()
}

/// An engine per receive queue (`OpenOptions::queue`): two contexts on each end of a
/// two-queue veth, each with its own engine and one socket, each talking to the peer's
/// engine on the same queue (the veth delivers on the queue the sender used).
#[test]
fn an_engine_per_queue_talks_through_its_own_queue() {
    if !needs_root("an_engine_per_queue_talks_through_its_own_queue") {
        return;
    }
    let a = Netns::create("roce-queues-a").unwrap();
    let b = Netns::create("roce-queues-b").unwrap();
    let ends = ((&a, "qa", "10.78.0.1/24"), (&b, "qb", "10.78.0.2/24"));
    veth_with_queues(ends.0, ends.1, 9000, 2).unwrap();
    let (link_a, link_b) = link();
    let (name_a, name_b) = (a.name.clone(), b.name.clone());
    let active = thread::spawn(move || queue_side(name_a, true, link_a));
    let passive = thread::spawn(move || queue_side(name_b, false, link_b));
    for report in [
        active.join().expect("side A"),
        passive.join().expect("side B"),
    ] {
        // One socket per engine, and each received its queue's frames.
        assert_eq!(report.len(), 2);
        assert!(
            report
                .iter()
                .all(|per_queue| per_queue.len() == 1 && per_queue[0] > 0),
            "{report:?}"
        );
    }
}
