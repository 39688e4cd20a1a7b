//! Queue pairs (create, modify with rdma-core's attribute masks, query, destroy, posting
//! through the ops table); the `ibv_qp_ex` part is `qp_ex`'s.

use core::ffi::{c_int, c_void};
use std::ops::Deref;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use roce_cabi::EOPNOTSUPP;
use roce_verbs::{
    AccessFlags, PathMtu, Psn, QpAttr, QpCaps, QpState, QpType, Rate, RateLimit, RnrTimer,
    SendFlags, SendOp, SendWr,
};

use crate::abi::*;
use crate::ah::{address_vector, Ah};
use crate::context::Context;
use crate::cq::Cq;
use crate::logging::fail_null;
use crate::pd::{Pd, Placement, RES_TYPE_QP};
use crate::post::{inline_bytes, post_list, post_recv_list, sg_list, MAX_INLINE_DATA};
use crate::qp_ex::{self, QpEx};
use crate::srq::Srq;

const EINVAL: c_int = 22;
const EBUSY: c_int = 16;

/// Our `ibv_qp`: the `ibv_qp_ex` around it comes first (so the pointer callers hold is
/// both), then what only the QP calls need.
#[repr(C)]
pub(crate) struct Qp {
    ex: QpEx,
    cap: ibv_qp_cap,
    sq_sig_all: c_int,
    /// The attributes given so far, as `ibv_query_qp` reports them.
    attr: Mutex<ibv_qp_attr>,
    /// Whether `ibv_qp_to_qp_ex` hands out the builders: created by `ibv_create_qp_ex`.
    extended: bool,
    /// Where its memory came from (its parent domain's allocator, or the heap).
    placement: Placement,
}

impl Qp {
    /// The QP behind an `ibv_qp` (or `ibv_qp_ex`) we handed out.
    ///
    /// # Safety
    /// `qp` is NULL or came from [`create_qp`] and is not destroyed.
    pub(crate) unsafe fn from_raw<'a>(qp: *mut ibv_qp) -> Option<&'a Qp> {
        // SAFETY: `ex.raw.qp_base` is the first field of our `#[repr(C)]` Qp.
        unsafe { qp.cast::<Qp>().as_ref() }
    }

    /// The `roce-verbs` QP behind it.
    pub(crate) fn verbs_qp(&self) -> &roce_verbs::Qp {
        &self.ex.qp
    }
}

impl Deref for Qp {
    type Target = QpEx;

    fn deref(&self) -> &QpEx {
        &self.ex
    }
}

/// What both `ibv_create_qp` and `ibv_create_qp_ex` give.
struct Creation<'a> {
    pd: *mut ibv_pd,
    qp_context: *mut c_void,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut c_void,
    /// Updated to what was given.
    cap: &'a mut ibv_qp_cap,
    qp_type: u32,
    sq_sig_all: c_int,
    extended: bool,
}

/// `ibv_create_qp`: RC, UC or UD, in RESET; `init_attr.cap` is updated to what was given.
pub(crate) unsafe extern "C" fn create_qp(
    pd: *mut ibv_pd,
    init_attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    // SAFETY: the caller passes a writable init struct.
    let Some(init) = (unsafe { init_attr.as_mut() }) else {
        return fail_null("ibv_create_qp", EINVAL, &"NULL attributes");
    };
    // SAFETY: the caller passes a PD and CQs of ours.
    unsafe {
        create(Creation {
            pd,
            qp_context: init.qp_context,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            cap: &mut init.cap,
            qp_type: init.qp_type,
            sq_sig_all: init.sq_sig_all,
            extended: false,
        })
    }
}

/// `verbs_context.create_qp_ex` (the inline `ibv_create_qp_ex`): RC, UC or UD with a PD,
/// and the extended attributes rxe takes (`qp_ex::check_init_attr`). The QP has the work
/// request builders whatever its send ops flags, as rxe's.
pub(crate) unsafe extern "C" fn create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    const CALL: &str = "ibv_create_qp_ex";
    // SAFETY: the caller passes a writable init struct.
    let Some(init) = (unsafe { attr.as_mut() }) else {
        return fail_null(CALL, EINVAL, &"NULL attributes");
    };
    if init.qp_type == IBV_QPT_XRC_RECV {
        // SAFETY: the caller passes a domain of ours, when the mask says there is one.
        return unsafe { create_xrc_recv(context, init) };
    }
    if let Err((errno, why)) = qp_ex::check_init_attr(init) {
        return fail_null(CALL, errno, &why);
    }
    // SAFETY: the caller passes a PD of ours.
    let same_context = unsafe { Pd::from_raw(init.pd) }.is_some_and(|pd| pd.raw.context == context);
    if !same_context {
        return fail_null(CALL, EINVAL, &"a PD of another context");
    }
    // SAFETY: the caller passes a PD and CQs of ours.
    unsafe {
        create(Creation {
            pd: init.pd,
            qp_context: init.qp_context,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            cap: &mut init.cap,
            qp_type: init.qp_type,
            sq_sig_all: init.sq_sig_all,
            extended: true,
        })
    }
}

/// `ibv_qp_to_qp_ex`: the builders of a QP made by `ibv_create_qp_ex`; else NULL (errno
/// untouched, as rdma-core's).
pub(crate) unsafe extern "C" fn qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    // SAFETY: the caller passes a QP of ours.
    match unsafe { Qp::from_raw(qp) } {
        Some(ours) if ours.extended => qp.cast(),
        _ => {
            crate::log_failure("ibv_qp_to_qp_ex", &"QP not made by ibv_create_qp_ex");
            core::ptr::null_mut()
        }
    }
}

/// Creates a QP.
///
/// # Safety
/// `c.pd` is a PD of ours; the CQs and the SRQ are NULL or ours.
unsafe fn create(c: Creation) -> *mut ibv_qp {
    const CALL: &str = "ibv_create_qp";
    // SAFETY: per this function's contract.
    let Some(ours) = (unsafe { Pd::from_raw(c.pd) }) else {
        return fail_null(CALL, EINVAL, &"NULL PD");
    };
    // SAFETY: per this function's contract.
    let srq = unsafe { Srq::from_raw(c.srq) };
    let qp_type = match c.qp_type {
        IBV_QPT_RC => QpType::Rc,
        IBV_QPT_UC => QpType::Uc,
        IBV_QPT_UD => QpType::Ud,
        IBV_QPT_XRC_SEND => QpType::XrcSend,
        other => return fail_null(CALL, EOPNOTSUPP, &format!("QP type {other}")),
    };
    // An XRC initiator has no receive side: its receive CQ may be NULL.
    let recv_cq_raw = match (qp_type, c.recv_cq.is_null()) {
        (QpType::XrcSend, true) => c.send_cq,
        _ => c.recv_cq,
    };
    // SAFETY: per this function's contract.
    let (Some(send_cq), Some(recv_cq)) = (unsafe { Cq::from_raw(c.send_cq) }, unsafe {
        Cq::from_raw(recv_cq_raw)
    }) else {
        return fail_null(CALL, EINVAL, &"NULL CQ");
    };
    // SAFETY: a PD's context outlives it.
    let Some(context) = (unsafe { Context::from_raw(ours.raw.context) }) else {
        return fail_null(CALL, EINVAL, &"PD without a context");
    };
    let no_receives = srq.is_some() || qp_type == QpType::XrcSend;
    let Some(cap) = granted_cap(c.cap, no_receives, &context.device().query().limits) else {
        return fail_null(CALL, EINVAL, &"capabilities beyond the device's");
    };
    let attr = roce_verbs::QpInitAttr {
        qp_type,
        send_cq: &send_cq.cq,
        recv_cq: &recv_cq.cq,
        caps: QpCaps {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            max_inline_data: cap.max_inline_data,
        },
        sq_sig_all: c.sq_sig_all != 0,
    };
    let created = match srq {
        Some(srq) => ours.pd.create_qp_with_srq(&attr, &srq.srq),
        None => ours.pd.create_qp(&attr),
    };
    let qp = match created {
        Ok(qp) => qp,
        Err(error) => return fail_null(CALL, crate::errno_of(&error), &error),
    };
    let qp_num = qp.qp_num();
    let made = Qp::new(&c, ours.raw.context, qp, cap);
    let ptr = match Placement::place(Some(ours), RES_TYPE_QP, made) {
        Ok((ptr, placement)) => {
            // SAFETY: just placed, not yet handed out.
            unsafe { (*ptr).placement = placement };
            ptr
        }
        Err(errno) => return fail_null(CALL, errno, &"the parent domain's allocator"),
    };
    ours.users.fetch_add(1, Ordering::AcqRel);
    // Counted as `destroy_qp` uncounts them: by the pointers the caller gave.
    send_cq.users.fetch_add(1, Ordering::AcqRel);
    if !c.recv_cq.is_null() {
        recv_cq.users.fetch_add(1, Ordering::AcqRel);
    }
    if let Some(srq) = srq {
        srq.users.fetch_add(1, Ordering::AcqRel);
    }
    if let Ok(mut qps) = context.qps.lock() {
        qps.insert(qp_num, ptr as usize);
    }
    ptr.cast()
}

/// An XRC target QP of the domain `init.xrcd` (`ibv_create_qp_ex` with `IBV_QPT_XRC_RECV`
/// and `IBV_QP_INIT_ATTR_XRCD`): no PD, CQs or caps.
///
/// # Safety
/// `init.xrcd` is NULL or a domain of ours; `context` is open.
unsafe fn create_xrc_recv(
    context: *mut ibv_context,
    init: &mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    const CALL: &str = "ibv_create_qp_ex";
    if init.comp_mask & IBV_QP_INIT_ATTR_XRCD == 0 {
        return fail_null(CALL, EINVAL, &"an XRC target QP without its XRC domain");
    }
    // SAFETY: per this function's contract.
    let Some(xrcd) = (unsafe { crate::xrc::Xrcd::from_raw(init.xrcd.cast()) }) else {
        return fail_null(CALL, EINVAL, &"NULL XRC domain");
    };
    let qp = match xrcd.create_recv_qp() {
        Ok(qp) => qp,
        Err(error) => return fail_null(CALL, crate::errno_of(&error), &error),
    };
    init.cap = ibv_qp_cap::default();
    // SAFETY: per this function's contract.
    unsafe { wrap_xrc_recv(context, init.qp_context, qp, true) }
}

/// Our `ibv_qp` around XRC target `qp` (created, or opened again); only the creator's is
/// the one async events name.
///
/// # Safety
/// `context` is open.
unsafe fn wrap_xrc_recv(
    context: *mut ibv_context,
    qp_context: *mut c_void,
    qp: roce_verbs::Qp,
    creator: bool,
) -> *mut ibv_qp {
    let c = Creation {
        pd: core::ptr::null_mut(),
        qp_context,
        send_cq: core::ptr::null_mut(),
        recv_cq: core::ptr::null_mut(),
        srq: core::ptr::null_mut(),
        cap: &mut ibv_qp_cap::default(),
        qp_type: IBV_QPT_XRC_RECV,
        sq_sig_all: 0,
        extended: false,
    };
    let qp_num = qp.qp_num();
    let ptr = Box::into_raw(Box::new(Qp::new(&c, context, qp, ibv_qp_cap::default())));
    // SAFETY: per this function's contract.
    if let (true, Some(ours)) = (creator, unsafe { Context::from_raw(context) }) {
        if let Ok(mut qps) = ours.qps.lock() {
            qps.insert(qp_num, ptr as usize);
        }
    }
    ptr.cast()
}

/// `verbs_context.open_qp` (`ibv_open_qp`): another handle to the XRC target QP `qp_num`
/// of the domain `xrcd`, which lives until its last handle is destroyed. The number, the
/// domain and the type (`IBV_QPT_XRC_RECV`) must be given (`EINVAL`); a QP of another
/// domain, or none, is `EINVAL` too.
pub(crate) unsafe extern "C" fn open_qp(
    context: *mut ibv_context,
    attr: *mut ibv_qp_open_attr,
) -> *mut ibv_qp {
    const CALL: &str = "ibv_open_qp";
    // SAFETY: the caller passes an open context and the attributes.
    let (Some(ours), Some(attr)) = (unsafe { Context::from_raw(context) }, unsafe {
        attr.as_ref()
    }) else {
        return fail_null(CALL, EINVAL, &"NULL context or attributes");
    };
    let needed = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
    if attr.comp_mask >= IBV_QP_OPEN_ATTR_RESERVED || attr.comp_mask & needed != needed {
        return fail_null(CALL, EINVAL, &"no QP number, XRC domain or type");
    }
    if attr.qp_type != IBV_QPT_XRC_RECV {
        return fail_null(CALL, EINVAL, &"only XRC target QPs are opened");
    }
    // SAFETY: the caller passes a domain of ours.
    let Some(xrcd) = (unsafe { crate::xrc::Xrcd::from_raw(attr.xrcd) }) else {
        return fail_null(CALL, EINVAL, &"NULL XRC domain");
    };
    let creator = ours
        .qps
        .lock()
        .ok()
        .and_then(|qps| qps.get(&attr.qp_num).copied());
    // SAFETY: the context's map holds QPs of ours that are not destroyed.
    let found = creator.and_then(|ptr| unsafe { Qp::from_raw(ptr as *mut ibv_qp) });
    let Some(found) = found.filter(|qp| qp.qp.xrcd_id() == Some(xrcd.id())) else {
        return fail_null(
            CALL,
            EINVAL,
            &"no XRC target QP of this number in the domain",
        );
    };
    let qp_context = if attr.comp_mask & IBV_QP_OPEN_ATTR_CONTEXT != 0 {
        attr.qp_context
    } else {
        core::ptr::null_mut()
    };
    match found.qp.open_xrc_recv() {
        // SAFETY: `context` is open.
        Ok(qp) => unsafe { wrap_xrc_recv(context, qp_context, qp, false) },
        Err(error) => fail_null(CALL, crate::errno_of(&error), &error),
    }
}

/// The capabilities a QP gets, written back into `cap`; `None` if they exceed the device's.
/// A QP on an SRQ has no receive queue: rxe ignores and reports 0 for its caps.
fn granted_cap(
    cap: &mut ibv_qp_cap,
    on_srq: bool,
    limits: &roce_transport::DeviceLimits,
) -> Option<ibv_qp_cap> {
    if on_srq {
        cap.max_recv_wr = 0;
        cap.max_recv_sge = 0;
    }
    let within = cap.max_send_wr <= limits.max_qp_wr
        && cap.max_recv_wr <= limits.max_qp_wr
        && cap.max_send_sge <= limits.max_sge
        && cap.max_recv_sge <= limits.max_sge
        && cap.max_inline_data <= MAX_INLINE_DATA;
    within.then_some(*cap)
}

impl Qp {
    /// Our QP around a created `qp`, as `c` asked for it in `context`.
    fn new(c: &Creation, context: *mut ibv_context, qp: roce_verbs::Qp, cap: ibv_qp_cap) -> Qp {
        let qp_base = ibv_qp {
            context,
            qp_context: c.qp_context,
            pd: c.pd,
            send_cq: c.send_cq,
            recv_cq: c.recv_cq,
            srq: c.srq,
            handle: 0,
            qp_num: qp.qp_num(),
            state: 0,
            qp_type: c.qp_type,
            mutex: [0; 5],
            cond: [0; 6],
            events_completed: 0,
        };
        Qp {
            ex: QpEx::new(qp_base, qp),
            cap,
            sq_sig_all: c.sq_sig_all,
            attr: Mutex::new(ibv_qp_attr {
                cap,
                ..ibv_qp_attr::default()
            }),
            extended: c.extended,
            placement: Placement::Heap,
        }
    }
}

/// `ibv_destroy_qp`.
pub(crate) unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    // SAFETY: the caller passes a QP of ours.
    let Some(ours) = (unsafe { Qp::from_raw(qp) }) else {
        return EINVAL;
    };
    // uverbs refuses to destroy a QP still attached to a multicast group.
    if ours.qp.mcast_attachments() > 0 {
        crate::log_failure("ibv_destroy_qp", &"still attached to a multicast group");
        return EBUSY;
    }
    let placement = ours.placement;
    // SAFETY: a QP's context, PD and CQs outlive it (they cannot go while it uses them).
    unsafe {
        if let Some(context) = Context::from_raw(ours.raw.qp_base.context) {
            if let Ok(mut qps) = context.qps.lock() {
                qps.remove(&ours.raw.qp_base.qp_num);
            }
        }
        for cq in [ours.raw.qp_base.send_cq, ours.raw.qp_base.recv_cq] {
            if let Some(cq) = Cq::from_raw(cq) {
                cq.users.fetch_sub(1, Ordering::AcqRel);
            }
        }
        if let Some(pd) = Pd::from_raw(ours.raw.qp_base.pd) {
            pd.users.fetch_sub(1, Ordering::AcqRel);
        }
        if let Some(srq) = Srq::from_raw(ours.raw.qp_base.srq) {
            srq.users.fetch_sub(1, Ordering::AcqRel);
        }
        // Placed by `create`; the caller gives it up.
        placement.release(qp.cast::<Qp>());
    }
    0
}

fn qp_state(value: u32) -> Option<QpState> {
    Some(match value {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        6 => QpState::Err,
        _ => return None,
    })
}

fn state_value(state: QpState) -> u32 {
    match state {
        QpState::Reset => 0,
        QpState::Init => 1,
        QpState::Rtr => 2,
        QpState::Rts => 3,
        QpState::Sqd => 4,
        QpState::Sqe => 5,
        QpState::Err => 6,
    }
}

/// rdma-core's attribute mask as [`QpAttr`]'s `Some` fields; the attributes this transport
/// has no use for (alternate path, SQD notification, caps) are `EINVAL`; the rate limit
/// is [`modify_qp`]'s.
fn qp_attr(attr: &ibv_qp_attr, mask: c_int) -> Result<QpAttr, &'static str> {
    use crate::abi::qp_mask::*;
    let known = STATE
        | CUR_STATE
        | ACCESS_FLAGS
        | PKEY_INDEX
        | PORT
        | QKEY
        | AV
        | PATH_MTU
        | TIMEOUT
        | RETRY_CNT
        | RNR_RETRY
        | RQ_PSN
        | MAX_QP_RD_ATOMIC
        | MIN_RNR_TIMER
        | SQ_PSN
        | MAX_DEST_RD_ATOMIC
        | DEST_QPN
        | RATE_LIMIT;
    if mask & !known != 0 {
        return Err("attributes this device does not take");
    }
    // What the mask names, each checked as it is read (fields evaluate in order, so the
    // first bad attribute is the one reported).
    let given = |bit: c_int| mask & bit != 0;
    Ok(QpAttr {
        state: given(STATE)
            .then(|| qp_state(attr.qp_state).ok_or("qp_state"))
            .transpose()?,
        cur_state: given(CUR_STATE)
            .then(|| qp_state(attr.cur_qp_state).ok_or("cur_qp_state"))
            .transpose()?,
        // Bits beyond the four we enforce (relaxed ordering, ...) are accepted and ignored.
        access_flags: given(ACCESS_FLAGS)
            .then(|| AccessFlags::from_bits_truncate(attr.qp_access_flags as u32)),
        pkey_index: given(PKEY_INDEX)
            .then_some(attr.pkey_index)
            .map(|index| match index {
                0 => Ok(index),
                _ => Err("pkey_index (the table has one entry)"),
            })
            .transpose()?,
        port_num: given(PORT).then_some(attr.port_num),
        qkey: given(QKEY).then_some(attr.qkey),
        av: given(AV)
            .then(|| address_vector(&attr.ah_attr))
            .transpose()?,
        path_mtu: given(PATH_MTU)
            .then(|| PathMtu::from_code(attr.path_mtu).ok_or("path_mtu"))
            .transpose()?,
        dest_qp_num: given(DEST_QPN).then_some(attr.dest_qp_num),
        timeout: given(TIMEOUT).then_some(attr.timeout),
        retry_cnt: given(RETRY_CNT).then_some(attr.retry_cnt),
        rnr_retry: given(RNR_RETRY).then_some(attr.rnr_retry),
        rq_psn: given(RQ_PSN).then(|| Psn::new(attr.rq_psn & 0xFF_FFFF)),
        max_rd_atomic: given(MAX_QP_RD_ATOMIC).then_some(attr.max_rd_atomic),
        min_rnr_timer: given(MIN_RNR_TIMER)
            .then_some(attr.min_rnr_timer)
            .map(|timer| match timer {
                0..=31 => Ok(RnrTimer::new(timer)),
                _ => Err("min_rnr_timer"),
            })
            .transpose()?,
        sq_psn: given(SQ_PSN).then(|| Psn::new(attr.sq_psn & 0xFF_FFFF)),
        max_dest_rd_atomic: given(MAX_DEST_RD_ATOMIC).then_some(attr.max_dest_rd_atomic),
    })
}

/// Copies the attributes `mask` names from `from` into `into` (what `ibv_query_qp` will
/// report).
fn remember(into: &mut ibv_qp_attr, from: &ibv_qp_attr, mask: c_int) {
    use crate::abi::qp_mask::*;
    let has = |bit: c_int| mask & bit != 0;
    if has(ACCESS_FLAGS) {
        into.qp_access_flags = from.qp_access_flags;
    }
    if has(PKEY_INDEX) {
        into.pkey_index = from.pkey_index;
    }
    if has(PORT) {
        into.port_num = from.port_num;
    }
    if has(QKEY) {
        into.qkey = from.qkey;
    }
    if has(AV) {
        into.ah_attr = from.ah_attr;
    }
    if has(PATH_MTU) {
        into.path_mtu = from.path_mtu;
    }
    if has(TIMEOUT) {
        into.timeout = from.timeout;
    }
    if has(RETRY_CNT) {
        into.retry_cnt = from.retry_cnt;
    }
    if has(RNR_RETRY) {
        into.rnr_retry = from.rnr_retry;
    }
    if has(RQ_PSN) {
        into.rq_psn = from.rq_psn;
    }
    if has(MAX_QP_RD_ATOMIC) {
        into.max_rd_atomic = from.max_rd_atomic;
    }
    if has(MIN_RNR_TIMER) {
        into.min_rnr_timer = from.min_rnr_timer;
    }
    if has(SQ_PSN) {
        into.sq_psn = from.sq_psn;
    }
    if has(MAX_DEST_RD_ATOMIC) {
        into.max_dest_rd_atomic = from.max_dest_rd_atomic;
    }
    if has(DEST_QPN) {
        into.dest_qp_num = from.dest_qp_num;
    }
}

/// `ibv_modify_qp`: 0 or an errno (`EINVAL` for a transition or mask rdma-core refuses).
pub(crate) unsafe extern "C" fn modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    // SAFETY: the caller passes a QP of ours and its attributes.
    let (Some(ours), Some(attr)) = (unsafe { Qp::from_raw(qp) }, unsafe { attr.as_ref() }) else {
        return EINVAL;
    };
    let wanted = match qp_attr(attr, mask) {
        Ok(wanted) => wanted,
        Err(why) => {
            crate::log_failure("ibv_modify_qp", &why);
            return EINVAL;
        }
    };
    // IBV_QP_RATE_LIMIT is an attribute of RTR → RTS and RTS → RTS (the kernel's table):
    // refused before anything changes when the QP does not end in RTS.
    let rate_limit = (mask & qp_mask::RATE_LIMIT != 0).then_some(attr.rate_limit);
    if rate_limit.is_some() && wanted.state.map_or(ours.qp.state().ok(), Some) != Some(QpState::Rts)
    {
        crate::log_failure(
            "ibv_modify_qp",
            &"rate_limit outside RTR → RTS and RTS → RTS",
        );
        return EINVAL;
    }
    if let Err(error) = ours.qp.modify(&wanted) {
        crate::log_failure("ibv_modify_qp", &error);
        return crate::errno_of(&error);
    }
    if let Some(kbps) = rate_limit {
        if let Err(error) = ours.qp.set_rate_limit(rate_limit_of(kbps, 0)) {
            crate::log_failure("ibv_modify_qp", &error);
            return crate::errno_of(&error);
        }
    }
    if let Ok(mut known) = ours.attr.lock() {
        remember(&mut known, attr, mask);
    }
    if let Some(state) = wanted.state {
        // SAFETY: `state` is the one field of `ibv_qp` callers read that changes; rdma-core
        // writes it the same way after a successful modify.
        unsafe { (*qp).state = state_value(state) };
    }
    0
}

/// A rate limit of `kbps` kbit/s (0: none) with bursts of `max_burst` bytes.
fn rate_limit_of(kbps: u32, max_burst: u32) -> Option<RateLimit> {
    (kbps > 0).then_some(RateLimit {
        rate: Rate(u64::from(kbps)),
        max_burst,
    })
}

/// `ibv_modify_qp_rate_limit`: paces what the QP sends to `rate_limit` kbit/s (0 removes
/// the limit), in bursts of up to `max_burst_sz` bytes (0: one packet); `typical_pkt_sz` is
/// a hint the token bucket has no use for. Only in RTR, RTS or SQD (`EINVAL` otherwise, or
/// for an unknown `comp_mask`).
pub(crate) unsafe extern "C" fn modify_qp_rate_limit(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_rate_limit_attr,
) -> c_int {
    // SAFETY: the caller passes a QP of ours and its attributes.
    let (Some(ours), Some(attr)) = (unsafe { Qp::from_raw(qp) }, unsafe { attr.as_ref() }) else {
        return EINVAL;
    };
    if attr.comp_mask != 0 {
        crate::log_failure("ibv_modify_qp_rate_limit", &"comp_mask");
        return EINVAL;
    }
    match ours
        .qp
        .set_rate_limit(rate_limit_of(attr.rate_limit, attr.max_burst_sz))
    {
        Ok(()) => 0,
        Err(error) => {
            crate::log_failure("ibv_modify_qp_rate_limit", &error);
            crate::errno_of(&error)
        }
    }
}

/// `ibv_query_qp`: the attributes given so far, the current state, and the creation
/// attributes.
pub(crate) unsafe extern "C" fn query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the caller passes a QP of ours and writable structs.
    let (Some(ours), Some(attr), Some(init)) = (
        unsafe { Qp::from_raw(qp) },
        unsafe { attr.as_mut() },
        unsafe { init_attr.as_mut() },
    ) else {
        return EINVAL;
    };
    let state = match ours.qp.state() {
        Ok(state) => state_value(state),
        Err(error) => return crate::errno_of(&error),
    };
    let retry = match ours.qp.retry() {
        Ok(retry) => retry,
        Err(error) => return crate::errno_of(&error),
    };
    let Ok(known) = ours.attr.lock() else {
        return EINVAL;
    };
    // What the program set, but the retry settings as they are: rdma_cm moves a QP to RTS
    // without ibv_modify_qp (rdma_accept, the REP's RTS), with the ACK timeout
    // rdma_set_option gave.
    *attr = ibv_qp_attr {
        qp_state: state,
        cur_qp_state: state,
        cap: ours.cap,
        timeout: retry.timeout,
        retry_cnt: retry.retry_cnt,
        rnr_retry: retry.rnr_retry,
        ..*known
    };
    *init = ibv_qp_init_attr {
        qp_context: ours.raw.qp_base.qp_context,
        send_cq: ours.raw.qp_base.send_cq,
        recv_cq: ours.raw.qp_base.recv_cq,
        srq: core::ptr::null_mut(),
        cap: ours.cap,
        qp_type: ours.raw.qp_base.qp_type,
        sq_sig_all: ours.sq_sig_all,
    };
    0
}

/// One `ibv_send_wr` as a [`SendWr`]; `ud` says whether the QP is UD (only then does the
/// `wr` union hold an address handle).
///
/// # Safety
/// `wr` is a valid work request of the caller's.
unsafe fn send_wr(wr: &ibv_send_wr, ud_qp: bool) -> Result<SendWr, c_int> {
    // SAFETY: the union member read is the one `opcode` selects.
    let (rdma, atomic, ud) = unsafe { (wr.wr.rdma, wr.wr.atomic, wr.wr.ud) };
    let imm = u32::from_be(wr.imm_data);
    let op = match wr.opcode {
        IBV_WR_SEND => SendOp::Send,
        IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm(imm),
        IBV_WR_SEND_WITH_INV => SendOp::SendWithInv(wr.imm_data),
        IBV_WR_RDMA_WRITE => SendOp::RdmaWrite {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::RdmaWriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
            imm,
        },
        IBV_WR_RDMA_READ => SendOp::RdmaRead {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            add: atomic.compare_add,
        },
        IBV_WR_LOCAL_INV => SendOp::LocalInv(wr.imm_data),
        // SAFETY: a bind names a window of ours and a region of the caller's.
        IBV_WR_BIND_MW => unsafe { crate::mw::bind_op(&wr.bind_mw) }?,
        _ => return Err(EINVAL),
    };
    let flags = SendFlags::from_bits_truncate(wr.send_flags);
    // SAFETY: the caller's list of `num_sge` elements.
    let mut sg = unsafe { sg_list(wr.sg_list, wr.num_sge) }?;
    let mut inline_data = Vec::new();
    if flags.contains(SendFlags::INLINE) && !op.is_read_or_atomic() {
        // SAFETY: the caller's buffers, as the elements describe them.
        unsafe { inline_bytes(&sg, &mut inline_data) }?;
        sg.clear();
    }
    let ud = if ud_qp {
        // SAFETY: a UD request's address handle is one of ours.
        let ah = unsafe { Ah::from_raw(ud.ah) }.ok_or(EINVAL)?;
        Some(ah.handle.dest(ud.remote_qpn, ud.remote_qkey))
    } else {
        None
    };
    Ok(SendWr {
        wr_id: wr.wr_id,
        op,
        sg_list: sg,
        inline_data,
        flags,
        ud,
        xrc_srqn: wr.remote_srqn,
    })
}

/// `ops.post_send`.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the caller passes a QP of ours.
    let Some(ours) = (unsafe { Qp::from_raw(qp) }) else {
        return EINVAL;
    };
    let ud_qp = ours.raw.qp_base.qp_type == IBV_QPT_UD;
    // SAFETY: the walk passes only requests of the caller's list, which are valid.
    let convert = |wr: &ibv_send_wr| unsafe { send_wr(wr, ud_qp) };
    // SAFETY: the caller passes a valid list and `bad_wr`.
    unsafe {
        post_list(
            wr,
            bad_wr,
            convert,
            |wr| wr.next,
            |walk| ours.qp.post_send(walk),
        )
    }
}

/// `ops.post_recv`.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller passes a QP of ours.
    let Some(ours) = (unsafe { Qp::from_raw(qp) }) else {
        return EINVAL;
    };
    // SAFETY: the caller passes a valid list and `bad_wr`.
    unsafe { post_recv_list(wr, bad_wr, |walk| ours.qp.post_recv(walk)) }
}
