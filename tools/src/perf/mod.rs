//! `roce perf TEST [flags] [host]`: perftest's bandwidth and latency tests (`ib_send_bw`,
//! `ib_write_bw`, `ib_read_bw`, `ib_atomic_bw`, `ib_send_lat`, `ib_write_lat`,
//! `ib_read_lat`), speaking perftest 4.5's TCP exchange (port 18515) so that either side can
//! be ours or perftest's, with its main flags and its report tables.
//!
//! The exchange (perftest `src/perftest_communication.c`): the client writes first in every
//! step; a 16-byte version (`6.06`), page size and cache-line size (4-byte big-endian each,
//! both sides keep the larger), the path MTU as an `ibv_mtu` digit (both keep the smaller),
//! then 108-byte `LID:OUT_READS:QPN:PSN:RKEY:VADDR:GID:SRQN:` messages repeated as barriers,
//! for bandwidth tests the client's five 8-byte results, and `done\0`. Size and iterations
//! are not exchanged: start both sides with the same `-s` and `-n`. Every message goes out in
//! one write: perftest reads each with one read(2) and fails on a short one.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use roce_verbs::{
    AccessFlags, ConnectOptions, Context, Cq, Mr, PathMtu, Progress, Qp, QpCaps, QpEndpoint,
    QpInitAttr, QpType, RetryConfig,
};
use roce_wire::Psn;

use crate::rdma::open_device;

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
    test: Test,
    /// Connect to this server (omit to be the server).
    host: Option<Ipv4Addr>,
    /// TCP port of the exchange.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    /// Network interface to use (default: the first one, as perftest takes the first device).
    #[arg(short = 'd', long = "ib-dev")]
    device: Option<String>,
    /// Port of the device (there is only 1).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// GID index: 1 is the IPv4-mapped GID, as on rxe.
    #[arg(short = 'x', long = "gid-index", default_value_t = 1)]
    gid_index: u8,
    /// Message size (K and M suffixes); default 65536 for bandwidth, 2 for latency, 8 (fixed)
    /// for atomics.
    #[arg(short = 's', long = "size", value_parser = crate::sim::parse_size)]
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
    /// Use kernel UDP sockets instead of AF_XDP (no root needed).
    #[arg(long)]
    udp: bool,
    /// Drive the engine from a thread that never sleeps (one more core spent; without it
    /// the one program thread drives the engine itself, also while it waits on TCP).
    #[arg(long, conflicts_with = "events")]
    busy_poll: bool,
    /// Drive the engine from a thread that sleeps in poll(2) between frames.
    #[arg(long)]
    events: bool,
    /// Both sides are `roce perf`: fill buffers with a known pattern and check what arrives.
    #[arg(long)]
    verify: bool,
    /// Write every frame sent and received to this pcap file.
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,
    /// Fault injection (client of write/read/atomic tests): name the peer's memory with a
    /// key it never issued, to see its NAK (the run then fails with REM_ACCESS_ERR).
    #[arg(long)]
    wrong_rkey: bool,
    /// Fault injection (receiver of send tests): post the receives this many milliseconds
    /// after the last barrier, so the first SENDs meet an empty queue and get RNR NAKs.
    #[arg(long, value_name = "MS")]
    late_receives: Option<u64>,
}

/// Runs `roce perf`.
pub fn run(args: &Args) -> ExitCode {
    match perf(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("roce perf: {error}");
            ExitCode::FAILURE
        }
    }
}

/// What perftest sends as its version (`configure.ac` of perftest 4.5-0.17).
const VERSION: &[u8; 4] = b"6.06";
/// Our page size and cache line, as perftest reads them (the peer's may be larger).
const PAGE: u32 = 4096;
const CACHE_LINE: u32 = 64;
/// READs and atomics our responder holds state for, advertised as OUT_READS.
const OUR_OUT_READS: u8 = 16;
/// perftest's iteration count above which no peak is computed.
const NO_PEAK_ITERS: u64 = 20_000;
const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Send,
    Write,
    Read,
    Atomic,
}

impl Test {
    fn verb(self) -> Verb {
        match self {
            Test::SendBw | Test::SendLat => Verb::Send,
            Test::WriteBw | Test::WriteLat => Verb::Write,
            Test::ReadBw | Test::ReadLat => Verb::Read,
            Test::AtomicBw => Verb::Atomic,
        }
    }

    fn is_latency(self) -> bool {
        matches!(self, Test::SendLat | Test::WriteLat | Test::ReadLat)
    }
}

/// The sizes and depths of a run, after perftest's defaults and the exchange.
#[derive(Debug, Clone, Copy)]
struct Params {
    test: Test,
    /// QPs (`-q`), each with its own part of the buffer.
    qps: u64,
    client: bool,
    size: u64,
    iters: u64,
    tx_depth: u64,
    rx_depth: u64,
    cq_mod: u64,
    /// Page size and cache line, the larger of both sides'.
    cycle_buffer: u64,
    cache_line: u64,
    mtu: PathMtu,
    atomic: AtomicType,
    gbits: bool,
    verify: bool,
}

impl Params {
    /// perftest's `BUFF_SIZE`: one side's window.
    fn buff_size(&self) -> u64 {
        self.size.max(self.cycle_buffer)
    }

    /// perftest's `INC`: the step between addresses when they cycle.
    fn step(&self, bytes: u64) -> u64 {
        if bytes > self.cache_line {
            bytes.div_ceil(self.cache_line) * self.cache_line
        } else {
            self.cache_line
        }
    }

    /// Offset of the `n`th operation in the window: bandwidth tests of at most half a page
    /// walk it in cache-line steps, everything else hits its start.
    fn offset(&self, n: u64) -> u64 {
        if self.test.is_latency() || self.size > self.cycle_buffer / 2 {
            return 0;
        }
        let step = self.step(self.size);
        (n % (self.cycle_buffer / step).max(1)) * step
    }
}

fn path_mtu_from_enum(value: u8) -> Option<PathMtu> {
    Some(match value {
        1 => PathMtu::Mtu256,
        2 => PathMtu::Mtu512,
        3 => PathMtu::Mtu1024,
        4 => PathMtu::Mtu2048,
        5 => PathMtu::Mtu4096,
        _ => return None,
    })
}

/// The pattern `--verify` fills buffers with, by offset in the window.
fn pattern(offset: u64) -> u8 {
    (offset * 7 + offset / 251 + 1) as u8
}

pub(crate) mod exchange;
mod report;
mod runs;

use exchange::{KeyMsg, Oob};
use report::{
    print_bw_header, print_bw_row, print_info, print_lat_header, print_lat_row, BwReport,
};
use runs::fill;

/// A handshake per QP, each with that QP's message (perftest's "per-QP" barriers).
fn per_qp(oob: &mut Oob, mine: &[KeyMsg]) -> io::Result<Vec<KeyMsg>> {
    mine.iter().map(|msg| oob.handshake(msg)).collect()
}

/// The verbs objects of a run.
struct Rdma<'a> {
    ctx: &'a Context,
    qps: &'a [Qp],
    cq: &'a Cq,
    /// Our buffer, perftest's layout: for each QP in turn, `BUFF_SIZE` bytes of what it
    /// sends (and READs into); then for each QP the window the peer reaches.
    buf: &'a Mr,
    params: Params,
}

fn perf(args: &Args) -> io::Result<()> {
    if args.ib_port != 1 {
        return Err(io::Error::other("only port 1 exists"));
    }
    let test = args.test;
    let verb = test.verb();
    if args.atomic_type.is_some() && verb != Verb::Atomic {
        return Err(io::Error::other(
            "You are not running the atomic_lat/bw test!",
        ));
    }
    if verb == Verb::Atomic && args.size.is_some_and(|size| size != 8) {
        return Err(io::Error::other(
            "Message size cannot be changed for Atomic tests",
        ));
    }
    let _ = args.cpu_freq;
    let progress = match (args.busy_poll, args.events) {
        (true, _) => Progress::BusyPoll,
        (_, true) => Progress::Events,
        // One thread for everything: on a two-core machine running both sides, any more
        // spinning threads than cores costs milliseconds per scheduler switch.
        _ => Progress::Caller,
    };
    let ctx = open_device(
        "perf",
        args.device.as_deref(),
        args.udp,
        progress,
        args.pcap.as_deref(),
    )?;
    let active = ctx.device().query_port().active_mtu;
    let mut mtu = active;
    if let Some(bytes) = args.mtu {
        match [256, 512, 1024, 2048, 4096]
            .iter()
            .position(|&b| b == bytes)
        {
            None => println!(" Invalid MTU - {bytes}"),
            Some(index) => {
                let wanted = path_mtu_from_enum(index as u8 + 1).unwrap_or(active);
                if wanted > active {
                    println!("Requested mtu is higher than active mtu ");
                    println!("Changing to active mtu - {}", active as u8);
                } else {
                    mtu = wanted;
                }
            }
        }
    }

    let mut oob = Oob::connect(args, &ctx)?;
    let (page, line, their_mtu) = oob.preamble(mtu)?;
    // They size our buffer: a peer's nonsense must not.
    let sane = |value: u32, most: u32| value.is_power_of_two() && value <= most;
    if !sane(page, 1 << 20) || !sane(line, page.max(PAGE)) {
        return Err(io::Error::other(format!(
            "the peer's page size {page} or cache line {line} makes no sense"
        )));
    }
    if let Some(theirs) = path_mtu_from_enum(their_mtu) {
        mtu = mtu.min(theirs);
    }
    let iters = args.iters.unwrap_or(match test {
        Test::WriteBw => 5000,
        _ => 1000,
    });
    if !(5..=100_000_000).contains(&iters) {
        return Err(io::Error::other(
            "Iteration count must be between 5 and 100000000",
        ));
    }
    let size = match (verb, test.is_latency()) {
        (Verb::Atomic, _) => 8,
        (_, true) => args.size.unwrap_or(2),
        (_, false) => args.size.unwrap_or(65536),
    };
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
    if !(1..=16384).contains(&args.qps) {
        return Err(io::Error::other(
            "the number of QPs must be between 1 and 16384",
        ));
    }
    if args.qps > 1 && test.is_latency() {
        return Err(io::Error::other(" Multiple QPs only available on bw tests"));
    }
    let params = Params {
        test,
        qps: u64::from(args.qps),
        client: args.host.is_some(),
        size,
        iters,
        tx_depth,
        rx_depth: iters.min(512),
        cq_mod,
        cycle_buffer: u64::from(page.max(PAGE)),
        cache_line: u64::from(line.max(CACHE_LINE)),
        mtu,
        atomic: args.atomic_type.unwrap_or(AtomicType::FetchAndAdd),
        gbits: args.report_gbits,
        verify: args.verify,
    };
    if size > u64::from(u32::MAX / 2) {
        return Err(io::Error::other("message size too large"));
    }

    let pd = ctx.alloc_pd()?;
    let depth = (tx_depth + params.rx_depth + 16) * params.qps;
    let cq = ctx.create_cq(depth as usize, None)?;
    let qps = (0..params.qps)
        .map(|_| {
            pd.create_qp(&QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                caps: QpCaps {
                    max_send_wr: (tx_depth as u32).max(16),
                    max_recv_wr: (params.rx_depth as u32).max(1),
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            })
        })
        .collect::<Result<Vec<Qp>, _>>()?;
    let window = params.step(params.buff_size());
    let buf = pd.reg_mr((2 * window * params.qps) as usize, AccessFlags::all())?;
    fill(&buf, &params)?;
    let out_reads = if matches!(verb, Verb::Read | Verb::Atomic) {
        OUR_OUT_READS
    } else {
        1
    };
    let mine = qps
        .iter()
        .enumerate()
        .map(|(index, qp)| {
            let endpoint = qp.endpoint(args.gid_index)?;
            Ok(KeyMsg {
                lid: 0,
                out_reads: u16::from(out_reads),
                qpn: endpoint.qpn,
                psn: endpoint.psn.value(),
                rkey: buf.rkey(),
                vaddr: buf.addr() + (params.qps + index as u64) * params.buff_size(),
                gid: endpoint.gid,
                srqn: 0,
            })
        })
        .collect::<io::Result<Vec<KeyMsg>>>()?;
    print_info(&ctx, &params, args.gid_index);

    // Before connecting: one handshake per QP (two for write_lat and read_lat).
    let mut peers = per_qp(&mut oob, &mine)?;
    if matches!(test, Test::WriteLat | Test::ReadLat) {
        peers = per_qp(&mut oob, &mine)?;
    }
    if peers
        .iter()
        .any(|peer| Ipv6Addr::from(peer.gid).to_ipv4_mapped().is_none())
    {
        return Err(io::Error::other(
            " Found Incompatibility issue with GID types.",
        ));
    }
    for (mine, peer) in mine.iter().zip(&mut peers) {
        mine.print("local", test);
        peer.print("remote", test);
        if args.wrong_rkey {
            // A key the peer never issued (keys are random: a flipped key is as good as any).
            peer.rkey ^= 0x5A5A_5A5A;
        }
    }
    println!("{RESULT_LINE}");
    for (qp, peer) in qps.iter().zip(&peers) {
        let remote = QpEndpoint {
            qpn: peer.qpn & 0xFF_FFFF,
            psn: Psn::new(peer.psn & 0xFF_FFFF),
            gid: peer.gid,
        };
        let options = ConnectOptions {
            mtu,
            retry: RetryConfig::RC_PINGPONG,
            sgid_index: args.gid_index,
            hop_limit: 0xFF,
            // Each side issues at most what the other holds state for.
            max_rd_atomic: (peer.out_reads.clamp(1, u16::from(OUR_OUT_READS))) as u8,
            max_dest_rd_atomic: out_reads,
        };
        qp.connect(&remote, &options)?;
    }
    let rdma = Rdma {
        ctx: &ctx,
        qps: &qps,
        cq: &cq,
        buf: &buf,
        params,
    };
    // The barriers perftest makes with QP 0's message only.
    let single = &mine[0];

    match test {
        Test::WriteBw | Test::ReadBw | Test::AtomicBw => {
            per_qp(&mut oob, &mine)?;
            oob.handshake(single)?;
            if params.client {
                print_bw_header(&params);
                let report = rdma.run_bw_client(&peers)?;
                oob.handshake(single)?;
                // The client's results; the server's are meaningless (perftest sends garbage).
                for value in report.to_wire() {
                    oob.exchange(&value)?;
                }
                print_bw_row(&params, &report);
                println!("{RESULT_LINE}");
                rdma.verify_after(&peers)?;
            } else {
                print_bw_header(&params);
                oob.handshake(single)?;
                let mut received = Vec::new();
                for _ in 0..5 {
                    received.push(oob.exchange(&[0u8; 8])?);
                }
                let report = BwReport::from_wire(&received)?;
                print_bw_row(&params, &report);
                println!("{RESULT_LINE}");
                rdma.verify_after(&peers)?;
            }
            oob.close(single)?;
        }
        Test::SendBw | Test::SendLat => {
            oob.handshake(single)?;
            per_qp(&mut oob, &mine)?;
            // Receives are up before the last barrier: the peer sends right after it.
            let receiver = !params.client || test == Test::SendLat;
            let post_all =
                || (0..qps.len()).try_for_each(|qp| rdma.post_receives(qp, params.rx_depth));
            if receiver && args.late_receives.is_none() {
                post_all()?;
            }
            oob.handshake(single)?;
            if let (true, Some(ms)) = (receiver, args.late_receives) {
                // Meanwhile the peer's SENDs find no receive: we answer RNR NAKs.
                let until = Instant::now() + Duration::from_millis(ms);
                while Instant::now() < until {
                    ctx.progress()?;
                    std::hint::spin_loop();
                }
                post_all()?;
            }
            if test == Test::SendBw {
                print_bw_header(&params);
                let report = if params.client {
                    rdma.run_bw_client(&peers)?
                } else {
                    rdma.run_send_bw_server()?
                };
                print_bw_row(&params, &report);
                println!("{RESULT_LINE}");
            } else {
                print_lat_header();
                let posted = rdma.run_send_lat()?;
                print_lat_row(&params, &posted, 2.0);
                println!("{RESULT_LINE}");
            }
            oob.close(single)?;
        }
        Test::WriteLat => {
            oob.handshake(single)?;
            oob.handshake(single)?;
            print_lat_header();
            let posted = rdma.run_write_lat(&peers[0])?;
            print_lat_row(&params, &posted, 2.0);
            println!("{RESULT_LINE}");
            // No closing handshake: keep answering (ACKs of the peer's last WRITE) until it
            // hangs up.
            oob.linger()?;
        }
        Test::ReadLat => {
            oob.handshake(single)?;
            oob.handshake(single)?;
            if params.client {
                print_lat_header();
                let posted = rdma.run_read_lat(&peers[0])?;
                print_lat_row(&params, &posted, 1.0);
                println!("{RESULT_LINE}");
                rdma.verify_after(&peers)?;
            }
            // The server waits here while the client READs.
            oob.close(single)?;
        }
    }
    Ok(())
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
