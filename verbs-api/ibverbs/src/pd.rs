//! Protection domains and memory regions.

use core::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};

use roce_cabi::set_errno;

use crate::abi::*;
use crate::context::Context;

const EINVAL: c_int = 22;
const EBUSY: c_int = 16;

/// Our `ibv_pd`.
#[repr(C)]
pub(crate) struct Pd {
    pub(crate) raw: ibv_pd,
    pub(crate) pd: roce_verbs::Pd,
    /// Regions, QPs and address handles made in it: while any is left, it cannot go.
    pub(crate) users: AtomicUsize,
}

impl Pd {
    /// The PD behind an `ibv_pd` we handed out.
    ///
    /// # Safety
    /// `pd` is NULL or came from [`alloc_pd`] and is not freed.
    pub(crate) unsafe fn from_raw<'a>(pd: *mut ibv_pd) -> Option<&'a Pd> {
        // SAFETY: `raw` is the first field of our `#[repr(C)]` Pd.
        unsafe { pd.cast::<Pd>().as_ref() }
    }
}

/// `ibv_alloc_pd`.
pub(crate) unsafe extern "C" fn alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    // SAFETY: the caller passes an open context.
    let Some(ours) = (unsafe { Context::from_raw(context) }) else {
        set_errno(EINVAL);
        return core::ptr::null_mut();
    };
    match ours.verbs().and_then(roce_verbs::Context::alloc_pd) {
        Ok(pd) => Box::into_raw(Box::new(Pd {
            raw: ibv_pd { context, handle: 0 },
            pd,
            users: AtomicUsize::new(0),
        }))
        .cast(),
        Err(error) => {
            crate::log_failure("ibv_alloc_pd", &error);
            set_errno(crate::errno_of(&error));
            core::ptr::null_mut()
        }
    }
}

/// `ibv_dealloc_pd`: `EBUSY` while regions, QPs or address handles use it.
pub(crate) unsafe extern "C" fn dealloc_pd(pd: *mut ibv_pd) -> c_int {
    // SAFETY: the caller passes a PD of ours.
    let Some(ours) = (unsafe { Pd::from_raw(pd) }) else {
        return EINVAL;
    };
    if ours.users.load(Ordering::Acquire) > 0 {
        return EBUSY;
    }
    // SAFETY: it was leaked from a Box in `alloc_pd`, and the caller gives it up.
    drop(unsafe { Box::from_raw(pd.cast::<Pd>()) });
    0
}
