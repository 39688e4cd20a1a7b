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
pub use roce_transport::wr::signaled;
use roce_transport::wr::{RecvWr, SendOp, Sge};
use roce_transport::{AccessFlags, CqId, Endpoint};
use roce_wire::Psn;

/// MAC of side A.
pub const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 0xA];
/// MAC of side B.
pub const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 0xB];

/// How each side is addressed.
fn addressing(mac: [u8; 6], ip: Ipv4Addr, peer_mac: [u8; 6], peer_ip: Ipv4Addr) -> Addressing {
    Addressing {
        mac,
        ip,
        neighbours: HashMap::from([(peer_ip, peer_mac)]),
    }
}

/// The two sides' engines, each over its backend (with its MAC and IPv4 address) and with
/// the other side as its one neighbour.
pub fn engines<A: Backend, B: Backend>(
    (endpoint_a, backend_a, mac_a, ip_a): (Endpoint, A, [u8; 6], Ipv4Addr),
    (endpoint_b, backend_b, mac_b, ip_b): (Endpoint, B, [u8; 6], Ipv4Addr),
) -> (Engine<A>, Engine<B>) {
    (
        Engine::new(endpoint_a, backend_a, addressing(mac_a, ip_a, mac_b, ip_b)),
        Engine::new(endpoint_b, backend_b, addressing(mac_b, ip_b, mac_a, ip_a)),
    )
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

/// An endpoint with one PD, one CQ and one RC QP.
pub struct Side {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// Its QP.
    pub qpn: u32,
    /// Its PD.
    pub pd: PdId,
    /// The QP's send and receive CQ.
    pub cq: CqId,
}

fn side(seed: u8) -> Side {
    let mut endpoint = Endpoint::new([seed; 32]);
    let pd = endpoint.mrs().alloc_pd();
    let cq = endpoint.create_cq(1024).expect("CQ");
    let init = QpInit {
        pd,
        qp_type: QpType::Rc,
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

    /// Registers a region at `iova` holding `contents`, with every access; returns its key.
    pub fn register(&mut self, iova: u64, contents: &[u8]) -> u32 {
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

/// Two sides at `ip_a` and `ip_b` whose QPs are connected to each other (RTS), path MTU `mtu`.
pub fn connected_pair(ip_a: Ipv4Addr, ip_b: Ipv4Addr, mtu: PathMtu) -> (Side, Side) {
    let (mut a, mut b) = (side(1), side(2));
    let peer = |ip, qpn, psn| Peer {
        av: av(ip),
        qpn,
        psn: Psn::new(psn),
    };
    let (qa, qb) = (a.qpn, b.qpn);
    a.connect(peer(ip_b, qb, 200), Psn::new(100), mtu);
    b.connect(peer(ip_a, qa, 100), Psn::new(200), mtu);
    (a, b)
}

/// Runs both engines in turn until `done` says so or `limit` has passed; whether `done` did.
pub fn drive<A: Backend, B: Backend>(
    a: &mut Engine<A>,
    b: &mut Engine<B>,
    limit: Duration,
    mut done: impl FnMut(&mut Engine<A>, &mut Engine<B>) -> bool,
) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if done(a, b) {
            return true;
        }
        a.run_once(Duration::from_micros(200)).expect("engine A");
        b.run_once(Duration::from_micros(200)).expect("engine B");
    }
    done(a, b)
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

/// Where the scenario's regions are, and what must end up in them.
struct Regions {
    data: Vec<u8>,
    /// A's region the READ fills.
    back: u32,
    /// B's region the WRITE fills.
    target: u32,
    /// B's region the SEND fills.
    inbox: u32,
}

const LEN: usize = 1 << 20;
const SRC: u64 = 0x1000_0000;
const BACK: u64 = 0x2000_0000;
const TARGET: u64 = 0x3000_0000;
const INBOX: u64 = 0x4000_0000;

/// Registers the regions and posts the WRITE, READ and SEND on A, the receive on B.
fn post_write_read_send(a: &mut Side, b: &mut Side) -> Regions {
    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + i / 251) as u8).collect();
    let src = a.register(SRC, &data);
    let back = a.register(BACK, &vec![0; LEN]);
    let target = b.register(TARGET, &vec![0; LEN]);
    let inbox = b.register(INBOX, &[0; 4096]);
    let now = Instant::now();
    let sge = |addr, length, lkey| Sge { addr, length, lkey };
    let receive = RecvWr {
        wr_id: 9,
        sg_list: [sge(INBOX, 4096, inbox)].into(),
    };
    b.endpoint.post_recv(now, b.qpn, &receive).expect("post");
    let write = SendOp::RdmaWrite {
        remote_addr: TARGET,
        rkey: target,
    };
    let read = SendOp::RdmaRead {
        remote_addr: TARGET,
        rkey: target,
    };
    let requests = [
        (1, write, sge(SRC, LEN as u32, src)),
        (2, read, sge(BACK, LEN as u32, back)),
        (3, SendOp::Send, sge(SRC, 4096, src)),
    ];
    for (wr_id, op, sge) in requests {
        a.endpoint
            .post_send(now, a.qpn, &signaled(wr_id, op, sge))
            .expect("post");
    }
    Regions {
        data,
        back,
        target,
        inbox,
    }
}

/// [`write_read_send`] with each side's backend, IPv4 address and real MAC, at path MTU `mtu`.
pub fn write_read_send_with_macs<A: Backend, B: Backend>(
    (backend_a, ip_a, mac_a): (A, Ipv4Addr, [u8; 6]),
    (backend_b, ip_b, mac_b): (B, Ipv4Addr, [u8; 6]),
    mtu: PathMtu,
) -> (Engine<A>, Engine<B>) {
    let (mut side_a, mut side_b) = connected_pair(ip_a, ip_b, mtu);
    let regions = post_write_read_send(&mut side_a, &mut side_b);
    let (cq_a, cq_b) = (side_a.cq, side_b.cq);
    let (mut a, mut b) = engines(
        (side_a.endpoint, backend_a, mac_a, ip_a),
        (side_b.endpoint, backend_b, mac_b, ip_b),
    );
    let (mut sends, mut recvs) = (Vec::new(), Vec::new());
    drive(&mut a, &mut b, Duration::from_secs(60), |a, b| {
        a.endpoint().cq(cq_a).poll(16, &mut sends);
        b.endpoint().cq(cq_b).poll(16, &mut recvs);
        sends.len() == 3 && !recvs.is_empty()
    });
    let sends: Vec<_> = sends.iter().map(|c| (c.wr_id, c.status)).collect();
    let success = WcStatus::Success;
    assert_eq!(sends, [(1, success), (2, success), (3, success)]);
    assert_eq!(
        (recvs[0].wr_id, recvs[0].status, recvs[0].byte_len),
        (9, WcStatus::Success, 4096)
    );
    let data = &regions.data[..];
    let mrs_b = b.endpoint().mrs();
    assert_eq!(
        mrs_b.get(regions.target).and_then(|mr| mr.bytes()),
        Some(data)
    );
    assert_eq!(
        mrs_b.get(regions.inbox).and_then(|mr| mr.bytes()),
        Some(&data[..4096])
    );
    let back = a
        .endpoint()
        .mrs()
        .get(regions.back)
        .and_then(|mr| mr.bytes().map(<[u8]>::to_vec));
    assert_eq!(back.as_deref(), Some(data));
    (a, b)
}
