//! Drives a transport [`Endpoint`] over a [`Backend`] with the real clock: frames in, parsed
//! and checked; timers fired; packets out as rxe-shaped IPv4 frames.

use std::collections::HashMap;
use std::io;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use roce_transport::{Endpoint, Transmit};
use roce_wire::{Frame, FrameError, FrameRepr};

use crate::backend::Backend;

/// Largest frame the engine sends or receives: path MTU 4096 plus every header, rounded up
/// to the two UMEM chunks an AF_XDP frame may span.
pub const MAX_FRAME: usize = 2 * 4096;

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
}

/// An endpoint, the backend it talks through, and the buffers in between.
pub struct Engine<B> {
    endpoint: Endpoint,
    backend: B,
    addressing: Addressing,
    rx: Vec<u8>,
    tx: Vec<u8>,
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
            rx: vec![0; MAX_FRAME],
            tx: vec![0; MAX_FRAME],
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

    /// Does everything possible now without blocking: every waiting frame, due timers, every
    /// packet ready to go.
    pub fn poll(&mut self) -> io::Result<()> {
        let now = Instant::now();
        while let Some(len) = self.backend.recv(&mut self.rx)? {
            receive(&mut self.endpoint, &mut self.stats, now, &self.rx[..len]);
        }
        self.endpoint.handle_timeout(now);
        while let Some(transmit) = self.endpoint.poll_transmit(now) {
            self.transmit(&transmit)?;
        }
        Ok(())
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

    fn transmit(&mut self, transmit: &Transmit) -> io::Result<()> {
        let neighbour = transmit
            .ipv4_destination()
            .and_then(|ip| self.addressing.neighbours.get(&ip));
        let repr = neighbour
            .and_then(|&mac| transmit.ipv4_frame(self.addressing.mac, self.addressing.ip, mac));
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
            Err(error) => Err(error),
        }
    }
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
