//! One queue (one RC QP, one rdma_cm connection): its receive buffers, where command
//! capsules land; its staging buffers, where data that is not a RAM namespace's goes; and
//! each command on its way through it:
//!
//! ```text
//! RECV ─▶ check ─▶ (host data: in the capsule, or RDMA READ) ─▶ execute
//!       ─▶ repost the RECV ─▶ (data for the host: RDMA WRITE) ─▶ SEND (with Invalidate) the response
//!       ─▶ its completion frees the command's context and staging buffer
//! ```
//!
//! A RAM namespace's data moves straight between the host and the namespace's region; a
//! command that needs a staging buffer while all are taken waits for one. The receive
//! buffer is reposted before the response leaves, as Linux's target does, so a host that
//! answers a completion with its next command never meets a missing receive.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Instant;

use roce_verbs::{
    AccessFlags, CmId, Mr, Pd, PostFailure, Qp, RecvWr, SendFlags, SendOp, SendWr, Sge,
};

use super::controller::{Done, Refusal, Reply, MAX_TRANSFER};
use super::io::{dsm_ranges, plan, Plan};
use super::subsystem::BLOCK_SHIFT;
use super::State;
use crate::wire::cm::CmRequest;
use crate::wire::cqe::SQ_HEAD_DISABLED;
use crate::wire::fabrics::{
    Connect, ConnectData, Fabrics, CATTR_DISABLE_SQ_FLOW, CONNECT_DATA_LEN,
};
use crate::wire::{Cqe, DataPointer, Sqe, Status, SQE_LEN};

/// Work request kinds, in the top half of a work request ID (the bottom half is the
/// receive slot or command context).
pub(crate) const KIND_RECV: u64 = 1;
pub(crate) const KIND_READ: u64 = 2;
pub(crate) const KIND_SEND: u64 = 3;
const KIND_WRITE: u64 = 4;

fn wr_id(kind: u64, index: usize) -> u64 {
    kind << 32 | index as u64
}

/// Bytes of a staging buffer: the largest transfer.
const STAGING_LEN: usize = MAX_TRANSFER as usize;

/// What a command still needs once its host data is here.
#[derive(Debug, Clone, Copy)]
enum Work {
    Connect(Connect),
    Io(Plan),
}

/// Data for the host, if the command succeeds.
#[derive(Debug)]
enum Out {
    None,
    Bytes(Vec<u8>),
    /// Straight from a RAM namespace's region.
    Region {
        nsid: u32,
        offset: u64,
        len: u32,
    },
}

#[derive(Debug)]
enum Stage {
    Free,
    /// Its host data is coming by RDMA READ (into its staging buffer unless `direct`).
    Fetching {
        work: Work,
        direct: bool,
    },
    /// Waiting for a staging buffer to fetch its data into.
    WaitingToFetch(Work),
    /// Waiting for a staging buffer to send its data from.
    WaitingToRespond(Status, u64, Out),
    /// An Asynchronous Event Request, held.
    Held,
    /// Its response is on its way; the completion of the SEND frees the context.
    Responding,
}

struct Context {
    slot: usize,
    byte_len: u32,
    sqe: Sqe,
    pointer: Option<DataPointer>,
    staging: Option<usize>,
    stage: Stage,
}

/// A queue's sizes, fixed when the connection is accepted.
pub(crate) struct Shape {
    /// Commands the host may have outstanding (its hsqsize + 1): receive buffers.
    pub(crate) depth: usize,
    /// In-capsule data a command may carry.
    pub(crate) in_capsule: u32,
    /// Staging buffers.
    pub(crate) staging: usize,
}

impl Shape {
    /// Work requests the send queue needs: at most two (a READ, or a WRITE and the
    /// response's SEND) for each context, and there are twice as many contexts as
    /// receive buffers (a context is freed only when its SEND completes, after its buffer
    /// took the next command).
    pub(crate) fn send_queue(&self) -> usize {
        4 * self.depth + 8
    }

    /// CQ entries the queue may need at once.
    pub(crate) fn cq_entries(&self) -> usize {
        self.depth + self.send_queue()
    }
}

/// One connection.
pub(crate) struct Queue {
    pub(crate) cm: CmId,
    pub(crate) qp: Qp,
    pub(crate) request: CmRequest,
    pub(crate) peer: Option<SocketAddr>,
    pub(crate) local: Option<SocketAddr>,
    pub(crate) created: Instant,
    /// Set by its Connect.
    pub(crate) qid: Option<u16>,
    pub(crate) cntlid: Option<u16>,
    pub(crate) shape: Shape,
    /// A Disconnect command asked to close it once the response has left.
    pub(crate) close_after_response: bool,
    recv: Mr,
    recv_len: usize,
    staging: Option<Mr>,
    staging_free: Vec<usize>,
    waiting: VecDeque<usize>,
    contexts: Vec<Context>,
    free: Vec<usize>,
    sq_entries: u16,
    sq_head: u16,
    sq_flow: bool,
}

/// Why a queue must close.
pub(crate) type Fatal = String;

impl Queue {
    /// The queue's buffers; the QP is created by the caller on `cm`, in INIT.
    pub(crate) fn new(
        cm: CmId,
        qp: Qp,
        pd: &Pd,
        request: CmRequest,
        shape: Shape,
        now: Instant,
    ) -> Result<Queue, Box<(CmId, Fatal)>> {
        let recv_len = SQE_LEN + shape.in_capsule as usize;
        let recv = match pd.reg_mr(recv_len * shape.depth, AccessFlags::LOCAL_WRITE) {
            Ok(recv) => recv,
            Err(error) => return Err(Box::new((cm, format!("receive buffers: {error}")))),
        };
        let staging = (shape.staging > 0)
            .then(|| pd.reg_mr(STAGING_LEN * shape.staging, AccessFlags::LOCAL_WRITE))
            .transpose();
        let staging = match staging {
            Ok(staging) => staging,
            Err(error) => return Err(Box::new((cm, format!("staging buffers: {error}")))),
        };
        let contexts = (0..2 * shape.depth)
            .map(|_| Context {
                slot: 0,
                byte_len: 0,
                sqe: Sqe::new(0, 0),
                pointer: None,
                staging: None,
                stage: Stage::Free,
            })
            .collect();
        let queue = Queue {
            peer: cm.peer_addr(),
            local: cm.local_addr(),
            cm,
            qp,
            request,
            created: now,
            qid: None,
            cntlid: None,
            close_after_response: false,
            recv,
            recv_len,
            staging_free: (0..shape.staging).rev().collect(),
            staging,
            waiting: VecDeque::new(),
            free: (0..2 * shape.depth).rev().collect(),
            contexts,
            shape,
            sq_entries: 0,
            sq_head: 0,
            sq_flow: true,
        };
        for slot in 0..queue.shape.depth {
            if let Err(why) = queue.post_recv(slot) {
                return Err(Box::new((queue.cm, why)));
            }
        }
        Ok(queue)
    }

    fn post_recv(&self, slot: usize) -> Result<(), Fatal> {
        self.qp
            .post_recv([RecvWr {
                wr_id: wr_id(KIND_RECV, slot),
                sg_list: [self.recv.sge(slot * self.recv_len, self.recv_len as u32)].into(),
            }])
            .map_err(|failure| format!("posting a receive: {}", failure.error))
    }

    fn post_send(&self, wrs: Vec<SendWr>) -> Result<(), Fatal> {
        self.qp
            .post_send(wrs)
            .map_err(|PostFailure { error, .. }| format!("posting a send: {error}"))
    }

    /// A command capsule arrived in receive buffer `slot`.
    pub(crate) fn on_recv(
        &mut self,
        slot: usize,
        byte_len: u32,
        state: &mut State,
        now: Instant,
    ) -> Result<(), Fatal> {
        if slot >= self.shape.depth {
            return Err(format!("a receive completion for slot {slot}"));
        }
        if (byte_len as usize) < SQE_LEN {
            return Err(format!("a command capsule of {byte_len} bytes"));
        }
        let mut head = [0u8; SQE_LEN];
        self.recv
            .read(slot * self.recv_len, &mut head)
            .map_err(|error| format!("reading a capsule: {error}"))?;
        let index = self
            .free
            .pop()
            .ok_or("more commands than the queue holds")?;
        self.contexts[index] = Context {
            slot,
            byte_len,
            sqe: Sqe(head),
            pointer: None,
            staging: None,
            stage: Stage::Free,
        };
        if let Some(controller) = self
            .cntlid
            .and_then(|id| state.registry.controllers.get_mut(&id))
        {
            controller.last_seen = now;
        }
        self.begin(index, state, now)
    }

    /// Checks the command and starts it.
    fn begin(&mut self, index: usize, state: &mut State, now: Instant) -> Result<(), Fatal> {
        let sqe = self.contexts[index].sqe;
        let fail = |this: &mut Queue, state: &mut State, status: Status| {
            this.finish(index, state, status, 0, Out::None)
        };
        if let Err(status) = sqe.check_flags() {
            return fail(self, state, status);
        }
        let pointer = match sqe.data() {
            Ok(pointer) => pointer,
            Err(status) => return fail(self, state, status),
        };
        if let DataPointer::InCapsule { offset, len } = pointer {
            let end = offset.saturating_add(u64::from(len));
            if !sqe.is_host_to_controller() {
                return fail(self, state, Status::INVALID_FIELD.dnr());
            }
            if end > u64::from(self.shape.in_capsule) {
                return fail(self, state, Status::SGL_INVALID_OFFSET.dnr());
            }
            if SQE_LEN as u64 + end > u64::from(self.contexts[index].byte_len) {
                return fail(self, state, Status::SGL_INVALID_DATA.dnr());
            }
        }
        self.contexts[index].pointer = Some(pointer);
        let transfer = pointer.len();
        let Some(qid) = self.qid else {
            // Before its Connect, a queue takes nothing else.
            return match (sqe.is_fabrics(), Fabrics::parse(&sqe)) {
                (true, Fabrics::Connect(connect)) if transfer == CONNECT_DATA_LEN as u32 => {
                    self.fetch(index, Work::Connect(connect), state)
                }
                (true, Fabrics::Connect(_)) => fail(self, state, Status::SGL_INVALID_DATA.dnr()),
                _ => fail(self, state, Status::INVALID_OPCODE.dnr()),
            };
        };
        let cntlid = self.cntlid.unwrap_or_default();
        if sqe.is_fabrics() {
            let controller = state.registry.controllers.get_mut(&cntlid);
            let done = match (Fabrics::parse(&sqe), controller) {
                (Fabrics::Connect(_), _) => Err(Status::COMMAND_SEQUENCE.dnr()),
                _ if transfer != 0 => Err(Status::SGL_INVALID_DATA.dnr()),
                (_, None) => Err(Status::INTERNAL),
                (Fabrics::PropertyGet { offset, wide }, Some(controller)) if qid == 0 => {
                    controller.property_get(offset, wide, &state.limits)
                }
                (
                    Fabrics::PropertySet {
                        offset,
                        wide,
                        value,
                    },
                    Some(controller),
                ) if qid == 0 => match controller.property_set(offset, wide, value) {
                    status if status.is_success() => Ok(0),
                    status => Err(status),
                },
                (Fabrics::Disconnect { .. }, _) if qid == 0 => {
                    Err(Status::INVALID_QUEUE_TYPE.dnr())
                }
                (Fabrics::Disconnect { recfmt: 0 }, _) => {
                    self.close_after_response = true;
                    Ok(0)
                }
                (Fabrics::Disconnect { .. }, _) => Err(Status::CONNECT_FORMAT.dnr()),
                _ => Err(Status::INVALID_OPCODE.dnr()),
            };
            return match done {
                Ok(result) => self.finish(index, state, Status::SUCCESS, result, Out::None),
                Err(status) => fail(self, state, status),
            };
        }
        let port = state.port(self.local);
        let Some(controller) = state.registry.controllers.get_mut(&cntlid) else {
            return fail(self, state, Status::INTERNAL);
        };
        if qid == 0 {
            let reply = controller.admin(&sqe, transfer, &state.subsystems, &state.limits, &port);
            return match reply {
                Reply::Hold => {
                    self.contexts[index].stage = Stage::Held;
                    Ok(())
                }
                Reply::Done(Done {
                    status,
                    result,
                    data,
                }) => {
                    let out = data.map_or(Out::None, Out::Bytes);
                    self.finish(index, state, status, result, out)
                }
            };
        }
        if !controller.ready() {
            return fail(self, state, Status::COMMAND_SEQUENCE.dnr());
        }
        let Some(subsystem) = controller.subsystem else {
            return fail(self, state, Status::INVALID_OPCODE.dnr());
        };
        let planned = match plan(&sqe, &state.subsystems[subsystem], transfer) {
            Ok(planned) => planned,
            Err(status) => return fail(self, state, status),
        };
        if planned.data_in() > 0 {
            return self.fetch(index, Work::Io(planned), state);
        }
        let (status, out) = execute_io(planned, None, subsystem, state, now);
        self.finish(index, state, status, 0, out)
    }

    /// Gets a command's host data: from its capsule, or by RDMA READ into its namespace's
    /// region (a RAM namespace's Write) or a staging buffer.
    fn fetch(&mut self, index: usize, work: Work, state: &mut State) -> Result<(), Fatal> {
        let context = &self.contexts[index];
        match context.pointer {
            Some(DataPointer::InCapsule { offset, len }) => {
                let mut data = vec![0u8; len as usize];
                let at = context.slot * self.recv_len + SQE_LEN + offset as usize;
                self.recv
                    .read(at, &mut data)
                    .map_err(|error| format!("reading in-capsule data: {error}"))?;
                self.execute(index, work, Some(data), state)
            }
            Some(DataPointer::Keyed { addr, len, key, .. }) => {
                let region = match work {
                    Work::Io(Plan::Write { nsid, offset, .. }) => self
                        .cntlid
                        .and_then(|id| state.region_sge(id, nsid, offset, len)),
                    _ => None,
                };
                let direct = region.is_some();
                let sge = match region {
                    Some(sge) => sge,
                    None => match self.staging_sge(index, len) {
                        Some(sge) => sge,
                        None => {
                            self.contexts[index].stage = Stage::WaitingToFetch(work);
                            self.waiting.push_back(index);
                            return Ok(());
                        }
                    },
                };
                self.contexts[index].stage = Stage::Fetching { work, direct };
                self.post_send(vec![SendWr {
                    wr_id: wr_id(KIND_READ, index),
                    op: SendOp::RdmaRead {
                        remote_addr: addr,
                        rkey: key,
                    },
                    sg_list: [sge].into(),
                    flags: SendFlags::SIGNALED,
                    ..SendWr::default()
                }])
            }
            None => Err("fetching data without a data pointer".into()),
        }
    }

    /// A staging buffer for context `index` (its own if it has one), as `len` bytes.
    fn staging_sge(&mut self, index: usize, len: u32) -> Option<Sge> {
        let staging = self.staging.as_ref()?;
        let buffer = match self.contexts[index].staging {
            Some(buffer) => buffer,
            None => {
                let buffer = self.staging_free.pop()?;
                self.contexts[index].staging = Some(buffer);
                buffer
            }
        };
        Some(staging.sge(buffer * STAGING_LEN, len.min(STAGING_LEN as u32)))
    }

    /// A command's RDMA READ completed.
    pub(crate) fn on_read(
        &mut self,
        index: usize,
        state: &mut State,
        now: Instant,
    ) -> Result<(), Fatal> {
        let Some(context) = self.contexts.get_mut(index) else {
            return Err(format!("a READ completion for context {index}"));
        };
        let Stage::Fetching { work, direct } = std::mem::replace(&mut context.stage, Stage::Free)
        else {
            return Err("a READ completion for a command not reading".into());
        };
        let data = if direct {
            None
        } else {
            let len = context.pointer.map_or(0, |p| p.len()) as usize;
            let buffer = context.staging.ok_or("READ into no staging buffer")?;
            let mut data = vec![0u8; len];
            self.staging
                .as_ref()
                .ok_or("no staging buffers")?
                .read(buffer * STAGING_LEN, &mut data)
                .map_err(|error| format!("reading staged data: {error}"))?;
            Some(data)
        };
        let _ = now;
        self.execute(index, work, data, state)
    }

    /// Runs a command whose host data is here (in `data`, or already in its region).
    fn execute(
        &mut self,
        index: usize,
        work: Work,
        data: Option<Vec<u8>>,
        state: &mut State,
    ) -> Result<(), Fatal> {
        let now = Instant::now();
        match work {
            Work::Connect(connect) => {
                let result = match data.as_deref().map(ConnectData::parse) {
                    Some(Ok(connect_data)) => self.connect(&connect, &connect_data, state, now),
                    Some(Err((status, location))) => Err(Refusal { status, location }),
                    None => Err(Refusal {
                        status: Status::INTERNAL,
                        location: 0,
                    }),
                };
                match result {
                    Ok(cntlid) => {
                        self.finish(index, state, Status::SUCCESS, cntlid.into(), Out::None)
                    }
                    Err(refusal) => self.finish(
                        index,
                        state,
                        refusal.status,
                        refusal.location.into(),
                        Out::None,
                    ),
                }
            }
            Work::Io(planned) => {
                let subsystem = self
                    .cntlid
                    .and_then(|id| state.registry.controllers.get(&id))
                    .and_then(|c| c.subsystem);
                let Some(subsystem) = subsystem else {
                    return self.finish(index, state, Status::INTERNAL, 0, Out::None);
                };
                let (status, out) = execute_io(planned, data, subsystem, state, now);
                self.finish(index, state, status, 0, out)
            }
        }
    }

    /// A Connect with its data: creates a controller (admin queue) or joins one (I/O queue).
    fn connect(
        &mut self,
        connect: &Connect,
        data: &ConnectData,
        state: &mut State,
        now: Instant,
    ) -> Result<u16, Refusal> {
        use crate::wire::fabrics::invalid;
        let invalid = |location| Refusal {
            status: Status::CONNECT_INVALID_PARAMETERS.dnr(),
            location,
        };
        // The queue the connection was made for, no deeper than its receive buffers.
        if connect.qid != self.request.qid {
            return Err(invalid(invalid::SQE_QID));
        }
        if usize::from(connect.sqsize) >= self.shape.depth {
            return Err(invalid(invalid::SQE_SQSIZE));
        }
        let cntlid = if connect.qid == 0 {
            state
                .registry
                .admin_connect(connect, data, &state.subsystems, now)?
        } else {
            state
                .registry
                .io_connect(connect, data, &state.subsystems, &state.limits, now)?
        };
        self.qid = Some(connect.qid);
        self.cntlid = Some(cntlid);
        self.sq_entries = connect.sqsize + 1;
        self.sq_flow = connect.cattr & CATTR_DISABLE_SQ_FLOW == 0;
        state.connected(self, data);
        Ok(cntlid)
    }

    /// Answers a command: reposts its receive buffer, then sends its data (if it
    /// succeeded and has any) and its response.
    fn finish(
        &mut self,
        index: usize,
        state: &mut State,
        status: Status,
        result: u64,
        out: Out,
    ) -> Result<(), Fatal> {
        let context = &self.contexts[index];
        let sqe = context.sqe;
        let pointer = context.pointer;
        let mut status = status;
        if !status.is_success() {
            if let Some(controller) = self
                .cntlid
                .and_then(|id| state.registry.controllers.get_mut(&id))
            {
                status = controller.log_error(self.qid.unwrap_or(0), &sqe, status);
            }
        }
        let keyed = match pointer {
            Some(DataPointer::Keyed {
                addr,
                len,
                key,
                invalidate,
            }) => Some((addr, len, key, invalidate && len > 0)),
            _ => None,
        };
        let mut wrs = Vec::with_capacity(2);
        if status.is_success() {
            let source = match out {
                Out::None => None,
                Out::Bytes(bytes) => match self.staging_sge(index, bytes.len() as u32) {
                    Some(sge) => {
                        let buffer = self.contexts[index].staging.unwrap_or_default();
                        self.staging
                            .as_ref()
                            .ok_or("no staging buffers")?
                            .write(buffer * STAGING_LEN, &bytes)
                            .map_err(|error| format!("staging data: {error}"))?;
                        Some(sge)
                    }
                    None => {
                        self.contexts[index].stage =
                            Stage::WaitingToRespond(status, result, Out::Bytes(bytes));
                        self.waiting.push_back(index);
                        return Ok(());
                    }
                },
                Out::Region { nsid, offset, len } => self
                    .cntlid
                    .and_then(|id| state.region_sge(id, nsid, offset, len)),
            };
            match (source, keyed) {
                (Some(sge), Some((addr, len, key, _))) if sge.length == len => wrs.push(SendWr {
                    wr_id: wr_id(KIND_WRITE, index),
                    op: SendOp::RdmaWrite {
                        remote_addr: addr,
                        rkey: key,
                    },
                    sg_list: [sge].into(),
                    ..SendWr::default()
                }),
                (None, _) => {}
                _ => {
                    // Data the SGL does not cover: a rule above was not kept.
                    status = Status::INTERNAL;
                }
            }
        }
        if self.sq_flow && self.sq_entries > 0 {
            self.sq_head = (self.sq_head + 1) % self.sq_entries;
        }
        let cqe = Cqe {
            result,
            sq_head: if self.sq_flow {
                self.sq_head
            } else {
                SQ_HEAD_DISABLED
            },
            sq_id: self.qid.unwrap_or(0),
            cid: sqe.cid(),
            status,
        };
        let op = match keyed {
            Some((_, _, key, true)) => SendOp::SendWithInv(key),
            _ => SendOp::Send,
        };
        wrs.push(SendWr {
            wr_id: wr_id(KIND_SEND, index),
            op,
            inline_data: cqe.emit().to_vec(),
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
            ..SendWr::default()
        });
        self.contexts[index].stage = Stage::Responding;
        self.post_recv(self.contexts[index].slot)?;
        self.post_send(wrs)
    }

    /// A response's SEND completed: frees its context and staging buffer, which a waiting
    /// command may take.
    pub(crate) fn on_send(&mut self, index: usize, state: &mut State) -> Result<(), Fatal> {
        let Some(context) = self.contexts.get_mut(index) else {
            return Err(format!("a SEND completion for context {index}"));
        };
        if !matches!(context.stage, Stage::Responding) {
            return Err("a SEND completion for a command not responding".into());
        }
        context.stage = Stage::Free;
        if let Some(buffer) = context.staging.take() {
            self.staging_free.push(buffer);
        }
        self.free.push(index);
        while !self.staging_free.is_empty() {
            let Some(waiting) = self.waiting.pop_front() else {
                break;
            };
            match std::mem::replace(&mut self.contexts[waiting].stage, Stage::Free) {
                Stage::WaitingToFetch(work) => self.fetch(waiting, work, state)?,
                Stage::WaitingToRespond(status, result, out) => {
                    self.finish(waiting, state, status, result, out)?
                }
                other => self.contexts[waiting].stage = other,
            }
        }
        Ok(())
    }

    /// Commands in progress (held asynchronous event requests included).
    pub(crate) fn busy(&self) -> usize {
        2 * self.shape.depth - self.free.len()
    }
}

/// Runs an I/O command; `data` is its host data unless it went straight to the region.
fn execute_io(
    planned: Plan,
    data: Option<Vec<u8>>,
    subsystem: usize,
    state: &mut State,
    _now: Instant,
) -> (Status, Out) {
    let Some(ns) = state.subsystems[subsystem].namespace_mut(match planned {
        Plan::Read { nsid, .. }
        | Plan::Write { nsid, .. }
        | Plan::Flush { nsid }
        | Plan::WriteZeroes { nsid, .. }
        | Plan::DatasetManagement { nsid, .. } => nsid,
    }) else {
        return (Status::INVALID_NS.dnr(), Out::None);
    };
    let io_error = |error: std::io::Error| {
        tracing::warn!(%error, "namespace I/O failed");
        Status::DATA_TRANSFER_ERROR
    };
    match planned {
        Plan::Read { nsid, offset, len } => {
            ns.counters.reads += 1;
            ns.counters.blocks_read += u64::from(len >> BLOCK_SHIFT);
            if ns.storage.region().is_some() {
                return (Status::SUCCESS, Out::Region { nsid, offset, len });
            }
            match ns.storage.read(offset, len as usize) {
                Ok(bytes) => (Status::SUCCESS, Out::Bytes(bytes)),
                Err(error) => (io_error(error), Out::None),
            }
        }
        Plan::Write {
            offset,
            len,
            durable,
            ..
        } => {
            ns.counters.writes += 1;
            ns.counters.blocks_written += u64::from(len >> BLOCK_SHIFT);
            let written = match data {
                Some(bytes) => ns.storage.write(offset, &bytes, durable),
                None if durable => ns.storage.flush(),
                None => Ok(()),
            };
            match written {
                Ok(()) => (Status::SUCCESS, Out::None),
                Err(error) => (io_error(error), Out::None),
            }
        }
        Plan::Flush { .. } => match ns.storage.flush() {
            Ok(()) => (Status::SUCCESS, Out::None),
            Err(error) => (io_error(error), Out::None),
        },
        Plan::WriteZeroes { offset, len, .. } => match ns.storage.zero(offset, len) {
            Ok(()) => (Status::SUCCESS, Out::None),
            Err(error) => (io_error(error), Out::None),
        },
        Plan::DatasetManagement { deallocate, .. } => {
            let ranges = match dsm_ranges(data.as_deref().unwrap_or_default(), ns.blocks) {
                Ok(ranges) => ranges,
                Err(status) => return (status, Out::None),
            };
            if deallocate {
                for (offset, len) in ranges {
                    if let Err(error) = ns.storage.deallocate(offset, len) {
                        return (io_error(error), Out::None);
                    }
                }
            }
            (Status::SUCCESS, Out::None)
        }
    }
}
