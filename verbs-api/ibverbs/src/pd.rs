//! Protection domains and memory regions over the caller's memory.

use core::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use roce_cabi::{set_errno, EOPNOTSUPP};
use roce_verbs::AccessFlags;

use crate::abi::*;
use crate::context::Context;
use crate::handles::{self, Kind};

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
        Ok(pd) => {
            let ptr = Box::into_raw(Box::new(Pd {
                raw: ibv_pd { context, handle: 0 },
                pd,
                users: AtomicUsize::new(0),
            }));
            // SAFETY: just made; nobody else has it yet.
            unsafe { (*ptr).raw.handle = handles::register(Kind::Pd, ptr as usize) };
            ptr.cast()
        }
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
    handles::forget(ours.raw.handle, pd as usize);
    // SAFETY: it was leaked from a Box in `alloc_pd` (or `ibv_import_pd`), and the caller
    // gives it up.
    drop(unsafe { Box::from_raw(pd.cast::<Pd>()) });
    0
}

/// Our `ibv_mr`: a region over the caller's memory.
#[repr(C)]
struct Mr {
    raw: ibv_mr,
    mr: roce_verbs::Mr,
}

/// `IBV_ACCESS_ON_DEMAND`: paging on fault, which needs a kernel driver.
const ACCESS_ON_DEMAND: u32 = 1 << 6;

/// `ibv_reg_mr`: the caller's `length` bytes at `addr`, which peers address at `addr`.
pub(crate) unsafe extern "C" fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: the caller's promise of `ibv_reg_mr`, passed on.
    unsafe { reg_mr_iova2(pd, addr, length, addr as u64, access as u32) }
}

/// `ibv_reg_mr_iova` (1.7; the same as `ibv_reg_mr_iova2` with signed flags).
pub(crate) unsafe extern "C" fn reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: the caller's promise of `ibv_reg_mr`, passed on.
    unsafe { reg_mr_iova2(pd, addr, length, iova, access as u32) }
}

/// `ibv_reg_mr_iova2`: the caller's `length` bytes at `addr`, which peers address from
/// `iova`. Access bits we do not enforce (relaxed ordering and the rest of the optional
/// range, hugetlb, ...) are accepted and ignored, as rdma-core does; on-demand paging is
/// `EOPNOTSUPP`.
pub(crate) unsafe extern "C" fn reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    // SAFETY: the caller passes a PD of ours.
    let Some(ours) = (unsafe { Pd::from_raw(pd) }) else {
        set_errno(EINVAL);
        return core::ptr::null_mut();
    };
    if access & ACCESS_ON_DEMAND != 0 {
        crate::log_failure("ibv_reg_mr", &"on-demand paging");
        set_errno(EOPNOTSUPP);
        return core::ptr::null_mut();
    }
    let flags = AccessFlags::from_bits_truncate(access);
    // SAFETY: `ibv_reg_mr`'s contract: the memory stays mapped until `ibv_dereg_mr`, and the
    // program orders its own accesses against the transfers through completions.
    let made = unsafe { ours.pd.reg_mr_iova(addr.cast(), length, iova, flags) };
    match made {
        Ok(mr) => {
            ours.users.fetch_add(1, Ordering::AcqRel);
            let raw = ibv_mr {
                context: ours.raw.context,
                pd,
                addr,
                length,
                handle: 0,
                lkey: mr.lkey(),
                rkey: mr.rkey(),
            };
            let ptr = Box::into_raw(Box::new(Mr { raw, mr }));
            // SAFETY: just made; nobody else has it yet.
            unsafe { (*ptr).raw.handle = handles::register(Kind::Mr, ptr as usize) };
            ptr.cast()
        }
        Err(error) => {
            crate::log_failure("ibv_reg_mr", &error);
            set_errno(crate::errno_of(&error));
            core::ptr::null_mut()
        }
    }
}

/// `ibv_dereg_mr`: from now on its keys are unknown to every peer and work request.
pub(crate) unsafe extern "C" fn dereg_mr(mr: *mut ibv_mr) -> c_int {
    if mr.is_null() {
        return EINVAL;
    }
    // An imported copy goes alone; the original stays its importer's.
    // SAFETY: the caller passes a region of ours and gives it up.
    if unsafe { handles::free_imported_mr(mr) } {
        return 0;
    }
    // SAFETY: the caller passes a region of ours and gives it up.
    let ours = unsafe { Box::from_raw(mr.cast::<Mr>()) };
    handles::forget(ours.raw.handle, mr as usize);
    // SAFETY: a region's PD outlives it (it cannot be freed while we use it).
    if let Some(pd) = unsafe { Pd::from_raw(ours.raw.pd) } {
        pd.users.fetch_sub(1, Ordering::AcqRel);
    }
    match ours.mr.dereg() {
        Ok(_) => 0,
        Err(error) => {
            crate::log_failure("ibv_dereg_mr", &error);
            crate::errno_of(&error)
        }
    }
}
