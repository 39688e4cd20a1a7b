//! Memory windows (`ibv_mw`): R_Keys that grant a peer a range of a region, bound and
//! unbound by work requests.
//!
//! - A **type 1** window is bound with [`Qp::bind_mw`] (`ibv_bind_mw`), which posts the bind
//!   on a QP and hands back the R_Key it will have; binding it with no region unbinds it.
//! - A **type 2** window is bound by posting [`SendOp::BindMw`] (`IBV_WR_BIND_MW`) with the
//!   R_Key of the caller's choice (usually [`inc_rkey`] of the last); only the QP that bound
//!   it reaches it, and [`SendOp::LocalInv`] or the peer's SEND with invalidate frees it.
//!
//! Binds run when the QP's requester reaches them, in order with the QP's other work
//! requests, and complete as `IBV_WC_BIND_MW` (or fail with `IBV_WC_MW_BIND_ERR`). The
//! transport's [`mr`](roce_transport::mr) module documents the rules.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use roce_transport::mr::MwType;
use roce_transport::wr::{MwBind, MwId, SendFlags, SendOp, SendWr};
use roce_transport::AccessFlags;

use crate::error::{Error, PostFailure};
use crate::mr::{Mr, Pd, PdInner};
use crate::qp::Qp;

/// `ibv_inc_rkey`: the R_Key with its key byte (the low 8 bits) one higher.
pub fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xFF) | (rkey.wrapping_add(1) & 0xFF)
}

/// A memory window (`ibv_mw`). Deallocated on drop (or by [`dealloc`](Self::dealloc)); its
/// R_Keys grant nothing from then on.
pub struct Mw {
    pd: Arc<PdInner>,
    id: MwId,
    kind: MwType,
    /// The R_Key as `ibv_mw.rkey` shows it: the first one, then the one each
    /// [`Qp::bind_mw`] gave.
    rkey: AtomicU32,
}

impl fmt::Debug for Mw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mw")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("rkey", &self.rkey())
            .finish()
    }
}

impl Pd {
    /// Allocates a memory window of `kind` (`ibv_alloc_mw`).
    pub fn alloc_mw(&self, kind: MwType) -> Result<Mw, Error> {
        let mut core = self.inner.shared.lock()?;
        let mrs = core.endpoint().mrs();
        let id = mrs.alloc_mw(self.inner.id, kind)?;
        let rkey = mrs.mw_rkey(id).ok_or(Error::Gone)?;
        Ok(Mw {
            pd: Arc::clone(&self.inner),
            id,
            kind,
            rkey: AtomicU32::new(rkey),
        })
    }
}

impl Mw {
    /// Which window this is, as [`MwBind::mw`] names it.
    pub fn id(&self) -> MwId {
        self.id
    }

    /// Type 1 or type 2.
    pub fn kind(&self) -> MwType {
        self.kind
    }

    /// The R_Key as `ibv_mw.rkey` holds it: the first, or the last [`Qp::bind_mw`] gave (a
    /// type 2 bind's R_Key is the one its work request names).
    pub fn rkey(&self) -> u32 {
        self.rkey.load(Ordering::Acquire)
    }

    /// The R_Key the window has now, after the binds that have run.
    pub fn current_rkey(&self) -> Result<u32, Error> {
        let mut core = self.pd.shared.lock()?;
        core.endpoint().mrs().mw_rkey(self.id).ok_or(Error::Gone)
    }

    /// Whether the window is bound to a region now.
    pub fn is_bound(&self) -> Result<bool, Error> {
        let mut core = self.pd.shared.lock()?;
        core.endpoint()
            .mrs()
            .mw_is_bound(self.id)
            .ok_or(Error::Gone)
    }

    /// A type 2 bind of this window to `len` bytes of `mr` from `addr`, with the R_Key
    /// `rkey`: the operand of [`SendOp::BindMw`].
    pub fn bind_to(&self, mr: &Mr, addr: u64, len: u64, access: AccessFlags, rkey: u32) -> MwBind {
        MwBind {
            mw: self.id,
            rkey,
            mr_lkey: mr.lkey(),
            addr,
            length: len,
            access,
            zero_based: false,
        }
    }

    /// Deallocates now (`ibv_dealloc_mw`); a bound window lets go of its region.
    pub fn dealloc(self) -> Result<(), Error> {
        // Dropping `self` afterwards finds the window gone, which it ignores.
        let mut core = self.pd.shared.lock()?;
        Ok(core.endpoint().mrs().dealloc_mw(self.id)?)
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        if let Ok(mut core) = self.pd.shared.lock() {
            let _ = core.endpoint().mrs().dealloc_mw(self.id);
        }
    }
}

/// What `ibv_bind_mw` binds a type 1 window to (`struct ibv_mw_bind_info`): `len` bytes of
/// `mr` from `addr`, or nothing (`mr` `None`, `addr` and `len` 0), which unbinds it.
#[derive(Clone, Copy)]
pub struct MwBindInfo<'a> {
    /// The region, or `None` to unbind.
    pub mr: Option<&'a Mr>,
    /// First address, in the region's addresses.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The remote rights the window grants.
    pub access: AccessFlags,
}

impl Qp {
    /// `ibv_bind_mw`: posts a bind of the type 1 window `mw` to `info` on this QP (its
    /// completion, `wr_id` with `flags`, comes as any send's) and returns the R_Key the window
    /// has once it runs, its key byte one past [`Mw::rkey`]'s, which becomes `mw`'s. A window
    /// or region of another PD is `EINVAL` here, as is a type 2 window (post
    /// [`SendOp::BindMw`] for those).
    pub fn bind_mw(
        &self,
        mw: &Mw,
        info: &MwBindInfo,
        wr_id: u64,
        flags: SendFlags,
    ) -> Result<u32, Error> {
        if mw.kind != MwType::One {
            return Err(Error::InvalidArgument("ibv_bind_mw binds type 1 windows"));
        }
        if info.mr.is_none() && (info.addr != 0 || info.len != 0) {
            return Err(Error::InvalidArgument("a range without a region"));
        }
        if !Arc::ptr_eq(&mw.pd.shared, self.shared()) {
            return Err(Error::ForeignObject("memory window"));
        }
        let rkey = inc_rkey(mw.rkey());
        let bind = MwBind {
            mw: mw.id,
            rkey,
            mr_lkey: info.mr.map_or(0, Mr::lkey),
            addr: info.addr,
            length: info.len,
            access: info.access,
            zero_based: false,
        };
        let wr = SendWr {
            wr_id,
            op: SendOp::BindMw(bind),
            flags,
            ..SendWr::default()
        };
        self.post_send([wr])
            .map_err(|PostFailure { error, .. }| error)?;
        mw.rkey.store(rkey, Ordering::Release);
        Ok(rkey)
    }
}
