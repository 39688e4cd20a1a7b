//! Reaching a target QP: perftest's client role against the servers the target runs in a
//! loop (one per verb, each on its own port), which tells us a fresh QP's number, expected
//! PSN, rkey and address for every connection.

use std::io::{self, Read, Write};
use std::net::{IpAddr, TcpStream};
use std::time::{Duration, Instant};

use roce_wire::Psn;

use crate::perf::exchange::KeyMsg;

/// Which of the target's perftest servers a scenario talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Service {
    /// `ib_write_bw`.
    Write,
    /// `ib_read_bw`.
    Read,
    /// `ib_atomic_bw`.
    Atomic,
    /// `ib_send_bw`.
    Send,
    /// A UD QP: `ibv_ud_pingpong -s SIZE -n 1` (or `roce pingpong --ud`), which speaks the
    /// pingpong programs' exchange instead of perftest's.
    Ud,
}

/// Our side of a connection, as announced to the target.
#[derive(Debug, Clone, Copy)]
pub struct Local {
    /// The QPN the target's answers go to.
    pub qpn: u32,
    /// The PSN our requests start from (the target expects it first).
    pub psn: Psn,
    /// Our GID (IPv4-mapped).
    pub gid: [u8; 16],
}

/// The target's QP of one connection.
#[derive(Debug, Clone, Copy)]
pub struct Remote {
    /// Its QPN.
    pub qpn: u32,
    /// The PSN its own requests would start from.
    pub psn: Psn,
    /// The key of its exposed buffer.
    pub rkey: u32,
    /// The address of its exposed buffer.
    pub vaddr: u64,
    /// The path MTU in bytes.
    pub mtu: usize,
}

/// A live connection: its QP, and how to end it so that the target's server finishes.
pub trait Session {
    /// The target's QP.
    fn remote(&self) -> Remote;
    /// Ends the connection as a client that completed its run would.
    fn close(self: Box<Self>) -> io::Result<()>;
}

/// Something that hands out fresh target QPs.
pub trait Target {
    /// A new connection to the server of `service`, announcing `local`.
    fn connect(&mut self, service: Service, local: &Local) -> io::Result<Box<dyn Session>>;
}

/// The TCP ports of the target's servers, by service.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    /// `ib_write_bw`'s.
    pub write: u16,
    /// `ib_read_bw`'s.
    pub read: u16,
    /// `ib_atomic_bw`'s.
    pub atomic: u16,
    /// `ib_send_bw`'s.
    pub send: u16,
    /// `ibv_ud_pingpong`'s.
    pub ud: u16,
}

/// perftest servers on `host`.
pub struct Perftest {
    /// The target's address.
    pub host: IpAddr,
    /// Its RoCE address, when not `host` ([`Reach::roce_addr`]).
    pub roce_addr: Option<IpAddr>,
    /// Its servers' ports.
    pub ports: Ports,
    /// How long a server may take to (re)start listening before we give up.
    pub patience: Duration,
}

/// The path MTU we ask for (`ibv_mtu` 1 = 256 bytes, the smallest, so both sides keep it):
/// multi-packet messages stay small.
const PATH_MTU_ENUM: u8 = 1;
const PATH_MTU: usize = 256;
/// Bound on each read and write of the exchange, or `--patience` when longer: a peer that
/// took the connection sets up its QP before it answers, which takes a slow target (an
/// emulated VM on a loaded host) more than 10 s at times.
const EXCHANGE_STALL: Duration = Duration::from_secs(10);

impl Perftest {
    /// The local address the connection to `service` would leave from, found by connecting.
    pub fn local_address(&self, service: Service) -> io::Result<IpAddr> {
        Ok(self.dial(service)?.local_addr()?.ip())
    }

    fn port(&self, service: Service) -> u16 {
        match service {
            Service::Write => self.ports.write,
            Service::Read => self.ports.read,
            Service::Atomic => self.ports.atomic,
            Service::Send => self.ports.send,
            Service::Ud => self.ports.ud,
        }
    }

    /// Connects, retrying while the server restarts (the target runs it in a loop).
    fn dial(&self, service: Service) -> io::Result<TcpStream> {
        let deadline = Instant::now() + self.patience;
        loop {
            match TcpStream::connect((self.host, self.port(service))) {
                Ok(stream) => {
                    stream.set_read_timeout(Some(EXCHANGE_STALL.max(self.patience)))?;
                    stream.set_write_timeout(Some(EXCHANGE_STALL.max(self.patience)))?;
                    stream.set_nodelay(true)?;
                    return Ok(stream);
                }
                Err(error) if Instant::now() > deadline => return Err(error),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}

impl Target for Perftest {
    fn connect(&mut self, service: Service, local: &Local) -> io::Result<Box<dyn Session>> {
        if service == Service::Ud {
            return pingpong_exchange(self.dial(service)?, local);
        }
        let mut session = PerftestSession {
            stream: self.dial(service)?,
            service,
            mine: KeyMsg {
                lid: 0,
                out_reads: 1,
                qpn: local.qpn,
                psn: local.psn.value(),
                rkey: 0,
                vaddr: 0,
                gid: local.gid,
                srqn: 0,
            },
            remote: Remote {
                qpn: 0,
                psn: Psn::new(0),
                rkey: 0,
                vaddr: 0,
                mtu: PATH_MTU,
            },
        };
        session.preamble()?;
        // Before the run: write, read and atomic make three handshakes, send four.
        let theirs = session.handshake()?;
        let barriers = if service == Service::Send { 3 } else { 2 };
        for _ in 0..barriers {
            session.handshake()?;
        }
        session.remote = Remote {
            qpn: theirs.qpn & 0xFF_FFFF,
            psn: Psn::new(theirs.psn),
            rkey: theirs.rkey,
            vaddr: theirs.vaddr,
            mtu: PATH_MTU,
        };
        Ok(Box::new(session))
    }
}

struct PerftestSession {
    stream: TcpStream,
    service: Service,
    mine: KeyMsg,
    remote: Remote,
}

impl PerftestSession {
    /// perftest's `ctx_xchg_data` as the client: write ours, read theirs.
    fn exchange(&mut self, mine: &[u8]) -> io::Result<Vec<u8>> {
        self.stream.write_all(mine)?;
        let mut theirs = vec![0u8; mine.len()];
        self.stream.read_exact(&mut theirs)?;
        Ok(theirs)
    }

    /// Version (perftest 4.5's), page size, cache line, MTU.
    fn preamble(&mut self) -> io::Result<()> {
        let mut version = [0u8; 16];
        version[..4].copy_from_slice(b"6.06");
        self.exchange(&version)?;
        self.exchange(&4096u32.to_be_bytes())?;
        self.exchange(&64u32.to_be_bytes())?;
        self.exchange(&[b'0' + PATH_MTU_ENUM, 0])?;
        Ok(())
    }

    fn handshake(&mut self) -> io::Result<KeyMsg> {
        let mine = self.mine.to_wire();
        KeyMsg::from_wire(&self.exchange(&mine)?)
    }
}

impl Session for PerftestSession {
    fn remote(&self) -> Remote {
        self.remote
    }

    fn close(mut self: Box<Self>) -> io::Result<()> {
        if self.service != Service::Send {
            // The run's end barrier, then the client's five results (zeros: we ran nothing).
            self.handshake()?;
            for _ in 0..5 {
                self.exchange(&[0u8; 8])?;
            }
        }
        self.handshake()?;
        self.stream.write_all(b"done\0")
    }
}

/// The UD QP of an `ibv_ud_pingpong` server: its receives are posted before the exchange,
/// and it answers the first message that reaches it with one of its own.
struct PingpongSession(Remote);

impl Session for PingpongSession {
    fn remote(&self) -> Remote {
        self.0
    }

    fn close(self: Box<Self>) -> io::Result<()> {
        Ok(())
    }
}

/// The pingpong programs' exchange as the client: `LID:QPN:PSN:GID` (52 bytes) each way,
/// then `done`.
fn pingpong_exchange(mut stream: TcpStream, local: &Local) -> io::Result<Box<dyn Session>> {
    let gid: String = local.gid.iter().map(|b| format!("{b:02x}")).collect();
    let mine = format!(
        "{:04x}:{:06x}:{:06x}:{gid}",
        0,
        local.qpn,
        local.psn.value()
    );
    let mut wire = [0u8; 52];
    wire[..mine.len()].copy_from_slice(mine.as_bytes());
    stream.write_all(&wire)?;
    stream.read_exact(&mut wire)?;
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "bad pingpong address");
    let text = std::str::from_utf8(&wire).map_err(|_| bad())?;
    let mut fields = text.split(':').skip(1);
    let mut number = || {
        fields
            .next()
            .and_then(|field| u32::from_str_radix(field, 16).ok())
            .ok_or_else(bad)
    };
    let (qpn, psn) = (number()?, number()?);
    stream.write_all(b"done\0")?;
    Ok(Box::new(PingpongSession(Remote {
        qpn: qpn & 0xFF_FFFF,
        psn: Psn::new(psn),
        rkey: 0,
        vaddr: 0,
        mtu: PATH_MTU,
    })))
}

/// How `roce conform`, `roce fuzz` and `roce replay` reach the target's perftest programs.
#[derive(clap::Args)]
pub struct Reach {
    /// The target (its perftest servers' address; with `--serve`, its clients'): IPv4, or
    /// IPv6 that is not link-local (a TCP connection would need the scope).
    pub host: IpAddr,
    /// The interface towards the target (default: the one whose address the connection
    /// to it leaves from).
    #[arg(short = 'd', long = "ib-dev")]
    pub device: Option<String>,
    #[command(flatten)]
    pub ports: PortArgs,
    /// The send server's message size (its `-s`).
    #[arg(long, default_value_t = 64)]
    pub send_size: usize,
    /// Seconds a server (or client) may take to come back, and to answer each step of the
    /// exchange (10 s at least), before the target counts as broken.
    #[arg(long, default_value_t = 15)]
    pub patience: u64,
    /// The target's RoCE address (its GID's) when it is not HOST: perftest's exchange is
    /// IPv4 only, so an IPv6 GID (its `-x` naming an IPv6 address's index) is reached through
    /// HOST's IPv4 exchange. Our frames then go from our own address of that kind on the same
    /// interface (the link-local one when ADDR is link-local) to the MAC of HOST.
    #[arg(long, value_name = "ADDR")]
    pub roce_addr: Option<IpAddr>,
}

impl Reach {
    /// The target's perftest servers.
    pub fn perftest(&self) -> Perftest {
        Perftest {
            host: self.host,
            roce_addr: self.roce_addr,
            ports: self.ports.ports(),
            patience: Duration::from_secs(self.patience),
        }
    }
}

/// The ports of the target's perftest servers.
#[derive(clap::Args, Clone, Copy)]
pub struct PortArgs {
    /// `ib_write_bw`'s port.
    #[arg(long, default_value_t = 18515)]
    pub write_port: u16,
    /// `ib_read_bw`'s port.
    #[arg(long, default_value_t = 18516)]
    pub read_port: u16,
    /// `ib_atomic_bw`'s port.
    #[arg(long, default_value_t = 18517)]
    pub atomic_port: u16,
    /// `ib_send_bw`'s port.
    #[arg(long, default_value_t = 18518)]
    pub send_port: u16,
    /// `ibv_ud_pingpong`'s port (its message size is `--send-size`).
    #[arg(long, default_value_t = 18519)]
    pub ud_port: u16,
}

impl PortArgs {
    /// As the target module wants them.
    pub fn ports(&self) -> Ports {
        Ports {
            write: self.write_port,
            read: self.read_port,
            atomic: self.atomic_port,
            send: self.send_port,
            ud: self.ud_port,
        }
    }
}

/// What a suite needs besides the target and the link.
pub struct Options {
    /// The send server's message size.
    pub send_size: usize,
    /// `--check`.
    pub check: Option<String>,
}

/// The RoCEv2 GID of an IP address: an IPv4 one mapped into IPv6, an IPv6 one itself.
pub fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(ip) => ip.to_ipv6_mapped().octets(),
        IpAddr::V6(ip) => ip.octets(),
    }
}

/// A fresh identity for our side of a connection.
pub fn fresh_local(ip: IpAddr) -> Local {
    let mut random = [0u8; 8];
    // Without entropy the numbers are merely predictable, which no scenario depends on.
    let _ = rustix::rand::getrandom(&mut random, rustix::rand::GetRandomFlags::empty());
    let word = u64::from_le_bytes(random);
    Local {
        // Away from QPs 0 and 1, and from the low numbers stacks hand out first.
        qpn: 0x10_0000 | (word as u32 & 0xF_FFFF),
        psn: roce_wire::Psn::new((word >> 32) as u32),
        gid: gid_of(ip),
    }
}
