//! Tag matching (`IBV_SRQT_TM`): an SRQ that also holds a list of tagged buffers, which the
//! SENDs of the RC QPs on it are matched against by the tag in the 16-byte header at the
//! start of their payload (the TMH, [`roce_wire::tmh`]). This is what mlx5's hardware and
//! provider give a program (`ibv_post_srq_ops`, the `IBV_WC_TM_*` completions), done in
//! software:
//!
//! - **The list** is changed by list operations (`struct ibv_ops_wr`): ADD a tagged buffer
//!   (tag, mask, one scatter element, the `wr_id` its receive completes with), which returns
//!   a handle; DEL one by its handle; SYNC. Each runs when posted (mlx5's internal command
//!   QP runs them in order, asynchronously); a signaled one completes on the SRQ's CQ with
//!   `IBV_WC_TM_ADD`/`DEL`/`SYNC`. Handles are handed out as mlx5's free list does: each
//!   index once, then freed ones first in, first out.
//! - **A tagged message** (TMH opcode EAGER or RNDV) matches the oldest tag, in posting
//!   order, with `TMH.tag & mask == tag`. An EAGER message lands after its TMH in the tag's
//!   buffer (`IBV_WC_TM_RECV` with `MATCH | DATA_VALID`). A RNDV request (TMH, then the
//!   rendezvous header, RVH: address, R_Key, length) completes with `MATCH` alone; the
//!   receiving QP reads the sender's data into the tag's buffer with an RDMA READ of its
//!   own, completes it with `DATA_VALID`, and tells the sender with a SEND of a TMH whose
//!   opcode is FIN. A request longer than `max_rndv_hdr_size`, or asking for more than the
//!   tag holds, is left to the program: its bytes after the TMH land in the tag's buffer
//!   and it completes with `IBV_WC_TM_RNDV_INCOMPLETE` (mlx5's "software rendezvous").
//! - **An unexpected message** (tagged, no tag matches) lands whole, TMH included, in the
//!   SRQ's next ordinary receive (`IBV_WC_TM_RECV` with neither flag); so does an untagged
//!   one (NO_TAG, and FIN, as mlx5 reports a FIN: `IBV_WC_TM_NO_TAG`).
//! - **Synchronisation** (mlx5's phase counts): the SRQ counts the unexpected messages it
//!   delivered; the program tells it how many it has handled (`IBV_OPS_TM_SYNC` with
//!   `unexpected_cnt`, 16 bits as mlx5 keeps them). A tag added while the two differ may
//!   match a message the program has not looked at yet, so it takes part in matching only
//!   once they agree again; its ADD (and DEL) completion carries `IBV_WC_TM_SYNC_REQ`, as
//!   does an unexpected message's once the program is more than 0x3fff behind.
//!
//! Everything here is bounded: at most `max_num_tags` tags (grown as used), one scatter
//! element each, and at most `max_ops` operations outstanding, counted as mlx5's command
//! queue counts its slots: those of one `ibv_post_srq_ops` list, and the unsignaled ones
//! since the last signaled one (whose completion frees them). Operations run at once here,
//! so a signaled one frees its slots when it completes rather than when it is polled.

use std::collections::VecDeque;

use roce_wire::{rvh, tmh};

use crate::cq::{TmFlags, TmInfo, WcOpcode, WcStatus, WorkCompletion};
use crate::errno;
use crate::limits::LIMITS;
use crate::wr::{SendFlags, SendOp, SendWr, SgList, Sge};

/// The sizes of a tag-matching SRQ's list (`struct ibv_tm_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TmSrqCaps {
    /// Tags the list holds at most (up to the device's `max_num_tags`).
    pub max_num_tags: u32,
    /// List operations outstanding at most (up to the device's `max_ops`).
    pub max_ops: u32,
}

/// What a list operation does (`enum ibv_ops_wr_opcode` with its operands).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TmOp {
    /// `IBV_WR_TAG_ADD`: a tagged buffer for messages with `TMH.tag & mask == tag`.
    Add {
        /// The tag.
        tag: u64,
        /// Which bits of a message's tag must equal `tag`.
        mask: u64,
        /// What the buffer's receive completes with (`recv_wr_id`).
        recv_wr_id: u64,
        /// The buffer: at most one element (`max_sge`); none, or an empty one, takes
        /// messages of no data.
        sg_list: SgList,
    },
    /// `IBV_WR_TAG_DEL`: removes the tag ADD returned `handle` for.
    Del {
        /// ADD's handle.
        handle: u32,
    },
    /// `IBV_WR_TAG_SYNC`: changes nothing but the count of unexpected messages handled.
    Sync,
}

/// A list operation (`struct ibv_ops_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TmOpWr {
    /// What its completion carries.
    pub wr_id: u64,
    /// What it does.
    pub op: TmOp,
    /// `IBV_OPS_SIGNALED`: complete it on the SRQ's CQ.
    pub signaled: bool,
    /// `IBV_OPS_TM_SYNC`: the unexpected messages the program has handled
    /// (`unexpected_cnt`).
    pub sync: Option<u32>,
}

/// Why a list operation was refused (the post fails; nothing changes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TmOpError {
    /// No such SRQ, or not a tag-matching one.
    #[error("not a tag-matching SRQ")]
    NotTagMatching,
    /// Every tag of the list is in use.
    #[error("tag list full")]
    ListFull,
    /// `max_ops` operations are outstanding.
    #[error("too many list operations outstanding")]
    OpsFull,
    /// More scatter elements than `max_sge`.
    #[error("too many scatter elements for a tag")]
    TooManySge,
    /// A handle beyond the list.
    #[error("no such tag handle")]
    UnknownHandle,
}

impl TmOpError {
    /// The errno `ibv_post_srq_ops` fails with (mlx5's).
    pub fn errno(&self) -> i32 {
        match self {
            TmOpError::ListFull | TmOpError::OpsFull => errno::ENOMEM,
            TmOpError::NotTagMatching | TmOpError::TooManySge | TmOpError::UnknownHandle => {
                errno::EINVAL
            }
        }
    }
}

/// What a tag-matching SRQ saw, for tools and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TmStats {
    /// Tagged messages that matched a tag.
    pub matched: u64,
    /// Tagged messages no tag matched.
    pub unexpected: u64,
    /// Untagged messages (NO_TAG and FIN).
    pub no_tag: u64,
    /// Rendezvous requests whose data the receiving QP read.
    pub rendezvous: u64,
    /// Requests refused for their TMH or RVH: too short, an undefined opcode (NAKed as
    /// invalid requests).
    pub malformed: u64,
}

/// The most the unexpected messages delivered may run ahead of those the program handled
/// before its unexpected completions ask for a sync (mlx5's `MLX5_TM_MAX_SYNC_DIFF`).
const MAX_SYNC_DIFF: u16 = 0x3fff;

/// Where a tag is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TagState {
    Free,
    /// In the list, waiting for a message.
    Posted,
    /// Matched by a message whose data is still coming (more packets, or a rendezvous read).
    Consumed,
}

#[derive(Debug)]
struct Tag {
    state: TagState,
    tag: u64,
    mask: u64,
    recv_wr_id: u64,
    sg_list: SgList,
    /// The count of unexpected messages handled when it was added.
    phase: u16,
    /// It may match: the program had handled every unexpected message when it was added, or
    /// has synchronised since.
    matchable: bool,
    /// The TMH of the message that consumed it: a rendezvous's FIN carries its `app_ctx`
    /// and tag back.
    matched: (u32, u64),
}

/// What a tagged buffer's receive needs: its `wr_id` and buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TagBuffer {
    pub handle: u32,
    pub recv_wr_id: u64,
    pub sg_list: SgList,
}

impl TagBuffer {
    /// Bytes the buffer holds.
    pub fn room(&self) -> u64 {
        self.sg_list.iter().map(|sge| u64::from(sge.length)).sum()
    }

    /// The RDMA READ of what a rendezvous request's RVH names into the start of the buffer
    /// (which holds it).
    pub fn rendezvous_read(&self, rvh: &rvh::Repr) -> SendWr {
        let mut left = rvh.dma_length;
        let sg_list = self
            .sg_list
            .iter()
            .map_while(|sge| {
                let length = sge.length.min(left);
                left -= length;
                (length > 0).then_some(Sge { length, ..*sge })
            })
            .collect();
        SendWr {
            wr_id: self.recv_wr_id,
            op: SendOp::RdmaRead {
                remote_addr: rvh.virtual_address,
                rkey: rvh.rkey,
            },
            sg_list,
            flags: SendFlags::SIGNALED,
            ..SendWr::default()
        }
    }
}

/// The completion of a message received through a tag-matching SRQ.
pub(crate) fn message_completion(
    qpn: u32,
    wr_id: u64,
    status: WcStatus,
    opcode: WcOpcode,
    byte_len: u32,
    tm: TmInfo,
) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status,
        opcode,
        byte_len,
        imm_data: None,
        invalidated_rkey: None,
        qp_num: qpn,
        src_qp: 0,
        solicited: false,
        network_header: None,
        tm,
    }
}

/// Where a message with this TMH goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// NO_TAG or FIN: to an ordinary receive, completing as `IBV_WC_TM_NO_TAG`.
    NoTag,
    /// Tagged, matching the tag of this handle.
    Matched(u32),
    /// Tagged, matching no tag: to an ordinary receive.
    Unexpected,
}

/// The tag-matching part of one SRQ.
#[derive(Debug)]
pub(crate) struct TagMatching {
    caps: TmSrqCaps,
    /// The slot of the CQ its list operations and messages complete in.
    pub cq: usize,
    /// Indexed by handle; grows as tags are first used, up to `max_num_tags`.
    tags: Vec<Tag>,
    /// Freed handles, reused oldest first once every handle has been used.
    free: VecDeque<u32>,
    /// The posted tags' handles, oldest first: the order matching looks in.
    posted: VecDeque<u32>,
    /// Unexpected messages delivered (mlx5's hardware phase count).
    delivered: u16,
    /// Unexpected messages the program said it handled.
    handled: u16,
    /// Unsignaled operations since the last signaled one.
    trailing: u32,
    /// Operations holding a slot of the queue: `trailing` as the current list began, and
    /// those of the list.
    occupied: u32,
    pub stats: TmStats,
}

impl TagMatching {
    /// The tag-matching part of a new SRQ completing in CQ slot `cq`; `caps` beyond the
    /// device's are refused (named).
    pub fn new(caps: TmSrqCaps, cq: usize) -> Result<TagMatching, &'static str> {
        if caps.max_num_tags > LIMITS.max_tm_tags {
            return Err("max_num_tags");
        }
        if caps.max_ops > LIMITS.max_tm_ops {
            return Err("max_ops");
        }
        Ok(TagMatching {
            caps,
            cq,
            tags: Vec::new(),
            free: VecDeque::new(),
            posted: VecDeque::new(),
            delivered: 0,
            handled: 0,
            trailing: 0,
            occupied: 0,
            stats: TmStats::default(),
        })
    }

    fn in_sync(&self) -> bool {
        self.delivered == self.handled
    }

    /// A new list of operations (one `ibv_post_srq_ops` call) begins.
    pub fn begin_list(&mut self) {
        self.occupied = self.trailing;
    }

    /// Runs one operation of the current list, all of it or (refused) none of it; ADD's
    /// handle, and the completion of a signaled operation.
    pub fn post(
        &mut self,
        wr: &TmOpWr,
        qpn: u32,
    ) -> Result<(Option<u32>, Option<WorkCompletion>), TmOpError> {
        if self.occupied >= self.caps.max_ops {
            return Err(TmOpError::OpsFull);
        }
        match &wr.op {
            TmOp::Add { sg_list, .. } => {
                if sg_list.len() > LIMITS.max_tm_sge as usize {
                    return Err(TmOpError::TooManySge);
                }
                let in_use = self.tags.len() - self.free.len();
                if in_use >= self.caps.max_num_tags as usize {
                    return Err(TmOpError::ListFull);
                }
            }
            TmOp::Del { handle } if *handle >= self.caps.max_num_tags => {
                return Err(TmOpError::UnknownHandle);
            }
            TmOp::Del { .. } | TmOp::Sync => {}
        }
        if let Some(handled) = wr.sync {
            // mlx5 passes the count in 16 bits.
            self.handled = handled as u16;
            if self.in_sync() {
                for &handle in &self.posted {
                    self.tags[handle as usize].matchable = true;
                }
            }
        }
        let (handle, opcode, status, flags) = match &wr.op {
            TmOp::Add {
                tag,
                mask,
                recv_wr_id,
                sg_list,
            } => {
                let tag = Tag {
                    state: TagState::Posted,
                    tag: *tag,
                    mask: *mask,
                    recv_wr_id: *recv_wr_id,
                    sg_list: sg_list.clone(),
                    phase: self.handled,
                    matchable: self.in_sync(),
                    matched: (0, 0),
                };
                let handle = self.allocate(tag);
                self.posted.push_back(handle);
                (
                    Some(handle),
                    WcOpcode::TmAdd,
                    WcStatus::Success,
                    self.sync_req(self.handled),
                )
            }
            TmOp::Del { handle } => {
                let index = *handle as usize;
                match self.tags.get(index) {
                    Some(tag) if tag.state == TagState::Posted => {
                        let flags = self.sync_req(tag.phase);
                        self.posted.retain(|&posted| posted != *handle);
                        self.release(*handle);
                        (None, WcOpcode::TmDel, WcStatus::Success, flags)
                    }
                    // Consumed meanwhile (or never added): mlx5's hardware reports failure.
                    _ => (None, WcOpcode::TmDel, WcStatus::TmError, TmFlags::empty()),
                }
            }
            TmOp::Sync => (None, WcOpcode::TmSync, WcStatus::Success, TmFlags::empty()),
        };
        self.occupied += 1;
        if !wr.signaled {
            self.trailing += 1;
            return Ok((handle, None));
        }
        self.trailing = 0;
        let tm = TmInfo {
            flags,
            ..TmInfo::NONE
        };
        let completion = message_completion(qpn, wr.wr_id, status, opcode, 0, tm);
        Ok((handle, Some(completion)))
    }

    /// `SYNC_REQ` when the unexpected messages delivered are not those handled as of
    /// `phase`.
    fn sync_req(&self, phase: u16) -> TmFlags {
        if self.delivered == phase {
            TmFlags::empty()
        } else {
            TmFlags::SYNC_REQ
        }
    }

    fn allocate(&mut self, tag: Tag) -> u32 {
        if self.tags.len() < self.caps.max_num_tags as usize {
            self.tags.push(tag);
            return (self.tags.len() - 1) as u32;
        }
        // The caller checked that a tag is free.
        let handle = self.free.pop_front().unwrap_or_default();
        self.tags[handle as usize] = tag;
        handle
    }

    /// Gives a tag back to the free list (it completed, or was deleted).
    pub fn release(&mut self, handle: u32) {
        if let Some(tag) = self.tags.get_mut(handle as usize) {
            if tag.state != TagState::Free {
                tag.state = TagState::Free;
                tag.sg_list.clear();
                self.free.push_back(handle);
            }
        }
    }

    /// Where a message with this TMH goes (nothing changes until it is taken).
    pub fn arrival(&self, tmh: &tmh::Repr) -> Arrival {
        match tmh.opcode {
            tmh::TmOpcode::NoTag | tmh::TmOpcode::Fin => Arrival::NoTag,
            tmh::TmOpcode::Eager | tmh::TmOpcode::Rndv => {
                let matching = self.posted.iter().copied().find(|&handle| {
                    let tag = &self.tags[handle as usize];
                    tag.matchable && tmh.tag & tag.mask == tag.tag
                });
                matching.map_or(Arrival::Unexpected, Arrival::Matched)
            }
        }
    }

    /// Takes the tag the message with this TMH matched out of the list: it is the message's
    /// now, until [`release`](Self::release)d.
    pub fn consume(&mut self, handle: u32, tmh: &tmh::Repr) -> Option<TagBuffer> {
        let tag = self.tags.get_mut(handle as usize)?;
        if tag.state != TagState::Posted {
            return None;
        }
        tag.state = TagState::Consumed;
        tag.matched = (tmh.app_ctx, tmh.tag);
        self.posted.retain(|&posted| posted != handle);
        self.stats.matched += 1;
        let tag = &self.tags[handle as usize];
        Some(TagBuffer {
            handle,
            recv_wr_id: tag.recv_wr_id,
            sg_list: tag.sg_list.clone(),
        })
    }

    /// Ends the rendezvous of the consumed tag `handle`, whose READ of `len` bytes ended with
    /// `status` on QP `qpn`: frees the tag; its second completion (`DATA_VALID`, or the
    /// failure), and on success the FIN to send (a TMH with opcode FIN and the request's
    /// `app_ctx` and tag). `None` if the tag is not consumed.
    pub fn finish_rendezvous(
        &mut self,
        handle: u32,
        qpn: u32,
        status: WcStatus,
        len: u32,
    ) -> Option<(WorkCompletion, Option<SendWr>)> {
        let tag = self.tags.get(handle as usize)?;
        if tag.state != TagState::Consumed {
            return None;
        }
        let (recv_wr_id, (app_ctx, tag)) = (tag.recv_wr_id, tag.matched);
        self.release(handle);
        let done = status == WcStatus::Success;
        let info = TmInfo {
            flags: if done {
                TmFlags::DATA_VALID
            } else {
                TmFlags::empty()
            },
            ..TmInfo::NONE
        };
        let len = if done { len } else { 0 };
        let completion = message_completion(qpn, recv_wr_id, status, WcOpcode::TmRecv, len, info);
        let fin = done.then(|| {
            let mut inline_data = vec![0; tmh::HEADER_LEN];
            let fin = tmh::Repr {
                opcode: tmh::TmOpcode::Fin,
                app_ctx,
                tag,
            };
            fin.emit(&mut tmh::Packet::new_unchecked(&mut inline_data[..]));
            SendWr {
                wr_id: recv_wr_id,
                op: SendOp::Send,
                inline_data,
                flags: SendFlags::INLINE,
                ..SendWr::default()
            }
        });
        Some((completion, fin))
    }

    /// Counts a request refused for its TMH or RVH.
    pub fn count_malformed(&mut self) {
        self.stats.malformed += 1;
    }

    /// Counts an unexpected message taken by an ordinary receive; the flags its completion
    /// carries.
    pub fn count_unexpected(&mut self) -> TmFlags {
        self.delivered = self.delivered.wrapping_add(1);
        self.stats.unexpected += 1;
        if self.delivered.wrapping_sub(self.handled) > MAX_SYNC_DIFF {
            TmFlags::SYNC_REQ
        } else {
            TmFlags::empty()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wr::Sge;

    fn sge() -> Sge {
        Sge {
            addr: 0x1000,
            length: 64,
            lkey: 1,
        }
    }

    fn add(tag: u64, mask: u64, recv_wr_id: u64) -> TmOpWr {
        TmOpWr {
            wr_id: recv_wr_id,
            op: TmOp::Add {
                tag,
                mask,
                recv_wr_id,
                sg_list: [sge()].into(),
            },
            signaled: true,
            sync: None,
        }
    }

    fn eager(tag: u64) -> tmh::Repr {
        tmh::Repr {
            opcode: tmh::TmOpcode::Eager,
            app_ctx: 0,
            tag,
        }
    }

    fn list(max_num_tags: u32, max_ops: u32) -> TagMatching {
        TagMatching::new(
            TmSrqCaps {
                max_num_tags,
                max_ops,
            },
            0,
        )
        .unwrap()
    }

    #[test]
    fn handles_are_used_once_then_reused_oldest_freed_first() {
        let mut tm = list(3, 16);
        let handles: Vec<u32> = (0..3)
            .map(|i| tm.post(&add(i, !0, i), 0).unwrap().0.unwrap())
            .collect();
        assert_eq!(handles, [0, 1, 2]);
        assert_eq!(tm.post(&add(9, !0, 9), 0), Err(TmOpError::ListFull));
        for handle in [2, 0] {
            let del = TmOpWr {
                op: TmOp::Del { handle },
                ..add(0, 0, 0)
            };
            tm.post(&del, 0).unwrap();
        }
        assert_eq!(tm.post(&add(7, !0, 7), 0).unwrap().0, Some(2));
        assert_eq!(tm.post(&add(8, !0, 8), 0).unwrap().0, Some(0));
    }

    #[test]
    fn the_oldest_matching_tag_wins_under_its_mask() {
        let mut tm = list(8, 16);
        tm.post(&add(0x10, 0xF0, 1), 0).unwrap();
        tm.post(&add(0x12, 0xFF, 2), 0).unwrap();
        tm.post(&add(0x10, 0xF0, 3), 0).unwrap();
        assert_eq!(tm.arrival(&eager(0x12)), Arrival::Matched(0));
        assert_eq!(tm.consume(0, &eager(0x12)).unwrap().recv_wr_id, 1);
        assert_eq!(tm.arrival(&eager(0x12)), Arrival::Matched(1));
        assert_eq!(tm.arrival(&eager(0x1F)), Arrival::Matched(2));
        assert_eq!(tm.arrival(&eager(0x21)), Arrival::Unexpected);
        let no_tag = tmh::Repr {
            opcode: tmh::TmOpcode::NoTag,
            ..eager(0x12)
        };
        assert_eq!(tm.arrival(&no_tag), Arrival::NoTag);
        assert!(
            tm.consume(0, &eager(0x12)).is_none(),
            "a consumed tag is not consumed twice"
        );
    }

    #[test]
    fn deleting_a_consumed_tag_fails_in_its_completion() {
        let mut tm = list(8, 16);
        let handle = tm.post(&add(5, !0, 5), 0).unwrap().0.unwrap();
        tm.consume(handle, &eager(5)).unwrap();
        let del = TmOpWr {
            op: TmOp::Del { handle },
            ..add(0, 0, 77)
        };
        let (_, completion) = tm.post(&del, 0).unwrap();
        let completion = completion.unwrap();
        assert_eq!(
            (completion.wr_id, completion.opcode, completion.status),
            (77, WcOpcode::TmDel, WcStatus::TmError)
        );
        let beyond = TmOpWr {
            op: TmOp::Del { handle: 8 },
            ..del
        };
        assert_eq!(tm.post(&beyond, 0), Err(TmOpError::UnknownHandle));
    }

    #[test]
    fn a_tag_added_out_of_sync_waits_for_the_sync() {
        let mut tm = list(8, 16);
        assert_eq!(tm.arrival(&eager(1)), Arrival::Unexpected);
        assert_eq!(tm.count_unexpected(), TmFlags::empty());
        let (handle, completion) = tm.post(&add(1, !0, 1), 0).unwrap();
        assert_eq!(completion.unwrap().tm.flags, TmFlags::SYNC_REQ);
        assert_eq!(
            tm.arrival(&eager(1)),
            Arrival::Unexpected,
            "not yet matchable"
        );
        let sync = TmOpWr {
            op: TmOp::Sync,
            sync: Some(1),
            ..add(0, 0, 27)
        };
        let (_, completion) = tm.post(&sync, 0).unwrap();
        let completion = completion.unwrap();
        assert_eq!(
            (completion.opcode, completion.tm.flags),
            (WcOpcode::TmSync, TmFlags::empty())
        );
        assert_eq!(tm.arrival(&eager(1)), Arrival::Matched(handle.unwrap()));
    }

    #[test]
    fn a_list_and_the_unsignaled_operations_before_it_fill_the_queue() {
        let quiet = |wr: TmOpWr| TmOpWr {
            signaled: false,
            ..wr
        };
        // Unsignaled operations hold their slots across lists...
        let mut tm = list(8, 2);
        for tag in 1..=2 {
            tm.begin_list();
            assert_eq!(tm.post(&quiet(add(tag, !0, tag)), 0).unwrap().1, None);
        }
        tm.begin_list();
        assert_eq!(tm.post(&add(3, !0, 3), 0), Err(TmOpError::OpsFull));
        // ... until a signaled one completes; a list holds a slot per operation.
        let mut tm = list(8, 2);
        tm.begin_list();
        tm.post(&quiet(add(1, !0, 1)), 0).unwrap();
        tm.post(&add(2, !0, 2), 0).unwrap();
        assert_eq!(tm.post(&add(3, !0, 3), 0), Err(TmOpError::OpsFull));
        tm.begin_list();
        tm.post(&add(3, !0, 3), 0).unwrap();
        tm.post(&add(4, !0, 4), 0).unwrap();
    }

    #[test]
    fn bounds_of_a_tag_and_of_the_list() {
        let mut tm = list(0, 4);
        assert_eq!(tm.post(&add(1, !0, 1), 0), Err(TmOpError::ListFull));
        let mut tm = list(4, 4);
        let two = TmOpWr {
            op: TmOp::Add {
                tag: 1,
                mask: !0,
                recv_wr_id: 1,
                sg_list: [sge(), sge()].into_iter().collect(),
            },
            ..add(0, 0, 0)
        };
        assert_eq!(tm.post(&two, 0), Err(TmOpError::TooManySge));
        let caps = TmSrqCaps {
            max_num_tags: LIMITS.max_tm_tags + 1,
            max_ops: 1,
        };
        assert_eq!(TagMatching::new(caps, 0).err(), Some("max_num_tags"));
    }
}
