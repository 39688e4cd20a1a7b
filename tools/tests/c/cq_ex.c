/* Extended CQs and the device's extended attributes, as rdma-core defines them:
 * ibv_create_cq_ex's refusals (EOPNOTSUPP, EINVAL), the readers a CQ gets for the wc_flags it
 * asked (NULL otherwise), start/next/end_poll over SEND_WITH_IMM, RDMA_WRITE_WITH_IMM and
 * READ between two QPs of one device (every field, and completion timestamps between clock
 * readings taken around them), ibv_poll_cq on an extended CQ, ibv_resize_cq (refused below
 * the completions waiting), create-CQ bad flows, ibv_query_device_ex, ibv_query_rt_values_ex
 * and the GID table's empty entries. Prints "ok" and exits 0 when every check holds.
 * Usage: cq_ex DEVICE */
#include <arpa/inet.h>
#include "rc_pair.h"

static struct ibv_context *ctx;

static uint64_t clock_ns(clockid_t clock)
{
	struct timespec t;
	clock_gettime(clock, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + t.tv_nsec;
}

static uint64_t device_clock(void)
{
	struct ibv_values_ex values = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	CHECK(ibv_query_rt_values_ex(ctx, &values) == 0);
	CHECK(values.raw_clock.tv_sec == 0);
	return values.raw_clock.tv_nsec;
}

/* ibv_create_cq_ex's answer for `attr`: NULL and `errno`, or a CQ (destroyed here). */
static void refused(struct ibv_cq_init_attr_ex attr, int expected)
{
	errno = 0;
	struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx, &attr);
	if (cq || errno != expected) {
		fprintf(stderr, "FAILED: cqe %u wc_flags %#lx mask %#x flags %#x: %s, errno %d\n",
			attr.cqe, (unsigned long)attr.wc_flags, attr.comp_mask, attr.flags,
			cq ? "created" : "refused", errno);
		exit(1);
	}
}

static void create_cq_ex_checks(struct ibv_device_attr_ex *dev)
{
	struct ibv_cq_init_attr_ex base = { .cqe = 16, .wc_flags = IBV_WC_STANDARD_FLAGS };
	struct ibv_cq_init_attr_ex attr = base;
	attr.wc_flags |= IBV_WC_EX_WITH_CVLAN;
	refused(attr, EOPNOTSUPP);
	attr = base;
	attr.wc_flags |= IBV_WC_EX_WITH_FLOW_TAG;
	refused(attr, EOPNOTSUPP);
	attr = base;
	attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
	attr.flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
	refused(attr, EOPNOTSUPP);
	attr = base;
	attr.comp_mask = 1 << 7;
	refused(attr, EOPNOTSUPP);
	attr = base;
	attr.cqe = dev->orig_attr.max_cqe + 1;
	refused(attr, EINVAL);
	attr = base;
	attr.cqe = 0;
	refused(attr, EINVAL);
	attr = base;
	attr.comp_vector = ctx->num_comp_vectors;
	refused(attr, EINVAL);
	/* One vector per possible CPU, as rxe: the last one is a CQ's to name. */
	CHECK(ctx->num_comp_vectors >= 1);
	attr.comp_vector = ctx->num_comp_vectors - 1;
	struct ibv_cq_ex *last = ibv_create_cq_ex(ctx, &attr);
	CHECK(last && ibv_destroy_cq(ibv_cq_ex_to_cq(last)) == 0);
	/* A plain PD is not a parent domain. */
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	attr = base;
	attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
	attr.parent_domain = pd;
	refused(attr, EINVAL);
	CHECK(ibv_dealloc_pd(pd) == 0);

	/* Single-threaded is accepted; readers exist exactly for the fields asked for. */
	attr = base;
	attr.wc_flags = IBV_WC_EX_WITH_BYTE_LEN;
	attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
	attr.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
	struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx, &attr);
	CHECK(cq);
	CHECK(cq->start_poll && cq->next_poll && cq->end_poll && cq->read_opcode &&
	      cq->read_vendor_err && cq->read_wc_flags && cq->read_byte_len);
	CHECK(!cq->read_imm_data && !cq->read_qp_num && !cq->read_src_qp && !cq->read_slid &&
	      !cq->read_sl && !cq->read_dlid_path_bits && !cq->read_completion_ts &&
	      !cq->read_completion_wallclock_ns && !cq->read_cvlan && !cq->read_flow_tag &&
	      !cq->read_tm_info);
	CHECK(cq->cqe >= 16);
	struct ibv_poll_cq_attr poll_attr = {};
	CHECK(ibv_start_poll(cq, &poll_attr) == ENOENT);
	poll_attr.comp_mask = 1;
	CHECK(ibv_start_poll(cq, &poll_attr) == EINVAL);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);

	/* Legacy ibv_create_cq: a negative size or a vector the context lacks. */
	errno = 0;
	CHECK(!ibv_create_cq(ctx, dev->orig_attr.max_cqe + 1, NULL, NULL, 0) && errno == EINVAL);
	errno = 0;
	CHECK(!ibv_create_cq(ctx, 16, NULL, NULL, ctx->num_comp_vectors + 1) && errno == EINVAL);
	errno = 0;
	CHECK(!ibv_create_cq(ctx, 16, NULL, NULL, -1) && errno == EINVAL);
	errno = 0;
	CHECK(!ibv_create_cq(ctx, -1, NULL, NULL, 0) && errno == EINVAL);
}

static void device_checks(struct ibv_device_attr_ex *dev)
{
	CHECK(ibv_query_device_ex(ctx, NULL, dev) == 0);
	struct ibv_device_attr plain;
	CHECK(ibv_query_device(ctx, &plain) == 0);
	CHECK(plain.node_guid == dev->orig_attr.node_guid && plain.max_cqe == dev->orig_attr.max_cqe &&
	      plain.max_qp_wr == dev->orig_attr.max_qp_wr &&
	      plain.device_cap_flags == dev->orig_attr.device_cap_flags &&
	      plain.vendor_id == dev->orig_attr.vendor_id);
	CHECK(dev->phys_port_cnt_ex == 1 && dev->orig_attr.phys_port_cnt == 1);
	CHECK(dev->odp_caps.general_caps & IBV_ODP_SUPPORT);
	CHECK(dev->odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT);
	uint32_t rc = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
		      IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
	CHECK((dev->odp_caps.per_transport_caps.rc_odp_caps & rc) == rc);
	CHECK(dev->odp_caps.per_transport_caps.ud_odp_caps & IBV_ODP_SUPPORT_SEND);
	CHECK(dev->hca_core_clock == 1000000 && dev->completion_timestamp_mask != 0);
	CHECK(dev->device_cap_flags_ex == dev->orig_attr.device_cap_flags);
	CHECK(dev->max_dm_size == 0);
	struct ibv_query_device_ex_input input = { .comp_mask = 1 };
	CHECK(ibv_query_device_ex(ctx, &input, dev) == EINVAL);
	struct ibv_values_ex values = { .comp_mask = 2 };
	CHECK(ibv_query_rt_values_ex(ctx, &values) == EINVAL);
	uint64_t before = device_clock(), after = device_clock();
	CHECK(before <= after);

	/* rxe's GID table: 1024 entries, those past the interface's addresses empty. */
	struct ibv_port_attr port;
	CHECK(ibv_query_port(ctx, 1, &port) == 0);
	CHECK(port.gid_tbl_len == 1024 && port.port_cap_flags & IBV_PORT_CM_SUP);
	struct ibv_gid_entry entry;
	CHECK(ibv_query_gid_ex(ctx, 1, 1, &entry, 0) == 0 && entry.gid_type == IBV_GID_TYPE_ROCE_V2);
	CHECK(ibv_query_gid_ex(ctx, 1, 1000, &entry, 0) == ENODATA);
	CHECK(ibv_query_gid_ex(ctx, 1, 1024, &entry, 0) == EINVAL);
	union ibv_gid gid = { .raw = { 1 } }, zero = {};
	CHECK(ibv_query_gid(ctx, 1, 1000, &gid) == 0 && memcmp(&gid, &zero, sizeof gid) == 0);
	CHECK(ibv_query_gid(ctx, 1, 1024, &gid) == -1);
}

enum { MSG = 3000 };

/* Polls `n` completions of `cq` with start/next/end_poll into `wr_ids`, `opcodes`, ... */
struct polled {
	uint64_t wr_id, ts, wallclock;
	enum ibv_wc_status status;
	enum ibv_wc_opcode opcode;
	uint32_t byte_len, imm, qp_num, src_qp, slid;
	unsigned int flags;
	uint8_t sl, dlid_path_bits;
};

static void poll_ex(struct ibv_cq_ex *cq, struct polled *out, int n)
{
	struct ibv_poll_cq_attr attr = {};
	double deadline = now() + 5;
	int ret;
	while ((ret = ibv_start_poll(cq, &attr)) == ENOENT && now() < deadline)
		;
	CHECK(ret == 0);
	for (int i = 0; i < n; i++) {
		if (i > 0) {
			while ((ret = ibv_next_poll(cq)) == ENOENT && now() < deadline)
				;
			CHECK(ret == 0);
		}
		struct polled *p = &out[i];
		p->wr_id = cq->wr_id;
		p->status = cq->status;
		p->opcode = ibv_wc_read_opcode(cq);
		p->byte_len = ibv_wc_read_byte_len(cq);
		p->imm = ibv_wc_read_imm_data(cq);
		p->qp_num = ibv_wc_read_qp_num(cq);
		p->src_qp = ibv_wc_read_src_qp(cq);
		p->flags = ibv_wc_read_wc_flags(cq);
		p->slid = ibv_wc_read_slid(cq);
		p->sl = ibv_wc_read_sl(cq);
		p->dlid_path_bits = ibv_wc_read_dlid_path_bits(cq);
		p->ts = ibv_wc_read_completion_ts(cq);
		p->wallclock = ibv_wc_read_completion_wallclock_ns(cq);
		CHECK(ibv_wc_read_vendor_err(cq) == 0);
	}
	CHECK(ibv_next_poll(cq) == ENOENT);
	ibv_end_poll(cq);
}

static void traffic_checks(void)
{
	uint64_t flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
			 IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
	struct ibv_cq_init_attr_ex attr = { .cqe = 64, .wc_flags = flags };
	struct ibv_cq_ex *send_cq = ibv_create_cq_ex(ctx, &attr);
	struct ibv_cq_ex *recv_cq = ibv_create_cq_ex(ctx, &attr);
	CHECK(send_cq && recv_cq);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	uint8_t *a_buf = calloc(1, 2 * MSG), *b_buf = calloc(1, 2 * MSG);
	CHECK(a_buf && b_buf);
	struct ibv_mr *a_mr = ibv_reg_mr(pd, a_buf, 2 * MSG, ALL_ACCESS);
	struct ibv_mr *b_mr = ibv_reg_mr(pd, b_buf, 2 * MSG, ALL_ACCESS);
	CHECK(a_mr && b_mr);
	struct ibv_qp *a = rc_qp(pd, ibv_cq_ex_to_cq(send_cq), ibv_cq_ex_to_cq(recv_cq));
	struct ibv_qp *b = rc_qp(pd, ibv_cq_ex_to_cq(send_cq), ibv_cq_ex_to_cq(recv_cq));
	rc_pair(a, b);

	struct ibv_sge rsge = { .addr = (uintptr_t)b_buf, .length = 2 * MSG, .lkey = b_mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 500, .sg_list = &rsge, .num_sge = 1 }, *rbad;
	CHECK(ibv_post_recv(b, &rwr, &rbad) == 0);
	rwr.wr_id = 501;
	CHECK(ibv_post_recv(b, &rwr, &rbad) == 0);
	for (int i = 0; i < MSG; i++)
		a_buf[i] = (uint8_t)(i * 7 + 1);

	uint64_t ts_before = device_clock(), wall_before = clock_ns(CLOCK_REALTIME);
	struct ibv_sge sge = { .addr = (uintptr_t)a_buf, .length = MSG, .lkey = a_mr->lkey };
	struct ibv_send_wr wr[3] = {
		{ .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_IMM,
		  .imm_data = htonl(0x12345678) },
		{ .wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
		  .imm_data = htonl(0xCAFE), .wr.rdma = { (uintptr_t)b_buf + MSG, b_mr->rkey } },
		{ .wr_id = 3, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
		  .wr.rdma = { (uintptr_t)b_buf + MSG, b_mr->rkey } },
	};
	wr[0].next = &wr[1];
	wr[1].next = &wr[2];
	struct ibv_send_wr *bad;
	CHECK(ibv_post_send(a, wr, &bad) == 0);
	struct polled sends[3], recvs[2];
	poll_ex(send_cq, sends, 3);
	poll_ex(recv_cq, recvs, 2);
	uint64_t ts_after = device_clock(), wall_after = clock_ns(CLOCK_REALTIME);

	enum ibv_wc_opcode send_ops[3] = { IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ };
	for (int i = 0; i < 3; i++) {
		struct polled *p = &sends[i];
		CHECK(p->wr_id == (uint64_t)i + 1 && p->status == IBV_WC_SUCCESS);
		CHECK(p->opcode == send_ops[i] && p->qp_num == a->qp_num);
		CHECK(p->ts >= ts_before && p->ts <= ts_after);
		CHECK(p->wallclock >= wall_before && p->wallclock <= wall_after);
		CHECK(i == 0 || p->ts >= sends[i - 1].ts);
		CHECK(p->slid == 0 && p->sl == 0 && p->dlid_path_bits == 0);
	}
	CHECK(sends[2].byte_len == MSG);
	CHECK(recvs[0].wr_id == 500 && recvs[0].status == IBV_WC_SUCCESS);
	CHECK(recvs[0].opcode == IBV_WC_RECV && recvs[0].byte_len == MSG);
	CHECK(recvs[0].flags == IBV_WC_WITH_IMM && ntohl(recvs[0].imm) == 0x12345678);
	CHECK(recvs[0].qp_num == b->qp_num);
	CHECK(recvs[1].wr_id == 501 && recvs[1].opcode == IBV_WC_RECV_RDMA_WITH_IMM);
	CHECK(recvs[1].byte_len == MSG && ntohl(recvs[1].imm) == 0xCAFE);
	CHECK(recvs[0].ts >= ts_before && recvs[1].ts <= ts_after);
	CHECK(memcmp(a_buf, b_buf, MSG) == 0 && memcmp(a_buf, b_buf + MSG, MSG) == 0);

	/* ibv_poll_cq polls an extended CQ too. */
	wr[0].next = NULL;
	wr[0].opcode = IBV_WR_SEND;
	CHECK(ibv_post_recv(b, &rwr, &rbad) == 0);
	CHECK(ibv_post_send(a, wr, &bad) == 0);
	struct ibv_wc wc = next_wc(ibv_cq_ex_to_cq(send_cq));
	CHECK(wc.wr_id == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND);
	wc = next_wc(ibv_cq_ex_to_cq(recv_cq));
	CHECK(wc.wr_id == 501 && wc.byte_len == MSG && wc.wc_flags == 0);

	/* Resize: refused below the completions waiting, granted otherwise, keeping them. */
	struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_qp *c = rc_qp(pd, cq, ibv_cq_ex_to_cq(recv_cq));
	struct ibv_qp *d = rc_qp(pd, cq, ibv_cq_ex_to_cq(recv_cq));
	rc_pair(c, d);
	struct ibv_send_wr write = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				     .wr.rdma = { (uintptr_t)b_buf, b_mr->rkey } };
	for (uint64_t i = 0; i < 3; i++) {
		write.wr_id = 10 + i;
		CHECK(ibv_post_send(c, &write, &bad) == 0);
	}
	/* Wait until all three completed, without taking them. */
	double deadline = now() + 5;
	while (ibv_resize_cq(cq, 2) == 0 && now() < deadline)
		CHECK(ibv_resize_cq(cq, 8) == 0);
	CHECK(ibv_resize_cq(cq, 2) == EINVAL);
	CHECK(ibv_resize_cq(cq, 3) == 0 && cq->cqe >= 3);
	CHECK(ibv_resize_cq(cq, 0) == EINVAL);
	struct ibv_device_attr dev;
	CHECK(ibv_query_device(ctx, &dev) == 0);
	CHECK(ibv_resize_cq(cq, dev.max_cqe + 1) == EINVAL);
	CHECK(ibv_resize_cq(cq, 100) == 0 && cq->cqe >= 100);
	for (uint64_t i = 0; i < 3; i++) {
		wc = next_wc(cq);
		CHECK(wc.wr_id == 10 + i && wc.status == IBV_WC_SUCCESS);
	}
	/* The resized CQ takes as many completions as it now holds. */
	for (uint64_t i = 0; i < 20; i++) {
		write.wr_id = 20 + i;
		CHECK(ibv_post_send(c, &write, &bad) == 0);
	}
	for (uint64_t i = 0; i < 20; i++) {
		wc = next_wc(cq);
		CHECK(wc.wr_id == 20 + i && wc.status == IBV_WC_SUCCESS);
	}

	CHECK(ibv_destroy_qp(c) == 0 && ibv_destroy_qp(d) == 0 && ibv_destroy_cq(cq) == 0);
	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(send_cq)) == 0);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(recv_cq)) == 0);
	CHECK(ibv_dereg_mr(a_mr) == 0 && ibv_dereg_mr(b_mr) == 0 && ibv_dealloc_pd(pd) == 0);
}

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	ctx = open_device(argv[1]);
	struct ibv_device_attr_ex dev;
	device_checks(&dev);
	create_cq_ex_checks(&dev);
	traffic_checks();
	CHECK(ibv_close_device(ctx) == 0);
	printf("ok\n");
	return 0;
}
