//! The device's limits, in one place: what `ibv_query_device` reports and what creating,
//! modifying and posting enforce, where rdma-core's providers (rxe's `rxe_qp_chk_cap`,
//! `rxe_qp_chk_attr`, `rxe_cq_chk_attr` and its user-space post path) enforce them. Each
//! refusal's errno is a method of its error type (values in [`errno`](crate::errno)).

/// Queue sizes and limits fixed at creation (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send work requests outstanding at once.
    pub max_send_wr: u32,
    /// Receive work requests outstanding at once.
    pub max_recv_wr: u32,
    /// Gather elements per send.
    pub max_send_sge: u32,
    /// Scatter elements per receive.
    pub max_recv_sge: u32,
    /// Bytes of inline data per send.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 256,
        }
    }
}

/// Limits of one device (the fields of `struct ibv_device_attr` this stack enforces).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Most QPs (QP numbers are never reused, so also most QPs ever created).
    pub max_qp: u32,
    /// Most work requests per send or receive queue (`max_send_wr`, `max_recv_wr`).
    pub max_qp_wr: u32,
    /// Most scatter/gather elements per work request, send or receive.
    pub max_sge: u32,
    /// Most entries per CQ.
    pub max_cqe: u32,
    /// Largest memory region, in bytes.
    pub max_mr_size: u64,
    /// Most READs and atomics a QP has outstanding as responder (`max_dest_rd_atomic`).
    pub max_qp_rd_atom: u8,
    /// Most READs and atomics a QP has outstanding as requester (`max_rd_atomic`).
    pub max_qp_init_rd_atom: u8,
    /// Most bytes of inline data per send (`max_inline_data`; a QP cap, not a device
    /// attribute in verbs).
    pub max_inline_data: u32,
    /// Entries in the P_Key table: only the default partition, so `pkey_index` must be 0.
    pub max_pkeys: u16,
    /// Most shared receive queues alive at once.
    pub max_srq: u32,
    /// Most work requests an SRQ holds (`max_wr` of create and resize).
    pub max_srq_wr: u32,
    /// Most scatter elements per SRQ receive.
    pub max_srq_sge: u32,
    /// Most memory windows alive at once.
    pub max_mw: u32,
    /// Entries of a port's GID table (`gid_tbl_len`); those past the interface's addresses
    /// are empty.
    pub gid_tbl_len: u32,
    /// Most multicast groups with a QP attached at once (`max_mcast_grp`).
    pub max_mcast_grp: u32,
    /// Most QPs attached to one group (`max_mcast_qp_attach`).
    pub max_mcast_qp_attach: u32,
    /// Most attachments of QPs to groups at once, over all groups
    /// (`max_total_mcast_qp_attach`).
    pub max_total_mcast_qp_attach: u32,
    /// Tag matching (`tm_caps`): most tags a tag-matching SRQ's list holds
    /// (`max_num_tags`).
    pub max_tm_tags: u32,
    /// Tag matching: most list operations outstanding on a tag-matching SRQ (`max_ops`).
    pub max_tm_ops: u32,
    /// Tag matching: most scatter elements of a tag's buffer (`max_sge`).
    pub max_tm_sge: u32,
    /// Tag matching: the longest rendezvous request (TMH, RVH and what follows) the
    /// receiver reads the data of itself (`max_rndv_hdr_size`); a longer one is left to the
    /// program.
    pub max_rndv_hdr_size: u32,
}

/// The limits of every roce-xdp device.
pub const LIMITS: DeviceLimits = DeviceLimits {
    max_qp: 0xFF_FFFF - 0x11,
    max_qp_wr: 1 << 16,
    max_sge: 32,
    max_cqe: 1 << 20,
    max_mr_size: 1 << 40,
    max_qp_rd_atom: 128,
    max_qp_init_rd_atom: 128,
    max_inline_data: 512,
    max_pkeys: 1,
    max_srq: 1 << 16,
    max_srq_wr: 1 << 16,
    max_srq_sge: 32,
    max_mw: 1 << 17,
    // rxe's RXE_PORT_GID_TBL_LEN.
    gid_tbl_len: 1024,
    // rxe's (`RXE_MAX_MCAST_GRP`, `RXE_MAX_MCAST_QP_ATTACH`, `RXE_MAX_TOT_MCAST_QP_ATTACH`).
    max_mcast_grp: 8192,
    max_mcast_qp_attach: 56,
    max_total_mcast_qp_attach: 0x7_0000,
    // mlx5's forms: (1 << log_tag_matching_list_sz) - 1 tags, a QP's worth of operations, one
    // scatter element and 64-byte rendezvous requests (MLX5_TM_MAX_SGE,
    // MLX5_TM_MAX_RNDV_MSG_SIZE).
    max_tm_tags: (1 << 10) - 1,
    max_tm_ops: 1 << 16,
    max_tm_sge: 1,
    max_rndv_hdr_size: 64,
};

impl DeviceLimits {
    /// Whether a QP may be created with `caps` (rxe's `rxe_qp_chk_cap`); the name of the
    /// first cap beyond its limit.
    pub fn check_qp_caps(&self, caps: &QpCaps) -> Result<(), &'static str> {
        let beyond = [
            ("max_send_wr", caps.max_send_wr > self.max_qp_wr),
            ("max_recv_wr", caps.max_recv_wr > self.max_qp_wr),
            ("max_send_sge", caps.max_send_sge > self.max_sge),
            ("max_recv_sge", caps.max_recv_sge > self.max_sge),
            (
                "max_inline_data",
                caps.max_inline_data > self.max_inline_data,
            ),
        ];
        match beyond.iter().find(|(_, beyond)| *beyond) {
            Some((name, _)) => Err(name),
            None => Ok(()),
        }
    }

    /// Whether a CQ may have `depth` entries (rxe's `rxe_cq_chk_attr`: 1 to `max_cqe`).
    pub fn allows_cq_depth(&self, depth: usize) -> bool {
        (1..=self.max_cqe as usize).contains(&depth)
    }
}
