//! A switch for the simulator: every node hangs off one port of it by a link of one speed.
//! A node's NIC puts its frames on its link one after the other at that speed; the switch
//! queues each frame at the egress port of its destination (a FIFO shared by every flow to
//! that node), drops what does not fit in `buffer`, and sends at the same speed. It marks
//! ECN-capable frames CE as DCQCN's switches do, RED on the queue's length in bytes (never
//! below `kmin`, always from `kmax`, linearly up to `pmax` between), taken when the frame
//! starts to leave: marking at dequeue, as shared-buffer switches do, so the mark reports
//! the queue it leaves behind and is not delayed by the queue it waited in.
//!
//! Serialisation counts the whole frame plus what Ethernet spends around it on the wire
//! (FCS, preamble, inter-frame gap).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rand_core::Rng;

use super::chance;
use crate::congestion::Rate;

/// Bytes a frame occupies on the wire besides its own: FCS 4, preamble 8, gap 12.
pub const WIRE_OVERHEAD: u64 = 24;

/// The switch and its links.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SwitchConfig {
    /// Speed of every link and port.
    pub rate: Rate,
    /// Propagation delay of every link (node to switch, switch to node); it replaces the
    /// [`LinkConfig`](super::LinkConfig)'s latency.
    pub latency: Duration,
    /// Bytes an egress queue holds; a frame that does not fit is dropped.
    pub buffer: u64,
    /// Queue length, in bytes, from which ECN-capable frames may be marked CE.
    pub kmin: u64,
    /// Queue length from which every ECN-capable frame is marked.
    pub kmax: u64,
    /// Marking probability just below `kmax`.
    pub pmax: f64,
}

impl Default for SwitchConfig {
    /// A 10 Gb/s top-of-rack switch: 1 µs links, 512 KiB per egress port, marking from
    /// the DCQCN paper's Kmin (5 KB) up to certainty at 50 KB (Pmax 50 %), where mlx5's
    /// DCQCN keeps an 8-to-1 incast without loss (`docs/performance.md` has the sweep).
    fn default() -> Self {
        SwitchConfig {
            rate: Rate::gbps(10),
            latency: Duration::from_micros(1),
            buffer: 512 * 1024,
            kmin: 5_000,
            kmax: 50_000,
            pmax: 0.5,
        }
    }
}

impl SwitchConfig {
    /// How likely a frame arriving to a queue of `queued` bytes is marked.
    pub fn marking_probability(&self, queued: u64) -> f64 {
        if queued <= self.kmin {
            0.0
        } else if queued >= self.kmax {
            1.0
        } else {
            self.pmax * (queued - self.kmin) as f64 / (self.kmax - self.kmin) as f64
        }
    }

    /// How long `bytes` of frame take on a link.
    pub fn serialisation(&self, bytes: usize) -> Duration {
        self.rate.time_for(bytes as u64 + WIRE_OVERHEAD)
    }
}

/// What one egress port did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Frames sent on.
    pub frames: u64,
    /// Their bytes on the wire (frame plus [`WIRE_OVERHEAD`] each).
    pub wire_bytes: u64,
    /// Frames dropped because the queue was full.
    pub dropped: u64,
    /// Frames marked CE.
    pub marked: u64,
    /// The longest the queue was, in bytes.
    pub max_queue: u64,
    /// The queue's length when last looked at (a frame's arrival or departure).
    pub queued: u64,
    /// When the first frame arrived.
    pub first_arrival: Option<Instant>,
    /// When the last frame sent finished leaving.
    pub last_departure: Option<Instant>,
}

impl PortStats {
    /// The share of the time from the first arrival to the last departure the port spent
    /// sending, at `rate`.
    pub fn utilisation(&self, rate: Rate) -> f64 {
        match (self.first_arrival, self.last_departure) {
            (Some(first), Some(last)) if last > first => {
                let busy = rate.time_for(self.wire_bytes);
                busy.as_secs_f64() / (last - first).as_secs_f64()
            }
            _ => 0.0,
        }
    }
}

/// One egress port: the frames it holds (waiting or leaving), each with when it has left.
#[derive(Debug, Default)]
struct Port {
    waiting: VecDeque<(Instant, u64)>,
    queued: u64,
    busy_until: Option<Instant>,
    stats: PortStats,
}

/// What the switch does with a frame arriving at an egress port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forward {
    /// The queue is full.
    Drop,
    /// It starts to leave at `start` (when [`Switch::depart`] decides on its mark), and
    /// reaches the far end of the port's link at `at`.
    Queued { start: Instant, at: Instant },
}

impl Port {
    /// Forgets the frames that have left by `now`.
    fn drain(&mut self, now: Instant) {
        while let Some(&(done, len)) = self.waiting.front() {
            if done > now {
                break;
            }
            self.waiting.pop_front();
            self.queued -= len;
        }
    }
}

/// The switch's state: each node's NIC and egress port.
#[derive(Debug)]
pub(crate) struct Switch {
    pub config: SwitchConfig,
    ports: Vec<Port>,
    /// When each node's NIC is free to put the next frame on its link.
    nic_free: Vec<Option<Instant>>,
}

impl Switch {
    pub fn new(config: SwitchConfig) -> Switch {
        Switch {
            config,
            ports: Vec::new(),
            nic_free: Vec::new(),
        }
    }

    fn grow(&mut self, node: usize) {
        if self.ports.len() <= node {
            self.ports.resize_with(node + 1, Port::default);
            self.nic_free.resize(node + 1, None);
        }
    }

    /// Whether `node`'s NIC may start a frame at `now`, or from when it may.
    pub fn nic_ready(&self, node: usize, now: Instant) -> Result<(), Instant> {
        match self.nic_free.get(node).copied().flatten() {
            Some(free) if free > now => Err(free),
            _ => Ok(()),
        }
    }

    /// `node`'s NIC puts a frame of `bytes` on its link at `now` (it is ready): returns
    /// when its last bit has left.
    pub fn transmit(&mut self, node: usize, now: Instant, bytes: usize) -> Instant {
        self.grow(node);
        let done = now + self.config.serialisation(bytes);
        self.nic_free[node] = Some(done);
        done
    }

    /// A frame of `bytes` for `to` has reached the switch at `now` (events reach it in time
    /// order): it is dropped or queued.
    pub fn arrive(&mut self, to: usize, now: Instant, bytes: usize) -> Forward {
        self.grow(to);
        let config = self.config;
        let port = &mut self.ports[to];
        port.stats.first_arrival.get_or_insert(now);
        port.drain(now);
        let len = bytes as u64 + WIRE_OVERHEAD;
        if port.queued + len > config.buffer {
            port.stats.dropped += 1;
            return Forward::Drop;
        }
        let start = port.busy_until.map_or(now, |busy| busy.max(now));
        let done = start + config.rate.time_for(len);
        port.busy_until = Some(done);
        port.waiting.push_back((done, len));
        port.queued += len;
        port.stats.max_queue = port.stats.max_queue.max(port.queued);
        port.stats.frames += 1;
        port.stats.wire_bytes += len;
        port.stats.last_departure = Some(done);
        Forward::Queued {
            start,
            at: done + config.latency,
        }
    }

    /// A frame queued for `to` starts to leave at `now`: whether to mark it CE (when it is
    /// ECN-capable, `ect`), on the queue's length now, itself included.
    pub fn depart(&mut self, to: usize, now: Instant, ect: bool, rng: &mut impl Rng) -> bool {
        self.grow(to);
        let config = self.config;
        let port = &mut self.ports[to];
        port.drain(now);
        let mark = ect && chance(rng, config.marking_probability(port.queued));
        if mark {
            port.stats.marked += 1;
        }
        mark
    }

    /// What the egress port to `node` did.
    pub fn port_stats(&self, node: usize) -> PortStats {
        self.ports
            .get(node)
            .map_or_else(PortStats::default, |port| PortStats {
                queued: port.queued,
                ..port.stats
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha8Rng;
    use rand_core::SeedableRng;

    #[test]
    fn red_marking_probability() {
        let config = SwitchConfig {
            kmin: 1000,
            kmax: 3000,
            pmax: 0.2,
            ..SwitchConfig::default()
        };
        assert_eq!(config.marking_probability(0), 0.0);
        assert_eq!(config.marking_probability(1000), 0.0);
        assert!((config.marking_probability(2000) - 0.1).abs() < 1e-12);
        assert_eq!(config.marking_probability(3000), 1.0);
        assert_eq!(config.marking_probability(1 << 30), 1.0);
    }

    #[test]
    fn a_port_queues_marks_and_drops() {
        let config = SwitchConfig {
            rate: Rate::gbps(1),
            latency: Duration::from_micros(1),
            buffer: 4 * 1024,
            kmin: 1024,
            kmax: 2048,
            pmax: 0.5,
        };
        let mut switch = Switch::new(config);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let t0 = Instant::now();
        let latency = config.latency;
        // 1000-byte frames, five at once: 1024 wire bytes each take 8.192 µs.
        let mut outcomes = Vec::new();
        for _ in 0..5 {
            outcomes.push(switch.arrive(0, t0, 1000));
        }
        let per = Duration::from_nanos(8192);
        let mut starts = Vec::new();
        for (k, outcome) in outcomes.iter().take(4).enumerate() {
            let Forward::Queued { start, at } = *outcome else {
                panic!("frame {k} dropped");
            };
            assert_eq!(start, t0 + per * k as u32);
            assert_eq!(at, t0 + per * (k as u32 + 1) + latency);
            starts.push(start);
        }
        assert_eq!(outcomes[4], Forward::Drop, "a fifth would make 5 KiB");
        // Marked as they leave, on the queue then (themselves included): 4096, 3072 and
        // 2048 bytes reach kmax, 1024 is at kmin.
        let marks: Vec<bool> = starts
            .iter()
            .map(|&start| switch.depart(0, start, true, &mut rng))
            .collect();
        assert_eq!(marks, [true, true, true, false]);
        assert!(
            !switch.depart(0, starts[3], false, &mut rng),
            "not ECN-capable"
        );
        let stats = switch.port_stats(0);
        assert_eq!((stats.frames, stats.dropped), (4, 1));
        assert_eq!(stats.marked, 3);
        assert_eq!(stats.max_queue, 4096);
        // Once the first frame has left, the queue has room again.
        let later = t0 + per;
        assert!(matches!(
            switch.arrive(0, later, 1000),
            Forward::Queued { .. }
        ));
        assert!((switch.port_stats(0).utilisation(config.rate) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_nic_sends_one_frame_at_a_time() {
        let mut switch = Switch::new(SwitchConfig::default());
        let t0 = Instant::now();
        assert_eq!(switch.nic_ready(3, t0), Ok(()));
        let done = switch.transmit(3, t0, 1226);
        // 1250 wire bytes at 10 Gb/s: 1 µs.
        assert_eq!(done, t0 + Duration::from_micros(1));
        assert_eq!(switch.nic_ready(3, t0), Err(done));
        assert_eq!(switch.nic_ready(3, done), Ok(()));
    }
}
