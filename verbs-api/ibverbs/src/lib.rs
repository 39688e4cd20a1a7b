//! A drop-in `libibverbs.so.1`: rdma-core's C verbs API as a thin face on `roce-verbs`, so
//! that unmodified programs linked against rdma-core (its examples, perftest) run over
//! roce-xdp. Point `LD_LIBRARY_PATH` at the built libraries (`roce exec` does).
//!
//! - **Devices**: one per up, non-loopback interface of the caller's network namespace,
//!   named after it, shaped as rxe shows itself (node type CA, transport IB, link layer
//!   Ethernet, vendor 0xFFFFFF part 0, RoCEv2 GIDs).
//! - **Objects**: every `ibv_*` object the caller sees is the first field of a `#[repr(C)]`
//!   struct of ours that holds the `roce-verbs` object behind it; the data path goes
//!   through `ibv_context_ops`, where the inline `ibv_post_send`, `ibv_poll_cq`, ... look.
//! - **Engine**: one per opened context, on a background thread (`ROCE_PROGRESS=events`,
//!   the default, sleeps on the socket; `busy` spins); `ROCE_BACKEND=auto|afxdp|udp`
//!   chooses how frames move; `ROCE_PCAP=FILE` records them; `ROCE_DCQCN=0` ignores CNPs
//!   (DCQCN's reaction point off), `ROCE_DCQCN_PARAMS=rp_max_rate=1000,...` sets its knobs.
//! - **Observability**: `ROCE_LOG` turns on the stack's events on stderr (`logging`);
//!   `ROCE_STATS=1` prints each device's rxe-named counters when it is closed or the program
//!   exits (`stats`).
//! - **Errors**: what rdma-core returns; whatever we do not support fails with
//!   `EOPNOTSUPP` (or is a NULL op, which the inline wrappers turn into it).
//!
//! Modules import one way, each only from modules below it: `ops` (opening, importing and
//! closing a device, the context's function tables) → `qp` → `qp_ex` (the `ibv_wr_*`
//! builders) → `ah` → `mw` (memory windows, whose binds post through `ops.post_send`) → `tm`
//! (tag-matching SRQs, `ibv_post_srq_ops`) → `srq` → `xrc` (XRC domains) → `import`
//! (`ibv_import_pd`/`_mr`) → `cq` → `pd` → `context` → `device`; `mcast` (attaching QPs to
//! multicast groups) above `qp`; `stats` (counters on
//! close and exit) sits between `ops` and `context`; `post`
//! (walking a posted list of work requests, inline data) below `qp`, `qp_ex` and `srq`;
//! `handles` (what makes objects importable: `cmd_fd`, handles) below `pd` and `context`;
//! `abi`, `errno`, `logging` and `strings` below all (the crate root only declares, exports
//! and re-exports).

mod abi;
mod ah;
mod context;
mod cq;
mod device;
mod errno;
mod handles;
mod import;
mod logging;
mod mcast;
mod mw;
mod ops;
mod pd;
mod post;
mod qp;
mod qp_ex;
mod rdmacm_hook;
mod srq;
mod stats;
mod strings;
mod tm;
mod xrc;

use roce_cabi::{export, unsupported};

// Version nodes as rdma-core 44's libibverbs.map.in gives them; every symbol any Debian
// rdma-core or perftest program imports is here (verbs-abi.md §1).
export!("ibv_get_device_list" @ "IBVERBS_1.1" => device::get_device_list);
export!("ibv_free_device_list" @ "IBVERBS_1.1" => device::free_device_list);
export!("ibv_get_device_name" @ "IBVERBS_1.1" => device::get_device_name);
export!("ibv_get_device_guid" @ "IBVERBS_1.1" => device::get_device_guid);
export!("ibv_get_device_index" @ "IBVERBS_1.9" => device::get_device_index);
export!("ibv_read_sysfs_file" @ "IBVERBS_1.0" => device::read_sysfs_file);
export!("ibv_get_sysfs_path" @ "IBVERBS_1.0" => device::get_sysfs_path);
export!("ibv_open_device" @ "IBVERBS_1.1" => ops::open_device);
export!("ibv_close_device" @ "IBVERBS_1.1" => ops::close_device);
export!("ibv_query_device" @ "IBVERBS_1.1" => context::query_device);
export!("ibv_query_port" @ "IBVERBS_1.1" => context::query_port_compat);
export!("ibv_query_gid" @ "IBVERBS_1.1" => context::query_gid);
export!("_ibv_query_gid_ex" @ "IBVERBS_1.11" => context::query_gid_ex);
export!("_ibv_query_gid_table" @ "IBVERBS_1.11" => context::query_gid_table);
export!("ibv_query_gid_type" @ "IBVERBS_PRIVATE_34" => context::query_gid_type);
export!("ibv_query_pkey" @ "IBVERBS_1.1" => context::query_pkey);
export!("ibv_get_pkey_index" @ "IBVERBS_1.5" => context::get_pkey_index);
export!("ibv_get_async_event" @ "IBVERBS_1.1" => context::get_async_event);
export!("ibv_ack_async_event" @ "IBVERBS_1.1" => context::ack_async_event);
export!("ibv_fork_init" @ "IBVERBS_1.1" => context::fork_init);
export!("ibv_is_fork_initialized" @ "IBVERBS_1.13" => context::is_fork_initialized);
export!("ibv_alloc_pd" @ "IBVERBS_1.1" => pd::alloc_pd);
export!("ibv_dealloc_pd" @ "IBVERBS_1.1" => pd::dealloc_pd);
export!("ibv_reg_mr" @ "IBVERBS_1.1" => pd::reg_mr);
export!("ibv_reg_mr_iova" @ "IBVERBS_1.7" => pd::reg_mr_iova);
export!("ibv_reg_mr_iova2" @ "IBVERBS_1.8" => pd::reg_mr_iova2);
export!("ibv_dereg_mr" @ "IBVERBS_1.1" => pd::dereg_mr);
export!("ibv_rereg_mr" @ "IBVERBS_1.1" => pd::rereg_mr);
export!("ibv_create_comp_channel" @ "IBVERBS_1.0" => cq::create_comp_channel);
export!("ibv_destroy_comp_channel" @ "IBVERBS_1.0" => cq::destroy_comp_channel);
export!("ibv_create_cq" @ "IBVERBS_1.1" => cq::create_cq);
export!("ibv_destroy_cq" @ "IBVERBS_1.1" => cq::destroy_cq);
export!("ibv_resize_cq" @ "IBVERBS_1.1" => cq::resize_cq);
export!("ibv_get_cq_event" @ "IBVERBS_1.1" => cq::get_cq_event);
export!("ibv_ack_cq_events" @ "IBVERBS_1.1" => cq::ack_cq_events);
export!("ibv_create_qp" @ "IBVERBS_1.1" => qp::create_qp);
export!("ibv_modify_qp" @ "IBVERBS_1.1" => qp::modify_qp);
export!("ibv_query_qp" @ "IBVERBS_1.1" => qp::query_qp);
export!("ibv_destroy_qp" @ "IBVERBS_1.1" => qp::destroy_qp);
export!("ibv_qp_to_qp_ex" @ "IBVERBS_1.6" => qp::qp_to_qp_ex);
export!("ibv_create_srq" @ "IBVERBS_1.1" => srq::create_srq);
export!("ibv_modify_srq" @ "IBVERBS_1.1" => srq::modify_srq);
export!("ibv_query_srq" @ "IBVERBS_1.1" => srq::query_srq);
export!("ibv_destroy_srq" @ "IBVERBS_1.1" => srq::destroy_srq);
export!("ibv_create_ah" @ "IBVERBS_1.1" => ah::create_ah);
export!("ibv_destroy_ah" @ "IBVERBS_1.1" => ah::destroy_ah);
export!("ibv_attach_mcast" @ "IBVERBS_1.1" => mcast::attach_mcast);
export!("ibv_detach_mcast" @ "IBVERBS_1.1" => mcast::detach_mcast);
export!("ibv_init_ah_from_wc" @ "IBVERBS_1.1" => ah::init_ah_from_wc);
export!("ibv_create_ah_from_wc" @ "IBVERBS_1.1" => ah::create_ah_from_wc);
export!("ibv_wc_status_str" @ "IBVERBS_1.1" => strings::wc_status_str);
export!("ibv_event_type_str" @ "IBVERBS_1.1" => strings::event_type_str);
export!("ibv_node_type_str" @ "IBVERBS_1.1" => strings::node_type_str);
export!("ibv_port_state_str" @ "IBVERBS_1.1" => strings::port_state_str);
export!("ibv_import_device" @ "IBVERBS_1.10" => ops::import_device);
export!("ibv_import_pd" @ "IBVERBS_1.10" => import::import_pd);
export!("ibv_import_mr" @ "IBVERBS_1.10" => import::import_mr);
export!("ibv_unimport_pd" @ "IBVERBS_1.10" => import::unimport_pd);
export!("ibv_unimport_mr" @ "IBVERBS_1.10" => import::unimport_mr);
// Not supported by this device; rdma-core fails them the same way for a provider without
// them.
export!("ibv_reg_dmabuf_mr" @ "IBVERBS_1.12" => unsupported::null);
export!("ibv_import_dm" @ "IBVERBS_1.13" => unsupported::null);
export!("ibv_unimport_dm" @ "IBVERBS_1.13" => unsupported::nothing);
export!("ibv_query_ece" @ "IBVERBS_1.10" => unsupported::int);
export!("ibv_set_ece" @ "IBVERBS_1.10" => unsupported::int);
export!("ibv_query_qp_data_in_order" @ "IBVERBS_1.14" => data_in_order_unknown);
// Debian's librdmacm.so.1 imports these; it must load against us (perftest needs it).
export!("ibv_copy_ah_attr_from_kern" @ "IBVERBS_1.1" => unsupported::nothing);
export!("ibv_copy_qp_attr_from_kern" @ "IBVERBS_1.0" => unsupported::nothing);
export!("ibv_copy_path_rec_from_kern" @ "IBVERBS_1.0" => unsupported::nothing);
// rdma_cm (roce-rdmacm, linked here): each call under a private name, which our
// librdmacm.so.1 (verbs-api/rdmacm/shim) forwards its symbol to, so that one library owns
// the process's roce-verbs state.
macro_rules! export_rdmacm {
    ($name:ident @ $version:literal => $entry:path, $returns:ident) => {
        export!("roce_" + $name @ "ROCE_RDMACM_PRIVATE" => $entry);
    };
}
roce_rdmacm::for_each_symbol!(export_rdmacm);
// What roce-rdmacm asks of this library's verbs objects.
export!("roce_rdmacm_verbs_context" @ "ROCE_RDMACM_PRIVATE" => rdmacm_hook::verbs_context);

/// `ibv_query_qp_data_in_order`: 0 promises nothing about placement order.
extern "C" fn data_in_order_unknown() -> i32 {
    0
}

pub(crate) use errno::errno_of;
pub(crate) use logging::failure as log_failure;
