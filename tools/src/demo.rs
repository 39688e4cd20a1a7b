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
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::Instant;

use roce_provider::afxdp::AfXdpBackend;
use roce_provider::backend::Backend;
use roce_provider::capture::PcapRecorder;
use roce_provider::engine::{Addressing, Engine};

use crate::rdma::{av, check_ok, signaled, wait, Side, STALL};
use roce_provider::netns::{self, is_root, veth, Netns};
use roce_provider::xdp::XdpMode;
use roce_transport::cq::WcOpcode;
use roce_transport::qp::QpCaps;
use roce_transport::qp_state::{PathMtu, Peer, QpType};
use roce_transport::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};
use roce_transport::CqId;
use roce_wire::Psn;

/// Arguments of `roce demo`.
#[derive(clap::Args)]
pub struct Args {
    /// Round trips of each 64-byte ping-pong (RoCE SEND and TCP).
    #[arg(long, default_value_t = 20_000)]
    iters: u32,
    /// Bytes each bandwidth test moves (K, M, G suffixes: KiB, MiB, GiB).
    #[arg(long, default_value = "512M", value_parser = crate::sim::parse_size)]
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

const IP_A: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 2);
const MESSAGE: usize = 64 * 1024;
/// WRITE/READ messages in flight; also the number of 64 KiB slots in the target window.
const WINDOW: usize = 16;
/// READs in flight (see `bandwidth`).
const READS_IN_FLIGHT: u64 = 4;
const PING: usize = 64;

// Where things live in each endpoint's address space.
const A_SOURCE: u64 = 0x1_0000_0000;
const A_READ_BACK: u64 = 0x2_0000_0000;
const A_PING: u64 = 0x3_0000_0000;
const A_ATOMIC: u64 = 0x4_0000_0000;
const B_WINDOW: u64 = 0x5_0000_0000;
const B_PING: u64 = 0x6_0000_0000;
const B_COUNTER: u64 = 0x7_0000_0000;

/// The path MTU a veth MTU allows.
fn path_mtu(veth_mtu: u32) -> PathMtu {
    if veth_mtu >= 9000 {
        PathMtu::Mtu4096
    } else {
        PathMtu::Mtu1024
    }
}

/// Namespaces to delete if the process is interrupted.
static NAMESPACES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Runs `roce demo`.
pub fn run(args: &Args) -> ExitCode {
    if !is_root() {
        eprintln!("roce demo: needs root (network namespaces, veth, AF_XDP)");
        return ExitCode::from(2);
    }
    let handler = ctrlc::set_handler(|| {
        for name in NAMESPACES
            .lock()
            .map(|names| names.clone())
            .unwrap_or_default()
        {
            netns::delete(&name);
        }
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
    NAMESPACES
        .lock()
        .map_err(|_| io::Error::other("poisoned"))?
        .push(a.name.clone());
    let b = Netns::create("roce-demo-b")?;
    NAMESPACES
        .lock()
        .map_err(|_| io::Error::other("poisoned"))?
        .push(b.name.clone());
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
    eprintln!("roce demo: RoCEv2 over AF_XDP...");
    let roce = roce_runs(&a, &b, mode, args)?;

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
        roce.write_gbps,
        tcp.stream_gbps,
        ratio(roce.write_gbps, tcp.stream_gbps)
    );
    println!(
        "{:<34} {:>16.2} Gbit/s {:>16.2} Gbit/s {:>8}",
        "RDMA READ 64 KiB vs TCP stream",
        roce.read_gbps,
        tcp.stream_gbps,
        ratio(roce.read_gbps, tcp.stream_gbps)
    );
    println!(
        "{:<34} {:>18.0} op/s {:>22} {:>8}",
        "FETCH_ADD + CMP_SWAP", roce.atomics_per_s, "-", "-"
    );
    println!("verified={} status=ok", roce.verified);
    Ok(true)
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
    write_gbps: f64,
    read_gbps: f64,
    atomics_per_s: f64,
    verified: u64,
}

/// Opens the AF_XDP backend on `roce0` from a thread inside `ns`.
fn open_in(ns: &Netns, mode: XdpMode) -> io::Result<AfXdpBackend> {
    let name = ns.name.clone();
    thread::spawn(move || {
        netns::enter(&name)?;
        AfXdpBackend::open("roce0", mode)
    })
    .join()
    .map_err(|_| io::Error::other("AF_XDP setup panicked"))?
}

fn roce_runs(a: &Netns, b: &Netns, mode: XdpMode, args: &Args) -> io::Result<RoceFigures> {
    let mut seeds = [[0u8; 32]; 2];
    for seed in &mut seeds {
        rustix::rand::getrandom(seed, rustix::rand::GetRandomFlags::empty())?;
    }
    let caps = QpCaps {
        max_send_wr: 256,
        max_recv_wr: 256,
        ..QpCaps::default()
    };
    let (mut side_a, mut side_b) = (
        Side::new(seeds[0], QpType::Rc, caps)?,
        Side::new(seeds[1], QpType::Rc, caps)?,
    );
    side_a.connect(
        Peer {
            av: av(IP_B),
            qpn: side_b.qpn,
            psn: Psn::new(0xB0),
        },
        Psn::new(0xA0),
        path_mtu(args.mtu),
    )?;
    side_b.connect(
        Peer {
            av: av(IP_A),
            qpn: side_a.qpn,
            psn: Psn::new(0xA0),
        },
        Psn::new(0xB0),
        path_mtu(args.mtu),
    )?;
    let source = side_a.register(A_SOURCE, MESSAGE * WINDOW)?;
    let read_back = side_a.register(A_READ_BACK, MESSAGE * WINDOW)?;
    let ping_a = side_a.register(A_PING, 2 * PING)?;
    let atomic_a = side_a.register(A_ATOMIC, 8 * WINDOW)?;
    let window = side_b.register(B_WINDOW, MESSAGE * WINDOW)?;
    let ping_b = side_b.register(B_PING, PING)?;
    let counter = side_b.register(B_COUNTER, 8)?;

    let (mac_a, mac_b) = (a.mac("roce0")?, b.mac("roce0")?);
    let addressing = |mac, ip, peer_mac, peer_ip| Addressing {
        mac,
        ip,
        neighbours: [(peer_ip, peer_mac)].into(),
    };
    let (qa, qb, cq_a, cq_b) = (side_a.qpn, side_b.qpn, side_a.cq, side_b.cq);
    let backend_a: Box<dyn Backend> = match &args.pcap {
        Some(path) => {
            Box::new(PcapRecorder::create(open_in(a, mode)?, path).map_err(io::Error::other)?)
        }
        None => Box::new(open_in(a, mode)?),
    };
    let mut engine_a = Engine::new(
        side_a.endpoint,
        backend_a,
        addressing(mac_a, IP_A, mac_b, IP_B),
    );
    let mut engine_b = Engine::new(
        side_b.endpoint,
        open_in(b, mode)?,
        addressing(mac_b, IP_B, mac_a, IP_A),
    );

    // B: echo every SEND back, and otherwise serve WRITEs, READs and atomics, until told.
    let stop = Arc::new(AtomicBool::new(false));
    let stop_b = Arc::clone(&stop);
    let ping_sge_b = Sge {
        addr: B_PING,
        length: PING as u32,
        lkey: ping_b,
    };
    let responder = thread::spawn(move || -> io::Result<()> {
        let now = Instant::now();
        let ep = engine_b.endpoint();
        ep.post_recv(
            now,
            qb,
            RecvWr {
                wr_id: 0,
                sg_list: vec![ping_sge_b],
            },
        )
        .map_err(io::Error::other)?;
        let mut completions = Vec::new();
        while !stop_b.load(Ordering::Relaxed) {
            engine_b.poll()?;
            let now = Instant::now();
            let ep = engine_b.endpoint();
            completions.clear();
            ep.cq(cq_b).poll(64, &mut completions);
            for completion in &completions {
                check_ok(completion)?;
                if completion.opcode == WcOpcode::Recv {
                    let echo = Sge {
                        length: completion.byte_len,
                        ..ping_sge_b
                    };
                    let wr = SendWr {
                        wr_id: 1,
                        op: SendOp::Send,
                        sg_list: vec![echo],
                        inline_data: Vec::new(),
                        flags: SendFlags::empty(),
                        ud: None,
                    };
                    // Re-arm first: the next ping may follow the echo at once.
                    ep.post_recv(
                        now,
                        qb,
                        RecvWr {
                            wr_id: 0,
                            sg_list: vec![ping_sge_b],
                        },
                    )
                    .map_err(io::Error::other)?;
                    ep.post_send(now, qb, wr).map_err(io::Error::other)?;
                }
            }
        }
        Ok(())
    });

    let requester = (|| -> io::Result<RoceFigures> {
        let mut verified = 0u64;
        let half_rtt_us = ping_pong(&mut engine_a, qa, cq_a, ping_a, args.iters, &mut verified)?;
        eprintln!("roce demo: ping-pong done");
        let write_gbps = bandwidth(
            &mut engine_a,
            qa,
            cq_a,
            Transfer::Write { source, window },
            args.bytes,
            &mut verified,
        )?;
        eprintln!("roce demo: WRITE done");
        let read_gbps = bandwidth(
            &mut engine_a,
            qa,
            cq_a,
            Transfer::Read {
                read_back,
                window,
                source,
            },
            args.bytes,
            &mut verified,
        )?;
        eprintln!("roce demo: READ done");
        let atomics_per_s = atomics(
            &mut engine_a,
            qa,
            cq_a,
            atomic_a,
            counter,
            args.iters,
            &mut verified,
        )?;
        Ok(RoceFigures {
            half_rtt_us,
            write_gbps,
            read_gbps,
            atomics_per_s,
            verified,
        })
    })();
    stop.store(true, Ordering::Relaxed);
    let served = responder
        .join()
        .map_err(|_| io::Error::other("responder panicked"))?;
    // The responder's failure, if any, explains the requester's.
    served?;
    requester
}

/// 64-byte SEND ping-pong; returns the half round trip in µs.
fn ping_pong<B: roce_provider::backend::Backend>(
    engine: &mut Engine<B>,
    qpn: u32,
    cq: CqId,
    key: u32,
    iters: u32,
    verified: &mut u64,
) -> io::Result<f64> {
    let out = Sge {
        addr: A_PING,
        length: PING as u32,
        lkey: key,
    };
    let back = Sge {
        addr: A_PING + PING as u64,
        length: PING as u32,
        lkey: key,
    };
    let started = Instant::now();
    for i in 0..iters {
        let ping: Vec<u8> = (0..PING).map(|k| (i as usize * 31 + k) as u8).collect();
        let mrs = engine.endpoint().mrs();
        mrs.get_mut(key)
            .ok_or_else(|| io::Error::other("ping region"))?
            .bytes_mut()[..PING]
            .copy_from_slice(&ping);
        let now = Instant::now();
        let ep = engine.endpoint();
        ep.post_recv(
            now,
            qpn,
            RecvWr {
                wr_id: 2,
                sg_list: vec![back],
            },
        )
        .map_err(io::Error::other)?;
        ep.post_send(now, qpn, signaled(1, SendOp::Send, out))
            .map_err(io::Error::other)?;
        wait(engine, cq, 2)?;
        let echoed = &engine
            .endpoint()
            .mrs()
            .get(key)
            .ok_or_else(|| io::Error::other("ping region"))?
            .bytes()[PING..];
        if echoed != &ping[..] {
            return Err(io::Error::other(format!("echo {i} differs")));
        }
        *verified += PING as u64;
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / f64::from(iters) / 2.0)
}

enum Transfer {
    Write {
        source: u32,
        window: u32,
    },
    Read {
        read_back: u32,
        window: u32,
        source: u32,
    },
}

/// Moves `bytes` in 64 KiB messages, [`WINDOW`] in flight; returns Gbit/s. WRITE fills B's
/// window from A's source; READ reads it back (it must equal the source) and checks every
/// message.
fn bandwidth<B: roce_provider::backend::Backend>(
    engine: &mut Engine<B>,
    qpn: u32,
    cq: CqId,
    transfer: Transfer,
    bytes: u64,
    verified: &mut u64,
) -> io::Result<f64> {
    let messages = bytes.div_ceil(MESSAGE as u64).max(WINDOW as u64);
    if let Transfer::Write { source, .. } = transfer {
        let pattern: Vec<u8> = (0..MESSAGE * WINDOW)
            .map(|i| (i * 7 + i / 65_521) as u8)
            .collect();
        let mrs = engine.endpoint().mrs();
        mrs.get_mut(source)
            .ok_or_else(|| io::Error::other("source"))?
            .bytes_mut()
            .copy_from_slice(&pattern);
    }
    // READ responses arrive in bursts the receiver must absorb; keeping fewer READs in flight
    // keeps a busy (or descheduled) requester from overflowing its AF_XDP receive ring.
    let in_flight = match transfer {
        Transfer::Write { .. } => WINDOW as u64,
        Transfer::Read { .. } => READS_IN_FLIGHT,
    };
    let started = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    let mut last_shown = 0;
    while done < messages {
        while posted < messages && posted - done < in_flight {
            let slot = (posted % WINDOW as u64) as usize;
            let offset = (slot * MESSAGE) as u64;
            let (op, sge) = match transfer {
                Transfer::Write { source, window } => (
                    SendOp::RdmaWrite {
                        remote_addr: B_WINDOW + offset,
                        rkey: window,
                    },
                    Sge {
                        addr: A_SOURCE + offset,
                        length: MESSAGE as u32,
                        lkey: source,
                    },
                ),
                Transfer::Read {
                    read_back, window, ..
                } => (
                    SendOp::RdmaRead {
                        remote_addr: B_WINDOW + offset,
                        rkey: window,
                    },
                    Sge {
                        addr: A_READ_BACK + offset,
                        length: MESSAGE as u32,
                        lkey: read_back,
                    },
                ),
            };
            engine
                .endpoint()
                .post_send(Instant::now(), qpn, signaled(posted, op, sge))
                .map_err(io::Error::other)?;
            posted += 1;
        }
        for completion in wait(engine, cq, 1)? {
            if let Transfer::Read {
                read_back, source, ..
            } = transfer
            {
                let slot = (completion.wr_id % WINDOW as u64) as usize;
                let range = slot * MESSAGE..(slot + 1) * MESSAGE;
                let mrs = engine.endpoint().mrs();
                let got = &mrs
                    .get(read_back)
                    .ok_or_else(|| io::Error::other("read back"))?
                    .bytes()[range.clone()];
                let want = &mrs
                    .get(source)
                    .ok_or_else(|| io::Error::other("source"))?
                    .bytes()[range];
                if got != want {
                    return Err(io::Error::other(format!(
                        "READ {} returned other bytes than were written",
                        completion.wr_id
                    )));
                }
            }
            done += 1;
        }
        if done * 10 / messages > last_shown {
            last_shown = done * 10 / messages;
            eprint!("\rroce demo: {}%", last_shown * 10);
        }
    }
    eprintln!();
    let seconds = started.elapsed().as_secs_f64();
    let moved = messages * MESSAGE as u64;
    *verified += if matches!(transfer, Transfer::Read { .. }) {
        moved
    } else {
        0
    };
    Ok(moved as f64 * 8.0 / seconds / 1e9)
}

/// FETCH_ADDs then a CMP_SWAP on B's counter, [`WINDOW`] in flight; every returned value is
/// checked against one-at-a-time execution. Returns operations per second.
fn atomics<B: roce_provider::backend::Backend>(
    engine: &mut Engine<B>,
    qpn: u32,
    cq: CqId,
    results: u32,
    counter: u32,
    iters: u32,
    verified: &mut u64,
) -> io::Result<f64> {
    let total = u64::from(iters);
    let started = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    while done < total {
        while posted < total && posted - done < WINDOW as u64 {
            let slot = posted % WINDOW as u64;
            let sge = Sge {
                addr: A_ATOMIC + slot * 8,
                length: 8,
                lkey: results,
            };
            let op = if posted + 1 == total {
                // The counter now holds total − 1 adds of 1: swap it for zero.
                SendOp::CompareSwap {
                    remote_addr: B_COUNTER,
                    rkey: counter,
                    compare: total - 1,
                    swap: 0,
                }
            } else {
                SendOp::FetchAdd {
                    remote_addr: B_COUNTER,
                    rkey: counter,
                    add: 1,
                }
            };
            engine
                .endpoint()
                .post_send(Instant::now(), qpn, signaled(posted, op, sge))
                .map_err(io::Error::other)?;
            posted += 1;
        }
        for completion in wait(engine, cq, 1)? {
            let slot = (completion.wr_id % WINDOW as u64) as usize;
            let bytes = &engine
                .endpoint()
                .mrs()
                .get(results)
                .ok_or_else(|| io::Error::other("results"))?
                .bytes()[slot * 8..slot * 8 + 8];
            let original = u64::from_ne_bytes(bytes.try_into().map_err(io::Error::other)?);
            if original != completion.wr_id {
                return Err(io::Error::other(format!(
                    "atomic {} saw {original}",
                    completion.wr_id
                )));
            }
            *verified += 8;
            done += 1;
        }
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}
