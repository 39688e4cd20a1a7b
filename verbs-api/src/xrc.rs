//! XRC domains (`ibv_xrcd`): what XRC SRQs ([`Pd::create_xrc_srq`](crate::Pd)) and XRC
//! target QPs ([`Xrcd::create_recv_qp`]) belong to. An XRC initiator QP
//! ([`QpType::XrcSend`](crate::QpType)) sends to a target, each work request naming the XRC
//! SRQ it is for ([`SendWr::xrc_srqn`](crate::SendWr)); the target receives it into that
//! SRQ, which must be of its domain, checks it against the SRQ's PD and completes it in the
//! SRQ's CQ.

use std::fmt;
use std::sync::Arc;

use roce_transport::xrc::XrcdId;

use crate::error::Error;
use crate::mr::Pd;
use crate::shared::Shared;

/// One domain, shared by its handles and what belongs to it; closed in the endpoint when the
/// last of them goes.
pub(crate) struct XrcdInner {
    pub(crate) shared: Arc<Shared>,
    pub(crate) id: XrcdId,
    /// What a target QP holds in the place of a PD (a target checks each request in its
    /// SRQ's PD, never in this one).
    pub(crate) holder: Pd,
}

impl Drop for XrcdInner {
    fn drop(&mut self) {
        if let Ok(mut core) = self.shared.lock() {
            // The last holder: no SRQ or QP belongs to it any more.
            let _ = core.endpoint().dealloc_xrcd(self.id);
        }
    }
}

/// An XRC domain (`ibv_xrcd`). Cloning gives another handle to the same domain.
#[derive(Clone)]
pub struct Xrcd {
    pub(crate) inner: Arc<XrcdInner>,
}

impl fmt::Debug for Xrcd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Xrcd").field("id", &self.inner.id).finish()
    }
}

impl Xrcd {
    /// Opens a new domain of the context whose state is `shared`.
    pub(crate) fn new(shared: &Arc<Shared>) -> Result<Xrcd, Error> {
        let holder = Pd::new(shared)?;
        let id = shared.lock()?.endpoint().alloc_xrcd();
        Ok(Xrcd {
            inner: Arc::new(XrcdInner {
                shared: Arc::clone(shared),
                id,
                holder,
            }),
        })
    }

    /// Which domain this is.
    pub fn id(&self) -> XrcdId {
        self.inner.id
    }

    /// `ibv_close_xrcd`: closes the domain now, or gives it back with [`Error::Busy`]
    /// (`EBUSY`) while an SRQ, a QP or another handle still holds it.
    pub fn close(self) -> Result<(), (Xrcd, Error)> {
        if Arc::strong_count(&self.inner) > 1 {
            return Err((self, Error::Busy("XRC domain")));
        }
        Ok(())
    }
}
