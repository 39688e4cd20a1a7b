//! `roce pingpong`: RC, UC and UD ping-pong that interoperate with rdma-core's
//! `ibv_rc_pingpong`, `ibv_uc_pingpong` and `ibv_ud_pingpong`, on the wire and at the command
//! line. It is a server without a host argument and a client with
//! one; the two sides swap `LID:QPN:PSN:GID` over TCP (port 18515), then bounce `-s`-byte SENDs
//! `-n` times, and print rdma-core's two result lines. Exit status 0 only when every message
//! arrived intact. Over AF_XDP (root) by default, or kernel UDP sockets with `--udp`.
//!

use std::fs;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, TcpListener, TcpStream};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use roce_provider::afxdp::AfXdpBackend;
use roce_provider::backend::Backend;
use roce_provider::engine::{Addressing, Engine};
use roce_provider::udp::UdpBackend;
use roce_provider::xdp::XdpMode;
use roce_transport::cq::WcOpcode;
use roce_transport::qp::QpCaps;
use roce_transport::qp_state::{PathMtu, Peer, QpType};
use roce_transport::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest};
use roce_wire::Psn;

use crate::rdma::{av, check_ok, Side, STALL};

/// Arguments of `roce pingpong`, named as `ibv_rc_pingpong` names them.
#[derive(clap::Args)]
pub struct Args {
    /// Connect to this server (omit to be the server).
    host: Option<Ipv4Addr>,
    /// TCP port of the address exchange.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    /// Network interface to use (default: the first one that is up, not loopback).
    #[arg(short = 'd', long = "ib-dev")]
    device: Option<String>,
    /// Port of the device (there is only 1).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// Message size in bytes.
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    size: u32,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
    /// Receives posted at once.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: u32,
    /// Round trips.
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    iters: u32,
    /// Service level (accepted for compatibility; RoCEv2 has none).
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    sl: u8,
    /// Sleep on completion events instead of polling.
    #[arg(short = 'e', long = "events")]
    events: bool,
    /// GID index: 1 is the IPv4-mapped GID, as on rxe (index 0, link-local IPv6, not yet).
    #[arg(short = 'g', long = "gid-idx", default_value_t = 1)]
    gid_index: u8,
    /// Validate received buffers (also on without it: every message is checked).
    #[arg(short = 'c', long = "chk")]
    check: bool,
    /// Reliable connection (the default), as ibv_rc_pingpong.
    #[arg(long, conflicts_with = "uc")]
    rc: bool,
    /// Unreliable connection, as ibv_uc_pingpong.
    #[arg(long, conflicts_with = "ud")]
    uc: bool,
    /// Unreliable datagram, as ibv_ud_pingpong (messages up to the path MTU).
    #[arg(long)]
    ud: bool,
    /// Use kernel UDP sockets instead of AF_XDP (no root needed).
    #[arg(long)]
    udp: bool,
}

/// The Q_Key ibv_ud_pingpong uses.
const UD_QKEY: u32 = 0x1111_1111;
/// Bytes in front of every UD receive.
const GRH: usize = 40;
const SEND_WRID: u64 = 1;
const RECV_WRID: u64 = 2;
const BUFFER: u64 = 0x10_0000;

/// Runs `roce pingpong`.
pub fn run(args: &Args) -> ExitCode {
    match pingpong(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("roce pingpong: {error}");
            ExitCode::FAILURE
        }
    }
}

fn path_mtu(bytes: u32) -> io::Result<PathMtu> {
    Ok(match bytes {
        256 => PathMtu::Mtu256,
        512 => PathMtu::Mtu512,
        1024 => PathMtu::Mtu1024,
        2048 => PathMtu::Mtu2048,
        4096 => PathMtu::Mtu4096,
        _ => return Err(io::Error::other(format!("invalid MTU {bytes}"))),
    })
}

/// The first interface that is up and not loopback, as rdma-core takes the first device.
fn first_interface() -> io::Result<String> {
    let mut names: Vec<String> = fs::read_dir("/sys/class/net")?
        .filter_map(|entry| {
            entry
                .ok()
                .map(|e| e.file_name().to_string_lossy().into_owned())
        })
        .filter(|name| name != "lo")
        .collect();
    names.sort();
    names
        .into_iter()
        .next()
        .ok_or_else(|| io::Error::other("no network interface"))
}

/// The interface's first IPv4 address and its MAC.
fn interface_addresses(interface: &str) -> io::Result<(Ipv4Addr, [u8; 6])> {
    let output = Command::new("ip")
        .args(["-o", "-4", "addr", "show", "dev", interface])
        .output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let ip = text
        .split_whitespace()
        .skip_while(|word| *word != "inet")
        .nth(1)
        .and_then(|cidr| cidr.split('/').next())
        .and_then(|ip| ip.parse().ok())
        .ok_or_else(|| io::Error::other(format!("{interface} has no IPv4 address")))?;
    let mac_text = fs::read_to_string(format!("/sys/class/net/{interface}/address"))?;
    Ok((ip, parse_mac(&mac_text)?))
}

fn parse_mac(text: &str) -> io::Result<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.trim().split(':');
    for byte in &mut mac {
        let part = parts.next().ok_or_else(|| io::Error::other("bad MAC"))?;
        *byte = u8::from_str_radix(part, 16).map_err(io::Error::other)?;
    }
    Ok(mac)
}

/// The peer's MAC from the kernel's neighbour table (the TCP exchange has just filled it).
fn neighbour_mac(ip: Ipv4Addr) -> io::Result<[u8; 6]> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let table = fs::read_to_string("/proc/net/arp")?;
        let entry = table
            .lines()
            .skip(1)
            .find(|line| line.split_whitespace().next() == Some(&ip.to_string()));
        if let Some(mac) = entry.and_then(|line| line.split_whitespace().nth(3)) {
            if mac != "00:00:00:00:00:00" {
                return parse_mac(mac);
            }
        }
        if Instant::now() > deadline {
            return Err(io::Error::other(format!("no neighbour entry for {ip}")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One side's address, as `ibv_rc_pingpong` sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dest {
    lid: u16,
    qpn: u32,
    psn: Psn,
    gid: [u8; 16],
}

impl Dest {
    /// `"%04x:%06x:%06x:%s"` with the GID as 32 hex digits, NUL-padded to 52 bytes.
    fn to_wire(self) -> [u8; 52] {
        let gid: String = self.gid.iter().map(|b| format!("{b:02x}")).collect();
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{gid}",
            self.lid,
            self.qpn,
            self.psn.value()
        );
        let mut wire = [0u8; 52];
        wire[..text.len()].copy_from_slice(text.as_bytes());
        wire
    }

    fn from_wire(wire: &[u8]) -> io::Result<Dest> {
        let text = String::from_utf8_lossy(wire);
        let text = text.trim_end_matches('\0');
        let bad = || io::Error::other(format!("bad address message {text:?}"));
        let mut fields = text.split(':');
        let mut hex = || {
            let field = fields.next().ok_or_else(bad)?;
            u32::from_str_radix(field, 16).map_err(|_| bad())
        };
        let lid = hex()? as u16;
        let qpn = hex()?;
        let psn = Psn::new(hex()?);
        let gid_text = fields.next().ok_or_else(bad)?;
        let mut gid = [0u8; 16];
        for (i, byte) in gid.iter_mut().enumerate() {
            let pair = gid_text.get(2 * i..2 * i + 2).ok_or_else(bad)?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
        }
        Ok(Dest { lid, qpn, psn, gid })
    }

    /// Prints the line rdma-core prints (`which` is "local" or "remote", which it aligns).
    fn print(&self, which: &str) {
        let pad = if which == "local" { " " } else { "" };
        println!(
            "  {which} address: {pad}LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            self.lid,
            self.qpn,
            self.psn.value(),
            Ipv6Addr::from(self.gid)
        );
    }
}

/// Swaps addresses over TCP as `ibv_rc_pingpong` does; returns the peer's and its IPv4
/// address. `connect` runs between reading the peer's address and the final handshake.
fn exchange(
    args: &Args,
    mine: Dest,
    connect: impl FnOnce(Dest) -> io::Result<()>,
) -> io::Result<(Dest, Ipv4Addr)> {
    if let Some(host) = args.host {
        let mut stream = TcpStream::connect((host, args.port))?;
        stream.set_read_timeout(Some(STALL))?;
        stream.write_all(&mine.to_wire())?;
        let mut wire = [0u8; 52];
        stream.read_exact(&mut wire)?;
        let peer = Dest::from_wire(&wire)?;
        connect(peer)?;
        stream.write_all(b"done\0")?;
        Ok((peer, host))
    } else {
        let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, args.port))?;
        let (mut stream, from) = listener.accept()?;
        stream.set_read_timeout(Some(STALL))?;
        let mut wire = [0u8; 52];
        stream.read_exact(&mut wire)?;
        let peer = Dest::from_wire(&wire)?;
        connect(peer)?;
        stream.write_all(&mine.to_wire())?;
        let mut done = [0u8; 5];
        stream.read_exact(&mut done)?;
        let std::net::IpAddr::V4(from) = from.ip() else {
            return Err(io::Error::other("IPv6 peers are not supported yet"));
        };
        Ok((peer, from))
    }
}

fn pingpong(args: &Args) -> io::Result<()> {
    if args.ib_port != 1 || args.gid_index != 1 {
        return Err(io::Error::other(
            "only port 1 and GID index 1 (IPv4-mapped) exist",
        ));
    }
    let mtu = path_mtu(args.mtu)?;
    let interface = match &args.device {
        Some(name) => name.clone(),
        None => first_interface()?,
    };
    let (ip, mac) = interface_addresses(&interface)?;
    let mut seed = [0u8; 32];
    rustix::rand::getrandom(&mut seed, rustix::rand::GetRandomFlags::empty())?;
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: args.rx_depth.max(1),
        ..QpCaps::default()
    };
    let qp_type = match (args.uc, args.ud) {
        (true, _) => QpType::Uc,
        (_, true) => QpType::Ud,
        _ => QpType::Rc,
    };
    let mut side = Side::new(seed, qp_type, caps)?;
    let size = args.size as usize;
    let send_key = side.register(BUFFER, size)?;
    // A UD receive starts with the 40-byte GRH area.
    let grh = if args.ud { GRH } else { 0 };
    let recv_key = side.register(BUFFER * 2, size + grh)?;
    // What ibv_rc_pingpong sends: 0x7b everywhere, and with -c a 0 at every page start.
    let mut message = vec![0x7bu8; size];
    if args.check {
        message.iter_mut().step_by(4096).for_each(|byte| *byte = 0);
    }
    side.endpoint
        .mrs()
        .get_mut(send_key)
        .ok_or_else(|| io::Error::other("buffer"))?
        .bytes_mut()
        .copy_from_slice(&message);
    let psn = Psn::new(u32::from_le_bytes([seed[0], seed[1], seed[2], 0]));
    let mine = Dest {
        lid: 0,
        qpn: side.qpn,
        psn,
        gid: ip.to_ipv6_mapped().octets(),
    };
    mine.print("local");
    // Listening before the exchange: the peer may send as soon as it is over.
    let backend: Box<dyn Backend> = if args.udp {
        Box::new(UdpBackend::bind(ip, mac)?)
    } else {
        let native = AfXdpBackend::open(&interface, XdpMode::Native);
        Box::new(native.or_else(|_| AfXdpBackend::open(&interface, XdpMode::Generic))?)
    };
    let (peer, peer_ip) = exchange(args, mine, |peer| {
        if args.ud {
            return side.bring_up_ud(UD_QKEY, psn);
        }
        let peer_ip = Ipv6Addr::from(peer.gid)
            .to_ipv4_mapped()
            .unwrap_or(Ipv4Addr::UNSPECIFIED);
        side.connect(
            Peer {
                av: av(peer_ip),
                qpn: peer.qpn,
                psn: peer.psn,
            },
            psn,
            mtu,
        )
    })?;
    peer.print("remote");
    if Ipv6Addr::from(peer.gid).to_ipv4_mapped() != Some(peer_ip) {
        return Err(io::Error::other(
            "the peer's GID is not the IPv4-mapped address it connected from",
        ));
    }
    let addressing = |peer_mac| Addressing {
        mac,
        ip,
        neighbours: [(peer_ip, peer_mac)].into(),
    };
    let peer_mac = if args.udp {
        [0; 6]
    } else {
        neighbour_mac(peer_ip)?
    };
    let engine = Engine::new(side.endpoint, backend, addressing(peer_mac));
    let ud = args.ud.then_some(UdDest {
        av: av(peer_ip),
        remote_qpn: peer.qpn,
        remote_qkey: UD_QKEY,
    });
    let buffers = Buffers {
        send_key,
        recv_key,
        grh,
        ud,
    };
    bounce(engine, side.qpn, side.cq, &buffers, &message, args)
}

/// The ping-pong itself, as `ibv_rc_pingpong` runs it: a side sends again once its last SEND
/// completed and the next message arrived; the client sends first.
/// The two buffers of a ping-pong, and where UD sends go.
struct Buffers {
    send_key: u32,
    recv_key: u32,
    /// Bytes before the message in a receive (the UD GRH area).
    grh: usize,
    ud: Option<UdDest>,
}

fn bounce<B: Backend>(
    mut engine: Engine<B>,
    qpn: u32,
    cq: roce_transport::CqId,
    buffers: &Buffers,
    message: &[u8],
    args: &Args,
) -> io::Result<()> {
    let size = message.len() as u32;
    let grh = buffers.grh;
    let recv = RecvWr {
        wr_id: RECV_WRID,
        sg_list: vec![Sge {
            addr: BUFFER * 2,
            length: size + grh as u32,
            lkey: buffers.recv_key,
        }],
    };
    let send = SendWr {
        wr_id: SEND_WRID,
        op: SendOp::Send,
        sg_list: vec![Sge {
            addr: BUFFER,
            length: size,
            lkey: buffers.send_key,
        }],
        inline_data: Vec::new(),
        flags: SendFlags::SIGNALED,
        ud: buffers.ud,
    };
    let now = Instant::now();
    for _ in 0..args.rx_depth.max(1) {
        engine
            .endpoint()
            .post_recv(now, qpn, recv.clone())
            .map_err(io::Error::other)?;
    }
    let started = Instant::now();
    let mut pending = RECV_WRID;
    if args.host.is_some() {
        engine
            .endpoint()
            .post_send(now, qpn, send.clone())
            .map_err(io::Error::other)?;
        pending |= SEND_WRID;
    }
    let (mut sent, mut received) = (0u32, 0u32);
    let mut completions = Vec::new();
    let mut last_progress = Instant::now();
    while sent < args.iters || received < args.iters {
        if args.events {
            engine.run_once(Duration::from_millis(10))?;
        } else {
            engine.poll()?;
        }
        completions.clear();
        engine.endpoint().cq(cq).poll(16, &mut completions);
        if completions.is_empty() {
            if last_progress.elapsed() > STALL {
                return Err(io::Error::other(format!(
                    "stalled after {sent} sends and {received} receives"
                )));
            }
            continue;
        }
        last_progress = Instant::now();
        for completion in &completions {
            check_ok(completion)?;
            match completion.opcode {
                WcOpcode::Send => sent += 1,
                WcOpcode::Recv => {
                    received += 1;
                    let got = engine
                        .endpoint()
                        .mrs()
                        .get(buffers.recv_key)
                        .map(|mr| &mr.bytes()[grh..] == message);
                    if got != Some(true) || completion.byte_len != size + grh as u32 {
                        return Err(io::Error::other(format!(
                            "message {received} arrived damaged"
                        )));
                    }
                    engine
                        .endpoint()
                        .post_recv(Instant::now(), qpn, recv.clone())
                        .map_err(io::Error::other)?;
                }
                other => return Err(io::Error::other(format!("unexpected completion {other:?}"))),
            }
            pending &= !completion.wr_id;
            if sent < args.iters && pending == 0 {
                engine
                    .endpoint()
                    .post_send(Instant::now(), qpn, send.clone())
                    .map_err(io::Error::other)?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let bytes = u64::from(size) * u64::from(args.iters) * 2;
    println!(
        "{bytes} bytes in {seconds:.2} seconds = {:.2} Mbit/sec",
        bytes as f64 * 8.0 / seconds / 1e6
    );
    println!(
        "{} iters in {seconds:.2} seconds = {:.2} usec/iter",
        args.iters,
        seconds * 1e6 / f64::from(args.iters)
    );
    Ok(())
}
