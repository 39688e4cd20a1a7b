//! `rdma_getaddrinfo` / `rdma_freeaddrinfo`: libc's `getaddrinfo` in rdma_cm's shape. There
//! is no route information to give on RoCE (no SA), so the result carries addresses only:
//! the source for a passive lookup (`RAI_PASSIVE`), else the destination and the hints'
//! source if they give one (as rdma-core copies it: ucmatose's `-b` on a client); with
//! neither a node nor a service, the hints' own addresses. IPv4 and IPv6 alike, a link-local
//! IPv6 address with its `%interface` scope.

use core::ffi::{c_char, c_int};

use crate::abi::*;

/// `rdma_getaddrinfo`: 0, or libc's `EAI_*` code.
pub unsafe extern "C" fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    if res.is_null() {
        return libc::EAI_SYSTEM;
    }
    // SAFETY: the caller passes NULL or hints.
    let hints = unsafe { hints.as_ref() };
    if node.is_null() && service.is_null() {
        // SAFETY: checked not null; the caller's out pointer.
        unsafe { *res = Box::into_raw(Box::new(from_hints(hints))) };
        return 0;
    }
    let flags = hints.map_or(0, |hints| hints.ai_flags);
    let port_space = match hints.map(|hints| hints.ai_port_space) {
        Some(0) | None => RDMA_PS_TCP,
        Some(space) => space,
    };
    let wanted = libc_hints(hints, flags, port_space);
    let mut found = core::ptr::null_mut();
    // SAFETY: the caller's NUL-terminated strings (or NULL), our hints, an out pointer.
    let status = unsafe { libc::getaddrinfo(node, service, &wanted, &mut found) };
    if status != 0 {
        return status;
    }
    // SAFETY: getaddrinfo succeeded: `found` is a list of at least one entry.
    let first = unsafe { &*found };
    // SAFETY: `ai_addr` holds `ai_addrlen` bytes.
    let (addr, len) = unsafe { boxed_copy(first.ai_addr, first.ai_addrlen) };
    let family = first.ai_family;
    // SAFETY: the list getaddrinfo returned, freed once.
    unsafe { libc::freeaddrinfo(found) };
    let passive = flags & RAI_PASSIVE != 0;
    let (src, src_len) = match hints {
        Some(hints) if !passive && !hints.ai_src_addr.is_null() && hints.ai_src_len > 0 => {
            // SAFETY: the caller's hints hold `ai_src_len` bytes at `ai_src_addr`.
            unsafe { boxed_copy(hints.ai_src_addr, hints.ai_src_len) }
        }
        _ => (core::ptr::null_mut(), 0),
    };
    let info = Box::new(rdma_addrinfo {
        ai_flags: flags,
        ai_family: family,
        ai_qp_type: if port_space == RDMA_PS_UDP {
            IBV_QPT_UD as c_int
        } else {
            IBV_QPT_RC as c_int
        },
        ai_port_space: port_space,
        ai_src_len: if passive { len } else { src_len },
        ai_dst_len: if passive { 0 } else { len },
        ai_src_addr: if passive { addr } else { src },
        ai_dst_addr: if passive { core::ptr::null_mut() } else { addr },
        ai_src_canonname: core::ptr::null_mut(),
        ai_dst_canonname: core::ptr::null_mut(),
        ai_route_len: 0,
        ai_route: core::ptr::null_mut(),
        ai_connect_len: 0,
        ai_connect: core::ptr::null_mut(),
        ai_next: core::ptr::null_mut(),
    });
    // SAFETY: checked not null; the caller's out pointer.
    unsafe { *res = Box::into_raw(info) };
    0
}

/// With neither a node nor a service to look up, rdma-core answers with the hints' own
/// addresses and kinds (pyverbs' `AddrInfo(src=...)` asks this way for a group's address).
fn from_hints(hints: Option<&rdma_addrinfo>) -> rdma_addrinfo {
    let copied = |addr: *mut libc::sockaddr, len: libc::socklen_t| {
        if addr.is_null() || len == 0 {
            (core::ptr::null_mut(), 0)
        } else {
            // SAFETY: the caller's hints hold `len` bytes at `addr`.
            unsafe { boxed_copy(addr, len) }
        }
    };
    let (src, src_len) = hints.map_or((core::ptr::null_mut(), 0), |hints| {
        copied(hints.ai_src_addr, hints.ai_src_len)
    });
    let (dst, dst_len) = hints.map_or((core::ptr::null_mut(), 0), |hints| {
        copied(hints.ai_dst_addr, hints.ai_dst_len)
    });
    rdma_addrinfo {
        ai_flags: hints.map_or(0, |hints| hints.ai_flags),
        ai_family: hints.map_or(0, |hints| hints.ai_family),
        ai_qp_type: hints.map_or(0, |hints| hints.ai_qp_type),
        ai_port_space: hints.map_or(0, |hints| hints.ai_port_space),
        ai_src_len: src_len,
        ai_dst_len: dst_len,
        ai_src_addr: src,
        ai_dst_addr: dst,
        ai_src_canonname: core::ptr::null_mut(),
        ai_dst_canonname: core::ptr::null_mut(),
        ai_route_len: 0,
        ai_route: core::ptr::null_mut(),
        ai_connect_len: 0,
        ai_connect: core::ptr::null_mut(),
        ai_next: core::ptr::null_mut(),
    }
}

/// libc's hints for rdma_getaddrinfo's: the family, a stream socket for TCP port space and
/// a datagram one for UDP, passive and numeric as asked.
fn libc_hints(hints: Option<&rdma_addrinfo>, flags: c_int, port_space: c_int) -> libc::addrinfo {
    // SAFETY: all-zero is a valid addrinfo (no hints).
    let mut wanted: libc::addrinfo = unsafe { core::mem::zeroed() };
    wanted.ai_family = hints.map_or(libc::AF_UNSPEC, |hints| hints.ai_family);
    wanted.ai_socktype = if port_space == RDMA_PS_UDP {
        libc::SOCK_DGRAM
    } else {
        libc::SOCK_STREAM
    };
    if flags & RAI_PASSIVE != 0 {
        wanted.ai_flags |= libc::AI_PASSIVE;
    }
    if flags & RAI_NUMERICHOST != 0 {
        wanted.ai_flags |= libc::AI_NUMERICHOST;
    }
    wanted
}

/// A `sockaddr_storage` of our own holding the `len` bytes at `addr` (at most a storage's),
/// and how many those are; `rdma_freeaddrinfo` frees it.
///
/// # Safety
/// `addr` points to `len` readable bytes.
unsafe fn boxed_copy(
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> (*mut libc::sockaddr, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut storage: Box<libc::sockaddr_storage> = Box::new(unsafe { core::mem::zeroed() });
    let len = usize::try_from(len)
        .unwrap_or(0)
        .min(core::mem::size_of::<libc::sockaddr_storage>());
    // SAFETY: the caller's `len` bytes at `addr`; the storage holds at least as many.
    unsafe {
        core::ptr::copy_nonoverlapping(
            addr.cast::<u8>(),
            core::ptr::from_mut(&mut *storage).cast::<u8>(),
            len,
        )
    };
    let len = libc::socklen_t::try_from(len).unwrap_or(0);
    (Box::into_raw(storage).cast::<libc::sockaddr>(), len)
}

/// `rdma_freeaddrinfo`.
pub unsafe extern "C" fn freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut next = res;
    while !next.is_null() {
        // SAFETY: an entry `rdma_getaddrinfo` made, freed once.
        let info = unsafe { Box::from_raw(next) };
        for addr in [info.ai_src_addr, info.ai_dst_addr] {
            if !addr.is_null() {
                // SAFETY: the storage `rdma_getaddrinfo` boxed for it.
                drop(unsafe { Box::from_raw(addr.cast::<libc::sockaddr_storage>()) });
            }
        }
        next = info.ai_next;
    }
}
