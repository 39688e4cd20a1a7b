//! `rdma_join_multicast`, `rdma_join_multicast_ex` and `rdma_leave_multicast`, with
//! librdmacm's own checks and its part of the work (`joins`): the join itself is
//! roce-verbs' (the kernel's in rdma-core), whose event attaches the id's QP; a leave
//! detaches the QP first. A synchronous id's join waits for its event.

use core::ffi::{c_int, c_void};

use crate::abi::*;
use crate::event;
use crate::id::{from_sockaddr, with_id, Id};
use crate::joins::Join;
use crate::verbs;

const EINVAL: c_int = 22;
const EADDRNOTAVAIL: c_int = 99;

/// `ucma_addrlen`: the length of an IPv4 or IPv6 `sockaddr` (AF_IB is not offered).
///
/// # Safety
/// `addr` is NULL or points to a `sockaddr` of its family's length.
unsafe fn addr_bytes<'a>(addr: *const libc::sockaddr) -> Option<&'a [u8]> {
    // SAFETY: the caller passes NULL or a sockaddr.
    let len = match c_int::from(unsafe { addr.as_ref() }?.sa_family) {
        libc::AF_INET => core::mem::size_of::<libc::sockaddr_in>(),
        libc::AF_INET6 => core::mem::size_of::<libc::sockaddr_in6>(),
        _ => return None,
    };
    // SAFETY: a sockaddr of that family is that long.
    Some(unsafe { core::slice::from_raw_parts(addr.cast::<u8>(), len) })
}

/// What both joins do, `flags` checked.
///
/// # Safety
/// `id` is NULL or ours; `addr` is NULL or a `sockaddr` of its family's length.
unsafe fn join(
    id: *mut rdma_cm_id,
    addr: *const libc::sockaddr,
    flags: u32,
    context: *mut c_void,
) -> c_int {
    with_id(id, |ours| {
        // SAFETY: the caller's sockaddr.
        let (Some(bytes), Some(group)) =
            (unsafe { addr_bytes(addr) }, unsafe { from_sockaddr(addr) })
        else {
            return Err(EINVAL);
        };
        let mut inner = ours.lock()?;
        let send_only = flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
        // Under the id's lock until the join is recorded: its event, which may be taken at
        // once by another thread, attaches the QP from the record.
        let number = Id::cm(&inner)?
            .join_multicast(group, send_only)
            .map_err(|error| crate::errors::fail("rdma_join_multicast", &error))?;
        inner.joins.push(Join {
            number,
            addr: bytes.to_vec(),
            flags,
            context,
            mgid: [0; 16],
            mlid: 0,
        });
        drop(inner);
        event::complete(ours, 12)
    })
}

/// `rdma_join_multicast`: a full member's join.
pub unsafe extern "C" fn join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the caller's id and sockaddr.
    unsafe { join(id, addr, RDMA_MC_JOIN_FLAG_FULLMEMBER, context) }
}

/// `rdma_join_multicast_ex`: the join flags of `attr` (full or send-only member).
pub unsafe extern "C" fn join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the caller passes NULL or its attributes.
    let checked = match unsafe { attr.as_ref() } {
        None => Err(EINVAL),
        Some(attr) if attr.comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED => Err(roce_cabi::EOPNOTSUPP),
        Some(attr) if attr.comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0 => Err(EINVAL),
        Some(attr)
            if attr.comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS == 0
                || attr.join_flags >= RDMA_MC_JOIN_FLAG_RESERVED =>
        {
            Err(EINVAL)
        }
        Some(attr) => Ok((attr.addr, attr.join_flags)),
    };
    match checked {
        // SAFETY: the caller's id and the sockaddr its attributes point to.
        Ok((addr, flags)) => unsafe { join(id, addr, flags, context) },
        Err(errno) => {
            roce_cabi::set_errno(errno);
            -1
        }
    }
}

/// `rdma_leave_multicast`: the join of the same address (`EADDRNOTAVAIL` if none); the id's
/// QP is detached from the group first, as librdmacm does (its answer ignored).
pub unsafe extern "C" fn leave_multicast(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    with_id(id, |ours| {
        // SAFETY: the caller's sockaddr.
        let bytes = unsafe { addr_bytes(addr) }.ok_or(EINVAL)?;
        let mut inner = ours.lock()?;
        let at = inner
            .joins
            .iter()
            .position(|join| join.addr.get(..bytes.len()) == Some(bytes))
            .ok_or(EADDRNOTAVAIL)?;
        let join = inner.joins.remove(at);
        let qp = ours.raw(&mut inner).qp;
        if !qp.is_null() && join.attaches() {
            let verbs = verbs::verbs()?;
            // SAFETY: the id's QP, alive while the id holds it, and a GID that lives
            // across the call.
            let _ = unsafe { (verbs.detach_mcast)(qp, &join.mgid, join.mlid) };
        }
        Id::cm(&inner)?
            .leave_multicast(join.number)
            .map_err(|error| crate::errors::fail("rdma_leave_multicast", &error))
    })
}
