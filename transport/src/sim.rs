//! A deterministic network for transport tests and `roce sim`: any number of endpoints on
//! one simulated Ethernet, a simulated clock, latency, and seeded loss, reordering,
//! duplication and corruption of whole frames.
//!
//! Frames cross it as bytes: every packet is emitted with Ethernet, IPv4, UDP and ICRC,
//! possibly damaged, and parsed again on arrival, so corruption is caught (or not) by the
//! same ICRC check a real receiver runs. A frame to a multicast group goes to every other
//! node, as a switch floods it, and back to its sender when the sender's host is a member
//! ([`Endpoint::mcast_loopback`]), each copy faulted on its own.
//!
//! By default the link has no speed: a frame arrives one latency after it is sent. With a
//! [`SwitchConfig`] ([`Sim::set_switch`]) the nodes hang off a switch instead: each NIC
//! sends one frame at a time at the link's speed, and frames queue at the switch's egress
//! port to their destination, where they may be marked CE or dropped (`switch.rs`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};
use roce_wire::multicast::multicast_mac;
use roce_wire::{Frame, FrameRepr};

use crate::cq::WorkCompletion;
use crate::endpoint::{CqId, Endpoint, Transmit};
use crate::mr::PdId;
use crate::qp::{PostError, QpCaps, QpInit};
pub use crate::qp_state::RetryConfig;
use crate::qp_state::{connect_attrs, ud_attrs, AddressVector, PathMtu, Peer, QpType};
use crate::wr::{RecvWr, SendWr};
use crate::AccessFlags;
use roce_wire::Psn;

mod switch;

use switch::{Forward, Switch};
pub use switch::{PortStats, SwitchConfig, WIRE_OVERHEAD};

/// Faults and timing of the simulated link, applied to every frame independently.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkConfig {
    /// One-way delay.
    pub latency: Duration,
    /// Probability a frame is lost.
    pub loss: f64,
    /// Probability a frame is delayed by up to three extra latencies (so later ones pass it).
    pub reorder: f64,
    /// Probability a frame is delivered twice.
    pub duplicate: f64,
    /// Probability one bit after the Ethernet header is flipped. Spared: BTH byte 4 (FECN,
    /// BECN, reserved), which switches may rewrite and the ICRC deliberately ignores, and the
    /// UDP checksum, where a flip turns "no checksum" into one that is right once in 65,536
    /// tries without changing anything the frame means.
    pub corrupt: f64,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            latency: Duration::from_micros(5),
            loss: 0.0,
            reorder: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
        }
    }
}

/// What the network did, for reports and assertions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Frames handed to the network.
    pub sent: u64,
    /// Frames delivered (duplicates count twice).
    pub delivered: u64,
    /// Frames dropped on purpose.
    pub lost: u64,
    /// Frames corrupted on purpose.
    pub corrupted: u64,
    /// Corrupted frames the receiver's checks rejected.
    pub corrupt_rejected: u64,
    /// Corrupted frames that passed every check (must stay 0: the ICRC exists for this).
    pub corrupt_accepted: u64,
    /// Frames the [`Sim::drop_filter`] dropped (not counted in `lost`).
    pub filtered: u64,
    /// Frames the switch dropped for want of buffer (not counted in `lost`).
    pub dropped: u64,
    /// Frames the switch marked CE.
    pub marked: u64,
}

/// A test's hook to lose chosen frames: called as `filter(from, to, frame)` for every frame
/// handed to the network, before the link's random faults; returning true drops the frame.
/// It may also just record what it sees. Being a plain function of the frames it is shown, it
/// keeps the simulation deterministic.
pub type DropFilter = Box<dyn FnMut(usize, usize, &FrameRepr<'_>) -> bool>;

/// An endpoint on the simulated network.
#[derive(Debug)]
pub struct Node {
    /// The transport.
    pub endpoint: Endpoint,
    /// Its IPv4 address.
    pub ip: Ipv4Addr,
    /// A protection domain for the test's regions.
    pub pd: PdId,
    /// The CQ every QP of the node uses for sends.
    pub send_cq: CqId,
    /// The CQ every QP of the node uses for receives.
    pub recv_cq: CqId,
}

struct InFlight {
    to: usize,
    corrupted: bool,
    /// Where the frame is when its event comes.
    hop: Hop,
    bytes: Vec<u8>,
}

/// Where a frame in flight goes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hop {
    /// It reaches the switch.
    Switch,
    /// It starts to leave the switch's egress port, and reaches its node at the instant
    /// given.
    Dequeue(Instant),
    /// It reaches its node.
    Node,
}

/// The simulated network and clock.
pub struct Sim {
    /// The endpoints, by index.
    pub nodes: Vec<Node>,
    /// Link behaviour.
    pub link: LinkConfig,
    /// Simulated time.
    pub now: Instant,
    /// What happened to frames so far.
    pub stats: NetStats,
    /// Drops the frames it returns true for (see [`DropFilter`]); `None` drops nothing.
    pub drop_filter: Option<DropFilter>,
    rng: ChaCha8Rng,
    queue: BinaryHeap<Reverse<(Instant, u64)>>,
    frames: std::collections::HashMap<u64, InFlight>,
    next_frame: u64,
    /// The switch, when the network has one.
    switch: Option<Switch>,
    /// Nodes whose NIC was busy when they may have had more to send: when it frees up,
    /// the simulation must wake to ask them.
    nic_waiting: Vec<Option<Instant>>,
}

/// A connected pair of QPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpPair {
    /// Node index and QPN of one side.
    pub a: (usize, u32),
    /// Node index and QPN of the other side.
    pub b: (usize, u32),
}

/// Depth of each node's CQs in the simulator.
pub const SIM_CQ_DEPTH: usize = 1 << 16;

impl Sim {
    /// An empty network whose every random choice comes from `seed`.
    pub fn new(link: LinkConfig, seed: u64) -> Self {
        Sim {
            nodes: Vec::new(),
            link,
            now: Instant::now(),
            stats: NetStats::default(),
            drop_filter: None,
            rng: ChaCha8Rng::seed_from_u64(seed),
            queue: BinaryHeap::new(),
            frames: std::collections::HashMap::new(),
            next_frame: 0,
            switch: None,
            nic_waiting: Vec::new(),
        }
    }

    /// Puts a switch between the nodes (see the module's docs), or takes it away.
    pub fn set_switch(&mut self, config: Option<SwitchConfig>) {
        self.switch = config.map(Switch::new);
    }

    /// The switch's settings, if there is one.
    pub fn switch(&self) -> Option<SwitchConfig> {
        self.switch.as_ref().map(|switch| switch.config)
    }

    /// What the switch's egress port to `node` did (all zero without a switch).
    pub fn port_stats(&self, node: usize) -> PortStats {
        self.switch
            .as_ref()
            .map_or_else(PortStats::default, |switch| switch.port_stats(node))
    }

    /// Adds an endpoint at 10.0.0.(n+1) with one PD and a send and a receive CQ.
    pub fn add_node(&mut self) -> usize {
        let index = self.nodes.len();
        let mut key_seed = [0u8; 32];
        self.rng.fill_bytes(&mut key_seed);
        let ip = Ipv4Addr::new(10, 0, 0, index as u8 + 1);
        let mut endpoint = Endpoint::new(key_seed);
        endpoint.set_gids(vec![ip.to_ipv6_mapped().octets()]);
        let pd = endpoint.mrs().alloc_pd();
        let send_cq = endpoint.create_cq(SIM_CQ_DEPTH).expect("within max_cqe");
        let recv_cq = endpoint.create_cq(SIM_CQ_DEPTH).expect("within max_cqe");
        self.nodes.push(Node {
            endpoint,
            ip,
            pd,
            send_cq,
            recv_cq,
        });
        index
    }

    /// The address vector that reaches `node`.
    pub fn av_of(&self, node: usize) -> AddressVector {
        AddressVector {
            dgid: self.nodes[node].ip.to_ipv6_mapped().octets(),
            sgid_index: 1,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
        }
    }

    /// Creates a QP of `qp_type` on `node` in RESET.
    pub fn create_qp(&mut self, node: usize, qp_type: QpType, caps: QpCaps) -> u32 {
        let n = &mut self.nodes[node];
        let init = QpInit {
            pd: n.pd,
            qp_type,
            caps,
            sq_sig_all: false,
        };
        n.endpoint
            .create_qp(init, n.send_cq, n.recv_cq)
            .expect("the CQs exist and the caps are within the device limits")
    }

    /// Connects a new QP on `a` with a new QP on `b` (RC or UC) and brings both to RTS, with
    /// rc_pingpong's defaults except the given MTU, timeout and retry counts.
    pub fn connect(
        &mut self,
        a: usize,
        b: usize,
        qp_type: QpType,
        mtu: PathMtu,
        retry: RetryConfig,
    ) -> QpPair {
        let caps = QpCaps {
            max_send_wr: 4096,
            max_recv_wr: 4096,
            ..QpCaps::default()
        };
        let qa = self.create_qp(a, qp_type, caps);
        let qb = self.create_qp(b, qp_type, caps);
        self.connect_qps((a, qa), (b, qb), qp_type, mtu, retry)
    }

    /// Connects QP `a.1` on node `a.0` with QP `b.1` on node `b.0`, both created and in
    /// RESET, as [`connect`](Self::connect) does (for QPs created some other way, such as
    /// on an SRQ).
    pub fn connect_qps(
        &mut self,
        (a, qa): (usize, u32),
        (b, qb): (usize, u32),
        qp_type: QpType,
        mtu: PathMtu,
        retry: RetryConfig,
    ) -> QpPair {
        let psn_a = Psn::new(self.rng.next_u32());
        let psn_b = Psn::new(self.rng.next_u32());
        self.bring_up(a, qa, qp_type, self.av_of(b), qb, psn_b, psn_a, mtu, retry);
        self.bring_up(b, qb, qp_type, self.av_of(a), qa, psn_a, psn_b, mtu, retry);
        QpPair {
            a: (a, qa),
            b: (b, qb),
        }
    }

    /// Connects XRC initiator `ini` on node `a` with XRC target `tgt` on node `b`, both
    /// created and in RESET, each with the attributes its half takes.
    pub fn connect_xrc(
        &mut self,
        (a, ini): (usize, u32),
        (b, tgt): (usize, u32),
        mtu: PathMtu,
        retry: RetryConfig,
    ) -> QpPair {
        let psn_a = Psn::new(self.rng.next_u32());
        let psn_b = Psn::new(self.rng.next_u32());
        let av_b = self.av_of(b);
        let av_a = self.av_of(a);
        self.bring_up(a, ini, QpType::XrcSend, av_b, tgt, psn_b, psn_a, mtu, retry);
        self.bring_up(b, tgt, QpType::XrcRecv, av_a, ini, psn_a, psn_b, mtu, retry);
        QpPair {
            a: (a, ini),
            b: (b, tgt),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn bring_up(
        &mut self,
        node: usize,
        qpn: u32,
        qp_type: QpType,
        av: AddressVector,
        dest_qpn: u32,
        rq_psn: Psn,
        sq_psn: Psn,
        mtu: PathMtu,
        retry: RetryConfig,
    ) {
        let peer = Peer {
            av,
            qpn: dest_qpn,
            psn: rq_psn,
        };
        let steps = connect_attrs(qp_type, peer, sq_psn, mtu, retry);
        for attr in steps {
            self.nodes[node]
                .endpoint
                .modify_qp(self.now, qpn, &attr)
                .expect("valid bring-up");
        }
    }

    /// Brings a UD QP to RTS with `qkey`.
    pub fn bring_up_ud(&mut self, node: usize, qpn: u32, qkey: u32) {
        let steps = ud_attrs(qkey, Psn::new(self.rng.next_u32()));
        for attr in steps {
            self.nodes[node]
                .endpoint
                .modify_qp(self.now, qpn, &attr)
                .expect("valid bring-up");
        }
    }

    /// Registers a region on `node` at `iova` holding `contents`, with every access right;
    /// returns its key.
    pub fn reg(&mut self, node: usize, iova: u64, contents: &[u8]) -> u32 {
        let pd = self.nodes[node].pd;
        let mrs = self.nodes[node].endpoint.mrs();
        let key = mrs
            .reg_mr(pd, iova, contents.len(), AccessFlags::all())
            .expect("valid region");
        if let Some(mr) = mrs.get_mut(key) {
            mr.write(0, contents).expect("the region has room");
        }
        key
    }

    /// The current contents of a region.
    pub fn mr_bytes(&mut self, node: usize, key: u32) -> Vec<u8> {
        self.nodes[node]
            .endpoint
            .mrs()
            .get(key)
            .and_then(|mr| mr.to_vec().ok())
            .unwrap_or_default()
    }

    /// Posts a send at the current simulated time.
    pub fn post_send(&mut self, node: usize, qpn: u32, wr: &SendWr) -> Result<(), PostError> {
        self.nodes[node].endpoint.post_send(self.now, qpn, wr)
    }

    /// Posts a receive at the current simulated time.
    pub fn post_recv(&mut self, node: usize, qpn: u32, wr: &RecvWr) -> Result<(), PostError> {
        self.nodes[node].endpoint.post_recv(self.now, qpn, wr)
    }

    /// Takes every completion waiting on `node`'s send CQ.
    pub fn poll_send(&mut self, node: usize) -> Vec<WorkCompletion> {
        let cq = self.nodes[node].send_cq;
        let mut out = Vec::new();
        self.nodes[node].endpoint.cq(cq).poll(usize::MAX, &mut out);
        out
    }

    /// Takes every completion waiting on `node`'s receive CQ.
    pub fn poll_recv(&mut self, node: usize) -> Vec<WorkCompletion> {
        let cq = self.nodes[node].recv_cq;
        let mut out = Vec::new();
        self.nodes[node].endpoint.cq(cq).poll(usize::MAX, &mut out);
        out
    }

    fn chance(&mut self, probability: f64) -> bool {
        chance(&mut self.rng, probability)
    }

    /// Turns a transmit into bytes on the wire, with the link's faults: to the node its
    /// address names, or to every node of its multicast group.
    fn send(&mut self, from: usize, transmit: &Transmit) {
        self.stats.sent += 1;
        let dgid = transmit.packet.av.dgid;
        if let Some(group_mac) = multicast_mac(&dgid) {
            let looped = self.nodes[from].endpoint.mcast_loopback(&dgid);
            for to in 0..self.nodes.len() {
                if to != from || looped {
                    self.send_to(from, to, group_mac, transmit);
                }
            }
            return;
        }
        let dst_ip = transmit.ipv4_destination();
        let Some(to) = self.nodes.iter().position(|node| Some(node.ip) == dst_ip) else {
            self.stats.lost += 1;
            return;
        };
        self.send_to(from, to, mac(to), transmit);
    }

    /// One frame of `transmit` from `from` to the node `to`, addressed to `dst_mac`.
    fn send_to(&mut self, from: usize, to: usize, dst_mac: [u8; 6], transmit: &Transmit) {
        let Some(repr) = transmit.frame(mac(from), self.nodes[from].ip.into(), dst_mac) else {
            self.stats.lost += 1;
            return;
        };
        let mut bytes = vec![0u8; repr.buffer_len()];
        if repr.emit(&mut bytes).is_err() {
            self.stats.lost += 1;
            return;
        }
        if let Some(filter) = &mut self.drop_filter {
            if filter(from, to, &repr) {
                self.stats.filtered += 1;
                return;
            }
        }
        if self.chance(self.link.loss) {
            self.stats.lost += 1;
            return;
        }
        let corrupted = self.chance(self.link.corrupt);
        if corrupted {
            self.stats.corrupted += 1;
            flip_random_bit(&mut bytes, &mut self.rng);
        }
        let copies = if self.chance(self.link.duplicate) {
            2
        } else {
            1
        };
        // Through a switch, the frame first leaves the NIC (which the caller found free).
        let (sent_at, hop) = match &mut self.switch {
            Some(switch) => (switch.transmit(from, self.now, bytes.len()), Hop::Switch),
            None => (self.now, Hop::Node),
        };
        let latency = self
            .switch
            .as_ref()
            .map_or(self.link.latency, |s| s.config.latency);
        for _ in 0..copies {
            let mut delay = latency;
            if self.chance(self.link.reorder) {
                delay += latency * (1 + self.rng.next_u32() % 3);
            }
            self.schedule(
                sent_at + delay,
                InFlight {
                    to,
                    corrupted,
                    hop,
                    bytes: bytes.clone(),
                },
            );
        }
    }

    fn schedule(&mut self, at: Instant, frame: InFlight) {
        let id = self.next_frame;
        self.next_frame += 1;
        self.queue.push(Reverse((at, id)));
        self.frames.insert(id, frame);
    }

    /// A frame reached the switch: it is queued at its egress port, or dropped.
    fn switch_frame(&mut self, mut frame: InFlight) {
        let Some(switch) = &mut self.switch else {
            return;
        };
        match switch.arrive(frame.to, self.now, frame.bytes.len()) {
            Forward::Drop => self.stats.dropped += 1,
            Forward::Queued { start, at } => {
                frame.hop = Hop::Dequeue(at);
                self.schedule(start, frame);
            }
        }
    }

    /// A frame starts to leave the switch: it may be marked CE on its way to its node.
    fn dequeue_frame(&mut self, mut frame: InFlight, at: Instant) {
        let Some(switch) = &mut self.switch else {
            return;
        };
        let ect = Frame::new_checked(&frame.bytes[..]).is_ok_and(|checked| {
            matches!(
                checked.ecn(),
                roce_wire::frame::ECN_ECT0 | roce_wire::frame::ECN_ECT1
            )
        });
        if switch.depart(frame.to, self.now, ect, &mut self.rng) {
            if let Ok(mut checked) = Frame::new_checked(&mut frame.bytes[..]) {
                checked.mark_congestion_experienced();
            }
            self.stats.marked += 1;
        }
        frame.hop = Hop::Node;
        self.schedule(at, frame);
    }

    fn deliver(&mut self, frame: InFlight) {
        self.stats.delivered += 1;
        let parsed =
            Frame::new_checked(&frame.bytes[..]).and_then(|checked| FrameRepr::parse(&checked));
        match (parsed, frame.corrupted) {
            (Ok(repr), corrupted) => {
                if corrupted {
                    self.stats.corrupt_accepted += 1;
                }
                self.nodes[frame.to].endpoint.handle_packet(self.now, &repr);
            }
            (Err(_), true) => self.stats.corrupt_rejected += 1,
            (Err(error), false) => panic!("the simulator emitted a frame it cannot parse: {error}"),
        }
    }

    /// Sends everything every endpoint has to send now (through a switch, as much as each
    /// NIC can start now).
    fn flush(&mut self) {
        let mut transmit = Transmit::default();
        self.nic_waiting.resize(self.nodes.len(), None);
        for index in 0..self.nodes.len() {
            loop {
                if let Some(switch) = &self.switch {
                    if let Err(free) = switch.nic_ready(index, self.now) {
                        self.nic_waiting[index] = Some(free);
                        break;
                    }
                }
                if !self.nodes[index]
                    .endpoint
                    .poll_transmit_into(self.now, &mut transmit)
                {
                    self.nic_waiting[index] = None;
                    break;
                }
                self.send(index, &transmit);
            }
        }
    }

    /// Advances to the next event (a delivery or a timer) and handles it. Returns false when
    /// nothing is left to happen.
    pub fn step(&mut self) -> bool {
        self.flush();
        let next_delivery = self.queue.peek().map(|Reverse((at, _))| *at);
        let next_timer = self
            .nodes
            .iter()
            .filter_map(|n| n.endpoint.poll_timeout())
            .min();
        let next_nic = self.nic_waiting.iter().flatten().min().copied();
        let Some(next) = [next_delivery, next_timer, next_nic]
            .into_iter()
            .flatten()
            .min()
        else {
            return false;
        };
        self.round_at(next);
        true
    }

    /// One round of every endpoint at `at` (or now, if later), in the order a provider's
    /// engine runs it: the frames that have arrived by then, the timers due, then what is
    /// to be sent. Stepping calls it at each next event; a test calls it to wake late.
    pub fn round_at(&mut self, at: Instant) {
        self.now = self.now.max(at);
        while let Some(Reverse((at, id))) = self.queue.peek().copied() {
            if at > self.now {
                break;
            }
            self.queue.pop();
            let Some(frame) = self.frames.remove(&id) else {
                continue;
            };
            match frame.hop {
                Hop::Switch => self.switch_frame(frame),
                Hop::Dequeue(at) => self.dequeue_frame(frame, at),
                Hop::Node => self.deliver(frame),
            }
        }
        for node in &mut self.nodes {
            node.endpoint.handle_timeout(self.now);
        }
        self.flush();
    }

    /// Steps until `done` holds or nothing is left to happen, at most `max_steps` times.
    /// Returns whether `done` held.
    pub fn run_until(&mut self, max_steps: u64, mut done: impl FnMut(&mut Sim) -> bool) -> bool {
        for _ in 0..max_steps {
            if done(self) {
                return true;
            }
            if !self.step() {
                return done(self);
            }
        }
        done(self)
    }
}

/// Flips one random bit after the Ethernet header of an untagged IPv4 RoCEv2 frame, sparing
/// what [`LinkConfig::corrupt`] spares: a corruption every receiver must catch.
pub fn flip_random_bit(frame: &mut [u8], rng: &mut impl Rng) {
    let udp_checksum = 14 + 20 + 6;
    let spared = [udp_checksum, udp_checksum + 1, 14 + 20 + 8 + 4];
    if frame.len() <= 14 + 20 + 8 + 12 {
        return;
    }
    let mut offset = spared[0];
    while spared.contains(&offset) {
        offset = 14 + (rng.next_u64() as usize) % (frame.len() - 14);
    }
    frame[offset] ^= 1 << (rng.next_u32() % 8);
}

/// Whether an event of `probability` happens, drawing from `rng`.
pub fn chance(rng: &mut impl Rng, probability: f64) -> bool {
    probability > 0.0 && (rng.next_u64() as f64 / u64::MAX as f64) < probability
}

fn mac(node: usize) -> [u8; 6] {
    [0x02, 0, 0, 0, 0, node as u8 + 1]
}
