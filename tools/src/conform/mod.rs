//! `roce conform [flags] HOST`: named IBTA scenarios against another RoCE stack, each with the
//! answer the specification requires, reported as PASS, DEVIATES (the target answered
//! otherwise) or BROKE (the target stopped working).
//!
//! The target runs perftest servers in a loop (`while :; do ib_write_bw -p 18515 ...; done`,
//! likewise `ib_read_bw`, `ib_atomic_bw` and `ib_send_bw -s 64 -n 5`); we play perftest's
//! client on each, which gives us a fresh QP (number, expected PSN, rkey, address) per
//! scenario. Our own frames leave through AF_XDP on the interface the TCP connection uses,
//! so anything in them can be wrong on purpose, and the target's answers come back the same
//! way. After each scenario a fresh connection must still do the normal operation of its
//! service, and `--check CMD` must succeed: otherwise the scenario BROKE the target.

use std::io::{self, Write};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Duration;

use roce_provider::afxdp::AfXdpBackend;
use roce_provider::backend::Backend;
use roce_provider::capture::PcapRecorder;
use roce_verbs::{devices, XdpMode};
use roce_wire::Opcode;

pub mod conn;
pub mod fuzz;
pub mod link;
#[cfg(test)]
mod memory;
pub mod scenarios;
pub mod serve;
pub mod target;

use conn::Conn;
use link::{Link, Station};
use scenarios::{baseline, Scenario, RECEIVES_AT_MOST, SCENARIOS};
use serve::{ServeSuite, Server, SERVE_SCENARIOS};
use target::{Local, Perftest, Ports, Service, Target};

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
    /// Seconds a server (or client) may take to come back before the target counts as
    /// broken.
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

/// Arguments of `roce conform`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub reach: Reach,
    /// Only the scenarios of these services (comma-separated; default all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub service: Vec<Service>,
    /// Only the scenarios with these names (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Not the scenarios with these names (one that broke the target, to run the rest).
    #[arg(long, value_delimiter = ',')]
    pub skip: Vec<String>,
    /// Milliseconds to wait for an answer that may not come.
    #[arg(long, default_value_t = 200)]
    pub wait: u64,
    /// A command (run by `sh -c`) whose failure after a scenario means the target broke.
    #[arg(long, value_name = "CMD")]
    pub check: Option<String>,
    /// Write every frame sent and received to this pcap file.
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
    /// The target as requester: serve its perftest clients (`-s 64 -n 5 -t 1`, looping,
    /// connecting to us from HOST) on the same ports, with the requester's scenarios.
    #[arg(long)]
    pub serve: bool,
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

/// A scenario's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The target answered as the specification requires.
    Pass,
    /// It answered otherwise, and still works.
    Deviates,
    /// It stopped working.
    Broke,
}

/// The counts of the last line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Scenarios run.
    pub scenarios: usize,
    /// Passed.
    pub pass: usize,
    /// Deviated.
    pub deviate: usize,
    /// Broke the target.
    pub broke: usize,
}

/// What a suite needs besides the target and the link.
pub struct Options {
    /// The send server's message size.
    pub send_size: usize,
    /// `--check`.
    pub check: Option<String>,
}

/// Runs `roce conform`.
pub fn run(args: &Args) -> ExitCode {
    match conform(args) {
        Ok(summary) if summary.broke == 0 => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("roce conform: {error}");
            ExitCode::from(2)
        }
    }
}

impl Args {
    /// The scenarios of `all` that `--service`, `--only` and `--skip` select (`what` says a
    /// scenario's service and name).
    fn chosen<'a, T>(
        &self,
        all: &'a [T],
        what: fn(&T) -> (Service, &str),
    ) -> io::Result<Vec<&'a T>> {
        let chosen: Vec<&T> = all
            .iter()
            .filter(|s| {
                let (service, name) = what(s);
                (self.service.is_empty() || self.service.contains(&service))
                    && (self.only.is_empty() || self.only.iter().any(|n| n == name))
                    && !self.skip.iter().any(|n| n == name)
            })
            .collect();
        if chosen.is_empty() {
            return Err(io::Error::other("no scenario selected"));
        }
        Ok(chosen)
    }
}

fn conform(args: &Args) -> io::Result<Summary> {
    if args.serve {
        return conform_serve(args);
    }
    let chosen = args.chosen(SCENARIOS, |s| (s.service, s.name))?;
    let mut target = args.reach.perftest();
    let mut link = open_link(
        &target,
        chosen[0].service,
        args.reach.device.as_deref(),
        args.pcap.as_deref(),
        Duration::from_millis(args.wait),
    )?;
    let options = Options {
        send_size: args.reach.send_size,
        check: args.check.clone(),
    };
    run_suite(&mut target, &mut link, &chosen, &options, &mut io::stdout())
}

fn conform_serve(args: &Args) -> io::Result<Summary> {
    let chosen = args.chosen(SERVE_SCENARIOS, |s| (s.service, s.name))?;
    let mut services: Vec<Service> = chosen.iter().map(|s| s.service).collect();
    services.dedup();
    let options = Options {
        send_size: args.reach.send_size,
        check: args.check.clone(),
    };
    let suite = ServeSuite {
        server: Server::bind(
            &services,
            args.reach.ports.ports(),
            args.reach.host,
            Duration::from_secs(args.reach.patience),
        )?,
        device: args.reach.device.clone(),
        roce_addr: args.reach.roce_addr,
        pcap: args.pcap.clone(),
        wait: Duration::from_millis(args.wait),
        options: &options,
    };
    suite.run(&chosen, &mut io::stdout())
}

/// Opens AF_XDP on the interface towards the target, and learns both stations (a TCP
/// connection to `service`'s server says which address we leave from, and fills the ARP
/// entry of the target's MAC; the server sees a client that hung up and starts again).
pub fn open_link(
    target: &Perftest,
    service: Service,
    device: Option<&str>,
    pcap: Option<&std::path::Path>,
    wait: Duration,
) -> io::Result<Link> {
    let ours = target.local_address(service)?;
    link_between(ours, target.host, target.roce_addr, device, pcap, wait)
}

/// Opens AF_XDP on the interface with address `ours` (or `device`), towards `theirs`, whose
/// MAC the kernel's neighbour table must already hold (a TCP connection with it fills it);
/// the frames go to `roce_addr` instead of `theirs` when given (see [`Reach::roce_addr`]).
pub fn link_between(
    ours: IpAddr,
    theirs: IpAddr,
    roce_addr: Option<IpAddr>,
    device: Option<&str>,
    pcap: Option<&std::path::Path>,
    wait: Duration,
) -> io::Result<Link> {
    let device = devices()?
        .into_iter()
        .find(|d| match device {
            Some(name) => d.name == name,
            None => d.gids.contains(&gid_of(ours)),
        })
        .ok_or_else(|| io::Error::other(format!("no interface with address {ours}")))?;
    let their_mac = neighbour_mac(theirs, &device.name)?;
    let (ours, theirs) = match roce_addr {
        Some(roce_addr) => (our_roce_addr(&device, roce_addr)?, roce_addr),
        None => (ours, theirs),
    };
    let afxdp = AfXdpBackend::open(&device.name, XdpMode::Native)
        .or_else(|_| AfXdpBackend::open(&device.name, XdpMode::Generic))?;
    let backend: Box<dyn Backend> = match pcap {
        Some(path) => Box::new(PcapRecorder::create(afxdp, path).map_err(io::Error::other)?),
        None => Box::new(afxdp),
    };
    Ok(Link::new(
        backend,
        Station {
            mac: device.mac,
            ip: ours,
        },
        Station {
            mac: their_mac,
            ip: theirs,
        },
        wait,
    ))
}

/// The target's MAC from the kernel's ARP or IPv6 neighbour table (the TCP connection has
/// just filled it).
fn neighbour_mac(ip: IpAddr, interface: &str) -> io::Result<[u8; 6]> {
    let missing = || io::Error::other(format!("no neighbour entry for {ip} on {interface}"));
    if ip.is_ipv6() {
        // No /proc file for it: ip(8) asks over netlink, in this thread's namespace.
        let output = Command::new("ip")
            .args(["-6", "neigh", "show", &ip.to_string(), "dev", interface])
            .output()?;
        return String::from_utf8_lossy(&output.stdout)
            .lines()
            .find_map(|line| {
                let words: Vec<&str> = line.split_whitespace().collect();
                let at = words.iter().position(|word| *word == "lladdr")?;
                roce_verbs::device::parse_mac(words.get(at + 1)?).ok()
            })
            .ok_or_else(missing);
    }
    let table = std::fs::read_to_string("/proc/thread-self/net/arp")?;
    let wanted = ip.to_string();
    table
        .lines()
        .skip(1)
        .find_map(|line| {
            let columns: Vec<&str> = line.split_whitespace().collect();
            match columns[..] {
                [address, _, _, mac, _, dev] if address == wanted && dev == interface => {
                    roce_verbs::device::parse_mac(mac).ok()
                }
                _ => None,
            }
        })
        .ok_or_else(missing)
}

/// Our address on `device` of the kind of the target's RoCE address `theirs`: IPv4, IPv6
/// link-local (the GID our stack derives from the MAC, as the kernel does), or another IPv6.
fn our_roce_addr(device: &roce_verbs::Device, theirs: IpAddr) -> io::Result<IpAddr> {
    let ours = match theirs {
        IpAddr::V4(_) => device.ipv4().map(IpAddr::V4),
        IpAddr::V6(theirs) => device
            .gids
            .iter()
            .map(|gid| std::net::Ipv6Addr::from(*gid))
            .find(|gid| {
                gid.to_ipv4_mapped().is_none()
                    && gid.is_unicast_link_local() == theirs.is_unicast_link_local()
            })
            .map(IpAddr::V6),
    };
    ours.ok_or_else(|| {
        io::Error::other(format!(
            "no address of {}'s kind on {}",
            theirs, device.name
        ))
    })
}

/// The RoCEv2 GID of an IP address: an IPv4 one mapped into IPv6, an IPv6 one itself.
pub fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(ip) => ip.to_ipv6_mapped().octets(),
        IpAddr::V6(ip) => ip.octets(),
    }
}

/// A fresh identity for our side of a connection.
fn fresh_local(ip: IpAddr) -> Local {
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

/// Runs `scenario` on a fresh connection; returns its observation, or an error saying why
/// no connection could be made (the caller decides whether that means BROKE).
pub fn conduct(
    target: &mut dyn Target,
    link: &mut Link,
    scenario: &Scenario,
    options: &Options,
) -> io::Result<Result<String, String>> {
    let local = fresh_local(link.ours.ip);
    let session = match target.connect(scenario.service, &local) {
        Ok(session) => session,
        Err(error) => return Ok(Err(format!("connect:{error}"))),
    };
    let mut conn = Conn::new(link, session.remote(), local, options.send_size);
    let observed = (scenario.run)(&mut conn)?;
    if scenario.service == Service::Send {
        use_up_receives(&mut conn)?;
    }
    // A server whose QP the scenario broke may have exited already: nothing to close.
    let _ = session.close();
    Ok(Ok(observed))
}

/// A send server finishes when its receives are used: SEND until it stops ACKing.
pub fn use_up_receives(conn: &mut Conn) -> io::Result<()> {
    for _ in 0..RECEIVES_AT_MOST {
        let at = conn.next;
        let answer = conn.step(&[conn.send(Opcode::RcSendOnly, at, conn.send_size)], 1)?;
        if answer != format!("ACK@{at}") {
            break;
        }
    }
    Ok(())
}

/// Runs `scenarios` in order, one result line each and the summary line on `out`; stops
/// after the first BROKE (what follows would only measure a dead target).
pub fn run_suite(
    target: &mut dyn Target,
    link: &mut Link,
    scenarios: &[&Scenario],
    options: &Options,
    out: &mut dyn Write,
) -> io::Result<Summary> {
    let mut summary = Summary::default();
    for scenario in scenarios {
        let outcome = conduct(target, link, scenario, options)?;
        let line = Line::judge(scenario.name, scenario.expected, outcome, |_| {
            let probe = baseline(scenario.service);
            let seen = conduct(target, link, probe, options)?;
            Ok(failed_probe(probe.name, probe.expected, seen)
                .into_iter()
                .chain(failed_check(options)?)
                .collect())
        })?;
        line.write(out, &mut summary)?;
        if line.verdict == Verdict::Broke {
            break;
        }
    }
    summary.write(out)?;
    Ok(summary)
}

/// `--check`'s failure, if it failed.
pub fn failed_check(options: &Options) -> io::Result<Option<String>> {
    let Some(check) = &options.check else {
        return Ok(None);
    };
    let status = Command::new("sh").args(["-c", check]).status()?;
    Ok((!status.success()).then(|| format!("check:{status}")))
}

/// What failed in a liveness probe named `name`, if it did not see what it `expected`.
pub fn failed_probe(name: &str, expected: &[&str], seen: Result<String, String>) -> Option<String> {
    match seen {
        Ok(seen) if expected.contains(&seen.as_str()) => None,
        Ok(seen) | Err(seen) => Some(format!("{name}:{seen}")),
    }
}

/// One scenario's result line.
pub struct Line<'a> {
    /// The scenario.
    pub name: &'a str,
    /// What the specification allows.
    pub expected: &'a [&'a str],
    /// What the target did.
    pub observed: String,
    /// The verdict.
    pub verdict: Verdict,
    /// What failed after the scenario, if it broke the target.
    pub broken_by: Vec<String>,
}

impl<'a> Line<'a> {
    /// The verdict on `outcome` (an observation, or why no connection could be made):
    /// unless that broke it already, `after` (given the observation) says what fails
    /// after the scenario, which makes it BROKE.
    pub fn judge(
        name: &'a str,
        expected: &'a [&'a str],
        outcome: Result<String, String>,
        after: impl FnOnce(&str) -> io::Result<Vec<String>>,
    ) -> io::Result<Line<'a>> {
        let (observed, mut verdict) = match outcome {
            Ok(observed) if expected.contains(&observed.as_str()) => (observed, Verdict::Pass),
            Ok(observed) => (observed, Verdict::Deviates),
            Err(why) => (why, Verdict::Broke),
        };
        let mut broken_by = Vec::new();
        if verdict != Verdict::Broke {
            broken_by = after(&observed)?;
            if !broken_by.is_empty() {
                verdict = Verdict::Broke;
            }
        }
        Ok(Line {
            name,
            expected,
            observed,
            verdict,
            broken_by,
        })
    }

    /// Writes `NAME expected=... observed=... VERDICT [after=...]` and counts it.
    pub fn write(&self, out: &mut dyn Write, summary: &mut Summary) -> io::Result<()> {
        summary.scenarios += 1;
        let word = match self.verdict {
            Verdict::Pass => {
                summary.pass += 1;
                "PASS"
            }
            Verdict::Deviates => {
                summary.deviate += 1;
                "DEVIATES"
            }
            Verdict::Broke => {
                summary.broke += 1;
                "BROKE"
            }
        };
        let why = if self.broken_by.is_empty() {
            String::new()
        } else {
            format!(" after={}", one_word(&self.broken_by.join(";")))
        };
        writeln!(
            out,
            "{} expected={} observed={} {word}{why}",
            self.name,
            self.expected.join("|"),
            one_word(&self.observed),
        )?;
        out.flush()
    }
}

impl Summary {
    /// The last line.
    pub fn write(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "scenarios={} pass={} deviate={} broke={}",
            self.scenarios, self.pass, self.deviate, self.broke
        )
    }
}

/// `text` with its whitespace made underscores, so that a result line splits on spaces.
fn one_word(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join("_")
}
