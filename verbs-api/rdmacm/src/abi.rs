//! rdma_cma.h's structs as Debian's librdmacm-dev 44 lays them out (x86_64; offsets from
//! pahole in verbs-abi.md §5.1), and the few verbs.h structs this library reads or writes.

#![allow(non_camel_case_types)]

use core::ffi::{c_char, c_int, c_void};

use libc::sockaddr_storage;

pub use roce_cabi::abi::{ibv_ah_attr, ibv_qp_attr, ibv_qp_cap};

/// `struct rdma_event_channel`.
#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// `struct rdma_ib_addr`: aligned to 8 as C aligns it (`union ibv_gid` has a 64-bit member).
#[repr(C, align(8))]
pub struct rdma_ib_addr {
    pub sgid: [u8; 16],
    pub dgid: [u8; 16],
    pub pkey: u16,
}

/// `struct rdma_addr`: the source and destination as `sockaddr_storage` unions.
#[repr(C)]
pub struct rdma_addr {
    pub src_addr: sockaddr_storage,
    pub dst_addr: sockaddr_storage,
    pub ibaddr: rdma_ib_addr,
}

/// `struct rdma_route`.
#[repr(C)]
pub struct rdma_route {
    pub addr: rdma_addr,
    pub path_rec: *mut c_void,
    pub num_paths: c_int,
}

/// `struct rdma_cm_id` (416 bytes).
#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut c_void,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    pub route: rdma_route,
    pub ps: c_int,
    pub port_num: u8,
    pub event: *mut rdma_cm_event,
    pub send_cq_channel: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq_channel: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub pd: *mut c_void,
    pub qp_type: c_int,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_cm_event` (80 bytes): `param` is the union of `rdma_conn_param` and the
/// 56-byte `rdma_ud_param`.
#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: c_int,
    pub status: c_int,
    pub param: EventParam,
}

/// `struct rdma_ud_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

/// The `param` union of `rdma_cm_event`.
#[repr(C)]
pub union EventParam {
    pub conn: rdma_conn_param,
    pub ud: rdma_ud_param,
}

/// `struct rdma_addrinfo` (96 bytes).
#[repr(C)]
pub struct rdma_addrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: libc::socklen_t,
    pub ai_dst_len: libc::socklen_t,
    pub ai_src_addr: *mut libc::sockaddr,
    pub ai_dst_addr: *mut libc::sockaddr,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut rdma_addrinfo,
}

/// `struct ibv_sa_path_rec` (infiniband/sa.h, 64 bytes): what `id->route.path_rec` points to.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct ibv_sa_path_rec {
    pub dgid: [u8; 16],
    pub sgid: [u8; 16],
    pub dlid: u16,
    pub slid: u16,
    pub raw_traffic: c_int,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub reversible: c_int,
    pub numb_path: u8,
    pub pkey: u16,
    pub sl: u8,
    pub mtu_selector: u8,
    pub mtu: u8,
    pub rate_selector: u8,
    pub rate: u8,
    pub packet_life_time_selector: u8,
    pub packet_life_time: u8,
    pub preference: u8,
}

/// The head of `struct ibv_qp` (verbs.h), as far as this library reads it.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut c_void,
    pub qp_context: *mut c_void,
    pub pd: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: u32,
    pub qp_type: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

/// `struct ibv_qp_init_attr_ex` up to `pd`: what `rdma_create_qp_ex` reads or fills; the
/// rest stays the caller's, passed on to libibverbs in place.
#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    pub qp_context: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut c_void,
}

/// `struct rdma_cm_join_mc_attr_ex`.
#[repr(C)]
pub struct rdma_cm_join_mc_attr_ex {
    pub comp_mask: u32,
    pub join_flags: u32,
    pub addr: *mut libc::sockaddr,
}

/// `RDMA_CM_JOIN_MC_ATTR_ADDRESS`, `_JOIN_FLAGS` and the first value past them.
pub const RDMA_CM_JOIN_MC_ATTR_ADDRESS: u32 = 1;
pub const RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS: u32 = 2;
pub const RDMA_CM_JOIN_MC_ATTR_RESERVED: u32 = 4;
/// `RDMA_MC_JOIN_FLAG_FULLMEMBER`, `_SENDONLY_FULLMEMBER` and the first value past them.
pub const RDMA_MC_JOIN_FLAG_FULLMEMBER: u32 = 0;
pub const RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: u32 = 1;
pub const RDMA_MC_JOIN_FLAG_RESERVED: u32 = 2;

/// `IBV_QP_INIT_ATTR_PD`.
pub const IBV_QP_INIT_ATTR_PD: u32 = 1;

/// `verbs_context.create_qp_ex`, the op behind verbs.h's inline `ibv_create_qp_ex`.
pub type CreateQpEx = unsafe extern "C" fn(*mut c_void, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;

/// Where `verbs_context.create_qp_ex` sits before the `ibv_context` that ends the
/// `verbs_context` (then `get_srq_num`, `create_srq_ex`, `open_xrcd`, `close_xrcd`, a
/// placeholder and `sz`: 7 words).
pub const CREATE_QP_EX_BEFORE_CONTEXT: usize = 56;

/// `IBV_QPT_RC`, `IBV_QPT_UD`.
pub const IBV_QPT_RC: u32 = 2;
pub const IBV_QPT_UD: u32 = 4;
/// `RDMA_PS_TCP`, `RDMA_PS_UDP`.
pub const RDMA_PS_TCP: c_int = 0x0106;
pub const RDMA_PS_UDP: c_int = 0x0111;

pub const RAI_PASSIVE: c_int = 1;
pub const RAI_NUMERICHOST: c_int = 2;

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    /// Compiles a program printing each row's C value against Debian's librdmacm-dev
    /// headers (`rdma/rdma_cma.h`) and compares.
    #[test]
    fn layouts_match_the_installed_rdma_cma_h() {
        let mut rows = roce_cabi::layout_rows! {
            rdma_event_channel { fd }
            rdma_ib_addr { sgid, dgid, pkey }
            rdma_route { addr, path_rec, num_paths }
            rdma_cm_id {
                verbs, channel, context, qp, route, ps, port_num, event, send_cq_channel,
                send_cq, recv_cq_channel, recv_cq, srq, pd, qp_type
            }
            rdma_conn_param {
                private_data, private_data_len, responder_resources, initiator_depth,
                flow_control, retry_count, rnr_retry_count, srq, qp_num
            }
            rdma_cm_event { id, listen_id, event, status, param }
            rdma_ud_param { private_data, private_data_len, ah_attr, qp_num, qkey }
            rdma_addrinfo {
                ai_flags, ai_family, ai_qp_type, ai_port_space, ai_src_len, ai_dst_len,
                ai_src_addr, ai_dst_addr, ai_src_canonname, ai_dst_canonname, ai_route_len,
                ai_route, ai_connect_len, ai_connect, ai_next
            }
            ibv_qp_init_attr { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all }
            rdma_cm_join_mc_attr_ex { comp_mask, join_flags, addr }
            ibv_sa_path_rec {
                dgid, sgid, dlid, slid, raw_traffic, flow_label, hop_limit, traffic_class,
                reversible, numb_path, pkey, sl, mtu_selector, mtu, rate_selector, rate,
                packet_life_time_selector, packet_life_time, preference
            }
        };
        // Unions, and the head of `struct ibv_qp` (the only part of it we read).
        for (expr, ours) in [
            (
                "sizeof(struct rdma_addr)",
                core::mem::size_of::<rdma_addr>(),
            ),
            (
                "offsetof(struct rdma_addr, src_addr)",
                offset_of!(rdma_addr, src_addr),
            ),
            (
                "offsetof(struct rdma_addr, dst_addr)",
                offset_of!(rdma_addr, dst_addr),
            ),
            (
                "offsetof(struct rdma_addr, addr.ibaddr)",
                offset_of!(rdma_addr, ibaddr),
            ),
            (
                "offsetof(struct ibv_qp, qp_num)",
                offset_of!(ibv_qp, qp_num),
            ),
            ("offsetof(struct ibv_qp, state)", offset_of!(ibv_qp, state)),
            (
                "offsetof(struct ibv_qp, qp_type)",
                offset_of!(ibv_qp, qp_type),
            ),
            ("offsetof(struct ibv_qp, srq)", offset_of!(ibv_qp, srq)),
            // The head of `struct ibv_qp_init_attr_ex` (the part rdma_create_qp_ex reads).
            (
                "offsetof(struct ibv_qp_init_attr_ex, comp_mask)",
                offset_of!(ibv_qp_init_attr_ex, comp_mask),
            ),
            (
                "offsetof(struct ibv_qp_init_attr_ex, pd)",
                offset_of!(ibv_qp_init_attr_ex, pd),
            ),
        ] {
            rows.push((expr.to_string(), ours));
        }
        roce_cabi::probe::assert_layouts(
            "#include <stddef.h>\n#include <rdma/rdma_cma.h>\n",
            &rows,
        );
    }
}
