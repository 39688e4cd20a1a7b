//! `roce pingpong`: RC, UC and UD ping-pong that interoperate with rdma-core's
//! `ibv_rc_pingpong`, `ibv_uc_pingpong` and `ibv_ud_pingpong`, on the wire and at the command
//! line. It is a server without a host argument and a client with
//! one; the two sides swap `LID:QPN:PSN:GID` over TCP (port 18515), then bounce `-s`-byte SENDs
//! `-n` times, and print rdma-core's two result lines. Exit status 0 only when every message
//! arrived intact. Over AF_XDP (root) by default, or kernel UDP sockets with `--udp`.
//!

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::Instant;

use roce_verbs::{
    AccessFlags, AddressVector, CompChannel, ConnectOptions, Cq, Mr, PathMtu, Pd, Progress, Qp,
    QpCaps, QpEndpoint, QpInitAttr, QpType, RecvWr, RetryConfig, SendFlags, SendOp, SendWr, UdDest,
    WcOpcode, WcStatus, WorkCompletion,
};
use roce_wire::Psn;

use crate::args::{parse_mtu, DeviceArgs};
use crate::rdma::{failed, open_device, print_counters, STALL};
use crate::signals;
use crate::tcp::{Channel, Idle};

/// Arguments of `roce pingpong`, named as `ibv_rc_pingpong` names them.
#[derive(clap::Args)]
pub struct Args {
    /// Connect to this server (omit to be the server).
    host: Option<Ipv4Addr>,
    /// TCP port of the address exchange.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    #[command(flatten)]
    device: DeviceArgs,
    /// Message size in bytes.
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    size: u32,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(short = 'm', long = "mtu", default_value = "1024", value_parser = parse_mtu)]
    mtu: PathMtu,
    /// Receives posted at once.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: u32,
    /// Round trips.
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    iters: u32,
    /// Service level (accepted for compatibility; RoCEv2 has none).
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    sl: u8,
    /// Sleep on completion events instead of polling (a completion channel, and an engine
    /// thread that sleeps in poll(2)).
    #[arg(short = 'e', long = "events")]
    events: bool,
    /// GID index: 0 is the link-local IPv6 GID, 1 the IPv4-mapped GID, as on rxe.
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
}

/// The Q_Key ibv_ud_pingpong uses.
const UD_QKEY: u32 = 0x1111_1111;
/// Bytes in front of every UD receive.
const GRH: usize = 40;
const SEND_WRID: u64 = 1;
const RECV_WRID: u64 = 2;

/// Runs `roce pingpong`.
pub fn run(args: &Args) -> ExitCode {
    match pingpong(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("roce pingpong: {error}");
            signals::failure(&error)
        }
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
        let bad = || {
            io::Error::other(
                "the peer's address message is not rdma-core's LID:QPN:PSN:GID in hex: is it \
                 ibv_rc_pingpong or roce pingpong, on the same port?",
            )
        };
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
    let mut wire = [0u8; 52];
    if let Some(host) = args.host {
        let stream = TcpStream::connect((host, args.port)).map_err(|error| {
            io::Error::new(
                error.kind(),
                format!("cannot reach {host} port {}: {error}", args.port),
            )
        })?;
        let mut channel = Channel::new(stream, Idle, STALL)?;
        channel.write_all(&mine.to_wire(), "address")?;
        channel.read_exact(&mut wire, "address")?;
        let peer = Dest::from_wire(&wire)?;
        connect(peer)?;
        channel.write_all(b"done\0", "closing `done`")?;
        Ok((peer, host))
    } else {
        let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, args.port))?;
        let (stream, from) = listener.accept()?;
        let mut channel = Channel::new(stream, Idle, STALL)?;
        channel.read_exact(&mut wire, "address")?;
        let peer = Dest::from_wire(&wire)?;
        connect(peer)?;
        channel.write_all(&mine.to_wire(), "address")?;
        let mut done = [0u8; 5];
        channel.read_exact(&mut done, "closing `done`")?;
        let std::net::IpAddr::V4(from) = from.ip() else {
            return Err(io::Error::other("IPv6 peers are not supported yet"));
        };
        Ok((peer, from))
    }
}

/// Refuses what cannot run: before the device is opened, a UD message beyond the largest
/// path MTU; once its port is known (`mtu`), one beyond the port's (a UD message is one
/// packet, and a UD QP's path MTU is its port's).
fn check(args: &Args, mtu: Option<PathMtu>) -> io::Result<()> {
    let (limit, whose) = match mtu {
        Some(mtu) => (mtu, "the port's path MTU"),
        None => (PathMtu::Mtu4096, "the largest path MTU"),
    };
    if args.ud && args.size as usize > limit.bytes() {
        return Err(io::Error::other(format!(
            "a UD message is one packet: -s {} is larger than {whose} ({} bytes)",
            args.size,
            limit.bytes()
        )));
    }
    Ok(())
}

fn pingpong(args: &Args) -> io::Result<()> {
    check(args, None)?;
    // One thread: it drives the engine itself, unless it sleeps on events.
    let progress = if args.events {
        Progress::Events
    } else {
        Progress::Caller
    };
    let ctx = open_device("pingpong", &args.device, args.gid_index, progress)?;
    check(args, Some(ctx.device().query_port().active_mtu))?;
    let pd = ctx.alloc_pd()?;
    let channel = args.events.then(|| ctx.create_comp_channel()).transpose()?;
    let rx_depth = args.rx_depth.max(1);
    let cq = ctx.create_cq(rx_depth as usize + 16, channel.as_ref())?;
    let qp = pd.create_qp(&QpInitAttr {
        qp_type: match (args.uc, args.ud) {
            (true, _) => QpType::Uc,
            (_, true) => QpType::Ud,
            _ => QpType::Rc,
        },
        send_cq: &cq,
        recv_cq: &cq,
        caps: QpCaps {
            max_send_wr: 16,
            max_recv_wr: rx_depth,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    })?;
    let size = args.size as usize;
    // A UD receive starts with the 40-byte GRH area.
    let grh = if args.ud { GRH } else { 0 };
    let send_buf = pd.reg_mr(size, AccessFlags::LOCAL_WRITE)?;
    let recv_buf = pd.reg_mr(size + grh, AccessFlags::all())?;
    let message = payload(args);
    send_buf.write(0, &message)?;
    let endpoint = qp.endpoint(args.gid_index)?;
    let mine = Dest {
        lid: 0,
        qpn: endpoint.qpn,
        psn: endpoint.psn,
        gid: endpoint.gid,
    };
    mine.print("local");
    let recv = RecvWr {
        wr_id: RECV_WRID,
        sg_list: [recv_buf.sge(0, (size + grh) as u32)].into(),
    };
    let mut ud = None;
    let (peer, peer_ip) = exchange(args, mine, |peer| {
        ud = ready(&qp, &pd, args, &peer)?;
        // Receives go up before the peer can send: right after the QP can take them.
        qp.post_recv((0..rx_depth).map(|_| recv.clone()))?;
        Ok(())
    })?;
    peer.print("remote");
    signals::stop_on_signals()?;
    // An IPv4-mapped GID must be the address the peer connected from (an IPv6 GID, such
    // as rxe's link-local GID 0, is used as given).
    let mapped = Ipv6Addr::from(peer.gid).to_ipv4_mapped();
    if mapped.is_some_and(|ip| ip != peer_ip) {
        return Err(io::Error::other(
            "the peer's GID is not the IPv4-mapped address it connected from",
        ));
    }
    let ping = Ping {
        qp: &qp,
        cq: &cq,
        channel: channel.as_ref(),
        send_buf: &send_buf,
        recv_buf: &recv_buf,
        recv,
        grh,
        ud,
    };
    let result = ping.bounce(&message, args);
    print_counters(&args.device, &ctx);
    result
}

/// What ibv_rc_pingpong sends: 0x7b everywhere, and with -c a 0 at every page start.
fn payload(args: &Args) -> Vec<u8> {
    let mut message = vec![0x7bu8; args.size as usize];
    if args.check {
        message.iter_mut().step_by(4096).for_each(|byte| *byte = 0);
    }
    message
}

/// Brings `qp` to where it can send to `peer`: connected (RC, UC), or ready with the
/// destination its UD sends name.
fn ready(qp: &Qp, pd: &Pd, args: &Args, peer: &Dest) -> io::Result<Option<UdDest>> {
    if args.ud {
        qp.ready_ud(UD_QKEY)?;
        let ah = pd.create_ah(AddressVector {
            dgid: peer.gid,
            sgid_index: args.gid_index,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
        })?;
        return Ok(Some(ah.dest(peer.qpn, UD_QKEY)));
    }
    let remote = QpEndpoint {
        qpn: peer.qpn,
        psn: peer.psn,
        gid: peer.gid,
    };
    let options = ConnectOptions {
        mtu: args.mtu,
        retry: RetryConfig::RC_PINGPONG,
        sgid_index: args.gid_index,
        ..ConnectOptions::default()
    };
    qp.connect(&remote, &options)?;
    Ok(None)
}

/// The ping-pong's verbs objects.
struct Ping<'a> {
    qp: &'a Qp,
    cq: &'a Cq,
    channel: Option<&'a CompChannel>,
    send_buf: &'a Mr,
    recv_buf: &'a Mr,
    recv: RecvWr,
    /// Bytes before the message in a receive (the UD GRH area).
    grh: usize,
    /// Where UD sends go.
    ud: Option<UdDest>,
}

impl Ping<'_> {
    /// The ping-pong itself, as `ibv_rc_pingpong` runs it: a side sends again once its last
    /// SEND completed and the next message arrived; the client sends first.
    fn bounce(&self, message: &[u8], args: &Args) -> io::Result<()> {
        let size = message.len() as u32;
        let send = SendWr {
            wr_id: SEND_WRID,
            op: SendOp::Send,
            sg_list: [self.send_buf.sge(0, size)].into(),
            inline_data: Vec::new(),
            flags: SendFlags::SIGNALED,
            ud: self.ud,
            xrc_srqn: 0,
        };
        let started = Instant::now();
        let mut pending = RECV_WRID;
        if args.host.is_some() {
            self.qp.post_send([send.clone()])?;
            pending |= SEND_WRID;
        }
        let (mut sent, mut received) = (0u32, 0u32);
        let mut completions = Vec::new();
        let mut last_progress = Instant::now();
        while sent < args.iters || received < args.iters {
            signals::check()?;
            self.reap(&mut completions)?;
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
                if completion.status != WcStatus::Success {
                    return Err(failed(completion));
                }
                match completion.opcode {
                    WcOpcode::Send => sent += 1,
                    WcOpcode::Recv => {
                        received += 1;
                        let intact = self
                            .recv_buf
                            .with_bytes(|bytes| &bytes[self.grh..] == message)?;
                        if !intact || completion.byte_len != size + self.grh as u32 {
                            return Err(io::Error::other(format!(
                                "message {received} arrived damaged"
                            )));
                        }
                        self.qp.post_recv([self.recv.clone()])?;
                    }
                    other => {
                        return Err(io::Error::other(format!("unexpected completion {other:?}")))
                    }
                }
                pending &= !completion.wr_id;
                if sent < args.iters && pending == 0 {
                    self.qp.post_send([send.clone()])?;
                    pending = RECV_WRID | SEND_WRID;
                }
            }
        }
        print_result(size, args.iters, started.elapsed().as_secs_f64());
        Ok(())
    }

    /// Takes what completions there are; `-e` first sleeps until there is one (or
    /// [`STALL`] passes), as rc_pingpong -e arms, sleeps until the event, then drains.
    fn reap(&self, completions: &mut Vec<WorkCompletion>) -> io::Result<()> {
        completions.clear();
        if let Some(channel) = self.channel {
            self.cq.req_notify(false)?;
            if self.cq.poll_into(16, completions)? == 0 {
                channel.get_cq_event(Some(STALL))?;
                self.cq.poll_into(16, completions)?;
            }
        } else {
            self.cq.poll_into(16, completions)?;
        }
        Ok(())
    }
}

/// rdma-core's two result lines.
fn print_result(size: u32, iters: u32, seconds: f64) {
    let bytes = u64::from(size) * u64::from(iters) * 2;
    println!(
        "{bytes} bytes in {seconds:.2} seconds = {:.2} Mbit/sec",
        bytes as f64 * 8.0 / seconds / 1e6
    );
    println!(
        "{iters} iters in {seconds:.2} seconds = {:.2} usec/iter",
        seconds * 1e6 / f64::from(iters)
    );
}
