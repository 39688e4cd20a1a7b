//! Drives a transport [`Endpoint`] over a [`Backend`] with the real clock: frames in, parsed
//! and checked; timers fired; packets out as rxe-shaped IPv4 frames.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use roce_transport::{Endpoint, Transmit};
use roce_wire::{Frame, FrameError, FrameRepr};

use crate::backend::{Backend, MAX_FRAME};

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
    /// Received frames that were not RoCEv2 (ARP, other UDP, ...).
    pub rx_other: u64,
    /// RoCEv2 frames dropped as malformed, with an unknown opcode or a bad ICRC.
    pub rx_rejected: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Packets dropped for want of a route (no IPv4-mapped GID, or no known neighbour).
    pub tx_unroutable: u64,
    /// Packets dropped because the backend's transmit queue was full; the transport resends
    /// them, as after a loss on the wire.
    pub tx_dropped: u64,
    /// Packets the backend refused for their own sake (no route, too big, filtered): lost.
    pub tx_failed: u64,
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
    rx: Vec<u8>,
    tx: Vec<u8>,
    /// The packet being sent, kept so its payload buffer is reused.
    outgoing: Transmit,
    /// Counters.
    pub stats: EngineStats,
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
            rx: vec![0; MAX_FRAME],
            tx: vec![0; MAX_FRAME],
            outgoing: Transmit::default(),
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

    /// Who this endpoint is on the link.
    pub fn addressing(&self) -> &Addressing {
        &self.addressing
    }

    /// Learns (or updates) the MAC of an IPv4 neighbour.
    pub fn add_neighbour(&mut self, ip: Ipv4Addr, mac: [u8; 6]) {
        self.addressing.neighbours.insert(ip, mac);
    }

    /// Learns (or updates) the MAC of an IPv6 neighbour.
    pub fn add_neighbour6(&mut self, ip: Ipv6Addr, mac: [u8; 6]) {
        self.neighbours6.insert(ip, mac);
    }

    /// Whether the MAC of this IPv6 neighbour is known.
    pub fn knows_neighbour6(&self, ip: &Ipv6Addr) -> bool {
        self.neighbours6.contains_key(ip)
    }

    /// Sets the GID table packets to IPv6 GIDs take their source address from (without
    /// one, only IPv4-mapped GIDs are reachable).
    pub fn set_gid_table(&mut self, gids: Vec<[u8; 16]>) {
        self.gids = gids;
    }

    /// Does everything possible now without blocking: every waiting frame, due timers, every
    /// packet ready to go.
    pub fn poll(&mut self) -> io::Result<()> {
        let now = Instant::now();
        while let Some(len) = self.backend.recv(&mut self.rx)? {
            receive(&mut self.endpoint, &mut self.stats, now, &self.rx[..len]);
        }
        self.endpoint.handle_timeout(now);
        let mut outgoing = std::mem::take(&mut self.outgoing);
        let mut sent = Ok(());
        while sent.is_ok() && self.endpoint.poll_transmit_into(now, &mut outgoing) {
            sent = self.transmit(&outgoing);
        }
        self.outgoing = outgoing;
        sent
    }

    /// [`poll`](Self::poll), then sleeps until a frame arrives, the next timer is due, or
    /// `max_wait` has passed, then polls again.
    pub fn run_once(&mut self, max_wait: Duration) -> io::Result<()> {
        self.poll()?;
        let until_timer = self
            .endpoint
            .poll_timeout()
            .map(|at| at.saturating_duration_since(Instant::now()));
        let wait = until_timer.map_or(max_wait, |until| until.min(max_wait));
        self.backend.wait(Some(wait))?;
        self.poll()
    }

    /// The frame for `transmit`: IPv4 from our address to a known IPv4 neighbour, or IPv6
    /// from the GID the packet names to a known IPv6 neighbour.
    fn frame<'t>(&self, transmit: &'t Transmit) -> Option<roce_wire::FrameRepr<'t>> {
        let mac = self.addressing.mac;
        if let Some(ip) = transmit.ipv4_destination() {
            let &neighbour = self.addressing.neighbours.get(&ip)?;
            return transmit.ipv4_frame(mac, self.addressing.ip, neighbour);
        }
        let ip = transmit.ipv6_destination()?;
        let &neighbour = self.neighbours6.get(&ip)?;
        let source = self.gids.get(usize::from(transmit.packet.av.sgid_index))?;
        let source = Ipv6Addr::from(*source);
        if source.to_ipv4_mapped().is_some() {
            return None;
        }
        transmit.ipv6_frame(mac, source, neighbour)
    }

    fn transmit(&mut self, transmit: &Transmit) -> io::Result<()> {
        let repr = self.frame(transmit);
        let Some(repr) = repr else {
            self.stats.tx_unroutable += 1;
            return Ok(());
        };
        let len = repr
            .emit(&mut self.tx)
            .map_err(|_| io::Error::other("packet does not fit a frame"))?;
        match self.backend.send(&self.tx[..len]) {
            Ok(()) => {
                self.stats.tx_frames += 1;
                Ok(())
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                self.stats.tx_dropped += 1;
                Ok(())
            }
            Err(error) if concerns_one_packet(&error) => {
                self.stats.tx_failed += 1;
                Ok(())
            }
            Err(error) => Err(error),
        }
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

/// Parses, checks and hands one received frame to the endpoint.
fn receive(endpoint: &mut Endpoint, stats: &mut EngineStats, now: Instant, bytes: &[u8]) {
    stats.rx_frames += 1;
    let parsed = Frame::new_checked(bytes).and_then(|frame| FrameRepr::parse(&frame));
    match parsed {
        Ok(repr) => endpoint.handle_packet(now, &repr),
        Err(FrameError::NotRoce) => stats.rx_other += 1,
        Err(_) => stats.rx_rejected += 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce_transport::mr::PdId;
    use roce_transport::qp::{QpCaps, QpInit};
    use roce_transport::qp_state::{connect_attrs, AddressVector, PathMtu, Peer, QpType};
    use roce_transport::wr::{SendFlags, SendOp, SendWr, SgList};
    use roce_wire::Psn;
    use std::time::Duration;

    /// A backend whose every send fails with `errno`.
    struct Refusing(i32);

    impl Backend for Refusing {
        fn send(&mut self, _: &[u8]) -> io::Result<()> {
            Err(io::Error::from_raw_os_error(self.0))
        }
        fn recv(&mut self, _: &mut [u8]) -> io::Result<Option<usize>> {
            Ok(None)
        }
        fn wait(&mut self, _: Option<Duration>) -> io::Result<()> {
            Ok(())
        }
    }

    /// An engine with one connected RC QP and one SEND posted.
    fn engine_with_a_send(errno: i32) -> Engine<Refusing> {
        let mut endpoint = Endpoint::new([3; 32]);
        let pd: PdId = endpoint.mrs().alloc_pd();
        let cq = endpoint.create_cq(8);
        let init = QpInit {
            pd,
            qp_type: QpType::Rc,
            send_cq: 0,
            recv_cq: 0,
            caps: QpCaps::default(),
            sq_sig_all: false,
        };
        let qpn = endpoint.create_qp(init, cq, cq).unwrap();
        let peer_ip = Ipv4Addr::new(10, 9, 9, 2);
        let peer = Peer {
            av: AddressVector {
                dgid: peer_ip.to_ipv6_mapped().octets(),
                sgid_index: 1,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: 0,
            },
            qpn: 0x11,
            psn: Psn::new(1),
        };
        let now = Instant::now();
        let retry = Default::default();
        for attr in connect_attrs(QpType::Rc, peer, Psn::new(1), PathMtu::Mtu1024, retry) {
            endpoint.modify_qp(now, qpn, &attr).unwrap();
        }
        let wr = SendWr {
            wr_id: 1,
            op: SendOp::Send,
            sg_list: SgList::new(),
            inline_data: Vec::new(),
            flags: SendFlags::SIGNALED,
            ud: None,
        };
        endpoint.post_send(now, qpn, &wr).unwrap();
        let addressing = Addressing {
            mac: [2, 0, 0, 0, 0, 1],
            ip: Ipv4Addr::new(10, 9, 9, 1),
            neighbours: HashMap::from([(peer_ip, [2, 0, 0, 0, 0, 2])]),
        };
        Engine::new(endpoint, Refusing(errno), addressing)
    }

    #[test]
    fn a_packet_refused_for_its_own_sake_is_lost_not_fatal() {
        for errno in [libc::ENETUNREACH, libc::EMSGSIZE, libc::EPERM, libc::EINVAL] {
            let mut engine = engine_with_a_send(errno);
            engine.poll().expect("the engine goes on");
            assert_eq!(engine.stats.tx_failed, 1, "errno {errno}");
        }
    }

    #[test]
    fn a_broken_backend_stops_the_engine() {
        let mut engine = engine_with_a_send(libc::EBADF);
        assert!(engine.poll().is_err());
    }
}
