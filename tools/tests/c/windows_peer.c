/* Memory windows across the wire, one process each side (ours, or Linux rxe's rdma-core):
 * the server owns a region that grants nothing itself and hands the client two windows onto
 * it, a type 1 one bound with ibv_bind_mw and a type 2 one bound with IBV_WR_BIND_MW; the
 * client WRITEs through both and READs back through the first, then SENDs with invalidate
 * naming the type 2 window; the server sees that R_Key (and prints the completion's flags),
 * and the client's next WRITE through it fails with IBV_WC_REM_ACCESS_ERR. QP numbers,
 * PSNs, GIDs and the windows travel over TCP port 18517, as rc_pingpong's do.
 *   windows_peer DEVICE GID_INDEX              (server)
 *   windows_peer DEVICE GID_INDEX SERVER_IP    (client)
 * Prints "ok" and exits 0 when every check on its side holds. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "common.h"

enum { SIZE = 12288, MSG = 4096, PORT = 18517 };

struct hello {
	uint32_t qpn, psn;
	uint8_t gid[16];
};

struct windows {
	uint64_t addr;
	uint32_t rkey1, rkey2;
};

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static struct ibv_wc next(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	double deadline = now() + 20;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0 && now() < deadline)
		;
	CHECK(n == 1);
	return wc;
}

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

/* The TCP connection to the other side: accepted (server) or made (client, retried for a
 * while: the server may not listen yet). */
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

static void to_rts(struct ibv_qp *qp, const struct hello *me, const struct hello *peer,
		   int gid_index)
{
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_INIT,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ,
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
	CHECK(ibv_modify_qp(qp, &attr,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				    IBV_QP_MIN_RNR_TIMER) == 0);
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_RTS;
	attr.timeout = 14;
	attr.retry_cnt = 7;
	attr.rnr_retry = 7;
	attr.sq_psn = me->psn;
	attr.max_rd_atomic = 1;
	CHECK(ibv_modify_qp(qp, &attr,
			    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

static void fill(uint8_t *buf, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(i * 131 + seed);
}

int main(int argc, char **argv)
{
	CHECK(argc == 3 || argc == 4);
	const char *server_ip = argc == 4 ? argv[3] : NULL;
	int gid_index = atoi(argv[2]);
	struct ibv_context *ctx = open_device(argv[1]);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(pd && cq);
	uint8_t *buf = calloc(1, SIZE);
	int access = server_ip ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				      IBV_ACCESS_REMOTE_READ
			    : IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND;
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, SIZE, access);
	CHECK(buf && mr);
	struct ibv_qp_init_attr init = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	CHECK(qp);

	struct hello me = { .qpn = qp->qp_num, .psn = (uint32_t)(now() * 1000) & 0xffffff }, peer;
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, gid_index, &gid) == 0);
	memcpy(me.gid, gid.raw, 16);
	int fd = rendezvous(server_ip);
	send_all(fd, &me, sizeof me);
	recv_all(fd, &peer, sizeof peer);
	to_rts(qp, &me, &peer, gid_index);
	struct windows w;
	char step;

	if (!server_ip) {
		/* The server: the windows' owner. */
		struct ibv_mw *one = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
		struct ibv_mw *two = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
		CHECK(one && two);
		struct ibv_mw_bind bind = {
			.wr_id = 1,
			.send_flags = IBV_SEND_SIGNALED,
			.bind_info = { .mr = mr, .addr = (uintptr_t)buf, .length = MSG,
				       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE |
							  IBV_ACCESS_REMOTE_READ },
		};
		CHECK(ibv_bind_mw(qp, one, &bind) == 0);
		CHECK(expect(cq, 1, IBV_WC_SUCCESS).opcode == IBV_WC_BIND_MW);
		struct ibv_send_wr wr = { .wr_id = 2, .opcode = IBV_WR_BIND_MW,
					  .send_flags = IBV_SEND_SIGNALED }, *bad;
		wr.bind_mw.mw = two;
		wr.bind_mw.rkey = ibv_inc_rkey(two->rkey);
		wr.bind_mw.bind_info = bind.bind_info;
		wr.bind_mw.bind_info.addr = (uintptr_t)buf + MSG;
		wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
		CHECK(ibv_post_send(qp, &wr, &bad) == 0);
		CHECK(expect(cq, 2, IBV_WC_SUCCESS).opcode == IBV_WC_BIND_MW);
		struct ibv_sge rsge = { .addr = (uintptr_t)buf + 2 * MSG, .length = 64,
					.lkey = mr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 3, .sg_list = &rsge, .num_sge = 1 }, *rbad;
		CHECK(ibv_post_recv(qp, &rwr, &rbad) == 0);
		w.addr = (uintptr_t)buf;
		w.rkey1 = one->rkey;
		w.rkey2 = wr.bind_mw.rkey;
		send_all(fd, &w, sizeof w);
		/* The client wrote both windows: every byte is its pattern. */
		recv_all(fd, &step, 1);
		uint8_t want[MSG];
		fill(want, MSG, 7);
		CHECK(memcmp(buf, want, MSG) == 0);
		fill(want, MSG, 8);
		CHECK(memcmp(buf + MSG, want, MSG) == 0);
		struct ibv_wc wc = expect(cq, 3, IBV_WC_SUCCESS);
		CHECK(wc.opcode == IBV_WC_RECV && wc.byte_len == 16);
		/* rxe's provider copies the kernel's flags, where IB_WC_WITH_INVALIDATE is bit 2
		 * (IBV_WC_IP_CSUM_OK to user space); verbs.h's IBV_WC_WITH_INV is bit 3. */
		printf("wc_flags 0x%x\n", wc.wc_flags);
		CHECK((wc.wc_flags & (IBV_WC_WITH_INV | IBV_WC_IP_CSUM_OK)) &&
		      wc.invalidated_rkey == w.rkey2);
		send_all(fd, "i", 1);
		/* The client's WRITE through the invalidated window was refused. */
		recv_all(fd, &step, 1);
		CHECK(step == 'r');
		CHECK(ibv_dealloc_mw(one) == 0 && ibv_dealloc_mw(two) == 0);
		goto done;
	}

	/* The client: through the server's windows. */
	recv_all(fd, &w, sizeof w);
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = MSG, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 10, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE }, *bad;
	fill(buf, MSG, 7);
	wr.wr.rdma.remote_addr = w.addr;
	wr.wr.rdma.rkey = w.rkey1;
	CHECK(ibv_post_send(qp, &wr, &bad) == 0);
	expect(cq, 10, IBV_WC_SUCCESS);
	memset(buf, 0, MSG);
	wr.wr_id = 11;
	wr.opcode = IBV_WR_RDMA_READ;
	CHECK(ibv_post_send(qp, &wr, &bad) == 0);
	expect(cq, 11, IBV_WC_SUCCESS);
	uint8_t want[MSG];
	fill(want, MSG, 7);
	CHECK(memcmp(buf, want, MSG) == 0);
	fill(buf, MSG, 8);
	wr.wr_id = 12;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.wr.rdma.remote_addr = w.addr + MSG;
	wr.wr.rdma.rkey = w.rkey2;
	CHECK(ibv_post_send(qp, &wr, &bad) == 0);
	expect(cq, 12, IBV_WC_SUCCESS);
	send_all(fd, "w", 1);
	struct ibv_send_wr inv = { .wr_id = 13, .sg_list = &sge, .num_sge = 1,
				   .opcode = IBV_WR_SEND_WITH_INV, .invalidate_rkey = w.rkey2 };
	sge.length = 16;
	CHECK(ibv_post_send(qp, &inv, &bad) == 0);
	expect(cq, 13, IBV_WC_SUCCESS);
	recv_all(fd, &step, 1);
	wr.wr_id = 14;
	sge.length = 8;
	CHECK(ibv_post_send(qp, &wr, &bad) == 0);
	expect(cq, 14, IBV_WC_REM_ACCESS_ERR);
	send_all(fd, "r", 1);
done:
	/* Closed in order, so that a capture (ROCE_PCAP) is complete. */
	CHECK(ibv_destroy_qp(qp) == 0 && ibv_dereg_mr(mr) == 0 && ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0);
	printf("ok\n");
	return 0;
}
