/* ibv_get_cq_event under signals, as rdma-core's read(2) of the channel's fd behaves: a
 * signal whose handler was installed without SA_RESTART ends the wait with -1 and EINTR
 * (qperf ends its timed tests so: an interval timer's SIGALRM gets it out of the wait), and
 * one installed with SA_RESTART does not end it: the wait goes on to the event. The event
 * is a SEND of an RC QP connected to itself through the device's GID 1, posted from another
 * thread after the signal. Prints "ok" and exits 0 when every check holds; otherwise names
 * the first that failed. Usage: cq_event_signals DEVICE */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include "common.h"

static volatile sig_atomic_t alarms;

static void on_alarm(int signo)
{
	(void)signo;
	alarms++;
}

/* SIGALRM in `ms` milliseconds, handled by on_alarm with `flags`. */
static void alarm_in(int ms, int flags)
{
	struct sigaction act = { .sa_handler = on_alarm, .sa_flags = flags };
	sigemptyset(&act.sa_mask);
	CHECK(sigaction(SIGALRM, &act, NULL) == 0);
	struct itimerval timer = { .it_value = { .tv_sec = 0, .tv_usec = ms * 1000 } };
	CHECK(setitimer(ITIMER_REAL, &timer, NULL) == 0);
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static struct ibv_qp *qp;
static struct ibv_mr *mr;
static char buf[64];

/* After 300 ms, one SEND from the QP to itself. */
static void *send_later(void *unused)
{
	(void)unused;
	usleep(300 * 1000);
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 16, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;
	CHECK(ibv_post_send(qp, &wr, &bad) == 0);
	return NULL;
}

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	struct ibv_context *ctx = open_device(argv[1]);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_comp_channel *channel = ibv_create_comp_channel(ctx);
	CHECK(pd && channel);
	struct ibv_cq *recv_cq = ibv_create_cq(ctx, 16, NULL, channel, 0);
	struct ibv_cq *send_cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(recv_cq && send_cq);
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr);
	struct ibv_qp_init_attr init = {
		.send_cq = send_cq,
		.recv_cq = recv_cq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	qp = ibv_create_qp(pd, &init);
	CHECK(qp);
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 1, &gid) == 0);
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					       IBV_QP_ACCESS_FLAGS) == 0);
	attr = (struct ibv_qp_attr){
		.qp_state = IBV_QPS_RTR,
		.path_mtu = IBV_MTU_1024,
		.dest_qp_num = qp->qp_num,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = gid, .sgid_index = 1, .hop_limit = 64 } },
	};
	CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					       IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0);
	attr = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
				     .rnr_retry = 7, .max_rd_atomic = 1 };
	CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					       IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					       IBV_QP_MAX_QP_RD_ATOMIC) == 0);
	struct ibv_sge sge = { .addr = (uintptr_t)buf + 32, .length = 32, .lkey = mr->lkey };
	struct ibv_recv_wr recv = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;
	CHECK(ibv_post_recv(qp, &recv, &bad) == 0);
	CHECK(ibv_req_notify_cq(recv_cq, 0) == 0);
	struct ibv_cq *ev_cq;
	void *ev_ctx;

	/* Without SA_RESTART: the signal ends the wait, as it ends rdma-core's read(2). */
	alarm_in(100, 0);
	errno = 0;
	CHECK(ibv_get_cq_event(channel, &ev_cq, &ev_ctx) == -1);
	CHECK(errno == EINTR);
	CHECK(alarms == 1);

	/* With SA_RESTART: the wait goes on past the signal, to the SEND 300 ms later. */
	pthread_t sender;
	CHECK(pthread_create(&sender, NULL, send_later, NULL) == 0);
	double start = now();
	alarm_in(100, SA_RESTART);
	CHECK(ibv_get_cq_event(channel, &ev_cq, &ev_ctx) == 0);
	CHECK(ev_cq == recv_cq);
	CHECK(alarms == 2);
	CHECK(now() - start > 0.25);
	ibv_ack_cq_events(recv_cq, 1);
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(recv_cq, 1, &wc) == 1);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 2 && wc.byte_len == 16);
	CHECK(pthread_join(sender, NULL) == 0);

	CHECK(ibv_destroy_qp(qp) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_destroy_cq(recv_cq) == 0 && ibv_destroy_cq(send_cq) == 0);
	CHECK(ibv_destroy_comp_channel(channel) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	printf("ok\n");
	return 0;
}
