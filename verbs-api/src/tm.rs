//! Tag matching (`IBV_SRQT_TM`): tag-matching SRQs and their list operations
//! (`ibv_post_srq_ops`), over the transport's (see `roce_transport::tm`). The SRQ holds its
//! CQ, where its list operations and the messages of the RC QPs on it complete with tag
//! matching's opcodes and [`TmInfo`](crate::TmInfo). List operations run when posted, under
//! the context's lock, as SRQ receives are posted.

use std::sync::Arc;

use roce_transport::srq::SrqAttr;
use roce_transport::tm::{TmOpWr, TmSrqCaps, TmStats};
use roce_transport::CqId;

use crate::cq::Cq;
use crate::error::{Error, PostFailure};
use crate::mr::Pd;
use crate::srq::{Srq, SrqInner};

impl Pd {
    /// Creates a tag-matching SRQ (`ibv_create_srq_ex` with `IBV_SRQT_TM`): an SRQ whose RC
    /// QPs' SENDs are matched against up to `caps.max_num_tags` tags, posted with
    /// [`Srq::post_ops`]; they and the list operations complete in `cq`.
    pub fn create_tm_srq(&self, attr: SrqAttr, caps: TmSrqCaps, cq: &Cq) -> Result<Srq, Error> {
        let shared = &self.inner.shared;
        if !Arc::ptr_eq(&cq.inner.shared, shared) {
            return Err(Error::ForeignObject("CQ"));
        }
        let mut core = shared.lock()?;
        let id = core.endpoint().create_tm_srq(attr, caps, cq.inner.id)?;
        Ok(Srq {
            inner: Arc::new(SrqInner {
                pd: Arc::clone(&self.inner),
                id,
                tm_cq: Some(Arc::clone(&cq.inner)),
                _xrc: None,
            }),
        })
    }
}

impl Srq {
    /// `ibv_post_srq_ops` for a list of operations: runs them in order, telling `each` the
    /// index and, for an ADD, the handle it got; stops at the first refused (a full list or
    /// more than `max_ops` outstanding `ENOMEM`, a bad handle, too many scatter elements or
    /// an SRQ without tag matching `EINVAL`), returning its index with the error. A signaled
    /// operation's completion is in the SRQ's CQ.
    pub fn post_ops(
        &self,
        wrs: impl IntoIterator<Item = TmOpWr>,
        each: impl FnMut(usize, Option<u32>),
    ) -> Result<(), PostFailure> {
        let fail = |index, error| PostFailure { index, error };
        let mut core = self.shared().lock().map_err(|error| fail(0, error))?;
        let posted = core.endpoint().post_srq_ops(self.inner.id, wrs, each);
        // Completions go where pollers take them now, not at the next round.
        core.deliver(std::time::Instant::now());
        posted.map_err(|(index, error)| fail(index, error.into()))
    }

    /// A tag-matching SRQ's CQ.
    pub fn tm_cq(&self) -> Option<CqId> {
        self.inner.tm_cq.as_ref().map(|cq| cq.id)
    }

    /// What a tag-matching SRQ saw (`None` for any other SRQ).
    pub fn tm_stats(&self) -> Result<Option<TmStats>, Error> {
        let mut core = self.shared().lock()?;
        Ok(core.endpoint().tm_stats(self.inner.id))
    }
}
