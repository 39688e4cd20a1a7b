/* Counters read live from the device view: sends COUNT UD messages of one packet each from the
 * device to itself (GID index 1), then, with the device still open, reads
 * /sys/class/infiniband/DEVICE/ports/1/hw_counters/sent_pkts until it says at least COUNT more
 * than before (at most 3 s: the files are rewritten every 100 ms). Prints
 * "sent_pkts BEFORE -> AFTER" and exits 0 when it got there; otherwise says what it read.
 * Usage: counters_live DEVICE COUNT */
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include "common.h"

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static long long sent_pkts(const char *device)
{
	char path[256], text[64] = { 0 };
	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/hw_counters/sent_pkts",
		 device);
	FILE *file = fopen(path, "r");
	CHECK(file);
	CHECK(fgets(text, sizeof(text), file));
	fclose(file);
	return atoll(text);
}

int main(int argc, char **argv)
{
	CHECK(argc == 3);
	const char *name = argv[1];
	int count = atoi(argv[2]);
	CHECK(count > 0 && count <= 64);
	long long before = sent_pkts(name);

	struct ibv_context *ctx = open_device(name);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	struct ibv_cq *cq = ibv_create_cq(ctx, 128, NULL, NULL, 0);
	CHECK(cq);
	static uint8_t buf[64 + 40];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr);
	struct ibv_qp_init_attr init = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_UD,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	CHECK(qp);
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				    .qkey = 0x11111111 };
	CHECK(!ibv_modify_qp(qp, &attr,
			     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY));
	attr.qp_state = IBV_QPS_RTR;
	CHECK(!ibv_modify_qp(qp, &attr, IBV_QP_STATE));
	attr.qp_state = IBV_QPS_RTS;
	attr.sq_psn = 0;
	CHECK(!ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN));

	union ibv_gid gid;
	CHECK(!ibv_query_gid(ctx, 1, 1, &gid));
	struct ibv_ah_attr ah_attr = { .is_global = 1, .port_num = 1,
				       .grh = { .dgid = gid, .sgid_index = 1, .hop_limit = 64 } };
	struct ibv_ah *ah = ibv_create_ah(pd, &ah_attr);
	CHECK(ah);
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	for (int i = 0; i < count; i++) {
		struct ibv_send_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
					  .wr = { .ud = { .ah = ah, .remote_qpn = qp->qp_num,
							  .remote_qkey = 0x11111111 } } };
		struct ibv_send_wr *bad;
		CHECK(!ibv_post_send(qp, &wr, &bad));
		struct ibv_wc wc;
		double deadline = now() + 5;
		int n;
		while ((n = ibv_poll_cq(cq, 1, &wc)) == 0 && now() < deadline)
			;
		CHECK(n == 1 && wc.status == IBV_WC_SUCCESS);
	}

	long long after = sent_pkts(name);
	double deadline = now() + 3;
	while (after < before + count && now() < deadline) {
		usleep(10000);
		after = sent_pkts(name);
	}
	printf("sent_pkts %lld -> %lld\n", before, after);
	int live = after >= before + count;
	if (!live)
		fprintf(stderr, "FAILED: sent_pkts read %lld, wanted at least %lld while open\n",
			after, before + count);

	ibv_destroy_ah(ah);
	ibv_destroy_qp(qp);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return live ? 0 : 1;
}
