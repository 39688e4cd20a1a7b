//! The calls on an id: address and route resolution, listen, connect/accept/reject,
//! disconnect, `rdma_establish`, `rdma_migrate_id`, `rdma_init_qp_attr`, options and the
//! device list.

use core::ffi::{c_int, c_void};
use std::sync::MutexGuard;

use roce_cabi::set_errno;
use roce_verbs::ConnParam;

use crate::abi::*;
use crate::channel::Channel;
use crate::event;
use crate::id::{from_sockaddr, port_of, to_storage, with_id, Id, Inner, Request};
use crate::qp_attr;
use crate::verbs;

const EINVAL: c_int = 22;

/// `rdma_bind_addr`.
pub unsafe extern "C" fn bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    with_id(id, |ours| {
        // SAFETY: the caller passes a sockaddr.
        let addr = unsafe { from_sockaddr(addr) }.ok_or(EINVAL)?;
        let mut inner = ours.lock()?;
        let cm = ours.attach(&mut inner, addr.ip())?;
        cm.bind_addr(addr)
            .map_err(|error| crate::errors::fail("rdma_bind_addr", &error))?;
        let (on_device, bound) = (cm.bound_to_device(), cm.local_addr().unwrap_or(addr));
        if on_device {
            ours.show_device(&mut inner);
        }
        let raw = ours.raw(&mut inner);
        raw.route.addr.src_addr = to_storage(bound);
        Ok(())
    })
}

/// `rdma_resolve_addr`: reports `ADDR_RESOLVED` or `ADDR_ERROR` on the channel.
pub unsafe extern "C" fn resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    with_id(id, |ours| {
        // SAFETY: the caller passes sockaddrs (or NULL for `src`).
        let (src, dst) = unsafe { (from_sockaddr(src), from_sockaddr(dst)) };
        let dst = dst.ok_or(EINVAL)?;
        let mut inner = ours.lock()?;
        let cm = ours.attach(&mut inner, src.map_or(dst.ip(), |src| src.ip()))?;
        if let Some(src) = src {
            cm.bind_addr(src)
                .map_err(|error| crate::errors::fail("rdma_resolve_addr", &error))?;
        }
        cm.resolve_addr(dst)
            .map_err(|error| crate::errors::fail("rdma_resolve_addr", &error))?;
        ours.show_device(&mut inner);
        ours.describe_now(&mut inner)?;
        drop(inner);
        event::complete(ours, 0)
    })
}

/// `rdma_resolve_route`: reports `ROUTE_RESOLVED` (RoCE has no SA: the path is local) and
/// sets `id->route.path_rec`.
pub unsafe extern "C" fn resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    with_id(id, |ours| {
        let mut inner = ours.lock()?;
        Id::cm(&inner)?
            .resolve_route()
            .map_err(|error| crate::errors::fail("rdma_resolve_route", &error))?;
        ours.describe_now(&mut inner)?;
        drop(inner);
        event::complete(ours, 2)
    })
}

/// `rdma_listen`.
pub unsafe extern "C" fn listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    with_id(id, |ours| {
        let inner = ours.lock()?;
        // rdma-core's default for a backlog of 0 or less.
        let backlog = usize::try_from(backlog)
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or(1024);
        Id::cm(&inner)?
            .listen(backlog)
            .map_err(|error| crate::errors::fail("rdma_listen", &error))
    })
}

/// The QP number a connect or accept uses: the id's QP, else `param->qp_num` (a QP the
/// program manages itself).
fn qp_num(raw: &rdma_cm_id, param: Option<&rdma_conn_param>) -> Result<u32, c_int> {
    // SAFETY: the id's QP is NULL or one of our libibverbs, alive while the id uses it.
    match unsafe { raw.qp.as_ref() } {
        Some(qp) => Ok(qp.qp_num),
        None => param.map(|param| param.qp_num).ok_or(EINVAL),
    }
}

/// `ConnParam` from the program's `rdma_conn_param`.
fn conn_param(param: &rdma_conn_param) -> ConnParam {
    let data = if param.private_data.is_null() {
        Vec::new()
    } else {
        // SAFETY: the program's private data, `private_data_len` bytes.
        unsafe {
            core::slice::from_raw_parts(
                param.private_data.cast::<u8>(),
                usize::from(param.private_data_len),
            )
        }
        .to_vec()
    };
    ConnParam {
        private_data: data,
        responder_resources: param.responder_resources,
        initiator_depth: param.initiator_depth,
        retry_count: param.retry_count.min(7),
        rnr_retry_count: param.rnr_retry_count.min(7),
    }
}

/// `RDMA_MAX_RESP_RES` and `RDMA_MAX_INIT_DEPTH`: as many as the device allows.
const RDMA_MAX_DEPTH: u8 = 0xFF;

/// The READ/atomic depths a connect or accept asks for (responder resources, initiator
/// depth), as rdma-core's librdmacm settles them: a value above the device's is `EINVAL`
/// (TCP port space, `ucma_valid_param`) unless it is `RDMA_MAX_*` (0xFF), which asks for
/// the device's most, or on an accept, for as many as the request offered within it; no
/// param is the same as 0xFF (libfabric's verbs provider passes 0xFF).
fn depths(
    inner: &MutexGuard<'_, Inner>,
    ps: c_int,
    param: Option<&rdma_conn_param>,
    offered: Option<Request>,
) -> Result<(u8, u8), c_int> {
    let limits = inner.device.ok_or(EINVAL)?.verbs.device().query().limits;
    let (max_resp, max_init) = (limits.max_qp_rd_atom, limits.max_qp_init_rd_atom);
    if let Some(param) = param.filter(|_| ps == RDMA_PS_TCP) {
        let above = |asked: u8, max: u8| asked != RDMA_MAX_DEPTH && asked > max;
        if above(param.responder_resources, max_resp) || above(param.initiator_depth, max_init) {
            crate::errors::log_failure("rdma_connect/rdma_accept", &"depth beyond the device's");
            return Err(EINVAL);
        }
    }
    let settle = |asked: Option<u8>, offered: Option<u8>, max: u8| match asked {
        Some(asked) if asked != RDMA_MAX_DEPTH => asked,
        _ => offered.map_or(max, |offered| offered.min(max)),
    };
    Ok((
        settle(
            param.map(|param| param.responder_resources),
            offered.map(|request| request.responder_resources),
            max_resp,
        ),
        settle(
            param.map(|param| param.initiator_depth),
            offered.map(|request| request.initiator_depth),
            max_init,
        ),
    ))
}

/// `rdma_connect`: the REQ leaves; `ESTABLISHED`, `REJECTED` or `UNREACHABLE` follows.
pub unsafe extern "C" fn connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    with_id(id, |ours| {
        // SAFETY: the caller passes NULL or a conn param.
        let param = unsafe { param.as_ref() };
        let mut inner = ours.lock()?;
        let cm = Id::cm(&inner)?;
        if cm.is_ud() {
            let private = param.map(conn_param).unwrap_or_default().private_data;
            cm.connect_ud(&private)
                .map_err(|error| crate::errors::fail("rdma_connect", &error))?;
            drop(inner);
            return event::complete(ours, 9);
        }
        let qpn = qp_num(ours.raw(&mut inner), param)?;
        let program_qp = ours.raw(&mut inner).qp.is_null();
        let ps = ours.raw(&mut inner).ps;
        let (responder_resources, initiator_depth) = depths(&inner, ps, param, None)?;
        let param = ConnParam {
            responder_resources,
            initiator_depth,
            ..param.map(conn_param).unwrap_or_default()
        };
        let cm = Id::cm(&inner)?;
        let connected = if program_qp {
            cm.connect_program_qp(qpn, &param)
        } else {
            cm.connect_qp_num(qpn, &param)
        };
        connected.map_err(|error| crate::errors::fail("rdma_connect", &error))?;
        if let Some(local) = cm.local_addr() {
            ours.raw(&mut inner).route.addr.src_addr = to_storage(local);
        }
        drop(inner);
        // An id without a QP hears CONNECT_RESPONSE and moves its QP itself, as rdma-core.
        event::complete(ours, if program_qp { 5 } else { 9 })
    })
}

/// `rdma_accept`: the QP goes to RTR and RTS and the REP leaves; `ESTABLISHED` follows the
/// RTU. With no param (or 0xFF), the request's depths are granted within the device's.
pub unsafe extern "C" fn accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    with_id(id, |ours| {
        // SAFETY: the caller passes NULL or a conn param.
        let param = unsafe { param.as_ref() };
        let mut inner = ours.lock()?;
        let qpn = qp_num(ours.raw(&mut inner), param)?;
        if Id::cm(&inner)?.is_ud() {
            // No RTU follows a SIDR_REP, so there is no event to wait for.
            let private = param.map(conn_param).unwrap_or_default().private_data;
            return Id::cm(&inner)?
                .accept_ud(qpn, &private)
                .map_err(|error| crate::errors::fail("rdma_accept", &error));
        }
        let ps = ours.raw(&mut inner).ps;
        let (responder_resources, initiator_depth) = depths(&inner, ps, param, inner.request)?;
        let param = ConnParam {
            responder_resources,
            initiator_depth,
            ..param.map(conn_param).unwrap_or_default()
        };
        let program_qp = ours.raw(&mut inner).qp.is_null();
        let cm = Id::cm(&inner)?;
        let accepted = if program_qp {
            cm.accept_program_qp(qpn, &param)
        } else {
            cm.accept_qp_num(qpn, &param)
        };
        accepted.map_err(|error| crate::errors::fail("rdma_accept", &error))?;
        drop(inner);
        event::complete(ours, 9)
    })
}

/// `rdma_reject`.
pub unsafe extern "C" fn reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    len: u8,
) -> c_int {
    with_id(id, |ours| {
        let data = if private_data.is_null() {
            &[][..]
        } else {
            // SAFETY: the program's private data, `len` bytes.
            unsafe { core::slice::from_raw_parts(private_data.cast::<u8>(), usize::from(len)) }
        };
        let inner = ours.lock()?;
        Id::cm(&inner)?
            .reject(data)
            .map_err(|error| crate::errors::fail("rdma_reject", &error))
    })
}

/// `rdma_disconnect`: the QP goes to ERR and the DREQ leaves; `DISCONNECTED` follows.
pub unsafe extern "C" fn disconnect(id: *mut rdma_cm_id) -> c_int {
    with_id(id, |ours| {
        let inner = ours.lock()?;
        Id::cm(&inner)?
            .disconnect()
            .map_err(|error| crate::errors::fail("rdma_disconnect", &error))
    })
}

/// `rdma_establish`: after `CONNECT_RESPONSE` on an id without a QP (the program moved
/// its own), sends the RTU. An id with a QP was established by the CM itself (`EINVAL`, as
/// rdma-core).
pub unsafe extern "C" fn establish(id: *mut rdma_cm_id) -> c_int {
    with_id(id, |ours| {
        let mut inner = ours.lock()?;
        if !ours.raw(&mut inner).qp.is_null() {
            return Err(EINVAL);
        }
        Id::cm(&inner)?
            .establish()
            .map_err(|error| crate::errors::fail("rdma_establish", &error))
    })
}

/// `rdma_notify`: the CM learns of the QP's first packet from the QP itself, so there is
/// nothing to tell it.
pub unsafe extern "C" fn notify(id: *mut rdma_cm_id, _event: c_int) -> c_int {
    with_id(id, |ours| Id::cm(&ours.lock()?).map(|_| ()))
}

/// `rdma_migrate_id`: the id's events go to `channel` from now on. A synchronous id
/// becomes asynchronous (its own channel goes, as rdma-core destroys it); NULL makes an
/// asynchronous id synchronous (`EINVAL` for one that is already).
pub unsafe extern "C" fn migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    with_id(id, |ours| {
        // SAFETY: the caller passes NULL or a channel of ours.
        let Some(to) = (unsafe { Channel::from_raw(channel) }) else {
            if ours.own_channel()?.is_some() {
                return Err(EINVAL);
            }
            return ours.make_synchronous();
        };
        let mut inner = ours.lock()?;
        let from = ours.channel(&mut inner)?;
        if let Some(cm) = &inner.cm {
            cm.migrate(to.events())
                .map_err(|error| crate::errors::fail("rdma_migrate_id", &error))?;
            from.unregister(cm.handle());
            to.register(cm.handle(), ours.key());
        }
        ours.raw(&mut inner).channel = to.as_raw();
        let own = inner.own_channel.take();
        drop(inner);
        drop(own);
        Ok(())
    })
}

/// `rdma_init_qp_attr`: the attributes that move the id's QP to `attr->qp_state` (INIT,
/// RTR or RTS) and their mask, as the kernel's rdma_cm derives them from the exchange.
pub unsafe extern "C" fn init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    with_id(id, |ours| {
        // SAFETY: the caller passes a QP attr to fill (or NULL).
        let attr = unsafe { attr.as_mut() };
        // SAFETY: and a mask to fill (or NULL).
        let mask = unsafe { mask.as_mut() };
        let (Some(attr), Some(mask)) = (attr, mask) else {
            return Err(EINVAL);
        };
        let state = qp_attr::qp_state(attr.qp_state).ok_or(EINVAL)?;
        let inner = ours.lock()?;
        let answer = Id::cm(&inner)?
            .qp_attr(state)
            .map_err(|error| crate::errors::fail("rdma_init_qp_attr", &error))?;
        *mask = qp_attr::to_c(&answer, attr);
        Ok(())
    })
}

/// `rdma_get_src_port`, in network order.
pub unsafe extern "C" fn get_src_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: the caller passes an id of ours.
    unsafe { id.as_ref() }.map_or(0, |raw| port_of(&raw.route.addr.src_addr))
}

/// `rdma_get_dst_port`, in network order.
pub unsafe extern "C" fn get_dst_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: the caller passes an id of ours.
    unsafe { id.as_ref() }.map_or(0, |raw| port_of(&raw.route.addr.dst_addr))
}

/// `rdma_set_option`: the options rdma-core passes to the kernel for an RC id over RoCE:
/// `RDMA_OPTION_ID_TOS` (one byte, as the kernel takes it) sets the traffic class of the
/// id's connection; `RDMA_OPTION_ID_ACK_TIMEOUT` (a `u8`) sets the QP's local ACK timeout at
/// RTS, as the kernel's; `_REUSEADDR` and `_AFONLY` are accepted and have no effect here;
/// others fail with `ENOSYS`, as the kernel answers them.
pub unsafe extern "C" fn set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    with_id(id, |ours| {
        const RDMA_OPTION_ID: c_int = 0;
        const RDMA_OPTION_ID_TOS: c_int = 0;
        const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
        if optval.is_null() || optlen == 0 {
            return Err(EINVAL);
        }
        match (level, optname) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => {
                // SAFETY: the caller passes `optlen` (at least 1) readable bytes.
                let timeout = unsafe { optval.cast::<u8>().read() };
                let inner = ours.lock()?;
                Id::cm(&inner)?
                    .set_ack_timeout(timeout)
                    .map_err(|error| crate::errors::fail("rdma_set_option", &error))
            }
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) => {
                if optlen != 1 {
                    return Err(EINVAL);
                }
                // SAFETY: one readable byte, as the caller says.
                let tos = unsafe { optval.cast::<u8>().read() };
                let mut inner = ours.lock()?;
                inner.tos = Some(tos);
                match &inner.cm {
                    Some(cm) => cm
                        .set_tos(tos)
                        .map_err(|error| crate::errors::fail("rdma_set_option", &error)),
                    None => Ok(()),
                }
            }
            (RDMA_OPTION_ID, 1..=2) => Ok(()),
            _ => Err(38),
        }
    })
}

/// `rdma_get_devices`: every device of the namespace, opened, NULL-terminated; freed by
/// `rdma_free_devices`.
pub unsafe extern "C" fn get_devices(num: *mut c_int) -> *mut *mut c_void {
    let devices = match verbs::open_all() {
        Ok(devices) => devices,
        Err(errno) => {
            set_errno(errno);
            return core::ptr::null_mut();
        }
    };
    // SAFETY: calloc of count+1 pointers, freed by `rdma_free_devices`.
    let list = unsafe { libc::calloc(devices.len() + 1, core::mem::size_of::<*mut c_void>()) }
        .cast::<*mut c_void>();
    if list.is_null() {
        set_errno(12);
        return list;
    }
    for (index, device) in devices.iter().enumerate() {
        // SAFETY: within the array just allocated.
        unsafe { *list.add(index) = device.ibv };
    }
    // SAFETY: the caller passes NULL or a count to fill.
    if let Some(num) = unsafe { num.as_mut() } {
        *num = c_int::try_from(devices.len()).unwrap_or(c_int::MAX);
    }
    list
}

/// `rdma_free_devices`.
pub unsafe extern "C" fn free_devices(list: *mut *mut c_void) {
    // SAFETY: a list from `rdma_get_devices` (calloc), freed once; the devices stay open.
    unsafe { libc::free(list.cast()) };
}
