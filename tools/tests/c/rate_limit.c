/* A QP's rate limit through the verbs: ibv_modify_qp_rate_limit and IBV_QP_RATE_LIMIT of
 * ibv_modify_qp pace what the QP sends (a token bucket), between two RC QPs of one device.
 * A WRITE of 256 KiB at 10 Mb/s cannot take less than the time its frames take at that
 * rate; once the limit is removed (rate 0) it takes a fraction of it. Refused with EINVAL:
 * a limit on a QP not yet sending (RESET), an unknown comp_mask, IBV_QP_RATE_LIMIT on a
 * transition that does not end in RTS (the QP then stays as it was). Prints "ok" and exits
 * 0 when every check holds. Usage: rate_limit DEVICE */
#include "rc_pair.h"

#define LEN (256 * 1024)
#define KBPS 10000

/* Seconds a WRITE of LEN bytes from a to b takes. */
static double timed_write(struct ibv_qp *a, struct ibv_cq *cq, char *buf, struct ibv_mr *mr)
{
	double start = now();
	enum ibv_wc_status status =
		rdma_write(a, cq, buf, mr->lkey, (uintptr_t)(buf + LEN), mr->rkey, LEN);
	if (status != IBV_WC_SUCCESS)
		fprintf(stderr, "WRITE: %s\n", ibv_wc_status_str(status));
	CHECK(status == IBV_WC_SUCCESS);
	return now() - start;
}

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	struct ibv_context *ctx = open_device(argv[1]);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	static char buf[2 * LEN];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, ALL_ACCESS);
	CHECK(mr);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_qp *a = rc_qp(pd, cq, cq), *b = rc_qp(pd, cq, cq);

	struct ibv_qp_rate_limit_attr limit = { .rate_limit = KBPS };
	CHECK(ibv_modify_qp_rate_limit(a, &limit) == EINVAL); /* RESET */
	rc_pair(a, b);
	limit.comp_mask = 1;
	CHECK(ibv_modify_qp_rate_limit(a, &limit) == EINVAL);

	/* IBV_QP_RATE_LIMIT towards ERR is refused, and the QP stays in RTS. */
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_ERR, .rate_limit = KBPS };
	CHECK(ibv_modify_qp(a, &attr, IBV_QP_STATE | IBV_QP_RATE_LIMIT) == EINVAL);
	struct ibv_qp_init_attr init;
	CHECK(ibv_query_qp(a, &attr, IBV_QP_STATE, &init) == 0 && attr.qp_state == IBV_QPS_RTS);

	/* RTS -> RTS with the limit: paced. A frame carries 1024 bytes and 58 of headers. */
	double paced = (double)LEN / 1024 * (1024 + 58) * 8 / (KBPS * 1000.0);
	attr = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .rate_limit = KBPS };
	CHECK(ibv_modify_qp(a, &attr, IBV_QP_STATE | IBV_QP_RATE_LIMIT) == 0);
	double limited = timed_write(a, cq, buf, mr);
	CHECK(limited >= 0.9 * paced);

	/* Removed: a fraction of the time. */
	limit = (struct ibv_qp_rate_limit_attr){ .rate_limit = 0 };
	CHECK(ibv_modify_qp_rate_limit(a, &limit) == 0);
	double unlimited = timed_write(a, cq, buf, mr);
	CHECK(unlimited * 4 < limited);

	/* Again through ibv_modify_qp_rate_limit, with a burst. */
	limit = (struct ibv_qp_rate_limit_attr){ .rate_limit = KBPS, .max_burst_sz = 4096 };
	CHECK(ibv_modify_qp_rate_limit(a, &limit) == 0);
	double again = timed_write(a, cq, buf, mr);
	CHECK(again >= 0.9 * paced);
	printf("ok paced=%.3fs limited=%.3fs unlimited=%.3fs again=%.3fs\n", paced, limited,
	       unlimited, again);
	return 0;
}
