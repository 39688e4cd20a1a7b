/* Memory windows through the C ABI, between two RC QPs of one device in one process: A (the
 * peer) reaches B's region, which grants nothing itself, only through B's windows.
 *   - ibv_alloc_mw (types 1 and 2; type 3 is EINVAL), ibv_dealloc_mw;
 *   - ibv_bind_mw: a type 1 window, the key byte one higher (ibv_mw.rkey follows), the
 *     IBV_WC_BIND_MW completion; EINVAL for a type 2 window or a zero-based one, EPERM for a
 *     region of another PD (the inline checks), and a bind of length 0 unbinds;
 *   - IBV_WR_BIND_MW in ibv_post_send and ibv_wr_bind_mw / ibv_wr_local_inv /
 *     ibv_wr_send_inv through ibv_qp_ex;
 *   - RDMA WRITE and READ through a window, SEND with invalidate (IBV_WC_WITH_INV and the
 *     invalidated R_Key at the receiver), LOCAL_INV (IBV_WC_LOCAL_INV);
 *   - ibv_dereg_mr is EINVAL while a window is bound to the region;
 *   - the failures, each on a fresh pair: access past a window and through an invalidated
 *     one (IBV_WC_REM_ACCESS_ERR), a bind of a bound type 2 window (IBV_WC_MW_BIND_ERR),
 *     LOCAL_INV of a type 1 window (IBV_WC_LOC_QP_OP_ERR), and a SEND with invalidate of a
 *     region's R_Key (IBV_WC_REM_INV_REQ_ERR at both ends).
 * Prints "ok" and exits 0 when every check holds. Usage: windows DEVICE */
#include <stdint.h>
#include <time.h>
#include "common.h"

enum { SIZE = 16384, MSG = 2048 };
#define ALL_ACCESS                                                                  \
	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | \
	 IBV_ACCESS_REMOTE_ATOMIC)
#define RW (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#define SEND_OPS                                                                    \
	(IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_BIND_MW |  \
	 IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_SEND_WITH_INV)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;

struct side {
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	uint8_t *buf;
};

/* A the peer, B the windows' owner. */
struct pair {
	struct side a, b;
};

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* The next completion of `cq` (at most 5 s). */
static struct ibv_wc next(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	double deadline = now() + 5;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0 && now() < deadline)
		;
	CHECK(n == 1);
	return wc;
}

/* The next completion of `cq`, which must be wr_id's with `status`. */
static struct ibv_wc expect(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_status status)
{
	struct ibv_wc wc = next(cq);
	if (wc.status != status || wc.wr_id != wr_id) {
		fprintf(stderr, "FAILED: wr %llu completed %s, wanted wr %llu %s\n",
			(unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status),
			(unsigned long long)wr_id, ibv_wc_status_str(status));
		exit(1);
	}
	return wc;
}

static void side_init(struct side *s, int access)
{
	s->buf = calloc(1, SIZE);
	CHECK(s->buf);
	s->mr = ibv_reg_mr(pd, s->buf, SIZE, access);
	CHECK(s->mr);
	s->cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(s->cq);
	struct ibv_qp_init_attr_ex init = {
		.send_cq = s->cq,
		.recv_cq = s->cq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = SEND_OPS,
	};
	s->qp = ibv_create_qp_ex(ctx, &init);
	CHECK(s->qp);
}

/* RESET -> INIT -> RTR -> RTS towards `peer`, path MTU 1024 (a window's 2 KiB is two
 * packets). */
static void connect_to(struct side *s, struct side *peer)
{
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_INIT,
		.port_num = 1,
		.qp_access_flags = ALL_ACCESS,
	};
	CHECK(ibv_modify_qp(s->qp, &attr,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_RTR;
	attr.path_mtu = IBV_MTU_1024;
	attr.dest_qp_num = peer->qp->qp_num;
	attr.rq_psn = 0;
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
	attr.max_rd_atomic = 4;
	CHECK(ibv_modify_qp(s->qp, &attr,
			    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

/* A connected pair: A with every right, B's region bindable and granting nothing itself. */
static struct pair new_pair(void)
{
	struct pair p;
	side_init(&p.a, ALL_ACCESS);
	side_init(&p.b, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	connect_to(&p.a, &p.b);
	connect_to(&p.b, &p.a);
	return p;
}

static void post(struct ibv_qp *qp, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	CHECK(ibv_post_send(qp, wr, &bad) == 0);
}

/* A's RDMA `opcode` of `len` bytes from its buffer to B's `remote` through `rkey`. */
static enum ibv_wc_status rdma(struct pair *p, enum ibv_wr_opcode opcode, uint8_t *remote,
			       uint32_t rkey, uint32_t len, uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)p->a.buf, .length = len, .lkey = p->a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = opcode };
	wr.wr.rdma.remote_addr = (uintptr_t)remote;
	wr.wr.rdma.rkey = rkey;
	post(p->a.qp, &wr);
	struct ibv_wc wc = next(p->a.cq);
	CHECK(wc.wr_id == wr_id);
	return wc.status;
}

static void fill(uint8_t *buf, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(i * 131 + seed);
}

/* B binds type 2 window `mw` over `len` bytes at `at` with `access`, posting IBV_WR_BIND_MW;
 * the R_Key it asked for. */
static uint32_t bind_type2(struct pair *p, struct ibv_mw *mw, uint8_t *at, uint32_t len,
			   int access, uint64_t wr_id)
{
	struct ibv_send_wr wr = { .wr_id = wr_id, .opcode = IBV_WR_BIND_MW,
				  .send_flags = IBV_SEND_SIGNALED };
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
	wr.bind_mw.bind_info.mr = p->b.mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)at;
	wr.bind_mw.bind_info.length = len;
	wr.bind_mw.bind_info.mw_access_flags = access;
	post(p->b.qp, &wr);
	return wr.bind_mw.rkey;
}

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	ctx = open_device(argv[1]);
	CHECK(ibv_query_gid(ctx, 1, 1, &gid) == 0);
	pd = ibv_alloc_pd(ctx);
	struct ibv_pd *other_pd = ibv_alloc_pd(ctx);
	CHECK(pd && other_pd);
	struct pair p = new_pair();

	/* Allocation. */
	errno = 0;
	CHECK(ibv_alloc_mw(pd, 3) == NULL && errno == EINVAL);
	struct ibv_mw *one = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	struct ibv_mw *two = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(one && two);
	CHECK(one->type == IBV_MW_TYPE_1 && two->type == IBV_MW_TYPE_2);
	CHECK(one->pd == pd && one->context == ctx && one->rkey >> 8 != two->rkey >> 8);
	CHECK(ibv_dealloc_pd(pd) == EBUSY);

	/* ibv_bind_mw's refusals. */
	struct ibv_mw_bind bind = {
		.wr_id = 10,
		.send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = p.b.mr, .addr = (uintptr_t)p.b.buf, .length = MSG,
			       .mw_access_flags = RW },
	};
	CHECK(ibv_bind_mw(p.b.qp, two, &bind) == EINVAL);
	struct ibv_mw_bind zero_based = bind;
	zero_based.bind_info.mw_access_flags |= IBV_ACCESS_ZERO_BASED;
	CHECK(ibv_bind_mw(p.b.qp, one, &zero_based) == EINVAL);
	uint8_t *alien_buf = calloc(1, MSG);
	struct ibv_mr *alien = ibv_reg_mr(other_pd, alien_buf, MSG,
					  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	CHECK(alien);
	struct ibv_mw_bind foreign = bind;
	foreign.bind_info.mr = alien;
	foreign.bind_info.addr = (uintptr_t)alien_buf;
	CHECK(ibv_bind_mw(p.b.qp, one, &foreign) == EPERM);

	/* A type 1 window over B's first MSG bytes. */
	uint32_t first = one->rkey;
	CHECK(ibv_bind_mw(p.b.qp, one, &bind) == 0);
	CHECK(one->rkey == ibv_inc_rkey(first));
	struct ibv_wc wc = expect(p.b.cq, 10, IBV_WC_SUCCESS);
	CHECK(wc.opcode == IBV_WC_BIND_MW);
	CHECK(ibv_dereg_mr(p.b.mr) == EINVAL);
	fill(p.a.buf, MSG, 1);
	CHECK(rdma(&p, IBV_WR_RDMA_WRITE, p.b.buf, one->rkey, MSG, 11) == IBV_WC_SUCCESS);
	CHECK(memcmp(p.a.buf, p.b.buf, MSG) == 0);
	memset(p.a.buf, 0, MSG);
	CHECK(rdma(&p, IBV_WR_RDMA_READ, p.b.buf, one->rkey, MSG, 12) == IBV_WC_SUCCESS);
	CHECK(memcmp(p.a.buf, p.b.buf, MSG) == 0);

	/* A type 2 window over the next MSG bytes, bound by a work request. */
	uint32_t key2 = bind_type2(&p, two, p.b.buf + MSG, MSG, IBV_ACCESS_REMOTE_WRITE, 20);
	CHECK(expect(p.b.cq, 20, IBV_WC_SUCCESS).opcode == IBV_WC_BIND_MW);
	fill(p.a.buf, MSG, 2);
	CHECK(rdma(&p, IBV_WR_RDMA_WRITE, p.b.buf + MSG, key2, MSG, 21) == IBV_WC_SUCCESS);
	CHECK(memcmp(p.a.buf, p.b.buf + MSG, MSG) == 0);

	/* A's SEND with invalidate frees it. */
	uint8_t *inbox = p.b.buf + 3 * MSG;
	struct ibv_sge rsge = { .addr = (uintptr_t)inbox, .length = MSG, .lkey = p.b.mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 30, .sg_list = &rsge, .num_sge = 1 }, *rbad;
	CHECK(ibv_post_recv(p.b.qp, &rwr, &rbad) == 0);
	struct ibv_sge sge = { .addr = (uintptr_t)p.a.buf, .length = 64, .lkey = p.a.mr->lkey };
	struct ibv_send_wr send = { .wr_id = 31, .sg_list = &sge, .num_sge = 1,
				    .opcode = IBV_WR_SEND_WITH_INV, .invalidate_rkey = key2 };
	post(p.a.qp, &send);
	expect(p.a.cq, 31, IBV_WC_SUCCESS);
	wc = expect(p.b.cq, 30, IBV_WC_SUCCESS);
	CHECK(wc.opcode == IBV_WC_RECV && wc.byte_len == 64);
	CHECK((wc.wc_flags & IBV_WC_WITH_INV) && wc.invalidated_rkey == key2);

	/* Bound again through ibv_qp_ex, and freed by LOCAL_INV through it. */
	struct ibv_qp_ex *bx = ibv_qp_to_qp_ex(p.b.qp);
	CHECK(bx);
	struct ibv_mw_bind_info info = { .mr = p.b.mr, .addr = (uintptr_t)p.b.buf + MSG,
					 .length = MSG, .mw_access_flags = IBV_ACCESS_REMOTE_WRITE };
	uint32_t key3 = ibv_inc_rkey(key2);
	ibv_wr_start(bx);
	bx->wr_id = 40;
	bx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(bx, two, key3, &info);
	CHECK(ibv_wr_complete(bx) == 0);
	CHECK(expect(p.b.cq, 40, IBV_WC_SUCCESS).opcode == IBV_WC_BIND_MW);
	CHECK(rdma(&p, IBV_WR_RDMA_WRITE, p.b.buf + MSG, key3, 8, 41) == IBV_WC_SUCCESS);
	ibv_wr_start(bx);
	bx->wr_id = 42;
	bx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(bx, key3);
	CHECK(ibv_wr_complete(bx) == 0);
	CHECK(expect(p.b.cq, 42, IBV_WC_SUCCESS).opcode == IBV_WC_LOCAL_INV);

	/* Bound once more, freed by ibv_wr_send_inv from A. */
	uint32_t key4 = ibv_inc_rkey(key3);
	ibv_wr_start(bx);
	bx->wr_id = 43;
	bx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(bx, two, key4, &info);
	CHECK(ibv_wr_complete(bx) == 0);
	expect(p.b.cq, 43, IBV_WC_SUCCESS);
	CHECK(ibv_post_recv(p.b.qp, &rwr, &rbad) == 0);
	struct ibv_qp_ex *ax = ibv_qp_to_qp_ex(p.a.qp);
	CHECK(ax);
	ibv_wr_start(ax);
	ax->wr_id = 44;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_inv(ax, key4);
	ibv_wr_set_sge(ax, p.a.mr->lkey, (uintptr_t)p.a.buf, 16);
	CHECK(ibv_wr_complete(ax) == 0);
	expect(p.a.cq, 44, IBV_WC_SUCCESS);
	wc = expect(p.b.cq, 30, IBV_WC_SUCCESS);
	CHECK((wc.wc_flags & IBV_WC_WITH_INV) && wc.invalidated_rkey == key4);

	/* A bind of length 0 unbinds the type 1 window; the region can go once none is bound. */
	struct ibv_mw_bind unbind = { .wr_id = 50, .send_flags = IBV_SEND_SIGNALED };
	CHECK(ibv_bind_mw(p.b.qp, one, &unbind) == 0);
	expect(p.b.cq, 50, IBV_WC_SUCCESS);
	CHECK(rdma(&p, IBV_WR_RDMA_WRITE, p.b.buf, one->rkey, 8, 51) == IBV_WC_REM_ACCESS_ERR);

	/* Failures, each on a fresh pair. */
	struct pair q = new_pair();
	struct ibv_mw *w = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(w);
	uint32_t kw = bind_type2(&q, w, q.b.buf, MSG, RW, 60);
	expect(q.b.cq, 60, IBV_WC_SUCCESS);
	CHECK(rdma(&q, IBV_WR_RDMA_WRITE, q.b.buf + MSG - 4, kw, 8, 61) == IBV_WC_REM_ACCESS_ERR);

	q = new_pair();
	w->rkey = kw;
	bind_type2(&q, w, q.b.buf, MSG, RW, 62);
	expect(q.b.cq, 62, IBV_WC_MW_BIND_ERR);

	q = new_pair();
	struct ibv_mw *t1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	struct ibv_mw_bind b1 = bind;
	b1.bind_info.mr = q.b.mr;
	b1.bind_info.addr = (uintptr_t)q.b.buf;
	b1.wr_id = 63;
	CHECK(t1 && ibv_bind_mw(q.b.qp, t1, &b1) == 0);
	expect(q.b.cq, 63, IBV_WC_SUCCESS);
	struct ibv_send_wr inv = { .wr_id = 64, .opcode = IBV_WR_LOCAL_INV,
				   .send_flags = IBV_SEND_SIGNALED, .invalidate_rkey = t1->rkey };
	post(q.b.qp, &inv);
	expect(q.b.cq, 64, IBV_WC_LOC_QP_OP_ERR);

	q = new_pair();
	rsge.addr = (uintptr_t)q.b.buf;
	rsge.lkey = q.b.mr->lkey;
	rwr.wr_id = 65;
	CHECK(ibv_post_recv(q.b.qp, &rwr, &rbad) == 0);
	sge.addr = (uintptr_t)q.a.buf;
	sge.lkey = q.a.mr->lkey;
	send.wr_id = 66;
	send.invalidate_rkey = q.b.mr->rkey;
	post(q.a.qp, &send);
	expect(q.a.cq, 66, IBV_WC_REM_INV_REQ_ERR);
	expect(q.b.cq, 65, IBV_WC_REM_INV_REQ_ERR);

	CHECK(ibv_dealloc_mw(one) == 0 && ibv_dealloc_mw(two) == 0);
	CHECK(ibv_dereg_mr(p.b.mr) == 0);
	printf("ok\n");
	return 0;
}
