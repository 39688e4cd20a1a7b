//! The `*_str` helpers, with rdma-core's words (`libibverbs/enum_strs.c`).

use core::ffi::{c_char, CStr};

fn pick(table: &[&'static CStr], index: u32) -> *const c_char {
    table
        .get(index as usize)
        .copied()
        .unwrap_or(c"unknown")
        .as_ptr()
}

/// `ibv_wc_status_str`.
pub(crate) extern "C" fn wc_status_str(status: u32) -> *const c_char {
    pick(
        &[
            c"success",
            c"local length error",
            c"local QP operation error",
            c"local EE context operation error",
            c"local protection error",
            c"Work Request Flushed Error",
            c"memory management operation error",
            c"bad response error",
            c"local access error",
            c"remote invalid request error",
            c"remote access error",
            c"remote operation error",
            c"transport retry counter exceeded",
            c"RNR retry counter exceeded",
            c"local RDD violation error",
            c"remote invalid RD request",
            c"aborted error",
            c"invalid EE context number",
            c"invalid EE context state",
            c"fatal error",
            c"response timeout error",
            c"general error",
            c"TM error",
            c"TM software rendezvous",
        ],
        status,
    )
}

/// `ibv_event_type_str`.
pub(crate) extern "C" fn event_type_str(event: u32) -> *const c_char {
    pick(
        &[
            c"CQ error",
            c"local work queue catastrophic error",
            c"invalid request local work queue error",
            c"local access violation work queue error",
            c"communication established",
            c"send queue drained",
            c"path migrated",
            c"path migration request error",
            c"local catastrophic error",
            c"port active",
            c"port error",
            c"LID change",
            c"P_Key change",
            c"SM change",
            c"SRQ catastrophic error",
            c"SRQ limit reached",
            c"last WQE reached",
            c"client reregistration",
            c"GID table change",
            c"WQ fatal",
        ],
        event,
    )
}

/// `ibv_node_type_str` (`enum ibv_node_type` starts at -1, `IBV_NODE_UNKNOWN`).
pub(crate) extern "C" fn node_type_str(node_type: i32) -> *const c_char {
    pick(
        &[
            c"unknown",
            c"unknown",
            c"InfiniBand channel adapter",
            c"InfiniBand switch",
            c"InfiniBand router",
            c"iWARP NIC",
            c"usNIC",
            c"usNIC UDP",
            c"unspecified",
        ],
        (node_type + 1) as u32,
    )
}

/// `ibv_port_state_str`.
pub(crate) extern "C" fn port_state_str(state: u32) -> *const c_char {
    pick(
        &[
            c"no state change (NOP)",
            c"down",
            c"init",
            c"armed",
            c"active",
            c"active defer",
        ],
        state,
    )
}
