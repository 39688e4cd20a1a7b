//! Drives a transport [`Endpoint`] over a [`Backend`] with the real clock: frames in, parsed
//! and checked; timers fired; packets out as rxe-shaped IPv4 or IPv6 frames.
//!
//! Each [`poll`](Engine::poll) is one bounded turn: at most [`Engine::RX_BUDGET`] received
//! frames, then due timers, then at most [`Engine::TX_BUDGET`] packets out. So no input rate, however high,
//! keeps responses, ACKs and retransmissions from leaving, and a long send queue does not
//! keep received frames waiting either. Timers come before the transmit half of the turn so
//! a retransmission they schedule leaves in the same turn.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use roce_transport::qp_state::AddressVector;
use roce_transport::{Endpoint, Transmit};
use roce_wire::frame::IpRepr;
use roce_wire::multicast::{is_group_mac, multicast_mac};
use roce_wire::{Frame, FrameError, FrameRepr, LinkHeaders};

use crate::backend::Backend;

/// Who this endpoint is on the link, and the neighbours it can reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addressing {
    /// Our MAC.
    pub mac: [u8; 6],
    /// Our IPv4 address (GID index 1, `::ffff:a.b.c.d`).
    pub ip: Ipv4Addr,
    /// MAC of each IPv4 neighbour.
    pub neighbours: HashMap<Ipv4Addr, [u8; 6]>,
}

/// What the engine has seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Frames received.
    pub rx_frames: u64,
    /// Received frames whose Ethernet destination is neither our MAC nor, while a QP of ours
    /// is attached to a multicast group, a group address (multicast datagrams go on to the
    /// endpoint, which knows its groups), dropped before parsing.
    pub rx_not_ours: u64,
    /// Received frames that were not RoCEv2 (ARP, other UDP, ...).
    pub rx_other: u64,
    /// RoCEv2 frames dropped as malformed, with an unknown opcode or a bad ICRC.
    pub rx_rejected: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Packets dropped for want of a route (no IPv4-mapped GID, or no known neighbour).
    pub tx_unroutable: u64,
    /// Times the backend's transmit queue was full: the packet waits for the next turn.
    pub tx_full: u64,
    /// Packets the backend refused for their own sake (no route, too big, filtered): lost.
    pub tx_failed: u64,
    /// Packets to one of our own addresses (another QP of this endpoint, or the sender
    /// itself), handed back to the endpoint as the frame the wire would carry without
    /// reaching the backend, as rxe loops them back.
    pub looped_back: u64,
}

/// An endpoint, the backend it talks through, and the buffers in between.
pub struct Engine<B> {
    endpoint: Endpoint,
    backend: B,
    addressing: Addressing,
    /// The GID table, for packets to IPv6 GIDs: they leave from the GID their address
    /// vector's `sgid_index` names.
    gids: Vec<[u8; 16]>,
    /// MAC of each IPv6 neighbour.
    neighbours6: HashMap<Ipv6Addr, [u8; 6]>,
    /// The packet being sent, kept so its payload buffer is reused; boxed so that a turn
    /// takes it out of the engine by moving a pointer (a `Transmit` is 240 bytes, and a
    /// turn with nothing to send is common).
    outgoing: Option<Box<Transmit>>,
    /// Whether `outgoing` holds a packet the backend had no room for yet.
    held: bool,
    /// The frame of the packet being looped back, kept so its buffer is reused.
    looped: Vec<u8>,
    /// Whether the last turn stopped at a budget with work left.
    unfinished: bool,
    /// The link headers of recent flows.
    headers: HeaderCache,
    /// Counters.
    pub stats: EngineStats,
}

/// The link headers (Ethernet, IP, UDP) of recent flows, a slot per QPN modulo
/// [`HEADER_SLOTS`]: a QP's packets reuse the headers its first packet built while its
/// address vector and our addresses stay the same, so building them (neighbour lookup,
/// header encoding: ~500 instructions a packet) is done once per flow rather than once per
/// packet. Changing our addresses, GIDs or neighbours makes every slot stale.
#[derive(Default)]
struct HeaderCache {
    slots: [Option<CachedHeaders>; HEADER_SLOTS],
    /// Bumped by every change of what headers are built from.
    generation: u64,
}

const HEADER_SLOTS: usize = 16;

struct CachedHeaders {
    qpn: u32,
    av: AddressVector,
    generation: u64,
    headers: LinkHeaders,
}

impl HeaderCache {
    fn slot(qpn: u32) -> usize {
        qpn as usize % HEADER_SLOTS
    }

    /// The headers of `transmit`'s flow, if built since the last change.
    fn get(&self, transmit: &Transmit) -> Option<&LinkHeaders> {
        let cached = self.slots[Self::slot(transmit.src_qpn)].as_ref()?;
        (cached.qpn == transmit.src_qpn
            && cached.av == transmit.packet.av
            && cached.generation == self.generation)
            .then_some(&cached.headers)
    }

    fn put(&mut self, transmit: &Transmit, headers: LinkHeaders) {
        self.slots[Self::slot(transmit.src_qpn)] = Some(CachedHeaders {
            qpn: transmit.src_qpn,
            av: transmit.packet.av,
            generation: self.generation,
            headers,
        });
    }

    fn invalidate(&mut self) {
        self.generation += 1;
    }
}

impl<B: Backend> Engine<B> {
    /// Puts `endpoint` on `backend` as `addressing` says.
    pub fn new(endpoint: Endpoint, backend: B, addressing: Addressing) -> Self {
        Engine {
            endpoint,
            backend,
            addressing,
            gids: Vec::new(),
            neighbours6: HashMap::new(),
            outgoing: None,
            held: false,
            looped: Vec::new(),
            unfinished: false,
            headers: HeaderCache::default(),
            stats: EngineStats::default(),
        }
    }

    /// The endpoint, to create objects, post work and poll CQs.
    pub fn endpoint(&mut self) -> &mut Endpoint {
        &mut self.endpoint
    }

    /// The backend.
    pub fn backend(&mut self) -> &mut B {
        &mut self.backend
    }

    /// Most received frames handled per turn.
    pub const RX_BUDGET: usize = 1024;
    /// Most packets sent per turn.
    pub const TX_BUDGET: usize = 1024;

    /// Who this endpoint is on the link.
    pub fn addressing(&self) -> &Addressing {
        &self.addressing
    }

    /// Learns (or updates) the MAC of an IPv4 neighbour.
    pub fn add_neighbour(&mut self, ip: Ipv4Addr, mac: [u8; 6]) {
        self.addressing.neighbours.insert(ip, mac);
        self.headers.invalidate();
    }

    /// Learns (or updates) the MAC of an IPv6 neighbour.
    pub fn add_neighbour6(&mut self, ip: Ipv6Addr, mac: [u8; 6]) {
        self.neighbours6.insert(ip, mac);
        self.headers.invalidate();
    }

    /// Whether the MAC of this IPv6 neighbour is known.
    pub fn knows_neighbour6(&self, ip: &Ipv6Addr) -> bool {
        self.neighbours6.contains_key(ip)
    }

    /// Sets the GID table packets to IPv6 GIDs take their source address from (without
    /// one, only IPv4-mapped GIDs are reachable); the endpoint then drops packets sent to
    /// any other address.
    pub fn set_gid_table(&mut self, gids: Vec<[u8; 16]>) {
        self.endpoint.set_gids(gids.clone());
        self.gids = gids;
        self.headers.invalidate();
    }

    /// One bounded turn without blocking: up to [`Self::RX_BUDGET`] waiting frames, due
    /// timers, up to [`Self::TX_BUDGET`] packets out.
    pub fn poll(&mut self) -> io::Result<()> {
        self.poll_at(Instant::now())
    }

    /// [`poll`](Self::poll) at `now`, a clock reading the caller took for this turn.
    pub fn poll_at(&mut self, now: Instant) -> io::Result<()> {
        let more_rx = match self.receive_turn(now) {
            // The device is gone for good: fail every QP, as an HCA's fatal error does.
            Err(error) if crate::backend::is_device_lost(&error) => {
                tracing::warn!(%error, "device lost");
                self.endpoint.device_fatal(now);
                false
            }
            other => other?,
        };
        self.endpoint.handle_timeout(now);
        let more_tx = self.transmit_turn(now)?;
        self.unfinished = more_rx || more_tx;
        Ok(())
    }

    /// When the engine next needs a [`poll`](Self::poll): now when the last turn left work
    /// for the next, else at the earliest timer (`None`: only when a frame arrives).
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.unfinished {
            return Some(Instant::now());
        }
        self.endpoint.poll_timeout()
    }

    /// [`poll`](Self::poll), then sleeps until a frame arrives, the engine's
    /// [`poll_timeout`](Self::poll_timeout), or `max_wait`, then polls again.
    pub fn run_once(&mut self, max_wait: Duration) -> io::Result<()> {
        self.poll()?;
        let until = self
            .poll_timeout()
            .map(|at| at.saturating_duration_since(Instant::now()));
        let wait = until.map_or(max_wait, |until| until.min(max_wait));
        self.backend.wait(Some(wait))?;
        self.poll()
    }

    /// Takes up to [`Self::RX_BUDGET`] frames, each parsed where the backend holds it; `true`
    /// when more may be waiting.
    fn receive_turn(&mut self, now: Instant) -> io::Result<bool> {
        let Engine {
            endpoint,
            backend,
            addressing,
            neighbours6,
            stats,
            ..
        } = self;
        let mac = addressing.mac;
        let received = backend.receive(Self::RX_BUDGET, &mut |frame| {
            if let Some(repr) = receive(endpoint, stats, mac, now, frame) {
                learn_cm_peer(addressing, neighbours6, &repr);
            }
        })?;
        Ok(received == Self::RX_BUDGET)
    }

    /// Sends up to [`Self::TX_BUDGET`] packets, then submits them; `true` when more wait (the
    /// budget ran out, or the backend's queue is full and the packet is held for the next
    /// turn).
    fn transmit_turn(&mut self, now: Instant) -> io::Result<bool> {
        let mut outgoing = self.outgoing.take().unwrap_or_default();
        let mut result = Ok(true);
        for _ in 0..Self::TX_BUDGET {
            if !self.held && !self.endpoint.poll_transmit_lent(now, &mut outgoing) {
                result = Ok(false);
                break;
            }
            self.held = false;
            match self.transmit(now, &outgoing) {
                Ok(true) => {}
                Ok(false) => {
                    // Kept for the next turn, by when its lent payload may have moved.
                    self.endpoint.materialize(&mut outgoing);
                    self.held = true;
                    break;
                }
                Err(error) => {
                    result = Err(error);
                    break;
                }
            }
        }
        self.outgoing = Some(outgoing);
        let submitted = self.backend.submit();
        result.and_then(|more| submitted.map(|()| more))
    }

    /// The frame for `transmit`: IPv4 from our address to a known IPv4 neighbour, or IPv6
    /// from the GID the packet names to a known IPv6 neighbour; to our own MAC when the
    /// destination is one of our addresses, to the group's MAC when it is a multicast group.
    fn frame<'t>(&self, transmit: &'t Transmit) -> Option<roce_wire::FrameRepr<'t>> {
        let mac = self.addressing.mac;
        let dgid = transmit.packet.av.dgid;
        let ours = self.gids.contains(&dgid)
            || (dgid == self.addressing.ip.to_ipv6_mapped().octets()
                && !self.addressing.ip.is_unspecified());
        let group = multicast_mac(&dgid);
        if let Some(ip) = transmit.ipv4_destination() {
            let neighbour = match group {
                _ if ours => mac,
                Some(group) => group,
                None => *self.addressing.neighbours.get(&ip)?,
            };
            return transmit.frame(mac, self.addressing.ip.into(), neighbour);
        }
        let ip = transmit.ipv6_destination()?;
        let neighbour = match group {
            _ if ours => mac,
            Some(group) => group,
            None => *self.neighbours6.get(&ip)?,
        };
        let source = self.gids.get(usize::from(transmit.packet.av.sgid_index))?;
        let source = Ipv6Addr::from(*source);
        if source.to_ipv4_mapped().is_some() {
            return None;
        }
        transmit.frame(mac, source.into(), neighbour)
    }

    /// Hands a packet addressed to us back to the endpoint as the frame the wire would
    /// carry: emitted, then parsed (ICRC checked) as a received frame is.
    fn loop_back(
        &mut self,
        now: Instant,
        transmit: &Transmit,
        headers: &LinkHeaders,
    ) -> io::Result<()> {
        let mut frame = std::mem::take(&mut self.looped);
        let packet = &transmit.packet;
        let payload_len = packet.payload_len();
        frame.resize(headers.buffer_len(&packet.bth, payload_len), 0);
        let endpoint = &self.endpoint;
        let emitted = headers.emit_with(
            &packet.bth,
            &packet.ext,
            payload_len,
            &mut frame,
            |payload, icrc| endpoint.write_payload(transmit, payload, icrc),
        );
        let result = match emitted {
            Err(_) => Err(io::Error::other("packet does not fit a frame")),
            Ok(len) => {
                let parsed = Frame::new_checked(&frame[..len]).and_then(|f| FrameRepr::parse(&f));
                match parsed {
                    Ok(looped) => {
                        self.endpoint.handle_packet(now, &looped);
                        self.stats.looped_back += 1;
                    }
                    Err(_) => self.stats.rx_rejected += 1,
                }
                Ok(())
            }
        };
        self.looped = frame;
        result
    }

    /// Whether a packet to our own address stays in this endpoint: always, unless the
    /// backend delivers such frames to whichever process owns them (a shared device) and
    /// the destination is not one of our QPs (or is QP 1, whose CM messages may be for the
    /// listener of another process).
    fn loops_back_itself(&self, transmit: &Transmit) -> bool {
        let qpn = transmit.packet.bth.dest_qpn;
        !self.backend.loops_back()
            || (qpn != roce_wire::mad::GSI_QPN && self.endpoint.qp_state(qpn).is_some())
    }

    /// Emits one packet straight into the backend's buffer, or loops it back when it is
    /// addressed to us; `false` when the backend's queue is full (nothing was sent).
    fn transmit(&mut self, now: Instant, transmit: &Transmit) -> io::Result<bool> {
        let headers = match self.headers.get(transmit) {
            Some(headers) => *headers,
            None => {
                let Some(repr) = self.frame(transmit) else {
                    let dgid = transmit.packet.av.dgid;
                    tracing::debug!(
                        qpn = transmit.src_qpn,
                        ?dgid,
                        "not sent: no route or neighbour"
                    );
                    self.stats.tx_unroutable += 1;
                    self.endpoint.transmit_failed();
                    return Ok(true);
                };
                let headers = LinkHeaders::new(&repr)
                    .map_err(|_| io::Error::other("packet does not fit a frame"))?;
                self.headers.put(transmit, headers);
                headers
            }
        };
        let dst = headers.ethernet_dst();
        if dst == self.addressing.mac && self.loops_back_itself(transmit) {
            self.loop_back(now, transmit, &headers)?;
            return Ok(true);
        }
        // Headers, then the payload copied once, from where it lies (a region, the WQE)
        // straight into the backend's buffer and hashed for the ICRC as it is copied.
        let packet = &transmit.packet;
        let payload_len = packet.payload_len();
        let (mut emitted, mut readable) = (Ok(()), true);
        let Engine {
            endpoint, backend, ..
        } = self;
        let sent = backend.transmit(
            headers.buffer_len(&packet.bth, payload_len),
            headers.udp_src_port(),
            &mut |buffer| {
                let write_payload = |payload: &mut [u8], icrc| {
                    let written = endpoint.write_payload(transmit, payload, icrc);
                    readable = written.is_some();
                    written
                };
                let written =
                    headers.emit_with(&packet.bth, &packet.ext, payload_len, buffer, write_payload);
                written.unwrap_or_else(|_| {
                    if readable {
                        emitted = Err(io::Error::other("packet does not fit a frame"));
                    }
                    0
                })
            },
        );
        emitted?;
        if !readable {
            // Checked when the transport made the packet; lost like a refused one if not.
            tracing::warn!(
                qpn = transmit.src_qpn,
                "not sent: its payload could not be read"
            );
            self.stats.tx_failed += 1;
            self.endpoint.transmit_failed();
            return Ok(true);
        }
        match sent {
            Ok(()) => {
                self.stats.tx_frames += 1;
                // A multicast datagram also reaches our own attached QPs while the host is
                // a member of its group, as the kernel loops it back to rxe.
                let dgid = transmit.packet.av.dgid;
                if is_group_mac(&dst) && self.endpoint.mcast_loopback(&dgid) {
                    self.loop_back(now, transmit, &headers)?;
                }
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                self.stats.tx_full += 1;
                return Ok(false);
            }
            Err(error) if concerns_one_packet(&error) => {
                tracing::debug!(qpn = transmit.src_qpn, %error, "not sent: the link refused it");
                self.stats.tx_failed += 1;
                self.endpoint.transmit_failed();
            }
            Err(error) => return Err(error),
        }
        Ok(true)
    }
}

/// Whether a send error is about this packet or its destination (no route, too big for the
/// path, refused by a firewall, no buffer now) rather than about the backend itself: such a
/// packet is lost, as on a wire, and the transport recovers or reports it; the engine goes on.
fn concerns_one_packet(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(
            libc::EMSGSIZE
                | libc::ENETUNREACH
                | libc::EHOSTUNREACH
                | libc::EHOSTDOWN
                | libc::ENETDOWN
                | libc::EADDRNOTAVAIL
                | libc::EINVAL
                | libc::EPERM
                | libc::EACCES
                | libc::ENOBUFS
                | libc::ECONNREFUSED
        )
    )
}

/// Parses, checks and hands one received frame to the endpoint, if it is addressed to `mac`
/// or a group address; the frame, parsed, if it was RoCEv2 and to us.
fn receive<'a>(
    endpoint: &mut Endpoint,
    stats: &mut EngineStats,
    mac: [u8; 6],
    now: Instant,
    bytes: &'a [u8],
) -> Option<FrameRepr<'a>> {
    stats.rx_frames += 1;
    // A group's frame is worth parsing only while a QP of ours is in a group.
    let to_us = bytes.first_chunk::<6>().is_some_and(|dst| {
        *dst == mac || (is_group_mac(dst) && endpoint.mcast_groups().next().is_some())
    });
    if !to_us {
        tracing::trace!(len = bytes.len(), "dropped: not to our MAC");
        stats.rx_not_ours += 1;
        return None;
    }
    let parsed = Frame::new_checked(bytes).and_then(|frame| FrameRepr::parse(&frame));
    match parsed {
        Ok(repr) => {
            endpoint.handle_packet(now, &repr);
            Some(repr)
        }
        Err(FrameError::NotRoce) => {
            stats.rx_other += 1;
            None
        }
        Err(error) => {
            tracing::debug!(?error, len = bytes.len(), "dropped: RoCEv2 frame rejected");
            stats.rx_rejected += 1;
            None
        }
    }
}

/// Neighbours learnt from CM MADs held at most (a flood of forged sources cannot grow the
/// tables further).
const MAX_LEARNT: usize = 4096;

/// Learns the MAC of a peer whose CM MAD (to QP 1) arrived, unless its MAC is known: our
/// answer (a REJ to a port nobody listens on, a REP) then leaves without a neighbour
/// lookup, as the kernel CM answers from the received packet's addresses.
fn learn_cm_peer(
    addressing: &mut Addressing,
    neighbours6: &mut HashMap<Ipv6Addr, [u8; 6]>,
    repr: &FrameRepr,
) {
    if repr.bth.dest_qpn != 1 {
        return;
    }
    let mac = repr.ethernet.src;
    match &repr.ip {
        IpRepr::V4(ip) if addressing.neighbours.len() < MAX_LEARNT => {
            addressing.neighbours.entry(ip.src).or_insert(mac);
        }
        IpRepr::V6(ip) if neighbours6.len() < MAX_LEARNT => {
            neighbours6.entry(ip.src).or_insert(mac);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{memory_pair, MemoryBackend};
    use roce_transport::cq::WcStatus;
    use roce_transport::mr::PdId;
    use roce_transport::qp::{QpCaps, QpInit};
    use roce_transport::qp_state::{connect_attrs, ud_attrs, AddressVector, PathMtu, Peer, QpType};
    use roce_transport::wr::{RecvWr, SendFlags, SendOp, SendWr, SgList, Sge, UdDest};
    use roce_transport::AccessFlags;
    use roce_wire::multicast::MULTICAST_QPN;
    use roce_wire::Psn;
    use std::time::Duration;

    /// A backend whose every send fails with `errno`.
    struct Refusing(i32);

    impl Backend for Refusing {
        fn transmit(
            &mut self,
            _: usize,
            _: u16,
            _: &mut dyn FnMut(&mut [u8]) -> usize,
        ) -> io::Result<()> {
            Err(io::Error::from_raw_os_error(self.0))
        }
        fn receive(&mut self, _: usize, _: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
            Ok(0)
        }
        fn wait(&mut self, _: Option<Duration>) -> io::Result<()> {
            Ok(())
        }
    }

    /// A backend that always has one more frame waiting (up to a bound, so a receive loop
    /// that never yields ends instead of hanging the test), and notes when it sent.
    struct Flooded {
        frame: Vec<u8>,
        received: usize,
        sent_after: Vec<usize>,
    }

    impl Backend for Flooded {
        fn transmit(
            &mut self,
            _: usize,
            _: u16,
            _: &mut dyn FnMut(&mut [u8]) -> usize,
        ) -> io::Result<()> {
            self.sent_after.push(self.received);
            Ok(())
        }
        fn receive(&mut self, budget: usize, handler: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
            let taken = budget.min(1_000_000 - self.received);
            for _ in 0..taken {
                handler(&self.frame);
            }
            self.received += taken;
            Ok(taken)
        }
        fn wait(&mut self, _: Option<Duration>) -> io::Result<()> {
            Ok(())
        }
    }

    /// A frame of junk to UDP 4791 addressed to `mac`.
    fn junk_to(mac: [u8; 6]) -> Vec<u8> {
        let mut frame = vec![0x5a; 120];
        frame[..6].copy_from_slice(&mac);
        frame
    }

    #[test]
    fn a_flood_of_input_does_not_hold_back_output() {
        let flooded = |mac| Flooded {
            frame: junk_to(mac),
            received: 0,
            sent_after: Vec::new(),
        };
        for mac in [OUR_MAC, [0xff; 6]] {
            let mut engine = engine_with_a_send(flooded(mac));
            engine.poll().unwrap();
            let backend = engine.backend();
            assert_eq!(
                backend.sent_after,
                [Engine::<Flooded>::RX_BUDGET],
                "one turn: a batch in, the SEND out"
            );
            assert!(engine.poll_timeout().is_some_and(|at| at <= Instant::now()));
        }
    }

    /// Keeps every frame sent.
    #[derive(Default)]
    struct Recording(Vec<Vec<u8>>);

    impl Backend for Recording {
        fn transmit(
            &mut self,
            len: usize,
            _: u16,
            fill: &mut dyn FnMut(&mut [u8]) -> usize,
        ) -> io::Result<()> {
            let mut frame = vec![0; len];
            let written = fill(&mut frame);
            frame.truncate(written);
            self.0.push(frame);
            Ok(())
        }
        fn receive(&mut self, _: usize, _: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
            Ok(0)
        }
        fn wait(&mut self, _: Option<Duration>) -> io::Result<()> {
            Ok(())
        }
    }

    const UD_PEER: Ipv4Addr = Ipv4Addr::new(10, 9, 9, 2);

    /// An engine over a [`Recording`] backend with a UD QP of `max_send_wr` sends ready,
    /// the peer at [`UD_PEER`] known as `02:00:00:00:00:02`; its QPN.
    fn ud_sender(max_send_wr: u32) -> (Engine<Recording>, u32) {
        let mut endpoint = Endpoint::new([3; 32]);
        let pd: PdId = endpoint.mrs().alloc_pd();
        let cq = endpoint.create_cq(2 * max_send_wr as usize).unwrap();
        let caps = QpCaps {
            max_send_wr,
            ..QpCaps::default()
        };
        let init = QpInit {
            pd,
            qp_type: QpType::Ud,
            caps,
            sq_sig_all: false,
        };
        let qpn = endpoint.create_qp(init, cq, cq).unwrap();
        for attr in ud_attrs(0x11, Psn::new(1)) {
            endpoint.modify_qp(Instant::now(), qpn, &attr).unwrap();
        }
        let addressing = Addressing {
            mac: OUR_MAC,
            ip: Ipv4Addr::new(10, 9, 9, 1),
            neighbours: HashMap::from([(UD_PEER, [2, 0, 0, 0, 0, 2])]),
        };
        (Engine::new(endpoint, Recording::default(), addressing), qpn)
    }

    /// An empty UD SEND to [`UD_PEER`] with IP TTL `hop_limit`.
    fn ud_send(hop_limit: u8) -> SendWr {
        SendWr {
            wr_id: 1,
            op: SendOp::Send,
            sg_list: SgList::new(),
            inline_data: Vec::new(),
            flags: SendFlags::empty(),
            ud: Some(UdDest {
                av: AddressVector {
                    dgid: UD_PEER.to_ipv6_mapped().octets(),
                    sgid_index: 1,
                    hop_limit,
                    traffic_class: 0,
                    flow_label: 0,
                },
                remote_qpn: 0x12,
                remote_qkey: 0x11,
            }),
            xrc_srqn: 0,
        }
    }

    #[test]
    fn a_turn_sends_at_most_its_budget() {
        let budget = Engine::<Recording>::TX_BUDGET;
        let (mut engine, qpn) = ud_sender(2 * budget as u32);
        let now = Instant::now();
        for _ in 0..budget + 10 {
            engine.endpoint().post_send(now, qpn, &ud_send(64)).unwrap();
        }
        engine.poll().unwrap();
        assert_eq!(engine.backend().0.len(), budget, "one turn, one budget");
        engine.poll().unwrap();
        assert_eq!(
            engine.backend().0.len(),
            budget + 10,
            "the rest in the next"
        );
    }

    /// The link headers a flow's first packet built are not kept past what they were built
    /// from: a neighbour's new MAC, or another hop limit in the address vector, shows in
    /// the very next frame.
    #[test]
    fn frames_follow_a_changed_neighbour_and_address_vector() {
        let (mut engine, qpn) = ud_sender(16);
        let sent = |engine: &mut Engine<Recording>, hop_limit| {
            let now = Instant::now();
            engine
                .endpoint()
                .post_send(now, qpn, &ud_send(hop_limit))
                .unwrap();
            engine.poll().unwrap();
            let frame = engine.backend().0.pop().expect("a frame");
            let parsed = FrameRepr::parse(&Frame::new_checked(&frame[..]).unwrap()).unwrap();
            let IpRepr::V4(ip) = parsed.ip else {
                panic!("not IPv4: {parsed:?}")
            };
            (parsed.ethernet.dst, ip.ttl)
        };
        assert_eq!(sent(&mut engine, 64), ([2, 0, 0, 0, 0, 2], 64));
        assert_eq!(sent(&mut engine, 64), ([2, 0, 0, 0, 0, 2], 64));
        engine.add_neighbour(UD_PEER, [2, 0, 0, 0, 0, 3]);
        assert_eq!(sent(&mut engine, 64), ([2, 0, 0, 0, 0, 3], 64));
        assert_eq!(sent(&mut engine, 9), ([2, 0, 0, 0, 0, 3], 9));
    }

    #[test]
    fn only_frames_to_our_mac_or_while_in_a_group_a_group_address_are_parsed() {
        let (wire, _peer) = memory_pair();
        let (mut engine, _, qpn) = engine_in_group(wire, 1);
        let mac = engine.addressing().mac;
        let now = Instant::now();
        let parsed = |engine: &mut Engine<MemoryBackend>| {
            let before = engine.stats;
            for to in [[0xff; 6], [0x01, 0, 0x5e, 0, 0, 1], [2, 0, 0, 0, 0, 9], mac] {
                receive(
                    &mut engine.endpoint,
                    &mut engine.stats,
                    mac,
                    now,
                    &junk_to(to),
                );
            }
            let stats = engine.stats;
            let rejected = stats.rx_other + stats.rx_rejected;
            (
                stats.rx_not_ours - before.rx_not_ours,
                rejected - before.rx_other - before.rx_rejected,
            )
        };
        assert_eq!(parsed(&mut engine), (1, 3));
        engine.endpoint().detach_mcast(qpn, GROUP).unwrap();
        assert_eq!(parsed(&mut engine), (3, 1));
    }

    /// 239.1.2.3 as a GID, and its MAC.
    const GROUP: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 239, 1, 2, 3];
    const GROUP_MAC: [u8; 6] = [0x01, 0x00, 0x5E, 0x01, 0x02, 0x03];

    /// An engine at 10.9.9.`host` on `backend` with a UD QP at RTS attached to [`GROUP`],
    /// one receive posted: the engine, its CQ and the QP.
    fn engine_in_group(
        backend: MemoryBackend,
        host: u8,
    ) -> (Engine<MemoryBackend>, roce_transport::CqId, u32) {
        let mut endpoint = Endpoint::new([host; 32]);
        let pd: PdId = endpoint.mrs().alloc_pd();
        let cq = endpoint.create_cq(8).unwrap();
        let init = QpInit {
            pd,
            qp_type: QpType::Ud,
            caps: QpCaps::default(),
            sq_sig_all: false,
        };
        let qpn = endpoint.create_qp(init, cq, cq).unwrap();
        let now = Instant::now();
        for attr in ud_attrs(0x0123_4567, Psn::new(0)) {
            endpoint.modify_qp(now, qpn, &attr).unwrap();
        }
        let key = endpoint
            .mrs()
            .reg_mr(pd, 0x1000, 64, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let mut sg_list = SgList::new();
        sg_list.push(Sge {
            addr: 0x1000,
            length: 64,
            lkey: key,
        });
        let recv = RecvWr { wr_id: 7, sg_list };
        endpoint.post_recv(now, qpn, &recv).unwrap();
        endpoint.attach_mcast(qpn, GROUP).unwrap();
        let addressing = Addressing {
            mac: [2, 0, 0, 0, 0, host],
            ip: Ipv4Addr::new(10, 9, 9, host),
            neighbours: HashMap::new(),
        };
        (Engine::new(endpoint, backend, addressing), cq, qpn)
    }

    fn send_to_group(engine: &mut Engine<MemoryBackend>, qpn: u32) {
        let wr = SendWr {
            wr_id: 1,
            op: SendOp::Send,
            sg_list: SgList::new(),
            inline_data: vec![9; 8],
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
            ud: Some(UdDest {
                av: AddressVector {
                    dgid: GROUP,
                    sgid_index: 1,
                    hop_limit: 64,
                    traffic_class: 0,
                    flow_label: 0,
                },
                remote_qpn: MULTICAST_QPN,
                remote_qkey: 0x0123_4567,
            }),
            xrc_srqn: 0,
        };
        engine
            .endpoint()
            .post_send(Instant::now(), qpn, &wr)
            .unwrap();
        engine.poll().unwrap();
    }

    /// Receive completions on `cq` after a few turns.
    fn received(engine: &mut Engine<MemoryBackend>, cq: roce_transport::CqId) -> Vec<u64> {
        let mut done = Vec::new();
        for _ in 0..5 {
            engine.poll().unwrap();
            engine.endpoint().cq(cq).poll(8, &mut done);
        }
        done.iter()
            .filter(|wc| wc.opcode == roce_transport::cq::WcOpcode::Recv)
            .map(|wc| wc.wr_id)
            .collect()
    }

    /// A datagram to a group leaves to the group's MAC with no neighbour known, reaches the
    /// peer's attached QP, and comes back to the sender's own attached QP only once its host
    /// is a member of the group.
    #[test]
    fn datagrams_to_a_group_go_to_its_mac_and_loop_back_only_to_members() {
        let (wire_a, wire_b) = memory_pair();
        let (mut a, cq_a, qp_a) = engine_in_group(wire_a, 1);
        let (mut b, cq_b, _) = engine_in_group(wire_b, 2);
        send_to_group(&mut a, qp_a);
        let mut frame = [0u8; 256];
        b.backend()
            .recv(&mut frame)
            .unwrap()
            .expect("a frame on the wire");
        assert_eq!(frame[..6], GROUP_MAC);
        assert_eq!(frame[14 + 16..14 + 20], GROUP[12..]);
        assert_eq!((a.stats.tx_frames, a.stats.looped_back), (1, 0));
        assert!(received(&mut a, cq_a).is_empty());

        a.endpoint().set_mcast_loopback(GROUP, true);
        send_to_group(&mut a, qp_a);
        assert_eq!(a.stats.looped_back, 1);
        assert_eq!(received(&mut a, cq_a), [7]);
        assert_eq!(received(&mut b, cq_b), [7]);
        assert_eq!(b.stats.rx_not_ours, 0);
    }

    const OUR_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];

    /// An engine with one connected RC QP and one SEND posted.
    fn engine_with_a_send<B: Backend>(backend: B) -> Engine<B> {
        engine_with_a_send_to(backend, Ipv4Addr::new(10, 9, 9, 2), None).0
    }

    /// An engine at 10.9.9.1 with one RC QP connected to `peer_ip` (QP 0x11, or itself when
    /// `None`) and one SEND posted: the engine, its CQ, the QP.
    fn engine_with_a_send_to<B: Backend>(
        backend: B,
        peer_ip: Ipv4Addr,
        peer_qpn: Option<u32>,
    ) -> (Engine<B>, roce_transport::CqId, u32) {
        let mut endpoint = Endpoint::new([3; 32]);
        let pd: PdId = endpoint.mrs().alloc_pd();
        let cq = endpoint.create_cq(8).unwrap();
        let init = QpInit {
            pd,
            qp_type: QpType::Rc,
            caps: QpCaps::default(),
            sq_sig_all: false,
        };
        let qpn = endpoint.create_qp(init, cq, cq).unwrap();
        let peer = Peer {
            av: AddressVector {
                dgid: peer_ip.to_ipv6_mapped().octets(),
                sgid_index: 1,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: 0,
            },
            qpn: peer_qpn.unwrap_or(qpn),
            psn: Psn::new(1),
        };
        let now = Instant::now();
        let retry = Default::default();
        for attr in connect_attrs(QpType::Rc, peer, Psn::new(1), PathMtu::Mtu1024, retry) {
            endpoint.modify_qp(now, qpn, &attr).unwrap();
        }
        let recv = RecvWr {
            wr_id: 2,
            sg_list: SgList::new(),
        };
        endpoint.post_recv(now, qpn, &recv).unwrap();
        let wr = SendWr {
            wr_id: 1,
            op: SendOp::Send,
            sg_list: SgList::new(),
            inline_data: Vec::new(),
            flags: SendFlags::SIGNALED,
            ud: None,
            xrc_srqn: 0,
        };
        endpoint.post_send(now, qpn, &wr).unwrap();
        let addressing = Addressing {
            mac: OUR_MAC,
            ip: Ipv4Addr::new(10, 9, 9, 1),
            neighbours: HashMap::from([(Ipv4Addr::new(10, 9, 9, 2), [2, 0, 0, 0, 0, 2])]),
        };
        (Engine::new(endpoint, backend, addressing), cq, qpn)
    }

    #[test]
    fn packets_to_our_own_address_loop_back_without_the_backend() {
        // Any frame handed to this backend would stop the engine.
        let (mut engine, cq, qpn) =
            engine_with_a_send_to(Refusing(libc::EBADF), Ipv4Addr::new(10, 9, 9, 1), None);
        let mut done = Vec::new();
        for _ in 0..10 {
            engine.poll().expect("nothing reaches the backend");
            engine.endpoint().cq(cq).poll(8, &mut done);
        }
        let mut ids: Vec<u64> = done.iter().map(|wc| wc.wr_id).collect();
        ids.sort_unstable();
        assert_eq!(ids, [1, 2], "{done:?}");
        assert!(done
            .iter()
            .all(|wc| wc.status == WcStatus::Success && wc.qp_num == qpn));
        // The SEND and its ACK.
        let stats = engine.stats;
        assert_eq!((stats.looped_back, stats.tx_frames), (2, 0), "{stats:?}");
    }

    #[test]
    fn a_packet_refused_for_its_own_sake_is_lost_not_fatal() {
        for errno in [libc::ENETUNREACH, libc::EMSGSIZE, libc::EPERM, libc::EINVAL] {
            let mut engine = engine_with_a_send(Refusing(errno));
            engine.poll().expect("the engine goes on");
            assert_eq!(engine.stats.tx_failed, 1, "errno {errno}");
            let counters = engine.endpoint().counters();
            assert_eq!(
                (counters.sent_pkts, counters.send_err),
                (0, 1),
                "as rxe counts it"
            );
        }
    }

    #[test]
    fn a_broken_backend_stops_the_engine() {
        let mut engine = engine_with_a_send(Refusing(libc::EBADF));
        assert!(engine.poll().is_err());
    }
}
