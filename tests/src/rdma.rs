//! A two-endpoint RDMA scenario over any pair of backends, through the provider's engine:
//! the cross-crate tests run it over the in-memory wire and over kernel UDP sockets.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use roce_provider::backend::Backend;
use roce_provider::engine::{Addressing, Engine};
use roce_transport::cq::WcStatus;
use roce_transport::mr::PdId;
use roce_transport::qp::{QpCaps, QpInit};
use roce_transport::qp_state::{connect_attrs, AddressVector, PathMtu, Peer, QpType, RetryConfig};
use roce_transport::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};
use roce_transport::{AccessFlags, CqId, Endpoint};
use roce_wire::Psn;

/// MAC of side A.
pub const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 0xA];
/// MAC of side B.
pub const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 0xB];

/// How each side is addressed.
pub fn addressing(mac: [u8; 6], ip: Ipv4Addr, peer_mac: [u8; 6], peer_ip: Ipv4Addr) -> Addressing {
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
    let qpn = endpoint.create_qp(init, cq, cq).expect("QP");
    Side {
        endpoint,
        qpn,
        pd,
        cq,
    }
}

impl Side {
    fn connect(&mut self, peer: Peer, sq_psn: Psn, mtu: PathMtu) {
        let now = Instant::now();
        for attr in connect_attrs(QpType::Rc, peer, sq_psn, mtu, RetryConfig::default()) {
            self.endpoint
                .modify_qp(now, self.qpn, &attr)
                .expect("bring-up");
        }
    }

    fn register(&mut self, iova: u64, contents: &[u8]) -> u32 {
        let mrs = self.endpoint.mrs();
        let key = mrs
            .reg_mr(self.pd, iova, contents.len(), AccessFlags::all())
            .expect("region");
        if let Some(mr) = mrs.get_mut(key) {
            mr.write(0, contents).expect("the region has room");
        }
        key
    }
}

fn signaled(wr_id: u64, op: SendOp, sge: Sge) -> SendWr {
    SendWr {
        wr_id,
        op,
        sg_list: [sge].into(),
        inline_data: Vec::new(),
        flags: SendFlags::SIGNALED,
        ud: None,
    }
}

/// A at `ip_a` WRITEs 1 MiB to B at `ip_b`, READs it back and SENDs 4 KiB, over the given
/// backends; panics unless every request succeeds and every byte arrives. Returns both
/// engines for further checks.
pub fn write_read_send<A: Backend, B: Backend>(
    backend_a: A,
    ip_a: Ipv4Addr,
    backend_b: B,
    ip_b: Ipv4Addr,
) -> (Engine<A>, Engine<B>) {
    let a = (backend_a, ip_a, MAC_A);
    write_read_send_with_macs(a, (backend_b, ip_b, MAC_B), PathMtu::Mtu1024)
}

/// [`write_read_send`] with each side's backend, IPv4 address and real MAC, at path MTU `mtu`.
pub fn write_read_send_with_macs<A: Backend, B: Backend>(
    (backend_a, ip_a, mac_a): (A, Ipv4Addr, [u8; 6]),
    (backend_b, ip_b, mac_b): (B, Ipv4Addr, [u8; 6]),
    mtu: PathMtu,
) -> (Engine<A>, Engine<B>) {
    let (mut side_a, mut side_b) = (side(1), side(2));
    let (qa, qb) = (side_a.qpn, side_b.qpn);
    side_a.connect(
        Peer {
            av: av(ip_b),
            qpn: qb,
            psn: Psn::new(200),
        },
        Psn::new(100),
        mtu,
    );
    side_b.connect(
        Peer {
            av: av(ip_a),
            qpn: qa,
            psn: Psn::new(100),
        },
        Psn::new(200),
        mtu,
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
            &RecvWr {
                wr_id: 9,
                sg_list: [inbox_sge].into(),
            },
        )
        .expect("post");
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
    ep_a.post_send(now, qa, &signaled(1, write, whole(0x1000_0000, src)))
        .expect("post");
    ep_a.post_send(now, qa, &signaled(2, read, whole(0x2000_0000, back)))
        .expect("post");
    ep_a.post_send(now, qa, &signaled(3, SendOp::Send, hello))
        .expect("post");
    let (cq_a, cq_b) = (side_a.cq, side_b.cq);

    let mut a = Engine::new(
        side_a.endpoint,
        backend_a,
        addressing(mac_a, ip_a, mac_b, ip_b),
    );
    let mut b = Engine::new(
        side_b.endpoint,
        backend_b,
        addressing(mac_b, ip_b, mac_a, ip_a),
    );
    let (mut sends, mut recvs) = (Vec::new(), Vec::new());
    // Bounded in rounds and in time; the run takes well under a second.
    let deadline = Instant::now() + Duration::from_secs(60);
    for _ in 0..1_000_000 {
        if (sends.len() == 3 && !recvs.is_empty()) || Instant::now() > deadline {
            break;
        }
        a.run_once(Duration::from_micros(200)).expect("engine A");
        b.run_once(Duration::from_micros(200)).expect("engine B");
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
    assert_eq!(mrs_b.get(target).and_then(|mr| mr.bytes()), Some(&data[..]));
    assert_eq!(
        mrs_b.get(inbox).and_then(|mr| mr.bytes()),
        Some(&data[..4096])
    );
    assert_eq!(
        a.endpoint().mrs().get(back).and_then(|mr| mr.bytes()),
        Some(&data[..])
    );
    (a, b)
}
