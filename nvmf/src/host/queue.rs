//! One host queue: its QP, the receive buffers responses land in, and a buffer per
//! command slot. A command's identifier is its slot; the slot is free again once its
//! response has been handled ([`HostQueue::release`]: its data read) and its SEND
//! completed (the SEND may still read the slot's buffer).
//! A slot's buffer holds 64 bytes of room for the command and then its data, so a
//! command with in-capsule data leaves as one SEND of one scatter/gather element.

use std::time::Instant;

use roce_verbs::{AccessFlags, CmId, Mr, Pd, PostFailure, Qp, RecvWr, SendFlags, SendOp, SendWr};

use super::Error;
use crate::wire::{Cqe, DataPointer, Sqe, CQE_LEN, SQE_LEN};

/// Work request kinds (top half of the ID; the bottom half is the slot).
pub(crate) const KIND_RECV: u64 = 1;
pub(crate) const KIND_SEND: u64 = 2;

/// How a command's data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfer {
    /// None.
    None,
    /// `len` bytes of the slot's buffer to the controller.
    ToController(u32),
    /// `len` bytes from the controller into the slot's buffer.
    FromController(u32),
    /// The command's data pointer as it is, and no data in the capsule (for testing how
    /// a controller takes descriptors a host would not send).
    AsIs,
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    busy: bool,
    handled: bool,
    sent: bool,
    submitted: Option<Instant>,
}

/// A completed command: its slot, its completion, when it was submitted.
#[derive(Debug, Clone, Copy)]
pub struct Completed {
    /// The queue's index (0 the admin queue).
    pub queue: usize,
    /// The command's slot (its command identifier).
    pub slot: u16,
    /// The completion.
    pub cqe: Cqe,
    /// When it was submitted.
    pub submitted: Instant,
}

pub(crate) struct HostQueue {
    pub(crate) cm: CmId,
    pub(crate) qp: Qp,
    pub(crate) qid: u16,
    responses: Mr,
    buffers: Mr,
    buffer_len: usize,
    slots: Vec<Slot>,
    free: Vec<u16>,
    /// Bytes of in-capsule data the controller takes on this queue.
    pub(crate) in_capsule: u32,
    /// Keyed SGLs ask the controller to invalidate the key (subtype 0xF).
    invalidate: bool,
}

impl HostQueue {
    /// Buffers for `depth` commands of up to `data_len` bytes each, and `depth`
    /// receive buffers (posted now; the QP is in INIT).
    pub(crate) fn new(
        cm: CmId,
        qp: Qp,
        pd: &Pd,
        qid: u16,
        depth: u16,
        data_len: usize,
    ) -> Result<HostQueue, Error> {
        let responses = pd.reg_mr(CQE_LEN * usize::from(depth), AccessFlags::LOCAL_WRITE)?;
        let buffer_len = SQE_LEN + data_len;
        let buffers = pd.reg_mr(
            buffer_len * usize::from(depth),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
        )?;
        let queue = HostQueue {
            cm,
            qp,
            qid,
            responses,
            buffers,
            buffer_len,
            slots: vec![Slot::default(); usize::from(depth)],
            free: (0..depth).rev().collect(),
            in_capsule: 0,
            invalidate: false,
        };
        for slot in 0..usize::from(depth) {
            queue.post_recv(slot)?;
        }
        Ok(queue)
    }

    pub(crate) fn set_invalidate(&mut self, invalidate: bool) {
        self.invalidate = invalidate;
    }

    fn post_recv(&self, slot: usize) -> Result<(), Error> {
        self.qp
            .post_recv([RecvWr {
                wr_id: KIND_RECV << 32 | slot as u64,
                sg_list: [self.responses.sge(slot * CQE_LEN, CQE_LEN as u32)].into(),
            }])
            .map_err(|PostFailure { error, .. }| error.into())
    }

    /// Commands the queue holds at once.
    pub(crate) fn depth(&self) -> usize {
        self.slots.len()
    }

    /// Whether a slot is free to take.
    pub(crate) fn has_free_slot(&self) -> bool {
        !self.free.is_empty()
    }

    /// A free slot, taken.
    pub(crate) fn take_slot(&mut self) -> Option<u16> {
        let slot = self.free.pop()?;
        self.slots[usize::from(slot)] = Slot {
            busy: true,
            ..Slot::default()
        };
        Some(slot)
    }

    fn data_at(&self, slot: u16) -> usize {
        usize::from(slot) * self.buffer_len + SQE_LEN
    }

    /// Writes `data` into slot `slot`'s buffer at `offset`.
    pub(crate) fn write_data(&self, slot: u16, offset: usize, data: &[u8]) -> Result<(), Error> {
        Ok(self.buffers.write(self.data_at(slot) + offset, data)?)
    }

    /// Reads slot `slot`'s buffer into `out`.
    pub(crate) fn read_data(&self, slot: u16, out: &mut [u8]) -> Result<(), Error> {
        Ok(self.buffers.read(self.data_at(slot), out)?)
    }

    /// Sends `sqe` from slot `slot` (its identifier becomes the slot), its data as
    /// `transfer` says: in the capsule when it fits, else by the slot's key.
    pub(crate) fn submit(
        &mut self,
        slot: u16,
        mut sqe: Sqe,
        transfer: Transfer,
    ) -> Result<(), Error> {
        sqe.set_cid(slot);
        let addr = self.buffers.addr() + self.data_at(slot) as u64;
        let keyed = |len: u32| DataPointer::Keyed {
            addr,
            len,
            key: self.buffers.rkey(),
            invalidate: self.invalidate && len > 0,
        };
        let wr_id = KIND_SEND << 32 | u64::from(slot);
        let wr = match transfer {
            Transfer::ToController(len) if len > 0 && len <= self.in_capsule => {
                sqe.set_data(&DataPointer::InCapsule { offset: 0, len });
                let at = usize::from(slot) * self.buffer_len;
                self.buffers.write(at, &sqe.0)?;
                SendWr {
                    wr_id,
                    op: SendOp::Send,
                    sg_list: [self.buffers.sge(at, SQE_LEN as u32 + len)].into(),
                    flags: SendFlags::SIGNALED,
                    ..SendWr::default()
                }
            }
            transfer => {
                match transfer {
                    Transfer::None => sqe.set_data(&DataPointer::NONE),
                    Transfer::ToController(len) | Transfer::FromController(len) => {
                        sqe.set_data(&keyed(len))
                    }
                    Transfer::AsIs => {}
                }
                SendWr {
                    wr_id,
                    op: SendOp::Send,
                    inline_data: sqe.0.to_vec(),
                    flags: SendFlags::SIGNALED | SendFlags::INLINE,
                    ..SendWr::default()
                }
            }
        };
        let entry = &mut self.slots[usize::from(slot)];
        entry.submitted = Some(Instant::now());
        self.qp
            .post_send([wr])
            .map_err(|PostFailure { error, .. }| Error::from(error))
    }

    /// Sends `bytes` as a capsule of their own (at most 64: inline), answered by no slot.
    pub(crate) fn send_bytes(&self, bytes: &[u8]) -> Result<(), Error> {
        self.qp
            .post_send([SendWr {
                wr_id: KIND_SEND << 32 | u64::from(u32::MAX),
                op: SendOp::Send,
                inline_data: bytes.to_vec(),
                flags: SendFlags::SIGNALED | SendFlags::INLINE,
                ..SendWr::default()
            }])
            .map_err(|PostFailure { error, .. }| Error::from(error))
    }

    /// A response arrived in receive buffer `buffer`: reposts it; the completed command
    /// if its slot is also done sending.
    pub(crate) fn on_recv(
        &mut self,
        buffer: usize,
        queue: usize,
    ) -> Result<Option<Completed>, Error> {
        let mut bytes = [0u8; CQE_LEN];
        self.responses.read(buffer * CQE_LEN, &mut bytes)?;
        self.post_recv(buffer)?;
        let cqe = Cqe::parse(&bytes).ok_or(Error::Protocol("a short response".into()))?;
        let Some(slot) = self
            .slots
            .get_mut(usize::from(cqe.cid))
            .filter(|slot| slot.busy && slot.submitted.is_some())
        else {
            return Err(Error::Protocol(format!(
                "a response for command {} not outstanding on queue {}",
                cqe.cid, self.qid
            )));
        };
        let submitted = slot.submitted.take().unwrap_or_else(Instant::now);
        Ok(Some(Completed {
            queue,
            slot: cqe.cid,
            cqe,
            submitted,
        }))
    }

    /// A command's SEND completed.
    pub(crate) fn on_send(&mut self, slot: usize) {
        if let Some(entry) = self.slots.get_mut(slot).filter(|s| s.busy) {
            entry.sent = true;
            self.release_if_done(slot as u16);
        }
    }

    /// The caller is done with a completed command's slot (its data read).
    pub(crate) fn release(&mut self, slot: u16) {
        if let Some(entry) = self.slots.get_mut(usize::from(slot)).filter(|s| s.busy) {
            entry.handled = true;
            self.release_if_done(slot);
        }
    }

    fn release_if_done(&mut self, slot: u16) {
        let entry = &mut self.slots[usize::from(slot)];
        if entry.busy && entry.sent && entry.handled {
            *entry = Slot::default();
            self.free.push(slot);
        }
    }

    /// Whether a slot is free (its response handled and its SEND complete).
    pub(crate) fn is_free(&self, slot: u16) -> bool {
        self.slots
            .get(usize::from(slot))
            .is_some_and(|entry| !entry.busy)
    }
}
