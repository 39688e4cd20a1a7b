//! The host (initiator): connects to a controller over rdma_cm, as Linux's `nvme_rdma`
//! does — the admin queue, Connect, enabling the controller through its properties,
//! Identify, Number of Queues, then each I/O queue with its own Connect — and keeps it
//! alive with Keep Alive commands while it is used. Every queue's QP completes into one
//! CQ, which one thread polls.
//!
//! Data moves through each command slot's registered buffer: the controller reads it
//! (RDMA READ, or in the capsule when it fits) or writes into it (RDMA WRITE), by keyed
//! SGL descriptors of subtype 0x0 unless [`HostConfig::invalidate`] asks for 0xF (remote
//! invalidation, for a stack whose regions can be invalidated remotely).

pub mod perf;
mod queue;

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use roce_verbs::{
    CmEventKind, CompChannel, ConnParam, Context, Cq, EventChannel, Pd, QpCaps, QpInitAttr, QpType,
    WcStatus, WorkCompletion,
};

pub use queue::{Completed, Transfer};

use queue::{HostQueue, KIND_RECV, KIND_SEND};

use crate::wire::cm::{parse_reject, CmRequest, RejectStatus, ADMIN_QUEUE_DEPTH, RECFMT};
use crate::wire::fabrics::{
    cc, csts, property, Connect, ConnectData, Fabrics, CNTLID_DYNAMIC, CONNECT_DATA_LEN,
    DISCOVERY_NQN,
};
use crate::wire::identify::{self, IdentifyController, IdentifyNamespace, SGLS_KEYED};
use crate::wire::log::{self, DiscoveryEntry, GetLogPage};
use crate::wire::{admin, feature, io as nvm, Cqe, Sqe, Status};

/// Why a host operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A verbs call failed.
    #[error("verbs: {0}")]
    Verbs(#[from] roce_verbs::Error),
    /// The controller refused the connection, with the binding's status.
    #[error("connection rejected: NVMe RDMA status {} ({})", .0.code(), .0.message())]
    Rejected(RejectStatus),
    /// The connection failed another way.
    #[error("connection: {0}")]
    Connection(String),
    /// A command failed.
    #[error("{command} failed: status {status}")]
    Command {
        /// Which command.
        command: &'static str,
        /// Its status.
        status: Status,
    },
    /// The controller broke a rule.
    #[error("protocol: {0}")]
    Protocol(String),
    /// A wait ran out.
    #[error("timed out: {0}")]
    Timeout(&'static str),
    /// The operating system.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// How the host connects.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The host's NQN.
    pub hostnqn: String,
    /// The host's 128-bit identifier.
    pub hostid: [u8; 16],
    /// Keep alive timeout (Linux's default: 5 s); Keep Alive goes every half of it.
    pub kato: Duration,
    /// I/O queues to ask for.
    pub io_queues: u16,
    /// Commands each I/O queue holds.
    pub queue_depth: u16,
    /// Largest I/O in bytes (a slot's buffer), at most the controller's limit.
    pub max_io: u32,
    /// Send write data in the capsule when the controller takes it.
    pub in_capsule: bool,
    /// Ask for remote invalidation (keyed SGL subtype 0xF).
    pub invalidate: bool,
    /// How long a wait for the controller may take.
    pub timeout: Duration,
    /// How long the thread keeps polling after its last completion before it sleeps.
    pub spin: Duration,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            hostnqn: "nqn.2014-08.io.roce-xdp:host".into(),
            hostid: [0; 16],
            kato: Duration::from_secs(5),
            io_queues: 1,
            queue_depth: 32,
            max_io: 128 << 10,
            in_capsule: true,
            invalidate: false,
            timeout: Duration::from_secs(10),
            spin: Duration::ZERO,
        }
    }
}

/// Admin commands at once: one a caller waits for, and Keep Alive.
const ADMIN_SLOTS: u16 = 4;
/// Bytes of an admin slot's buffer.
const ADMIN_DATA: usize = 128 << 10;
/// Completions taken per poll.
const BATCH: usize = 64;
/// How often a poll looks at connection events and the keep alive timer.
const SERVICE_INTERVAL: Duration = Duration::from_millis(1);
/// READs the controller may have outstanding at this host per queue.
const RESPONDER_RESOURCES: u8 = 16;

/// A connected controller, with its queues.
pub struct Controller {
    /// The I/O queues (index `i` is queue ID `i + 1`); the admin queue after them, so it
    /// is dropped last.
    queues: Vec<HostQueue>,
    admin: HostQueue,
    cq: Cq,
    comp: CompChannel,
    channel: EventChannel,
    pd: Pd,
    config: HostConfig,
    /// The controller's ID.
    pub cntlid: u16,
    /// Its Identify Controller data.
    pub identity: IdentifyController,
    /// Its CAP property.
    pub cap: u64,
    keep_alive: Option<(u16, Instant)>,
    /// When the next Keep Alive is due (none before the controller is enabled).
    next_keep_alive: Option<Instant>,
    /// Set when a queue's connection went away.
    lost: Option<String>,
    /// Completions taken while arming the CQ, handled by the next poll.
    pending: Vec<WorkCompletion>,
    /// When `poll` next looks at connection events and Keep Alive.
    next_service: Instant,
}

fn wr_parts(completion: &WorkCompletion) -> (u64, usize) {
    (
        completion.wr_id >> 32,
        (completion.wr_id & 0xFFFF_FFFF) as usize,
    )
}

impl Controller {
    /// Connects to the subsystem `subnqn` at `addr`: the admin queue, the controller
    /// enabled and identified, then as many I/O queues as it grants (up to
    /// `config.io_queues`).
    pub fn connect(
        ctx: &Context,
        addr: SocketAddr,
        subnqn: &str,
        config: &HostConfig,
    ) -> Result<Controller, Error> {
        let pd = ctx.alloc_pd()?;
        let comp = ctx.create_comp_channel()?;
        let queues = usize::from(config.io_queues);
        let depth = usize::from(config.queue_depth.max(2));
        let cq_depth = 2 * usize::from(ADMIN_SLOTS) + queues * 2 * depth + 16;
        let cq = ctx.create_cq(cq_depth, Some(&comp))?;
        let channel = ctx.create_event_channel()?;
        let admin_request = CmRequest {
            recfmt: RECFMT,
            qid: 0,
            hrqsize: ADMIN_QUEUE_DEPTH,
            hsqsize: ADMIN_QUEUE_DEPTH - 1,
            cntlid: 0,
        };
        let admin = open_queue(
            ctx,
            &pd,
            &cq,
            &channel,
            addr,
            admin_request,
            ADMIN_SLOTS,
            ADMIN_DATA,
            config.timeout,
        )?;
        let mut controller = Controller {
            queues: Vec::new(),
            admin,
            cq,
            comp,
            channel,
            pd,
            config: config.clone(),
            cntlid: 0,
            identity: IdentifyController::default(),
            cap: 0,
            keep_alive: None,
            next_keep_alive: None,
            lost: None,
            pending: Vec::new(),
            next_service: Instant::now(),
        };
        controller.admin.set_invalidate(config.invalidate);
        let kato_ms = if subnqn == DISCOVERY_NQN {
            0
        } else {
            config.kato.as_millis().min(u128::from(u32::MAX)) as u32
        };
        let connect = Connect {
            recfmt: 0,
            qid: 0,
            sqsize: ADMIN_QUEUE_DEPTH - 1,
            cattr: 0,
            kato: kato_ms,
        };
        let data = ConnectData {
            hostid: config.hostid,
            cntlid: CNTLID_DYNAMIC,
            subnqn: subnqn.to_string(),
            hostnqn: config.hostnqn.clone(),
        };
        let cqe = controller.connect_queue(None, &connect, &data)?;
        controller.cntlid = cqe.result as u16;
        controller.enable()?;
        let identity = controller.admin_data(
            "Identify Controller",
            identify_command(identify::CNS_CONTROLLER, 0),
            identify::IDENTIFY_LEN,
        )?;
        controller.identity = IdentifyController::parse(&identity)
            .ok_or(Error::Protocol("short Identify data".into()))?;
        if controller.identity.cntlid != controller.cntlid {
            return Err(Error::Protocol(format!(
                "Connect gave controller {} but Identify says {}",
                controller.cntlid, controller.identity.cntlid
            )));
        }
        if controller.identity.subnqn != subnqn {
            return Err(Error::Protocol(format!(
                "asked for {subnqn}, connected to {}",
                controller.identity.subnqn
            )));
        }
        if controller.identity.sgls & SGLS_KEYED == 0 {
            return Err(Error::Protocol("no keyed SGL support".into()));
        }
        controller.next_keep_alive = Some(Instant::now() + config.kato / 2);
        if subnqn != DISCOVERY_NQN && config.io_queues > 0 {
            controller.open_io_queues(ctx, addr, subnqn)?;
        }
        Ok(controller)
    }

    /// Enables the controller through CC and waits for CSTS.RDY, as long as CAP.TO allows.
    fn enable(&mut self) -> Result<(), Error> {
        self.cap = self.property_get(property::CAP, true)?;
        let config = cc::EN | 6 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT;
        self.property_set(property::CC, u64::from(config))?;
        let limit = Duration::from_millis(500 * ((self.cap >> 24) & 0xFF).max(1));
        let deadline = Instant::now() + limit;
        loop {
            let status = self.property_get(property::CSTS, false)? as u32;
            if status & csts::CFS != 0 {
                return Err(Error::Protocol("controller fatal status on enable".into()));
            }
            if status & csts::RDY != 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout("CSTS.RDY"));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn open_io_queues(
        &mut self,
        ctx: &Context,
        addr: SocketAddr,
        subnqn: &str,
    ) -> Result<(), Error> {
        let mut sqe = Sqe::new(admin::SET_FEATURES, 0);
        sqe.set_dword(10, u32::from(feature::NUMBER_OF_QUEUES));
        let asked = u32::from(self.config.io_queues - 1);
        sqe.set_dword(11, asked | asked << 16);
        let granted = self.admin_command("Set Features (Number of Queues)", sqe, Transfer::None)?;
        let granted = (granted.result as u16).min((granted.result >> 16) as u16) + 1;
        let count = self.config.io_queues.min(granted);
        let mqes = (self.cap & 0xFFFF) as u16;
        let depth = self
            .config
            .queue_depth
            .clamp(2, mqes.saturating_add(1))
            .min(self.identity.maxcmd.max(2));
        let max_io = self.max_io();
        for qid in 1..=count {
            let request = CmRequest {
                recfmt: RECFMT,
                qid,
                hrqsize: depth,
                hsqsize: depth - 1,
                cntlid: self.cntlid,
            };
            let mut queue = open_queue(
                ctx,
                &self.pd,
                &self.cq,
                &self.channel,
                addr,
                request,
                depth,
                max_io as usize,
                self.config.timeout,
            )?;
            queue.set_invalidate(self.config.invalidate);
            if self.config.in_capsule {
                queue.in_capsule = self.identity.in_capsule_len();
            }
            self.queues.push(queue);
            let connect = Connect {
                recfmt: 0,
                qid,
                sqsize: depth - 1,
                cattr: 0,
                kato: 0,
            };
            let data = ConnectData {
                hostid: self.config.hostid,
                cntlid: self.cntlid,
                subnqn: subnqn.to_string(),
                hostnqn: self.config.hostnqn.clone(),
            };
            self.connect_queue(Some(self.queues.len() - 1), &connect, &data)?;
        }
        Ok(())
    }

    /// Largest I/O: what the configuration asks, within the controller's MDTS.
    pub fn max_io(&self) -> u32 {
        let limit = self.identity.max_transfer().unwrap_or(u64::MAX);
        u64::from(self.config.max_io).min(limit) as u32
    }

    /// The I/O queues' depth (commands each holds).
    pub fn queue_depth(&self) -> usize {
        self.queues.first().map_or(0, HostQueue::depth)
    }

    /// Number of I/O queues.
    pub fn io_queues(&self) -> usize {
        self.queues.len()
    }

    fn queue(&mut self, index: Option<usize>) -> &mut HostQueue {
        match index {
            Some(index) => &mut self.queues[index],
            None => &mut self.admin,
        }
    }

    /// Sends a queue's Connect (its data in the capsule if the queue takes 1024 bytes
    /// there) and waits for its completion.
    fn connect_queue(
        &mut self,
        index: Option<usize>,
        connect: &Connect,
        data: &ConnectData,
    ) -> Result<Cqe, Error> {
        let queue = self.queue(index);
        let slot = queue
            .take_slot()
            .ok_or(Error::Protocol("no free slot".into()))?;
        queue.write_data(slot, 0, &data.emit())?;
        queue.submit(
            slot,
            Fabrics::Connect(*connect).emit(0),
            Transfer::ToController(CONNECT_DATA_LEN as u32),
        )?;
        self.wait_for(index, slot, "Connect")
    }

    /// Waits for the completion of `slot` on queue `index` (`None`: admin), failing on an
    /// error status.
    fn wait_for(
        &mut self,
        index: Option<usize>,
        slot: u16,
        what: &'static str,
    ) -> Result<Cqe, Error> {
        let cqe = self.wait_cqe(index, slot, what)?;
        if !cqe.status.is_success() {
            return Err(Error::Command {
                command: what,
                status: cqe.status,
            });
        }
        Ok(cqe)
    }

    /// Waits for the completion of `slot` on queue `index` (`None`: admin), and for the
    /// slot to be free again (its SEND complete).
    fn wait_cqe(
        &mut self,
        index: Option<usize>,
        slot: u16,
        what: &'static str,
    ) -> Result<Cqe, Error> {
        let deadline = Instant::now() + self.config.timeout;
        let queue_number = index.map_or(0, |i| i + 1);
        let mut found = None;
        let mut completions = Vec::new();
        while found.is_none() || !self.queue(index).is_free(slot) {
            if Instant::now() > deadline {
                return Err(Error::Timeout(what));
            }
            completions.clear();
            if self.poll(&mut completions)? == 0 {
                self.wait(Duration::from_millis(10))?;
            }
            for completed in completions.drain(..) {
                if completed.queue == queue_number && completed.slot == slot {
                    found = Some(completed.cqe);
                }
                self.release(completed.queue, completed.slot);
            }
        }
        found.ok_or(Error::Timeout(what))
    }

    /// Runs a command on queue `queue` (0 the admin queue, `i` I/O queue `i`) and returns
    /// its completion whatever its status: for probing a controller with commands a host
    /// would not send. Data to the controller is taken from the slot's buffer, which holds
    /// `data` first.
    pub fn raw_command(
        &mut self,
        queue: usize,
        sqe: Sqe,
        transfer: Transfer,
        data: &[u8],
    ) -> Result<Cqe, Error> {
        let index = queue.checked_sub(1);
        let target = self.queue(index);
        let slot = target
            .take_slot()
            .ok_or(Error::Protocol("no free slot".into()))?;
        target.write_data(slot, 0, data)?;
        target.submit(slot, sqe, transfer)?;
        self.wait_cqe(index, slot, "a raw command")
    }

    /// Sends `bytes` (at most 64) as a capsule on queue `queue`, for probing how a
    /// controller takes a malformed one.
    pub fn raw_capsule(&mut self, queue: usize, bytes: &[u8]) -> Result<(), Error> {
        self.queue(queue.checked_sub(1)).send_bytes(bytes)
    }

    /// Runs an admin command and waits for it.
    pub fn admin_command(
        &mut self,
        what: &'static str,
        sqe: Sqe,
        transfer: Transfer,
    ) -> Result<Cqe, Error> {
        let slot = self
            .admin
            .take_slot()
            .ok_or(Error::Protocol("no free admin slot".into()))?;
        self.admin.submit(slot, sqe, transfer)?;
        self.wait_for(None, slot, what)
    }

    /// Runs an admin command that returns `len` bytes; the bytes.
    pub fn admin_data(
        &mut self,
        what: &'static str,
        sqe: Sqe,
        len: usize,
    ) -> Result<Vec<u8>, Error> {
        if len > ADMIN_DATA {
            return Err(Error::Protocol(format!("{len} bytes of admin data")));
        }
        let slot = self
            .admin
            .take_slot()
            .ok_or(Error::Protocol("no free admin slot".into()))?;
        self.admin
            .submit(slot, sqe, Transfer::FromController(len as u32))?;
        // Read the data before the slot can be reused: wait for the response first.
        let deadline = Instant::now() + self.config.timeout;
        let mut completions = Vec::new();
        loop {
            if Instant::now() > deadline {
                return Err(Error::Timeout(what));
            }
            completions.clear();
            if self.poll(&mut completions)? == 0 {
                self.wait(Duration::from_millis(10))?;
            }
            let mine = completions
                .iter()
                .find(|c| c.queue == 0 && c.slot == slot)
                .map(|c| c.cqe);
            let mut data = vec![0u8; len];
            if mine.is_some() {
                self.admin.read_data(slot, &mut data)?;
            }
            for completed in completions.drain(..) {
                self.release(completed.queue, completed.slot);
            }
            if let Some(cqe) = mine {
                if !cqe.status.is_success() {
                    return Err(Error::Command {
                        command: what,
                        status: cqe.status,
                    });
                }
                return Ok(data);
            }
        }
    }

    /// Property Get.
    pub fn property_get(&mut self, offset: u32, wide: bool) -> Result<u64, Error> {
        let sqe = Fabrics::PropertyGet { offset, wide }.emit(0);
        Ok(self
            .admin_command("Property Get", sqe, Transfer::None)?
            .result)
    }

    /// Property Set (4 bytes wide).
    pub fn property_set(&mut self, offset: u32, value: u64) -> Result<(), Error> {
        let sqe = Fabrics::PropertySet {
            offset,
            wide: false,
            value,
        }
        .emit(0);
        self.admin_command("Property Set", sqe, Transfer::None)?;
        Ok(())
    }

    /// Identify Namespace `nsid`.
    pub fn identify_namespace(&mut self, nsid: u32) -> Result<IdentifyNamespace, Error> {
        let data = self.admin_data(
            "Identify Namespace",
            identify_command(identify::CNS_NAMESPACE, nsid),
            identify::IDENTIFY_LEN,
        )?;
        IdentifyNamespace::parse(&data).ok_or(Error::Protocol("short Identify data".into()))
    }

    /// The active namespaces' IDs.
    pub fn namespaces(&mut self) -> Result<Vec<u32>, Error> {
        let data = self.admin_data(
            "Identify (active namespaces)",
            identify_command(identify::CNS_ACTIVE_NAMESPACES, 0),
            identify::IDENTIFY_LEN,
        )?;
        Ok(identify::parse_namespace_list(&data))
    }

    /// Get Log Page: `len` bytes of log `lid` from `offset`, for namespace `nsid`.
    pub fn log_page(
        &mut self,
        lid: u8,
        nsid: u32,
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>, Error> {
        let mut sqe = Sqe::new(admin::GET_LOG_PAGE, 0);
        sqe.set_nsid(nsid);
        GetLogPage {
            lid,
            lsp: 0,
            rae: false,
            len: len as u64,
            offset,
        }
        .emit(&mut sqe);
        self.admin_data("Get Log Page", sqe, len)
    }

    /// Takes completions from every queue (0 the admin queue, `i` I/O queue `i`); Keep
    /// Alive is sent when due and its completion handled here.
    pub fn poll(&mut self, out: &mut Vec<Completed>) -> Result<usize, Error> {
        let mut completions = std::mem::take(&mut self.pending);
        self.cq.poll_into(BATCH, &mut completions)?;
        let before = out.len();
        for completion in &completions {
            let Some(index) = self.queue_of(completion.qp_num) else {
                continue;
            };
            if completion.status != WcStatus::Success {
                return Err(Error::Connection(format!(
                    "queue {}: a work request failed: {:?}",
                    index, completion.status
                )));
            }
            let (kind, slot) = wr_parts(completion);
            let queue = if index == 0 {
                &mut self.admin
            } else {
                &mut self.queues[index - 1]
            };
            match kind {
                KIND_RECV => {
                    if let Some(completed) = queue.on_recv(slot, index)? {
                        if index == 0 && self.keep_alive.is_some_and(|(ka, _)| ka == completed.slot)
                        {
                            self.keep_alive = None;
                            self.admin.release(completed.slot);
                            if !completed.cqe.status.is_success() {
                                return Err(Error::Command {
                                    command: "Keep Alive",
                                    status: completed.cqe.status,
                                });
                            }
                        } else {
                            out.push(completed);
                        }
                    }
                }
                KIND_SEND => queue.on_send(slot),
                _ => {}
            }
        }
        // Connection events and the keep alive timer need no more than a look per
        // millisecond; a poll of a busy queue should not pay for them each time.
        let now = Instant::now();
        if now >= self.next_service {
            self.next_service = now + SERVICE_INTERVAL;
            self.service()?;
        }
        Ok(out.len() - before)
    }

    /// The caller is done with a completed command's slot.
    pub fn release(&mut self, queue: usize, slot: u16) {
        if queue == 0 {
            self.admin.release(slot);
        } else if let Some(q) = self.queues.get_mut(queue - 1) {
            q.release(slot);
        }
    }

    fn queue_of(&self, qpn: u32) -> Option<usize> {
        if self.admin.qp.qp_num() == qpn {
            return Some(0);
        }
        self.queues
            .iter()
            .position(|q| q.qp.qp_num() == qpn)
            .map(|i| i + 1)
    }

    /// Keep Alive when due; connection events.
    fn service(&mut self) -> Result<(), Error> {
        let now = Instant::now();
        if let Some(event) = self.channel.try_get_cm_event()? {
            if matches!(
                event.kind,
                CmEventKind::Disconnected | CmEventKind::TimewaitExit
            ) {
                self.lost = Some(format!("rdma_cm event {}", event.kind.code()));
            }
        }
        if let Some(lost) = &self.lost {
            return Err(Error::Connection(format!(
                "the controller disconnected ({lost})"
            )));
        }
        let kato = self.config.kato;
        if kato.is_zero() || self.next_keep_alive.is_none_or(|due| now < due) {
            return Ok(());
        }
        if let Some((_, sent)) = self.keep_alive {
            if now.duration_since(sent) > kato {
                return Err(Error::Timeout("Keep Alive"));
            }
            return Ok(());
        }
        if let Some(slot) = self.admin.take_slot() {
            self.admin
                .submit(slot, Sqe::new(admin::KEEP_ALIVE, 0), Transfer::None)?;
            self.keep_alive = Some((slot, now));
        }
        self.next_keep_alive = Some(now + kato / 2);
        Ok(())
    }

    /// Sleeps until a completion arrives or `timeout` passes (after polling for
    /// `HostConfig::spin`).
    pub fn wait(&mut self, timeout: Duration) -> Result<(), Error> {
        let cq = &self.cq;
        let mut early = Vec::new();
        crate::wait::sleep(cq, &self.comp, &self.channel, timeout, || {
            cq.poll_into(BATCH, &mut early)
                .map(|n| n > 0)
                .map_err(|error| io::Error::other(error.to_string()))
        })?;
        // Completions taken while arming are handled as if polled now.
        for completion in early {
            self.requeue(completion);
        }
        Ok(())
    }

    /// A completion taken by [`wait`](Self::wait) goes back through [`poll`](Self::poll)
    /// by way of the pending list.
    fn requeue(&mut self, completion: WorkCompletion) {
        self.pending.push(completion);
    }

    /// Writes `data` into slot `slot`'s buffer of I/O queue `queue` (1-based).
    pub fn write_buffer(&self, queue: usize, slot: u16, data: &[u8]) -> Result<(), Error> {
        self.queues[queue - 1].write_data(slot, 0, data)
    }

    /// Reads slot `slot`'s buffer of I/O queue `queue` (1-based) into `out`.
    pub fn read_buffer(&self, queue: usize, slot: u16, out: &mut [u8]) -> Result<(), Error> {
        self.queues[queue - 1].read_data(slot, out)
    }

    /// A free slot of I/O queue `queue` (1-based).
    pub fn take_slot(&mut self, queue: usize) -> Option<u16> {
        self.queues.get_mut(queue - 1)?.take_slot()
    }

    /// Whether I/O queue `queue` (1-based) has a slot free: a command's slot is free once
    /// its response was handled and its SEND completed, which may come after the response
    /// (a responder coalescing ACKs answers the SEND later).
    pub fn has_free_slot(&self, queue: usize) -> bool {
        self.queues
            .get(queue - 1)
            .is_some_and(HostQueue::has_free_slot)
    }

    /// Submits an I/O command on queue `queue` (1-based) from `slot`.
    pub fn submit(
        &mut self,
        queue: usize,
        slot: u16,
        sqe: Sqe,
        transfer: Transfer,
    ) -> Result<(), Error> {
        self.queues[queue - 1].submit(slot, sqe, transfer)
    }

    /// Shuts the controller down (CC.SHN normal, until CSTS.SHST says complete) and
    /// disconnects every queue, the admin queue last.
    pub fn shutdown(mut self) -> Result<(), Error> {
        let config = cc::EN | 6 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT | 1 << cc::SHN_SHIFT;
        let result = self
            .property_set(property::CC, u64::from(config))
            .and_then(|()| {
                let deadline = Instant::now() + self.config.timeout;
                loop {
                    let status = self.property_get(property::CSTS, false)? as u32;
                    if status & csts::SHST_COMPLETE == csts::SHST_COMPLETE {
                        return Ok(());
                    }
                    if Instant::now() > deadline {
                        return Err(Error::Timeout("shutdown"));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
        for queue in self.queues.iter().chain([&self.admin]) {
            let _ = queue.cm.disconnect();
        }
        result
    }
}

/// An Identify command.
fn identify_command(cns: u8, nsid: u32) -> Sqe {
    let mut sqe = Sqe::new(admin::IDENTIFY, 0);
    sqe.set_nsid(nsid);
    sqe.set_dword(10, u32::from(cns));
    sqe
}

/// A Read or Write of `blocks` blocks at `lba`.
pub fn rw_command(write: bool, nsid: u32, lba: u64, blocks: u32) -> Sqe {
    let mut sqe = Sqe::new(if write { nvm::WRITE } else { nvm::READ }, 0);
    sqe.set_nsid(nsid);
    sqe.set_qword(10, lba);
    sqe.set_dword(12, blocks.saturating_sub(1) & 0xFFFF);
    sqe
}

/// Opens a queue's connection: resolves, creates the QP and its buffers, connects with
/// the binding's private data, waits until it is established.
#[allow(clippy::too_many_arguments)]
fn open_queue(
    ctx: &Context,
    pd: &Pd,
    cq: &Cq,
    channel: &EventChannel,
    addr: SocketAddr,
    request: CmRequest,
    depth: u16,
    data_len: usize,
    timeout: Duration,
) -> Result<HostQueue, Error> {
    let id = ctx.create_id(channel)?;
    let handle = id.handle();
    let expect =
        |want: fn(&CmEventKind) -> bool, what: &'static str| -> Result<CmEventKind, Error> {
            let deadline = Instant::now() + timeout;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                let event = match channel.get_cm_event(Some(left)) {
                    Ok(event) => event,
                    Err(roce_verbs::Error::TimedOut) => return Err(Error::Timeout(what)),
                    Err(error) => return Err(error.into()),
                };
                if event.id != handle {
                    continue;
                }
                return match event.kind {
                    ref kind if want(kind) => Ok(event.kind),
                    CmEventKind::Rejected { private_data, .. } => {
                        Err(match parse_reject(&private_data) {
                            Some(status) => Error::Rejected(status),
                            None => Error::Connection("rejected (no NVMe status)".into()),
                        })
                    }
                    other => Err(Error::Connection(format!(
                        "{what}: rdma_cm event {}",
                        other.code()
                    ))),
                };
            }
        };
    id.resolve_addr(addr)?;
    expect(
        |k| matches!(k, CmEventKind::AddrResolved),
        "address resolution",
    )?;
    id.resolve_route()?;
    expect(
        |k| matches!(k, CmEventKind::RouteResolved),
        "route resolution",
    )?;
    // One SEND per command, and room for the engine to lag behind.
    let caps = QpCaps {
        max_send_wr: 2 * u32::from(depth) + 4,
        max_recv_wr: u32::from(depth),
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qp = id.create_qp(
        pd,
        &QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            caps,
            sq_sig_all: false,
        },
    )?;
    let param = ConnParam {
        private_data: request.emit().to_vec(),
        responder_resources: RESPONDER_RESOURCES,
        initiator_depth: 0,
        retry_count: 7,
        rnr_retry_count: 7,
    };
    let queue = HostQueue::new(id, qp, pd, request.qid, depth, data_len)?;
    queue.cm.connect(&queue.qp, &param)?;
    expect(|k| matches!(k, CmEventKind::Established), "connection")?;
    Ok(queue)
}

/// Asks the discovery controller at `addr` which subsystems this host may reach.
pub fn discover(
    ctx: &Context,
    addr: SocketAddr,
    config: &HostConfig,
) -> Result<Vec<DiscoveryEntry>, Error> {
    let config = HostConfig {
        io_queues: 0,
        ..config.clone()
    };
    let mut controller = Controller::connect(ctx, addr, DISCOVERY_NQN, &config)?;
    let record = log::DISCOVERY_RECORD_LEN;
    let header = controller.log_page(log::LID_DISCOVERY, 0, 0, record)?;
    let (_, records) = log::parse_discovery_header(&header)
        .ok_or(Error::Protocol("short discovery log".into()))?;
    let records = usize::try_from(records)
        .ok()
        .filter(|&n| n < ADMIN_DATA / record)
        .ok_or(Error::Protocol(format!("{records} discovery records")))?;
    let mut entries = Vec::with_capacity(records);
    if records > 0 {
        let page = controller.log_page(log::LID_DISCOVERY, 0, record as u64, records * record)?;
        entries.extend(page.chunks_exact(record).filter_map(DiscoveryEntry::parse));
    }
    controller.shutdown()?;
    Ok(entries)
}
