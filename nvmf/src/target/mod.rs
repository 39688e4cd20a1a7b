//! The target (controller side): subsystems of namespaces served over rdma_cm.
//!
//! One thread runs everything: it takes rdma_cm events (connect requests are checked
//! against the binding's private data and accepted or rejected with its status codes),
//! polls one CQ shared by every queue's QP (a completion names its QP, which names its
//! queue), and checks keep alive timers. It sleeps in poll(2) on the event channel and the
//! CQ's completion channel when there is nothing to do. What a controller answers is in
//! `controller` and `io` (no I/O there); how a command moves through its queue is in `queue`.

mod controller;
mod io;
mod queue;
mod storage;
mod subsystem;

use std::collections::HashMap;
use std::fmt;
use std::io as stdio;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use roce_verbs::{
    CmEventKind, CmId, CompChannel, ConnParam, ConnectRequest, Context, Cq, EventChannel, Pd,
    QpCaps, QpInitAttr, QpType, Sge, WcStatus, WorkCompletion,
};

pub use controller::Limits;
pub use storage::Backing;
pub use subsystem::{HostAccess, SubsystemConfig, BLOCK_SHIFT};

use controller::{Port, Registry, ADMIN_QUEUE_DEPTH};
use queue::{Queue, Shape, KIND_READ, KIND_RECV, KIND_SEND};
use subsystem::Subsystem;

use crate::wire::cm::{emit_reject, CmReply, CmRequest, RejectStatus, RECFMT};
use crate::wire::fabrics::ConnectData;
use crate::wire::log::{ADRFAM_IPV4, ADRFAM_IPV6};

/// The NVMe over RDMA port.
pub const PORT: u16 = 4420;

/// Entries of the CQ every queue shares; connections beyond it are refused (no
/// resources).
const CQ_DEPTH: usize = 1 << 16;
/// Completions taken per poll.
const BATCH: usize = 64;
/// Longest sleep between looks at the timers.
const TICK: Duration = Duration::from_millis(100);
/// How long a connected queue may go without its Connect command.
const CONNECT_GRACE: Duration = Duration::from_secs(30);
/// READs a connection lets us have outstanding at its host, at most (the device's limit).
const MAX_READS: u8 = 128;
/// Staging buffers of an admin queue, and of an I/O queue of RAM namespaces (whose
/// reads and writes need none; Dataset Management's ranges do).
const FEW_STAGING: usize = 4;
/// Staging buffers of an I/O queue when a namespace is a file.
const FILE_STAGING: usize = 16;

/// What the target serves, and where.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    /// Address and port to listen on (port 4420 by convention; the unspecified address
    /// listens on all of the device's).
    pub listen: SocketAddr,
    /// The subsystems (the discovery subsystem is always there too).
    pub subsystems: Vec<SubsystemConfig>,
    /// What each controller may have.
    pub limits: Limits,
    /// How long the thread keeps polling after its last work before it sleeps.
    pub spin: Duration,
}

/// Something that happened, for a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Listening.
    Listening(SocketAddr),
    /// A connection was refused.
    Rejected {
        /// Who asked.
        peer: Option<SocketAddr>,
        /// Why.
        why: String,
    },
    /// A host created a controller.
    Controller {
        /// Its ID.
        cntlid: u16,
        /// The subsystem.
        subnqn: String,
        /// The host.
        hostnqn: String,
        /// The host's address.
        peer: Option<SocketAddr>,
    },
    /// An I/O queue joined a controller.
    IoQueue {
        /// The controller.
        cntlid: u16,
        /// Queue ID.
        qid: u16,
        /// Entries.
        depth: usize,
    },
    /// A queue closed on its own.
    QueueClosed {
        /// Its controller, if it had one.
        cntlid: Option<u16>,
        /// Its queue ID, once connected.
        qid: Option<u16>,
        /// Why.
        why: String,
    },
    /// A controller ended, with all its queues.
    ControllerGone {
        /// Its ID.
        cntlid: u16,
        /// Its host.
        hostnqn: String,
        /// Queues freed.
        queues: usize,
        /// Why.
        why: String,
    },
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let addr = |peer: &Option<SocketAddr>| peer.map_or("?".into(), |p| p.to_string());
        match self {
            Event::Listening(addr) => write!(f, "listening on {addr} (rdma_cm)"),
            Event::Rejected { peer, why } => {
                write!(f, "rejected a connection from {}: {why}", addr(peer))
            }
            Event::Controller {
                cntlid,
                subnqn,
                hostnqn,
                peer,
            } => write!(
                f,
                "controller {cntlid}: host {hostnqn} at {} connected to {subnqn}",
                addr(peer)
            ),
            Event::IoQueue { cntlid, qid, depth } => {
                write!(f, "controller {cntlid}: I/O queue {qid}, {depth} entries")
            }
            Event::QueueClosed { cntlid, qid, why } => match (cntlid, qid) {
                (Some(cntlid), Some(qid)) => {
                    write!(f, "controller {cntlid}: I/O queue {qid} closed: {why}")
                }
                _ => write!(f, "a queue without a controller closed: {why}"),
            },
            Event::ControllerGone {
                cntlid,
                hostnqn,
                queues,
                why,
            } => write!(
                f,
                "controller {cntlid} (host {hostnqn}) ended: {why}; {queues} queue(s) freed"
            ),
        }
    }
}

/// What the queues share: the subsystems, the controllers, the limits.
pub(crate) struct State {
    pd: Pd,
    subsystems: Vec<Subsystem>,
    registry: Registry,
    limits: Limits,
    listen: SocketAddr,
    events: Vec<Event>,
}

impl State {
    /// This port, as a discovery log entry gives it: the listening address, or (listening
    /// on all) the address the host reached.
    fn port(&self, local: Option<SocketAddr>) -> Port {
        let addr = match local {
            Some(local) if self.listen.ip().is_unspecified() => local,
            _ => self.listen,
        };
        Port {
            adrfam: if addr.is_ipv4() {
                ADRFAM_IPV4
            } else {
                ADRFAM_IPV6
            },
            traddr: addr.ip().to_string(),
            trsvcid: self.listen.port().to_string(),
        }
    }

    /// `len` bytes at `offset` of namespace `nsid` of controller `cntlid`'s subsystem, if
    /// it is a RAM namespace.
    fn region_sge(&self, cntlid: u16, nsid: u32, offset: u64, len: u32) -> Option<Sge> {
        let subsystem = self.registry.controllers.get(&cntlid)?.subsystem?;
        let ns = self.subsystems[subsystem].namespace(nsid)?;
        let region = ns.storage.region()?;
        (offset + u64::from(len) <= ns.len()).then(|| region.sge(offset as usize, len))
    }

    /// A queue's Connect succeeded.
    fn connected(&mut self, queue: &Queue, data: &ConnectData) {
        let (Some(cntlid), Some(qid)) = (queue.cntlid, queue.qid) else {
            return;
        };
        self.events.push(if qid == 0 {
            Event::Controller {
                cntlid,
                subnqn: data.subnqn.clone(),
                hostnqn: data.hostnqn.clone(),
                peer: queue.peer,
            }
        } else {
            Event::IoQueue {
                cntlid,
                qid,
                depth: queue.shape.depth,
            }
        });
    }
}

/// The target: listening, serving its subsystems to the hosts they allow.
pub struct Target {
    queues: HashMap<u64, Queue>,
    by_qpn: HashMap<u32, u64>,
    listener: CmId,
    channel: EventChannel,
    cq: Cq,
    comp: CompChannel,
    cq_used: usize,
    state: State,
    spin: Duration,
    /// Dropped last: the device stays open while anything above uses it.
    _ctx: Context,
}

fn verbs(what: &str) -> impl FnOnce(roce_verbs::Error) -> stdio::Error + '_ {
    move |error| stdio::Error::other(format!("{what}: {error}"))
}

impl Target {
    /// Opens the subsystems' storage and listens.
    pub fn new(ctx: Context, config: TargetConfig) -> stdio::Result<Target> {
        let pd = ctx.alloc_pd().map_err(verbs("allocating a PD"))?;
        let mut subsystems = Vec::new();
        for subsystem in &config.subsystems {
            if subsystems
                .iter()
                .any(|s: &Subsystem| s.nqn == subsystem.nqn)
            {
                return Err(stdio::Error::other(format!(
                    "subsystem {} given twice",
                    subsystem.nqn
                )));
            }
            subsystems.push(Subsystem::open(subsystem, &pd)?);
        }
        let comp = ctx
            .create_comp_channel()
            .map_err(verbs("creating a completion channel"))?;
        let cq = ctx
            .create_cq(CQ_DEPTH, Some(&comp))
            .map_err(verbs("creating the CQ"))?;
        let channel = ctx
            .create_event_channel()
            .map_err(verbs("creating an event channel"))?;
        let listener = ctx.create_id(&channel).map_err(verbs("creating a CM id"))?;
        listener
            .bind_addr(config.listen)
            .map_err(verbs("binding the listening address"))?;
        listener.listen(128).map_err(verbs("listening"))?;
        let limits = config.limits;
        if limits.max_queue_depth < 2 || limits.max_io_queues == 0 {
            return Err(stdio::Error::other(
                "queues need at least 2 entries, and a controller at least 1 I/O queue",
            ));
        }
        Ok(Target {
            queues: HashMap::new(),
            by_qpn: HashMap::new(),
            listener,
            channel,
            cq,
            comp,
            cq_used: 0,
            state: State {
                pd,
                subsystems,
                registry: Registry::default(),
                limits,
                listen: config.listen,
                events: vec![Event::Listening(config.listen)],
            },
            spin: config.spin,
            _ctx: ctx,
        })
    }

    /// Connections open now.
    pub fn queues(&self) -> usize {
        self.queues.len()
    }

    /// Controllers alive now.
    pub fn controllers(&self) -> usize {
        self.state.registry.controllers.len()
    }

    /// Serves until `stop` says so (it is asked at least every 100 ms), telling `on_event`
    /// what happens. Fails only if the device fails.
    pub fn run(
        &mut self,
        stop: impl Fn() -> bool,
        mut on_event: impl FnMut(&Event),
    ) -> stdio::Result<()> {
        let mut completions = Vec::with_capacity(BATCH);
        let mut next_sweep = Instant::now() + TICK;
        let mut busy_until = Instant::now();
        loop {
            for event in self.state.events.drain(..) {
                on_event(&event);
            }
            if stop() {
                return Ok(());
            }
            let now = Instant::now();
            let mut worked = false;
            while let Some(event) = self
                .channel
                .try_get_cm_event()
                .map_err(verbs("taking a CM event"))?
            {
                self.on_cm(event.id, event.kind, now);
                worked = true;
            }
            completions.clear();
            self.cq
                .poll_into(BATCH, &mut completions)
                .map_err(verbs("polling the CQ"))?;
            worked |= !completions.is_empty();
            for completion in completions.drain(..) {
                self.on_completion(&completion, now);
            }
            if now >= next_sweep {
                self.sweep(now);
                next_sweep = now + TICK;
            }
            if worked {
                busy_until = now + self.spin;
                continue;
            }
            if now < busy_until {
                std::hint::spin_loop();
                continue;
            }
            self.sleep(next_sweep.saturating_duration_since(now))?;
        }
    }

    /// Sleeps until a CM event, a completion or `timeout`.
    fn sleep(&mut self, timeout: Duration) -> stdio::Result<()> {
        let mut completions = Vec::new();
        let cq = &self.cq;
        crate::wait::sleep(cq, &self.comp, &self.channel, timeout.min(TICK), || {
            cq.poll_into(BATCH, &mut completions)
                .map_err(verbs("polling the CQ"))?;
            Ok(!completions.is_empty())
        })?;
        let now = Instant::now();
        for completion in &completions {
            self.on_completion(completion, now);
        }
        Ok(())
    }

    fn on_cm(&mut self, handle: u64, kind: CmEventKind, now: Instant) {
        match kind {
            CmEventKind::ConnectRequest(request) => self.on_request(*request, now),
            CmEventKind::Established => {}
            CmEventKind::Disconnected => self.close(handle, "the host disconnected".into(), false),
            CmEventKind::TimewaitExit => {}
            other => self.close(
                handle,
                format!("connection failed (rdma_cm event {})", other.code()),
                false,
            ),
        }
    }

    /// Checks a connect request's private data and resources; the queue's shape.
    fn check(&self, request: &ConnectRequest) -> Result<(CmRequest, Shape), RejectStatus> {
        let nvme = CmRequest::parse(&request.private_data)?;
        let limits = &self.state.limits;
        if nvme.recfmt != RECFMT {
            return Err(RejectStatus::InvalidRecfmt);
        }
        let depth = usize::from(nvme.hsqsize) + 1;
        let shape = if nvme.qid == 0 {
            if depth > usize::from(ADMIN_QUEUE_DEPTH) {
                return Err(RejectStatus::InvalidHsqsize);
            }
            Shape {
                depth,
                in_capsule: 0,
                staging: FEW_STAGING,
            }
        } else {
            if nvme.qid > limits.max_io_queues {
                return Err(RejectStatus::InvalidQid);
            }
            if depth > usize::from(limits.max_queue_depth) {
                return Err(RejectStatus::InvalidHsqsize);
            }
            let files = self.state.subsystems.iter().any(Subsystem::has_files);
            Shape {
                depth,
                in_capsule: limits.in_capsule,
                staging: if files { FILE_STAGING } else { FEW_STAGING },
            }
        };
        if nvme.hrqsize == 0 {
            return Err(RejectStatus::InvalidHrqsize);
        }
        // Without READs at the host, no host data could be fetched.
        if request.responder_resources == 0 {
            return Err(RejectStatus::InvalidIrd);
        }
        if self.cq_used + shape.cq_entries() > CQ_DEPTH {
            return Err(RejectStatus::NoResources);
        }
        Ok((nvme, shape))
    }

    fn on_request(&mut self, request: ConnectRequest, now: Instant) {
        let peer = request.id.peer_addr();
        let reject = |state: &mut State, id: &CmId, status: RejectStatus, why: String| {
            let _ = id.reject(&emit_reject(status));
            state.events.push(Event::Rejected {
                peer,
                why: format!(
                    "{why} (NVMe RDMA status {}: {})",
                    status.code(),
                    status.message()
                ),
            });
        };
        let (nvme, shape) = match self.check(&request) {
            Ok(checked) => checked,
            Err(status) => {
                return reject(&mut self.state, &request.id, status, "refused".into());
            }
        };
        let caps = QpCaps {
            max_send_wr: shape.send_queue() as u32,
            max_recv_wr: shape.depth as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        };
        let attr = QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &self.cq,
            recv_cq: &self.cq,
            caps,
            sq_sig_all: false,
        };
        let qp = match request.id.create_qp(&self.state.pd, &attr) {
            Ok(qp) => qp,
            Err(error) => {
                let why = format!("no QP: {error}");
                return reject(&mut self.state, &request.id, RejectStatus::NoResources, why);
            }
        };
        let param = ConnParam {
            private_data: CmReply {
                recfmt: RECFMT,
                crqsize: shape.depth as u16,
            }
            .emit()
            .to_vec(),
            responder_resources: request.initiator_depth.min(MAX_READS),
            initiator_depth: request.responder_resources.min(MAX_READS),
            retry_count: 7,
            rnr_retry_count: 7,
        };
        let cq_entries = shape.cq_entries();
        let queue = match Queue::new(request.id, qp, &self.state.pd, nvme, shape, now) {
            Ok(queue) => queue,
            Err(failed) => {
                let (id, why) = *failed;
                return reject(&mut self.state, &id, RejectStatus::NoResources, why);
            }
        };
        if let Err(error) = queue.cm.accept(&queue.qp, &param) {
            self.state.events.push(Event::Rejected {
                peer,
                why: format!("accepting failed: {error}"),
            });
            return;
        }
        let handle = queue.cm.handle();
        self.by_qpn.insert(queue.qp.qp_num(), handle);
        self.queues.insert(handle, queue);
        self.cq_used += cq_entries;
    }

    fn on_completion(&mut self, completion: &WorkCompletion, now: Instant) {
        let Some(&handle) = self.by_qpn.get(&completion.qp_num) else {
            return;
        };
        let Some(queue) = self.queues.get_mut(&handle) else {
            return;
        };
        if completion.status != WcStatus::Success {
            if completion.status != WcStatus::WrFlush {
                let why = format!("a work request failed: {:?}", completion.status);
                self.fail(handle, why);
            }
            return;
        }
        let index = (completion.wr_id & 0xFFFF_FFFF) as usize;
        let done = match completion.wr_id >> 32 {
            KIND_RECV => queue.on_recv(index, completion.byte_len, &mut self.state, now),
            KIND_READ => queue.on_read(index, &mut self.state, now),
            KIND_SEND => {
                let sent = queue.on_send(index, &mut self.state);
                if sent.is_ok() && queue.close_after_response && queue.busy() == 0 {
                    self.close(handle, "a Disconnect command".into(), true);
                    return;
                }
                sent
            }
            _ => Ok(()),
        };
        if let Err(why) = done {
            self.fail(handle, why);
        }
    }

    /// A queue broke: its controller ends, as Linux's target ends one on a fatal error;
    /// a queue without one just closes.
    fn fail(&mut self, handle: u64, why: String) {
        match self.queues.get(&handle).and_then(|q| q.cntlid) {
            Some(cntlid) => self.end_controller(cntlid, why),
            None => self.close(handle, why, true),
        }
    }

    /// Closes one queue (sending a DREQ if `disconnect`); an admin queue takes its
    /// controller with it.
    fn close(&mut self, handle: u64, why: String, disconnect: bool) {
        let Some(queue) = self.queues.get(&handle) else {
            return;
        };
        if let (Some(cntlid), Some(0)) = (queue.cntlid, queue.qid) {
            return self.end_controller(cntlid, why);
        }
        let Some(queue) = self.drop_queue(handle, disconnect) else {
            return;
        };
        if let (Some(cntlid), Some(qid)) = (queue.0, queue.1) {
            if let Some(controller) = self.state.registry.controllers.get_mut(&cntlid) {
                controller.io_queues.remove(&qid);
            }
        }
        self.state.events.push(Event::QueueClosed {
            cntlid: queue.0,
            qid: queue.1,
            why,
        });
    }

    /// Frees a queue; its controller and queue ID.
    fn drop_queue(&mut self, handle: u64, disconnect: bool) -> Option<(Option<u16>, Option<u16>)> {
        let queue = self.queues.remove(&handle)?;
        self.by_qpn.remove(&queue.qp.qp_num());
        self.cq_used -= queue.shape.cq_entries();
        if disconnect {
            let _ = queue.cm.disconnect();
        }
        Some((queue.cntlid, queue.qid))
    }

    /// Ends a controller: every queue of it is disconnected and freed.
    fn end_controller(&mut self, cntlid: u16, why: String) {
        let handles: Vec<u64> = self
            .queues
            .iter()
            .filter(|(_, q)| q.cntlid == Some(cntlid))
            .map(|(&handle, _)| handle)
            .collect();
        for &handle in &handles {
            self.drop_queue(handle, true);
        }
        let hostnqn = self
            .state
            .registry
            .controllers
            .remove(&cntlid)
            .map(|c| c.hostnqn)
            .unwrap_or_default();
        self.state.events.push(Event::ControllerGone {
            cntlid,
            hostnqn,
            queues: handles.len(),
            why,
        });
    }

    /// Keep alive timers, and queues that never sent their Connect.
    fn sweep(&mut self, now: Instant) {
        let expired: Vec<(u16, u32)> = self
            .state
            .registry
            .controllers
            .values()
            .filter(|c| c.expired(now))
            .map(|c| (c.cntlid, c.kato_ms))
            .collect();
        for (cntlid, kato_ms) in expired {
            self.end_controller(cntlid, format!("keep alive timeout ({kato_ms} ms)"));
        }
        let silent: Vec<u64> = self
            .queues
            .iter()
            .filter(|(_, q)| q.qid.is_none() && now.duration_since(q.created) > CONNECT_GRACE)
            .map(|(&handle, _)| handle)
            .collect();
        for handle in silent {
            self.close(handle, "no Connect command".into(), true);
        }
    }
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("listening", &self.listener.local_addr())
            .field("queues", &self.queues.len())
            .finish_non_exhaustive()
    }
}
