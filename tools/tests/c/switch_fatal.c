/* A process on a device whose switch dies: ./switch_fatal DEVICE. Creates a QP (which
 * attaches it to the device's switch) with a receive posted, says "ready", then waits for
 * the device's death: IBV_EVENT_DEVICE_FATAL, and the receive completed as flushed. Exits 0
 * when both came, 1 otherwise (the test bounds the wait). */
#include <unistd.h>

#include "common.h"

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	struct ibv_context *ctx = open_device(argv[1]);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_qp_init_attr init = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	CHECK(qp);
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE,
	};
	CHECK(ibv_modify_qp(qp, &attr,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
	static char buffer[64];
	struct ibv_mr *mr = ibv_reg_mr(pd, buffer, sizeof buffer, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr);
	struct ibv_sge sge = { .addr = (uintptr_t)buffer, .length = sizeof buffer, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(qp, &wr, &bad) == 0);
	printf("ready\n");
	fflush(stdout);

	struct ibv_async_event event;
	CHECK(ibv_get_async_event(ctx, &event) == 0);
	printf("event %s\n", ibv_event_type_str(event.event_type));
	fflush(stdout);
	CHECK(event.event_type == IBV_EVENT_DEVICE_FATAL);
	ibv_ack_async_event(&event);

	struct ibv_wc wc;
	int polled = 0;
	for (int i = 0; i < 2000 && polled == 0; i++) {
		polled = ibv_poll_cq(cq, 1, &wc);
		CHECK(polled >= 0);
		if (!polled)
			usleep(1000);
	}
	CHECK(polled == 1);
	printf("completion %llu %s\n", (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
	CHECK(wc.wr_id == 7 && wc.status == IBV_WC_WR_FLUSH_ERR);
	printf("ok\n");
	return 0;
}
