//! Two endpoints over kernel UDP sockets on loopback (127.0.0.1 and 127.0.0.2, port 4791):
//! the backend that needs neither root nor AF_XDP.

use std::net::Ipv4Addr;

use roce_provider::udp::UdpBackend;
use roce_tests::rdma::{write_read_send, MAC_A, MAC_B};

#[test]
fn rdma_over_kernel_udp_sockets_on_loopback() {
    let (ip_a, ip_b) = (Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2));
    let a = UdpBackend::bind(ip_a, MAC_A).expect("bind 127.0.0.1:4791");
    let b = UdpBackend::bind(ip_b, MAC_B).expect("bind 127.0.0.2:4791");
    let (a, b) = write_read_send(a, ip_a, b, ip_b);
    // Every datagram's ICRC checked out once its IP identification was recovered.
    assert_eq!(
        (a.stats.rx_rejected, b.stats.rx_rejected),
        (0, 0),
        "{:?} {:?}",
        a.stats,
        b.stats
    );
    assert!(a.stats.rx_frames > 500 && b.stats.rx_frames > 500);
}
