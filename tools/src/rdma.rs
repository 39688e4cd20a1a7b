//! What the tools share to drive RDMA: one connected RC QP on an endpoint, and waiting for
//! its completions.

use std::io;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use roce_provider::backend::Backend;
use roce_provider::engine::Engine;
use roce_transport::cq::{WcStatus, WorkCompletion};
use roce_transport::mr::PdId;
use roce_transport::qp::{QpCaps, QpInit};
use roce_transport::qp_state::{connect_attrs, AddressVector, PathMtu, Peer, QpType, RetryConfig};
use roce_transport::wr::{SendFlags, SendOp, SendWr, Sge};
use roce_transport::{AccessFlags, CqId, Endpoint};
use roce_verbs::{devices, BackendChoice, BackendKind, Context, Device, OpenOptions, Progress};
use roce_wire::Psn;

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

/// An endpoint with one PD, one CQ and one connected (RC or UC) QP.
pub struct Side {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// The QP.
    pub qpn: u32,
    /// Its protection domain.
    pub pd: PdId,
    /// The CQ of both its queues.
    pub cq: CqId,
    /// RC or UC.
    pub qp_type: QpType,
}

impl Side {
    /// A fresh endpoint whose keys come from `seed`, with a QP of `qp_type` and `caps` in
    /// RESET.
    pub fn new(seed: [u8; 32], qp_type: QpType, caps: QpCaps) -> io::Result<Side> {
        let mut endpoint = Endpoint::new(seed);
        let pd = endpoint.mrs().alloc_pd();
        let cq = endpoint.create_cq(8192);
        let init = QpInit {
            pd,
            qp_type,
            send_cq: 0,
            recv_cq: 0,
            caps,
            sq_sig_all: false,
        };
        let qpn = endpoint.create_qp(init, cq, cq).map_err(io::Error::other)?;
        Ok(Side {
            endpoint,
            qpn,
            pd,
            cq,
            qp_type,
        })
    }

    /// Brings the QP to RTS towards `peer`, with rc_pingpong's timers (a 67 ms ACK timeout:
    /// a side descheduled for a few ms must not use up the retries).
    pub fn connect(&mut self, peer: Peer, sq_psn: Psn, mtu: PathMtu) -> io::Result<()> {
        let now = Instant::now();
        for attr in connect_attrs(self.qp_type, peer, sq_psn, mtu, RetryConfig::RC_PINGPONG) {
            self.endpoint
                .modify_qp(now, self.qpn, &attr)
                .map_err(io::Error::other)?;
        }
        Ok(())
    }

    /// Registers `len` zeroed bytes at `iova` with every access right.
    pub fn register(&mut self, iova: u64, len: usize) -> io::Result<u32> {
        self.endpoint
            .mrs()
            .reg_mr(self.pd, iova, len, AccessFlags::all())
            .map_err(io::Error::other)
    }
}

/// The address vector of an IPv4 peer (its IPv4-mapped GID).
pub fn av(ip: Ipv4Addr) -> AddressVector {
    AddressVector {
        dgid: ip.to_ipv6_mapped().octets(),
        sgid_index: 1,
        hop_limit: 64,
        traffic_class: 0,
        flow_label: 0,
    }
}

/// Fails unless the completion is a success.
pub fn check_ok(completion: &WorkCompletion) -> io::Result<()> {
    if completion.status == WcStatus::Success {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "work request {} ended {:?}",
            completion.wr_id, completion.status
        )))
    }
}

/// Polls `engine` until `want` completions arrived (each must be a success), then returns
/// them; fails after [`STALL`] without progress.
pub fn wait<B: Backend>(
    engine: &mut Engine<B>,
    cq: CqId,
    want: usize,
) -> io::Result<Vec<WorkCompletion>> {
    let mut completions = Vec::with_capacity(want);
    let mut last_progress = Instant::now();
    while completions.len() < want {
        engine.poll()?;
        let before = completions.len();
        engine
            .endpoint()
            .cq(cq)
            .poll(want - completions.len(), &mut completions);
        if completions.len() > before {
            last_progress = Instant::now();
        } else if last_progress.elapsed() > STALL {
            return Err(io::Error::other("no completion for 10 s"));
        }
    }
    completions.iter().try_for_each(check_ok)?;
    Ok(completions)
}

/// A signaled send work request with one gather element.
pub fn signaled(wr_id: u64, op: SendOp, sge: Sge) -> SendWr {
    SendWr {
        wr_id,
        op,
        sg_list: vec![sge],
        inline_data: Vec::new(),
        flags: SendFlags::SIGNALED,
        ud: None,
    }
}
