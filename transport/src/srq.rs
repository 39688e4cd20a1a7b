//! Shared receive queues (`ibv_create_srq`): one queue of receive WQEs that several QPs
//! take from. A QP on an SRQ takes a WQE when a message needs one and holds it in its own
//! receive queue until the message completes, so a multi-packet SEND keeps its buffer while
//! other QPs take the next ones (rxe copies the WQE into `qp->resp.srq_wqe` the same way).
//! The checks and errno values are rxe's (`rxe_srq_chk_init`, `rxe_srq_chk_attr`, its
//! user-space `post_srq_recv`), and `ib_destroy_srq`'s `EBUSY` while a QP uses the SRQ.

use crate::errno;
use crate::limits::LIMITS;
use crate::mr::PdId;
use crate::ring::Ring;
use crate::tm::TagMatching;
use crate::wr::RecvWr;
use crate::xrc::XrcdId;

/// The SRQ number of the SRQ in slot 0 (`ibv_get_srq_num`; rxe's first SRQ index): what an
/// XRCETH names.
const FIRST_SRQN: u32 = 0x2_0001;

/// Identifies a shared receive queue of an [`Endpoint`](crate::Endpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SrqId(usize);

/// An SRQ's sizes and limit (`struct ibv_srq_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqAttr {
    /// Work requests the SRQ holds at most.
    pub max_wr: u32,
    /// Scatter elements per work request.
    pub max_sge: u32,
    /// The armed limit: when fewer WQEs than this remain after a QP takes one, the SRQ
    /// raises [`SrqLimitReached`](crate::endpoint::AsyncEvent::SrqLimitReached) once and
    /// disarms (0). Ignored at creation, as `ibv_create_srq` documents.
    pub srq_limit: u32,
}

/// What `ibv_modify_srq` changes: the attributes its mask names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqModify {
    /// `IBV_SRQ_MAX_WR`: resize to this many WQEs (not below those queued).
    pub max_wr: Option<u32>,
    /// `IBV_SRQ_LIMIT`: arm the limit event at this count (0 disarms).
    pub srq_limit: Option<u32>,
}

/// Why an SRQ call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SrqError {
    /// No such SRQ (or it was destroyed).
    #[error("unknown shared receive queue")]
    UnknownSrq,
    /// `max_srq` SRQs exist already.
    #[error("no SRQs left")]
    TooMany,
    /// An attribute out of range (named): `max_wr` 0 or beyond the device's or below the
    /// armed limit or the WQEs queued, `max_sge` beyond the device's, a limit beyond
    /// `max_wr`.
    #[error("{0} out of range")]
    InvalidAttr(&'static str),
    /// A QP still takes its receives from it.
    #[error("shared receive queue still used by a QP")]
    InUse,
    /// The SRQ already holds `max_wr` work requests.
    #[error("shared receive queue full")]
    QueueFull,
    /// More scatter elements than the SRQ's `max_sge`.
    #[error("too many scatter/gather elements")]
    TooManySge,
}

impl SrqError {
    /// The errno the verbs call fails with.
    pub fn errno(&self) -> i32 {
        match self {
            SrqError::TooMany | SrqError::QueueFull => errno::ENOMEM,
            SrqError::InUse => errno::EBUSY,
            SrqError::UnknownSrq | SrqError::InvalidAttr(_) | SrqError::TooManySge => errno::EINVAL,
        }
    }
}

/// What makes an SRQ an XRC SRQ (`IBV_SRQT_XRC`): its domain, and the PD and CQ its
/// receives use, since the XRC target QPs that take from it have neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct XrcSrq {
    pub xrcd: XrcdId,
    pub pd: PdId,
    /// The CQ's slot.
    pub cq: usize,
}

/// One SRQ.
#[derive(Debug)]
struct Srq {
    max_wr: u32,
    max_sge: u32,
    /// The armed limit, 0 when disarmed.
    limit: u32,
    wqes: Ring<RecvWr>,
    /// A tag-matching SRQ's list and counts (boxed: most SRQs have none).
    tm: Option<Box<TagMatching>>,
    xrc: Option<XrcSrq>,
}

/// The endpoint's SRQs, and the limit events they raised since the owner last took them.
#[derive(Debug, Default)]
pub(crate) struct SrqTable {
    /// A destroyed SRQ's slot is `None` and is reused, so the table holds at most
    /// `max_srq` slots.
    srqs: Vec<Option<Srq>>,
    limit_reached: Vec<SrqId>,
}

impl SrqTable {
    /// `ibv_create_srq`: `max_wr` 1 to `max_srq_wr`, `max_sge` up to `max_srq_sge` (0 is
    /// raised to 1, as rxe does); the limit starts disarmed.
    pub fn create(&mut self, attr: SrqAttr) -> Result<SrqId, SrqError> {
        self.create_with(attr, None)
    }

    /// [`create`](Self::create) for an XRC SRQ.
    pub fn create_xrc(&mut self, attr: SrqAttr, xrc: XrcSrq) -> Result<SrqId, SrqError> {
        self.create_with(attr, Some(xrc))
    }

    fn create_with(&mut self, attr: SrqAttr, xrc: Option<XrcSrq>) -> Result<SrqId, SrqError> {
        if attr.max_wr == 0 || attr.max_wr > LIMITS.max_srq_wr {
            return Err(SrqError::InvalidAttr("max_wr"));
        }
        if attr.max_sge > LIMITS.max_srq_sge {
            return Err(SrqError::InvalidAttr("max_sge"));
        }
        let srq = Srq {
            max_wr: attr.max_wr,
            max_sge: attr.max_sge.max(1),
            limit: 0,
            wqes: Ring::default(),
            tm: None,
            xrc,
        };
        let free = self.srqs.iter().position(Option::is_none);
        let slot = match free {
            Some(slot) => slot,
            None if self.srqs.len() < LIMITS.max_srq as usize => {
                self.srqs.push(None);
                self.srqs.len() - 1
            }
            None => return Err(SrqError::TooMany),
        };
        self.srqs[slot] = Some(srq);
        Ok(SrqId(slot))
    }

    fn get(&self, id: SrqId) -> Result<&Srq, SrqError> {
        self.srqs
            .get(id.0)
            .and_then(Option::as_ref)
            .ok_or(SrqError::UnknownSrq)
    }

    fn get_mut(&mut self, id: SrqId) -> Result<&mut Srq, SrqError> {
        self.srqs
            .get_mut(id.0)
            .and_then(Option::as_mut)
            .ok_or(SrqError::UnknownSrq)
    }

    pub fn exists(&self, id: SrqId) -> bool {
        self.get(id).is_ok()
    }

    /// [`create`](Self::create) for a tag-matching SRQ (`IBV_SRQT_TM`).
    pub fn create_tm(&mut self, attr: SrqAttr, tm: TagMatching) -> Result<SrqId, SrqError> {
        let id = self.create(attr)?;
        if let Some(srq) = self.srqs[id.0].as_mut() {
            srq.tm = Some(Box::new(tm));
        }
        Ok(id)
    }

    /// A tag-matching SRQ's list; `None` for any other SRQ.
    pub fn tm(&self, id: SrqId) -> Option<&TagMatching> {
        self.get(id).ok()?.tm.as_deref()
    }

    /// [`tm`](Self::tm), to change.
    pub fn tm_mut(&mut self, id: SrqId) -> Option<&mut TagMatching> {
        self.get_mut(id).ok()?.tm.as_deref_mut()
    }

    /// The SRQ's number (`ibv_get_srq_num`), what an XRCETH names.
    pub fn number(&self, id: SrqId) -> Result<u32, SrqError> {
        self.get(id)?;
        Ok(FIRST_SRQN + id.0 as u32)
    }

    /// The XRC SRQ numbered `srqn` of domain `xrcd`, with its PD and CQ: where an XRC
    /// request for it goes. `None` for any other number (a basic SRQ's too).
    pub fn xrc_target(&self, srqn: u32, xrcd: XrcdId) -> Option<(SrqId, XrcSrq)> {
        let slot = srqn.checked_sub(FIRST_SRQN)? as usize;
        let xrc = self.srqs.get(slot)?.as_ref()?.xrc?;
        (xrc.xrcd == xrcd).then_some((SrqId(slot), xrc))
    }

    /// Whether an XRC or tag-matching SRQ completes into the CQ in slot `cq`.
    pub fn uses_cq(&self, cq: usize) -> bool {
        self.srqs.iter().flatten().any(|srq| {
            srq.xrc.is_some_and(|xrc| xrc.cq == cq) || srq.tm.as_ref().is_some_and(|tm| tm.cq == cq)
        })
    }

    /// Whether an XRC SRQ belongs to `xrcd`.
    pub fn uses_xrcd(&self, xrcd: XrcdId) -> bool {
        self.srqs
            .iter()
            .flatten()
            .any(|srq| srq.xrc.is_some_and(|xrc| xrc.xrcd == xrcd))
    }

    /// `ibv_modify_srq`, checked as a whole before anything changes.
    pub fn modify(&mut self, id: SrqId, change: &SrqModify) -> Result<(), SrqError> {
        let srq = self.get_mut(id)?;
        if let Some(max_wr) = change.max_wr {
            let below_limit = srq.limit != 0 && max_wr < srq.limit;
            let below_queued = (max_wr as usize) < srq.wqes.len();
            if max_wr == 0 || max_wr > LIMITS.max_srq_wr || below_limit || below_queued {
                return Err(SrqError::InvalidAttr("max_wr"));
            }
        }
        let max_wr = change.max_wr.unwrap_or(srq.max_wr);
        if change.srq_limit.is_some_and(|limit| limit > max_wr) {
            return Err(SrqError::InvalidAttr("srq_limit"));
        }
        srq.max_wr = max_wr;
        if let Some(limit) = change.srq_limit {
            srq.limit = limit;
        }
        Ok(())
    }

    /// `ibv_query_srq`.
    pub fn query(&self, id: SrqId) -> Result<SrqAttr, SrqError> {
        let srq = self.get(id)?;
        Ok(SrqAttr {
            max_wr: srq.max_wr,
            max_sge: srq.max_sge,
            srq_limit: srq.limit,
        })
    }

    /// Removes an SRQ (the caller checked that no QP uses it); its WQEs are dropped.
    pub fn remove(&mut self, id: SrqId) -> Result<(), SrqError> {
        self.get(id)?;
        self.srqs[id.0] = None;
        Ok(())
    }

    /// `ibv_post_srq_recv` for one work request, copied into the SRQ.
    pub fn post(&mut self, id: SrqId, wr: &RecvWr) -> Result<(), SrqError> {
        let srq = self.get_mut(id)?;
        // rxe's order: a full queue first.
        if srq.wqes.len() >= srq.max_wr as usize {
            return Err(SrqError::QueueFull);
        }
        if wr.sg_list.len() > srq.max_sge as usize {
            return Err(SrqError::TooManySge);
        }
        srq.wqes.push_slot().clone_from(wr);
        Ok(())
    }

    /// Moves the SRQ's oldest WQE to the back of `to` (a QP's own receive queue); `false`
    /// when the SRQ is empty. Raises the limit event when this leaves fewer WQEs than the
    /// armed limit.
    pub fn take_into(&mut self, id: SrqId, to: &mut Ring<RecvWr>) -> bool {
        let Ok(srq) = self.get_mut(id) else {
            return false;
        };
        let Some(wqe) = srq.wqes.front() else {
            return false;
        };
        to.push_slot().clone_from(wqe);
        srq.wqes.pop_front();
        if srq.limit != 0 && srq.wqes.len() < srq.limit as usize {
            srq.limit = 0;
            self.limit_reached.push(id);
        }
        true
    }

    /// The SRQs whose limit was reached since the last call, in order.
    pub fn take_limit_events(&mut self) -> std::vec::Drain<'_, SrqId> {
        self.limit_reached.drain(..)
    }
}
