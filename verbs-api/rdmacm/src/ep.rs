//! Synchronous endpoints (`rdma_create_ep`, `rdma_destroy_ep`, `rdma_get_request`), as
//! rdma_server and rdma_client use them.

use core::ffi::{c_int, c_void};

use roce_cabi::set_errno;

use crate::abi::*;
use crate::calls::{bind_addr, resolve_addr, resolve_route};
use crate::channel::Channel;
use crate::event;
use crate::id::{create_id, destroy_id, with_id, Id};
use crate::qp::{create_qp, destroy_qp};

const EINVAL: c_int = 22;

/// `rdma_create_ep`: a synchronous id from `rdma_getaddrinfo`'s answer: a passive one bound
/// to its source (its requests get QPs as `attr` says), an active one with its address and
/// route resolved and, given `attr`, its QP.
pub unsafe extern "C" fn create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut c_void,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the caller passes an rdma_getaddrinfo answer.
    let Some(info) = (unsafe { res.as_ref() }) else {
        set_errno(EINVAL);
        return -1;
    };
    if id.is_null() {
        set_errno(EINVAL);
        return -1;
    }
    let mut made = core::ptr::null_mut();
    // SAFETY: no channel: a synchronous id.
    if unsafe {
        create_id(
            core::ptr::null_mut(),
            &mut made,
            core::ptr::null_mut(),
            info.ai_port_space,
        )
    } != 0
    {
        return -1;
    }
    // As rdma-core: the QP's type is the answer's (programs leave it zero).
    // SAFETY: the caller passes NULL or a QP init attr.
    if let Some(attr) = unsafe { attr.as_mut() } {
        attr.qp_type = u32::try_from(info.ai_qp_type).unwrap_or(IBV_QPT_RC);
    }
    let done = if info.ai_flags & RAI_PASSIVE != 0 {
        // SAFETY: an id just made and the answer's source address.
        let bound = unsafe { bind_addr(made, info.ai_src_addr) };
        if bound == 0 {
            // SAFETY: the id just made.
            let ours = unsafe { Id::from_raw(made) };
            // SAFETY: the caller's QP attributes (or NULL).
            let attr = unsafe { attr.as_ref() };
            if let (Some(ours), Some(attr)) = (ours, attr) {
                if let Ok(mut inner) = ours.lock() {
                    inner.ep_qp = Some((pd, *attr));
                }
            }
        }
        bound
    } else {
        // SAFETY: an id just made and the answer's addresses; the QP attr is the caller's.
        unsafe {
            let mut done = resolve_addr(made, info.ai_src_addr, info.ai_dst_addr, 2000);
            if done == 0 {
                done = resolve_route(made, 2000);
            }
            if done == 0 && !attr.is_null() {
                done = create_qp(made, pd, attr);
            }
            done
        }
    };
    if done != 0 {
        let errno = crate::errors::errno();
        // SAFETY: the id just made, not handed out.
        unsafe { destroy_id(made) };
        set_errno(errno);
        return -1;
    }
    // SAFETY: checked not null; the caller's out pointer.
    unsafe { *id = made };
    0
}

/// `rdma_destroy_ep`: the id's QP (and what `rdma_create_qp` made for it), then the id.
pub unsafe extern "C" fn destroy_ep(id: *mut rdma_cm_id) {
    // SAFETY: the caller passes an id of ours, not used after.
    unsafe {
        destroy_qp(id);
        destroy_id(id);
    }
}

/// `rdma_get_request`: waits on a synchronous listener for a connect request; the new id
/// is synchronous too and, after `rdma_create_ep` with a QP attr, has its QP.
pub unsafe extern "C" fn get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int {
    with_id(listen, |listener| {
        if id.is_null() {
            return Err(EINVAL);
        }
        let (channel, ep_qp) = {
            let inner = listener.lock()?;
            let channel = inner.own_channel.as_deref().ok_or(EINVAL)?;
            (core::ptr::from_ref::<Channel>(channel), inner.ep_qp)
        };
        // SAFETY: the listener's own channel lives as long as the listener.
        let event = unsafe { event::next(channel) }?;
        if event.what().0 != 4 {
            return Err(EINVAL);
        }
        let made = event.id();
        // SAFETY: the new id the request made.
        let ours = unsafe { Id::from_raw(made) }.ok_or(EINVAL)?;
        ours.make_synchronous()?;
        if let Some((pd, mut attr)) = ep_qp {
            // SAFETY: the new id, the PD and attr `rdma_create_ep` was given.
            if unsafe { create_qp(made, pd, &mut attr) } != 0 {
                return Err(crate::errors::errno());
            }
        }
        // SAFETY: checked not null; the caller's out pointer.
        unsafe { *id = made };
        Ok(())
    })
}
