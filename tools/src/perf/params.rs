//! What a `roce perf` run is: its command line, named as perftest names it, and the sizes
//! and depths that follow from it, perftest's defaults and what the peer says in the
//! exchange. Every option is checked here, before anything waits for a peer.

use std::io;
use std::net::IpAddr;

use roce_verbs::{Device, PathMtu};

use crate::args::{parse_size, path_mtu, path_mtu_from_enum, DeviceArgs};

/// Which perftest program this run stands in for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Test {
    /// `ib_send_bw`.
    #[value(name = "send_bw")]
    SendBw,
    /// `ib_write_bw`.
    #[value(name = "write_bw")]
    WriteBw,
    /// `ib_read_bw`.
    #[value(name = "read_bw")]
    ReadBw,
    /// `ib_atomic_bw`.
    #[value(name = "atomic_bw")]
    AtomicBw,
    /// `ib_send_lat`.
    #[value(name = "send_lat")]
    SendLat,
    /// `ib_write_lat`.
    #[value(name = "write_lat")]
    WriteLat,
    /// `ib_read_lat`.
    #[value(name = "read_lat")]
    ReadLat,
}

/// `-A`: which atomic `atomic_bw` issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AtomicType {
    /// Add 1 (perftest's default).
    #[value(name = "FETCH_AND_ADD")]
    FetchAndAdd,
    /// Compare with 0, swap in 0.
    #[value(name = "CMP_AND_SWAP")]
    CmpAndSwap,
}

/// Arguments of `roce perf`, named as perftest names them.
#[derive(clap::Args)]
pub struct Args {
    /// The test.
    #[arg(value_enum)]
    pub(super) test: Test,
    /// Connect to this server (omit to be the server).
    pub(super) host: Option<IpAddr>,
    /// TCP port of the exchange.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub(super) port: u16,
    #[command(flatten)]
    pub(super) device: DeviceArgs,
    /// GID index: 1 is the IPv4-mapped GID, as on rxe.
    #[arg(short = 'x', long = "gid-index", default_value_t = 1)]
    pub(super) gid_index: u8,
    /// Message size (K and M suffixes); default 65536 for bandwidth, 2 for latency, 8 (fixed)
    /// for atomics.
    #[arg(short = 's', long = "size", value_parser = parse_size)]
    size: Option<u64>,
    /// Iterations; default 5000 for write_bw, 1000 otherwise.
    #[arg(short = 'n', long = "iters")]
    iters: Option<u64>,
    /// QPs, each doing `-n` iterations (bandwidth tests).
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    qps: u32,
    /// Work requests in flight (bandwidth tests; default 128).
    #[arg(short = 't', long = "tx-depth")]
    tx_depth: Option<u32>,
    /// Signal every Nth work request (default 100; 1 above 8 KiB).
    #[arg(short = 'Q', long = "cq-mod")]
    cq_mod: Option<u32>,
    /// Path MTU (256-4096); above the port's active MTU it falls back to that, as perftest.
    #[arg(short = 'm', long = "mtu")]
    mtu: Option<u32>,
    /// Which atomic atomic_bw issues.
    #[arg(short = 'A', long = "atomic_type", value_enum)]
    atomic_type: Option<AtomicType>,
    /// Accepted for compatibility (perftest's CPU-frequency warning; we use the OS clock).
    #[arg(short = 'F', long = "CPU-freq")]
    cpu_freq: bool,
    /// Report bandwidth in Gb/s instead of MB/s (MiB/s, as perftest).
    #[arg(long = "report_gbits")]
    report_gbits: bool,
    /// Drive the engine from a thread that never sleeps (one more core spent; without it
    /// the one program thread drives the engine itself, also while it waits on TCP).
    #[arg(long, conflicts_with = "events")]
    pub(super) busy_poll: bool,
    /// Drive the engine from a thread that sleeps in poll(2) between frames.
    #[arg(long)]
    pub(super) events: bool,
    /// Both sides are `roce perf`: fill buffers with a known pattern and check what arrives.
    #[arg(long)]
    verify: bool,
    /// Fault injection (client of write/read/atomic tests): name the peer's memory with a
    /// key it never issued, to see its NAK (the run then fails with REM_ACCESS_ERR).
    #[arg(long)]
    pub(super) wrong_rkey: bool,
    /// Seconds to wait for the peer at any step of the TCP exchange; RDMA traffic from it
    /// counts as a sign of life (a bandwidth server waits in the exchange while the client
    /// runs).
    #[arg(long, value_name = "SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub(super) exchange_timeout: u64,
    /// Fault injection (receiver of send tests): post the receives this many milliseconds
    /// after the last barrier, so the first SENDs meet an empty queue and get RNR NAKs.
    #[arg(long, value_name = "MS")]
    pub(super) late_receives: Option<u64>,
}

/// What perftest sends as its version (`configure.ac` of perftest 4.5-0.17).
pub(super) const VERSION: &[u8; 4] = b"6.06";
/// Our page size and cache line, as perftest reads them (the peer's may be larger).
pub(super) const PAGE: u32 = 4096;
pub(super) const CACHE_LINE: u32 = 64;
/// READs and atomics our responder holds state for, advertised as OUT_READS.
pub(super) const OUR_OUT_READS: u8 = 16;
/// perftest's iteration count above which no peak is computed.
pub(super) const NO_PEAK_ITERS: u64 = 20_000;
pub(super) const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verb {
    Send,
    Write,
    Read,
    Atomic,
}

impl Test {
    pub(super) fn verb(self) -> Verb {
        match self {
            Test::SendBw | Test::SendLat => Verb::Send,
            Test::WriteBw | Test::WriteLat => Verb::Write,
            Test::ReadBw | Test::ReadLat => Verb::Read,
            Test::AtomicBw => Verb::Atomic,
        }
    }

    pub(super) fn is_latency(self) -> bool {
        matches!(self, Test::SendLat | Test::WriteLat | Test::ReadLat)
    }
}

/// The sizes and depths of a run, after perftest's defaults and the exchange.
#[derive(Debug, Clone, Copy)]
pub(super) struct Params {
    pub(super) test: Test,
    /// QPs (`-q`), each with its own part of the buffer.
    pub(super) qps: u64,
    pub(super) client: bool,
    pub(super) size: u64,
    pub(super) iters: u64,
    pub(super) tx_depth: u64,
    pub(super) rx_depth: u64,
    pub(super) cq_mod: u64,
    /// Page size and cache line, the larger of both sides'.
    pub(super) cycle_buffer: u64,
    pub(super) cache_line: u64,
    pub(super) mtu: PathMtu,
    pub(super) atomic: AtomicType,
    pub(super) gbits: bool,
    pub(super) verify: bool,
}

impl Params {
    /// perftest's `BUFF_SIZE`: one side's window.
    pub(super) fn buff_size(&self) -> u64 {
        self.size.max(self.cycle_buffer)
    }

    /// perftest's `INC`: the step between addresses when they cycle.
    pub(super) fn step(&self, bytes: u64) -> u64 {
        if bytes > self.cache_line {
            bytes.div_ceil(self.cache_line) * self.cache_line
        } else {
            self.cache_line
        }
    }

    /// Offset of the `n`th operation in the window: bandwidth tests of at most half a page
    /// walk it in cache-line steps, everything else hits its start.
    pub(super) fn offset(&self, n: u64) -> u64 {
        if self.test.is_latency() || self.size > self.cycle_buffer / 2 {
            return 0;
        }
        let step = self.step(self.size);
        (n % (self.cycle_buffer / step).max(1)) * step
    }

    /// Where, in our buffer, QP `qp`'s window the peer reaches starts (the VADDR we
    /// advertise for it): perftest's `buf + (num_qps + qp) * BUFF_SIZE`.
    pub(super) fn exposed_at(&self, qp: usize) -> usize {
        (self.qps as usize + qp) * self.buff_size() as usize
    }

    /// Where QP `qp`'s own data (what it sends, and what it READs into) starts.
    pub(super) fn local_at(&self, qp: usize) -> usize {
        qp * self.buff_size() as usize
    }

    /// READs and atomics our responder holds state for, as we advertise them.
    pub(super) fn out_reads(&self) -> u8 {
        if matches!(self.test.verb(), Verb::Read | Verb::Atomic) {
            OUR_OUT_READS
        } else {
            1
        }
    }

    /// The parameters `args` ask for, with perftest's defaults, before the device is open
    /// and the exchange starts; an error, in perftest's words where it has them, for options
    /// that cannot run.
    pub(super) fn new(args: &Args) -> io::Result<Params> {
        let test = args.test;
        let verb = test.verb();
        let refuse = |why: &str| Err(io::Error::other(why.to_string()));
        if args.atomic_type.is_some() && verb != Verb::Atomic {
            return refuse("You are not running the atomic_lat/bw test!");
        }
        if verb == Verb::Atomic && args.size.is_some_and(|size| size != 8) {
            return refuse("Message size cannot be changed for Atomic tests");
        }
        let _ = args.cpu_freq;
        let iters = args.iters.unwrap_or(match test {
            Test::WriteBw => 5000,
            _ => 1000,
        });
        if !(5..=100_000_000).contains(&iters) {
            return refuse("Iteration count must be between 5 and 100000000");
        }
        let size = match (verb, test.is_latency()) {
            (Verb::Atomic, _) => 8,
            (_, true) => args.size.unwrap_or(2),
            (_, false) => args.size.unwrap_or(65536),
        };
        if size > u64::from(u32::MAX / 2) {
            return refuse("message size too large");
        }
        if !(1..=16384).contains(&args.qps) {
            return refuse("the number of QPs must be between 1 and 16384");
        }
        if args.qps > 1 && test.is_latency() {
            return refuse(" Multiple QPs only available on bw tests");
        }
        if args.tx_depth == Some(0) {
            return refuse("the TX depth (-t) must be at least 1");
        }
        let tx_depth = if test.is_latency() {
            1
        } else {
            u64::from(args.tx_depth.unwrap_or(128)).min(iters)
        };
        let cq_mod = match args.cq_mod {
            Some(n) => u64::from(n.max(1)),
            None if size > 8192 => 1,
            None => 100,
        }
        .min(tx_depth);
        Ok(Params {
            test,
            qps: u64::from(args.qps),
            client: args.host.is_some(),
            size,
            iters,
            tx_depth,
            rx_depth: iters.min(512),
            cq_mod,
            cycle_buffer: u64::from(PAGE),
            cache_line: u64::from(CACHE_LINE),
            mtu: PathMtu::Mtu1024,
            atomic: args.atomic_type.unwrap_or(AtomicType::FetchAndAdd),
            gbits: args.report_gbits,
            verify: args.verify,
        })
    }

    /// Fits the run to the device: the MTU `-m` asks for within the port's, and a TX depth
    /// within its work-request limit.
    pub(super) fn fit(&mut self, args: &Args, device: &Device) -> io::Result<()> {
        let most = u64::from(device.query().limits.max_qp_wr);
        if self.tx_depth > most {
            return Err(io::Error::other(format!(
                "the TX depth (-t) must be at most {most}, the device's max_qp_wr"
            )));
        }
        self.mtu = requested_mtu(args.mtu, device.query_port().active_mtu);
        Ok(())
    }

    /// Takes in what the peer said in the preamble: the larger page and cache line, the
    /// smaller MTU.
    pub(super) fn agree(&mut self, page: u32, line: u32, their_mtu: u8) -> io::Result<()> {
        // They size our buffer: a peer's nonsense must not.
        let sane = |value: u32, most: u32| value.is_power_of_two() && value <= most;
        if !sane(page, 1 << 20) || !sane(line, page.max(PAGE)) {
            return Err(io::Error::other(format!(
                "the peer's page size {page} or cache line {line} makes no sense"
            )));
        }
        self.cycle_buffer = u64::from(page.max(PAGE));
        self.cache_line = u64::from(line.max(CACHE_LINE));
        if let Some(theirs) = path_mtu_from_enum(their_mtu) {
            self.mtu = self.mtu.min(theirs);
        }
        Ok(())
    }
}

/// `-m`, as perftest takes it: an MTU above the port's active MTU falls back to that, and
/// one that is not an MTU is reported and ignored.
fn requested_mtu(bytes: Option<u32>, active: PathMtu) -> PathMtu {
    let Some(bytes) = bytes else {
        return active;
    };
    match path_mtu(bytes as usize) {
        None => {
            println!(" Invalid MTU - {bytes}");
            active
        }
        Some(wanted) if wanted > active => {
            println!("Requested mtu is higher than active mtu ");
            println!("Changing to active mtu - {}", active as u8);
            active
        }
        Some(wanted) => wanted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_bandwidth_requests_walk_the_window_in_cache_lines() {
        let params = Params {
            test: Test::WriteBw,
            qps: 1,
            client: true,
            size: 64,
            iters: 1000,
            tx_depth: 128,
            rx_depth: 512,
            cq_mod: 100,
            cycle_buffer: 4096,
            cache_line: 64,
            mtu: PathMtu::Mtu1024,
            atomic: AtomicType::FetchAndAdd,
            gbits: false,
            verify: false,
        };
        let offsets: Vec<u64> = (0..66).map(|n| params.offset(n)).collect();
        assert_eq!(offsets[..3], [0, 64, 128]);
        assert_eq!(offsets[63], 0xfc0);
        assert_eq!(offsets[64..], [0, 64], "wraps after a page");
        let big = Params {
            size: 4096,
            ..params
        };
        assert_eq!(big.offset(5), 0, "above half a page: always the start");
        assert_eq!(big.buff_size(), 4096);
        assert_eq!(params.step(100), 128);
    }
}
