//! `roce`: the roce-xdp command-line tool, shaped like rdma-core's and perftest's programs.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod demo;
mod dump;
mod exec;
mod perf;
mod pingpong;
mod rdma;
mod sim;

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
    /// Decode RoCEv2 frames in pcap/pcapng files, one line per frame, checking every ICRC.
    Dump(dump::Args),
    /// Move data between two simulated endpoints over a lossy link and verify every byte.
    Sim(sim::Args),
    /// Run an unmodified rdma-core program (ibv_rc_pingpong, ib_write_bw, ...) over our libibverbs.
    Exec(exec::Args),
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Demo(args) => demo::run(&args),
        Command::Dump(args) => dump::run(&args),
        Command::Perf(args) => perf::run(&args),
        Command::Pingpong(args) => pingpong::run(&args),
        Command::Sim(args) => sim::run(&args),
        Command::Exec(args) => exec::run(&args),
    }
}
