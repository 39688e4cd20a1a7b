/* Same-device traffic, as rxe's loopback carries it: two RC QPs of one device in one process
 * connected to each other through the device's IPv4-mapped GID (index 1), one QP connected
 * to itself through its link-local IPv6 GID (index 0), and two QPs of two contexts of the
 * device (each opened by its own ibv_open_device, as rdma-core's Python tests open one per
 * side) connected to each other. SEND/receive, RDMA WRITE, RDMA READ, FETCH_AND_ADD and
 * CMP_AND_SWAP, every byte checked. Prints "ok" and exits 0 when every check holds;
 * otherwise names the first that failed. Usage: loopback DEVICE */
#include <stdint.h>
#include <time.h>
#include "common.h"

enum { SIZE = 8192, MSG = 4096 };
#define ALL_ACCESS                                                                  \
	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | \
	 IBV_ACCESS_REMOTE_ATOMIC)

/* What a side's QP is made in: a context's PD and CQs. Send and receive completions apart: a
 * receive may complete before its SEND is acknowledged. */
struct resources {
	struct ibv_pd *pd;
	struct ibv_cq *send_cq, *recv_cq;
};

static union ibv_gid gids[2];

struct side {
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	uint8_t *buf;
	struct ibv_cq *send_cq, *recv_cq;
};

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* The next completion of `cq`, which must be wr_id's and successful; at most 5 s. */
static void complete(struct ibv_cq *cq, uint64_t wr_id)
{
	struct ibv_wc wc;
	double deadline = now() + 5;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0 && now() < deadline)
		;
	CHECK(n == 1);
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != wr_id) {
		fprintf(stderr, "FAILED: wr %llu completed %s, wanted wr %llu\n",
			(unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status),
			(unsigned long long)wr_id);
		exit(1);
	}
}

static void resources_init(struct resources *r, struct ibv_context *ctx)
{
	r->pd = ibv_alloc_pd(ctx);
	CHECK(r->pd);
	r->send_cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	r->recv_cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(r->send_cq && r->recv_cq);
}

static void side_init(struct side *s, struct resources *r)
{
	s->buf = calloc(1, SIZE);
	CHECK(s->buf);
	s->mr = ibv_reg_mr(r->pd, s->buf, SIZE, ALL_ACCESS);
	CHECK(s->mr);
	s->send_cq = r->send_cq;
	s->recv_cq = r->recv_cq;
	struct ibv_qp_init_attr init = {
		.send_cq = r->send_cq,
		.recv_cq = r->recv_cq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	s->qp = ibv_create_qp(r->pd, &init);
	CHECK(s->qp);
}

/* RESET -> INIT -> RTR -> RTS towards `peer` at our own GID `gid_index`, path MTU 1024 (a
 * 4 KiB message is several packets). */
static void connect_to(struct side *s, struct side *peer, int gid_index)
{
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = 1,
		.qp_access_flags = ALL_ACCESS,
	};
	CHECK(ibv_modify_qp(s->qp, &attr,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_RTR;
	attr.path_mtu = IBV_MTU_1024;
	attr.dest_qp_num = peer->qp->qp_num;
	attr.rq_psn = peer->qp->qp_num * 7 & 0xffffff;
	attr.max_dest_rd_atomic = 4;
	attr.min_rnr_timer = 12;
	attr.ah_attr.is_global = 1;
	attr.ah_attr.grh.dgid = gids[gid_index];
	attr.ah_attr.grh.sgid_index = gid_index;
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
	attr.sq_psn = s->qp->qp_num * 7 & 0xffffff;
	attr.max_rd_atomic = 4;
	CHECK(ibv_modify_qp(s->qp, &attr,
			    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

static void post(struct side *s, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	CHECK(ibv_post_send(s->qp, wr, &bad) == 0);
	complete(s->send_cq, wr->wr_id);
}

static void fill(uint8_t *buf, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(i * 131 + seed);
}

/* Every operation from `s` to `peer` (which may be `s` itself: then the targets are the
 * upper half of the one buffer, the sources the lower). */
static void exchange(struct side *s, struct side *peer, unsigned seed)
{
	uint8_t *src = s->buf, *dst = peer->buf + (s == peer ? SIZE / 2 : 0);
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = MSG, .lkey = s->mr->lkey };

	/* SEND into a posted receive. */
	memset(dst, 0, MSG);
	struct ibv_sge rsge = { .addr = (uintptr_t)dst, .length = MSG, .lkey = peer->mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 100, .sg_list = &rsge, .num_sge = 1 }, *rbad;
	CHECK(ibv_post_recv(peer->qp, &rwr, &rbad) == 0);
	fill(src, MSG, seed);
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	post(s, &wr);
	complete(peer->recv_cq, 100);
	CHECK(memcmp(src, dst, MSG) == 0);

	/* RDMA WRITE. */
	memset(dst, 0, MSG);
	fill(src, MSG, seed + 1);
	wr.wr_id = 2;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.wr.rdma.remote_addr = (uintptr_t)dst;
	wr.wr.rdma.rkey = peer->mr->rkey;
	post(s, &wr);
	CHECK(memcmp(src, dst, MSG) == 0);

	/* RDMA READ back what the peer holds. */
	fill(dst, MSG, seed + 2);
	memset(src, 0, MSG);
	wr.wr_id = 3;
	wr.opcode = IBV_WR_RDMA_READ;
	post(s, &wr);
	CHECK(memcmp(src, dst, MSG) == 0);

	/* FETCH_AND_ADD, then CMP_AND_SWAP, on the peer's first 8 bytes. */
	uint64_t *target = (uint64_t *)dst, *old = (uint64_t *)src;
	*target = 1000 + seed;
	sge.length = 8;
	wr.wr_id = 4;
	wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	wr.wr.atomic.remote_addr = (uintptr_t)dst;
	wr.wr.atomic.rkey = peer->mr->rkey;
	wr.wr.atomic.compare_add = 5;
	post(s, &wr);
	CHECK(*old == 1000 + seed && *target == 1005 + seed);
	wr.wr_id = 5;
	wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
	wr.wr.atomic.compare_add = 1005 + seed;
	wr.wr.atomic.swap = 77;
	post(s, &wr);
	CHECK(*old == 1005 + seed && *target == 77);
}

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	struct ibv_context *ctx = open_device(argv[1]);
	CHECK(ibv_query_gid(ctx, 1, 0, &gids[0]) == 0 && ibv_query_gid(ctx, 1, 1, &gids[1]) == 0);
	struct resources r;
	resources_init(&r, ctx);

	/* Two QPs connected to each other, both ways. */
	struct side a, b;
	side_init(&a, &r);
	side_init(&b, &r);
	connect_to(&a, &b, 1);
	connect_to(&b, &a, 1);
	exchange(&a, &b, 1);
	exchange(&b, &a, 2);

	/* One QP connected to itself. */
	struct side self;
	side_init(&self, &r);
	connect_to(&self, &self, 0);
	exchange(&self, &self, 3);

	/* A QP of a second context of the device, and one of the first, connected to each other
	 * (one device: one QP number space, one loopback, whichever context made the QP). */
	struct ibv_context *ctx2 = open_device(argv[1]);
	struct resources r2;
	resources_init(&r2, ctx2);
	struct side c, d;
	side_init(&c, &r);
	side_init(&d, &r2);
	CHECK(c.qp->qp_num != d.qp->qp_num);
	connect_to(&c, &d, 1);
	connect_to(&d, &c, 1);
	exchange(&c, &d, 4);
	exchange(&d, &c, 5);

	printf("ok\n");
	return 0;
}
