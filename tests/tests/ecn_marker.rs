//! The ECN marker (`roce_provider::ecn_marker`): a tc program on a veth's egress whose
//! virtual queue, with a threshold of 0 and a link of 1 byte/s, is above the threshold at
//! every packet: it marks CE every ECN-capable datagram and none of the others.
//!
//! Needs root and a kernel with tcx (6.6); in CI a missing prerequisite fails the test.

use std::net::UdpSocket;
use std::thread;

use roce_provider::ecn_marker::EcnMarker;
use roce_provider::netns::{needs_root, veth, Netns};

#[test]
fn the_marker_marks_ect_datagrams_above_its_threshold() {
    if !needs_root("the_marker_marks_ect_datagrams_above_its_threshold") {
        return;
    }
    let a = Netns::create("roce-ecn-mark").unwrap();
    let b = Netns::create("roce-ecn-mark-peer").unwrap();
    veth(
        (&a, "em0", "10.87.0.1/24"),
        (&b, "em1", "10.87.0.2/24"),
        1500,
    )
    .unwrap();
    let ifindex = a.ifindex("em0").unwrap();
    let name = a.name.clone();
    let stats = thread::spawn(move || {
        roce_provider::netns::enter(&name).unwrap();
        let marker = EcnMarker::attach(ifindex, 1, 0).unwrap();
        let socket = UdpSocket::bind("10.87.0.1:0").unwrap();
        let before = marker.stats().unwrap();
        for (tos, count) in [(0b10u8, 20), (0, 10), (0b01, 5)] {
            rustix::net::sockopt::set_ip_tos(&socket, tos).unwrap();
            for _ in 0..count {
                socket.send_to(&[0; 64], "10.87.0.2:9").unwrap();
            }
        }
        (before, marker.stats().unwrap())
    })
    .join()
    .unwrap();
    let (before, after) = stats;
    assert_eq!(before.marked, 0);
    // ECT(0) and ECT(1) marked, Not-ECT left alone; ARP goes through it too.
    assert_eq!(after.marked, 25, "{after:?}");
    assert!(after.packets >= 35, "{after:?}");
    assert!(after.queue > 0, "{after:?}");
}
