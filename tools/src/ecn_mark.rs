//! `roce ecn-mark IFACE`: a congested switch port where the kernel has no `red` qdisc: CE
//! marks on what leaves IFACE while a virtual queue of the given rate holds more than the
//! threshold (`roce_provider::ecn_marker`), until SIGINT or SIGTERM; then the counts.

use std::io;
use std::process::ExitCode;
use std::time::Duration;

use roce_provider::ecn_marker::EcnMarker;

use crate::args::parse_size;

#[derive(clap::Args)]
pub struct Args {
    /// The interface whose egress is the congested port.
    interface: String,
    /// The rate the port drains at, in Mb/s (that of the shaper below it).
    #[arg(long, value_name = "MBPS")]
    rate: u64,
    /// Queue length above which ECN-capable packets are marked CE (64K, 30000...).
    #[arg(long, value_parser = parse_size, default_value = "30K")]
    threshold: u64,
}

pub fn run(args: &Args) -> ExitCode {
    // sysfs as `ip netns exec` mounts it: this namespace's interfaces.
    let path = format!("/sys/class/net/{}/ifindex", args.interface);
    let marker = std::fs::read_to_string(&path)
        .and_then(|text| text.trim().parse().map_err(io::Error::other))
        .and_then(|ifindex| EcnMarker::attach(ifindex, args.rate * 1_000_000 / 8, args.threshold));
    let marker = match marker {
        Ok(marker) => marker,
        Err(error) => {
            eprintln!("roce ecn-mark {}: {error}", args.interface);
            return ExitCode::FAILURE;
        }
    };
    if let Err(error) = crate::signals::stop_on_signals() {
        eprintln!("roce ecn-mark: {error}");
        return ExitCode::FAILURE;
    }
    eprintln!("roce ecn-mark {}: marking (Ctrl-C ends it)", args.interface);
    while crate::signals::check().is_ok() {
        std::thread::sleep(Duration::from_millis(20));
    }
    match marker.stats() {
        Ok(stats) => {
            println!(
                "packets={} marked={} queue={}",
                stats.packets, stats.marked, stats.queue
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("roce ecn-mark: {error}");
            ExitCode::FAILURE
        }
    }
}
