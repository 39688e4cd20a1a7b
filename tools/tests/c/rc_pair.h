/* Two RC QPs of one device in one process, connected to each other through the device's
 * IPv4-mapped GID (index 1), for the tests of what completes and what regions allow. */
#ifndef ROCE_TEST_RC_PAIR_H
#define ROCE_TEST_RC_PAIR_H

#include <stdint.h>
#include <time.h>
#include "common.h"

#define ALL_ACCESS                                                                  \
	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | \
	 IBV_ACCESS_REMOTE_ATOMIC)

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* An RC QP in `pd` completing into `send_cq` and `recv_cq`, every send signaled. */
static struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *send_cq, struct ibv_cq *recv_cq)
{
	struct ibv_qp_init_attr init = {
		.send_cq = send_cq,
		.recv_cq = recv_cq,
		.cap = { .max_send_wr = 32, .max_recv_wr = 32, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	CHECK(qp);
	return qp;
}

/* RESET (or any state) -> INIT -> RTR -> RTS towards `peer`, through our GID 1. */
static void rc_connect(struct ibv_qp *qp, struct ibv_qp *peer)
{
	union ibv_gid gid;
	CHECK(ibv_query_gid(qp->context, 1, 1, &gid) == 0);
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_RESET };
	CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE) == 0);
	attr = (struct ibv_qp_attr){
		.qp_state = IBV_QPS_INIT,
		.port_num = 1,
		.qp_access_flags = ALL_ACCESS,
	};
	CHECK(ibv_modify_qp(qp, &attr,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_RTR;
	attr.path_mtu = IBV_MTU_1024;
	attr.dest_qp_num = peer->qp_num;
	attr.rq_psn = 100;
	attr.max_dest_rd_atomic = 4;
	attr.min_rnr_timer = 12;
	attr.ah_attr.is_global = 1;
	attr.ah_attr.grh.dgid = gid;
	attr.ah_attr.grh.sgid_index = 1;
	attr.ah_attr.grh.hop_limit = 1;
	attr.ah_attr.port_num = 1;
	CHECK(ibv_modify_qp(qp, &attr,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				    IBV_QP_MIN_RNR_TIMER) == 0);
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_RTS;
	attr.timeout = 10;
	attr.retry_cnt = 2;
	attr.rnr_retry = 2;
	attr.sq_psn = 100;
	attr.max_rd_atomic = 4;
	CHECK(ibv_modify_qp(qp, &attr,
			    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

/* Connects two QPs to each other (again, from any state). */
static void rc_pair(struct ibv_qp *a, struct ibv_qp *b)
{
	rc_connect(a, b);
	rc_connect(b, a);
}

/* The next completion of `cq` (at most 5 s), whatever its status. */
static struct ibv_wc next_wc(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	double deadline = now() + 5;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0 && now() < deadline)
		;
	CHECK(n == 1);
	return wc;
}

/* Posts one work request on `qp` and returns its completion's status (from `cq`). */
static enum ibv_wc_status post_one(struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	CHECK(ibv_post_send(qp, wr, &bad) == 0);
	struct ibv_wc wc = next_wc(cq);
	CHECK(wc.wr_id == wr->wr_id);
	return wc.status;
}

/* An RDMA WRITE of `len` bytes from `src` (key `lkey`) to `remote` (key `rkey`). */
static inline enum ibv_wc_status rdma_write(struct ibv_qp *qp, struct ibv_cq *cq, void *src, uint32_t lkey,
				     uint64_t remote, uint32_t rkey, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = {
		.wr_id = 77, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.wr.rdma = { .remote_addr = remote, .rkey = rkey },
	};
	return post_one(qp, cq, &wr);
}

#endif
