//! The verbs API over real interfaces: two programs' worth of verbs calls, each in its own
//! network namespace on one veth pair (MTU 9000), over AF_XDP (found by
//! `BackendChoice::Auto`) and over kernel UDP sockets. Nothing is given by hand but the
//! interface name: the device, its GIDs and path MTU come from the system, and the peer's MAC
//! from a real ARP exchange. Needs root (CI is root).

use std::sync::mpsc::{self, Receiver, Sender};
use std::thread;
use std::time::Duration;

use roce_provider::netns::{self, is_root, veth, Netns};
use roce_verbs::{
    devices, AccessFlags, BackendChoice, BackendKind, ConnectOptions, Context, OpenOptions,
    PathMtu, Progress, QpCaps, QpEndpoint, QpInitAttr, QpType, RecvWr, RetryConfig, SendFlags,
    SendOp, SendWr, WcOpcode, WcStatus,
};

const STALL: Duration = Duration::from_secs(20);
const LEN: usize = 1 << 20;

fn data() -> Vec<u8> {
    (0..LEN).map(|i| (i * 31 + i / 4099) as u8).collect()
}

/// What the two sides tell each other: QP endpoint, then the target region's address and key.
struct Link {
    tx: Sender<(QpEndpoint, u64, u32)>,
    rx: Receiver<(QpEndpoint, u64, u32)>,
}

fn link() -> (Link, Link) {
    let (a_tx, b_rx) = mpsc::channel();
    let (b_tx, a_rx) = mpsc::channel();
    (Link { tx: a_tx, rx: a_rx }, Link { tx: b_tx, rx: b_rx })
}

/// One side, inside namespace `ns`: opens the only device there is, connects, and either
/// WRITEs and SENDs (`active`) or receives and checks. Returns the backend it used.
fn side(ns: String, backend: fn() -> BackendChoice, active: bool, link: Link) -> BackendKind {
    netns::enter(&ns).unwrap();
    let list = devices().unwrap();
    assert_eq!(list.len(), 1, "one veth end in the namespace: {list:?}");
    let device = &list[0];
    let port = device.query_port();
    assert_eq!(port.active_mtu, PathMtu::Mtu4096, "veth MTU 9000");
    let options = OpenOptions {
        backend: backend(),
        progress: Progress::Events,
        seed: None,
        pcap: None,
    };
    let ctx = Context::open(device, options).unwrap();
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
    let region = pd.reg_mr(LEN, AccessFlags::all()).unwrap();
    let inbox = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    if active {
        region.write(0, &data()).unwrap();
    }
    link.tx
        .send((qp.endpoint(1).unwrap(), region.addr(), region.rkey()))
        .unwrap();
    let (peer, peer_addr, peer_rkey) = link.rx.recv().unwrap();
    let options = ConnectOptions {
        mtu: port.active_mtu,
        retry: RetryConfig {
            timeout: 12,
            ..RetryConfig::default()
        },
        ..ConnectOptions::default()
    };
    // Resolves the peer's MAC through the kernel (ARP over the veth).
    qp.connect(&peer, &options).unwrap();
    if !active {
        qp.post_recv([RecvWr {
            wr_id: 7,
            sg_list: vec![inbox.sge(0, 4096)],
        }])
        .unwrap();
    }
    // Both connected (and the receive posted) before anything is sent.
    link.tx.send((peer, 0, 0)).unwrap();
    link.rx.recv().unwrap();
    let signaled = |wr_id, op, sge| SendWr {
        wr_id,
        op,
        sg_list: vec![sge],
        inline_data: Vec::new(),
        flags: SendFlags::SIGNALED,
        ud: None,
    };
    if active {
        let write = SendOp::RdmaWrite {
            remote_addr: peer_addr,
            rkey: peer_rkey,
        };
        qp.post_send([
            signaled(1, write, region.sge(0, LEN as u32)),
            signaled(2, SendOp::Send, region.sge(0, 4096)),
        ])
        .unwrap();
        let done = cq.wait_for(2, STALL).unwrap();
        assert!(
            done.iter().all(|wc| wc.status == WcStatus::Success),
            "{done:?}"
        );
        // Keep the QP until the peer has checked everything.
        link.rx.recv().ok();
    } else {
        let got = cq.wait_for(1, STALL).unwrap();
        assert_eq!(
            (got[0].wr_id, got[0].status, got[0].opcode, got[0].byte_len),
            (7, WcStatus::Success, WcOpcode::Recv, 4096)
        );
        // The WRITE came before the SEND on the same QP: it is all there.
        assert_eq!(region.to_vec().unwrap(), data());
        assert_eq!(inbox.to_vec().unwrap(), data()[..4096]);
        link.tx.send((qp.endpoint(1).unwrap(), 0, 0)).unwrap();
    }
    assert_eq!(ctx.stats().unwrap().rx_rejected, 0);
    ctx.backend_kind().clone()
}

fn run_pair(backend: fn() -> BackendChoice) -> (BackendKind, BackendKind) {
    let a = Netns::create("roce-verbs-a").unwrap();
    let b = Netns::create("roce-verbs-b").unwrap();
    veth((&a, "va", "10.79.0.1/24"), (&b, "vb", "10.79.0.2/24"), 9000).unwrap();
    let (link_a, link_b) = link();
    let (name_a, name_b) = (a.name.clone(), b.name.clone());
    let active = thread::spawn(move || side(name_a, backend, true, link_a));
    let passive = thread::spawn(move || side(name_b, backend, false, link_b));
    let kinds = (active.join(), passive.join());
    // The namespaces go on drop, even after a failed side.
    (kinds.0.expect("side A"), kinds.1.expect("side B"))
}

#[test]
fn verbs_over_af_xdp_with_arp() {
    if !is_root() {
        eprintln!("SKIPPED verbs_over_af_xdp_with_arp: needs root");
        return;
    }
    let (a, b) = run_pair(|| BackendChoice::Auto);
    // veth has native XDP: Auto takes it.
    let native = BackendKind::AfXdp(roce_verbs::XdpMode::Native);
    assert_eq!((a, b), (native.clone(), native));
}

#[test]
fn verbs_over_kernel_udp_sockets() {
    if !is_root() {
        eprintln!("SKIPPED verbs_over_kernel_udp_sockets: needs root (namespaces)");
        return;
    }
    let (a, b) = run_pair(|| BackendChoice::Udp);
    let udp = BackendKind::Udp { fallback: None };
    assert_eq!((a, b), (udp.clone(), udp));
}
