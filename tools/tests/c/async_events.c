/* ibv_context.async_fd as rdma-core defines it: blocking until the caller makes it
 * O_NONBLOCK (then ibv_get_async_event fails with EAGAIN when no event waits), and
 * readable for poll(2) once an event waits. Each of two RC QPs is connected to a QP that
 * does not exist at PEER (an address that answers ARP but runs no RoCE), so its SEND is
 * never acknowledged, its retries run out and it goes to ERR with IBV_EVENT_QP_FATAL: the
 * first event is awaited with poll(2) on a non-blocking fd, the second with a blocking
 * ibv_get_async_event. A third such QP has four SENDs and a send CQ of one entry: the
 * failed SEND and the three flushed after it overflow that CQ, which raises
 * IBV_EVENT_CQ_ERR naming it (as rxe's rxe_cq_post), next to the QP's QP_FATAL. A second
 * context of the device hears none of these, then its own QP's QP_FATAL, which the first
 * does not hear.
 * Prints "ok" and exits 0 when every check holds; otherwise names the first that failed.
 * Usage: async_events DEVICE PEER_IPV4 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>
#include "common.h"

static char buf[4096];

/* An RC QP in RTS towards QP 0x123 at `peer`, with `sends` SENDs (wr_id 7, 8, ...)
 * posted that nobody will acknowledge (about 4 ms per try, one retry). NULL on failure. */
static struct ibv_qp *doomed_qp(struct ibv_pd *pd, struct ibv_cq *send_cq,
				struct ibv_cq *recv_cq, struct ibv_mr *mr, struct in_addr peer,
				int sends)
{
	struct ibv_qp_init_attr init = {
		.send_cq = send_cq, .recv_cq = recv_cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	if (!qp)
		return NULL;
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_INIT, .port_num = 1, .pkey_index = 0,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE,
	};
	if (ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					     IBV_QP_ACCESS_FLAGS))
		return NULL;
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_RTR;
	attr.path_mtu = IBV_MTU_1024;
	attr.dest_qp_num = 0x123;
	attr.rq_psn = 0;
	attr.max_dest_rd_atomic = 1;
	attr.min_rnr_timer = 12;
	attr.ah_attr.is_global = 1;
	attr.ah_attr.port_num = 1;
	attr.ah_attr.grh.sgid_index = 1;
	attr.ah_attr.grh.hop_limit = 64;
	/* ::ffff:a.b.c.d */
	attr.ah_attr.grh.dgid.raw[10] = 0xff;
	attr.ah_attr.grh.dgid.raw[11] = 0xff;
	memcpy(&attr.ah_attr.grh.dgid.raw[12], &peer, 4);
	if (ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return NULL;
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_RTS;
	attr.timeout = 10;
	attr.retry_cnt = 1;
	attr.rnr_retry = 1;
	attr.sq_psn = 0;
	attr.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					     IBV_QP_MAX_QP_RD_ATOMIC))
		return NULL;
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	for (int i = 0; i < sends; i++) {
		struct ibv_send_wr wr = { .wr_id = 7 + i, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
		struct ibv_send_wr *bad = NULL;
		if (ibv_post_send(qp, &wr, &bad))
			return NULL;
	}
	return qp;
}

int main(int argc, char **argv)
{
	struct in_addr peer;
	CHECK(argc == 3 && inet_pton(AF_INET, argv[2], &peer) == 1);
	/* A hang fails the run rather than the test's timeout. */
	alarm(30);
	struct ibv_context *ctx = open_device(argv[1]);
	struct ibv_context *other = open_device(argv[1]);

	int flags = fcntl(ctx->async_fd, F_GETFL);
	/* Blocking until the caller says otherwise, as rdma-core's. */
	CHECK(flags >= 0 && !(flags & O_NONBLOCK));
	CHECK(fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) == 0);
	struct ibv_async_event event;
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &event) == -1 && errno == EAGAIN);

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(cq);
	/* Still nothing, and nothing to read. */
	struct pollfd pfd = { .fd = ctx->async_fd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 0) == 0);
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &event) == -1 && errno == EAGAIN);

	struct ibv_qp *first = doomed_qp(pd, cq, cq, mr, peer, 1);
	CHECK(first);
	/* The event makes the fd readable (generous: the retries take about 10 ms). */
	CHECK(poll(&pfd, 1, 20000) == 1 && (pfd.revents & POLLIN));
	CHECK(ibv_get_async_event(ctx, &event) == 0);
	CHECK(event.event_type == IBV_EVENT_QP_FATAL && event.element.qp == first);
	ibv_ack_async_event(&event);
	/* Taken: the fd is quiet again and a non-blocking call says EAGAIN. */
	CHECK(poll(&pfd, 1, 0) == 0);
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &event) == -1 && errno == EAGAIN);
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(cq, 1, &wc) == 1 && wc.wr_id == 7 && wc.status == IBV_WC_RETRY_EXC_ERR);

	/* Blocking again: the call itself waits for the second QP's event. */
	CHECK(fcntl(ctx->async_fd, F_SETFL, flags) == 0);
	struct ibv_qp *second = doomed_qp(pd, cq, cq, mr, peer, 1);
	CHECK(second);
	CHECK(ibv_get_async_event(ctx, &event) == 0);
	CHECK(event.event_type == IBV_EVENT_QP_FATAL && event.element.qp == second);
	ibv_ack_async_event(&event);

	/* A CQ of one entry: ibv_create_cq may hold more (ours up to twice as many), so the
	 * third QP's four completions still overflow it. */
	struct ibv_cq *tiny = ibv_create_cq(ctx, 1, NULL, NULL, 0);
	CHECK(tiny && tiny->cqe >= 1 && tiny->cqe < 4);
	struct ibv_qp *third = doomed_qp(pd, tiny, cq, mr, peer, 4);
	CHECK(third);
	int cq_err = 0, qp_fatal = 0;
	/* Both events, in either order; nothing names another object. */
	for (int i = 0; i < 2; i++) {
		CHECK(ibv_get_async_event(ctx, &event) == 0);
		if (event.event_type == IBV_EVENT_CQ_ERR) {
			CHECK(event.element.cq == tiny);
			cq_err++;
		} else {
			CHECK(event.event_type == IBV_EVENT_QP_FATAL && event.element.qp == third);
			qp_fatal++;
		}
		ibv_ack_async_event(&event);
	}
	CHECK(cq_err == 1 && qp_fatal == 1);

	/* The other context: none of those events was of its objects. */
	int other_flags = fcntl(other->async_fd, F_GETFL);
	CHECK(other_flags >= 0 && fcntl(other->async_fd, F_SETFL, other_flags | O_NONBLOCK) == 0);
	errno = 0;
	CHECK(ibv_get_async_event(other, &event) == -1 && errno == EAGAIN);
	struct ibv_pd *other_pd = ibv_alloc_pd(other);
	CHECK(other_pd);
	struct ibv_mr *other_mr = ibv_reg_mr(other_pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_cq *other_cq = ibv_create_cq(other, 16, NULL, NULL, 0);
	CHECK(other_mr && other_cq);
	struct ibv_qp *fourth = doomed_qp(other_pd, other_cq, other_cq, other_mr, peer, 1);
	CHECK(fourth);
	CHECK(fcntl(other->async_fd, F_SETFL, other_flags) == 0);
	CHECK(ibv_get_async_event(other, &event) == 0);
	CHECK(event.event_type == IBV_EVENT_QP_FATAL && event.element.qp == fourth);
	ibv_ack_async_event(&event);
	/* ... and the first context keeps only its own. */
	CHECK(fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) == 0);
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &event) == -1 && errno == EAGAIN);
	struct ibv_qp_attr state;
	struct ibv_qp_init_attr init_attr;
	CHECK(ibv_query_qp(third, &state, IBV_QP_STATE, &init_attr) == 0 &&
	      state.qp_state == IBV_QPS_ERR);

	CHECK(ibv_destroy_qp(first) == 0 && ibv_destroy_qp(second) == 0);
	CHECK(ibv_destroy_qp(third) == 0 && ibv_destroy_cq(tiny) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	printf("ok\n");
	return 0;
}
