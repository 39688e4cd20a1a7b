//! Two endpoints driven by the provider's engine over the in-memory wire, through the fault
//! injector and the pcap recorder: RDMA with the real clock and real frames.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use roce_provider::capture::{read_frames, PcapRecorder};
use roce_provider::engine::{Addressing, Engine};
use roce_provider::fault::FaultInjector;
use roce_provider::memory::memory_pair;
use roce_transport::cq::WcStatus;
use roce_transport::mr::PdId;
use roce_transport::qp::{QpCaps, QpInit};
use roce_transport::qp_state::{connect_attrs, AddressVector, PathMtu, Peer, QpType, RetryConfig};
use roce_transport::sim::LinkConfig;
use roce_transport::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};
use roce_transport::{AccessFlags, CqId, Endpoint};
use roce_wire::{Frame, FrameRepr, Psn};

const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 0xA];
const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 0xB];
const IP_A: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);

fn addressing(mac: [u8; 6], ip: Ipv4Addr, peer_mac: [u8; 6], peer_ip: Ipv4Addr) -> Addressing {
    Addressing {
        mac,
        ip,
        neighbours: HashMap::from([(peer_ip, peer_mac)]),
    }
}

fn av(ip: Ipv4Addr) -> AddressVector {
    AddressVector {
        dgid: ip.to_ipv6_mapped().octets(),
        sgid_index: 1,
        hop_limit: 64,
        traffic_class: 0,
        flow_label: 0,
    }
}

/// An endpoint with one PD, one CQ and one RC QP in RESET.
struct Side {
    endpoint: Endpoint,
    qpn: u32,
    pd: PdId,
    cq: CqId,
}

fn side(seed: u8) -> Side {
    let mut endpoint = Endpoint::new([seed; 32]);
    let pd = endpoint.mrs().alloc_pd();
    let cq = endpoint.create_cq(1024);
    let init = QpInit {
        pd,
        qp_type: QpType::Rc,
        send_cq: 0,
        recv_cq: 0,
        caps: QpCaps::default(),
        sq_sig_all: false,
    };
    let qpn = endpoint.create_qp(init, cq, cq).unwrap();
    Side {
        endpoint,
        qpn,
        pd,
        cq,
    }
}

impl Side {
    fn connect(&mut self, peer: Peer, sq_psn: Psn) {
        let now = Instant::now();
        for attr in connect_attrs(
            QpType::Rc,
            peer,
            sq_psn,
            PathMtu::Mtu1024,
            RetryConfig::default(),
        ) {
            self.endpoint.modify_qp(now, self.qpn, &attr).unwrap();
        }
    }

    fn register(&mut self, iova: u64, contents: &[u8]) -> u32 {
        let mrs = self.endpoint.mrs();
        let key = mrs
            .reg_mr(self.pd, iova, contents.len(), AccessFlags::all())
            .unwrap();
        mrs.get_mut(key)
            .unwrap()
            .bytes_mut()
            .copy_from_slice(contents);
        key
    }
}

fn signaled(wr_id: u64, op: SendOp, sge: Sge) -> SendWr {
    SendWr {
        wr_id,
        op,
        sg_list: vec![sge],
        inline_data: Vec::new(),
        flags: SendFlags::SIGNALED,
        ud: None,
    }
}

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

    let (mut side_a, mut side_b) = (side(1), side(2));
    let (qa, qb) = (side_a.qpn, side_b.qpn);
    side_a.connect(
        Peer {
            av: av(IP_B),
            qpn: qb,
            psn: Psn::new(200),
        },
        Psn::new(100),
    );
    side_b.connect(
        Peer {
            av: av(IP_A),
            qpn: qa,
            psn: Psn::new(100),
        },
        Psn::new(200),
    );

    let len = 1 << 20;
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
    let src = side_a.register(0x1000_0000, &data);
    let back = side_a.register(0x2000_0000, &vec![0; len]);
    let target = side_b.register(0x3000_0000, &vec![0; len]);
    let inbox = side_b.register(0x4000_0000, &[0; 4096]);
    let now = Instant::now();
    let inbox_sge = Sge {
        addr: 0x4000_0000,
        length: 4096,
        lkey: inbox,
    };
    side_b
        .endpoint
        .post_recv(
            now,
            qb,
            RecvWr {
                wr_id: 9,
                sg_list: vec![inbox_sge],
            },
        )
        .unwrap();
    let whole = |addr, lkey| Sge {
        addr,
        length: len as u32,
        lkey,
    };
    let write = SendOp::RdmaWrite {
        remote_addr: 0x3000_0000,
        rkey: target,
    };
    let read = SendOp::RdmaRead {
        remote_addr: 0x3000_0000,
        rkey: target,
    };
    let hello = Sge {
        addr: 0x1000_0000,
        length: 4096,
        lkey: src,
    };
    let ep_a = &mut side_a.endpoint;
    ep_a.post_send(now, qa, signaled(1, write, whole(0x1000_0000, src)))
        .unwrap();
    ep_a.post_send(now, qa, signaled(2, read, whole(0x2000_0000, back)))
        .unwrap();
    ep_a.post_send(now, qa, signaled(3, SendOp::Send, hello))
        .unwrap();
    let (cq_a, cq_b) = (side_a.cq, side_b.cq);

    let mut a = Engine::new(
        side_a.endpoint,
        recorded_a,
        addressing(MAC_A, IP_A, MAC_B, IP_B),
    );
    let mut b = Engine::new(
        side_b.endpoint,
        faulty_b,
        addressing(MAC_B, IP_B, MAC_A, IP_A),
    );
    let (mut sends, mut recvs) = (Vec::new(), Vec::new());
    // Bounded in rounds and in time; the run takes well under a second.
    let deadline = Instant::now() + Duration::from_secs(60);
    for _ in 0..1_000_000 {
        if (sends.len() == 3 && !recvs.is_empty()) || Instant::now() > deadline {
            break;
        }
        a.run_once(Duration::from_micros(200)).unwrap();
        b.run_once(Duration::from_micros(200)).unwrap();
        a.endpoint().cq(cq_a).poll(16, &mut sends);
        b.endpoint().cq(cq_b).poll(16, &mut recvs);
    }
    let sends: Vec<_> = sends.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        sends,
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    assert_eq!(
        (recvs[0].wr_id, recvs[0].status, recvs[0].byte_len),
        (9, WcStatus::Success, 4096)
    );
    let mrs_b = b.endpoint().mrs();
    assert_eq!(mrs_b.get(target).unwrap().bytes(), &data[..]);
    assert_eq!(mrs_b.get(inbox).unwrap().bytes(), &data[..4096]);
    assert_eq!(a.endpoint().mrs().get(back).unwrap().bytes(), &data[..]);

    // The recording: every frame A sent verifies; exactly the frames A's engine rejected fail
    // verification. (A flip can also make a frame look like other traffic: the wire carries
    // nothing else, so those count too.)
    let stats_a = a.stats;
    drop(a);
    let mut bad = 0;
    for frame in read_frames(&pcap).unwrap() {
        let verdict =
            Frame::new_checked(&frame.data[..]).and_then(|f| FrameRepr::parse(&f).map(|_| ()));
        match verdict {
            Ok(()) => {}
            Err(error) => {
                assert_eq!(
                    frame.data[6..12],
                    MAC_B,
                    "a frame A sent is damaged: {error}"
                );
                bad += 1;
            }
        }
    }
    assert_eq!(bad, stats_a.rx_rejected + stats_a.rx_other);
    assert!(
        stats_a.rx_rejected > 0,
        "the faults were injected: {stats_a:?}"
    );
}
