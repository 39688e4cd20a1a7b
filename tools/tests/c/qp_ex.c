/* ibv_create_qp_ex and the ibv_qp_ex work request builders, as rdma-core's verbs.h calls them
 * (inline, through the pointers in struct ibv_qp_ex), on QPs of one device connected to each
 * other through its IPv4-mapped GID (index 1):
 * - which extended attributes ibv_create_qp_ex takes and refuses (rxe's), and which QPs
 *   ibv_qp_to_qp_ex hands builders for;
 * - RC: SEND, SEND with immediate, RDMA WRITE (inline, from a list of buffers), WRITE with
 *   immediate, READ, compare and swap, fetch and add and ATOMIC WRITE, several in one batch,
 *   with wr_set_sge, wr_set_sge_list, wr_set_inline_data and wr_set_inline_data_list;
 *   wr_abort posts nothing; a builder error and an operation this device lacks fail
 *   wr_complete and post nothing;
 * - UD: SEND with immediate through wr_set_ud_addr.
 * Every region has IBV_ACCESS_RELAXED_ORDERING. Every byte checked. Prints "ok" and exits 0 when every check holds; otherwise names the
 * first that failed. Usage: qp_ex DEVICE */
#include <endian.h>
#include <time.h>
#include "common.h"

enum { SIZE = 8192, UD_QKEY = 0x11111111 };
#define ALL_ACCESS                                                                  \
	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | \
	 IBV_ACCESS_REMOTE_ATOMIC)
/* Relaxed ordering, an optional access flag (rdma-core drops it where a device lacks it):
 * every region of the traffic below has it. */
#define MR_ACCESS (ALL_ACCESS | IBV_ACCESS_RELAXED_ORDERING)
#define RC_OPS                                                                              \
	(IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |   \
	 IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |                     \
	 IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |           \
	 IBV_QP_EX_WITH_ATOMIC_WRITE)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *send_cq, *recv_cq;
static union ibv_gid gid;

struct side {
	struct ibv_qp *qp;
	struct ibv_qp_ex *qpx;
	struct ibv_mr *mr;
	uint8_t *buf;
};

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* The next completion of `cq`, which must be wr_id's, successful and of `opcode`; at most 5 s. */
static struct ibv_wc complete(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_opcode opcode)
{
	struct ibv_wc wc;
	double deadline = now() + 5;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0 && now() < deadline)
		;
	CHECK(n == 1);
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != wr_id || wc.opcode != opcode) {
		fprintf(stderr, "FAILED: wr %llu completed %s with opcode %d, wanted wr %llu, opcode %d\n",
			(unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), wc.opcode,
			(unsigned long long)wr_id, opcode);
		exit(1);
	}
	return wc;
}

/* Nothing completes on either CQ for 100 ms. */
static void nothing_completes(void)
{
	struct ibv_wc wc;
	double deadline = now() + 0.1;
	while (now() < deadline)
		CHECK(ibv_poll_cq(send_cq, 1, &wc) == 0 && ibv_poll_cq(recv_cq, 1, &wc) == 0);
}

static struct ibv_qp_init_attr_ex init_ex(enum ibv_qp_type type, uint64_t ops)
{
	struct ibv_qp_init_attr_ex attr = {
		.send_cq = send_cq,
		.recv_cq = recv_cq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2,
			 .max_recv_sge = 2, .max_inline_data = 64 },
		.qp_type = type,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = ops,
	};
	return attr;
}

/* ibv_create_qp_ex refuses `attr` with errno `expected`. */
static void refused(struct ibv_qp_init_attr_ex attr, int expected, int line)
{
	errno = 0;
	struct ibv_qp *qp = ibv_create_qp_ex(ctx, &attr);
	if (qp || errno != expected) {
		fprintf(stderr, "FAILED line %d: created %p, errno %d, wanted errno %d\n", line,
			(void *)qp, errno, expected);
		exit(1);
	}
}

static void side_init(struct side *s, enum ibv_qp_type type, uint64_t ops)
{
	s->buf = calloc(1, SIZE);
	CHECK(s->buf);
	s->mr = ibv_reg_mr(pd, s->buf, SIZE, MR_ACCESS);
	CHECK(s->mr);
	struct ibv_qp_init_attr_ex attr = init_ex(type, ops);
	s->qp = ibv_create_qp_ex(ctx, &attr);
	CHECK(s->qp);
	s->qpx = ibv_qp_to_qp_ex(s->qp);
	CHECK(s->qpx && &s->qpx->qp_base == s->qp);
}

static void rc_connect(struct side *s, struct side *peer)
{
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = ALL_ACCESS,
	};
	CHECK(ibv_modify_qp(s->qp, &attr,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_RTR;
	attr.path_mtu = IBV_MTU_1024;
	attr.dest_qp_num = peer->qp->qp_num;
	attr.rq_psn = peer->qp->qp_num * 3 & 0xffffff;
	attr.max_dest_rd_atomic = 4;
	attr.min_rnr_timer = 12;
	attr.ah_attr.is_global = 1;
	attr.ah_attr.grh.dgid = gid;
	attr.ah_attr.grh.sgid_index = 1;
	attr.ah_attr.grh.hop_limit = 1;
	attr.ah_attr.port_num = 1;
	CHECK(ibv_modify_qp(s->qp, &attr,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				    IBV_QP_MIN_RNR_TIMER) == 0);
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_RTS;
	attr.timeout = 14;
	attr.retry_cnt = 7;
	attr.rnr_retry = 7;
	attr.sq_psn = s->qp->qp_num * 3 & 0xffffff;
	attr.max_rd_atomic = 4;
	CHECK(ibv_modify_qp(s->qp, &attr,
			    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

static void ud_ready(struct side *s)
{
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = UD_QKEY,
	};
	CHECK(ibv_modify_qp(s->qp, &attr,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0);
	attr.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(s->qp, &attr, IBV_QP_STATE) == 0);
	attr.qp_state = IBV_QPS_RTS;
	attr.sq_psn = 0;
	CHECK(ibv_modify_qp(s->qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
}

static void post_recv(struct side *s, uint64_t wr_id, uint32_t offset, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf + offset, .length = len,
			       .lkey = s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(s->qp, &wr, &bad) == 0);
}

static void fill(uint8_t *buf, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(i * 29 + seed);
}

/* What ibv_create_qp_ex takes and refuses, and which QPs have builders. */
static void creation(void)
{
	/* Windows and invalidation are RC/UC/XRC operations (tests/c/windows.c), as rxe's. */
	struct ibv_qp_init_attr_ex attr = init_ex(IBV_QPT_UD, IBV_QP_EX_WITH_BIND_MW);
	refused(attr, EOPNOTSUPP, __LINE__);
	refused(init_ex(IBV_QPT_UD, IBV_QP_EX_WITH_SEND_WITH_INV), EOPNOTSUPP, __LINE__);
	attr = init_ex(IBV_QPT_RC, IBV_QP_EX_WITH_SEND);
	attr.comp_mask |= IBV_QP_INIT_ATTR_CREATE_FLAGS;
	attr.create_flags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;
	refused(attr, EOPNOTSUPP, __LINE__);
	attr = init_ex(IBV_QPT_RC, IBV_QP_EX_WITH_SEND);
	attr.comp_mask |= IBV_QP_INIT_ATTR_MAX_TSO_HEADER;
	attr.max_tso_header = 64;
	refused(attr, EOPNOTSUPP, __LINE__);
	refused(init_ex(IBV_QPT_UC, IBV_QP_EX_WITH_RDMA_READ), EOPNOTSUPP, __LINE__);
	refused(init_ex(IBV_QPT_UD, IBV_QP_EX_WITH_RDMA_WRITE), EOPNOTSUPP, __LINE__);
	refused(init_ex(IBV_QPT_UC, IBV_QP_EX_WITH_ATOMIC_WRITE), EOPNOTSUPP, __LINE__);

	/* No creation flag asked for, no send ops flags: a QP with builders, as rxe's. */
	for (int type = IBV_QPT_RC; type <= IBV_QPT_UD; type++) {
		attr = init_ex(type, 0);
		attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
		struct ibv_qp *qp = ibv_create_qp_ex(ctx, &attr);
		CHECK(qp && qp->qp_type == type && qp->state == IBV_QPS_RESET);
		CHECK(ibv_qp_to_qp_ex(qp) != NULL);
		CHECK(ibv_destroy_qp(qp) == 0);
	}
	/* ibv_create_qp's QPs have none. */
	struct ibv_qp_init_attr plain = {
		.send_cq = send_cq, .recv_cq = recv_cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &plain);
	CHECK(qp);
	CHECK(ibv_qp_to_qp_ex(qp) == NULL);
	CHECK(ibv_destroy_qp(qp) == 0);
}

/* Every RC builder from `s` to `peer`. */
static void rc_traffic(struct side *s, struct side *peer)
{
	struct ibv_qp_ex *qpx = s->qpx;
	uint8_t *src = s->buf, *dst = peer->buf;

	/* One batch: SEND from one SGE, SEND with immediate from a list of two, and an inline
	 * WRITE from a list of two buffers. */
	fill(src, 3000, 1);
	memset(dst, 0, SIZE);
	post_recv(peer, 100, 0, 2048);
	post_recv(peer, 101, 2048, 2048);
	struct ibv_sge two[2] = {
		{ .addr = (uintptr_t)src + 1000, .length = 500, .lkey = s->mr->lkey },
		{ .addr = (uintptr_t)src + 2000, .length = 700, .lkey = s->mr->lkey },
	};
	uint8_t small[2][24];
	fill(small[0], 24, 7);
	fill(small[1], 24, 8);
	struct ibv_data_buf bufs[2] = { { small[0], 24 }, { small[1], 16 } };
	ibv_wr_start(qpx);
	qpx->wr_id = 1;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, s->mr->lkey, (uintptr_t)src, 1000);
	qpx->wr_id = 2;
	ibv_wr_send_imm(qpx, htobe32(0x12345678));
	ibv_wr_set_sge_list(qpx, 2, two);
	qpx->wr_id = 3;
	ibv_wr_rdma_write(qpx, peer->mr->rkey, (uintptr_t)dst + 5000);
	ibv_wr_set_inline_data_list(qpx, 2, bufs);
	CHECK(ibv_wr_complete(qpx) == 0);
	complete(send_cq, 1, IBV_WC_SEND);
	complete(send_cq, 2, IBV_WC_SEND);
	complete(send_cq, 3, IBV_WC_RDMA_WRITE);
	struct ibv_wc wc = complete(recv_cq, 100, IBV_WC_RECV);
	CHECK(wc.byte_len == 1000 && !(wc.wc_flags & IBV_WC_WITH_IMM));
	wc = complete(recv_cq, 101, IBV_WC_RECV);
	CHECK(wc.byte_len == 1200 && (wc.wc_flags & IBV_WC_WITH_IMM) &&
	      wc.imm_data == htobe32(0x12345678));
	CHECK(memcmp(dst, src, 1000) == 0);
	CHECK(memcmp(dst + 2048, src + 1000, 500) == 0 && memcmp(dst + 2548, src + 2000, 700) == 0);
	CHECK(memcmp(dst + 5000, small[0], 24) == 0 && memcmp(dst + 5024, small[1], 16) == 0);

	/* WRITE with immediate (consumes a receive, reports the length written), then READ it
	 * back elsewhere; one inline SEND through wr_set_inline_data. */
	post_recv(peer, 102, 0, 16);
	fill(src, 4000, 2);
	ibv_wr_start(qpx);
	qpx->wr_id = 4;
	ibv_wr_rdma_write_imm(qpx, peer->mr->rkey, (uintptr_t)dst + 1024, htobe32(77));
	ibv_wr_set_sge(qpx, s->mr->lkey, (uintptr_t)src, 4000);
	qpx->wr_id = 5;
	ibv_wr_rdma_read(qpx, peer->mr->rkey, (uintptr_t)dst + 1024);
	ibv_wr_set_sge(qpx, s->mr->lkey, (uintptr_t)src + 4096, 4000);
	CHECK(ibv_wr_complete(qpx) == 0);
	complete(send_cq, 4, IBV_WC_RDMA_WRITE);
	wc = complete(send_cq, 5, IBV_WC_RDMA_READ);
	CHECK(wc.byte_len == 4000);
	wc = complete(recv_cq, 102, IBV_WC_RECV_RDMA_WITH_IMM);
	CHECK(wc.byte_len == 4000 && wc.imm_data == htobe32(77));
	CHECK(memcmp(dst + 1024, src, 4000) == 0 && memcmp(src + 4096, src, 4000) == 0);
	post_recv(peer, 103, 0, 64);
	char hello[] = "inline, through wr_set_inline_data";
	ibv_wr_start(qpx);
	qpx->wr_id = 6;
	ibv_wr_send(qpx);
	ibv_wr_set_inline_data(qpx, hello, sizeof hello);
	CHECK(ibv_wr_complete(qpx) == 0);
	complete(send_cq, 6, IBV_WC_SEND);
	wc = complete(recv_cq, 103, IBV_WC_RECV);
	CHECK(wc.byte_len == sizeof hello && memcmp(dst, hello, sizeof hello) == 0);

	/* The atomics on the peer's word at 4096, the originals landing at ours; then an
	 * ATOMIC WRITE of eight bytes as they are. */
	uint64_t *word = (uint64_t *)(dst + 4096);
	uint64_t *originals = (uint64_t *)(src + 64);
	*word = 40;
	ibv_wr_start(qpx);
	qpx->wr_id = 7;
	ibv_wr_atomic_fetch_add(qpx, peer->mr->rkey, (uintptr_t)word, 2);
	ibv_wr_set_sge(qpx, s->mr->lkey, (uintptr_t)&originals[0], 8);
	qpx->wr_id = 8;
	ibv_wr_atomic_cmp_swp(qpx, peer->mr->rkey, (uintptr_t)word, 42, 1000);
	ibv_wr_set_sge(qpx, s->mr->lkey, (uintptr_t)&originals[1], 8);
	const uint8_t bytes[8] = { 0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4 };
	qpx->wr_id = 9;
	ibv_wr_atomic_write(qpx, peer->mr->rkey, (uintptr_t)(dst + 4104), bytes);
	CHECK(ibv_wr_complete(qpx) == 0);
	complete(send_cq, 7, IBV_WC_FETCH_ADD);
	complete(send_cq, 8, IBV_WC_COMP_SWAP);
	wc = complete(send_cq, 9, IBV_WC_ATOMIC_WRITE);
	CHECK(wc.byte_len == 8);
	CHECK(originals[0] == 40 && originals[1] == 42 && *word == 1000);
	CHECK(memcmp(dst + 4104, bytes, 8) == 0);

	/* Aborted: nothing leaves. A builder that fails (more inline bytes than a send may
	 * carry, a bind with no window) fails the whole batch. */
	post_recv(peer, 104, 0, 64);
	ibv_wr_start(qpx);
	qpx->wr_id = 10;
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, s->mr->lkey, (uintptr_t)src, 8);
	ibv_wr_abort(qpx);
	ibv_wr_start(qpx);
	CHECK(ibv_wr_complete(qpx) == 0);
	static uint8_t big[4096];
	ibv_wr_start(qpx);
	qpx->wr_id = 11;
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, s->mr->lkey, (uintptr_t)src, 8);
	qpx->wr_id = 12;
	ibv_wr_send(qpx);
	ibv_wr_set_inline_data(qpx, big, sizeof big);
	CHECK(ibv_wr_complete(qpx) == EINVAL);
	ibv_wr_start(qpx);
	qpx->wr_id = 13;
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, s->mr->lkey, (uintptr_t)src, 8);
	ibv_wr_bind_mw(qpx, NULL, 0, NULL);
	CHECK(ibv_wr_complete(qpx) == EINVAL);
	nothing_completes();
	/* The QP works on: the receive posted above takes the next SEND. */
	ibv_wr_start(qpx);
	qpx->wr_id = 14;
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, s->mr->lkey, (uintptr_t)src, 8);
	CHECK(ibv_wr_complete(qpx) == 0);
	complete(send_cq, 14, IBV_WC_SEND);
	complete(recv_cq, 104, IBV_WC_RECV);
}

static void ud_traffic(void)
{
	struct side u, v;
	side_init(&u, IBV_QPT_UD, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM);
	side_init(&v, IBV_QPT_UD, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM);
	ud_ready(&u);
	ud_ready(&v);
	struct ibv_ah_attr ah_attr = {
		.is_global = 1, .port_num = 1,
		.grh = { .dgid = gid, .sgid_index = 1, .hop_limit = 64 },
	};
	struct ibv_ah *ah = ibv_create_ah(pd, &ah_attr);
	CHECK(ah);
	post_recv(&v, 200, 0, 40 + 512);
	fill(u.buf, 512, 9);
	ibv_wr_start(u.qpx);
	u.qpx->wr_id = 20;
	u.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(u.qpx, htobe32(0xabcdef));
	ibv_wr_set_ud_addr(u.qpx, ah, v.qp->qp_num, UD_QKEY);
	ibv_wr_set_sge(u.qpx, u.mr->lkey, (uintptr_t)u.buf, 512);
	CHECK(ibv_wr_complete(u.qpx) == 0);
	complete(send_cq, 20, IBV_WC_SEND);
	struct ibv_wc wc = complete(recv_cq, 200, IBV_WC_RECV);
	CHECK(wc.byte_len == 40 + 512 && wc.src_qp == u.qp->qp_num &&
	      (wc.wc_flags & IBV_WC_WITH_IMM) && wc.imm_data == htobe32(0xabcdef));
	CHECK(memcmp(v.buf + 40, u.buf, 512) == 0);
	/* No address: the batch fails. */
	ibv_wr_start(u.qpx);
	u.qpx->wr_id = 21;
	ibv_wr_send(u.qpx);
	ibv_wr_set_ud_addr(u.qpx, NULL, v.qp->qp_num, UD_QKEY);
	ibv_wr_set_sge(u.qpx, u.mr->lkey, (uintptr_t)u.buf, 8);
	CHECK(ibv_wr_complete(u.qpx) == EINVAL);
	nothing_completes();
	CHECK(ibv_destroy_ah(ah) == 0);
}

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	ctx = open_device(argv[1]);
	CHECK(ibv_query_gid(ctx, 1, 1, &gid) == 0);
	pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	send_cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	recv_cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(send_cq && recv_cq);

	/* The exported ibv_reg_mr (which the macro takes for constant flags without optional
	 * bits) takes relaxed ordering too. */
	static uint8_t page[64];
	struct ibv_mr *ro = (ibv_reg_mr)(pd, page, sizeof page, MR_ACCESS);
	CHECK(ro && ibv_dereg_mr(ro) == 0);

	creation();
	struct side a, b;
	side_init(&a, IBV_QPT_RC, RC_OPS);
	side_init(&b, IBV_QPT_RC, RC_OPS);
	rc_connect(&a, &b);
	rc_connect(&b, &a);
	rc_traffic(&a, &b);
	rc_traffic(&b, &a);
	ud_traffic();
	printf("ok\n");
	return 0;
}
