//! `roce demo`: two RoCEv2 endpoints in two network namespaces joined by a veth pair, talking
//! over AF_XDP (kernel bypass), next to kernel TCP over the same veth, measured in the same
//! run; every byte verified. Needs root. The namespaces go away on every exit path, Ctrl-C
//! included.
//!
//! The veth has MTU 9000, so the path MTU is 4096 and every full frame spans two UMEM chunks
//! (multi-buffer AF_XDP); `--mtu 1500` gives path MTU 1024.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use roce_provider::ceiling::{CeilingRate, Meter, Station};
use roce_provider::netns::{self, is_root, veth, Netns};
use roce_verbs::{
    AccessFlags, BackendChoice, ConnectOptions, Context, Cq, Device, OpenOptions, PathMtu, Pd,
    Progress, Qp, QpCaps, QpEndpoint, QpInitAttr, QpType, RecvWr, SendFlags, SendOp, SendWr,
    WcOpcode, WcStatus, WorkCompletion, XdpMode,
};

use crate::args::parse_size;
use crate::progress::Tenths;
use crate::rdma::{failed, signaled, STALL};
use crate::workload::{Counter, Pattern, Slots};

/// Arguments of `roce demo`.
#[derive(clap::Args)]
pub struct Args {
    /// Round trips of each 64-byte ping-pong (RoCE SEND and TCP).
    #[arg(long, default_value_t = 20_000)]
    iters: u32,
    /// Bytes each bandwidth test moves (K, M, G suffixes: KiB, MiB, GiB).
    #[arg(long, default_value = "512M", value_parser = parse_size)]
    bytes: u64,
    /// Attach the XDP program in generic mode instead of in the driver.
    #[arg(long)]
    generic: bool,
    /// MTU of the veth: 9000 gives path MTU 4096 (frames of two AF_XDP buffers), 1500 gives
    /// path MTU 1024.
    #[arg(long, default_value_t = 9000, value_parser = clap::value_parser!(u32).range(1500..=9000))]
    mtu: u32,
    /// Write every frame the first endpoint sends and receives to this pcap file.
    #[arg(long, value_name = "FILE")]
    pcap: Option<std::path::PathBuf>,
}

/// The interface of the ceiling's own link, in both namespaces.
const CEILING_IF: &str = "roce1";
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 2);
const MESSAGE: usize = 64 * 1024;
/// WRITE/READ messages in flight; also the number of 64 KiB slots in the target window.
const WINDOW: usize = 16;
/// The target window and its local copy: a slot per message in flight, between guards.
const SLOTS: Slots = Slots {
    size: MESSAGE,
    count: WINDOW,
    guard: 64,
};
/// What WRITE sends and READ must bring back, by offset in the window's slots.
const PAYLOAD: Pattern = Pattern::new(0x6465_6d6f);
/// READs in flight (see `bandwidth`).
const READS_IN_FLIGHT: u64 = 4;
const PING: usize = 64;
/// Small WRITEs in flight for the message rate: deeper than [`WINDOW`], since each costs
/// the responder little.
const SMALL_IN_FLIGHT: u64 = 64;
/// One small WRITE in this many is signaled, as perftest's message-rate tests signal one in
/// `--cq-mod` (100 by default): the rate is the link's and the transport's, not a
/// completion's per message.
const SIGNAL_EVERY: u64 = 16;
/// 64-byte WRITEs per ping-pong round trip of `--iters`: the rate needs more messages than
/// the latency to settle.
const SMALL_PER_ITER: u64 = 20;
/// The ceiling's measuring time per run (over its slices) per byte of `--bytes`, within
/// [`CEILING_PERIODS`]: a short demo (as in CI) gets a short ceiling.
const CEILING_SECONDS_PER_GIB: f64 = 2.0;
const CEILING_PERIODS: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(2));

/// The path MTU a veth MTU allows.
fn path_mtu(veth_mtu: u32) -> PathMtu {
    if veth_mtu >= 9000 {
        PathMtu::Mtu4096
    } else {
        PathMtu::Mtu1024
    }
}

/// Deletes this process's namespaces, found by name (`Netns::create` puts the process id in
/// it) rather than from a list: an interruption may come between a namespace's creation
/// and the moment its handle exists.
fn remove_namespaces() {
    let tag = format!("-{}-", std::process::id());
    for entry in std::fs::read_dir("/var/run/netns")
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("roce-demo-") && name.contains(&tag) {
            netns::delete(&name);
        }
    }
}

/// Runs `roce demo`.
pub fn run(args: &Args) -> ExitCode {
    if !is_root() {
        eprintln!("roce demo: needs root (network namespaces, veth, AF_XDP)");
        return ExitCode::from(2);
    }
    let handler = ctrlc::set_handler(|| {
        // The pcap first: the namespaces' removal may take a while, a second signal less.
        crate::signals::flush_captures();
        remove_namespaces();
        eprintln!("roce demo: interrupted; namespaces removed");
        std::process::exit(130);
    });
    if let Err(error) = handler {
        eprintln!("roce demo: cannot handle Ctrl-C: {error}");
        return ExitCode::from(2);
    }
    match demo(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            println!("status=FAIL reason=\"{error}\"");
            ExitCode::FAILURE
        }
    }
}

fn demo(args: &Args) -> io::Result<bool> {
    let a = Netns::create("roce-demo-a")?;
    let b = Netns::create("roce-demo-b")?;
    veth(
        (&a, "roce0", "10.79.0.1/24"),
        (&b, "roce0", "10.79.0.2/24"),
        args.mtu,
    )?;
    let mode = if args.generic {
        XdpMode::Generic
    } else {
        XdpMode::Native
    };
    eprintln!(
        "roce demo: namespaces {} and {} joined by a veth (MTU {}, path MTU {}), XDP {mode:?}",
        a.name,
        b.name,
        args.mtu,
        path_mtu(args.mtu).bytes()
    );

    eprintln!("roce demo: kernel TCP baseline...");
    let tcp = tcp_baseline(&a, &b, args)?;
    // The ceiling's own link between the same namespaces, so that its slices can be
    // interleaved with the RoCE runs: see [`Interleaved`].
    veth(
        (&a, CEILING_IF, "10.79.1.1/24"),
        (&b, CEILING_IF, "10.79.1.2/24"),
        args.mtu,
    )?;
    let station = |netns: &Netns| Station {
        netns: netns.name.clone(),
        interface: CEILING_IF.to_owned(),
    };
    let meter = Meter::open(&station(&a), &station(&b), mode)?;
    eprintln!("roce demo: RoCEv2 over AF_XDP, with the raw AF_XDP ceiling in slices between...");
    let roce = roce_runs(&a, &b, args, meter)?;

    print_comparison(&roce, &tcp);
    print_ceiling(&roce);
    println!("verified={} status=ok", roce.verified);
    Ok(true)
}

/// The table of our figures next to kernel TCP's, with their ratios.
fn print_comparison(roce: &RoceFigures, tcp: &TcpFigures) {
    let ratio = |ours: f64, theirs: f64| format!("{:.2}x", ours / theirs);
    println!(
        "{:<34} {:>22} {:>22} {:>8}",
        "", "roce-xdp (AF_XDP)", "kernel TCP (same veth)", "ratio"
    );
    println!(
        "{:<34} {:>19.2} µs {:>19.2} µs {:>8}",
        "64 B ping-pong, half round trip",
        roce.half_rtt_us,
        tcp.half_rtt_us,
        ratio(roce.half_rtt_us, tcp.half_rtt_us)
    );
    println!(
        "{:<34} {:>16.2} Gbit/s {:>16.2} Gbit/s {:>8}",
        "RDMA WRITE 64 KiB vs TCP stream",
        roce.write.figure,
        tcp.stream_gbps,
        ratio(roce.write.figure, tcp.stream_gbps)
    );
    println!(
        "{:<34} {:>16.2} Gbit/s {:>16.2} Gbit/s {:>8}",
        "RDMA READ 64 KiB vs TCP stream",
        roce.read.figure,
        tcp.stream_gbps,
        ratio(roce.read.figure, tcp.stream_gbps)
    );
    println!(
        "{:<34} {:>15.3} M msg/s {:>22} {:>8}",
        "RDMA WRITE 64 B message rate",
        roce.write64.figure / 1e6,
        "-",
        "-"
    );
    println!(
        "{:<34} {:>18.0} op/s {:>22} {:>8}",
        "FETCH_ADD + CMP_SWAP", roce.atomics_per_s, "-", "-"
    );
}

/// The raw AF_XDP rows, the ceiling's receiver counters and our figures divided by it:
/// each run by the slices of the ceiling taken between its own chunks.
fn print_ceiling(roce: &RoceFigures) {
    let full_payload = roce.write.payload;
    let full: Vec<CeilingRate> = [&roce.write.ceiling[..], &roce.read.ceiling[..]].concat();
    let small = &roce.write64.ceiling;
    println!(
        "{:<34} {:>16.2} Gbit/s {:>22} {:>8}",
        format!("raw AF_XDP, {full_payload} B payload frames"),
        gbps(frames_per_sec(&full), full_payload),
        "-",
        "-"
    );
    println!(
        "{:<34} {:>15.3} M msg/s {:>22} {:>8}",
        format!("raw AF_XDP, {} B payload frames", roce.write64.payload),
        roce.write64.ceiling_figure() / 1e6,
        "-",
        "-"
    );
    let spread = |rates: &[CeilingRate]| {
        rates
            .iter()
            .map(|rate| rate.frames_per_sec)
            .fold((f64::INFINITY, 0f64), |(low, high), r| {
                (low.min(r), high.max(r))
            })
    };
    let ((full_low, full_high), (small_low, small_high)) = (spread(&full), spread(small));
    println!(
        "raw AF_XDP, {} slices between the RoCE runs' chunks: {full_payload} B {:.2}-{:.2} \
         Gbit/s, {} B {:.3}-{:.3} M msg/s",
        full.len() + small.len(),
        gbps(full_low, full_payload),
        gbps(full_high, full_payload),
        roce.write64.payload,
        small_low / 1e6,
        small_high / 1e6
    );
    // Drops at the receiver would mean the ceiling measured its own overflow, not the link.
    // Its sockets' counters run from the meter's start: the last slice has them all.
    let written_off: u64 = full.iter().chain(small).map(|rate| rate.written_off).sum();
    if let Some(CeilingRate { receiver, .. }) = small.last() {
        println!(
            "raw AF_XDP: receiver rx_ring_full={} rx_dropped={} fill_ring_empty={}, \
             written off {written_off}",
            receiver.rx_ring_full, receiver.rx_dropped, receiver.rx_fill_ring_empty_descs,
        );
    }
    println!(
        "ceiling write={:.2} read={:.2} rate64={:.2}",
        roce.write.ratio(),
        roce.read.ratio(),
        roce.write64.ratio()
    );
}

/// Frames per second over all of `rates`' time together.
fn frames_per_sec(rates: &[CeilingRate]) -> f64 {
    let frames: u64 = rates.iter().map(|rate| rate.frames).sum();
    let seconds: f64 = rates.iter().map(|rate| rate.elapsed.as_secs_f64()).sum();
    frames as f64 / seconds
}

struct TcpFigures {
    half_rtt_us: f64,
    stream_gbps: f64,
}

/// Kernel TCP between the same namespaces: a 64-byte ping-pong and a stream.
fn tcp_baseline(a: &Netns, b: &Netns, args: &Args) -> io::Result<TcpFigures> {
    let (ready_tx, ready_rx) = mpsc::channel();
    let name = b.name.clone();
    let (iters, bytes) = (args.iters, args.bytes);
    let server = thread::spawn(move || -> io::Result<()> {
        netns::enter(&name)?;
        let listener = TcpListener::bind((IP_B, 18515))?;
        let _ = ready_tx.send(());
        let (mut echo, _) = listener.accept()?;
        echo.set_nodelay(true)?;
        let mut ping = [0u8; PING];
        for _ in 0..iters {
            echo.read_exact(&mut ping)?;
            echo.write_all(&ping)?;
        }
        let (mut sink, _) = listener.accept()?;
        let mut buffer = vec![0u8; 1 << 20];
        let mut received = 0u64;
        while received < bytes {
            let n = sink.read(&mut buffer)?;
            if n == 0 {
                break;
            }
            received += n as u64;
        }
        sink.write_all(&received.to_be_bytes())
    });
    ready_rx
        .recv_timeout(STALL)
        .map_err(|_| io::Error::other("TCP server did not start"))?;
    let name = a.name.clone();
    let client = thread::spawn(move || -> io::Result<TcpFigures> {
        netns::enter(&name)?;
        let mut ping_stream = TcpStream::connect((IP_B, 18515))?;
        ping_stream.set_nodelay(true)?;
        let mut ping = [0u8; PING];
        let started = Instant::now();
        for i in 0..iters {
            ping[..4].copy_from_slice(&i.to_be_bytes());
            ping_stream.write_all(&ping)?;
            let sent = ping;
            ping_stream.read_exact(&mut ping)?;
            if ping != sent {
                return Err(io::Error::other("TCP echo differs"));
            }
        }
        let half_rtt_us = started.elapsed().as_secs_f64() * 1e6 / f64::from(iters) / 2.0;
        let mut stream = TcpStream::connect((IP_B, 18515))?;
        let chunk = vec![0x5Au8; 1 << 20];
        let started = Instant::now();
        let mut sent = 0u64;
        while sent < bytes {
            let n = (bytes - sent).min(chunk.len() as u64) as usize;
            stream.write_all(&chunk[..n])?;
            sent += n as u64;
        }
        let mut count = [0u8; 8];
        stream.read_exact(&mut count)?;
        let seconds = started.elapsed().as_secs_f64();
        if u64::from_be_bytes(count) != bytes {
            return Err(io::Error::other("TCP stream lost bytes"));
        }
        Ok(TcpFigures {
            half_rtt_us,
            stream_gbps: bytes as f64 * 8.0 / seconds / 1e9,
        })
    });
    let figures = client
        .join()
        .map_err(|_| io::Error::other("TCP client panicked"))??;
    server
        .join()
        .map_err(|_| io::Error::other("TCP server panicked"))??;
    Ok(figures)
}

struct RoceFigures {
    half_rtt_us: f64,
    write: Measured,
    read: Measured,
    write64: Measured,
    atomics_per_s: f64,
    verified: u64,
}

/// A run measured against its ceiling: our figure and the ceiling's slices taken between
/// its chunks, frames of `payload` bytes.
struct Measured {
    payload: usize,
    /// The figure is payload Gbit/s (a bandwidth), or else messages per second.
    in_gbps: bool,
    figure: f64,
    ceiling: Vec<CeilingRate>,
}

impl Measured {
    /// The ceiling over all its slices, in the figure's unit.
    fn ceiling_figure(&self) -> f64 {
        let rate = frames_per_sec(&self.ceiling);
        if self.in_gbps {
            gbps(rate, self.payload)
        } else {
            rate
        }
    }

    fn ratio(&self) -> f64 {
        self.figure / self.ceiling_figure()
    }
}

/// Payload Gbit/s of `frames_per_sec` frames of `payload` bytes.
fn gbps(frames_per_sec: f64, payload: usize) -> f64 {
    frames_per_sec * payload as f64 * 8.0 / 1e9
}

/// What B tells A: its QP, and where A may write, read and add.
struct Offer {
    qp: QpEndpoint,
    window: (u64, u32),
    counter: (u64, u32),
}

/// One side's verbs objects: a context on `roce0` of its namespace, driven by the thread
/// that uses it (one thread per side: the demo's machine may have two cores).
struct Side {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    qp: Qp,
}

fn open_side(generic: bool, pcap: Option<&std::path::Path>) -> io::Result<Side> {
    let mode = if generic {
        XdpMode::Generic
    } else {
        XdpMode::Native
    };
    let device = Device::by_name("roce0")?;
    let options = OpenOptions {
        backend: BackendChoice::AfXdp(mode),
        progress: Progress::Caller,
        pcap: pcap.map(std::path::Path::to_path_buf),
        ..OpenOptions::default()
    };
    let ctx = Context::open(&device, options)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(1024, None)?;
    let caps = QpCaps {
        max_send_wr: 256,
        max_recv_wr: 256,
        ..QpCaps::default()
    };
    let qp = pd.create_qp(&QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: &cq,
        recv_cq: &cq,
        caps,
        sq_sig_all: false,
    })?;
    Ok(Side { ctx, pd, cq, qp })
}

fn connect(side: &Side, peer: &QpEndpoint, veth_mtu: u32) -> io::Result<()> {
    let options = ConnectOptions {
        mtu: path_mtu(veth_mtu),
        ..ConnectOptions::default()
    };
    side.qp.connect(peer, &options)?;
    Ok(())
}

fn roce_runs(a: &Netns, b: &Netns, args: &Args, meter: Meter) -> io::Result<RoceFigures> {
    let (offer_tx, offer_rx) = mpsc::channel::<Offer>();
    let (a_tx, a_rx) = mpsc::channel::<QpEndpoint>();
    let stop = Arc::new(AtomicBool::new(false));
    let paused = Arc::new(AtomicBool::new(false));
    let (mtu, generic) = (args.mtu, args.generic);

    let name_b = b.name.clone();
    let (stop_b, paused_b) = (Arc::clone(&stop), Arc::clone(&paused));
    let responder = thread::spawn(move || -> io::Result<()> {
        netns::enter(&name_b)?;
        let side = open_side(generic, None)?;
        serve(&side, mtu, &offer_tx, &a_rx, (&stop_b, &paused_b))?;
        drop(side.ctx);
        Ok(())
    });

    let name_a = a.name.clone();
    let (iters, bytes, pcap) = (args.iters, args.bytes, args.pcap.clone());
    let seconds = bytes as f64 / f64::from(1u32 << 30) * CEILING_SECONDS_PER_GIB;
    let period = Duration::from_secs_f64(seconds).clamp(CEILING_PERIODS.0, CEILING_PERIODS.1);
    let ceiling = Ceiling {
        meter,
        full_payload: path_mtu(mtu).bytes(),
        slice: (period / (CHUNKS as u32 + 1)).max(MIN_SLICE),
        paused,
        responder: responder.thread().clone(),
    };
    let requester = thread::spawn(move || -> io::Result<RoceFigures> {
        netns::enter(&name_a)?;
        let side = open_side(generic, pcap.as_deref())?;
        let offer = offer_rx
            .recv_timeout(STALL)
            .map_err(|_| io::Error::other("no offer from B"))?;
        a_tx.send(side.qp.endpoint(1)?)
            .map_err(|_| io::Error::other("B is gone"))?;
        connect(&side, &offer.qp, mtu)?;
        measure(&side, &offer, (iters, bytes), &ceiling)
    });
    let figures = requester
        .join()
        .map_err(|_| io::Error::other("requester panicked"));
    stop.store(true, Ordering::Relaxed);
    responder.thread().unpark();
    let served = responder
        .join()
        .map_err(|_| io::Error::other("responder panicked"))?;
    // The responder's failure, if any, explains the requester's.
    served?;
    figures?
}

/// B: offers its QP and memory to A, then echoes every SEND back, and otherwise serves
/// WRITEs, READs and atomics, until told to stop.
fn serve(
    side: &Side,
    mtu: u32,
    offer_tx: &mpsc::Sender<Offer>,
    a_rx: &mpsc::Receiver<QpEndpoint>,
    (stop, paused): (&AtomicBool, &AtomicBool),
) -> io::Result<()> {
    let window = side.pd.reg_mr(SLOTS.len(), AccessFlags::all())?;
    let counter = side.pd.reg_mr(8, AccessFlags::all())?;
    let ping = side.pd.reg_mr(PING, AccessFlags::all())?;
    let offer = Offer {
        qp: side.qp.endpoint(1)?,
        window: (window.addr(), window.rkey()),
        counter: (counter.addr(), counter.rkey()),
    };
    offer_tx
        .send(offer)
        .map_err(|_| io::Error::other("A is gone"))?;
    let peer = a_rx
        .recv_timeout(STALL)
        .map_err(|_| io::Error::other("no QP from A"))?;
    connect(side, &peer, mtu)?;
    let arm = || RecvWr {
        wr_id: 0,
        sg_list: [ping.sge(0, PING as u32)].into(),
    };
    side.qp.post_recv([arm()])?;
    let mut completions = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        if paused.load(Ordering::Acquire) {
            // The requester unparks us when the ceiling's slice is over.
            thread::park_timeout(Duration::from_millis(10));
            continue;
        }
        completions.clear();
        side.cq.poll_into(64, &mut completions)?;
        for completion in &completions {
            check_ok(completion)?;
            if completion.opcode == WcOpcode::Recv {
                // Re-arm first: the next ping may follow the echo at once.
                side.qp.post_recv([arm()])?;
                let echo = SendWr {
                    wr_id: 1,
                    op: SendOp::Send,
                    sg_list: [ping.sge(0, completion.byte_len)].into(),
                    inline_data: Vec::new(),
                    flags: SendFlags::empty(),
                    ud: None,
                    xrc_srqn: 0,
                };
                side.qp.post_send([echo])?;
            }
        }
    }
    Ok(())
}

/// A: the measurements against B's offer, in turn; the bandwidths and the message rate
/// interleaved with their ceiling.
fn measure(
    side: &Side,
    offer: &Offer,
    (iters, bytes): (u32, u64),
    ceiling: &Ceiling,
) -> io::Result<RoceFigures> {
    let mut verified = 0u64;
    let half_rtt_us = ping_pong(side, iters, &mut verified)?;
    eprintln!("roce demo: ping-pong done");
    let write = bandwidth(
        side,
        Direction::Write,
        offer.window,
        bytes,
        ceiling,
        &mut verified,
    )?;
    eprintln!("roce demo: WRITE done");
    let read = bandwidth(
        side,
        Direction::Read,
        offer.window,
        bytes,
        ceiling,
        &mut verified,
    )?;
    eprintln!("roce demo: READ done");
    let messages = u64::from(iters) * SMALL_PER_ITER;
    let write64 = message_rate(side, offer.window, messages, ceiling)?;
    eprintln!("roce demo: 64 B WRITE done");
    let atomics_per_s = atomics(side, offer.counter, iters, &mut verified)?;
    Ok(RoceFigures {
        half_rtt_us,
        write,
        read,
        write64,
        atomics_per_s,
        verified,
    })
}

/// Polls until `want` completions arrived, each a success; fails after [`STALL`] without one.
fn wait(side: &Side, want: usize) -> io::Result<Vec<WorkCompletion>> {
    let completions = side.cq.wait_for(want, STALL)?;
    completions.iter().try_for_each(check_ok)?;
    Ok(completions)
}

fn check_ok(completion: &WorkCompletion) -> io::Result<()> {
    if completion.status == WcStatus::Success {
        Ok(())
    } else {
        Err(failed(completion))
    }
}

/// 64-byte SEND ping-pong; returns the half round trip in µs.
fn ping_pong(side: &Side, iters: u32, verified: &mut u64) -> io::Result<f64> {
    let buffer = side.pd.reg_mr(2 * PING, AccessFlags::LOCAL_WRITE)?;
    let started = Instant::now();
    for i in 0..iters {
        let mut ping = [0u8; PING];
        Pattern::new(u64::from(i)).fill(0, &mut ping);
        buffer.write(0, &ping)?;
        side.qp.post_recv([RecvWr {
            wr_id: 2,
            sg_list: [buffer.sge(PING, PING as u32)].into(),
        }])?;
        side.qp
            .post_send([signaled(1, SendOp::Send, buffer.sge(0, PING as u32))])?;
        wait(side, 2)?;
        let intact = buffer.with_bytes(|bytes| bytes[PING..] == ping[..])?;
        if !intact {
            return Err(io::Error::other(format!("echo {i} differs")));
        }
        *verified += PING as u64;
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / f64::from(iters) / 2.0)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Write,
    Read,
}

/// Moves `bytes` in 64 KiB messages, [`WINDOW`] in flight, interleaved with the ceiling;
/// payload Gbit/s. WRITE fills B's window with a pattern; READ reads it back and checks
/// every message against it.
fn bandwidth(
    side: &Side,
    direction: Direction,
    (window, rkey): (u64, u32),
    bytes: u64,
    ceiling: &Ceiling,
    verified: &mut u64,
) -> io::Result<Measured> {
    let messages = bytes.div_ceil(MESSAGE as u64).max(WINDOW as u64);
    let mut pattern = vec![0u8; MESSAGE * WINDOW];
    PAYLOAD.fill(0, &mut pattern);
    let local = side.pd.reg_mr(SLOTS.len(), AccessFlags::all())?;
    local.with_bytes_mut(|bytes| {
        bytes.copy_from_slice(&SLOTS.blank());
        if direction == Direction::Write {
            for (slot, message) in pattern.chunks(MESSAGE).enumerate() {
                bytes[SLOTS.offset(slot)..][..MESSAGE].copy_from_slice(message);
            }
        }
    })?;
    // READ responses arrive in bursts the receiver must absorb; keeping fewer READs in flight
    // keeps a busy (or descheduled) requester from overflowing its AF_XDP receive ring.
    let in_flight = match direction {
        Direction::Write => WINDOW as u64,
        Direction::Read => READS_IN_FLIGHT,
    };
    let run_payload = ceiling.full_payload;
    let mut run = Interleaved::start(ceiling, run_payload, messages)?;
    let (mut posted, mut done) = (0u64, 0u64);
    let name = match direction {
        Direction::Write => "WRITE",
        Direction::Read => "READ",
    };
    let mut progress = Tenths::new(format!("roce demo: {name}"), Duration::ZERO);
    while done < messages {
        let mut batch = Vec::new();
        while posted < run.limit() && posted - done + (batch.len() as u64) < in_flight {
            let n = posted + batch.len() as u64;
            let offset = SLOTS.offset((n % WINDOW as u64) as usize);
            let remote_addr = window + offset as u64;
            let op = match direction {
                Direction::Write => SendOp::RdmaWrite { remote_addr, rkey },
                Direction::Read => SendOp::RdmaRead { remote_addr, rkey },
            };
            batch.push(signaled(n, op, local.sge(offset, MESSAGE as u32)));
        }
        posted += batch.len() as u64;
        side.qp.post_send(batch)?;
        for completion in wait(side, 1)? {
            if direction == Direction::Read {
                let slot = (completion.wr_id % WINDOW as u64) as usize;
                let want = &pattern[slot * MESSAGE..(slot + 1) * MESSAGE];
                local
                    .with_bytes(|got| SLOTS.check(got, slot, want))?
                    .map_err(|why| {
                        io::Error::other(format!(
                            "READ {} returned other bytes than were written: {why}",
                            completion.wr_id
                        ))
                    })?;
            }
            done += 1;
        }
        progress.update(done, messages, |_| String::new());
        run.reached(done)?;
    }
    progress.finish();
    let (ours, ceiling) = run.finish();
    let seconds = ours.as_secs_f64();
    let moved = messages * MESSAGE as u64;
    if direction == Direction::Read {
        *verified += moved;
    }
    Ok(Measured {
        payload: run_payload,
        in_gbps: true,
        figure: moved as f64 * 8.0 / seconds / 1e9,
        ceiling,
    })
}

/// `messages` 64-byte WRITEs into B's window, [`SMALL_IN_FLIGHT`] in flight, one in
/// [`SIGNAL_EVERY`] signaled (and the last), interleaved with the ceiling; messages per
/// second. Their bytes are not counted as verified: READ checked the window's transfer path
/// already, and this measures the per-message cost.
fn message_rate(
    side: &Side,
    (window, rkey): (u64, u32),
    messages: u64,
    ceiling: &Ceiling,
) -> io::Result<Measured> {
    let local = side.pd.reg_mr(PING, AccessFlags::LOCAL_WRITE)?;
    let mut run = Interleaved::start(ceiling, PING, messages)?;
    let (mut posted, mut done) = (0u64, 0u64);
    while done < messages {
        let mut batch = Vec::new();
        while posted < run.limit() && posted - done + (batch.len() as u64) < SMALL_IN_FLIGHT {
            let n = posted + batch.len() as u64;
            let remote_addr = window + SLOTS.offset((n % WINDOW as u64) as usize) as u64;
            let op = SendOp::RdmaWrite { remote_addr, rkey };
            let mut wr = signaled(n, op, local.sge(0, PING as u32));
            // The last of each chunk is signaled too: the chunk ends when it completes.
            if n % SIGNAL_EVERY != SIGNAL_EVERY - 1 && n + 1 != run.limit() {
                wr.flags = SendFlags::empty();
            }
            batch.push(wr);
        }
        posted += batch.len() as u64;
        side.qp.post_send(batch)?;
        // RC completes in order: a signaled WRITE's completion says all before it are done.
        let latest = wait(side, 1)?.iter().map(|c| c.wr_id).max().unwrap_or(0);
        done = done.max(latest + 1);
        run.reached(done)?;
    }
    let (ours, ceiling) = run.finish();
    Ok(Measured {
        payload: PING,
        in_gbps: false,
        figure: messages as f64 / ours.as_secs_f64(),
        ceiling,
    })
}

/// A run cut into [`CHUNKS`] chunks, with a slice of its ceiling before each chunk and
/// after the last, the responder paused meanwhile (it polls, and would take a core from the
/// ceiling): on a shared host the machine's speed drifts over seconds (the 64 B ceiling
/// alone moved 0.47-0.71 M frames/s between runs on an idle machine), and a ceiling
/// measured once, seconds away from the figure it divides, carried that drift into the
/// ratio. Our clock runs only while the chunks do.
struct Interleaved<'a> {
    ceiling: &'a Ceiling,
    payload: usize,
    total: u64,
    chunk: u64,
    ours: Duration,
    since: Instant,
    slices: Vec<CeilingRate>,
}

/// Chunks per run, each between two slices of the ceiling.
const CHUNKS: u64 = 4;
/// The shortest slice of the ceiling.
const MIN_SLICE: Duration = Duration::from_millis(50);

/// What a requester needs to interleave the ceiling with its runs.
struct Ceiling {
    meter: Meter,
    /// The full frames' payload: the path MTU.
    full_payload: usize,
    /// Each slice's length.
    slice: Duration,
    /// Set while the ceiling measures: the responder waits.
    paused: Arc<AtomicBool>,
    responder: thread::Thread,
}

impl Ceiling {
    /// A slice of the ceiling with `payload`-byte frames, the responder paused.
    fn slice(&self, payload: usize) -> io::Result<CeilingRate> {
        self.paused.store(true, Ordering::Release);
        let rate = self.meter.measure(payload, self.slice);
        self.paused.store(false, Ordering::Release);
        self.responder.unpark();
        rate
    }
}

impl<'a> Interleaved<'a> {
    /// Takes the first slice, then starts our clock.
    fn start(ceiling: &'a Ceiling, payload: usize, total: u64) -> io::Result<Self> {
        let slices = vec![ceiling.slice(payload)?];
        Ok(Interleaved {
            ceiling,
            payload,
            total,
            chunk: 1,
            ours: Duration::ZERO,
            since: Instant::now(),
            slices,
        })
    }

    /// How many of the run's messages may be posted by now: those of the chunks so far.
    fn limit(&self) -> u64 {
        (self.total * self.chunk).div_ceil(CHUNKS)
    }

    /// With `done` messages done: at the end of a chunk, stops our clock, takes a slice of
    /// the ceiling, and starts our clock again.
    fn reached(&mut self, done: u64) -> io::Result<()> {
        if done < self.limit() || self.chunk > CHUNKS {
            return Ok(());
        }
        self.ours += self.since.elapsed();
        self.slices.push(self.ceiling.slice(self.payload)?);
        self.chunk += 1;
        self.since = Instant::now();
        Ok(())
    }

    /// Our time over the chunks, and the ceiling's slices.
    fn finish(self) -> (Duration, Vec<CeilingRate>) {
        (self.ours, self.slices)
    }
}

/// FETCH_ADDs then a CMP_SWAP on B's counter, [`WINDOW`] in flight; every returned value is
/// checked against one-at-a-time execution. Returns operations per second.
fn atomics(
    side: &Side,
    (counter, rkey): (u64, u32),
    iters: u32,
    verified: &mut u64,
) -> io::Result<f64> {
    let results = side.pd.reg_mr(8 * WINDOW, AccessFlags::all())?;
    let total = u64::from(iters);
    // What B's counter holds, and what each slot's atomic must find there.
    let mut counter_at_b = Counter::default();
    let mut expected = [0u64; WINDOW];
    let started = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    while done < total {
        while posted < total && posted - done < WINDOW as u64 {
            let slot = (posted % WINDOW as u64) as usize;
            let op = if posted + 1 == total {
                // The counter now holds total − 1 adds of 1: swap it for zero.
                let (compare, swap) = (total - 1, 0);
                expected[slot] = counter_at_b.compare_swap(compare, swap);
                SendOp::CompareSwap {
                    remote_addr: counter,
                    rkey,
                    compare,
                    swap,
                }
            } else {
                expected[slot] = counter_at_b.fetch_add(1);
                SendOp::FetchAdd {
                    remote_addr: counter,
                    rkey,
                    add: 1,
                }
            };
            side.qp
                .post_send([signaled(posted, op, results.sge(slot * 8, 8))])?;
            posted += 1;
        }
        for completion in wait(side, 1)? {
            let slot = (completion.wr_id % WINDOW as u64) as usize;
            let mut original = [0u8; 8];
            results.read(slot * 8, &mut original)?;
            let original = u64::from_ne_bytes(original);
            if original != expected[slot] {
                return Err(io::Error::other(format!(
                    "atomic {} saw {original}, expected {}",
                    completion.wr_id, expected[slot]
                )));
            }
            *verified += 8;
            done += 1;
        }
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce_provider::ceiling::XdpCounters;

    fn slice(frames: u64, seconds: f64) -> CeilingRate {
        CeilingRate {
            payload: PING,
            frame_len: 138,
            elapsed: Duration::from_secs_f64(seconds),
            sent: frames,
            frames,
            frames_per_sec: frames as f64 / seconds,
            bytes_per_sec: (frames * 138) as f64 / seconds,
            written_off: 0,
            receiver: XdpCounters::default(),
        }
    }

    #[test]
    fn the_ceiling_over_slices_weighs_each_by_its_time() {
        // 100 frames in 1 s and 600 in 3 s: 175 frames/s over the 4 s, not the mean of the
        // two rates (150).
        let rate = frames_per_sec(&[slice(100, 1.0), slice(600, 3.0)]);
        assert!((rate - 175.0).abs() < 1e-9, "{rate}");
        // A slice that counted nothing takes its time too.
        let rate = frames_per_sec(&[slice(0, 1.0), slice(100, 1.0)]);
        assert!((rate - 50.0).abs() < 1e-9, "{rate}");
    }
}
