//! What the tools share to drive RDMA: opening a device, a work request, a failed
//! completion in words, and how long a wait may stall.

use std::io;
use std::path::Path;
use std::time::Duration;

pub use roce_transport::wr::signaled;
use roce_verbs::{
    devices, BackendChoice, BackendKind, Context, Device, OpenOptions, Progress, WcStatus,
    WorkCompletion,
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
        pcap: args.pcap.as_deref().map(Path::to_path_buf),
        ..OpenOptions::default()
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

/// A completion's status as rdma-core names it (`IBV_WC_*`), with what it tells a user.
pub fn status_in_words(status: WcStatus) -> String {
    let (name, words) = match status {
        WcStatus::Success => ("IBV_WC_SUCCESS", "success"),
        WcStatus::LocalLength => (
            "IBV_WC_LOC_LEN_ERR",
            "local length error: a message longer than the receive buffer",
        ),
        WcStatus::LocalQpOperation => (
            "IBV_WC_LOC_QP_OP_ERR",
            "local QP operation error: a request this QP cannot carry out",
        ),
        WcStatus::LocalProtection => (
            "IBV_WC_LOC_PROT_ERR",
            "local protection error: a local key or its access does not cover the buffer",
        ),
        WcStatus::WrFlush => (
            "IBV_WC_WR_FLUSH_ERR",
            "flushed: the QP had already failed, and an earlier completion says why",
        ),
        WcStatus::BadResponse => (
            "IBV_WC_BAD_RESP_ERR",
            "bad response error: the peer answered with something impossible",
        ),
        WcStatus::LocalAccess => (
            "IBV_WC_LOC_ACCESS_ERR",
            "local access error: a READ or atomic result could not be written here",
        ),
        WcStatus::RemoteInvalidRequest => (
            "IBV_WC_REM_INV_REQ_ERR",
            "remote invalid request error: the peer refused the request as invalid",
        ),
        WcStatus::RemoteAccess => (
            "IBV_WC_REM_ACCESS_ERR",
            "remote access error: the peer refused the key, the address range or the access",
        ),
        WcStatus::RemoteOperation => (
            "IBV_WC_REM_OP_ERR",
            "remote operation error: the peer could not carry out the request",
        ),
        WcStatus::RetryExceeded => (
            "IBV_WC_RETRY_EXC_ERR",
            "transport retry counter exceeded: the peer stopped answering",
        ),
        WcStatus::RnrRetryExceeded => (
            "IBV_WC_RNR_RETRY_EXC_ERR",
            "RNR retry counter exceeded: the peer had no receive posted, retry after retry",
        ),
        WcStatus::General => ("IBV_WC_GENERAL_ERR", "general error"),
        _ => ("IBV_WC_GENERAL_ERR", "an error this tool has no words for"),
    };
    format!("{name} ({words})")
}

/// The error a failed completion makes: what it was, on which QP, and its status in words.
pub fn failed(completion: &WorkCompletion) -> io::Error {
    io::Error::other(format!(
        "work request {} ({:?} on QP {:#x}) failed: {}",
        completion.wr_id,
        completion.opcode,
        completion.qp_num,
        status_in_words(completion.status)
    ))
}

/// Bound on any single wait, so a broken run ends instead of hanging.
pub const STALL: Duration = Duration::from_secs(10);

/// With `--stats`, the device's counters on stderr, one `name value` line each, as the C
/// drop-in prints them with `ROCE_STATS=1`.
pub fn print_counters(args: &DeviceArgs, ctx: &Context) {
    if !args.stats {
        return;
    }
    match ctx.counters() {
        Ok(counters) => {
            eprintln!("roce-xdp hw_counters {}", ctx.device().name);
            for (name, value) in counters.iter() {
                eprintln!("{name} {value}");
            }
        }
        Err(error) => eprintln!("roce: no counters: {error}"),
    }
}
