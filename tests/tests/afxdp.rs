//! Two endpoints over AF_XDP on a veth pair between two namespaces: RDMA WRITE, READ and
//! SEND with kernel bypass, native and generic mode, path MTU 1024 (veth MTU 1500) and 4096
//! (MTU 9000: frames of two UMEM chunks). Needs root (CI is root).

use std::net::Ipv4Addr;

use roce_provider::netns::{needs_root, veth, Netns};
use roce_provider::xdp::XdpMode;
use roce_tests::afxdp_in;
use roce_tests::netcheck::kernel_echoes_udp;
use roce_tests::rdma::write_read_send_with_macs;
use roce_transport::qp_state::PathMtu;

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
