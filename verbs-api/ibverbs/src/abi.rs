//! The C structures of rdma-core 44's `<infiniband/verbs.h>` (x86_64) that callers share with
//! the library, field for field. `layout_tests` compiles a C program against the installed
//! headers and compares every offset and size with these.
//!
//! Slots the library never fills are kept as opaque words so that the named ones sit where
//! C code looks for them.

#![allow(non_camel_case_types)]

use core::ffi::{c_char, c_int, c_void};

pub use roce_cabi::abi::{ibv_ah_attr, ibv_global_route, ibv_qp_attr, ibv_qp_cap};

/// `pthread_mutex_t` (zeroed is `PTHREAD_MUTEX_INITIALIZER` in glibc).
pub type pthread_mutex_t = [u64; 5];
/// `pthread_cond_t` (zeroed is `PTHREAD_COND_INITIALIZER` in glibc).
pub type pthread_cond_t = [u64; 6];

pub const IBV_NODE_CA: c_int = 1;
pub const IBV_TRANSPORT_IB: c_int = 0;

#[repr(C)]
pub struct ibv_device {
    pub _ops: [usize; 2],
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; 64],
    pub dev_name: [c_char; 64],
    pub dev_path: [c_char; 256],
    pub ibdev_path: [c_char; 256],
}

pub type PollCq = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub type ReqNotifyCq = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
pub type PostSend =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub type PostRecv =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type PostSrqRecv =
    unsafe extern "C" fn(*mut c_void, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type QueryPort = unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int;
pub type AllocMw = unsafe extern "C" fn(*mut ibv_pd, u32) -> *mut ibv_mw;
pub type OpenQp = unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_open_attr) -> *mut ibv_qp;
pub type GetSrqNum = unsafe extern "C" fn(*mut ibv_srq, *mut u32) -> c_int;
pub type OpenXrcd =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_xrcd_init_attr) -> *mut ibv_xrcd;
pub type CloseXrcd = unsafe extern "C" fn(*mut ibv_xrcd) -> c_int;
pub type BindMw = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int;
pub type DeallocMw = unsafe extern "C" fn(*mut ibv_mw) -> c_int;

/// `struct ibv_context_ops`: what the inline `ibv_post_send`, `ibv_poll_cq`, ... call.
#[repr(C)]
pub struct ibv_context_ops {
    pub _compat_0_to_56: [usize; 7],
    pub alloc_mw: Option<AllocMw>,
    pub bind_mw: Option<BindMw>,
    pub dealloc_mw: Option<DeallocMw>,
    pub _compat_create_cq: usize,
    pub poll_cq: Option<PollCq>,
    pub req_notify_cq: Option<ReqNotifyCq>,
    pub _compat_104_to_160: [usize; 7],
    pub post_srq_recv: Option<PostSrqRecv>,
    pub _compat_168_to_200: [usize; 4],
    pub post_send: Option<PostSend>,
    pub post_recv: Option<PostRecv>,
    pub _compat_216_to_256: [usize; 5],
}

#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `struct verbs_context`: the extended ops, at fixed negative offsets from the
/// `ibv_context` that ends it. A NULL op makes the inline wrappers fall back to an exported
/// function or fail with `EOPNOTSUPP`.
#[repr(C)]
pub struct verbs_context {
    pub query_port: Option<QueryPort>,
    pub advise_mr: Option<AdviseMr>,
    pub _ops_16_to_104: [usize; 11],
    pub modify_qp_rate_limit: Option<ModifyQpRateLimit>,
    pub alloc_parent_domain: Option<AllocParentDomain>,
    pub dealloc_td: Option<DeallocTd>,
    pub alloc_td: Option<AllocTd>,
    pub modify_cq: usize,
    pub post_srq_ops: Option<PostSrqOps>,
    pub _ops_152_to_192: [usize; 5],
    pub query_rt_values: Option<QueryRtValues>,
    pub create_cq_ex: Option<CreateCqEx>,
    pub _priv: usize,
    pub query_device_ex: Option<QueryDeviceEx>,
    pub _ops_224_to_256: [usize; 4],
    pub open_qp: Option<OpenQp>,
    pub create_qp_ex: Option<CreateQpEx>,
    pub get_srq_num: Option<GetSrqNum>,
    pub create_srq_ex: Option<CreateSrqEx>,
    pub open_xrcd: Option<OpenXrcd>,
    pub close_xrcd: Option<CloseXrcd>,
    pub _abi_placeholder3: u64,
    pub sz: usize,
    pub context: ibv_context,
}

/// What `verbs_get_ctx` requires in `ibv_context.abi_compat` (`__VERBS_ABI_IS_EXTENDED`).
pub const VERBS_ABI_IS_EXTENDED: usize = usize::MAX;

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// The size of `struct _compat_ibv_port_attr`: `ibv_port_attr` before `port_cap_flags2`,
/// what the exported `ibv_query_port` writes (old binaries pass a buffer this long).
pub const COMPAT_PORT_ATTR_LEN: usize = 48;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: u32,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_int,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: u32,
    pub qp_type: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

pub type WrStart = unsafe extern "C" fn(*mut ibv_qp_ex);
pub type WrComplete = unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int;
/// For the builders we do not support: they take more arguments, which the callee may
/// ignore in the C calling convention.
pub type WrUnsupported = unsafe extern "C" fn(*mut ibv_qp_ex);

/// `struct ibv_qp_ex`: an `ibv_qp` and the work request builders (`ibv_wr_*`), which
/// applications call through these pointers after writing `wr_id` and `wr_flags`.
#[repr(C)]
pub struct ibv_qp_ex {
    pub qp_base: ibv_qp,
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: u32,
    pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64)>,
    pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64)>,
    pub wr_bind_mw:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_mw, u32, *const ibv_mw_bind_info)>,
    pub wr_local_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_rdma_read: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_send: Option<WrStart>,
    pub wr_send_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_tso: Option<WrUnsupported>,
    pub wr_set_ud_addr: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32)>,
    pub wr_set_xrc_srqn: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_set_inline_data: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, usize)>,
    pub wr_set_inline_data_list:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_data_buf)>,
    pub wr_set_sge: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_set_sge_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_sge)>,
    pub wr_start: Option<WrStart>,
    pub wr_complete: Option<WrComplete>,
    pub wr_abort: Option<WrStart>,
    pub wr_atomic_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, *const c_void)>,
}

#[repr(C)]
pub struct ibv_data_buf {
    pub addr: *mut c_void,
    pub length: usize,
}

#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    /// `struct ibv_rx_hash_conf`.
    pub rx_hash_conf: [u64; 3],
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

pub const IBV_QP_INIT_ATTR_PD: u32 = 1;
pub const IBV_QP_INIT_ATTR_XRCD: u32 = 1 << 1;
pub const IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;

pub type CreateQpEx =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;

pub const IBV_QPT_RC: u32 = 2;
pub const IBV_QPT_UC: u32 = 3;
pub const IBV_QPT_UD: u32 = 4;
pub const IBV_QPT_XRC_SEND: u32 = 9;
pub const IBV_QPT_XRC_RECV: u32 = 10;

/// `struct ibv_xrcd`.
#[repr(C)]
pub struct ibv_xrcd {
    pub context: *mut ibv_context,
}

/// `struct ibv_xrcd_init_attr`.
#[repr(C)]
pub struct ibv_xrcd_init_attr {
    pub comp_mask: u32,
    pub fd: c_int,
    pub oflags: c_int,
}

/// `enum ibv_xrcd_init_attr_mask`.
pub const IBV_XRCD_INIT_ATTR_FD: u32 = 1;
pub const IBV_XRCD_INIT_ATTR_OFLAGS: u32 = 1 << 1;
pub const IBV_XRCD_INIT_ATTR_RESERVED: u32 = 1 << 2;

/// `struct ibv_qp_open_attr`: what `ibv_open_qp` takes.
#[repr(C)]
pub struct ibv_qp_open_attr {
    pub comp_mask: u32,
    pub qp_num: u32,
    pub xrcd: *mut ibv_xrcd,
    pub qp_context: *mut c_void,
    pub qp_type: u32,
}

/// `enum ibv_qp_open_attr_mask`.
pub const IBV_QP_OPEN_ATTR_NUM: u32 = 1;
pub const IBV_QP_OPEN_ATTR_XRCD: u32 = 1 << 1;
pub const IBV_QP_OPEN_ATTR_CONTEXT: u32 = 1 << 2;
pub const IBV_QP_OPEN_ATTR_TYPE: u32 = 1 << 3;
pub const IBV_QP_OPEN_ATTR_RESERVED: u32 = 1 << 4;

#[repr(C)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_rdma_wr {
    pub remote_addr: u64,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_atomic_wr {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_ud_wr {
    pub ah: *mut ibv_ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// The `wr` union of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_rdma_wr,
    pub atomic: ibv_atomic_wr,
    pub ud: ibv_ud_wr,
}

#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: u32,
    /// `imm_data` (big-endian) or `invalidate_rkey`.
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    /// `qp_type.xrc.remote_srqn`.
    pub remote_srqn: u32,
    /// The `bind_mw` member of the `bind_mw` / `tso` union (the larger).
    pub bind_mw: ibv_bind_mw_wr,
}

/// `struct ibv_mw`.
#[repr(C)]
pub struct ibv_mw {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub rkey: u32,
    pub handle: u32,
    /// `type` (`enum ibv_mw_type`).
    pub mw_type: u32,
}

pub const IBV_MW_TYPE_1: u32 = 1;
pub const IBV_MW_TYPE_2: u32 = 2;
/// `IBV_ACCESS_ZERO_BASED`: a window addressed from 0.
pub const IBV_ACCESS_ZERO_BASED: u32 = 1 << 5;

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: u32,
}

/// `struct ibv_mw_bind`: what `ibv_bind_mw` takes.
#[repr(C)]
pub struct ibv_mw_bind {
    pub wr_id: u64,
    pub send_flags: u32,
    pub bind_info: ibv_mw_bind_info,
}

/// The `bind_mw` member of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_bind_mw_wr {
    pub mw: *mut ibv_mw,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

pub const IBV_WR_RDMA_WRITE: u32 = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: u32 = 1;
pub const IBV_WR_SEND: u32 = 2;
pub const IBV_WR_SEND_WITH_IMM: u32 = 3;
pub const IBV_WR_RDMA_READ: u32 = 4;
pub const IBV_WR_ATOMIC_CMP_AND_SWP: u32 = 5;
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: u32 = 6;
pub const IBV_WR_LOCAL_INV: u32 = 7;
pub const IBV_WR_BIND_MW: u32 = 8;
pub const IBV_WR_SEND_WITH_INV: u32 = 9;

#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (big-endian) or `invalidated_rkey`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

pub const IBV_WC_GRH: u32 = 1;
pub const IBV_WC_WITH_IMM: u32 = 2;
pub const IBV_WC_WITH_INV: u32 = 1 << 3;

/// `enum ibv_qp_attr_mask`.
pub mod qp_mask {
    pub const STATE: i32 = 1;
    pub const CUR_STATE: i32 = 1 << 1;
    pub const ACCESS_FLAGS: i32 = 1 << 3;
    pub const PKEY_INDEX: i32 = 1 << 4;
    pub const PORT: i32 = 1 << 5;
    pub const QKEY: i32 = 1 << 6;
    pub const AV: i32 = 1 << 7;
    pub const PATH_MTU: i32 = 1 << 8;
    pub const TIMEOUT: i32 = 1 << 9;
    pub const RETRY_CNT: i32 = 1 << 10;
    pub const RNR_RETRY: i32 = 1 << 11;
    pub const RQ_PSN: i32 = 1 << 12;
    pub const MAX_QP_RD_ATOMIC: i32 = 1 << 13;
    pub const MIN_RNR_TIMER: i32 = 1 << 15;
    pub const SQ_PSN: i32 = 1 << 16;
    pub const MAX_DEST_RD_ATOMIC: i32 = 1 << 17;
    pub const DEST_QPN: i32 = 1 << 20;
    pub const RATE_LIMIT: i32 = 1 << 25;
}

#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

/// Aligned to 8 as C aligns it: `union ibv_gid` has a 64-bit member.
#[repr(C, align(8))]
pub struct ibv_gid_entry {
    pub gid: [u8; 16],
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// `IBV_GID_TYPE_ROCE_V2` of `enum ibv_gid_type`.
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
/// `enum ibv_gid_type_sysfs`.
pub const IBV_GID_TYPE_SYSFS_IB_ROCE_V1: u32 = 0;
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: u32 = 1;

#[repr(C)]
pub struct ibv_async_event {
    /// The `element` union: a CQ, QP, SRQ or WQ pointer, or the port number.
    pub element: usize,
    pub event_type: u32,
}

#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

#[repr(C)]
pub struct ibv_srq_init_attr_ex {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
    pub comp_mask: u32,
    pub srq_type: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub cq: *mut ibv_cq,
    pub tm_cap: ibv_tm_cap,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_tm_cap {
    pub max_num_tags: u32,
    pub max_ops: u32,
}

pub type CreateSrqEx =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq;

/// `enum ibv_srq_init_attr_mask`.
pub const IBV_SRQ_INIT_ATTR_TYPE: u32 = 1;
pub const IBV_SRQ_INIT_ATTR_PD: u32 = 1 << 1;
pub const IBV_SRQ_INIT_ATTR_XRCD: u32 = 1 << 2;
pub const IBV_SRQ_INIT_ATTR_CQ: u32 = 1 << 3;
pub const IBV_SRQ_INIT_ATTR_TM: u32 = 1 << 4;
/// `IBV_SRQT_XRC`.
pub const IBV_SRQT_XRC: u32 = 1;
/// `IBV_SRQT_BASIC` of `enum ibv_srq_type` (the others are XRC and tag matching).
pub const IBV_SRQT_BASIC: u32 = 0;
pub const IBV_SRQT_TM: u32 = 2;

/// `struct ibv_ops_wr`: a tag-matching list operation (`ibv_post_srq_ops`).
#[repr(C)]
pub struct ibv_ops_wr {
    pub wr_id: u64,
    pub next: *mut ibv_ops_wr,
    pub opcode: u32,
    pub flags: c_int,
    pub tm: ibv_ops_wr_tm,
}

/// `ibv_ops_wr.tm`.
#[repr(C)]
pub struct ibv_ops_wr_tm {
    pub unexpected_cnt: u32,
    pub handle: u32,
    pub add: ibv_ops_wr_tm_add,
}

/// `ibv_ops_wr.tm.add`.
#[repr(C)]
pub struct ibv_ops_wr_tm_add {
    pub recv_wr_id: u64,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub tag: u64,
    pub mask: u64,
}

/// `enum ibv_ops_wr_opcode`.
pub const IBV_WR_TAG_ADD: u32 = 0;
pub const IBV_WR_TAG_DEL: u32 = 1;
pub const IBV_WR_TAG_SYNC: u32 = 2;
/// `enum ibv_ops_flags`.
pub const IBV_OPS_SIGNALED: c_int = 1;
pub const IBV_OPS_TM_SYNC: c_int = 1 << 1;

pub type PostSrqOps =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_ops_wr, *mut *mut ibv_ops_wr) -> c_int;

/// `struct ibv_tm_caps` of `ibv_device_attr_ex`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_tm_caps {
    pub max_rndv_hdr_size: u32,
    pub max_num_tags: u32,
    pub flags: u32,
    pub max_ops: u32,
    pub max_sge: u32,
}

/// `IBV_TM_CAP_RC` of `enum ibv_tm_cap_flags`.
pub const IBV_TM_CAP_RC: u32 = 1;

/// `struct ibv_wc_tm_info` (`ibv_wc_read_tm_info`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc_tm_info {
    pub tag: u64,
    pub priv_: u32,
}

pub type ReadTmInfo = unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_wc_tm_info);
/// `enum ibv_srq_attr_mask`.
pub const IBV_SRQ_MAX_WR: c_int = 1;
pub const IBV_SRQ_LIMIT: c_int = 1 << 1;

/// `struct ibv_cq_ex`: an `ibv_cq` followed by the polling entry points the inline
/// `ibv_start_poll`, `ibv_wc_read_*`, ... call; callers read `status` and `wr_id` directly.
#[repr(C)]
pub struct ibv_cq_ex {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
    pub comp_mask: u32,
    pub status: u32,
    pub wr_id: u64,
    pub start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int>,
    pub next_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
    pub end_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex)>,
    pub read_opcode: Option<ReadU32>,
    pub read_vendor_err: Option<ReadU32>,
    pub read_byte_len: Option<ReadU32>,
    pub read_imm_data: Option<ReadU32>,
    pub read_qp_num: Option<ReadU32>,
    pub read_src_qp: Option<ReadU32>,
    pub read_wc_flags: Option<ReadU32>,
    pub read_slid: Option<ReadU32>,
    pub read_sl: Option<ReadU8>,
    pub read_dlid_path_bits: Option<ReadU8>,
    pub read_completion_ts: Option<ReadU64>,
    pub read_cvlan: usize,
    pub read_flow_tag: usize,
    pub read_tm_info: Option<ReadTmInfo>,
    pub read_completion_wallclock_ns: Option<ReadU64>,
}

/// The `ibv_wc_read_*` entry points, by the width of what they return.
pub type ReadU32 = unsafe extern "C" fn(*mut ibv_cq_ex) -> u32;
pub type ReadU8 = unsafe extern "C" fn(*mut ibv_cq_ex) -> u8;
pub type ReadU64 = unsafe extern "C" fn(*mut ibv_cq_ex) -> u64;

#[repr(C)]
pub struct ibv_poll_cq_attr {
    pub comp_mask: u32,
}

#[repr(C)]
pub struct ibv_cq_init_attr_ex {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut ibv_pd,
}

pub type CreateCqEx =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex;

/// `enum ibv_create_cq_wc_flags`.
pub mod wc_ex {
    pub const BYTE_LEN: u64 = 1;
    pub const IMM: u64 = 1 << 1;
    pub const QP_NUM: u64 = 1 << 2;
    pub const SRC_QP: u64 = 1 << 3;
    pub const SLID: u64 = 1 << 4;
    pub const SL: u64 = 1 << 5;
    pub const DLID_PATH_BITS: u64 = 1 << 6;
    pub const COMPLETION_TIMESTAMP: u64 = 1 << 7;
    pub const TM_INFO: u64 = 1 << 10;
    pub const COMPLETION_TIMESTAMP_WALLCLOCK: u64 = 1 << 11;
    /// `IBV_WC_STANDARD_FLAGS`.
    pub const STANDARD: u64 = BYTE_LEN | IMM | QP_NUM | SRC_QP | SLID | SL | DLID_PATH_BITS;
}

/// `enum ibv_cq_init_attr_mask`.
pub const IBV_CQ_INIT_ATTR_MASK_FLAGS: u32 = 1;
pub const IBV_CQ_INIT_ATTR_MASK_PD: u32 = 1 << 1;
/// `enum ibv_create_cq_attr_flags`.
pub const IBV_CREATE_CQ_ATTR_SINGLE_THREADED: u32 = 1;

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_odp_caps {
    pub general_caps: u64,
    pub rc_odp_caps: u32,
    pub uc_odp_caps: u32,
    pub ud_odp_caps: u32,
}

/// `enum ibv_odp_general_caps` and `enum ibv_odp_transport_cap_bits`.
pub mod odp {
    pub const SUPPORT: u64 = 1;
    pub const SUPPORT_IMPLICIT: u64 = 1 << 1;
    pub const SEND: u32 = 1;
    pub const RECV: u32 = 1 << 1;
    pub const WRITE: u32 = 1 << 2;
    pub const READ: u32 = 1 << 3;
    pub const ATOMIC: u32 = 1 << 4;
    pub const SRQ_RECV: u32 = 1 << 5;
}

/// `struct ibv_device_attr_ex`; the capabilities we have none of (TSO, RSS, packet pacing,
/// tag matching, CQ moderation, device memory, PCI atomics) are opaque zeroes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr_ex {
    pub orig_attr: ibv_device_attr,
    pub comp_mask: u32,
    pub odp_caps: ibv_odp_caps,
    pub completion_timestamp_mask: u64,
    pub hca_core_clock: u64,
    pub device_cap_flags_ex: u64,
    /// `tso_caps`, `rss_caps`, `max_wq_type_rq`, `packet_pacing_caps`, `raw_packet_caps`.
    pub _offloads: [u32; 15],
    pub tm_caps: ibv_tm_caps,
    /// `struct ibv_cq_moderation_caps`.
    pub cq_mod_caps: [u16; 2],
    pub max_dm_size: u64,
    /// `struct ibv_pci_atomic_caps`.
    pub pci_atomic_caps: [u16; 3],
    pub xrc_odp_caps: u32,
    pub phys_port_cnt_ex: u32,
}

#[repr(C)]
pub struct ibv_query_device_ex_input {
    pub comp_mask: u32,
}

pub type QueryDeviceEx = unsafe extern "C" fn(
    *mut ibv_context,
    *const ibv_query_device_ex_input,
    *mut ibv_device_attr_ex,
    usize,
) -> c_int;

/// `struct timespec` on x86_64.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct timespec {
    pub tv_sec: i64,
    pub tv_nsec: i64,
}

#[repr(C)]
pub struct ibv_values_ex {
    pub comp_mask: u32,
    pub raw_clock: timespec,
}

/// `IBV_VALUES_MASK_RAW_CLOCK` of `enum ibv_values_mask`.
pub const IBV_VALUES_MASK_RAW_CLOCK: u32 = 1;

pub type QueryRtValues = unsafe extern "C" fn(*mut ibv_context, *mut ibv_values_ex) -> c_int;

#[repr(C)]
pub struct ibv_td {
    pub context: *mut ibv_context,
}

#[repr(C)]
pub struct ibv_td_init_attr {
    pub comp_mask: u32,
}

pub type AllocTd = unsafe extern "C" fn(*mut ibv_context, *mut ibv_td_init_attr) -> *mut ibv_td;
pub type DeallocTd = unsafe extern "C" fn(*mut ibv_td) -> c_int;

/// A parent domain's allocator: `IBV_ALLOCATOR_USE_DEFAULT` ((void *)-1) asks for ours.
pub type PdAlloc = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, usize, u64) -> *mut c_void;
pub type PdFree = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, *mut c_void, u64);

#[repr(C)]
pub struct ibv_parent_domain_init_attr {
    pub pd: *mut ibv_pd,
    pub td: *mut ibv_td,
    pub comp_mask: u32,
    pub alloc: Option<PdAlloc>,
    pub free: Option<PdFree>,
    pub pd_context: *mut c_void,
}

/// `enum ibv_parent_domain_init_attr_mask`.
pub const IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS: u32 = 1;
pub const IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT: u32 = 1 << 1;

pub type AllocParentDomain =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_parent_domain_init_attr) -> *mut ibv_pd;

/// `struct ibv_qp_rate_limit_attr` (`ibv_modify_qp_rate_limit`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_rate_limit_attr {
    /// kbit/s; 0 removes the limit.
    pub rate_limit: u32,
    /// Bytes; 0 is the device's default.
    pub max_burst_sz: u32,
    pub typical_pkt_sz: u16,
    pub comp_mask: u32,
}

pub type ModifyQpRateLimit =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_rate_limit_attr) -> c_int;

pub type AdviseMr = unsafe extern "C" fn(*mut ibv_pd, u32, u32, *mut ibv_sge, u32) -> c_int;

/// `enum ib_uverbs_advise_mr_advice` and its one flag.
pub const IBV_ADVISE_MR_ADVICE_PREFETCH: u32 = 0;
pub const IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE: u32 = 1;
pub const IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT: u32 = 2;
pub const IBV_ADVISE_MR_FLAG_FLUSH: u32 = 1;

/// `enum ibv_rereg_mr_flags`.
pub const IBV_REREG_MR_CHANGE_TRANSLATION: c_int = 1;
pub const IBV_REREG_MR_CHANGE_PD: c_int = 1 << 1;
pub const IBV_REREG_MR_CHANGE_ACCESS: c_int = 1 << 2;
pub const IBV_REREG_MR_FLAGS_SUPPORTED: c_int = (IBV_REREG_MR_CHANGE_ACCESS << 1) - 1;
/// `enum ibv_rereg_mr_err_code`: the old region is still valid after an input error; after a
/// command error it should not be used.
pub const IBV_REREG_MR_ERR_INPUT: c_int = -1;
pub const IBV_REREG_MR_ERR_CMD: c_int = -4;

/// `enum ibv_fork_status`.
pub const IBV_FORK_UNNEEDED: c_int = 2;

#[cfg(test)]
mod layout_tests {
    use super::*;
    use core::mem::offset_of;

    /// One row per C expression: `sizeof(struct X)` or `offsetof(struct X, field)`, with
    /// our value.
    fn rows() -> Vec<(String, usize)> {
        let mut rows = Vec::new();
        rows.extend(roce_cabi::layout_rows! {
            ibv_device { node_type, transport_type, name, dev_name, dev_path, ibdev_path }
            ibv_context_ops {
                alloc_mw, bind_mw, dealloc_mw, poll_cq, req_notify_cq, post_srq_recv, post_send,
                post_recv
            }
            ibv_context { ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat }
            verbs_context {
                query_port, advise_mr, alloc_parent_domain, dealloc_td, alloc_td, query_rt_values,
                create_cq_ex, query_device_ex, create_qp_ex, sz, get_srq_num, create_srq_ex, context,
                open_qp, open_xrcd, close_xrcd, modify_qp_rate_limit, post_srq_ops
            }
            ibv_qp_rate_limit_attr { rate_limit, max_burst_sz, typical_pkt_sz, comp_mask }
            ibv_port_attr {
                state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, pkey_tbl_len,
                lid, sm_lid, lmc, max_vl_num, active_width, active_speed, phys_state, link_layer,
                flags, port_cap_flags2
            }
            ibv_device_attr {
                node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id, vendor_part_id,
                hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd, max_cq, max_cqe,
                max_mr, max_pd, max_qp_rd_atom, max_res_rd_atom, max_qp_init_rd_atom, atomic_cap,
                max_mw, max_ah, max_srq, max_srq_wr, max_srq_sge, max_pkeys, local_ca_ack_delay,
                phys_port_cnt
            }
            ibv_pd { context, handle }
            ibv_mr { context, pd, addr, length, handle, lkey, rkey }
            ibv_comp_channel { context, fd, refcnt }
            ibv_cq {
                context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
                async_events_completed
            }
            ibv_qp {
                context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type,
                mutex, cond, events_completed
            }
            ibv_qp_ex {
                qp_base, comp_mask, wr_id, wr_flags, wr_atomic_cmp_swp, wr_atomic_fetch_add,
                wr_bind_mw, wr_local_inv, wr_rdma_read, wr_rdma_write, wr_rdma_write_imm, wr_send,
                wr_send_imm, wr_send_inv, wr_send_tso, wr_set_ud_addr, wr_set_xrc_srqn,
                wr_set_inline_data, wr_set_inline_data_list, wr_set_sge, wr_set_sge_list, wr_start,
                wr_complete, wr_abort, wr_atomic_write
            }
            ibv_data_buf { addr, length }
            ibv_qp_init_attr_ex {
                cap, qp_type, sq_sig_all, comp_mask, pd, xrcd, create_flags, max_tso_header,
                rwq_ind_tbl, rx_hash_conf, source_qpn, send_ops_flags
            }
            ibv_ah { context, pd, handle }
            ibv_sge { addr, length, lkey }
            ibv_send_wr { wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data, wr }
        });
        // The union members and the fields our struct names otherwise.
        let wr = offset_of!(ibv_send_wr, wr);
        for (member, value) in [
            (
                "wr.rdma.remote_addr",
                wr + offset_of!(ibv_rdma_wr, remote_addr),
            ),
            ("wr.rdma.rkey", wr + offset_of!(ibv_rdma_wr, rkey)),
            (
                "wr.atomic.compare_add",
                wr + offset_of!(ibv_atomic_wr, compare_add),
            ),
            ("wr.atomic.swap", wr + offset_of!(ibv_atomic_wr, swap)),
            ("wr.atomic.rkey", wr + offset_of!(ibv_atomic_wr, rkey)),
            ("wr.ud.ah", wr + offset_of!(ibv_ud_wr, ah)),
            ("wr.ud.remote_qpn", wr + offset_of!(ibv_ud_wr, remote_qpn)),
            ("wr.ud.remote_qkey", wr + offset_of!(ibv_ud_wr, remote_qkey)),
            (
                "qp_type.xrc.remote_srqn",
                offset_of!(ibv_send_wr, remote_srqn),
            ),
            ("bind_mw", offset_of!(ibv_send_wr, bind_mw)),
            (
                "bind_mw.mw",
                offset_of!(ibv_send_wr, bind_mw) + offset_of!(ibv_bind_mw_wr, mw),
            ),
            (
                "bind_mw.rkey",
                offset_of!(ibv_send_wr, bind_mw) + offset_of!(ibv_bind_mw_wr, rkey),
            ),
            (
                "bind_mw.bind_info",
                offset_of!(ibv_send_wr, bind_mw) + offset_of!(ibv_bind_mw_wr, bind_info),
            ),
        ] {
            rows.push((format!("offsetof(struct ibv_send_wr, {member})"), value));
        }
        rows.extend(roce_cabi::layout_rows! {
            ibv_recv_wr { wr_id, next, sg_list, num_sge }
            ibv_wc {
                wr_id, status, opcode, vendor_err, byte_len, imm_data, qp_num, src_qp, wc_flags,
                pkey_index, slid, sl, dlid_path_bits
            }
            ibv_global_route { dgid, flow_label, sgid_index, hop_limit, traffic_class }
            ibv_ah_attr { grh, dlid, sl, src_path_bits, static_rate, is_global, port_num }
            ibv_qp_cap { max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data }
            ibv_qp_attr {
                qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn,
                dest_qp_num, qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index,
                alt_pkey_index, en_sqd_async_notify, sq_draining, max_rd_atomic,
                max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry,
                alt_port_num, alt_timeout, rate_limit
            }
            ibv_qp_init_attr { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all }
            ibv_gid_entry { gid, gid_index, port_num, gid_type, ndev_ifindex }
            ibv_async_event { element, event_type }
            ibv_srq { context, srq_context, pd, handle, mutex, cond, events_completed }
            ibv_srq_attr { max_wr, max_sge, srq_limit }
            ibv_srq_init_attr { srq_context, attr }
            ibv_srq_init_attr_ex { srq_context, attr, comp_mask, srq_type, pd, xrcd, cq, tm_cap }
            ibv_mw { context, pd, rkey, handle }
            ibv_mw_bind_info { mr, addr, length, mw_access_flags }
            ibv_mw_bind { wr_id, send_flags, bind_info }
            ibv_xrcd { context }
            ibv_xrcd_init_attr { comp_mask, fd, oflags }
            ibv_qp_open_attr { comp_mask, qp_num, xrcd, qp_context, qp_type }
            ibv_cq_ex {
                context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
                async_events_completed, comp_mask, status, wr_id, start_poll, next_poll, end_poll,
                read_opcode, read_vendor_err, read_byte_len, read_imm_data, read_qp_num,
                read_src_qp, read_wc_flags, read_slid, read_sl, read_dlid_path_bits,
                read_completion_ts, read_cvlan, read_flow_tag, read_tm_info,
                read_completion_wallclock_ns
            }
            ibv_poll_cq_attr { comp_mask }
            ibv_cq_init_attr_ex {
                cqe, cq_context, channel, comp_vector, wc_flags, comp_mask, flags, parent_domain
            }
            ibv_odp_caps { general_caps }
            ibv_device_attr_ex {
                orig_attr, comp_mask, odp_caps, completion_timestamp_mask, hca_core_clock,
                device_cap_flags_ex, tm_caps, cq_mod_caps, max_dm_size, pci_atomic_caps,
                xrc_odp_caps, phys_port_cnt_ex
            }
            ibv_tm_caps { max_rndv_hdr_size, max_num_tags, flags, max_ops, max_sge }
            ibv_tm_cap { max_num_tags, max_ops }
            ibv_ops_wr { wr_id, next, opcode, flags, tm }
            ibv_wc_tm_info { tag }
            ibv_query_device_ex_input { comp_mask }
            ibv_values_ex { comp_mask, raw_clock }
            ibv_td { context }
            ibv_td_init_attr { comp_mask }
            ibv_parent_domain_init_attr { pd, td, comp_mask, alloc, free, pd_context }
        });
        rows.push((
            "offsetof(struct ibv_mw, type)".into(),
            offset_of!(ibv_mw, mw_type),
        ));
        // The enum values the memory-window and invalidation paths use.
        for (name, value) in [
            ("IBV_WC_WITH_INV", IBV_WC_WITH_INV),
            ("IBV_WR_LOCAL_INV", IBV_WR_LOCAL_INV),
            ("IBV_WR_BIND_MW", IBV_WR_BIND_MW),
            ("IBV_WR_SEND_WITH_INV", IBV_WR_SEND_WITH_INV),
            ("IBV_MW_TYPE_1", IBV_MW_TYPE_1),
            ("IBV_MW_TYPE_2", IBV_MW_TYPE_2),
            ("IBV_ACCESS_ZERO_BASED", IBV_ACCESS_ZERO_BASED),
            ("IBV_WC_BIND_MW", roce_verbs::WcOpcode::BindMw as u32),
            ("IBV_WC_LOCAL_INV", roce_verbs::WcOpcode::LocalInv as u32),
            ("IBV_WC_MW_BIND_ERR", roce_verbs::WcStatus::MwBind as u32),
            (
                "IBV_ACCESS_MW_BIND",
                roce_verbs::AccessFlags::MW_BIND.bits(),
            ),
            ("IBV_QPT_XRC_SEND", IBV_QPT_XRC_SEND),
            ("IBV_QPT_XRC_RECV", IBV_QPT_XRC_RECV),
            ("IBV_QP_INIT_ATTR_XRCD", IBV_QP_INIT_ATTR_XRCD),
            ("IBV_SRQ_INIT_ATTR_XRCD", IBV_SRQ_INIT_ATTR_XRCD),
            ("IBV_SRQ_INIT_ATTR_CQ", IBV_SRQ_INIT_ATTR_CQ),
            ("IBV_SRQT_XRC", IBV_SRQT_XRC),
            ("IBV_XRCD_INIT_ATTR_RESERVED", IBV_XRCD_INIT_ATTR_RESERVED),
            ("IBV_QP_OPEN_ATTR_RESERVED", IBV_QP_OPEN_ATTR_RESERVED),
        ] {
            rows.push((name.into(), value as usize));
        }
        // Members of anonymous structs and of the offloads we keep opaque.
        let odp = offset_of!(ibv_device_attr_ex, odp_caps);
        for (member, value) in [
            (
                "odp_caps.per_transport_caps.rc_odp_caps",
                odp + offset_of!(ibv_odp_caps, rc_odp_caps),
            ),
            (
                "odp_caps.per_transport_caps.uc_odp_caps",
                odp + offset_of!(ibv_odp_caps, uc_odp_caps),
            ),
            (
                "odp_caps.per_transport_caps.ud_odp_caps",
                odp + offset_of!(ibv_odp_caps, ud_odp_caps),
            ),
            ("tso_caps", offset_of!(ibv_device_attr_ex, _offloads)),
        ] {
            rows.push((
                format!("offsetof(struct ibv_device_attr_ex, {member})"),
                value,
            ));
        }
        let tm = offset_of!(ibv_ops_wr, tm);
        let add = tm + offset_of!(ibv_ops_wr_tm, add);
        for (member, value) in [
            (
                "tm.unexpected_cnt",
                tm + offset_of!(ibv_ops_wr_tm, unexpected_cnt),
            ),
            ("tm.handle", tm + offset_of!(ibv_ops_wr_tm, handle)),
            (
                "tm.add.recv_wr_id",
                add + offset_of!(ibv_ops_wr_tm_add, recv_wr_id),
            ),
            (
                "tm.add.sg_list",
                add + offset_of!(ibv_ops_wr_tm_add, sg_list),
            ),
            (
                "tm.add.num_sge",
                add + offset_of!(ibv_ops_wr_tm_add, num_sge),
            ),
            ("tm.add.tag", add + offset_of!(ibv_ops_wr_tm_add, tag)),
            ("tm.add.mask", add + offset_of!(ibv_ops_wr_tm_add, mask)),
        ] {
            rows.push((format!("offsetof(struct ibv_ops_wr, {member})"), value));
        }
        rows.push((
            "offsetof(struct ibv_wc_tm_info, priv)".into(),
            offset_of!(ibv_wc_tm_info, priv_),
        ));
        // Tag matching's constants, and the transport's values of its completions.
        use roce_verbs::{TmFlags, WcOpcode, WcStatus};
        for (name, value) in [
            ("IBV_SRQT_TM", IBV_SRQT_TM as usize),
            ("IBV_SRQ_INIT_ATTR_CQ", IBV_SRQ_INIT_ATTR_CQ as usize),
            ("IBV_SRQ_INIT_ATTR_TM", IBV_SRQ_INIT_ATTR_TM as usize),
            ("IBV_WR_TAG_ADD", IBV_WR_TAG_ADD as usize),
            ("IBV_WR_TAG_DEL", IBV_WR_TAG_DEL as usize),
            ("IBV_WR_TAG_SYNC", IBV_WR_TAG_SYNC as usize),
            ("IBV_OPS_SIGNALED", IBV_OPS_SIGNALED as usize),
            ("IBV_OPS_TM_SYNC", IBV_OPS_TM_SYNC as usize),
            ("IBV_TM_CAP_RC", IBV_TM_CAP_RC as usize),
            ("IBV_WC_EX_WITH_TM_INFO", wc_ex::TM_INFO as usize),
            ("IBV_WC_TM_SYNC_REQ", TmFlags::SYNC_REQ.bits() as usize),
            ("IBV_WC_TM_MATCH", TmFlags::MATCH.bits() as usize),
            ("IBV_WC_TM_DATA_VALID", TmFlags::DATA_VALID.bits() as usize),
            ("IBV_WC_TM_ADD", WcOpcode::TmAdd as usize),
            ("IBV_WC_TM_DEL", WcOpcode::TmDel as usize),
            ("IBV_WC_TM_SYNC", WcOpcode::TmSync as usize),
            ("IBV_WC_TM_RECV", WcOpcode::TmRecv as usize),
            ("IBV_WC_TM_NO_TAG", WcOpcode::TmNoTag as usize),
            ("IBV_WC_TM_ERR", WcStatus::TmError as usize),
            (
                "IBV_WC_TM_RNDV_INCOMPLETE",
                WcStatus::TmRndvIncomplete as usize,
            ),
        ] {
            rows.push((name.into(), value));
        }
        rows.push(("sizeof(struct timespec)".into(), size_of::<timespec>()));
        rows
    }

    /// Compiles a program printing each row's C value against Debian's libibverbs-dev
    /// headers and compares. Needs gcc and /usr/include/infiniband/verbs.h.
    #[test]
    fn layouts_match_the_installed_verbs_h() {
        roce_cabi::probe::assert_layouts(
            "#include <stddef.h>\n#include <time.h>\n#include <infiniband/verbs.h>\n",
            &rows(),
        );
        assert_eq!(
            offset_of!(verbs_context, context),
            320,
            "checked against C above; verbs_get_ctx relies on it"
        );
    }
}
