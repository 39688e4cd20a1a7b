//! Two endpoints over AF_XDP on a veth pair between two namespaces: RDMA WRITE, READ and
//! SEND with kernel bypass, native and generic mode, path MTU 1024 (veth MTU 1500) and 4096
//! (MTU 9000: frames of two UMEM chunks). Needs root (CI is root).

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use roce_provider::afxdp::AfXdpBackend;
use roce_provider::backend::Backend;
use roce_provider::netns::{self, needs_root, veth, Netns};
use roce_provider::udp::UdpBackend;
use roce_provider::xdp::XdpMode;
use roce_tests::afxdp_in;
use roce_tests::netcheck::kernel_echoes_udp;
use roce_tests::rdma::write_read_send_with_macs;
use roce_transport::qp_state::PathMtu;
use roce_wire::frame::{EthernetRepr, IpRepr, Ipv4Repr};
use roce_wire::{bth, ExtRepr, Frame, FrameRepr, Opcode, Psn};

#[test]
fn rdma_over_af_xdp_between_namespaces() {
    if !needs_root("rdma_over_af_xdp_between_namespaces") {
        return;
    }
    let runs = [
        (XdpMode::Native, 1500, PathMtu::Mtu1024),
        (XdpMode::Generic, 1500, PathMtu::Mtu1024),
        (XdpMode::Native, 9000, PathMtu::Mtu4096),
        (XdpMode::Generic, 9000, PathMtu::Mtu4096),
    ];
    for (mode, veth_mtu, path_mtu) in runs {
        let a = Netns::create("roce-afxdp-a").unwrap();
        let b = Netns::create("roce-afxdp-b").unwrap();
        veth(
            (&a, "xa", "10.78.0.1/24"),
            (&b, "xb", "10.78.0.2/24"),
            veth_mtu,
        )
        .unwrap();
        let (mac_a, mac_b) = (a.mac("xa").unwrap(), b.mac("xb").unwrap());
        let backend_a = afxdp_in(&a, "xa", mode);
        let backend_b = afxdp_in(&b, "xb", mode);
        let (ip_a, ip_b) = (Ipv4Addr::new(10, 78, 0, 1), Ipv4Addr::new(10, 78, 0, 2));
        let (mut engine_a, mut engine_b) =
            write_read_send_with_macs((backend_a, ip_a, mac_a), (backend_b, ip_b, mac_b), path_mtu);
        assert_eq!(
            (engine_a.stats.rx_rejected, engine_b.stats.rx_rejected),
            (0, 0),
            "{mode:?} {path_mtu:?}"
        );
        // Frames are handed on where they lie; only one whose buffers straddle the fill
        // ring's wrap is copied together first.
        for stats in [engine_a.backend().stats(), engine_b.backend().stats()] {
            assert!(stats.received > 100, "{mode:?} {path_mtu:?} {stats:?}");
            assert!(stats.gathered * 100 <= stats.received, "{mode:?} {stats:?}");
        }
        // The kernel still answers ARP and UDP on the same interface while we hold its RoCE
        // traffic.
        if let Err(error) = kernel_echoes_udp(&a, "10.78.0.1", &b) {
            panic!("{mode:?}: the kernel stopped answering while AF_XDP was attached: {error}");
        }
    }
}

/// A peer on kernel UDP sockets (our UDP backend, as `roce perf` falls back to when the
/// interface's queue is still held by a socket that is closing) sends datagrams an AF_XDP
/// receiver takes as they are on the wire: they must carry a right UDP checksum or none. On
/// veth the kernel leaves a checksum it computes to the device, which never does, so the
/// receiver saw the pseudo-header's partial sum and rejected every frame as malformed
/// (`roce conform` against our servers under load: `observed=MALFORMED`).
#[test]
fn frames_from_the_udp_backend_reach_af_xdp_well_formed() {
    if !needs_root("frames_from_the_udp_backend_reach_af_xdp_well_formed") {
        return;
    }
    let a = Netns::create("roce-udpxdp-a").unwrap();
    let b = Netns::create("roce-udpxdp-b").unwrap();
    veth((&a, "ua", "10.79.0.1/24"), (&b, "ub", "10.79.0.2/24"), 1500).unwrap();
    let (mac_a, mac_b) = (a.mac("ua").unwrap(), b.mac("ub").unwrap());
    let (ip_a, ip_b) = (Ipv4Addr::new(10, 79, 0, 1), Ipv4Addr::new(10, 79, 0, 2));
    let mut receiver = afxdp_in(&a, "ua", XdpMode::Native);
    let name = b.name.clone();
    let mut sender = std::thread::spawn(move || {
        netns::enter(&name)?;
        UdpBackend::bind(ip_b, mac_b)
    })
    .join()
    .expect("binding thread")
    .expect("UDP socket");

    let payload = [0x5A; 64];
    let frame = FrameRepr {
        ethernet: EthernetRepr {
            dst: mac_a,
            src: mac_b,
            vlan: None,
        },
        ip: IpRepr::V4(Ipv4Repr::new(ip_b, ip_a)),
        udp_src_port: 0xC011,
        udp_checksum: false,
        bth: bth::Repr::new(Opcode::RcSendOnly, 0x11, Psn::new(7)),
        ext: ExtRepr::default(),
        payload: &payload,
    };
    let mut bytes = vec![0; frame.buffer_len()];
    frame.emit(&mut bytes).unwrap();
    // The first datagram may wait for ARP; resend until one arrives (bounded).
    let mut received = vec![0; 9000];
    let deadline = Instant::now() + Duration::from_secs(10);
    let len = loop {
        sender.send(&bytes).unwrap();
        receiver.wait(Some(Duration::from_millis(100))).unwrap();
        if let Some(len) = receiver.recv(&mut received).unwrap() {
            break len;
        }
        assert!(Instant::now() < deadline, "no frame from the UDP backend");
    };
    let received = &received[..len];
    let checked = Frame::new_checked(received)
        .and_then(|f| FrameRepr::parse(&f).map(|repr| (repr.bth.opcode, repr.payload.to_vec())));
    assert_eq!(
        checked,
        Ok((Opcode::RcSendOnly, payload.to_vec())),
        "{received:02x?}"
    );
    let udp = 14 + 20;
    assert_eq!(
        received[udp + 6..udp + 8],
        [0, 0],
        "no UDP checksum, as rxe"
    );
}

/// A program restarted on an interface binds the queue its predecessor's socket held: the
/// kernel lets go of a closed socket's queue in deferred work, late on a loaded machine, and
/// until then a bind fails with EBUSY. Opening waits for it (bounded) rather than failing,
/// which made `roce perf` fall back to kernel UDP sockets between `roce conform` runs.
#[test]
fn opening_waits_for_a_queue_that_is_being_let_go() {
    if !needs_root("opening_waits_for_a_queue_that_is_being_let_go") {
        return;
    }
    let a = Netns::create("roce-busy-a").unwrap();
    let b = Netns::create("roce-busy-b").unwrap();
    veth((&a, "ba", "10.80.0.1/24"), (&b, "bb", "10.80.0.2/24"), 1500).unwrap();
    let holder = afxdp_in(&a, "ba", XdpMode::Native);
    let releasing = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(holder);
    });
    let name = a.name.clone();
    let reopened = std::thread::spawn(move || {
        netns::enter(&name)?;
        AfXdpBackend::open("ba", XdpMode::Native)
    })
    .join()
    .expect("opening thread");
    releasing.join().unwrap();
    if let Err(error) = reopened {
        panic!("the queue, let go 300 ms later, was not taken: {error}");
    }
}
