//! An id's QP (`rdma_create_qp`, `rdma_create_qp_ex`, `rdma_destroy_qp`): made through
//! our libibverbs, with the id's PD and new CQs where the caller gives none, and moved as
//! rdma-core moves it (an RC QP to INIT, a UD QP on to RTS).

use core::ffi::{c_int, c_void};

use roce_cabi::set_errno;
use std::sync::MutexGuard;

use roce_verbs::{CmId, QpState};

use crate::abi::*;
use crate::id::{with_id, Id, Inner};
use crate::qp_attr;
use crate::verbs::{self, Opened};

const EINVAL: c_int = 22;
const EOPNOTSUPP: c_int = 95;

/// Depth of the CQs `rdma_create_qp` makes when the caller gives none.
const DEFAULT_CQ_DEPTH: c_int = 64;

/// What `rdma_create_qp` and `rdma_create_qp_ex` read and fill alike in their init
/// attributes.
trait InitAttr {
    fn qp_type(&self) -> u32;
    /// The send and receive CQs (NULL: the id makes them).
    fn cqs(&mut self) -> [&mut *mut c_void; 2];
}

impl InitAttr for ibv_qp_init_attr {
    fn qp_type(&self) -> u32 {
        self.qp_type
    }
    fn cqs(&mut self) -> [&mut *mut c_void; 2] {
        [&mut self.send_cq, &mut self.recv_cq]
    }
}

impl InitAttr for ibv_qp_init_attr_ex {
    fn qp_type(&self) -> u32 {
        self.qp_type
    }
    fn cqs(&mut self) -> [&mut *mut c_void; 2] {
        [&mut self.send_cq, &mut self.recv_cq]
    }
}

/// `rdma_create_qp`: a QP of the id's type through our libibverbs, with the id's PD and
/// new CQs where the caller gives none, moved as rdma-core moves it (RC to INIT with no
/// remote access until the exchange sets it, UD on to RTS); `id->qp` is set.
pub unsafe extern "C" fn create_qp(
    id: *mut rdma_cm_id,
    pd: *mut c_void,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the caller passes a writable init attr, used only within this call.
    let Some(init) = (unsafe { attr.as_mut() }) else {
        set_errno(EINVAL);
        return -1;
    };
    attach_qp(id, "rdma_create_qp", pd, init, |verbs, _, pd, init| {
        // SAFETY: a PD of our libibverbs and a complete init attr, whose caps
        // ibv_create_qp sets to those granted, as it does to its argument.
        unsafe { (verbs.create_qp)(pd, init) }
    })
}

/// `rdma_create_qp_ex` (perftest's `-R` uses it for the work request builders): as
/// `rdma_create_qp`, through the device's `create_qp_ex` op, with the caller's extended
/// attributes (`attr->pd` the id's when the caller gives none).
pub unsafe extern "C" fn create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    // SAFETY: the caller passes a writable init attr, used only within this call.
    let Some(init) = (unsafe { attr.as_mut() }) else {
        set_errno(EINVAL);
        return -1;
    };
    let pd = if init.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
        core::ptr::null_mut()
    } else {
        init.pd
    };
    attach_qp(id, "rdma_create_qp_ex", pd, init, |_, device, pd, init| {
        init.pd = pd;
        init.comp_mask |= IBV_QP_INIT_ATTR_PD;
        // SAFETY: our libibverbs' contexts are `verbs_context`s (verbs.h's layout), so the
        // op sits at this fixed distance before the `ibv_context`.
        let create = unsafe {
            device
                .ibv
                .cast::<u8>()
                .sub(CREATE_QP_EX_BEFORE_CONTEXT)
                .cast::<Option<CreateQpEx>>()
                .read()
        };
        match create {
            // SAFETY: the device's own op, its context and a complete init attr.
            Some(create) => unsafe { create(device.ibv, init) },
            None => {
                set_errno(EOPNOTSUPP);
                core::ptr::null_mut()
            }
        }
    })
}

/// What `rdma_create_qp` and `rdma_create_qp_ex` share: a QP of the id's type, the id's PD
/// and new CQs where the caller has none, the QP `make` creates moved and set as `id->qp`.
fn attach_qp<A: InitAttr>(
    id: *mut rdma_cm_id,
    call: &str,
    pd: *mut c_void,
    init: &mut A,
    make: impl FnOnce(&verbs::Verbs, Opened, *mut c_void, &mut A) -> *mut ibv_qp,
) -> c_int {
    with_id(id, |ours| {
        let verbs = verbs::verbs()?;
        let mut inner = ours.lock()?;
        if c_int::try_from(init.qp_type()) != Ok(ours.raw(&mut inner).qp_type) {
            let why = "a QP of the id's type (RC for TCP ids, UD for UDP ids)";
            crate::errors::log_failure(call, &why);
            return Err(EOPNOTSUPP);
        }
        let device = inner.device.ok_or(EINVAL)?;
        let pd = id_pd(ours, &mut inner, verbs, device, pd)?;
        for (send, cq) in [true, false].into_iter().zip(init.cqs()) {
            if cq.is_null() {
                *cq = make_cq(ours, &mut inner, verbs, device, send)?;
            }
        }
        let qp = make(verbs, device, pd, init);
        if qp.is_null() {
            return Err(crate::errors::errno());
        }
        if let Err(errno) = move_qp(Id::cm(&inner)?, verbs, qp, init.qp_type()) {
            // SAFETY: the QP just made, not handed out.
            unsafe { (verbs.destroy_qp)(qp) };
            return Err(errno);
        }
        ours.raw(&mut inner).qp = qp;
        Ok(())
    })
}

/// The PD a QP of the id is made with: the caller's, else the id's (allocated once).
fn id_pd(
    ours: &Id,
    inner: &mut MutexGuard<'_, Inner>,
    verbs: &verbs::Verbs,
    device: Opened,
    caller: *mut c_void,
) -> Result<*mut c_void, c_int> {
    let pd = match (caller.is_null(), ours.raw(inner).pd.is_null()) {
        (false, _) => caller,
        (true, false) => ours.raw(inner).pd,
        (true, true) => {
            // SAFETY: an open context of our libibverbs.
            let made = unsafe { (verbs.alloc_pd)(device.ibv) };
            if made.is_null() {
                return Err(crate::errors::errno());
            }
            made
        }
    };
    ours.raw(inner).pd = pd;
    Ok(pd)
}

/// A send or receive CQ of the id, with its completion channel (`id->send_cq_channel`
/// ...), destroyed with the QP.
fn make_cq(
    ours: &Id,
    inner: &mut MutexGuard<'_, Inner>,
    verbs: &verbs::Verbs,
    device: Opened,
    send: bool,
) -> Result<*mut c_void, c_int> {
    // SAFETY: an open context of our libibverbs.
    let comp = unsafe { (verbs.create_comp_channel)(device.ibv) };
    if comp.is_null() {
        return Err(crate::errors::errno());
    }
    inner.made.push((verbs.destroy_comp_channel, comp));
    // SAFETY: an open context and its channel.
    let made =
        unsafe { (verbs.create_cq)(device.ibv, DEFAULT_CQ_DEPTH, ours.as_raw().cast(), comp, 0) };
    if made.is_null() {
        return Err(crate::errors::errno());
    }
    // The CQ goes before its channel.
    inner.made.insert(0, (verbs.destroy_cq, made));
    let raw = ours.raw(inner);
    if send {
        raw.send_cq = made;
        raw.send_cq_channel = comp;
    } else {
        raw.recv_cq = made;
        raw.recv_cq_channel = comp;
    }
    Ok(made)
}

/// As rdma-core: an RC QP waits in INIT for the exchange; a UD QP goes on to RTS. Each
/// step with `rdma_init_qp_attr`'s attributes.
fn move_qp(cm: &CmId, verbs: &verbs::Verbs, qp: *mut ibv_qp, qp_type: u32) -> Result<(), c_int> {
    let steps: &[QpState] = if qp_type == IBV_QPT_UD {
        &[QpState::Init, QpState::Rtr, QpState::Rts]
    } else {
        &[QpState::Init]
    };
    for &state in steps {
        let answer = cm
            .qp_attr(state)
            .map_err(|error| crate::errors::fail("rdma_create_qp", &error))?;
        let mut attr = ibv_qp_attr::default();
        let mask = qp_attr::to_c(&answer, &mut attr);
        // SAFETY: the QP just made, and an attr complete for `mask`.
        let moved = unsafe { (verbs.modify_qp)(qp, &mut attr, mask) };
        if moved != 0 {
            return Err(moved);
        }
    }
    Ok(())
}

/// `rdma_destroy_qp`: the id's QP, and the CQs `rdma_create_qp` made for it.
pub unsafe extern "C" fn destroy_qp(id: *mut rdma_cm_id) {
    with_id(id, |ours| {
        let verbs = verbs::verbs()?;
        let mut inner = ours.lock()?;
        let raw = ours.raw(&mut inner);
        let qp = core::mem::replace(&mut raw.qp, core::ptr::null_mut());
        if !qp.is_null() {
            // SAFETY: the id's QP, destroyed once.
            unsafe { (verbs.destroy_qp)(qp) };
        }
        for (destroy, object) in core::mem::take(&mut inner.made) {
            // SAFETY: objects this library made for the id, destroyed once, CQs first.
            unsafe { destroy(object) };
        }
        Ok(())
    });
}
