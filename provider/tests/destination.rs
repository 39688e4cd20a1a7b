//! The engine gives its endpoint the device's GID table: a RoCEv2 frame to another host's
//! address or to broadcast is dropped as misaddressed before any QP sees it, while the
//! same frame to our address reaches the QP lookup.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use roce_provider::backend::Backend;
use roce_provider::engine::{Addressing, Engine};
use roce_provider::memory::memory_pair;
use roce_transport::Endpoint;
use roce_wire::{bth, reth, ExtRepr, FrameRepr, Opcode, Psn};

const OURS: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

/// A READ request from the peer to `dst` for a QP that does not exist.
fn read_request(dst: Ipv4Addr) -> Vec<u8> {
    let repr = FrameRepr {
        udp_src_port: 0xC011,
        ..FrameRepr::ipv4(
            ([2, 0, 0, 0, 0, 1], PEER),
            ([2, 0, 0, 0, 0, 2], dst),
            bth::Repr {
                ack_req: true,
                resv7: 0,
                ..bth::Repr::new(Opcode::RcRdmaReadRequest, 0x11, Psn::new(0))
            },
            ExtRepr {
                reth: Some(reth::Repr {
                    virtual_address: 0x1000,
                    rkey: 1,
                    dma_length: 1 << 20,
                }),
                ..ExtRepr::default()
            },
            &[],
        )
    };
    let mut bytes = vec![0; repr.buffer_len()];
    repr.emit(&mut bytes).expect("room for the frame");
    bytes
}

#[test]
fn frames_to_other_addresses_are_dropped_as_misaddressed() {
    let (mut wire, ours) = memory_pair();
    let addressing = Addressing {
        mac: [2, 0, 0, 0, 0, 2],
        ip: OURS,
        neighbours: HashMap::from([(PEER, [2, 0, 0, 0, 0, 1])]),
    };
    let mut engine = Engine::new(Endpoint::new([1; 32]), ours, addressing);
    engine.set_gid_table(vec![[0xFE; 16], OURS.to_ipv6_mapped().octets()]);
    let mut deliver = |dst| {
        wire.send(&read_request(dst)).unwrap();
        engine.poll().unwrap();
        let endpoint = engine.endpoint();
        (endpoint.misaddressed_drops, endpoint.unknown_qp_drops)
    };
    assert_eq!(deliver(OURS), (0, 1), "ours: reaches the QP lookup");
    assert_eq!(deliver(Ipv4Addr::new(10, 0, 0, 77)), (1, 1));
    assert_eq!(deliver(Ipv4Addr::BROADCAST), (2, 1));
}
