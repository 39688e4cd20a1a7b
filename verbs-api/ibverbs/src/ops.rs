//! Opening and closing a device, and the function tables of an opened context: the layer
//! above the objects, which wires their entry points (`ops.poll_cq`, `ops.post_send`,
//! `create_qp_ex`, ...) into the `verbs_context` the caller gets, and tells `stats` when a
//! context comes and goes.

use core::ffi::{c_int, c_void};

use crate::abi::*;
use crate::context::{self, query_port_ex, Context};
use crate::logging::fail_null;
use crate::{cq, handles, mw, pd, qp, srq, stats, tm, xrc};

/// `ibv_open_device`.
pub(crate) unsafe extern "C" fn open_device(device: *mut ibv_device) -> *mut ibv_context {
    // SAFETY: the caller passes NULL or a device from the list.
    let context = unsafe { context::open_device(device, table) };
    // SAFETY: NULL or just opened.
    if let Some(ours) = unsafe { Context::from_raw(context) } {
        stats::opened(ours);
    }
    context
}

/// `ibv_import_device`: another context in the object space of `cmd_fd` (a context's
/// `cmd_fd` or a dup of it; see `handles`), which takes the fd over and closes it when it is
/// closed. An fd that is not open fails with `EBADF`, one of no context with `EINVAL`.
pub(crate) unsafe extern "C" fn import_device(cmd_fd: c_int) -> *mut ibv_context {
    // SAFETY: `ibv_import_device` takes the fd over when it succeeds.
    match unsafe { handles::import_cmd_fd(cmd_fd) } {
        Ok((device, fd)) => {
            // SAFETY: the device of a context we opened, from the list.
            let context = unsafe { context::open_device_with(device, table, fd) };
            // SAFETY: NULL or just opened.
            if let Some(ours) = unsafe { Context::from_raw(context) } {
                stats::opened(ours);
            }
            context
        }
        Err(errno) => fail_null("ibv_import_device", errno, &"not a context's cmd_fd"),
    }
}

/// `ibv_close_device`: reports the device's counters (`ROCE_STATS`), then closes it.
pub(crate) unsafe extern "C" fn close_device(context: *mut ibv_context) -> c_int {
    // SAFETY: the caller passes an open context.
    if let Some(ours) = unsafe { Context::from_raw(context) } {
        stats::closing(ours);
    }
    // SAFETY: the caller passes an open context and never uses it again.
    unsafe { context::close_device(context) }
}

/// The tables of a context on `device` whose `async_fd` is `async_fd`.
fn table(device: *mut ibv_device, async_fd: c_int) -> verbs_context {
    let mut ops: ibv_context_ops = zeroed_ops();
    ops.poll_cq = Some(cq::poll_cq);
    ops.req_notify_cq = Some(cq::req_notify_cq);
    ops.post_send = Some(qp::post_send);
    ops.post_recv = Some(qp::post_recv);
    ops.post_srq_recv = Some(srq::post_srq_recv);
    ops.alloc_mw = Some(mw::alloc_mw);
    ops.bind_mw = Some(mw::bind_mw);
    ops.dealloc_mw = Some(mw::dealloc_mw);
    verbs_context {
        query_port: Some(query_port_ex),
        advise_mr: Some(pd::advise_mr),
        _ops_16_to_104: [0; 11],
        modify_qp_rate_limit: Some(qp::modify_qp_rate_limit),
        alloc_parent_domain: Some(pd::alloc_parent_domain),
        dealloc_td: Some(pd::dealloc_td),
        alloc_td: Some(pd::alloc_td),
        modify_cq: 0,
        post_srq_ops: Some(tm::post_srq_ops),
        _ops_152_to_192: [0; 5],
        query_rt_values: Some(context::query_rt_values),
        create_cq_ex: Some(cq::create_cq_ex),
        _priv: 0,
        query_device_ex: Some(context::query_device_ex),
        _ops_224_to_256: [0; 4],
        open_qp: Some(qp::open_qp),
        create_qp_ex: Some(qp::create_qp_ex),
        get_srq_num: Some(srq::get_srq_num),
        create_srq_ex: Some(srq::create_srq_ex),
        open_xrcd: Some(xrc::open_xrcd),
        close_xrcd: Some(xrc::close_xrcd),
        _abi_placeholder3: 0,
        sz: size_of::<verbs_context>(),
        context: ibv_context {
            device,
            ops,
            cmd_fd: -1,
            async_fd,
            num_comp_vectors: context::comp_vectors(),
            mutex: [0; 5],
            abi_compat: VERBS_ABI_IS_EXTENDED as *mut c_void,
        },
    }
}

fn zeroed_ops() -> ibv_context_ops {
    ibv_context_ops {
        _compat_0_to_56: [0; 7],
        alloc_mw: None,
        bind_mw: None,
        dealloc_mw: None,
        _compat_create_cq: 0,
        poll_cq: None,
        req_notify_cq: None,
        _compat_104_to_160: [0; 7],
        post_srq_recv: None,
        _compat_168_to_200: [0; 4],
        post_send: None,
        post_recv: None,
        _compat_216_to_256: [0; 5],
    }
}
