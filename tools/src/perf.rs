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

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use roce_verbs::{
    AccessFlags, ConnectOptions, Context, Cq, Mr, PathMtu, Progress, Qp, QpCaps, QpEndpoint,
    QpInitAttr, QpType, RecvWr, RetryConfig, SendFlags, SendOp, SendWr, WcOpcode, WcStatus,
    WorkCompletion,
};
use roce_wire::Psn;

use crate::rdma::{open_device, STALL};

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
        (n % (self.cycle_buffer / step)) * step
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

/// One side of the TCP exchange. While it waits for the peer, it keeps our engine running:
/// the peer may be in the middle of a test against us (a bandwidth server waits here).
struct Oob<'a> {
    stream: TcpStream,
    client: bool,
    ctx: &'a Context,
}

impl<'a> Oob<'a> {
    fn connect(args: &Args, ctx: &'a Context) -> io::Result<Oob<'a>> {
        let stream = if let Some(host) = args.host {
            // perftest's client does not retry; we do for a few seconds, as a courtesy to
            // scripts that start both sides at once.
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match TcpStream::connect((host, args.port)) {
                    Ok(stream) => break stream,
                    Err(error) if Instant::now() > deadline => return Err(error),
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        } else {
            println!("\n************************************");
            println!("* Waiting for client to connect... *");
            println!("************************************");
            let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, args.port))?;
            listener.accept()?.0
        };
        stream.set_nodelay(true)?;
        // Never blocks: a waiting side polls the socket and drives the engine in turn (a
        // socket timeout is a scheduler tick, 4 ms, far too coarse).
        stream.set_nonblocking(true)?;
        Ok(Oob {
            stream,
            client: args.host.is_some(),
            ctx,
        })
    }

    /// Writes the whole message; it fits the socket buffer, so it leaves in one piece.
    fn write_all(&mut self, message: &[u8]) -> io::Result<()> {
        let mut sent = 0;
        while sent < message.len() {
            match self.stream.write(&message[sent..]) {
                Ok(n) => sent += n,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => self.ctx.progress()?,
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Reads exactly `buf.len()` bytes, driving the engine while none are there.
    fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.stream.read(&mut buf[filled..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => filled += n,
                Err(error)
                    if matches!(
                        error.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) =>
                {
                    self.ctx.progress()?;
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Says we are done (half-close), then keeps the engine running until the peer closes
    /// too (perftest exits; another `roce perf` half-closes) or `STALL` passes.
    fn linger(&mut self) -> io::Result<()> {
        self.stream.shutdown(std::net::Shutdown::Write)?;
        let started = Instant::now();
        let mut scratch = [0u8; 64];
        while started.elapsed() < STALL {
            match self.stream.read(&mut scratch) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(error) if error.kind() == io::ErrorKind::ConnectionReset => return Ok(()),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => self.ctx.progress()?,
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// perftest's `ctx_xchg_data`: the client writes then reads, the server the reverse.
    fn exchange(&mut self, mine: &[u8]) -> io::Result<Vec<u8>> {
        let mut theirs = vec![0u8; mine.len()];
        if self.client {
            self.write_all(mine)?;
            self.read_exact(&mut theirs)?;
        } else {
            self.read_exact(&mut theirs)?;
            self.write_all(mine)?;
        }
        Ok(theirs)
    }

    /// Versions, page and cache-line sizes, MTU: returns the peer's (page, line, mtu enum).
    fn preamble(&mut self, mtu: PathMtu) -> io::Result<(u32, u32, u8)> {
        let mut version = [0u8; 16];
        version[..VERSION.len()].copy_from_slice(VERSION);
        let theirs = self.exchange(&version)?;
        let text = String::from_utf8_lossy(&theirs);
        let number: f64 = text
            .trim_end_matches('\0')
            .parse()
            .map_err(|_| io::Error::other(format!("peer version {text:?}")))?;
        if number < 5.70 {
            return Err(io::Error::other(
                "Current implementation is not compatible with versions older than 5.70",
            ));
        }
        let word = |bytes: Vec<u8>| -> io::Result<u32> {
            let array: [u8; 4] = bytes.try_into().map_err(|_| io::Error::other("short"))?;
            Ok(u32::from_be_bytes(array))
        };
        let page = word(self.exchange(&PAGE.to_be_bytes())?)?;
        let line = word(self.exchange(&CACHE_LINE.to_be_bytes())?)?;
        let theirs = self.exchange(&[b'0' + mtu as u8, 0])?;
        Ok((page, line, theirs[0].wrapping_sub(b'0')))
    }

    /// One 108-byte key handshake; returns the peer's message.
    fn handshake(&mut self, mine: &KeyMsg) -> io::Result<KeyMsg> {
        KeyMsg::from_wire(&self.exchange(&mine.to_wire())?)
    }

    /// perftest's `ctx_close_connection`: a handshake, then `done\0` (which nobody reads).
    fn close(mut self, mine: &KeyMsg) -> io::Result<()> {
        self.handshake(mine)?;
        self.write_all(b"done\0")?;
        Ok(())
    }
}

/// perftest's `struct pingpong_dest` as it travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KeyMsg {
    lid: u16,
    out_reads: u16,
    qpn: u32,
    psn: u32,
    rkey: u32,
    vaddr: u64,
    gid: [u8; 16],
    srqn: u32,
}

impl KeyMsg {
    const LEN: usize = 108;

    /// `"%04x:%04x:%06x:%06x:%08x:%016llx:" + 16 × "%02x:" + "%08x:"`, NUL-terminated.
    fn to_wire(self) -> [u8; Self::LEN] {
        let mut text = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        for byte in self.gid {
            text.push_str(&format!("{byte:02x}:"));
        }
        text.push_str(&format!("{:08x}:", self.srqn));
        let mut wire = [0u8; Self::LEN];
        wire[..text.len()].copy_from_slice(text.as_bytes());
        wire
    }

    fn from_wire(wire: &[u8]) -> io::Result<KeyMsg> {
        let text = String::from_utf8_lossy(wire);
        let text = text.trim_end_matches('\0');
        let bad = || io::Error::other(format!("bad key message {text:?}"));
        let fields: Vec<&str> = text.split(':').collect();
        if fields.len() < 23 {
            return Err(bad());
        }
        let hex = |i: usize| u64::from_str_radix(fields[i], 16).map_err(|_| bad());
        let mut gid = [0u8; 16];
        for (i, byte) in gid.iter_mut().enumerate() {
            *byte = hex(6 + i)? as u8;
        }
        Ok(KeyMsg {
            lid: hex(0)? as u16,
            out_reads: hex(1)? as u16,
            qpn: hex(2)? as u32,
            psn: hex(3)? as u32,
            rkey: hex(4)? as u32,
            vaddr: hex(5)?,
            gid,
            srqn: hex(22)? as u32,
        })
    }

    /// perftest's address lines.
    fn print(&self, which: &str, test: Test) {
        let mut line = format!(
            " {which} address: LID {:#06x} QPN {:#06x} PSN {:#06x}",
            self.lid, self.qpn, self.psn
        );
        if test.verb() == Verb::Read {
            line.push_str(&format!(" OUT {:#04x}", self.out_reads));
        }
        if matches!(test.verb(), Verb::Write | Verb::Read) {
            line.push_str(&format!(
                " RKey {:#08x} VAddr {:#016x}",
                self.rkey, self.vaddr
            ));
        }
        println!("{line}");
        let gid: Vec<String> = self.gid.iter().map(|b| format!("{b:02}")).collect();
        println!(" GID: {}", gid.join(":"));
    }
}

/// The verbs objects of a run.
struct Rdma<'a> {
    ctx: &'a Context,
    qp: &'a Qp,
    cq: &'a Cq,
    /// Our buffer, perftest's layout: from the start what we send (and READ into), from
    /// `BUFF_SIZE` the window the peer reaches; each part rounded up to a cache line.
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
    let params = Params {
        test,
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
    let cq = ctx.create_cq((tx_depth + params.rx_depth + 16) as usize, None)?;
    let qp = pd.create_qp(&QpInitAttr {
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
    })?;
    let window = params.step(params.buff_size());
    let buf = pd.reg_mr((2 * window) as usize, AccessFlags::all())?;
    fill(&buf, &params)?;
    let endpoint = qp.endpoint(args.gid_index)?;
    let out_reads = if matches!(verb, Verb::Read | Verb::Atomic) {
        OUR_OUT_READS
    } else {
        1
    };
    let mine = KeyMsg {
        lid: 0,
        out_reads: u16::from(out_reads),
        qpn: endpoint.qpn,
        psn: endpoint.psn.value(),
        rkey: buf.rkey(),
        vaddr: buf.addr() + params.buff_size(),
        gid: endpoint.gid,
        srqn: 0,
    };
    print_info(&ctx, &params, args.gid_index);

    // Before connecting: one handshake, two for write_lat and read_lat.
    let before_connect = if matches!(test, Test::WriteLat | Test::ReadLat) {
        2
    } else {
        1
    };
    let mut peer = mine;
    for _ in 0..before_connect {
        peer = oob.handshake(&mine)?;
    }
    if Ipv6Addr::from(peer.gid).to_ipv4_mapped().is_none() {
        return Err(io::Error::other(
            " Found Incompatibility issue with GID types.",
        ));
    }
    mine.print("local", test);
    peer.print("remote", test);
    if args.wrong_rkey {
        // A key the peer never issued (keys are random: a flipped key is as good as any).
        peer.rkey ^= 0x5A5A_5A5A;
    }
    println!("{RESULT_LINE}");
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
    let rdma = Rdma {
        ctx: &ctx,
        qp: &qp,
        cq: &cq,
        buf: &buf,
        params,
    };

    match test {
        Test::WriteBw | Test::ReadBw | Test::AtomicBw => {
            oob.handshake(&mine)?;
            oob.handshake(&mine)?;
            if params.client {
                print_bw_header(&params);
                let report = rdma.run_bw_client(&peer)?;
                oob.handshake(&mine)?;
                // The client's results; the server's are meaningless (perftest sends garbage).
                for value in report.to_wire() {
                    oob.exchange(&value)?;
                }
                print_bw_row(&params, &report);
                println!("{RESULT_LINE}");
                rdma.verify_after(&peer)?;
            } else {
                print_bw_header(&params);
                oob.handshake(&mine)?;
                let mut received = Vec::new();
                for _ in 0..5 {
                    received.push(oob.exchange(&[0u8; 8])?);
                }
                let report = BwReport::from_wire(&received)?;
                print_bw_row(&params, &report);
                println!("{RESULT_LINE}");
                rdma.verify_after(&peer)?;
            }
            oob.close(&mine)?;
        }
        Test::SendBw | Test::SendLat => {
            oob.handshake(&mine)?;
            oob.handshake(&mine)?;
            // Receives are up before the last barrier: the peer sends right after it.
            let receiver = !params.client || test == Test::SendLat;
            if receiver && args.late_receives.is_none() {
                rdma.post_receives(params.rx_depth)?;
            }
            oob.handshake(&mine)?;
            if let (true, Some(ms)) = (receiver, args.late_receives) {
                // Meanwhile the peer's SENDs find no receive: we answer RNR NAKs.
                let until = Instant::now() + Duration::from_millis(ms);
                while Instant::now() < until {
                    ctx.progress()?;
                    std::hint::spin_loop();
                }
                rdma.post_receives(params.rx_depth)?;
            }
            if test == Test::SendBw {
                print_bw_header(&params);
                let report = if params.client {
                    rdma.run_bw_client(&peer)?
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
            oob.close(&mine)?;
        }
        Test::WriteLat => {
            oob.handshake(&mine)?;
            oob.handshake(&mine)?;
            print_lat_header();
            let posted = rdma.run_write_lat(&peer)?;
            print_lat_row(&params, &posted, 2.0);
            println!("{RESULT_LINE}");
            // No closing handshake: keep answering (ACKs of the peer's last WRITE) until it
            // hangs up.
            oob.linger()?;
        }
        Test::ReadLat => {
            oob.handshake(&mine)?;
            oob.handshake(&mine)?;
            if params.client {
                print_lat_header();
                let posted = rdma.run_read_lat(&peer)?;
                print_lat_row(&params, &posted, 1.0);
                println!("{RESULT_LINE}");
                rdma.verify_after(&peer)?;
            }
            // The server waits here while the client READs.
            oob.close(&mine)?;
        }
    }
    Ok(())
}

/// What goes in our buffer before the run.
fn fill(buf: &Mr, params: &Params) -> io::Result<()> {
    let exposed_at = params.buff_size() as usize;
    buf.with_bytes_mut(|bytes| {
        let (local, exposed) = bytes.split_at_mut(exposed_at);
        if params.verify {
            let patterned = |part: &mut [u8]| {
                for (i, byte) in part.iter_mut().enumerate() {
                    *byte = pattern(i as u64);
                }
            };
            match params.test.verb() {
                // The READer's buffer stays zero, so the pattern can only come from the peer.
                Verb::Read => patterned(exposed),
                Verb::Send | Verb::Write => patterned(local),
                Verb::Atomic => {}
            }
        }
        // write_lat's payload is zeros but for its counter byte, as perftest's.
        if params.test == Test::WriteLat {
            local.fill(0);
        }
    })?;
    Ok(())
}

/// The client's results, as the five 8-byte values perftest sends.
#[derive(Debug, Clone, Copy, PartialEq)]
struct BwReport {
    size: u64,
    iters: u64,
    peak: f64,
    average: f64,
    msg_rate: f64,
}

impl BwReport {
    fn to_wire(self) -> [[u8; 8]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.peak.to_bits().to_be_bytes(),
            self.average.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }

    fn from_wire(values: &[Vec<u8>]) -> io::Result<BwReport> {
        let word = |i: usize| -> io::Result<u64> {
            let bytes: [u8; 8] = values
                .get(i)
                .and_then(|v| v.as_slice().try_into().ok())
                .ok_or_else(|| io::Error::other("short report"))?;
            Ok(u64::from_be_bytes(bytes))
        };
        Ok(BwReport {
            size: word(0)?,
            iters: word(1)?,
            peak: f64::from_bits(word(2)?),
            average: f64::from_bits(word(3)?),
            msg_rate: f64::from_bits(word(4)?),
        })
    }

    /// perftest's `print_report_bw` from post and completion times.
    fn compute(params: &Params, posted: &[Instant], completed: &[Instant]) -> BwReport {
        let n = posted.len();
        let unit = if params.gbits { 125e6 } else { 1_048_576.0 };
        let size = params.size as f64;
        let elapsed = completed[n - 1]
            .duration_since(posted[0])
            .as_secs_f64()
            .max(1e-9);
        // Peak: the best rate over any run of operations ending at a signaled completion.
        let mut peak = 0.0;
        if (n as u64) <= NO_PEAK_ITERS && params.client {
            let cq_mod = params.cq_mod as usize;
            let ends = (cq_mod - 1..n).step_by(cq_mod).chain([n - 1]);
            let mut best = f64::INFINITY;
            for j in ends {
                for (i, start) in posted.iter().enumerate().take(j + 1) {
                    let per_op =
                        completed[j].duration_since(*start).as_secs_f64() / (j - i + 1) as f64;
                    if per_op > 0.0 && per_op < best {
                        best = per_op;
                    }
                }
            }
            if best.is_finite() {
                peak = size / best / unit;
            }
        }
        BwReport {
            size: params.size,
            iters: n as u64,
            peak,
            average: size * n as f64 / elapsed / unit,
            msg_rate: n as f64 / elapsed / 1e6,
        }
    }
}

impl Rdma<'_> {
    /// Where, in our buffer, the window the peer reaches starts (the VADDR we advertise).
    fn exposed_at(&self) -> usize {
        self.params.buff_size() as usize
    }

    /// Posts up to `count` receives of one message each into the exposed window.
    fn post_receives(&self, count: u64) -> io::Result<()> {
        let wr = RecvWr {
            wr_id: 0,
            sg_list: vec![self.buf.sge(self.exposed_at(), self.params.size as u32)],
        };
        self.qp.post_recv((0..count).map(|_| wr.clone()))?;
        Ok(())
    }

    /// The `n`th request of a bandwidth client.
    fn request(&self, n: u64, peer: &KeyMsg) -> SendWr {
        let params = &self.params;
        let offset = params.offset(n);
        let remote_addr = peer.vaddr + offset;
        let rkey = peer.rkey;
        let op = match params.test.verb() {
            Verb::Send => SendOp::Send,
            Verb::Write => SendOp::RdmaWrite { remote_addr, rkey },
            Verb::Read => SendOp::RdmaRead { remote_addr, rkey },
            Verb::Atomic => match params.atomic {
                AtomicType::FetchAndAdd => SendOp::FetchAdd {
                    remote_addr,
                    rkey,
                    add: 1,
                },
                AtomicType::CmpAndSwap => SendOp::CompareSwap {
                    remote_addr,
                    rkey,
                    compare: 0,
                    swap: 0,
                },
            },
        };
        let signaled = n % params.cq_mod == params.cq_mod - 1 || n == params.iters - 1;
        SendWr {
            wr_id: n,
            op,
            sg_list: vec![self.buf.sge(offset as usize, params.size as u32)],
            inline_data: Vec::new(),
            flags: if signaled {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            },
            ud: None,
        }
    }

    /// Polls until at least one completion arrives (each must be a success).
    fn poll(&self, out: &mut Vec<WorkCompletion>) -> io::Result<()> {
        out.clear();
        let started = Instant::now();
        while self.cq.poll_into(64, out)? == 0 {
            if started.elapsed() > STALL {
                return Err(io::Error::other("no completion for 10 s"));
            }
            // Let an engine thread (--events, --busy-poll) have the core.
            std::thread::yield_now();
        }
        match out.iter().find(|wc| wc.status != WcStatus::Success) {
            Some(bad) => Err(io::Error::other(format!(
                "work request {} ({:?}) ended {:?}",
                bad.wr_id, bad.opcode, bad.status
            ))),
            None => Ok(()),
        }
    }

    /// perftest's `run_iter_bw`: `iters` requests, `tx_depth` in flight, every `cq_mod`th
    /// signaled.
    fn run_bw_client(&self, peer: &KeyMsg) -> io::Result<BwReport> {
        let params = &self.params;
        let n = params.iters as usize;
        let (mut posted, mut completed) = (Vec::with_capacity(n), vec![None; n]);
        let (mut sent, mut done) = (0u64, 0u64);
        let mut completions = Vec::new();
        let mut batch = Vec::new();
        while done < params.iters {
            batch.clear();
            while sent < params.iters && sent - done < params.tx_depth {
                batch.push(self.request(sent, peer));
                sent += 1;
            }
            if !batch.is_empty() {
                let now = Instant::now();
                posted.extend(batch.iter().map(|_| now));
                self.qp.post_send(batch.drain(..))?;
            }
            self.poll(&mut completions)?;
            let now = Instant::now();
            for wc in &completions {
                // A signaled completion also completes every unsignaled request before it.
                for slot in &mut completed[done as usize..=wc.wr_id as usize] {
                    *slot = Some(now);
                }
                done = wc.wr_id + 1;
            }
        }
        let completed: Vec<Instant> = completed
            .into_iter()
            .map(|at| at.unwrap_or_else(Instant::now))
            .collect();
        Ok(BwReport::compute(params, &posted, &completed))
    }

    /// perftest's `run_iter_bw_server`: receive `iters` SENDs, re-posting as they arrive.
    fn run_send_bw_server(&self) -> io::Result<BwReport> {
        let params = &self.params;
        let n = params.iters as usize;
        let mut arrivals = Vec::with_capacity(n);
        let mut posted = params.rx_depth;
        let mut completions = Vec::new();
        while arrivals.len() < n {
            self.poll(&mut completions)?;
            let now = Instant::now();
            for wc in &completions {
                if wc.opcode != WcOpcode::Recv || u64::from(wc.byte_len) != params.size {
                    return Err(io::Error::other(format!("unexpected completion {wc:?}")));
                }
                arrivals.push(now);
            }
            self.check_received()?;
            let more = (params.iters - posted).min(completions.len() as u64);
            self.post_receives(more)?;
            posted += more;
        }
        // The server's clock starts at the first arrival and it reports no peak.
        let report = BwReport::compute(params, &arrivals, &arrivals);
        Ok(BwReport {
            peak: 0.0,
            ..report
        })
    }

    /// With `--verify`: the exposed window holds the peer's pattern (SENDs land there).
    fn check_received(&self) -> io::Result<()> {
        if !self.params.verify {
            return Ok(());
        }
        let window = self.exposed_at();
        let size = self.params.size as usize;
        let intact = self.buf.with_bytes(|bytes| {
            bytes[window..window + size]
                .iter()
                .enumerate()
                .all(|(i, &b)| b == pattern(i as u64))
        })?;
        intact
            .then_some(())
            .ok_or_else(|| io::Error::other("a received message differs from what was sent"))
    }

    /// Checks after a bandwidth or READ run what can be checked on this side.
    fn verify_after(&self, peer: &KeyMsg) -> io::Result<()> {
        let params = &self.params;
        let window = self.exposed_at();
        let bytes = self.buf.to_vec()?;
        match (params.test.verb(), params.client) {
            // Any client: every atomic hit one of our 64 slots.
            (Verb::Atomic, false) => {
                let step = params.step(8) as usize;
                let slots = (params.cycle_buffer as usize / step).min(params.iters as usize);
                let total: u64 = (0..slots)
                    .map(|k| {
                        let at = window + k * step;
                        u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default())
                    })
                    .sum();
                let expected = match params.atomic {
                    AtomicType::FetchAndAdd => params.iters,
                    AtomicType::CmpAndSwap => 0,
                };
                if total != expected {
                    return Err(io::Error::other(format!(
                        "the atomics left {total} in our slots, expected {expected}"
                    )));
                }
                println!(" verified: {} atomics applied to our memory", params.iters);
            }
            (Verb::Write, false) if params.verify => {
                let written = (0..params.iters.min(params.cycle_buffer))
                    .map(|n| params.offset(n) as usize)
                    .collect::<std::collections::BTreeSet<_>>();
                let size = params.size as usize;
                let intact = written
                    .iter()
                    .all(|&at| (at..at + size).all(|i| bytes[window + i] == pattern(i as u64)));
                if !intact {
                    return Err(io::Error::other("the WRITEs left wrong bytes"));
                }
                println!(" verified: every byte the peer wrote");
            }
            (Verb::Read, true) if params.verify => {
                let size = params.size as usize;
                let read: std::collections::BTreeSet<usize> =
                    (0..params.iters.min(params.cycle_buffer))
                        .map(|n| params.offset(n) as usize)
                        .collect();
                let intact = read
                    .iter()
                    .all(|&at| (at..at + size).all(|i| bytes[i] == pattern(i as u64)));
                if !intact {
                    return Err(io::Error::other("the READs brought back wrong bytes"));
                }
                println!(" verified: every byte read from {:#x}", peer.vaddr);
            }
            _ => {}
        }
        Ok(())
    }

    /// perftest's `run_iter_lat_send`: the client sends first; each side answers each
    /// arrival with its next SEND.
    fn run_send_lat(&self) -> io::Result<Vec<Instant>> {
        let params = &self.params;
        let mut posted = Vec::with_capacity(params.iters as usize);
        let (mut sent, mut received, mut sends_done) = (0u64, 0u64, 0u64);
        let mut recvs_posted = params.rx_depth;
        let mut completions = Vec::new();
        let send = |n: u64| SendWr {
            wr_id: n,
            op: SendOp::Send,
            sg_list: vec![self.buf.sge(0, params.size as u32)],
            inline_data: Vec::new(),
            flags: SendFlags::SIGNALED,
            ud: None,
        };
        while sent < params.iters || received < params.iters {
            // The client sends first.
            if received < params.iters && (!params.client || sent > 0) {
                // Wait for the next arrival (send completions come along the way).
                let before = received;
                while received == before {
                    self.poll(&mut completions)?;
                    for wc in &completions {
                        match wc.opcode {
                            WcOpcode::Recv => received += 1,
                            _ => sends_done += 1,
                        }
                    }
                }
                self.check_received()?;
                let more = (params.iters - recvs_posted).min(received - before);
                self.post_receives(more)?;
                recvs_posted += more;
            }
            if sent < params.iters {
                // A few SENDs may await their ACK; never more than the send queue holds.
                while sent - sends_done >= 8 {
                    self.poll(&mut completions)?;
                    for wc in &completions {
                        match wc.opcode {
                            WcOpcode::Recv => received += 1,
                            _ => sends_done += 1,
                        }
                    }
                }
                posted.push(Instant::now());
                self.qp.post_send([send(sent)])?;
                sent += 1;
            }
        }
        Ok(posted)
    }

    /// perftest's `run_iter_lat_write`: the server writes first; each side waits for the
    /// peer's counter in the last byte of its window, then writes its own.
    fn run_write_lat(&self, peer: &KeyMsg) -> io::Result<Vec<Instant>> {
        let params = &self.params;
        let size = params.size as usize;
        let window = self.exposed_at();
        let poll_at = window + size - 1;
        let mut posted = Vec::with_capacity(params.iters as usize);
        let (mut sent, mut received) = (0u64, 0u64);
        let mut completions = Vec::new();
        while sent < params.iters || received < params.iters {
            // The server writes first.
            if received < params.iters && (params.client || sent > 0) {
                received += 1;
                let want = received as u8;
                let started = Instant::now();
                loop {
                    // Nothing but us moves the engine while we watch memory.
                    self.ctx.progress()?;
                    let mut last = [0u8];
                    self.buf.read(poll_at, &mut last)?;
                    if last[0] == want {
                        break;
                    }
                    if started.elapsed() > STALL {
                        return Err(io::Error::other(format!(
                            "no WRITE {received} from the peer"
                        )));
                    }
                    std::thread::yield_now();
                }
            }
            if sent < params.iters {
                posted.push(Instant::now());
                sent += 1;
                self.buf.write(size - 1, &[sent as u8])?;
                let write = SendWr {
                    wr_id: sent,
                    op: SendOp::RdmaWrite {
                        remote_addr: peer.vaddr,
                        rkey: peer.rkey,
                    },
                    sg_list: vec![self.buf.sge(0, params.size as u32)],
                    inline_data: Vec::new(),
                    flags: SendFlags::SIGNALED,
                    ud: None,
                };
                self.qp.post_send([write])?;
                self.poll(&mut completions)?;
            }
        }
        Ok(posted)
    }

    /// perftest's `run_iter_lat` for READ: one signaled READ at a time.
    fn run_read_lat(&self, peer: &KeyMsg) -> io::Result<Vec<Instant>> {
        let params = &self.params;
        let mut posted = Vec::with_capacity(params.iters as usize);
        let mut completions = Vec::new();
        for n in 0..params.iters {
            let read = SendWr {
                wr_id: n,
                op: SendOp::RdmaRead {
                    remote_addr: peer.vaddr,
                    rkey: peer.rkey,
                },
                sg_list: vec![self.buf.sge(0, params.size as u32)],
                inline_data: Vec::new(),
                flags: SendFlags::SIGNALED,
                ud: None,
            };
            posted.push(Instant::now());
            self.qp.post_send([read])?;
            self.poll(&mut completions)?;
        }
        Ok(posted)
    }
}

fn print_info(ctx: &Context, params: &Params, gid_index: u8) {
    let verb = match params.test.verb() {
        Verb::Send => "Send",
        Verb::Write => "RDMA_Write",
        Verb::Read => "RDMA_Read",
        Verb::Atomic => "Atomic",
    };
    let atomic = match (params.test.verb(), params.atomic) {
        (Verb::Atomic, AtomicType::FetchAndAdd) => "FETCH_AND_ADD ",
        (Verb::Atomic, AtomicType::CmpAndSwap) => "CMP_AND_SWAP ",
        _ => "",
    };
    let kind = if params.test.is_latency() {
        "Latency"
    } else {
        "BW"
    };
    println!("{RESULT_LINE}");
    println!("                    {verb} {atomic}{kind} Test");
    println!(
        " Dual-port       : OFF\t\tDevice         : {}",
        ctx.device().name
    );
    println!(" Number of qps   : 1\t\tTransport type : IB");
    println!(" Connection type : RC\t\tUsing SRQ      : OFF");
    if params.client || params.test.is_latency() {
        println!(" TX depth        : {}", params.tx_depth);
    } else if params.test.verb() == Verb::Send {
        println!(" RX depth        : {}", params.rx_depth);
    }
    if !params.test.is_latency() {
        println!(" CQ Moderation   : {}", params.cq_mod);
    }
    println!(" Mtu             : {}[B]", params.mtu.bytes());
    println!(" Link type       : Ethernet");
    println!(" GID index       : {gid_index}");
    match params.test.verb() {
        Verb::Read | Verb::Atomic => println!(" Outstand reads  : {OUR_OUT_READS}"),
        _ => println!(" Max inline data : 0[B]"),
    }
    println!(" rdma_cm QPs\t : OFF");
    println!(" Data ex. method : Ethernet");
    println!("{RESULT_LINE}");
}

fn print_bw_header(params: &Params) {
    let unit = if params.gbits { "Gb/sec" } else { "MB/sec" };
    println!(" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]");
}

fn print_bw_row(params: &Params, report: &BwReport) {
    if params.gbits && report.average < 0.1 {
        println!(
            " {:<7}    {}           {:<7.6}            {:<7.6}            {:<7.6}",
            report.size, report.iters, report.peak, report.average, report.msg_rate
        );
    } else {
        println!(
            " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
            report.size, report.iters, report.peak, report.average, report.msg_rate
        );
    }
}

fn print_lat_header() {
    println!(
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
    );
}

/// perftest's `print_report_lat`: deltas between consecutive posts over `rtt_factor`
/// (2 for ping-pongs: half a round trip), the two largest dropped.
fn print_lat_row(params: &Params, posted: &[Instant], rtt_factor: f64) {
    let mut delta: Vec<f64> = posted
        .windows(2)
        .map(|pair| pair[1].duration_since(pair[0]).as_secs_f64() * 1e6 / rtt_factor)
        .collect();
    delta.sort_by(f64::total_cmp);
    let measured = delta.len().saturating_sub(2).max(1).min(delta.len());
    if delta.is_empty() {
        return;
    }
    let kept = &delta[..measured];
    let m = kept.len();
    let typical = if m.is_multiple_of(2) {
        (kept[m / 2] + kept[m / 2 - 1]) / 2.0
    } else {
        kept[m / 2]
    };
    let average = kept.iter().sum::<f64>() / m as f64;
    let stdev = (kept.iter().map(|d| (average - d).powi(2)).sum::<f64>() / m as f64).sqrt();
    let percentile = |p: f64| delta[((m as f64 * p).ceil() as usize).min(delta.len() - 1)];
    println!(
        " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
        params.size,
        params.iters,
        kept[0],
        kept[m - 1],
        typical,
        average,
        stdev,
        percentile(0.99),
        percentile(0.999)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_message_matches_a_captured_one() {
        // From write_bw.pcap (rxe's ib_write_bw server).
        let captured = "0000:0001:000013:68de9b:00000448:00005558d43dd000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:58:00:0b:00000000:";
        let mut wire = [0u8; KeyMsg::LEN];
        wire[..captured.len()].copy_from_slice(captured.as_bytes());
        let msg = KeyMsg::from_wire(&wire).unwrap();
        assert_eq!(
            msg,
            KeyMsg {
                lid: 0,
                out_reads: 1,
                qpn: 0x13,
                psn: 0x68de9b,
                rkey: 0x448,
                vaddr: 0x5558_d43d_d000,
                gid: Ipv4Addr::new(10, 88, 0, 11).to_ipv6_mapped().octets(),
                srqn: 0,
            }
        );
        assert_eq!(msg.to_wire(), wire, "byte for byte, NUL included");
        assert!(KeyMsg::from_wire(b"0000:0001:zz").is_err());
    }

    #[test]
    fn report_values_are_big_endian_doubles() {
        let report = BwReport {
            size: 4096,
            iters: 200,
            peak: 0.0405,
            average: 0.0359,
            msg_rate: 0.001095,
        };
        let wire = report.to_wire();
        assert_eq!(wire[0], [0, 0, 0, 0, 0, 0, 0x10, 0]);
        assert_eq!(wire[1], [0, 0, 0, 0, 0, 0, 0, 0xc8]);
        // 0.0405 as perftest's hton_double puts it on the wire.
        assert_eq!(wire[2][..2], [0x3f, 0xa4]);
        let back = BwReport::from_wire(&wire.iter().map(|w| w.to_vec()).collect::<Vec<_>>());
        assert_eq!(back.unwrap(), report);
    }

    #[test]
    fn small_bandwidth_requests_walk_the_window_in_cache_lines() {
        let params = Params {
            test: Test::WriteBw,
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
