/* ibv_import_device, ibv_import_pd, ibv_import_mr and ibv_unimport_*, within one process, as
 * rdma-core's test_shared_pd uses them: a context's cmd_fd (a dup of it) opens another
 * context in the same object space, where the first context's PD and MR are imported by
 * handle and carry traffic; handles are unique; what is not of that space is refused;
 * unimporting leaves the originals working, and closing the imported context closes its fd.
 * Prints "ok" and exits 0 when every check holds; otherwise names the first that failed.
 * Usage: import DEVICE */
#include <fcntl.h>
#include <time.h>
#include <unistd.h>
#include "common.h"

enum { SIZE = 4096 };
#define ALL_ACCESS \
	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static union ibv_gid gid;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void complete(struct ibv_cq *cq, uint64_t wr_id)
{
	struct ibv_wc wc;
	double deadline = now() + 5;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0 && now() < deadline)
		;
	CHECK(n == 1);
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != wr_id) {
		fprintf(stderr, "FAILED: wr %llu completed %s\n", (unsigned long long)wc.wr_id,
			ibv_wc_status_str(wc.status));
		exit(1);
	}
}

static struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr init = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .sq_sig_all = 1,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	CHECK(qp);
	return qp;
}

static void rc_connect(struct ibv_qp *qp, uint32_t dest)
{
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = ALL_ACCESS,
	};
	CHECK(ibv_modify_qp(qp, &attr,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_RTR;
	attr.path_mtu = IBV_MTU_1024;
	attr.dest_qp_num = dest;
	attr.rq_psn = dest;
	attr.max_dest_rd_atomic = 1;
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
	attr.timeout = 14;
	attr.retry_cnt = 7;
	attr.rnr_retry = 7;
	attr.sq_psn = qp->qp_num;
	attr.max_rd_atomic = 1;
	CHECK(ibv_modify_qp(qp, &attr,
			    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

/* RDMA WRITE of `len` bytes at `src` (key `lkey`) to `dst` (key `rkey`) through `qp`. */
static void rdma_write(struct ibv_qp *qp, struct ibv_cq *cq, void *src, uint32_t lkey,
		       void *dst, uint32_t rkey, uint32_t len, uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE }, *bad;
	wr.wr.rdma.remote_addr = (uintptr_t)dst;
	wr.wr.rdma.rkey = rkey;
	CHECK(ibv_post_send(qp, &wr, &bad) == 0);
	complete(cq, wr_id);
}

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	struct ibv_context *ctx = open_device(argv[1]);
	CHECK(ibv_query_gid(ctx, 1, 1, &gid) == 0);
	CHECK(ctx->cmd_fd >= 0);
	struct ibv_pd *pd = ibv_alloc_pd(ctx), *other_pd = ibv_alloc_pd(ctx);
	CHECK(pd && other_pd && pd->handle != other_pd->handle);
	uint8_t *buf = calloc(1, SIZE), *target = calloc(1, SIZE);
	CHECK(buf && target);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, SIZE, ALL_ACCESS);
	struct ibv_mr *target_mr = ibv_reg_mr(pd, target, SIZE, ALL_ACCESS);
	CHECK(mr && target_mr && mr->handle != target_mr->handle);

	/* Another context in the same object space, from a dup of the cmd_fd. */
	int fd = dup(ctx->cmd_fd);
	CHECK(fd >= 0);
	struct ibv_context *imported = ibv_import_device(fd);
	CHECK(imported && imported != ctx && imported->cmd_fd == fd &&
	      imported->device == ctx->device);
	struct ibv_pd *pd2 = ibv_import_pd(imported, pd->handle);
	CHECK(pd2 && pd2 != pd && pd2->context == imported && pd2->handle == pd->handle);
	struct ibv_mr *mr2 = ibv_import_mr(pd2, mr->handle);
	CHECK(mr2 && mr2->context == imported && mr2->pd == pd2 && mr2->addr == NULL &&
	      mr2->length == SIZE && mr2->lkey == mr->lkey && mr2->rkey == mr->rkey &&
	      mr2->handle == mr->handle);

	/* Refused: what is not open, not a context's, not an object's, or of another space. */
	errno = 0;
	CHECK(ibv_import_device(-1) == NULL && errno == EBADF);
	int null_fd = open("/dev/null", O_RDONLY);
	CHECK(null_fd >= 0);
	errno = 0;
	CHECK(ibv_import_device(null_fd) == NULL && errno == EINVAL);
	CHECK(fcntl(null_fd, F_GETFD) >= 0 && close(null_fd) == 0);
	errno = 0;
	CHECK(ibv_import_pd(imported, 0xdeadbeef) == NULL && errno == EINVAL);
	errno = 0;
	CHECK(ibv_import_mr(pd2, pd->handle) == NULL && errno == EINVAL);
	struct ibv_context *separate = open_device(argv[1]);
	CHECK(separate->cmd_fd >= 0 && separate->cmd_fd != ctx->cmd_fd);
	errno = 0;
	CHECK(ibv_import_pd(separate, pd->handle) == NULL && errno == EINVAL);

	/* Traffic: a QP of the imported context on the imported PD, with the imported MR's
	 * keys, and one of the first context, both ways. */
	struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	struct ibv_cq *cq2 = ibv_create_cq(imported, 8, NULL, NULL, 0);
	CHECK(cq && cq2);
	struct ibv_qp *qp = rc_qp(pd, cq), *qp2 = rc_qp(pd2, cq2);
	CHECK(qp2->context == imported && qp2->pd == pd2);
	rc_connect(qp, qp2->qp_num);
	rc_connect(qp2, qp->qp_num);
	for (int i = 0; i < SIZE; i++)
		buf[i] = (uint8_t)(i * 7 + 1);
	rdma_write(qp2, cq2, buf, mr2->lkey, target, target_mr->rkey, SIZE, 1);
	CHECK(memcmp(buf, target, SIZE) == 0);
	memset(target, 0x5a, 100);
	rdma_write(qp, cq, target, target_mr->lkey, buf + 1000, mr2->rkey, 100, 2);
	CHECK(memcmp(buf + 1000, target, 100) == 0);

	/* Unimported, then the imported context closed (with its fd): the originals work on. */
	CHECK(ibv_destroy_qp(qp2) == 0 && ibv_destroy_cq(cq2) == 0);
	ibv_unimport_mr(mr2);
	ibv_unimport_pd(pd2);
	CHECK(ibv_close_device(imported) == 0);
	errno = 0;
	CHECK(fcntl(fd, F_GETFD) == -1 && errno == EBADF);
	CHECK(ibv_destroy_qp(qp) == 0);
	struct ibv_qp *qp3 = rc_qp(pd, cq), *qp4 = rc_qp(pd, cq);
	rc_connect(qp4, qp3->qp_num);
	rc_connect(qp3, qp4->qp_num);
	memset(target, 0x33, SIZE);
	rdma_write(qp3, cq, target, target_mr->lkey, buf, mr->rkey, SIZE, 3);
	CHECK(memcmp(buf, target, SIZE) == 0);
	CHECK(ibv_destroy_qp(qp3) == 0 && ibv_destroy_qp(qp4) == 0 && ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dealloc_pd(pd) == EBUSY);
	CHECK(ibv_dereg_mr(mr) == 0 && ibv_dereg_mr(target_mr) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0 && ibv_dealloc_pd(other_pd) == 0);
	CHECK(ibv_close_device(separate) == 0 && ibv_close_device(ctx) == 0);
	printf("ok\n");
	return 0;
}
