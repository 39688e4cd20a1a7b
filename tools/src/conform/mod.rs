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

use std::io;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

pub mod conduct;
pub mod conn;
pub mod fuzz;
pub mod link;
#[cfg(test)]
mod memory;
pub mod open;
pub mod scenarios;
pub mod serve;
pub mod target;
pub mod verdict;

use conduct::run_suite;
use open::open_link;
use scenarios::SCENARIOS;
use serve::{ServeSuite, Server, SERVE_SCENARIOS};
use target::{Options, Reach, Service};
use verdict::Summary;

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
