//! Two endpoints driven by the provider's engine over the in-memory wire, through the fault
//! injector and the pcap recorder: RDMA with the real clock and real frames.

use std::net::Ipv4Addr;

use roce_provider::capture::{read_frames, PcapRecorder};
use roce_provider::fault::FaultInjector;
use roce_provider::memory::memory_pair;
use roce_tests::rdma::{write_read_send, MAC_B};
use roce_transport::sim::LinkConfig;
use roce_wire::{Frame, FrameRepr};

#[test]
fn rdma_through_the_engine_over_a_faulty_wire() {
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("a.pcap");
    let faults = LinkConfig {
        loss: 0.05,
        reorder: 0.05,
        duplicate: 0.01,
        corrupt: 0.01,
        ..LinkConfig::default()
    };
    let (wire_a, wire_b) = memory_pair();
    let recorded_a = PcapRecorder::create(FaultInjector::new(wire_a, faults, 1), &pcap).unwrap();
    let faulty_b = FaultInjector::new(wire_b, faults, 2);
    let (a, _b) = write_read_send(
        recorded_a,
        Ipv4Addr::new(10, 9, 0, 1),
        faulty_b,
        Ipv4Addr::new(10, 9, 0, 2),
    );

    // The recording: every frame A sent verifies; exactly the frames A's engine rejected fail
    // verification. (A flip can also make a frame look like other traffic: the wire carries
    // nothing else, so those count too.)
    let stats_a = a.stats;
    drop(a);
    let mut bad = 0;
    for frame in read_frames(&pcap).unwrap() {
        let verdict =
            Frame::new_checked(&frame.data[..]).and_then(|f| FrameRepr::parse(&f).map(|_| ()));
        if let Err(error) = verdict {
            assert_eq!(
                frame.data[6..12],
                MAC_B,
                "a frame A sent is damaged: {error}"
            );
            bad += 1;
        }
    }
    assert_eq!(bad, stats_a.rx_rejected + stats_a.rx_other);
    assert!(
        stats_a.rx_rejected > 0,
        "the faults were injected: {stats_a:?}"
    );
}
