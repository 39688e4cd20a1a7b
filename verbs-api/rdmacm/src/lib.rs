//! rdma-core's connection manager API (rdma_cma.h, version nodes `RDMACM_1.0` …
//! `RDMACM_1.3`) over `roce-verbs`' CM, so that unmodified rdma_cm programs (`rping`,
//! `ucmatose`, perftest's `-R`) run over roce-xdp. `roce exec` puts our `librdmacm.so.1`
//! beside our `libibverbs.so.1`.
//!
//! **Where it lives.** This crate is linked into our `libibverbs.so.1`, which exports each
//! entry point of [`for_each_symbol!`] under a private name (`roce_rdma_create_id@
//! ROCE_RDMACM_PRIVATE`, ...); `librdmacm.so.1` (`verbs-api/rdmacm/shim`) holds no Rust
//! state at all: each of its symbols jumps to that private export. So the `roce-verbs`
//! state of a process has one owner, one compiled copy of its types and statics (the
//! tracing subscriber `ROCE_LOG` installs among them), and the libraries meet only through
//! rdma_cma.h's C ABI. (Before, each library linked its own `roce-verbs` and librdmacm
//! reached into libibverbs' Rust objects; a layout or static of one build seen through
//! another's code was undefined behaviour guarded only by a size check.)
//!
//! The objects an `rdma_cm_id` holds (`verbs`, `pd`, `qp`, CQs) are libibverbs' own: the
//! program passes them to `ibv_*` calls. This crate makes them through libibverbs' C API and
//! asks it (`roce_rdmacm_verbs_context`, now a call within the same library) for the
//! `roce_verbs::Context` behind an `ibv_context`: the CM runs on that context's endpoint (QP
//! 1), beside the QPs it connects, and its QP state changes reach the QPs the program posts
//! to.
//!
//! - **Channels** belong to no device and have a real fd (`poll` it; `O_NONBLOCK` makes
//!   `rdma_get_cm_event` fail with `EAGAIN`).
//! - **Ids** take the device of their address at `rdma_bind_addr` or `rdma_resolve_addr`
//!   (one opened context per device and process, kept open). RC (`RDMA_PS_TCP`) and UD
//!   (`RDMA_PS_UDP`, resolved with SIDR, joining multicast groups) ids.
//! - **Errors**: -1 with errno, as rdma-core. What is not offered fails with `ENOSYS`
//!   (rsockets) or `EOPNOTSUPP` (other port spaces, SRQs, ECE), and says
//!   why on stderr with `ROCE_LOG` set. `rpoll`/`rselect` are `poll`/`select`: with no
//!   rsockets every fd is a plain one (rping, ucmatose and udaddy import `rpoll`).

//!
//! Modules, each building only on those before it: `abi`, `errors`, `qp_attr` and `verbs`
//! (C shapes, errno, our libibverbs); `channel`; `joins` (an id's multicast joins, and
//! attaching its QP when one is reported); `id`; `event` (C events, which make the ids of
//! requests); `calls`, `qp` and `mcast` (what the program does with an id); `ep`.

// The C entry points are public for the library that exports them; the safety contract of
// each is rdma_cma.h's for that call.
#![allow(clippy::missing_safety_doc)]

mod abi;
mod addrinfo;
mod calls;
mod channel;
mod ep;
mod errors;
mod event;
mod id;
mod joins;
mod mcast;
mod qp;
mod qp_attr;
mod verbs;

/// Calls `$m!(NAME @ "VERSION" => ENTRY, RETURNS)` for every symbol of rdma-core 44's
/// librdmacm.so.1 (version nodes as its librdmacm.map gives them, verbs-abi.md §2), so
/// every Debian program loads: NAME the C symbol, ENTRY the `extern "C"` function that
/// implements it, RETURNS `int` or `ptr` (what its C type returns, for a caller that must
/// fail it). Our libibverbs.so.1 exports each ENTRY privately; our librdmacm.so.1 forwards
/// NAME to it.
#[macro_export]
macro_rules! for_each_symbol {
    ($m:ident) => {
        $m!(rdma_create_event_channel @ "RDMACM_1.0" => $crate::entry::create_event_channel, ptr);
        $m!(rdma_destroy_event_channel @ "RDMACM_1.0" => $crate::entry::destroy_event_channel, int);
        $m!(rdma_get_cm_event @ "RDMACM_1.0" => $crate::entry::get_cm_event, int);
        $m!(rdma_ack_cm_event @ "RDMACM_1.0" => $crate::entry::ack_cm_event, int);
        $m!(rdma_event_str @ "RDMACM_1.0" => $crate::entry::event_str, ptr);
        $m!(rdma_create_id @ "RDMACM_1.0" => $crate::entry::create_id, int);
        $m!(rdma_destroy_id @ "RDMACM_1.0" => $crate::entry::destroy_id, int);
        $m!(rdma_bind_addr @ "RDMACM_1.0" => $crate::entry::bind_addr, int);
        $m!(rdma_resolve_addr @ "RDMACM_1.0" => $crate::entry::resolve_addr, int);
        $m!(rdma_resolve_route @ "RDMACM_1.0" => $crate::entry::resolve_route, int);
        $m!(rdma_listen @ "RDMACM_1.0" => $crate::entry::listen, int);
        $m!(rdma_create_qp @ "RDMACM_1.0" => $crate::entry::create_qp, int);
        $m!(rdma_create_qp_ex @ "RDMACM_1.0" => $crate::entry::create_qp_ex, int);
        $m!(rdma_destroy_qp @ "RDMACM_1.0" => $crate::entry::destroy_qp, int);
        $m!(rdma_connect @ "RDMACM_1.0" => $crate::entry::connect, int);
        $m!(rdma_accept @ "RDMACM_1.0" => $crate::entry::accept, int);
        $m!(rdma_reject @ "RDMACM_1.0" => $crate::entry::reject, int);
        $m!(rdma_disconnect @ "RDMACM_1.0" => $crate::entry::disconnect, int);
        $m!(rdma_migrate_id @ "RDMACM_1.0" => $crate::entry::migrate_id, int);
        $m!(rdma_set_option @ "RDMACM_1.0" => $crate::entry::set_option, int);
        $m!(rdma_get_src_port @ "RDMACM_1.0" => $crate::entry::get_src_port, int);
        $m!(rdma_get_dst_port @ "RDMACM_1.0" => $crate::entry::get_dst_port, int);
        $m!(rdma_get_devices @ "RDMACM_1.0" => $crate::entry::get_devices, ptr);
        $m!(rdma_free_devices @ "RDMACM_1.0" => $crate::entry::free_devices, int);
        $m!(rdma_getaddrinfo @ "RDMACM_1.0" => $crate::entry::getaddrinfo, int);
        $m!(rdma_freeaddrinfo @ "RDMACM_1.0" => $crate::entry::freeaddrinfo, int);
        $m!(rdma_notify @ "RDMACM_1.0" => $crate::entry::notify, int);
        $m!(rdma_establish @ "RDMACM_1.2" => $crate::entry::establish, int);
        $m!(rdma_init_qp_attr @ "RDMACM_1.2" => $crate::entry::init_qp_attr, int);
        $m!(rdma_create_ep @ "RDMACM_1.0" => $crate::entry::create_ep, int);
        $m!(rdma_destroy_ep @ "RDMACM_1.0" => $crate::entry::destroy_ep, int);
        $m!(rdma_get_request @ "RDMACM_1.0" => $crate::entry::get_request, int);
        $m!(rdma_join_multicast @ "RDMACM_1.0" => $crate::entry::join_multicast, int);
        $m!(rdma_join_multicast_ex @ "RDMACM_1.1" => $crate::entry::join_multicast_ex, int);
        $m!(rdma_leave_multicast @ "RDMACM_1.0" => $crate::entry::leave_multicast, int);
        // Not offered yet: fail cleanly.
        $m!(rdma_create_srq @ "RDMACM_1.0" => $crate::entry::unsupported::eopnotsupp, int);
        $m!(rdma_create_srq_ex @ "RDMACM_1.0" => $crate::entry::unsupported::eopnotsupp, int);
        $m!(rdma_destroy_srq @ "RDMACM_1.0" => $crate::entry::unsupported::nothing, int);
        $m!(rdma_get_remote_ece @ "RDMACM_1.3" => $crate::entry::unsupported::eopnotsupp, int);
        $m!(rdma_set_local_ece @ "RDMACM_1.3" => $crate::entry::unsupported::eopnotsupp, int);
        $m!(rdma_reject_ece @ "RDMACM_1.3" => $crate::entry::unsupported::eopnotsupp, int);
        // rsockets: no rsocket exists, so every fd is a plain one.
        $m!(rpoll @ "RDMACM_1.0" => $crate::entry::rpoll, int);
        $m!(rselect @ "RDMACM_1.0" => $crate::entry::rselect, int);
        $m!(rsocket @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(rbind @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(rlisten @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(raccept @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(rconnect @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(rshutdown @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(rclose @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(rrecv @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(rrecvfrom @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(rrecvmsg @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(rsend @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(rsendto @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(rsendmsg @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(rread @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(rreadv @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(rwrite @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(rwritev @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(rgetpeername @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(rgetsockname @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(rsetsockopt @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(rgetsockopt @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(rfcntl @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(riomap @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(riounmap @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
        $m!(riowrite @ "RDMACM_1.0" => $crate::entry::unsupported::enosys, int);
    };
}

/// The C entry points [`for_each_symbol!`] names, for the library that exports them.
#[doc(hidden)]
pub mod entry {
    pub use crate::addrinfo::{freeaddrinfo, getaddrinfo};
    pub use crate::calls::{
        accept, bind_addr, connect, disconnect, establish, free_devices, get_devices, get_dst_port,
        get_src_port, init_qp_attr, listen, migrate_id, notify, reject, resolve_addr,
        resolve_route, set_option,
    };
    pub use crate::channel::{create_event_channel, destroy_event_channel, event_str};
    pub use crate::ep::{create_ep, destroy_ep, get_request};
    pub use crate::event::{ack_cm_event, get_cm_event};
    pub use crate::id::{create_id, destroy_id};
    pub use crate::mcast::{join_multicast, join_multicast_ex, leave_multicast};
    pub use crate::passthrough::{rpoll, rselect};
    pub use crate::qp::{create_qp, create_qp_ex, destroy_qp};
    pub use roce_cabi::unsupported;
}

/// The rsocket calls that pass through.
mod passthrough {
    use core::ffi::c_int;

    /// `rpoll`: `poll`, as rsockets pass plain fds through.
    pub unsafe extern "C" fn rpoll(
        fds: *mut libc::pollfd,
        count: libc::nfds_t,
        timeout: c_int,
    ) -> c_int {
        // SAFETY: the caller's poll arguments, passed on unchanged.
        unsafe { libc::poll(fds, count, timeout) }
    }

    /// `rselect`: `select`, as rsockets pass plain fds through.
    pub unsafe extern "C" fn rselect(
        count: c_int,
        read: *mut libc::fd_set,
        write: *mut libc::fd_set,
        except: *mut libc::fd_set,
        timeout: *mut libc::timeval,
    ) -> c_int {
        // SAFETY: the caller's select arguments, passed on unchanged.
        unsafe { libc::select(count, read, write, except, timeout) }
    }
}
