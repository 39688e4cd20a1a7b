//! A drop-in `librdmacm.so.1`: rdma-core's connection manager API (rdma_cma.h, version
//! nodes `RDMACM_1.0` … `RDMACM_1.3`) over `roce-verbs`' CM, so that unmodified rdma_cm
//! programs (`rping`, `ucmatose`, perftest's `-R`) run over roce-xdp. `roce exec` puts it
//! beside our `libibverbs.so.1`.
//!
//! **How it meets libibverbs.** The objects an `rdma_cm_id` holds (`verbs`, `pd`, `qp`,
//! CQs) are our libibverbs' own: the program passes them to `ibv_*` calls, so they must be.
//! This library makes them through libibverbs' C API (found with `dlopen`, so a program that
//! links only librdmacm still loads), and asks libibverbs, through one private export
//! (`roce_rdmacm_verbs_context@ROCE_RDMACM_PRIVATE`), for the `roce_verbs::Context` behind
//! an `ibv_context`: the CM runs on that context's endpoint (QP 1), beside the QPs it
//! connects, and its QP state changes reach the QPs the program posts to. The alternative,
//! one library exporting both APIs, would give the program one file under two SONAMEs;
//! this keeps each library what its name says at the cost of one rule: both come from the
//! same build, which shares one compiled `roce-verbs` (the hook refuses a caller whose
//! `roce_verbs::Context` has another size; `roce exec` always places a matching pair).
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

use roce_cabi::{export, unsupported};

// Version nodes as rdma-core 44's librdmacm.map gives them (verbs-abi.md §2); every symbol
// of the real library is here, so every Debian program loads.
export!("rdma_create_event_channel" @ "RDMACM_1.0" => channel::create_event_channel);
export!("rdma_destroy_event_channel" @ "RDMACM_1.0" => channel::destroy_event_channel);
export!("rdma_get_cm_event" @ "RDMACM_1.0" => event::get_cm_event);
export!("rdma_ack_cm_event" @ "RDMACM_1.0" => event::ack_cm_event);
export!("rdma_event_str" @ "RDMACM_1.0" => channel::event_str);
export!("rdma_create_id" @ "RDMACM_1.0" => id::create_id);
export!("rdma_destroy_id" @ "RDMACM_1.0" => id::destroy_id);
export!("rdma_bind_addr" @ "RDMACM_1.0" => calls::bind_addr);
export!("rdma_resolve_addr" @ "RDMACM_1.0" => calls::resolve_addr);
export!("rdma_resolve_route" @ "RDMACM_1.0" => calls::resolve_route);
export!("rdma_listen" @ "RDMACM_1.0" => calls::listen);
export!("rdma_create_qp" @ "RDMACM_1.0" => qp::create_qp);
export!("rdma_create_qp_ex" @ "RDMACM_1.0" => qp::create_qp_ex);
export!("rdma_destroy_qp" @ "RDMACM_1.0" => qp::destroy_qp);
export!("rdma_connect" @ "RDMACM_1.0" => calls::connect);
export!("rdma_accept" @ "RDMACM_1.0" => calls::accept);
export!("rdma_reject" @ "RDMACM_1.0" => calls::reject);
export!("rdma_disconnect" @ "RDMACM_1.0" => calls::disconnect);
export!("rdma_migrate_id" @ "RDMACM_1.0" => calls::migrate_id);
export!("rdma_set_option" @ "RDMACM_1.0" => calls::set_option);
export!("rdma_get_src_port" @ "RDMACM_1.0" => calls::get_src_port);
export!("rdma_get_dst_port" @ "RDMACM_1.0" => calls::get_dst_port);
export!("rdma_get_devices" @ "RDMACM_1.0" => calls::get_devices);
export!("rdma_free_devices" @ "RDMACM_1.0" => calls::free_devices);
export!("rdma_getaddrinfo" @ "RDMACM_1.0" => addrinfo::getaddrinfo);
export!("rdma_freeaddrinfo" @ "RDMACM_1.0" => addrinfo::freeaddrinfo);
export!("rdma_notify" @ "RDMACM_1.0" => calls::notify);
export!("rdma_establish" @ "RDMACM_1.2" => calls::establish);
export!("rdma_init_qp_attr" @ "RDMACM_1.2" => calls::init_qp_attr);
export!("rdma_create_ep" @ "RDMACM_1.0" => ep::create_ep);
export!("rdma_destroy_ep" @ "RDMACM_1.0" => ep::destroy_ep);
export!("rdma_get_request" @ "RDMACM_1.0" => ep::get_request);
export!("rdma_join_multicast" @ "RDMACM_1.0" => mcast::join_multicast);
export!("rdma_join_multicast_ex" @ "RDMACM_1.1" => mcast::join_multicast_ex);
export!("rdma_leave_multicast" @ "RDMACM_1.0" => mcast::leave_multicast);
// Not offered yet: fail cleanly.
export!("rdma_create_srq" @ "RDMACM_1.0" => unsupported::eopnotsupp);
export!("rdma_create_srq_ex" @ "RDMACM_1.0" => unsupported::eopnotsupp);
export!("rdma_destroy_srq" @ "RDMACM_1.0" => unsupported::nothing);
export!("rdma_get_remote_ece" @ "RDMACM_1.3" => unsupported::eopnotsupp);
export!("rdma_set_local_ece" @ "RDMACM_1.3" => unsupported::eopnotsupp);
export!("rdma_reject_ece" @ "RDMACM_1.3" => unsupported::eopnotsupp);
// rsockets: no rsocket exists, so every fd is a plain one.
export!("rpoll" @ "RDMACM_1.0" => passthrough::rpoll);
export!("rselect" @ "RDMACM_1.0" => passthrough::rselect);
export!("rsocket" @ "RDMACM_1.0" => unsupported::enosys);
export!("rbind" @ "RDMACM_1.0" => unsupported::enosys);
export!("rlisten" @ "RDMACM_1.0" => unsupported::enosys);
export!("raccept" @ "RDMACM_1.0" => unsupported::enosys);
export!("rconnect" @ "RDMACM_1.0" => unsupported::enosys);
export!("rshutdown" @ "RDMACM_1.0" => unsupported::enosys);
export!("rclose" @ "RDMACM_1.0" => unsupported::enosys);
export!("rrecv" @ "RDMACM_1.0" => unsupported::enosys);
export!("rrecvfrom" @ "RDMACM_1.0" => unsupported::enosys);
export!("rrecvmsg" @ "RDMACM_1.0" => unsupported::enosys);
export!("rsend" @ "RDMACM_1.0" => unsupported::enosys);
export!("rsendto" @ "RDMACM_1.0" => unsupported::enosys);
export!("rsendmsg" @ "RDMACM_1.0" => unsupported::enosys);
export!("rread" @ "RDMACM_1.0" => unsupported::enosys);
export!("rreadv" @ "RDMACM_1.0" => unsupported::enosys);
export!("rwrite" @ "RDMACM_1.0" => unsupported::enosys);
export!("rwritev" @ "RDMACM_1.0" => unsupported::enosys);
export!("rgetpeername" @ "RDMACM_1.0" => unsupported::enosys);
export!("rgetsockname" @ "RDMACM_1.0" => unsupported::enosys);
export!("rsetsockopt" @ "RDMACM_1.0" => unsupported::enosys);
export!("rgetsockopt" @ "RDMACM_1.0" => unsupported::enosys);
export!("rfcntl" @ "RDMACM_1.0" => unsupported::enosys);
export!("riomap" @ "RDMACM_1.0" => unsupported::enosys);
export!("riounmap" @ "RDMACM_1.0" => unsupported::enosys);
export!("riowrite" @ "RDMACM_1.0" => unsupported::enosys);

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
