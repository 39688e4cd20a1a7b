//! What the tools share to drive RDMA: opening a device, and how long a wait may stall.

use std::io;
use std::path::Path;
use std::time::Duration;

use roce_verbs::{devices, BackendChoice, BackendKind, Context, Device, OpenOptions, Progress};

/// Opens the device named `name` (or the first, as rdma-core does) over AF_XDP, or kernel
/// UDP sockets with `udp` or when AF_XDP is unavailable (and says so on stderr).
pub fn open_device(
    tool: &str,
    name: Option<&str>,
    udp: bool,
    progress: Progress,
    pcap: Option<&Path>,
) -> io::Result<Context> {
    let device = match name {
        Some(name) => Device::by_name(name)?,
        None => devices()?
            .into_iter()
            .next()
            .ok_or_else(|| io::Error::other("no network interface"))?,
    };
    let options = OpenOptions {
        backend: if udp {
            BackendChoice::Udp
        } else {
            BackendChoice::Auto
        },
        progress,
        seed: None,
        pcap: pcap.map(Path::to_path_buf),
    };
    let ctx = Context::open(&device, options)?;
    if let BackendKind::Udp {
        fallback: Some(why),
    } = ctx.backend_kind()
    {
        eprintln!("roce {tool}: AF_XDP unavailable ({why}); using kernel UDP sockets");
    }
    Ok(ctx)
}

/// Bound on any single wait, so a broken run ends instead of hanging.
pub const STALL: Duration = Duration::from_secs(10);
