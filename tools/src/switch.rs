//! `roce switch IFACE`: the switch of a device, in the foreground (a process starts one on
//! demand when none runs, with `--on-demand`); see `roce_provider::switch`.

use std::io;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use roce_provider::switch::{Identity, Switch, SwitchConfig};
use roce_provider::xdp::XdpMode;
use roce_verbs::Device;

static STOP: AtomicBool = AtomicBool::new(false);

#[derive(clap::Args)]
pub struct Args {
    /// The interface (the device) to serve.
    interface: String,
    /// Leave once the last process using the device has (how processes start a switch
    /// when none runs).
    #[arg(long)]
    on_demand: bool,
    /// Never lend the device to a process that is alone on it: every process's frames go
    /// through the switch (isolation from the first frame; costs the lone process).
    #[arg(long)]
    no_lend: bool,
    /// AF_XDP mode: native or generic (default: native, else generic).
    #[arg(long, value_name = "MODE")]
    mode: Option<String>,
}

/// How long the switch polls after its last work: `ROCE_SPIN_US` (a process that starts
/// a switch passes its own on), else the engine threads' default.
fn spin() -> Duration {
    std::env::var("ROCE_SPIN_US")
        .ok()
        .and_then(|value| value.parse().ok())
        .map_or(
            roce_verbs::OpenOptions::default().spin,
            Duration::from_micros,
        )
}

pub fn run(args: &Args) -> ExitCode {
    match serve(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("roce switch {}: {error}", args.interface);
            ExitCode::FAILURE
        }
    }
}

fn serve(args: &Args) -> io::Result<()> {
    let mode = match args.mode.as_deref() {
        None => None,
        Some("native") => Some(XdpMode::Native),
        Some("generic") => Some(XdpMode::Generic),
        Some(other) => {
            return Err(io::Error::other(format!(
                "--mode {other}: expected native or generic"
            )))
        }
    };
    let device = Device::by_name(&args.interface)?;
    let config = SwitchConfig {
        interface: device.name.clone(),
        ifindex: device.ifindex,
        identity: Identity {
            mac: device.mac,
            gids: device.gids.clone(),
        },
        mode,
        on_demand: args.on_demand,
        lend: !args.no_lend,
        spin: spin(),
    };
    let mut switch = match Switch::bind(config) {
        // Another process started one first: it serves.
        Err(error) if error.kind() == io::ErrorKind::AddrInUse && args.on_demand => return Ok(()),
        Err(error) if error.kind() == io::ErrorKind::AddrInUse => {
            return Err(io::Error::other("a switch already serves this device"))
        }
        other => other?,
    };
    if !args.on_demand {
        ctrlc::set_handler(|| STOP.store(true, Ordering::Relaxed))
            .map_err(|error| io::Error::other(format!("cannot handle SIGINT: {error}")))?;
        eprintln!("roce switch {}: serving (Ctrl-C ends it)", args.interface);
    }
    let result = switch.run(&STOP);
    if !args.on_demand {
        for (name, value) in switch.stats().iter().take(14) {
            eprintln!("{name} {value}");
        }
    }
    result
}
