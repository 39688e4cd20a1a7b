/* UD multicast through libibverbs' C API, as rdma-core and rxe define it.
 *
 *   mcast errors DEVICE        attach/detach errno, the limits, destroy of an attached QP
 *   mcast recv DEVICE GROUP N  two UD QPs attached to the group GROUP (an IPv4 or IPv6
 *                              address), N receives each;
 *                              prints "ready" once attached, then waits (10 s at most) for
 *                              every datagram on both QPs and checks each byte
 *   mcast send DEVICE GROUP N  N datagrams to GROUP (QPN 0xFFFFFF) through an address handle
 *
 * Each prints "ok" and exits 0 when every check holds, else names the first that failed. */
#include <arpa/inet.h>
#include <stdint.h>
#include <time.h>
#include "common.h"

enum { LEN = 256, GRH = 40, QKEY = 0x01234567, MAX_N = 64 };

static struct ibv_pd *pd;
static struct ibv_cq *cq;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* A QP of `type` in RESET, or NULL with errno. */
static struct ibv_qp *qp_of(enum ibv_qp_type type)
{
	struct ibv_qp_init_attr init = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = MAX_N, .max_recv_wr = MAX_N, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = type,
	};
	return ibv_create_qp(pd, &init);
}

/* A UD QP moved to RTS with rdma_cm's Q_Key. */
static struct ibv_qp *ud_qp(void)
{
	struct ibv_qp *qp = qp_of(IBV_QPT_UD);
	CHECK(qp);
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				    .qkey = QKEY };
	CHECK(ibv_modify_qp(qp, &attr,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0);
	attr = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR };
	CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE) == 0);
	attr = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .sq_psn = 0 };
	CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
	return qp;
}

/* The GID of `ip`: an IPv6 address as it is, IPv4 mapped. */
static union ibv_gid mapped(const char *ip)
{
	union ibv_gid gid = { 0 };
	if (strchr(ip, ':')) {
		CHECK(inet_pton(AF_INET6, ip, gid.raw) == 1);
		return gid;
	}
	gid.raw[10] = 0xff;
	gid.raw[11] = 0xff;
	CHECK(inet_pton(AF_INET, ip, &gid.raw[12]) == 1);
	return gid;
}

/* Byte `i` of datagram `n`. */
static uint8_t byte(int n, int i)
{
	return (uint8_t)(i * 7 + n * 31 + 1);
}

static int errors(struct ibv_context *ctx)
{
	struct ibv_device_attr dev;
	CHECK(ibv_query_device(ctx, &dev) == 0);
	/* rxe's limits. */
	CHECK(dev.max_mcast_grp == 8192);
	CHECK(dev.max_mcast_qp_attach == 56);
	CHECK(dev.max_total_mcast_qp_attach == 0x70000);

	union ibv_gid group = mapped("239.3.3.3"), unicast = mapped("10.3.3.3");
	struct ibv_qp *ud = ud_qp(), *rc = qp_of(IBV_QPT_RC);
	CHECK(rc);
	CHECK(ibv_attach_mcast(rc, &group, 0) == EINVAL);
	CHECK(ibv_attach_mcast(ud, &unicast, 0) == EINVAL);
	CHECK(ibv_detach_mcast(ud, &group, 0) == EINVAL);
	CHECK(ibv_attach_mcast(ud, &group, 0) == 0);
	CHECK(ibv_attach_mcast(ud, &group, 0) == 0);
	/* uverbs keeps a QP with attachments alive. */
	CHECK(ibv_destroy_qp(ud) == EBUSY);
	CHECK(ibv_detach_mcast(ud, &group, 0) == 0);
	CHECK(ibv_detach_mcast(ud, &group, 0) == EINVAL);
	CHECK(ibv_destroy_qp(ud) == 0);
	CHECK(ibv_destroy_qp(rc) == 0);

	/* 56 QPs to a group, the 57th refused. */
	struct ibv_qp *qps[57];
	for (int i = 0; i < 57; i++) {
		qps[i] = qp_of(IBV_QPT_UD);
		CHECK(qps[i]);
		CHECK(ibv_attach_mcast(qps[i], &group, 0) == (i < 56 ? 0 : ENOMEM));
	}
	for (int i = 0; i < 57; i++) {
		if (i < 56)
			CHECK(ibv_detach_mcast(qps[i], &group, 0) == 0);
		CHECK(ibv_destroy_qp(qps[i]) == 0);
	}
	return 0;
}

static int recv_side(const char *group_ip, int n)
{
	union ibv_gid group = mapped(group_ip);
	struct ibv_qp *qps[2] = { ud_qp(), ud_qp() };
	static uint8_t buf[2][MAX_N][GRH + LEN];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr);
	for (int q = 0; q < 2; q++) {
		CHECK(ibv_attach_mcast(qps[q], &group, 0) == 0);
		for (int i = 0; i < n; i++) {
			struct ibv_sge sge = { (uintptr_t)buf[q][i], GRH + LEN, mr->lkey };
			struct ibv_recv_wr wr = { .wr_id = (uint64_t)q << 32 | i, .sg_list = &sge,
						  .num_sge = 1 },
					   *bad;
			CHECK(ibv_post_recv(qps[q], &wr, &bad) == 0);
		}
	}
	printf("ready\n");
	fflush(stdout);
	int got[2] = { 0, 0 };
	double deadline = now() + 10;
	while (got[0] + got[1] < 2 * n && now() < deadline) {
		struct ibv_wc wc;
		int polled = ibv_poll_cq(cq, 1, &wc);
		CHECK(polled >= 0);
		if (!polled)
			continue;
		CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV);
		CHECK(wc.byte_len == GRH + LEN && (wc.wc_flags & IBV_WC_GRH));
		int q = wc.wr_id >> 32, i = wc.wr_id & 0xffffffff;
		CHECK(wc.qp_num == qps[q]->qp_num);
		/* In order: datagram i fills receive i. The GRH area's destination is the group:
		 * the whole IPv6 header, or an IPv4 header in its last 20 bytes. */
		CHECK(i == got[q]);
		if (group.raw[0] == 0xff)
			CHECK(!memcmp(&buf[q][i][24], group.raw, 16));
		else
			CHECK(!memcmp(&buf[q][i][GRH - 4], &group.raw[12], 4));
		for (int b = 0; b < LEN; b++)
			CHECK(buf[q][i][GRH + b] == byte(i, b));
		got[q]++;
	}
	printf("received %d %d\n", got[0], got[1]);
	CHECK(got[0] == n && got[1] == n);
	for (int q = 0; q < 2; q++) {
		CHECK(ibv_detach_mcast(qps[q], &group, 0) == 0);
		CHECK(ibv_destroy_qp(qps[q]) == 0);
	}
	CHECK(ibv_dereg_mr(mr) == 0);
	return 0;
}

static int send_side(const char *group_ip, int n)
{
	struct ibv_qp *qp = ud_qp();
	static uint8_t buf[MAX_N][LEN];
	for (int i = 0; i < n; i++)
		for (int b = 0; b < LEN; b++)
			buf[i][b] = byte(i, b);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr);
	/* From the IPv4-mapped GID (index 1) to an IPv4 group, the link-local one (index 0) to
	 * an IPv6 group. */
	union ibv_gid group = mapped(group_ip);
	struct ibv_ah_attr to = { .is_global = 1, .port_num = 1,
				  .grh = { .dgid = group, .sgid_index = group.raw[0] == 0xff ? 0 : 1,
					   .hop_limit = 64 } };
	struct ibv_ah *ah = ibv_create_ah(pd, &to);
	CHECK(ah);
	for (int i = 0; i < n; i++) {
		struct ibv_sge sge = { (uintptr_t)buf[i], LEN, mr->lkey };
		struct ibv_send_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
				   *bad;
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = 0xffffff;
		wr.wr.ud.remote_qkey = QKEY;
		CHECK(ibv_post_send(qp, &wr, &bad) == 0);
		struct ibv_wc wc;
		int polled;
		double deadline = now() + 5;
		while ((polled = ibv_poll_cq(cq, 1, &wc)) == 0 && now() < deadline)
			;
		CHECK(polled == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)i);
	}
	CHECK(ibv_destroy_ah(ah) == 0);
	CHECK(ibv_destroy_qp(qp) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	return 0;
}

int main(int argc, char **argv)
{
	CHECK(argc >= 3);
	struct ibv_context *ctx = open_device(argv[2]);
	pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	cq = ibv_create_cq(ctx, 2 * MAX_N, NULL, NULL, 0);
	CHECK(cq);
	int n = argc > 4 ? atoi(argv[4]) : 0;
	CHECK(n >= 0 && n <= MAX_N);
	if (!strcmp(argv[1], "errors"))
		errors(ctx);
	else if (!strcmp(argv[1], "recv") && argc == 5)
		recv_side(argv[3], n);
	else if (!strcmp(argv[1], "send") && argc == 5)
		send_side(argv[3], n);
	else
		CHECK(!"usage: mcast errors|recv|send DEVICE [GROUP N]");
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	printf("ok\n");
	return 0;
}
