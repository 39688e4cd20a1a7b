/* Error paths of our libibverbs as rdma-core defines them, run on one device without
 * traffic. Prints "ok" and exits 0 when every check holds; otherwise names the first
 * that failed. Usage: error_paths DEVICE */
#include <fcntl.h>
#include "common.h"

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	struct ibv_context *ctx = open_device(argv[1]);

	struct ibv_port_attr port;
	CHECK(ibv_query_port(ctx, 1, &port) == 0 && port.link_layer == IBV_LINK_LAYER_ETHERNET);
	CHECK(ibv_query_port(ctx, 2, &port) != 0);

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	static char buf[8192];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr && mr->lkey && mr->addr == buf && mr->length == sizeof buf);
	/* Remote write without local write: EINVAL, as rdma-core. */
	errno = 0;
	CHECK(!ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_REMOTE_WRITE) && errno == EINVAL);
	/* A PD with a region cannot go. */
	CHECK(ibv_dealloc_pd(pd) == EBUSY);

	struct ibv_comp_channel *channel = ibv_create_comp_channel(ctx);
	CHECK(channel);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, channel, 0);
	CHECK(cq);
	/* Non-blocking channel, no event: EAGAIN. */
	CHECK(fcntl(channel->fd, F_SETFL, fcntl(channel->fd, F_GETFL) | O_NONBLOCK) == 0);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	errno = 0;
	CHECK(ibv_get_cq_event(channel, &ev_cq, &ev_ctx) == -1 && errno == EAGAIN);
	CHECK(ibv_destroy_comp_channel(channel) == EBUSY);

	struct ibv_qp_init_attr init = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	CHECK(qp && qp->state == IBV_QPS_RESET);
	/* A CQ used by a QP cannot go. */
	CHECK(ibv_destroy_cq(cq) == EBUSY);

	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	struct ibv_send_wr swr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND };
	struct ibv_send_wr *bad_send = NULL;
	/* Posting a send in RESET fails, naming the request. */
	CHECK(ibv_post_send(qp, &swr, &bad_send) != 0 && bad_send == &swr);

	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_RTR };
	/* RESET -> RTR does not exist. */
	CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE) == EINVAL);
	/* RESET -> INIT without its required attributes. */
	attr.qp_state = IBV_QPS_INIT;
	CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE) == EINVAL);
	attr.port_num = 1;
	attr.pkey_index = 0;
	attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					IBV_QP_ACCESS_FLAGS) == 0);
	CHECK(qp->state == IBV_QPS_INIT);
	struct ibv_qp_init_attr got_init;
	CHECK(ibv_query_qp(qp, &attr, IBV_QP_STATE | IBV_QP_CAP, &got_init) == 0);
	CHECK(attr.qp_state == IBV_QPS_INIT && got_init.cap.max_recv_wr >= 2);

	/* More scatter elements than max_recv_sge: EINVAL. */
	struct ibv_sge two[2] = { sge, sge };
	struct ibv_recv_wr wide = { .wr_id = 9, .sg_list = two, .num_sge = 2 };
	struct ibv_recv_wr *bad_recv = NULL;
	CHECK(ibv_post_recv(qp, &wide, &bad_recv) == EINVAL && bad_recv == &wide);

	/* Receives beyond max_recv_wr: ENOMEM, the first refused one named. */
	struct ibv_recv_wr rwr[3];
	for (int i = 0; i < 3; i++) {
		rwr[i] = (struct ibv_recv_wr){ .wr_id = i, .sg_list = &sge, .num_sge = 1,
					       .next = i < 2 ? &rwr[i + 1] : NULL };
	}
	bad_recv = NULL;
	CHECK(ibv_post_recv(qp, &rwr[0], &bad_recv) == ENOMEM && bad_recv == &rwr[2]);
	/* What this device does not do fails cleanly. */
	struct ibv_cq_init_attr_ex cq_ex = { .cqe = 4, .wc_flags = IBV_WC_EX_WITH_CVLAN };
	errno = 0;
	CHECK(!ibv_create_cq_ex(ctx, &cq_ex) && errno == EOPNOTSUPP);
	/* Windows are type 1 or 2 (tests/c/windows.c for the rest). */
	errno = 0;
	CHECK(!ibv_alloc_mw(pd, 3) && errno == EINVAL);
	CHECK(!ibv_qp_to_qp_ex(qp));

	/* Shared receive queues, refused as rxe refuses them. */
	struct ibv_srq_init_attr srq_init = { .attr = { .max_wr = 0, .max_sge = 1 } };
	errno = 0;
	CHECK(!ibv_create_srq(pd, &srq_init) && errno == EINVAL);
	srq_init.attr.max_wr = 2;
	struct ibv_srq *srq = ibv_create_srq(pd, &srq_init);
	CHECK(srq && srq->pd == pd && srq->context == ctx && srq_init.attr.max_wr == 2);
	bad_recv = NULL;
	CHECK(ibv_post_srq_recv(srq, &wide, &bad_recv) == EINVAL && bad_recv == &wide);
	bad_recv = NULL;
	CHECK(ibv_post_srq_recv(srq, &rwr[0], &bad_recv) == ENOMEM && bad_recv == &rwr[2]);
	struct ibv_srq_attr srq_attr = { .srq_limit = 3 };
	CHECK(ibv_modify_srq(srq, &srq_attr, IBV_SRQ_LIMIT) == EINVAL);
	srq_attr.srq_limit = 1;
	CHECK(ibv_modify_srq(srq, &srq_attr, IBV_SRQ_LIMIT) == 0);
	srq_attr.max_wr = 1;
	CHECK(ibv_modify_srq(srq, &srq_attr, IBV_SRQ_MAX_WR) == EINVAL);
	memset(&srq_attr, 0, sizeof srq_attr);
	CHECK(ibv_query_srq(srq, &srq_attr) == 0 && srq_attr.max_wr == 2 && srq_attr.srq_limit == 1);
	struct ibv_qp_init_attr on_srq = init;
	on_srq.srq = srq;
	struct ibv_qp *srq_qp = ibv_create_qp(pd, &on_srq);
	CHECK(srq_qp && srq_qp->srq == srq && on_srq.cap.max_recv_wr == 0);
	bad_recv = NULL;
	CHECK(ibv_post_recv(srq_qp, &rwr[2], &bad_recv) == EINVAL && bad_recv == &rwr[2]);
	/* An SRQ a QP uses cannot go. */
	CHECK(ibv_destroy_srq(srq) == EBUSY);
	CHECK(ibv_destroy_qp(srq_qp) == 0);
	/* An XRC SRQ needs its XRC domain (tests/c/xrc.c for the rest); every SRQ has a
	 * number. */
	struct ibv_srq_init_attr_ex xrc = {
		.attr = { .max_wr = 2, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ,
		.srq_type = IBV_SRQT_XRC, .pd = pd, .cq = cq,
	};
	errno = 0;
	CHECK(!ibv_create_srq_ex(ctx, &xrc) && errno == EINVAL);
	uint32_t srq_num = 0;
	CHECK(ibv_get_srq_num(srq, &srq_num) == 0 && srq_num != 0);
	CHECK(ibv_destroy_srq(srq) == 0);

	CHECK(ibv_destroy_qp(qp) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_destroy_comp_channel(channel) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	printf("ok\n");
	return 0;
}
