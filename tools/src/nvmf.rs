//! `roce nvmf`: NVMe over Fabrics (RDMA transport) on our stack, a thin layer over
//! `roce-nvmf`: `serve` a target, `perf` a verified workload against one, `discover` what
//! a discovery controller lists.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args as ClapArgs, Subcommand};
use roce_nvmf::host::perf::{self, Mode, Workload};
use roce_nvmf::host::{self, Controller, HostConfig};
use roce_nvmf::target::{Backing, HostAccess, Limits, SubsystemConfig, Target, TargetConfig, PORT};
use roce_verbs::{devices, Context, Progress};

use crate::args::{parse_size, DeviceArgs};
use crate::rdma::open_device;
use crate::signals;

/// `roce nvmf`.
#[derive(ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve namespaces (RAM, files or block devices) as an NVMe over RDMA target.
    Serve(ServeArgs),
    /// Connect to a target and run a verified workload, fio-style.
    Perf(PerfArgs),
    /// List the subsystems a target's discovery controller offers this host.
    Discover(DiscoverArgs),
}

#[derive(ClapArgs)]
struct ServeArgs {
    /// The subsystem's NQN.
    #[arg(long)]
    nqn: String,
    /// A RAM namespace of this size (16M, 1G, ...); repeat for more namespaces.
    #[arg(long, value_parser = parse_size)]
    ram: Vec<u64>,
    /// A namespace backed by this file or block device; repeat for more.
    #[arg(long)]
    file: Vec<PathBuf>,
    /// Address to listen on, with an optional port (default: all addresses, port 4420).
    #[arg(long, value_parser = parse_addr)]
    listen: Option<SocketAddr>,
    /// Only this host NQN may connect; repeat for more (default: any host).
    #[arg(long = "allow-host", value_name = "NQN")]
    allow_hosts: Vec<String>,
    /// Any host may connect (also the default when no --allow-host is given).
    #[arg(long, conflicts_with = "allow_hosts")]
    allow_any: bool,
    /// I/O queues each controller may have.
    #[arg(long, default_value = "8")]
    queues: u16,
    /// Entries of each I/O queue, at most.
    #[arg(long, default_value = "128")]
    queue_depth: u16,
    /// Bytes of in-capsule data a write may carry.
    #[arg(long, default_value = "8192", value_parser = parse_size)]
    in_capsule: u64,
    /// Microseconds to keep polling after the last work before sleeping.
    #[arg(long, default_value = "0")]
    spin_us: u64,
    #[command(flatten)]
    device: DeviceArgs,
}

#[derive(ClapArgs)]
struct HostArgs {
    /// The target's address, with an optional port (default 4420).
    #[arg(value_parser = parse_addr)]
    addr: SocketAddr,
    /// This host's NQN.
    #[arg(long, default_value = "nqn.2014-08.io.roce-xdp:host")]
    hostnqn: String,
    /// Keep alive timeout, in seconds.
    #[arg(long, default_value = "5")]
    kato: u64,
    #[command(flatten)]
    device: DeviceArgs,
}

#[derive(ClapArgs)]
struct PerfArgs {
    #[command(flatten)]
    host: HostArgs,
    /// The subsystem's NQN.
    #[arg(long)]
    nqn: String,
    /// read, write, randread, randwrite, rw or randrw (fio's names).
    #[arg(long, default_value = "randrw")]
    rw: Mode,
    /// Percent of reads in a mix.
    #[arg(long, default_value = "50", value_parser = clap::value_parser!(u8).range(0..=100))]
    rwmixread: u8,
    /// Bytes per I/O.
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    bs: u64,
    /// Commands outstanding per I/O queue.
    #[arg(long, default_value = "32")]
    iodepth: u16,
    /// I/O queues.
    #[arg(long, default_value = "1")]
    queues: u16,
    /// Length of the timed phase (5s, 500ms, 2m).
    #[arg(long, value_parser = parse_duration)]
    time: Option<Duration>,
    /// I/Os of the timed phase.
    #[arg(long)]
    ios: Option<u64>,
    /// Bytes of the namespace to use, from its start (default: all of it).
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// The namespace.
    #[arg(long, default_value = "1")]
    nsid: u32,
    /// Check every byte read against what was written.
    #[arg(long)]
    verify: bool,
    /// Send write data by keyed SGL even where it would fit in the capsule.
    #[arg(long)]
    no_in_capsule: bool,
    /// Ask the target to invalidate each command's key (keyed SGL subtype 0xF).
    #[arg(long)]
    invalidate: bool,
    /// Seed of random offsets and verification patterns.
    #[arg(long, default_value = "1")]
    seed: u64,
    /// Microseconds to keep polling after the last completion before sleeping.
    #[arg(long, default_value = "0")]
    spin_us: u64,
}

#[derive(ClapArgs)]
struct DiscoverArgs {
    #[command(flatten)]
    host: HostArgs,
}

/// Runs `roce nvmf ...`.
pub fn run(args: &Args) -> ExitCode {
    let result = match &args.command {
        Command::Serve(args) => serve(args),
        Command::Perf(args) => run_perf(args),
        Command::Discover(args) => discover(args),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("roce nvmf: {error}");
            signals::failure(&error)
        }
    }
}

/// `ADDR` or `ADDR:PORT` (an IPv6 address with a port in brackets); port 4420 if none.
fn parse_addr(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    text.trim_matches(['[', ']'])
        .parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, PORT))
        .map_err(|_| {
            format!("`{text}` is not an address (10.0.0.1, 10.0.0.1:4420, [fe80::1]:4420)")
        })
}

/// `5s`, `500ms`, `2m`, or seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| c.is_ascii_alphabetic()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration such as 5s, 500ms or 2m"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        _ => return Err(format!("`{text}`: the unit is ms, s or m")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|error| format!("`{text}`: {error}"))
}

/// The device: `-d`, else the one holding `ip`, else the first.
fn device_for(args: &DeviceArgs, ip: Option<IpAddr>, tool: &str) -> io::Result<Context> {
    let mut args = DeviceArgs {
        device: args.device.clone(),
        ib_port: args.ib_port,
        udp: args.udp,
        pcap: args.pcap.clone(),
        stats: args.stats,
    };
    if let (None, Some(IpAddr::V4(ip))) = (&args.device, ip) {
        if !ip.is_unspecified() {
            args.device = devices()?
                .into_iter()
                .find(|device| device.ipv4() == Some(ip))
                .map(|device| device.name);
        }
    }
    open_device(tool, &args, 0, Progress::Events)
}

fn serve(args: &ServeArgs) -> io::Result<ExitCode> {
    let listen = args
        .listen
        .unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), PORT));
    let mut namespaces: Vec<Backing> = args.ram.iter().map(|&bytes| Backing::Ram(bytes)).collect();
    namespaces.extend(args.file.iter().cloned().map(Backing::File));
    if namespaces.is_empty() {
        return Err(io::Error::other(
            "give at least one --ram SIZE or --file PATH",
        ));
    }
    let hosts = if args.allow_any || args.allow_hosts.is_empty() {
        HostAccess::Any
    } else {
        HostAccess::Only(args.allow_hosts.clone())
    };
    let config = TargetConfig {
        listen,
        subsystems: vec![SubsystemConfig {
            nqn: args.nqn.clone(),
            namespaces,
            hosts,
        }],
        limits: Limits {
            max_io_queues: args.queues,
            max_queue_depth: args.queue_depth,
            in_capsule: u32::try_from(args.in_capsule)
                .map_err(|_| io::Error::other("--in-capsule is too large"))?,
        },
        spin: Duration::from_micros(args.spin_us),
    };
    let ctx = device_for(&args.device, Some(listen.ip()), "nvmf serve")?;
    let mut target = Target::new(ctx, config)?;
    signals::stop_on_signals()?;
    target.run(
        || signals::check().is_err(),
        |event| eprintln!("roce nvmf serve: {event}"),
    )?;
    eprintln!("roce nvmf serve: stopped");
    Ok(ExitCode::SUCCESS)
}

fn host_config(args: &HostArgs) -> HostConfig {
    HostConfig {
        hostnqn: args.hostnqn.clone(),
        kato: Duration::from_secs(args.kato),
        ..HostConfig::default()
    }
}

fn run_perf(args: &PerfArgs) -> io::Result<ExitCode> {
    let ctx = device_for(&args.host.device, None, "nvmf perf")?;
    let config = HostConfig {
        io_queues: args.queues,
        queue_depth: args.iodepth,
        max_io: u32::try_from(args.bs).unwrap_or(u32::MAX),
        in_capsule: !args.no_in_capsule,
        invalidate: args.invalidate,
        spin: Duration::from_micros(args.spin_us),
        ..host_config(&args.host)
    };
    let mut controller =
        Controller::connect(&ctx, args.host.addr, &args.nqn, &config).map_err(io::Error::other)?;
    signals::stop_on_signals()?;
    let id = &controller.identity;
    println!(
        "roce nvmf perf: {} {}: controller {}, {} I/O queue(s) of {} entries, MDTS {} KiB, in-capsule {} B, model \"{}\"",
        args.host.addr,
        args.nqn,
        controller.cntlid,
        controller.io_queues(),
        controller.queue_depth(),
        id.max_transfer().map_or(0, |bytes| bytes >> 10),
        id.in_capsule_len(),
        id.model
    );
    let workload = Workload {
        mode: args.rw,
        read_percent: args.rwmixread,
        block_size: u32::try_from(args.bs).map_err(|_| io::Error::other("--bs is too large"))?,
        nsid: args.nsid,
        region: args.size.unwrap_or(0),
        depth: usize::from(args.iodepth),
        duration: match (args.time, args.ios) {
            (None, None) => Some(Duration::from_secs(5)),
            (time, _) => time,
        },
        ios: args.ios,
        verify: args.verify,
        seed: args.seed,
    };
    println!(
        "  {} bs={} iodepth={} queues={} verify={}",
        workload.mode,
        workload.block_size,
        workload.depth,
        controller.io_queues(),
        if workload.verify { "on" } else { "off" }
    );
    let report = perf::run(&mut controller, &workload, &|| signals::check().is_err())
        .map_err(io::Error::other)?;
    print!("{report}");
    let shutdown = controller.shutdown();
    crate::rdma::print_counters(&args.host.device, &ctx);
    let mut summary = report.summary();
    if let Err(error) = &shutdown {
        eprintln!("roce nvmf perf: shutdown: {error}");
        summary = summary.replace("status=ok", "status=error");
    }
    println!("{summary}");
    Ok(if report.ok() && shutdown.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn discover(args: &DiscoverArgs) -> io::Result<ExitCode> {
    let ctx = device_for(&args.host.device, None, "nvmf discover")?;
    let entries =
        host::discover(&ctx, args.host.addr, &host_config(&args.host)).map_err(io::Error::other)?;
    println!("Discovery Log Number of Records {}", entries.len());
    for (index, entry) in entries.iter().enumerate() {
        println!("=====Discovery Log Entry {index}======");
        println!(
            "trtype:  {}",
            if entry.trtype == 1 { "rdma" } else { "other" }
        );
        println!(
            "adrfam:  {}",
            if entry.adrfam == 1 { "ipv4" } else { "ipv6" }
        );
        println!(
            "subtype: {}",
            if entry.subtype == 2 {
                "nvme subsystem"
            } else {
                "discovery subsystem"
            }
        );
        println!("portid:  {}", entry.portid);
        println!("trsvcid: {}", entry.trsvcid);
        println!("subnqn:  {}", entry.subnqn);
        println!("traddr:  {}", entry.traddr);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_durations() {
        assert_eq!(parse_addr("10.0.0.1"), Ok("10.0.0.1:4420".parse().unwrap()));
        assert_eq!(
            parse_addr("10.0.0.1:4421"),
            Ok("10.0.0.1:4421".parse().unwrap())
        );
        assert_eq!(
            parse_addr("[fe80::1]"),
            Ok("[fe80::1]:4420".parse().unwrap())
        );
        assert!(parse_addr("host").is_err());
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("5h").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
