/* XRC across the wire, one process each side. The server opens an XRC domain by a file
 * (checking what ibv_open_xrcd answers: the same domain for a second open, EINVAL with
 * O_EXCL, EAGAIN for a file without one and no O_CREAT, EBADF, EINVAL without fd/oflags),
 * makes two XRC SRQs in it (each with its own PD and CQ; ibv_get_srq_num), an XRC target
 * QP (ibv_create_qp_ex with IBV_QPT_XRC_RECV), and opens that target again (ibv_open_qp).
 * The client's XRC initiator (ibv_create_qp, its receive CQ NULL) sends to each SRQ with
 * ibv_post_send (qp_type.xrc.remote_srqn) and through ibv_qp_ex (ibv_wr_set_xrc_srqn),
 * writes into and reads back from the first SRQ's region, and finally names an SRQ number
 * that is not the domain's: IBV_WC_REM_INV_REQ_ERR. The server checks every byte and
 * completion, that the target outlives its creator's handle while opened, and that
 * ibv_close_xrcd is EBUSY while an SRQ holds the domain. QP numbers, PSNs, GIDs and SRQ
 * numbers travel over TCP port 18519.
 *   xrc DEVICE GID_INDEX              (server)
 *   xrc DEVICE GID_INDEX SERVER_IP    (client)
 * Prints "ok" and exits 0 when every check on its side holds. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "common.h"

enum { SIZE = 16384, MSG = 3000, PORT = 18519 };

struct hello {
	uint32_t qpn, psn, srqn[2];
	uint64_t addr;
	uint32_t rkey;
	uint8_t gid[16];
};

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static struct ibv_wc expect(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_status status)
{
	struct ibv_wc wc;
	double deadline = now() + 20;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0 && now() < deadline)
		;
	CHECK(n == 1);
	if (wc.status != status || wc.wr_id != wr_id) {
		fprintf(stderr, "FAILED: wr %llu completed %s, wanted wr %llu %s\n",
			(unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status),
			(unsigned long long)wr_id, ibv_wc_status_str(status));
		exit(1);
	}
	return wc;
}

static void send_all(int fd, const void *buf, size_t len)
{
	CHECK(write(fd, buf, len) == (ssize_t)len);
}

static void recv_all(int fd, void *buf, size_t len)
{
	size_t got = 0;
	while (got < len) {
		ssize_t n = read(fd, (char *)buf + got, len - got);
		CHECK(n > 0);
		got += n;
	}
}

static int rendezvous(const char *server)
{
	struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons(PORT) };
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(fd >= 0);
	if (!server) {
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		CHECK(bind(fd, (struct sockaddr *)&addr, sizeof addr) == 0);
		CHECK(listen(fd, 1) == 0);
		int conn = accept(fd, NULL, NULL);
		CHECK(conn >= 0);
		close(fd);
		return conn;
	}
	CHECK(inet_pton(AF_INET, server, &addr.sin_addr) == 1);
	double deadline = now() + 30;
	while (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
		CHECK(now() < deadline);
		usleep(100000);
		close(fd);
		fd = socket(AF_INET, SOCK_STREAM, 0);
	}
	return fd;
}

/* RESET -> INIT -> RTR -> RTS with the attributes each XRC half takes. */
static void to_rts(struct ibv_qp *qp, int target, uint32_t psn, const struct hello *peer,
		   int gid_index)
{
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_INIT,
		.port_num = 1,
		.qp_access_flags = target ? IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ : 0,
	};
	CHECK(ibv_modify_qp(qp, &attr,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_RTR;
	attr.path_mtu = IBV_MTU_1024;
	attr.dest_qp_num = peer->qpn;
	attr.rq_psn = peer->psn;
	attr.max_dest_rd_atomic = 1;
	attr.min_rnr_timer = 12;
	attr.ah_attr.is_global = 1;
	memcpy(attr.ah_attr.grh.dgid.raw, peer->gid, 16);
	attr.ah_attr.grh.sgid_index = gid_index;
	attr.ah_attr.grh.hop_limit = 64;
	attr.ah_attr.port_num = 1;
	int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	if (target)
		rtr |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	CHECK(ibv_modify_qp(qp, &attr, rtr) == 0);
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_RTS;
	attr.timeout = 14;
	attr.retry_cnt = 7;
	attr.rnr_retry = 7;
	attr.sq_psn = psn;
	attr.max_rd_atomic = 1;
	int rts = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN;
	if (!target)
		rts |= IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	CHECK(ibv_modify_qp(qp, &attr, rts) == 0);
}

static void fill(uint8_t *buf, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(i * 131 + seed);
}

/* What ibv_open_xrcd answers, on a fresh temporary file; the domain of `path`. */
static struct ibv_xrcd *open_checked(struct ibv_context *ctx, const char *path)
{
	struct ibv_xrcd_init_attr attr = { .comp_mask = IBV_XRCD_INIT_ATTR_FD |
						       IBV_XRCD_INIT_ATTR_OFLAGS };
	attr.fd = open(path, O_RDONLY | O_CREAT, 0600);
	CHECK(attr.fd >= 0);
	attr.oflags = 0;
	errno = 0;
	CHECK(!ibv_open_xrcd(ctx, &attr) && errno == EAGAIN);
	attr.oflags = O_CREAT;
	struct ibv_xrcd *xrcd = ibv_open_xrcd(ctx, &attr);
	CHECK(xrcd && xrcd->context == ctx);
	struct ibv_xrcd *again = ibv_open_xrcd(ctx, &attr);
	CHECK(again && again != xrcd);
	attr.oflags = O_CREAT | O_EXCL;
	errno = 0;
	CHECK(!ibv_open_xrcd(ctx, &attr) && errno == EINVAL);
	CHECK(ibv_close_xrcd(again) == 0);
	struct ibv_xrcd_init_attr bad = { .comp_mask = IBV_XRCD_INIT_ATTR_FD, .fd = -1 };
	errno = 0;
	CHECK(!ibv_open_xrcd(ctx, &bad) && errno == EINVAL);
	bad.comp_mask |= IBV_XRCD_INIT_ATTR_OFLAGS;
	bad.fd = 1000;
	errno = 0;
	CHECK(!ibv_open_xrcd(ctx, &bad) && errno == EBADF);
	bad.fd = -1;
	struct ibv_xrcd *anonymous = ibv_open_xrcd(ctx, &bad);
	CHECK(anonymous && ibv_close_xrcd(anonymous) == 0);
	close(attr.fd);
	return xrcd;
}

static void server(struct ibv_context *ctx, int gid_index)
{
	char path[] = "/tmp/roce-xrc-XXXXXX";
	int tmp = mkstemp(path);
	CHECK(tmp >= 0);
	close(tmp);
	struct ibv_xrcd *xrcd = open_checked(ctx, path);
	unlink(path);
	struct ibv_pd *pd[2];
	struct ibv_cq *cq[2];
	struct ibv_srq *srq[2];
	struct ibv_mr *mr[2];
	uint8_t *buf[2];
	struct hello me = { 0 }, peer;
	for (int i = 0; i < 2; i++) {
		pd[i] = ibv_alloc_pd(ctx);
		cq[i] = ibv_create_cq(ctx, 16, NULL, NULL, 0);
		CHECK(pd[i] && cq[i]);
		struct ibv_srq_init_attr_ex init = {
			.attr = { .max_wr = 8, .max_sge = 1 },
			.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
				     IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ,
			.srq_type = IBV_SRQT_XRC,
			.pd = pd[i],
			.xrcd = xrcd,
			.cq = cq[i],
		};
		srq[i] = ibv_create_srq_ex(ctx, &init);
		CHECK(srq[i]);
		CHECK(ibv_get_srq_num(srq[i], &me.srqn[i]) == 0);
		buf[i] = calloc(1, SIZE);
		mr[i] = ibv_reg_mr(pd[i], buf[i], SIZE,
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					   IBV_ACCESS_REMOTE_READ);
		CHECK(buf[i] && mr[i]);
	}
	CHECK(me.srqn[0] != me.srqn[1]);
	struct ibv_srq_init_attr_ex no_cq = {
		.attr = { .max_wr = 8, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD,
		.srq_type = IBV_SRQT_XRC,
		.pd = pd[0],
		.xrcd = xrcd,
	};
	errno = 0;
	CHECK(!ibv_create_srq_ex(ctx, &no_cq) && errno == EINVAL);
	struct ibv_qp_init_attr_ex tinit = {
		.qp_type = IBV_QPT_XRC_RECV,
		.comp_mask = IBV_QP_INIT_ATTR_XRCD,
		.xrcd = xrcd,
	};
	struct ibv_qp *tgt = ibv_create_qp_ex(ctx, &tinit);
	CHECK(tgt && tgt->qp_type == IBV_QPT_XRC_RECV);
	struct ibv_qp_open_attr oattr = {
		.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE,
		.qp_num = tgt->qp_num,
		.xrcd = xrcd,
		.qp_type = IBV_QPT_XRC_RECV,
	};
	struct ibv_qp *opened = ibv_open_qp(ctx, &oattr);
	CHECK(opened && opened != tgt && opened->qp_num == tgt->qp_num);
	oattr.qp_num = tgt->qp_num + 1000;
	errno = 0;
	CHECK(!ibv_open_qp(ctx, &oattr) && errno == EINVAL);

	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, gid_index, &gid) == 0);
	memcpy(me.gid, gid.raw, 16);
	me.qpn = tgt->qp_num;
	me.psn = 0x1234;
	me.addr = (uintptr_t)buf[0];
	me.rkey = mr[0]->rkey;
	for (int i = 0; i < 2; i++) {
		for (int n = 0; n < 2; n++) {
			struct ibv_sge sge = { .addr = (uintptr_t)buf[i] + n * 4096, .length = 4096,
					       .lkey = mr[i]->lkey };
			struct ibv_recv_wr rwr = { .wr_id = 10 * i + n, .sg_list = &sge,
						   .num_sge = 1 }, *bad;
			CHECK(ibv_post_srq_recv(srq[i], &rwr, &bad) == 0);
		}
	}
	int fd = rendezvous(NULL);
	send_all(fd, &me, sizeof me);
	recv_all(fd, &peer, sizeof peer);
	/* The creator's handle goes; the opened one brings the target up. */
	CHECK(ibv_destroy_qp(tgt) == 0);
	to_rts(opened, 1, me.psn, &peer, gid_index);
	send_all(fd, "r", 1);

	/* Each SRQ got its SENDs: one by ibv_post_send, one by ibv_qp_ex. */
	uint8_t want[MSG];
	for (int i = 0; i < 2; i++) {
		for (int n = 0; n < 2; n++) {
			struct ibv_wc wc = expect(cq[i], 10 * i + n, IBV_WC_SUCCESS);
			CHECK(wc.opcode == IBV_WC_RECV && wc.byte_len == MSG + i + n);
			CHECK(wc.qp_num == opened->qp_num);
			fill(want, MSG, 10 * i + n);
			CHECK(memcmp(buf[i] + n * 4096, want, MSG) == 0);
		}
	}
	char step;
	recv_all(fd, &step, 1);
	fill(want, MSG, 99);
	CHECK(step == 'w' && memcmp(buf[0] + 8192, want, MSG) == 0);
	errno = 0;
	CHECK(ibv_close_xrcd(xrcd) == EBUSY);
	recv_all(fd, &step, 1);
	CHECK(step == 'e');
	CHECK(ibv_destroy_qp(opened) == 0);
	for (int i = 0; i < 2; i++)
		CHECK(ibv_destroy_srq(srq[i]) == 0);
	CHECK(ibv_close_xrcd(xrcd) == 0);
	/* Closed in order, so that a capture (ROCE_PCAP) is complete. */
	for (int i = 0; i < 2; i++) {
		CHECK(ibv_dereg_mr(mr[i]) == 0 && ibv_destroy_cq(cq[i]) == 0);
		CHECK(ibv_dealloc_pd(pd[i]) == 0);
	}
	CHECK(ibv_close_device(ctx) == 0);
	printf("ok\n");
}

static void client(struct ibv_context *ctx, int gid_index, const char *server_ip)
{
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	uint8_t *buf = calloc(1, SIZE);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, SIZE, IBV_ACCESS_LOCAL_WRITE);
	CHECK(pd && cq && buf && mr);
	struct ibv_qp_init_attr_ex init = {
		.send_cq = cq,
		.cap = { .max_send_wr = 8, .max_send_sge = 1 },
		.qp_type = IBV_QPT_XRC_SEND,
		.sq_sig_all = 1,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_SEND,
	};
	struct ibv_qp *ini = ibv_create_qp_ex(ctx, &init);
	CHECK(ini && ini->qp_type == IBV_QPT_XRC_SEND);
	struct hello me = { .qpn = ini->qp_num, .psn = 0x5678 }, peer;
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, gid_index, &gid) == 0);
	memcpy(me.gid, gid.raw, 16);
	int fd = rendezvous(server_ip);
	send_all(fd, &me, sizeof me);
	recv_all(fd, &peer, sizeof peer);
	to_rts(ini, 0, me.psn, &peer, gid_index);
	char step;
	recv_all(fd, &step, 1);

	struct ibv_qp_ex *qpx = ibv_qp_to_qp_ex(ini);
	CHECK(qpx);
	for (int i = 0; i < 2; i++) {
		uint8_t *at = buf + i * 4096;
		fill(at, MSG + i, 10 * i);
		struct ibv_sge sge = { .addr = (uintptr_t)at, .length = MSG + i, .lkey = mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 2 * i, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND }, *bad;
		wr.qp_type.xrc.remote_srqn = peer.srqn[i];
		CHECK(ibv_post_send(ini, &wr, &bad) == 0);
		expect(cq, 2 * i, IBV_WC_SUCCESS);
		at = buf + 8192;
		fill(at, MSG + i + 1, 10 * i + 1);
		ibv_wr_start(qpx);
		qpx->wr_id = 2 * i + 1;
		qpx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send(qpx);
		ibv_wr_set_xrc_srqn(qpx, peer.srqn[i]);
		ibv_wr_set_sge(qpx, mr->lkey, (uintptr_t)at, MSG + i + 1);
		CHECK(ibv_wr_complete(qpx) == 0);
		expect(cq, 2 * i + 1, IBV_WC_SUCCESS);
	}
	/* WRITE then READ through the first SRQ's PD. */
	fill(buf, MSG, 99);
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = MSG, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE }, *bad;
	wr.qp_type.xrc.remote_srqn = peer.srqn[0];
	wr.wr.rdma.remote_addr = peer.addr + 8192;
	wr.wr.rdma.rkey = peer.rkey;
	CHECK(ibv_post_send(ini, &wr, &bad) == 0);
	expect(cq, 7, IBV_WC_SUCCESS);
	memset(buf + 4096, 0, MSG);
	sge.addr = (uintptr_t)buf + 4096;
	wr.wr_id = 8;
	wr.opcode = IBV_WR_RDMA_READ;
	CHECK(ibv_post_send(ini, &wr, &bad) == 0);
	expect(cq, 8, IBV_WC_SUCCESS);
	CHECK(memcmp(buf, buf + 4096, MSG) == 0);
	send_all(fd, "w", 1);
	/* An SRQ number the domain does not have. */
	wr.wr_id = 9;
	wr.opcode = IBV_WR_SEND;
	wr.qp_type.xrc.remote_srqn = peer.srqn[0] ^ 0x400000;
	CHECK(ibv_post_send(ini, &wr, &bad) == 0);
	expect(cq, 9, IBV_WC_REM_INV_REQ_ERR);
	send_all(fd, "e", 1);
	CHECK(ibv_destroy_qp(ini) == 0 && ibv_dereg_mr(mr) == 0 && ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0);
	printf("ok\n");
}

int main(int argc, char **argv)
{
	CHECK(argc == 3 || argc == 4);
	struct ibv_context *ctx = open_device(argv[1]);
	int gid_index = atoi(argv[2]);
	if (argc == 3)
		server(ctx, gid_index);
	else
		client(ctx, gid_index, argv[3]);
	return 0;
}
