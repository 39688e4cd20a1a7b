//! A verified workload, as fio runs one: sequential or random reads, writes or a mix, of
//! one block size, every I/O queue kept `depth` commands deep, for a time or a number of
//! I/Os; then IOPS, bandwidth and completion latency percentiles.
//!
//! Verification: every write carries a pattern derived from its block, a version and a
//! seed; a read must return the pattern of the block's last completed write. So that
//! reads have something to check, a workload that reads first writes the whole region
//! (not timed), and every verified run ends by reading back every block it wrote. A block
//! with a command in flight is not given another (NVMe orders nothing between commands).

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use super::{rw_command, Controller, Error, Transfer};
use crate::wire::Status;

/// What the workload does (fio's `rw` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Sequential mix.
    ReadWrite,
    /// Random mix.
    RandReadWrite,
}

impl Mode {
    fn random(self) -> bool {
        matches!(self, Mode::RandRead | Mode::RandWrite | Mode::RandReadWrite)
    }

    fn reads(self) -> bool {
        !matches!(self, Mode::Write | Mode::RandWrite)
    }
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(text: &str) -> Result<Mode, String> {
        Ok(match text {
            "read" => Mode::Read,
            "write" => Mode::Write,
            "randread" => Mode::RandRead,
            "randwrite" => Mode::RandWrite,
            "rw" | "readwrite" => Mode::ReadWrite,
            "randrw" => Mode::RandReadWrite,
            _ => {
                return Err(format!(
                    "`{text}`: read, write, randread, randwrite, rw or randrw"
                ))
            }
        })
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Read => "read",
            Mode::Write => "write",
            Mode::RandRead => "randread",
            Mode::RandWrite => "randwrite",
            Mode::ReadWrite => "rw",
            Mode::RandReadWrite => "randrw",
        })
    }
}

/// A workload.
#[derive(Debug, Clone)]
pub struct Workload {
    /// What it does.
    pub mode: Mode,
    /// Percent of reads in a mix.
    pub read_percent: u8,
    /// Bytes per I/O.
    pub block_size: u32,
    /// The namespace.
    pub nsid: u32,
    /// Bytes of the namespace it covers from its start (0: all of it).
    pub region: u64,
    /// Commands outstanding per I/O queue.
    pub depth: usize,
    /// How long the timed phase lasts (`None`: until `ios`).
    pub duration: Option<Duration>,
    /// I/Os of the timed phase (`None`: until `duration`).
    pub ios: Option<u64>,
    /// Check every read.
    pub verify: bool,
    /// Seed of the random offsets and of the patterns.
    pub seed: u64,
}

/// One direction's figures.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// I/Os completed.
    pub ios: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Completion latency of each I/O, in nanoseconds.
    latencies: Vec<u32>,
}

impl Stats {
    fn record(&mut self, bytes: u32, latency: Duration) {
        self.ios += 1;
        self.bytes += u64::from(bytes);
        self.latencies
            .push(latency.as_nanos().min(u128::from(u32::MAX)) as u32);
    }

    /// The latency below which `percent` of the I/Os completed, in microseconds.
    pub fn percentile_us(&self, percent: f64) -> f64 {
        percentile(&self.latencies, percent)
    }

    fn merged(&self, other: &Stats) -> Stats {
        let mut latencies = self.latencies.clone();
        latencies.extend_from_slice(&other.latencies);
        latencies.sort_unstable();
        Stats {
            ios: self.ios + other.ios,
            bytes: self.bytes + other.bytes,
            latencies,
        }
    }

    fn sort(&mut self) {
        self.latencies.sort_unstable();
    }
}

fn percentile(sorted: &[u32], percent: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((percent / 100.0) * sorted.len() as f64).ceil() as usize;
    f64::from(sorted[rank.clamp(1, sorted.len()) - 1]) / 1000.0
}

/// How verification went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verified {
    /// Not asked for.
    Off,
    /// Every read matched; this many blocks were checked.
    Ok(u64),
    /// A read did not match.
    Mismatch(String),
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// The workload.
    pub workload: Workload,
    /// Reads of the timed phase.
    pub reads: Stats,
    /// Writes of the timed phase.
    pub writes: Stats,
    /// How long the timed phase took.
    pub elapsed: Duration,
    /// Verification.
    pub verified: Verified,
    /// The first failed I/O, if any.
    pub failure: Option<String>,
}

impl Report {
    /// Both directions together.
    pub fn total(&self) -> Stats {
        self.reads.merged(&self.writes)
    }

    /// Whether every I/O succeeded and, if asked, verified.
    pub fn ok(&self) -> bool {
        self.failure.is_none() && !matches!(self.verified, Verified::Mismatch(_))
    }

    /// The last line: `ios=N bytes=B iops=X p50_us=.. p99_us=.. verified=ok status=ok`.
    pub fn summary(&self) -> String {
        let total = self.total();
        let seconds = self.elapsed.as_secs_f64().max(1e-9);
        format!(
            "ios={} bytes={} iops={:.0} p50_us={:.1} p99_us={:.1} verified={} status={}",
            total.ios,
            total.bytes,
            total.ios as f64 / seconds,
            total.percentile_us(50.0),
            total.percentile_us(99.0),
            match &self.verified {
                Verified::Off => "off",
                Verified::Ok(_) => "ok",
                Verified::Mismatch(_) => "mismatch",
            },
            if self.failure.is_none() {
                "ok"
            } else {
                "error"
            }
        )
    }
}

impl fmt::Display for Report {
    /// fio's layout: per direction IOPS, bandwidth, completion latency and percentiles.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seconds = self.elapsed.as_secs_f64().max(1e-9);
        for (name, stats) in [("read", &self.reads), ("write", &self.writes)] {
            if stats.ios == 0 {
                continue;
            }
            let mib = stats.bytes as f64 / f64::from(1 << 20);
            writeln!(
                f,
                "  {name}: IOPS={:.0}, BW={:.1}MiB/s ({:.1}MB/s)({:.1}MiB/{}msec)",
                stats.ios as f64 / seconds,
                mib / seconds,
                stats.bytes as f64 / 1e6 / seconds,
                mib,
                self.elapsed.as_millis()
            )?;
            let (min, max) = (
                f64::from(*stats.latencies.first().unwrap_or(&0)) / 1000.0,
                f64::from(*stats.latencies.last().unwrap_or(&0)) / 1000.0,
            );
            let avg = stats.latencies.iter().map(|&l| f64::from(l)).sum::<f64>()
                / stats.latencies.len().max(1) as f64
                / 1000.0;
            writeln!(
                f,
                "    clat (usec): min={min:.1}, max={max:.1}, avg={avg:.1}"
            )?;
            let marks = [1.0, 5.0, 10.0, 50.0, 90.0, 99.0, 99.9];
            let row: Vec<String> = marks
                .iter()
                .map(|&p| format!("{p:.2}th=[{:.1}]", stats.percentile_us(p)))
                .collect();
            writeln!(f, "     clat percentiles (usec): {}", row.join(", "))?;
        }
        match &self.verified {
            Verified::Off => writeln!(f, "  verify: off")?,
            Verified::Ok(blocks) => writeln!(f, "  verify: {blocks} reads matched")?,
            Verified::Mismatch(what) => writeln!(f, "  verify: MISMATCH: {what}")?,
        }
        if let Some(failure) = &self.failure {
            writeln!(f, "  error: {failure}")?;
        }
        Ok(())
    }
}

/// xorshift64*: the offsets of random workloads.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The bytes a unit holds after its `version`th write.
fn fill(buffer: &mut [u8], seed: u64, unit: u64, version: u32) {
    let base = splitmix(seed ^ unit.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(version) << 40);
    for (index, word) in buffer.chunks_mut(8).enumerate() {
        let value = splitmix(base.wrapping_add(index as u64)).to_le_bytes();
        word.copy_from_slice(&value[..word.len()]);
    }
}

/// Whether `buffer` is what `fill` writes; the first byte that differs.
fn check(buffer: &[u8], seed: u64, unit: u64, version: u32) -> Option<usize> {
    let base = splitmix(seed ^ unit.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(version) << 40);
    for (index, word) in buffer.chunks(8).enumerate() {
        let value = splitmix(base.wrapping_add(index as u64)).to_le_bytes();
        if let Some(at) = word.iter().zip(value).position(|(a, b)| *a != b) {
            return Some(index * 8 + at);
        }
    }
    None
}

#[derive(Debug, Clone, Copy)]
struct Op {
    unit: u64,
    write: bool,
    version: u32,
}

/// The state of a run: what each unit holds and which are in flight.
struct Runner<'a> {
    controller: &'a mut Controller,
    workload: &'a Workload,
    /// Blocks of the namespace per I/O.
    lbas_per_io: u64,
    versions: Vec<u32>,
    busy: Vec<bool>,
    in_flight: HashMap<(usize, u16), (Op, Instant)>,
    per_queue: Vec<usize>,
    scratch: Vec<u8>,
    verified: u64,
    mismatch: Option<String>,
    failure: Option<String>,
}

/// Where the next I/O goes, or `None` when a phase has nothing more.
type Next<'n> = dyn FnMut(&Runner) -> Option<(u64, bool)> + 'n;

impl Runner<'_> {
    /// Keeps every queue full from `next` until it runs dry and everything completed;
    /// each completion is counted into `stats` (reads, writes) if given.
    fn drive(
        &mut self,
        next: &mut Next<'_>,
        mut stats: Option<(&mut Stats, &mut Stats)>,
        stop: &dyn Fn() -> bool,
    ) -> Result<(), Error> {
        let queues = self.controller.io_queues();
        let depth = self
            .workload
            .depth
            .min(self.controller.queue_depth())
            .max(1);
        let mut exhausted = false;
        let mut completed = Vec::new();
        let mut idle_since: Option<Instant> = None;
        loop {
            if stop() || self.failure.is_some() || self.mismatch.is_some() {
                exhausted = true;
            }
            if !exhausted {
                'fill: for queue in 1..=queues {
                    while self.per_queue[queue - 1] < depth && self.controller.has_free_slot(queue)
                    {
                        let Some((unit, write)) = next(self) else {
                            exhausted = true;
                            break 'fill;
                        };
                        if self.busy[unit as usize] {
                            break;
                        }
                        self.submit(queue, unit, write)?;
                    }
                }
            }
            if self.in_flight.is_empty() && exhausted {
                return Ok(());
            }
            completed.clear();
            if self.controller.poll(&mut completed)? == 0 {
                let idle = *idle_since.get_or_insert_with(Instant::now);
                if idle.elapsed() >= self.controller.config.spin {
                    self.controller.wait(Duration::from_millis(100))?;
                }
                if idle.elapsed() > self.controller.config.timeout {
                    return Err(Error::Timeout("I/O completions"));
                }
                continue;
            }
            idle_since = None;
            let now = Instant::now();
            for done in completed.drain(..) {
                let Some((op, submitted)) = self.in_flight.remove(&(done.queue, done.slot)) else {
                    self.controller.release(done.queue, done.slot);
                    continue;
                };
                self.per_queue[done.queue - 1] -= 1;
                self.busy[op.unit as usize] = false;
                if !done.cqe.status.is_success() {
                    self.failure.get_or_insert(format!(
                        "{} of block {} failed: status {}",
                        if op.write { "write" } else { "read" },
                        op.unit * self.lbas_per_io,
                        done.cqe.status
                    ));
                } else if op.write {
                    self.versions[op.unit as usize] = op.version;
                } else if self.workload.verify && op.version > 0 {
                    self.controller
                        .read_buffer(done.queue, done.slot, &mut self.scratch)?;
                    match check(&self.scratch, self.workload.seed, op.unit, op.version) {
                        None => self.verified += 1,
                        Some(at) => {
                            self.mismatch.get_or_insert(format!(
                                "block {} (LBA {}), byte {at}: not what write {} put there",
                                op.unit,
                                op.unit * self.lbas_per_io,
                                op.version
                            ));
                        }
                    }
                }
                self.controller.release(done.queue, done.slot);
                if let Some((reads, writes)) = stats.as_mut() {
                    let direction = if op.write {
                        &mut **writes
                    } else {
                        &mut **reads
                    };
                    direction.record(self.workload.block_size, now.duration_since(submitted));
                }
            }
        }
    }

    fn submit(&mut self, queue: usize, unit: u64, write: bool) -> Result<(), Error> {
        let Some(slot) = self.controller.take_slot(queue) else {
            return Err(Error::Protocol("no free slot".into()));
        };
        let version = if write {
            self.versions[unit as usize].wrapping_add(1).max(1)
        } else {
            self.versions[unit as usize]
        };
        let bs = self.workload.block_size;
        if write && self.workload.verify {
            fill(&mut self.scratch, self.workload.seed, unit, version);
            self.controller.write_buffer(queue, slot, &self.scratch)?;
        }
        let lba = unit * self.lbas_per_io;
        let sqe = rw_command(write, self.workload.nsid, lba, self.lbas_per_io as u32);
        let transfer = if write {
            Transfer::ToController(bs)
        } else {
            Transfer::FromController(bs)
        };
        self.controller.submit(queue, slot, sqe, transfer)?;
        self.busy[unit as usize] = true;
        self.per_queue[queue - 1] += 1;
        self.in_flight.insert(
            (queue, slot),
            (
                Op {
                    unit,
                    write,
                    version,
                },
                Instant::now(),
            ),
        );
        Ok(())
    }
}

/// Runs `workload` on `controller`'s I/O queues; `stop` ends it early (asked before each
/// round of submissions).
pub fn run(
    controller: &mut Controller,
    workload: &Workload,
    stop: &dyn Fn() -> bool,
) -> Result<Report, Error> {
    if controller.io_queues() == 0 {
        return Err(Error::Protocol("no I/O queues".into()));
    }
    let namespace = controller.identify_namespace(workload.nsid)?;
    if namespace.nsze == 0 {
        return Err(Error::Command {
            command: "Identify Namespace",
            status: Status::INVALID_NS,
        });
    }
    let lba = 1u64 << namespace.lba_shift;
    let bs = u64::from(workload.block_size);
    if bs == 0 || bs % lba != 0 || bs > u64::from(controller.max_io()) {
        return Err(Error::Protocol(format!(
            "block size {bs}: a multiple of the namespace's {lba}-byte blocks, at most {} bytes",
            controller.max_io()
        )));
    }
    let size = namespace.nsze * lba;
    let region = if workload.region == 0 {
        size
    } else {
        workload.region.min(size)
    };
    let units = region / bs;
    if units == 0 {
        return Err(Error::Protocol(format!(
            "a {region}-byte region holds no {bs}-byte block"
        )));
    }
    let mut runner = Runner {
        lbas_per_io: bs / lba,
        versions: vec![0; units as usize],
        busy: vec![false; units as usize],
        in_flight: HashMap::new(),
        per_queue: vec![0; controller.io_queues()],
        scratch: vec![0; bs as usize],
        verified: 0,
        mismatch: None,
        failure: None,
        controller,
        workload,
    };
    // Prefill: what reads will check.
    if workload.verify && workload.mode.reads() {
        let mut cursor = 0;
        runner.drive(
            &mut |_| {
                (cursor < units).then(|| {
                    cursor += 1;
                    (cursor - 1, true)
                })
            },
            None,
            stop,
        )?;
    }
    // The timed phase.
    let mut reads = Stats::default();
    let mut writes = Stats::default();
    let start = Instant::now();
    let deadline = workload.duration.map(|d| start + d);
    let limit = workload.ios.unwrap_or(u64::MAX);
    let mut issued = 0u64;
    let mut rng = Rng(workload.seed | 1);
    let mut cursor = 0u64;
    let mode = workload.mode;
    runner.drive(
        &mut |runner| {
            if issued >= limit || deadline.is_some_and(|d| Instant::now() >= d) {
                return None;
            }
            let write = match mode {
                Mode::Read | Mode::RandRead => false,
                Mode::Write | Mode::RandWrite => true,
                Mode::ReadWrite | Mode::RandReadWrite => {
                    rng.next() % 100 >= u64::from(workload.read_percent)
                }
            };
            let unit = if mode.random() {
                // A free unit near a random one.
                let start = rng.next() % units;
                (0..units.min(64))
                    .map(|step| (start + step) % units)
                    .find(|&unit| !runner.busy[unit as usize])
                    .unwrap_or(start)
            } else {
                let unit = cursor % units;
                cursor += 1;
                unit
            };
            issued += 1;
            Some((unit, write))
        },
        Some((&mut reads, &mut writes)),
        stop,
    )?;
    let elapsed = start.elapsed();
    // Read back everything written.
    if workload.verify && runner.failure.is_none() {
        let mut cursor = 0;
        runner.drive(
            &mut |runner| {
                while cursor < units {
                    cursor += 1;
                    if runner.versions[cursor as usize - 1] > 0 {
                        return Some((cursor - 1, false));
                    }
                }
                None
            },
            None,
            stop,
        )?;
    }
    reads.sort();
    writes.sort();
    Ok(Report {
        workload: workload.clone(),
        reads,
        writes,
        elapsed,
        verified: match (workload.verify, runner.mismatch) {
            (false, _) => Verified::Off,
            (true, Some(what)) => Verified::Mismatch(what),
            (true, None) => Verified::Ok(runner.verified),
        },
        failure: runner.failure,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_by_unit_version_and_seed_and_check_catches_a_byte() {
        let mut a = vec![0u8; 4096];
        fill(&mut a, 1, 7, 1);
        assert_eq!(check(&a, 1, 7, 1), None);
        assert!(check(&a, 1, 7, 2).is_some());
        assert!(check(&a, 1, 8, 1).is_some());
        assert!(check(&a, 2, 7, 1).is_some());
        a[1000] ^= 1;
        assert_eq!(check(&a, 1, 7, 1), Some(1000));
    }

    #[test]
    fn percentiles_and_modes() {
        let mut stats = Stats::default();
        for us in 1..=100u64 {
            stats.record(512, Duration::from_micros(us));
        }
        stats.sort();
        assert_eq!(stats.percentile_us(50.0), 50.0);
        assert_eq!(stats.percentile_us(99.0), 99.0);
        assert_eq!(stats.percentile_us(100.0), 100.0);
        for mode in ["read", "write", "randread", "randwrite", "rw", "randrw"] {
            assert_eq!(mode.parse::<Mode>().unwrap().to_string(), mode);
        }
        assert!("trim".parse::<Mode>().is_err());
    }
}
