//! `roce exec`: runs an unmodified program linked against rdma-core over our libraries
//! (`libibverbs.so.1`, `librdmacm.so.1` and the `libmlx5.so.1`/`libefa.so.1` stubs), by
//! putting them first on the library path, and shows it our devices where programs look for
//! RDMA devices: in sysfs and `/dev`, as the kernel shows rxe devices, inside a mount
//! namespace of the program's own (`view`). Nothing is installed system-wide, and nothing
//! changes outside the program's namespace.

mod view;

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// The libraries a program finds under their SONAMEs: (SONAME, what cargo builds).
const LIBRARIES: [(&str, &str); 4] = [
    ("libibverbs.so.1", "libibverbs.so"),
    ("librdmacm.so.1", "librdmacm.so"),
    ("libmlx5.so.1", "libmlx5.so"),
    ("libefa.so.1", "libefa.so"),
];

#[derive(clap::Args)]
#[command(trailing_var_arg = true)]
pub struct Args {
    /// Where the built libraries are (default: next to this executable, as `cargo build`
    /// leaves them).
    #[arg(long, value_name = "DIR")]
    lib_dir: Option<PathBuf>,
    /// Write every frame sent and received to this pcap file (sets ROCE_PCAP).
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,
    /// Say on stderr why verbs calls fail (sets ROCE_LOG).
    #[arg(long)]
    log: bool,
    /// How frames move: auto (AF_XDP native, generic, else UDP sockets), native, generic, udp
    /// (sets ROCE_BACKEND).
    #[arg(long, value_name = "KIND")]
    backend: Option<String>,
    /// What drives each device's engine: events (a thread that sleeps until work or a
    /// frame), busy (a thread that spins), caller (no thread: polling a CQ or waiting for
    /// a CQ event drives it; lowest latency, for programs that always do one of those)
    /// (sets ROCE_PROGRESS).
    #[arg(long, value_name = "KIND")]
    progress: Option<String>,
    /// Leave sysfs and /dev as they are: no /sys/class/infiniband, /sys/class/infiniband_verbs
    /// or /dev/infiniband entries for our devices (which need root: a private mount
    /// namespace).
    #[arg(long)]
    no_device_view: bool,
    /// The program and its arguments.
    #[arg(
        required = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM [ARGS]"
    )]
    command: Vec<OsString>,
}

pub fn run(args: &Args) -> ExitCode {
    match exec(args) {
        Ok(never) => match never {},
        Err(why) => {
            eprintln!("roce exec: {why}");
            ExitCode::from(127)
        }
    }
}

/// A directory holding the libraries under their SONAMEs (links to cargo's outputs in
/// `built`), made once next to them.
fn soname_dir(built: &Path) -> Result<PathBuf, String> {
    let dir = built.join("roce-exec");
    std::fs::create_dir_all(&dir).map_err(|error| format!("{}: {error}", dir.display()))?;
    for (soname, file) in LIBRARIES {
        let target = built.join(file);
        if !target.exists() {
            return Err(format!(
                "{} not found; build the libraries first: cargo build --release -p roce-ibverbs -p roce-rdmacm-shim -p roce-mlx5 -p roce-efa",
                target.display()
            ));
        }
        let link = dir.join(soname);
        if std::fs::read_link(&link).ok().as_deref() != Some(target.as_path()) {
            // Another `roce exec` may be making the same link: whoever wins, it is right.
            let _ = std::fs::remove_file(&link);
            match std::os::unix::fs::symlink(&target, &link) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(error) => return Err(format!("{}: {error}", link.display())),
            }
        }
    }
    Ok(dir)
}

fn exec(args: &Args) -> Result<std::convert::Infallible, String> {
    let built = match &args.lib_dir {
        // The links made there must not be relative to wherever the program runs.
        Some(dir) => {
            std::fs::canonicalize(dir).map_err(|error| format!("{}: {error}", dir.display()))?
        }
        None => std::env::current_exe()
            .map_err(|error| format!("where am I: {error}"))?
            .parent()
            .map(Path::to_path_buf)
            .ok_or("this executable has no directory")?,
    };
    let dir = soname_dir(&built)?;
    let mut path = OsString::from(&dir);
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|old| !old.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let (program, rest) = args.command.split_first().ok_or("no program given")?;
    let mut command = Command::new(program);
    command.args(rest).env("LD_LIBRARY_PATH", path);
    if let Some(pcap) = &args.pcap {
        command.env("ROCE_PCAP", pcap);
    }
    if args.log {
        command.env("ROCE_LOG", "1");
    }
    // The program's libibverbs starts a device's switch with this executable when a second
    // process may need the device (`roce_provider::switch`).
    if std::env::var_os("ROCE_SWITCH_BIN").is_none() {
        if let Ok(me) = std::env::current_exe() {
            command.env("ROCE_SWITCH_BIN", me);
        }
    }
    if let Some(backend) = &args.backend {
        command.env("ROCE_BACKEND", backend);
    }
    if let Some(progress) = &args.progress {
        command.env("ROCE_PROGRESS", progress);
    }
    if !args.no_device_view {
        device_view()?;
    }
    // Only returns on failure; the program's exit status becomes ours.
    let error = command.exec();
    Err(format!("{}: {error}", program.to_string_lossy()))
}

/// Shows the program the devices `ibv_get_device_list` lists (the up interfaces, in its
/// order), in a mount namespace of its own; without root, says so and goes on without.
fn device_view() -> Result<(), String> {
    let devices: Vec<roce_verbs::Device> = roce_verbs::devices()
        .map_err(|error| format!("listing the devices: {error}"))?
        .into_iter()
        .filter(|device| device.up)
        .collect();
    match view::install(&roce_verbs::sysfs::tree(&devices)) {
        Ok(()) => Ok(()),
        Err(view::Failure::NotPermitted(error)) => {
            eprintln!(
                "roce exec: no device view in sysfs and /dev ({error}: a private mount namespace needs root)"
            );
            Ok(())
        }
        Err(view::Failure::Broken(why)) => Err(format!(
            "making the device view: {why} (--no-device-view runs without it)"
        )),
    }
}
