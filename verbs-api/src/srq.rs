//! Shared receive queues (`ibv_srq`): receives posted once for many QPs.
//!
//! An SRQ handle is a cheap clone; the SRQ keeps its PD alive, and a QP created on it
//! ([`Pd::create_qp_with_srq`]) keeps the SRQ alive. Posting to an SRQ takes the context's
//! lock (the receives go straight into the transport's SRQ, which every QP on it reads).
//! When the armed limit is reached, the context's async events carry
//! [`AsyncEvent::SrqLimitReached`](crate::AsyncEvent::SrqLimitReached) with [`Srq::id`].

use std::fmt;
use std::sync::Arc;

use roce_transport::srq::{SrqAttr, SrqModify};
use roce_transport::wr::RecvWr;
use roce_transport::SrqId;

use crate::cq::{Cq, CqInner};
use crate::error::{Error, PostFailure};
use crate::mr::{Pd, PdInner};
use crate::shared::Shared;
use crate::xrc::{Xrcd, XrcdInner};

/// One SRQ, shared by its handles and the QPs on it; destroyed in the endpoint when the
/// last of them goes.
pub(crate) struct SrqInner {
    pub(crate) pd: Arc<PdInner>,
    pub(crate) id: SrqId,
    /// A tag-matching SRQ's CQ, held so that it outlives the SRQ.
    pub(crate) tm_cq: Option<Arc<CqInner>>,
    /// An XRC SRQ's domain and CQ, held so they outlive it.
    pub(crate) _xrc: Option<(Arc<XrcdInner>, Arc<CqInner>)>,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        if let Ok(mut core) = self.pd.shared.lock() {
            // The last holder: no QP is on this SRQ any more, so the transport cannot refuse.
            let _ = core.endpoint().destroy_srq(self.id);
        }
    }
}

/// A shared receive queue (`ibv_srq`). Cloning gives another handle to the same SRQ.
#[derive(Clone)]
pub struct Srq {
    pub(crate) inner: Arc<SrqInner>,
}

impl fmt::Debug for Srq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Srq").field("id", &self.inner.id).finish()
    }
}

impl Pd {
    /// Creates an SRQ (`ibv_create_srq`): `max_wr` 1 to `max_srq_wr`, `max_sge` up to
    /// `max_srq_sge`; `srq_limit` is ignored (arm it with [`Srq::modify`]).
    pub fn create_srq(&self, attr: SrqAttr) -> Result<Srq, Error> {
        let id = self.inner.shared.lock()?.endpoint().create_srq(attr)?;
        Ok(Srq {
            inner: Arc::new(SrqInner {
                pd: Arc::clone(&self.inner),
                id,
                tm_cq: None,
                _xrc: None,
            }),
        })
    }

    /// Creates an XRC SRQ of `xrcd` (`ibv_create_srq_ex` with `IBV_SRQT_XRC`): XRC requests
    /// naming its number ([`Srq::number`]) are received into it, checked in this PD, and
    /// complete in `cq`.
    pub fn create_xrc_srq(&self, attr: SrqAttr, xrcd: &Xrcd, cq: &Cq) -> Result<Srq, Error> {
        let shared = &self.inner.shared;
        if !Arc::ptr_eq(&xrcd.inner.shared, shared) {
            return Err(Error::ForeignObject("XRC domain"));
        }
        if !Arc::ptr_eq(&cq.inner.shared, shared) {
            return Err(Error::ForeignObject("CQ"));
        }
        let mut core = shared.lock()?;
        let id = (core.endpoint()).create_xrc_srq(attr, xrcd.id(), cq.inner.id, self.inner.id)?;
        Ok(Srq {
            inner: Arc::new(SrqInner {
                pd: Arc::clone(&self.inner),
                id,
                tm_cq: None,
                _xrc: Some((Arc::clone(&xrcd.inner), Arc::clone(&cq.inner))),
            }),
        })
    }
}

impl Srq {
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.inner.pd.shared
    }

    /// Which SRQ this is, as its async events name it.
    pub fn id(&self) -> SrqId {
        self.inner.id
    }

    /// Its number (`ibv_get_srq_num`): what an XRC initiator's work request names it by.
    pub fn number(&self) -> Result<u32, Error> {
        let mut core = self.shared().lock()?;
        Ok(core.endpoint().srq_number(self.inner.id)?)
    }

    /// `ibv_post_srq_recv` for a list of work requests: posts them in order and stops at
    /// the first that fails (a full SRQ is `ENOMEM`, too many SGEs `EINVAL`), returning its
    /// index with the error.
    pub fn post_recv(&self, wrs: impl IntoIterator<Item = RecvWr>) -> Result<(), PostFailure> {
        let fail = |index, error| PostFailure { index, error };
        let mut core = self.shared().lock().map_err(|error| fail(0, error))?;
        for (index, wr) in wrs.into_iter().enumerate() {
            (core.endpoint().post_srq_recv(self.inner.id, &wr))
                .map_err(|error| fail(index, error.into()))?;
        }
        Ok(())
    }

    /// `ibv_modify_srq`: resizes it (`max_wr`) or arms its limit (`srq_limit`, 0 disarms).
    pub fn modify(&self, change: &SrqModify) -> Result<(), Error> {
        let mut core = self.shared().lock()?;
        Ok(core.endpoint().modify_srq(self.inner.id, change)?)
    }

    /// `ibv_query_srq`: its size, and the armed limit (0 when not armed or once reached).
    pub fn query(&self) -> Result<SrqAttr, Error> {
        let mut core = self.shared().lock()?;
        Ok(core.endpoint().query_srq(self.inner.id)?)
    }

    /// `ibv_destroy_srq`: destroys the SRQ now, or gives it back with [`Error::Busy`]
    /// (`EBUSY`) while a QP or another handle still holds it.
    pub fn destroy(self) -> Result<(), (Srq, Error)> {
        if Arc::strong_count(&self.inner) > 1 {
            return Err((self, Error::Busy("SRQ")));
        }
        Ok(())
    }
}
