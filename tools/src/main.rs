//! `roce`: the roce-xdp command-line tool, shaped like rdma-core's and perftest's programs.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod args;
mod conform;
mod demo;
mod dump;
mod ecn_mark;
mod exec;
mod nvmf;
mod perf;
mod pingpong;
mod progress;
mod rdma;
mod signals;
mod sim;
mod switch;
mod tcp;
mod workload;

#[derive(Parser)]
#[command(name = "roce", version, about = "RoCEv2 in user space: tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Two RoCEv2 endpoints over AF_XDP in network namespaces, next to kernel TCP (root).
    Demo(demo::Args),
    /// RC ping-pong, wire- and option-compatible with rdma-core's ibv_rc_pingpong.
    Pingpong(pingpong::Args),
    /// perftest's bandwidth and latency tests, wire-compatible with ib_write_bw and friends.
    Perf(perf::Args),
    /// IBTA conformance scenarios against another RoCE stack's perftest servers (root).
    Conform(conform::Args),
    /// Seeded mutations inside live connections to another RoCE stack's perftest servers (root).
    Fuzz(conform::fuzz::Args),
    /// Send a `roce fuzz` finding again, on a fresh connection (root).
    Replay(conform::fuzz::ReplayArgs),
    /// Decode RoCEv2 frames in pcap/pcapng files, one line per frame, checking every ICRC.
    Dump(dump::Args),
    /// Move data between two simulated endpoints over a lossy link and verify every byte.
    Sim(sim::Args),
    /// Run an unmodified rdma-core program (ibv_rc_pingpong, ib_write_bw, ...) over our libibverbs.
    Exec(exec::Args),
    /// NVMe over Fabrics (RDMA): serve a target, run a verified workload, discover (root).
    Nvmf(nvmf::Args),
    /// Run the switch that lets several processes use one device, in the foreground (root).
    Switch(switch::Args),
    /// Mark CE on an interface's egress above a virtual queue's threshold (root; tcx).
    EcnMark(ecn_mark::Args),
}

fn main() -> ExitCode {
    init_logging();
    match Cli::parse().command {
        Command::Conform(args) => conform::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Dump(args) => dump::run(&args),
        Command::Fuzz(args) => conform::fuzz::run(&args),
        Command::Replay(args) => conform::fuzz::run_replay(&args),
        Command::Perf(args) => perf::run(&args),
        Command::Pingpong(args) => pingpong::run(&args),
        Command::Sim(args) => sim::run(&args),
        Command::Exec(args) => exec::run(&args),
        Command::Nvmf(args) => nvmf::run(&args),
        Command::Switch(args) => switch::run(&args),
        Command::EcnMark(args) => ecn_mark::run(&args),
    }
}

/// `ROCE_LOG` (tracing's env-filter syntax: `debug`, `roce_transport=trace`, ...) turns on
/// the stack's events on stderr; `roce exec` also passes it on to the program it runs.
fn init_logging() {
    let Some(filter) = std::env::var_os("ROCE_LOG") else {
        return;
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter.to_string_lossy()))
        .with_writer(std::io::stderr)
        .init();
}
