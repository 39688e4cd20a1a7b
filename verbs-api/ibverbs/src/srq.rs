//! Shared receive queues: `ibv_create_srq`, the `create_srq_ex` op (basic and XRC SRQs, and
//! tag-matching ones, which `tm` makes), the `get_srq_num` op (an XRC sender names an SRQ by
//! it), `ibv_modify_srq`, `ibv_query_srq`, `ibv_destroy_srq` (`EBUSY` while a QP uses it) and
//! `ops.post_srq_recv`.

use core::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use roce_cabi::EOPNOTSUPP;
use roce_verbs::{SrqAttr, SrqModify};

use crate::abi::*;
use crate::context::Context;
use crate::cq::Cq;
use crate::logging::fail_null;
use crate::pd::{Pd, Placement, RES_TYPE_SRQ};
use crate::post::post_recv_list;

const EINVAL: c_int = 22;
const EBUSY: c_int = 16;

/// Our `ibv_srq`.
#[repr(C)]
pub(crate) struct Srq {
    raw: ibv_srq,
    pub(crate) srq: roce_verbs::Srq,
    /// QPs that take their receives from it: while any is left, it cannot go.
    pub(crate) users: AtomicUsize,
    /// An XRC or tag-matching SRQ's CQ (an `ibv_cq` of ours), whose users it counts in.
    pub(crate) held_cq: usize,
    /// Where its memory came from (its parent domain's allocator, or the heap).
    placement: Placement,
}

impl Srq {
    /// The SRQ behind an `ibv_srq` we handed out.
    ///
    /// # Safety
    /// `srq` is NULL or came from [`create_srq`] and is not destroyed.
    pub(crate) unsafe fn from_raw<'a>(srq: *mut c_void) -> Option<&'a Srq> {
        // SAFETY: `raw` is the first field of our `#[repr(C)]` Srq.
        unsafe { srq.cast::<Srq>().as_ref() }
    }
}

/// `ibv_create_srq`: `init_attr.attr` is updated to the sizes given.
pub(crate) unsafe extern "C" fn create_srq(
    pd: *mut ibv_pd,
    init_attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    // SAFETY: the caller passes a writable init struct.
    let Some(init) = (unsafe { init_attr.as_mut() }) else {
        return fail_null("ibv_create_srq", EINVAL, &"NULL attributes");
    };
    // SAFETY: the caller passes a PD of ours.
    unsafe { create(pd, init.srq_context, &mut init.attr) }
}

/// `verbs_context.create_srq_ex` (the inline `ibv_create_srq_ex` calls it for anything but
/// a plain PD and basic type): a basic SRQ, or an XRC SRQ (`IBV_SRQT_XRC` with its PD,
/// domain and CQ, `EINVAL` without them); tag matching is `EOPNOTSUPP`.
pub(crate) unsafe extern "C" fn create_srq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    const CALL: &str = "ibv_create_srq_ex";
    // SAFETY: the caller passes a writable init struct.
    let Some(init) = (unsafe { attr.as_mut() }) else {
        return fail_null(CALL, EINVAL, &"NULL attributes");
    };
    let typed = init.comp_mask & IBV_SRQ_INIT_ATTR_TYPE != 0;
    if typed && init.srq_type == IBV_SRQT_TM {
        // SAFETY: the caller passes its PD and CQ, when the mask says so.
        return unsafe { crate::tm::create_srq(context, init) };
    }
    if typed && init.srq_type == IBV_SRQT_XRC {
        // SAFETY: the caller passes its PD, domain and CQ, when the mask says so.
        return unsafe { create_xrc(context, init) };
    }
    let basic = !typed || init.srq_type == IBV_SRQT_BASIC;
    if !basic || init.comp_mask & !(IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD) != 0 {
        return fail_null(CALL, EOPNOTSUPP, &"tag-matching SRQs");
    }
    // SAFETY: the caller passes a PD of ours, when the mask says there is one.
    let pd = (init.comp_mask & IBV_SRQ_INIT_ATTR_PD != 0)
        .then(|| unsafe { Pd::from_raw(init.pd) })
        .flatten();
    if pd.is_none_or(|pd| pd.raw.context != context) {
        return fail_null(CALL, EINVAL, &"no PD of this context");
    }
    // SAFETY: checked above to be a PD of ours.
    unsafe { create(init.pd, init.srq_context, &mut init.attr) }
}

/// An XRC SRQ: its PD, domain and CQ must all be given, of this context.
///
/// # Safety
/// The init struct's PD, domain and CQ are NULL or ours, when its mask names them.
unsafe fn create_xrc(context: *mut ibv_context, init: &mut ibv_srq_init_attr_ex) -> *mut ibv_srq {
    const CALL: &str = "ibv_create_srq_ex";
    let needed = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
    if init.comp_mask & needed != needed {
        return fail_null(CALL, EINVAL, &"an XRC SRQ without its PD, XRC domain or CQ");
    }
    // SAFETY: per this function's contract.
    let (pd, xrcd, cq) = unsafe {
        (
            Pd::from_raw(init.pd),
            crate::xrc::Xrcd::from_raw(init.xrcd.cast()),
            Cq::from_raw(init.cq),
        )
    };
    let (Some(pd), Some(xrcd), Some(cq)) = (pd, xrcd, cq) else {
        return fail_null(CALL, EINVAL, &"NULL PD, XRC domain or CQ");
    };
    if pd.raw.context != context {
        return fail_null(CALL, EINVAL, &"a PD of another context");
    }
    let make = |wanted| pd.pd.create_xrc_srq(wanted, xrcd, &cq.cq);
    // SAFETY: checked above to be a PD of ours.
    let srq = unsafe { create_with(init.pd, init.srq_context, &mut init.attr, make) };
    if !srq.is_null() {
        cq.users.fetch_add(1, Ordering::AcqRel);
        // SAFETY: just created, ours.
        if let Some(ours) = unsafe { srq.cast::<Srq>().as_mut() } {
            ours.held_cq = init.cq as usize;
        }
    }
    srq
}

/// `verbs_context.get_srq_num` (the inline `ibv_get_srq_num`).
pub(crate) unsafe extern "C" fn get_srq_num(srq: *mut ibv_srq, srq_num: *mut u32) -> c_int {
    // SAFETY: the caller passes an SRQ of ours and a writable number.
    let (Some(ours), Some(out)) = (unsafe { Srq::from_raw(srq.cast()) }, unsafe {
        srq_num.as_mut()
    }) else {
        return EINVAL;
    };
    match ours.srq.number() {
        Ok(number) => {
            *out = number;
            0
        }
        Err(error) => crate::errno_of(&error),
    }
}

/// Creates a basic SRQ in `pd`, writing the sizes given back into `attr`.
///
/// # Safety
/// `pd` is NULL or a PD of ours.
unsafe fn create(
    pd: *mut ibv_pd,
    srq_context: *mut c_void,
    attr: &mut ibv_srq_attr,
) -> *mut ibv_srq {
    // SAFETY: per this function's contract.
    let Some(ours) = (unsafe { Pd::from_raw(pd) }) else {
        return fail_null("ibv_create_srq", EINVAL, &"NULL PD");
    };
    // SAFETY: per this function's contract.
    unsafe { create_with(pd, srq_context, attr, |wanted| ours.pd.create_srq(wanted)) }
}

/// Creates an SRQ in `pd` with `make`, writing the sizes given back into `attr`.
///
/// # Safety
/// `pd` is NULL or a PD of ours.
pub(crate) unsafe fn create_with(
    pd: *mut ibv_pd,
    srq_context: *mut c_void,
    attr: &mut ibv_srq_attr,
    make: impl FnOnce(SrqAttr) -> Result<roce_verbs::Srq, roce_verbs::Error>,
) -> *mut ibv_srq {
    const CALL: &str = "ibv_create_srq";
    // SAFETY: per this function's contract.
    let Some(ours) = (unsafe { Pd::from_raw(pd) }) else {
        return fail_null(CALL, EINVAL, &"NULL PD");
    };
    // SAFETY: a PD's context outlives it.
    let Some(context) = (unsafe { Context::from_raw(ours.raw.context) }) else {
        return fail_null(CALL, EINVAL, &"PD without a context");
    };
    let wanted = SrqAttr {
        max_wr: attr.max_wr,
        max_sge: attr.max_sge,
        srq_limit: attr.srq_limit,
    };
    let srq = match make(wanted) {
        Ok(srq) => srq,
        Err(error) => return fail_null(CALL, crate::errno_of(&error), &error),
    };
    if let Ok(given) = srq.query() {
        attr.max_wr = given.max_wr;
        attr.max_sge = given.max_sge;
    }
    let id = srq.id();
    let made = Srq {
        raw: ibv_srq {
            context: ours.raw.context,
            srq_context,
            pd,
            handle: 0,
            mutex: [0; 5],
            cond: [0; 6],
            events_completed: 0,
        },
        srq,
        users: AtomicUsize::new(0),
        held_cq: 0,
        placement: Placement::Heap,
    };
    let ptr = match Placement::place(Some(ours), RES_TYPE_SRQ, made) {
        Ok((ptr, placement)) => {
            // SAFETY: just placed, not yet handed out.
            unsafe { (*ptr).placement = placement };
            ptr
        }
        Err(errno) => return fail_null(CALL, errno, &"the parent domain's allocator"),
    };
    ours.users.fetch_add(1, Ordering::AcqRel);
    if let Ok(mut srqs) = context.srqs.lock() {
        srqs.insert(id, ptr as usize);
    }
    ptr.cast()
}

/// `ibv_modify_srq`: `IBV_SRQ_MAX_WR` resizes, `IBV_SRQ_LIMIT` arms the limit event.
pub(crate) unsafe extern "C" fn modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    attr_mask: c_int,
) -> c_int {
    // SAFETY: the caller passes an SRQ of ours and the attributes.
    let (Some(ours), Some(attr)) = (unsafe { Srq::from_raw(srq.cast()) }, unsafe {
        attr.as_ref()
    }) else {
        return EINVAL;
    };
    if attr_mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 {
        return EINVAL;
    }
    let change = SrqModify {
        max_wr: (attr_mask & IBV_SRQ_MAX_WR != 0).then_some(attr.max_wr),
        srq_limit: (attr_mask & IBV_SRQ_LIMIT != 0).then_some(attr.srq_limit),
    };
    match ours.srq.modify(&change) {
        Ok(()) => 0,
        Err(error) => {
            crate::log_failure("ibv_modify_srq", &error);
            crate::errno_of(&error)
        }
    }
}

/// `ibv_query_srq`.
pub(crate) unsafe extern "C" fn query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    // SAFETY: the caller passes an SRQ of ours.
    let Some(ours) = (unsafe { Srq::from_raw(srq.cast()) }) else {
        return EINVAL;
    };
    if attr.is_null() {
        return EINVAL;
    }
    match ours.srq.query() {
        Ok(given) => {
            // SAFETY: the caller passes a writable attribute struct (checked not null).
            unsafe {
                attr.write(ibv_srq_attr {
                    max_wr: given.max_wr,
                    max_sge: given.max_sge,
                    srq_limit: given.srq_limit,
                })
            };
            0
        }
        Err(error) => crate::errno_of(&error),
    }
}

/// `ibv_destroy_srq`: `EBUSY` while a QP takes its receives from it.
pub(crate) unsafe extern "C" fn destroy_srq(srq: *mut ibv_srq) -> c_int {
    // SAFETY: the caller passes an SRQ of ours.
    let Some(ours) = (unsafe { Srq::from_raw(srq.cast()) }) else {
        return EINVAL;
    };
    if ours.users.load(Ordering::Acquire) > 0 {
        return EBUSY;
    }
    let placement = ours.placement;
    // SAFETY: an SRQ's context and PD outlive it (the PD cannot go while it is used).
    unsafe {
        if let Some(context) = Context::from_raw(ours.raw.context) {
            if let Ok(mut srqs) = context.srqs.lock() {
                srqs.remove(&ours.srq.id());
            }
        }
        if let Some(pd) = Pd::from_raw(ours.raw.pd) {
            pd.users.fetch_sub(1, Ordering::AcqRel);
        }
        if let Some(cq) = Cq::from_raw(ours.held_cq as *mut ibv_cq) {
            cq.users.fetch_sub(1, Ordering::AcqRel);
        }
        // Placed by `create`; the caller gives it up.
        placement.release(srq.cast::<Srq>());
    }
    0
}

/// `ops.post_srq_recv` (the inline `ibv_post_srq_recv`): a full SRQ is `ENOMEM`, too many
/// SGEs `EINVAL`; `bad_wr` names the first request not posted.
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut c_void,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller passes an SRQ of ours.
    let Some(ours) = (unsafe { Srq::from_raw(srq) }) else {
        return EINVAL;
    };
    // SAFETY: the caller passes a valid list and `bad_wr`.
    unsafe { post_recv_list(wr, bad_wr, |walk| ours.srq.post_recv(walk)) }
}
