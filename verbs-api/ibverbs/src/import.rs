//! `ibv_import_pd`, `ibv_import_mr` and their `ibv_unimport_*`: objects of one context used
//! from another context of its object space (one made by `ibv_import_device` from its
//! `cmd_fd`, within this process; see `handles`).
//!
//! An imported PD is a PD of the importer's context over the same `roce-verbs` PD, so QPs and
//! regions made with it live where the original's do; an imported MR is a copy of the
//! original's `ibv_mr` (keys and length; its address NULL, as rdma-core's import gives it).
//! Unimporting frees the copy and leaves the original alone. An imported PD that QPs or
//! regions still use is not freed by `ibv_unimport_pd` (pyverbs unimports before it destroys
//! them, and they point at it): it stays allocated, as its QPs and regions expect.

use core::ffi::c_int;
use std::sync::atomic::Ordering;

use crate::abi::*;
use crate::context::Context;
use crate::handles::{self, Kind};
use crate::logging::fail_null;
use crate::pd::Pd;

const EINVAL: c_int = 22;

/// The object space of a context we handed out (the inode of its `cmd_fd`).
///
/// # Safety
/// `context` is NULL or open.
unsafe fn space(context: *mut ibv_context) -> Option<u64> {
    // SAFETY: per this function's contract.
    let ours = unsafe { Context::from_raw(context) }?;
    handles::space_of(ours.raw.context.cmd_fd)
}

/// `ibv_import_pd`: the PD `pd_handle` of `context`'s object space, as a PD of `context`.
pub(crate) unsafe extern "C" fn import_pd(
    context: *mut ibv_context,
    pd_handle: u32,
) -> *mut ibv_pd {
    const CALL: &str = "ibv_import_pd";
    let Some(found) = handles::lookup(Kind::Pd, pd_handle) else {
        return fail_null(CALL, EINVAL, &"no PD has this handle");
    };
    // SAFETY: registered PDs are live (they leave the registry as they go).
    let Some(original) = (unsafe { Pd::from_raw(found as *mut ibv_pd) }) else {
        return fail_null(CALL, EINVAL, &"no PD has this handle");
    };
    // SAFETY: the caller passes an open context; a live PD's context is open.
    let same_space =
        unsafe { space(context).is_some() && space(context) == space(original.raw.context) };
    if !same_space {
        return fail_null(CALL, EINVAL, &"the PD is of another context's objects");
    }
    let raw = ibv_pd {
        context,
        handle: pd_handle,
    };
    Box::into_raw(Box::new(Pd::plain(raw, original.pd.clone()))).cast()
}

/// `ibv_unimport_pd`: frees an imported PD (see the module's docs for one still in use).
pub(crate) unsafe extern "C" fn unimport_pd(pd: *mut ibv_pd) {
    // SAFETY: the caller passes a PD of ours.
    let Some(ours) = (unsafe { Pd::from_raw(pd) }) else {
        return;
    };
    if handles::is_original(ours.raw.handle, pd as usize) {
        crate::log_failure("ibv_unimport_pd", &"not an imported PD");
        return;
    }
    if ours.users.load(Ordering::Acquire) > 0 {
        crate::log_failure("ibv_unimport_pd", &"still used: kept");
        return;
    }
    // SAFETY: an imported PD, leaked from a Box in `import_pd`, which the caller gives up.
    drop(unsafe { Box::from_raw(pd.cast::<Pd>()) });
}

/// `ibv_import_mr`: the MR `mr_handle` of `pd`'s object space, as an MR of `pd`.
pub(crate) unsafe extern "C" fn import_mr(pd: *mut ibv_pd, mr_handle: u32) -> *mut ibv_mr {
    const CALL: &str = "ibv_import_mr";
    // SAFETY: the caller passes a PD of ours.
    let Some(importer) = (unsafe { Pd::from_raw(pd) }) else {
        return fail_null(CALL, EINVAL, &"NULL PD");
    };
    let Some(found) = handles::lookup(Kind::Mr, mr_handle) else {
        return fail_null(CALL, EINVAL, &"no MR has this handle");
    };
    // SAFETY: registered MRs are live (they leave the registry as they go).
    let original = unsafe { &*(found as *const ibv_mr) };
    // SAFETY: the importer's and the original's contexts are open while their objects live.
    let same_space = unsafe {
        space(importer.raw.context).is_some()
            && space(importer.raw.context) == space(original.context)
    };
    if !same_space {
        return fail_null(CALL, EINVAL, &"the MR is of another context's objects");
    }
    handles::imported_mr(ibv_mr {
        context: importer.raw.context,
        pd,
        addr: core::ptr::null_mut(),
        length: original.length,
        handle: mr_handle,
        lkey: original.lkey,
        rkey: original.rkey,
    })
}

/// `ibv_unimport_mr`: frees an imported MR's copy.
pub(crate) unsafe extern "C" fn unimport_mr(mr: *mut ibv_mr) {
    // SAFETY: the caller passes an MR of ours and gives it up if it is imported.
    if !unsafe { handles::free_imported_mr(mr) } {
        crate::log_failure("ibv_unimport_mr", &"not an imported MR");
    }
}
