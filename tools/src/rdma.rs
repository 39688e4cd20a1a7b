//! What the tools share to drive RDMA: opening a device, a work request, and how long a
//! wait may stall.

use std::io;
use std::path::Path;
use std::time::Duration;

use roce_verbs::{
    devices, BackendChoice, BackendKind, Context, Device, OpenOptions, Progress, SendFlags, SendOp,
    SendWr, Sge,
};

use crate::args::DeviceArgs;

/// Opens the device `-d` names (or the first, as rdma-core does) over AF_XDP, or kernel UDP
/// sockets with `--udp` or when AF_XDP is unavailable (and says so on stderr). Fails, in
/// words, when the device has no GID at `gid_index`.
pub fn open_device(
    tool: &str,
    args: &DeviceArgs,
    gid_index: u8,
    progress: Progress,
) -> io::Result<Context> {
    let device = match &args.device {
        Some(name) => Device::by_name(name)?,
        None => devices()?
            .into_iter()
            .next()
            .ok_or_else(|| io::Error::other("no network interface"))?,
    };
    if device.gid(usize::from(gid_index)).is_none() {
        return Err(io::Error::other(format!(
            "GID index {gid_index} does not exist on {} (it has {} GIDs: 0 is the link-local \
             GID, 1 the IPv4-mapped GID of its first address)",
            device.name,
            device.gids.len()
        )));
    }
    let options = OpenOptions {
        backend: if args.udp {
            BackendChoice::Udp
        } else {
            BackendChoice::Auto
        },
        progress,
        seed: None,
        pcap: args.pcap.as_deref().map(Path::to_path_buf),
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

/// A signaled work request of one gather element.
pub fn signaled(wr_id: u64, op: SendOp, sge: Sge) -> SendWr {
    SendWr {
        wr_id,
        op,
        sg_list: [sge].into(),
        inline_data: Vec::new(),
        flags: SendFlags::SIGNALED,
        ud: None,
    }
}

/// Bound on any single wait, so a broken run ends instead of hanging.
pub const STALL: Duration = Duration::from_secs(10);
