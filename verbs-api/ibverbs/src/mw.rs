//! Memory windows: `ibv_alloc_mw`, `ibv_dealloc_mw` and `ibv_bind_mw` (inline in `verbs.h`
//! over `ibv_context_ops`), and the operand of an `IBV_WR_BIND_MW` work request.

use core::ffi::c_int;
use std::sync::atomic::Ordering;

use roce_cabi::set_errno;
use roce_verbs::{inc_rkey, AccessFlags, MwBind, MwType, SendOp};

use crate::abi::*;
use crate::pd::Pd;

const EINVAL: c_int = 22;
const EPERM: c_int = 1;

/// Our `ibv_mw`.
#[repr(C)]
pub(crate) struct Mw {
    raw: ibv_mw,
    mw: roce_verbs::Mw,
}

/// `ops.alloc_mw`: a type 1 or type 2 window in `pd`; another type is `EINVAL`.
pub(crate) unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, mw_type: u32) -> *mut ibv_mw {
    // SAFETY: the caller passes a PD of ours.
    let Some(ours) = (unsafe { Pd::from_raw(pd) }) else {
        set_errno(EINVAL);
        return core::ptr::null_mut();
    };
    let kind = match mw_type {
        IBV_MW_TYPE_1 => MwType::One,
        IBV_MW_TYPE_2 => MwType::Two,
        other => {
            crate::log_failure("ibv_alloc_mw", &format!("window type {other}"));
            set_errno(EINVAL);
            return core::ptr::null_mut();
        }
    };
    match ours.pd.alloc_mw(kind) {
        Ok(mw) => {
            ours.users.fetch_add(1, Ordering::AcqRel);
            let raw = ibv_mw {
                context: ours.raw.context,
                pd,
                rkey: mw.rkey(),
                handle: 0,
                mw_type,
            };
            Box::into_raw(Box::new(Mw { raw, mw })).cast()
        }
        Err(error) => {
            crate::log_failure("ibv_alloc_mw", &error);
            set_errno(crate::errno_of(&error));
            core::ptr::null_mut()
        }
    }
}

/// `ops.dealloc_mw`: a bound window lets go of its region; its R_Keys grant nothing more.
pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    if mw.is_null() {
        return EINVAL;
    }
    // SAFETY: the caller passes a window of ours and gives it up.
    let ours = unsafe { Box::from_raw(mw.cast::<Mw>()) };
    // SAFETY: a window's PD outlives it (it cannot be freed while the window holds it).
    if let Some(pd) = unsafe { Pd::from_raw(ours.raw.pd) } {
        pd.users.fetch_sub(1, Ordering::AcqRel);
    }
    match ours.mw.dealloc() {
        Ok(()) => 0,
        Err(error) => {
            crate::log_failure("ibv_dealloc_mw", &error);
            crate::errno_of(&error)
        }
    }
}

/// `ops.bind_mw` (`ibv_bind_mw`, type 1 windows, which the inline wrapper checked): posts the
/// bind on `qp` through `ops.post_send` with the window's R_Key's key byte one higher, and
/// gives the window that R_Key, as rdma-core's rxe provider does. 0 or an errno.
pub(crate) unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    mw_bind: *mut ibv_mw_bind,
) -> c_int {
    // SAFETY: the caller passes a QP, a window of ours and the bind.
    let (Some(raw_qp), Some(window), Some(bind)) =
        (unsafe { qp.as_ref() }, unsafe { mw.as_mut() }, unsafe {
            mw_bind.as_ref()
        })
    else {
        return EINVAL;
    };
    let info = bind.bind_info;
    let no_region = info.mr.is_null() && (info.addr != 0 || info.length != 0);
    let zero_based = info.mw_access_flags & IBV_ACCESS_ZERO_BASED != 0;
    // SAFETY: a non-NULL region is one of the caller's (ours).
    let foreign = unsafe { info.mr.as_ref() }.is_some_and(|mr| mr.pd != window.pd);
    let refused = if no_region || zero_based {
        Some(EINVAL)
    } else if foreign {
        Some(EPERM)
    } else {
        None
    };
    if let Some(errno) = refused {
        set_errno(errno);
        return errno;
    }
    let rkey = inc_rkey(window.rkey);
    // SAFETY: every field the bind reads is set; the rest is zero, as rdma-core clears it.
    let mut wr: ibv_send_wr = unsafe { core::mem::zeroed() };
    wr.wr_id = bind.wr_id;
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = bind.send_flags;
    wr.bind_mw = ibv_bind_mw_wr {
        mw,
        rkey,
        bind_info: info,
    };
    let mut bad = core::ptr::null_mut();
    // SAFETY: a QP's context is open while the QP lives.
    let post = unsafe { raw_qp.context.as_ref() }.and_then(|context| context.ops.post_send);
    let Some(post) = post else {
        return EINVAL;
    };
    // SAFETY: our own `ops.post_send` on the caller's QP with a valid one-request list.
    let result = unsafe { post(qp, &mut wr, &mut bad) };
    if result == 0 {
        window.rkey = rkey;
    } else {
        set_errno(result);
    }
    result
}

/// The operation of an `IBV_WR_BIND_MW` work request.
///
/// # Safety
/// `bind.mw` is NULL or a window of ours; `bind.bind_info.mr` is NULL or a region of the
/// caller's.
pub(crate) unsafe fn bind_op(bind: &ibv_bind_mw_wr) -> Result<SendOp, c_int> {
    // SAFETY: per this function's contract.
    let window = unsafe { bind.mw.cast::<Mw>().as_ref() }.ok_or(EINVAL)?;
    let info = bind.bind_info;
    // SAFETY: per this function's contract.
    let mr_lkey = unsafe { info.mr.as_ref() }.map_or(0, |mr| mr.lkey);
    Ok(SendOp::BindMw(MwBind {
        mw: window.mw.id(),
        rkey: bind.rkey,
        mr_lkey,
        addr: info.addr,
        length: info.length,
        access: AccessFlags::from_bits_truncate(info.mw_access_flags),
        zero_based: info.mw_access_flags & IBV_ACCESS_ZERO_BASED != 0,
    }))
}
