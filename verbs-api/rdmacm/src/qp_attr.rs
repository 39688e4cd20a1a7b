//! `rdma_init_qp_attr`'s answer in C: a `roce_verbs::QpAttr` as the `ibv_qp_attr` and
//! attribute mask the kernel's ucma returns, and a route's path as `ibv_sa_path_rec`.

use core::ffi::c_int;

use roce_verbs::{AddressVector, PathRecord, QpAttr, QpState};

use crate::abi::{ibv_ah_attr, ibv_qp_attr, ibv_sa_path_rec};
use roce_cabi::abi::ibv_global_route;

/// `enum ibv_qp_attr_mask` (verbs.h).
pub(crate) mod mask {
    use core::ffi::c_int;
    pub const STATE: c_int = 1;
    pub const ACCESS_FLAGS: c_int = 1 << 3;
    pub const PKEY_INDEX: c_int = 1 << 4;
    pub const PORT: c_int = 1 << 5;
    pub const QKEY: c_int = 1 << 6;
    pub const AV: c_int = 1 << 7;
    pub const PATH_MTU: c_int = 1 << 8;
    pub const TIMEOUT: c_int = 1 << 9;
    pub const RETRY_CNT: c_int = 1 << 10;
    pub const RNR_RETRY: c_int = 1 << 11;
    pub const RQ_PSN: c_int = 1 << 12;
    pub const MAX_QP_RD_ATOMIC: c_int = 1 << 13;
    pub const MIN_RNR_TIMER: c_int = 1 << 15;
    pub const SQ_PSN: c_int = 1 << 16;
    pub const MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
    pub const DEST_QPN: c_int = 1 << 20;
}

/// `enum ibv_qp_state`, for the states `rdma_init_qp_attr` answers.
pub(crate) fn qp_state(code: u32) -> Option<QpState> {
    match code {
        0 => Some(QpState::Reset),
        1 => Some(QpState::Init),
        2 => Some(QpState::Rtr),
        3 => Some(QpState::Rts),
        4 => Some(QpState::Sqd),
        5 => Some(QpState::Sqe),
        6 => Some(QpState::Err),
        _ => None,
    }
}

/// Writes the attributes `from` has into `attr` and returns their mask.
pub(crate) fn to_c(from: &QpAttr, attr: &mut ibv_qp_attr) -> c_int {
    let mut bits = mask::STATE;
    if let Some(state) = from.state {
        attr.qp_state = (0..=6)
            .find(|&code| qp_state(code) == Some(state))
            .unwrap_or(0);
    }
    if let Some(v) = from.pkey_index {
        attr.pkey_index = v;
        bits |= mask::PKEY_INDEX;
    }
    if let Some(v) = from.port_num {
        attr.port_num = v;
        bits |= mask::PORT;
    }
    if let Some(v) = from.access_flags {
        attr.qp_access_flags = v.bits() as c_int;
        bits |= mask::ACCESS_FLAGS;
    }
    if let Some(v) = from.qkey {
        attr.qkey = v;
        bits |= mask::QKEY;
    }
    if let Some(v) = from.av {
        attr.ah_attr = ah_attr(&v);
        bits |= mask::AV;
    }
    if let Some(v) = from.path_mtu {
        attr.path_mtu = v as u32;
        bits |= mask::PATH_MTU;
    }
    if let Some(v) = from.dest_qp_num {
        attr.dest_qp_num = v;
        bits |= mask::DEST_QPN;
    }
    if let Some(v) = from.rq_psn {
        attr.rq_psn = v.value();
        bits |= mask::RQ_PSN;
    }
    if let Some(v) = from.max_dest_rd_atomic {
        attr.max_dest_rd_atomic = v;
        bits |= mask::MAX_DEST_RD_ATOMIC;
    }
    if let Some(v) = from.min_rnr_timer {
        attr.min_rnr_timer = v.code();
        bits |= mask::MIN_RNR_TIMER;
    }
    if let Some(v) = from.sq_psn {
        attr.sq_psn = v.value();
        bits |= mask::SQ_PSN;
    }
    if let Some(v) = from.timeout {
        attr.timeout = v;
        bits |= mask::TIMEOUT;
    }
    if let Some(v) = from.retry_cnt {
        attr.retry_cnt = v;
        bits |= mask::RETRY_CNT;
    }
    if let Some(v) = from.rnr_retry {
        attr.rnr_retry = v;
        bits |= mask::RNR_RETRY;
    }
    if let Some(v) = from.max_rd_atomic {
        attr.max_rd_atomic = v;
        bits |= mask::MAX_QP_RD_ATOMIC;
    }
    bits
}

/// The address vector as a RoCE `ibv_ah_attr`: always global, port 1, no LID.
pub(crate) fn ah_attr(av: &AddressVector) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: av.dgid,
            flow_label: av.flow_label,
            sgid_index: av.sgid_index,
            hop_limit: av.hop_limit,
            traffic_class: av.traffic_class,
        },
        is_global: 1,
        port_num: 1,
        ..ibv_ah_attr::default()
    }
}

/// `IB_SA_EQ`: the path's values are exact, not bounds.
const SA_EQ: u8 = 1;

/// The path as librdmacm copies the kernel's RoCE path record (`ibv_copy_path_rec_from_kern`).
pub(crate) fn path_rec(path: &PathRecord) -> ibv_sa_path_rec {
    ibv_sa_path_rec {
        dgid: path.dgid,
        sgid: path.sgid,
        flow_label: path.flow_label.to_be(),
        hop_limit: path.hop_limit,
        traffic_class: path.traffic_class,
        reversible: 1,
        pkey: path.pkey.to_be(),
        sl: path.sl,
        mtu_selector: SA_EQ,
        mtu: path.mtu as u8,
        rate_selector: SA_EQ,
        rate: path.rate,
        packet_life_time_selector: SA_EQ,
        packet_life_time: path.packet_life_time,
        ..ibv_sa_path_rec::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce_verbs::{AccessFlags, PathMtu, Psn, RnrTimer};

    #[test]
    fn masks_and_states_are_verbs_h_s() {
        let mut rows: Vec<(String, usize)> = [
            ("IBV_QP_STATE", mask::STATE),
            ("IBV_QP_ACCESS_FLAGS", mask::ACCESS_FLAGS),
            ("IBV_QP_PKEY_INDEX", mask::PKEY_INDEX),
            ("IBV_QP_PORT", mask::PORT),
            ("IBV_QP_QKEY", mask::QKEY),
            ("IBV_QP_AV", mask::AV),
            ("IBV_QP_PATH_MTU", mask::PATH_MTU),
            ("IBV_QP_TIMEOUT", mask::TIMEOUT),
            ("IBV_QP_RETRY_CNT", mask::RETRY_CNT),
            ("IBV_QP_RNR_RETRY", mask::RNR_RETRY),
            ("IBV_QP_RQ_PSN", mask::RQ_PSN),
            ("IBV_QP_MAX_QP_RD_ATOMIC", mask::MAX_QP_RD_ATOMIC),
            ("IBV_QP_MIN_RNR_TIMER", mask::MIN_RNR_TIMER),
            ("IBV_QP_SQ_PSN", mask::SQ_PSN),
            ("IBV_QP_MAX_DEST_RD_ATOMIC", mask::MAX_DEST_RD_ATOMIC),
            ("IBV_QP_DEST_QPN", mask::DEST_QPN),
        ]
        .map(|(name, bit)| (name.to_string(), bit as usize))
        .to_vec();
        for (name, code) in [("IBV_QPS_RESET", 0), ("IBV_QPS_RTS", 3), ("IBV_QPS_ERR", 6)] {
            rows.push((name.to_string(), code));
        }
        roce_cabi::probe::assert_layouts("#include <infiniband/verbs.h>\n", &rows);
    }

    /// The kernel's RTR and RTS for RC (`cm_init_qp_rtr_attr`, `_rts_attr`) come out with
    /// ucma's masks and every field where ibv_modify_qp reads it.
    #[test]
    fn rtr_and_rts_carry_ucmas_masks() {
        let av = AddressVector {
            dgid: [0xfe; 16],
            sgid_index: 1,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
        };
        let rtr = QpAttr {
            state: Some(QpState::Rtr),
            av: Some(av),
            path_mtu: Some(PathMtu::Mtu1024),
            dest_qp_num: Some(0x42),
            rq_psn: Some(Psn::new(0x12_3456)),
            max_dest_rd_atomic: Some(1),
            min_rnr_timer: Some(RnrTimer::new(0)),
            ..QpAttr::default()
        };
        let mut attr = ibv_qp_attr::default();
        use mask::*;
        assert_eq!(
            to_c(&rtr, &mut attr),
            STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER
        );
        assert_eq!(
            (attr.qp_state, attr.path_mtu, attr.dest_qp_num),
            (2, 3, 0x42)
        );
        assert_eq!((attr.rq_psn, attr.max_dest_rd_atomic), (0x12_3456, 1));
        assert_eq!((attr.ah_attr.is_global, attr.ah_attr.port_num), (1, 1));
        assert_eq!(attr.ah_attr.grh.dgid, [0xfe; 16]);
        assert_eq!(
            (attr.ah_attr.grh.sgid_index, attr.ah_attr.grh.hop_limit),
            (1, 64)
        );
        let rts = QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::new(7)),
            timeout: Some(19),
            retry_cnt: Some(7),
            rnr_retry: Some(6),
            max_rd_atomic: Some(1),
            ..QpAttr::default()
        };
        let mut attr = ibv_qp_attr::default();
        assert_eq!(
            to_c(&rts, &mut attr),
            STATE | SQ_PSN | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_QP_RD_ATOMIC
        );
        assert_eq!((attr.qp_state, attr.sq_psn, attr.timeout), (3, 7, 19));
        assert_eq!(
            (attr.retry_cnt, attr.rnr_retry, attr.max_rd_atomic),
            (7, 6, 1)
        );
        let init = QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            access_flags: Some(AccessFlags::REMOTE_WRITE),
            ..QpAttr::default()
        };
        let mut attr = ibv_qp_attr::default();
        assert_eq!(
            to_c(&init, &mut attr),
            STATE | PKEY_INDEX | PORT | ACCESS_FLAGS
        );
        assert_eq!(
            (attr.qp_state, attr.port_num, attr.qp_access_flags),
            (1, 1, 2)
        );
    }
}
