/* Tag matching as rdma-core's verbs define it (and mlx5 gives it), between two RC QPs of one
 * device: tm_caps in ibv_query_device_ex; a tag-matching SRQ made with ibv_create_srq_ex
 * (and its refusals); ibv_post_srq_ops lists (ADD handles written back, TAG_DEL, TAG_SYNC,
 * bad_wr and errno of a refused one); an extended CQ reading IBV_WC_TM_* completions with
 * read_tm_info: eager messages matched into their tags, unexpected and untagged ones in
 * ordinary receives, a rendezvous read by the receiving QP (which posts no send of its own)
 * and the FIN it sends back; the CQ held while the SRQ lives. Prints "ok" and exits 0 when
 * every check holds.
 * Usage: tm DEVICE */
#include <endian.h>
#include <infiniband/tm_types.h>
#include "rc_pair.h"

#define SLOT 4096

static struct ibv_context *ctx;
static struct ibv_cq_ex *scq; /* the server's: its SRQ's and its QP's */
static struct ibv_cq *ccq;    /* the client's */
static struct ibv_srq *srq;
static struct ibv_qp *client, *server;
static char *tags, *recvs, *msgs, *fin;
static struct ibv_mr *tags_mr, *recvs_mr, *msgs_mr, *fin_mr;

/* What a server completion said. */
struct tm_wc {
	uint64_t wr_id;
	enum ibv_wc_status status;
	enum ibv_wc_opcode opcode;
	unsigned int flags;
	uint32_t byte_len;
	struct ibv_wc_tm_info info;
};

static struct tm_wc next_tm(void)
{
	struct ibv_poll_cq_attr attr = {};
	double deadline = now() + 5;
	int ret;
	while ((ret = ibv_start_poll(scq, &attr)) == ENOENT && now() < deadline)
		;
	CHECK(ret == 0);
	struct tm_wc wc = {
		.wr_id = scq->wr_id,
		.status = scq->status,
		.opcode = ibv_wc_read_opcode(scq),
		.flags = ibv_wc_read_wc_flags(scq),
		.byte_len = ibv_wc_read_byte_len(scq),
	};
	ibv_wc_read_tm_info(scq, &wc.info);
	ibv_end_poll(scq);
	return wc;
}

static void expect(struct tm_wc wc, uint64_t wr_id, enum ibv_wc_status status,
		   enum ibv_wc_opcode opcode, unsigned int flags, uint64_t tag, uint32_t priv)
{
	if (wc.wr_id != wr_id || wc.status != status || wc.opcode != opcode ||
	    (wc.flags & (IBV_WC_TM_SYNC_REQ | IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID)) != flags ||
	    wc.info.tag != tag || wc.info.priv != priv) {
		fprintf(stderr,
			"FAILED: got wr_id %lu status %d opcode %d flags %#x tag %#lx priv %#x, "
			"wanted %lu %d %d %#x %#lx %#x\n",
			(unsigned long)wc.wr_id, wc.status, wc.opcode, wc.flags,
			(unsigned long)wc.info.tag, wc.info.priv, (unsigned long)wr_id, status, opcode,
			flags, (unsigned long)tag, priv);
		exit(1);
	}
}

/* ibv_post_srq_ops of one operation; its errno. */
static int post_op(struct ibv_ops_wr *wr)
{
	struct ibv_ops_wr *bad = NULL;
	int ret = ibv_post_srq_ops(srq, wr, &bad);
	CHECK(ret == 0 ? bad == NULL : bad == wr);
	return ret;
}

/* ADDs `tag` (exact) with slot `slot` of `tags` as its buffer; its handle, after its
 * TM_ADD completion (wr_id 100 + recv_wr_id). */
static uint32_t add(uint64_t tag, uint64_t recv_wr_id, int slot, uint32_t len)
{
	struct ibv_sge sge = { (uintptr_t)(tags + slot * SLOT), len, tags_mr->lkey };
	struct ibv_ops_wr wr = {
		.wr_id = 100 + recv_wr_id,
		.opcode = IBV_WR_TAG_ADD,
		.flags = IBV_OPS_SIGNALED,
		.tm.add = { .recv_wr_id = recv_wr_id, .sg_list = &sge, .num_sge = 1, .tag = tag,
			    .mask = ~0ull },
		.tm.handle = 0xdead,
	};
	CHECK(post_op(&wr) == 0);
	expect(next_tm(), 100 + recv_wr_id, IBV_WC_SUCCESS, IBV_WC_TM_ADD, 0, 0, 0);
	return wr.tm.handle;
}

/* Posts ordinary receives wr_id `first`.. to the SRQ, slot by slot of `recvs`. */
static void post_receives(int first, int count)
{
	for (int i = first; i < first + count; i++) {
		struct ibv_sge sge = { (uintptr_t)(recvs + i * SLOT), SLOT, recvs_mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;
		CHECK(ibv_post_srq_recv(srq, &wr, &bad) == 0);
	}
}

/* The client sends `len` bytes at `msgs + offset`, whose first 16 are a TMH of `op`, `tag`
 * and `app_ctx`; waits for its completion. */
static void send_tagged(size_t offset, uint32_t len, uint8_t op, uint64_t tag, uint32_t app_ctx)
{
	struct ibv_tmh *tmh = (struct ibv_tmh *)(msgs + offset);
	tmh->opcode = op;
	tmh->app_ctx = htobe32(app_ctx);
	tmh->tag = htobe64(tag);
	struct ibv_sge sge = { (uintptr_t)(msgs + offset), len, msgs_mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 9, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND };
	CHECK(post_one(client, ccq, &wr) == IBV_WC_SUCCESS);
}

static void setup(void)
{
	struct ibv_device_attr_ex dev;
	CHECK(ibv_query_device_ex(ctx, NULL, &dev) == 0);
	CHECK(dev.tm_caps.flags & IBV_TM_CAP_RC);
	CHECK(dev.tm_caps.max_rndv_hdr_size == 64 && dev.tm_caps.max_sge == 1);
	CHECK(dev.tm_caps.max_num_tags >= 8 && dev.tm_caps.max_ops >= 16);

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	struct ibv_cq_init_attr_ex cq_attr = {
		.cqe = 64, .wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_TM_INFO,
	};
	scq = ibv_create_cq_ex(ctx, &cq_attr);
	CHECK(scq && scq->read_tm_info);
	ccq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(ccq);

	struct ibv_srq_init_attr_ex attr = {
		.attr = { .max_wr = 32, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
			     IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM,
		.srq_type = IBV_SRQT_TM,
		.pd = pd,
		.cq = ibv_cq_ex_to_cq(scq),
		.tm_cap = { .max_num_tags = dev.tm_caps.max_num_tags + 1, .max_ops = 10 },
	};
	errno = 0;
	CHECK(!ibv_create_srq_ex(ctx, &attr) && errno == EINVAL);
	attr.tm_cap.max_num_tags = 4;
	attr.comp_mask &= ~IBV_SRQ_INIT_ATTR_CQ;
	errno = 0;
	CHECK(!ibv_create_srq_ex(ctx, &attr) && errno == EINVAL);
	attr.comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
	srq = ibv_create_srq_ex(ctx, &attr);
	CHECK(srq);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(scq)) == EBUSY);

	/* The server's QP posts no sends: it reads rendezvous data and sends FINs anyway. */
	struct ibv_qp_init_attr init = {
		.send_cq = ibv_cq_ex_to_cq(scq),
		.recv_cq = ibv_cq_ex_to_cq(scq),
		.srq = srq,
		.qp_type = IBV_QPT_UD,
	};
	errno = 0;
	CHECK(!ibv_create_qp(pd, &init) && errno == EINVAL); /* RC only */
	init.qp_type = IBV_QPT_RC;
	server = ibv_create_qp(pd, &init);
	CHECK(server);
	client = rc_qp(pd, ccq, ccq);
	rc_pair(client, server);

	tags = calloc(16, SLOT);
	recvs = calloc(16, SLOT);
	msgs = calloc(16, SLOT);
	fin = calloc(4, 64);
	CHECK(tags && recvs && msgs && fin);
	tags_mr = ibv_reg_mr(pd, tags, 16 * SLOT, ALL_ACCESS);
	recvs_mr = ibv_reg_mr(pd, recvs, 16 * SLOT, ALL_ACCESS);
	msgs_mr = ibv_reg_mr(pd, msgs, 16 * SLOT, ALL_ACCESS);
	fin_mr = ibv_reg_mr(pd, fin, 4 * 64, ALL_ACCESS);
	CHECK(tags_mr && recvs_mr && msgs_mr && fin_mr);
	for (int i = 0; i < 16 * SLOT; i++)
		msgs[i] = (char)(i * 7 + 3);
}

/* Lists of operations: handles written back, a refused one named by bad_wr. */
static void list_operations(void)
{
	struct ibv_sge sge = { (uintptr_t)tags, 8, tags_mr->lkey };
	struct ibv_ops_wr second = {
		.wr_id = 2, .opcode = IBV_WR_TAG_ADD, .flags = IBV_OPS_SIGNALED,
		.tm.add = { .recv_wr_id = 2, .sg_list = &sge, .num_sge = 1, .tag = 2, .mask = ~0ull },
	};
	struct ibv_ops_wr first = second;
	first.wr_id = 1;
	first.tm.add.tag = 1;
	first.next = &second;
	struct ibv_ops_wr *bad = NULL;
	CHECK(ibv_post_srq_ops(srq, &first, &bad) == 0 && !bad);
	CHECK(first.tm.handle == 0 && second.tm.handle == 1);
	expect(next_tm(), 1, IBV_WC_SUCCESS, IBV_WC_TM_ADD, 0, 0, 0);
	expect(next_tm(), 2, IBV_WC_SUCCESS, IBV_WC_TM_ADD, 0, 0, 0);
	/* An unknown opcode stops the list there, after the DEL before it ran. */
	struct ibv_ops_wr junk = { .wr_id = 4, .opcode = 7 };
	struct ibv_ops_wr del = { .wr_id = 3, .opcode = IBV_WR_TAG_DEL, .flags = IBV_OPS_SIGNALED,
				  .next = &junk, .tm.handle = 0 };
	CHECK(ibv_post_srq_ops(srq, &del, &bad) == EINVAL && bad == &junk);
	expect(next_tm(), 3, IBV_WC_SUCCESS, IBV_WC_TM_DEL, 0, 0, 0);
	del.next = NULL;
	del.tm.handle = 1;
	CHECK(post_op(&del) == 0);
	expect(next_tm(), 3, IBV_WC_SUCCESS, IBV_WC_TM_DEL, 0, 0, 0);
	/* Deleting it again: the operation runs and fails in its completion, as mlx5's. */
	CHECK(post_op(&del) == 0);
	expect(next_tm(), 3, IBV_WC_TM_ERR, IBV_WC_TM_DEL, 0, 0, 0);
	/* A handle beyond the list, two scatter elements: EINVAL; a full list: ENOMEM. */
	del.tm.handle = 4;
	CHECK(post_op(&del) == EINVAL);
	struct ibv_sge two[2] = { sge, sge };
	second.next = NULL;
	second.tm.add.sg_list = two;
	second.tm.add.num_sge = 2;
	CHECK(post_op(&second) == EINVAL);
	second.tm.add.num_sge = 1;
	second.tm.add.sg_list = &sge;
	for (int i = 0; i < 4; i++) {
		CHECK(post_op(&second) == 0);
		expect(next_tm(), 2, IBV_WC_SUCCESS, IBV_WC_TM_ADD, 0, 0, 0);
	}
	CHECK(post_op(&second) == ENOMEM);
	for (uint32_t handle = 0; handle < 4; handle++) {
		struct ibv_ops_wr quiet = { .opcode = IBV_WR_TAG_DEL, .tm.handle = handle };
		CHECK(post_op(&quiet) == 0);
	}
}

/* Eager messages into their tags; an unexpected one and a NO_TAG one into ordinary
 * receives, whole; the sync the unexpected one needs. */
static void eager_and_unexpected(void)
{
	post_receives(0, 4);
	uint32_t h = add(0x51, 5, 1, SLOT);
	CHECK(h < 4);
	send_tagged(0, 1000, IBV_TMH_EAGER, 0x51, 0xabc);
	expect(next_tm(), 5, IBV_WC_SUCCESS, IBV_WC_TM_RECV,
	       IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID, 0x51, 0xabc);
	CHECK(memcmp(tags + SLOT, msgs + 16, 1000 - 16) == 0);

	send_tagged(SLOT, 300, IBV_TMH_EAGER, 0x99, 1);
	struct tm_wc wc = next_tm();
	expect(wc, 0, IBV_WC_SUCCESS, IBV_WC_TM_RECV, 0, 0, 0);
	CHECK(wc.byte_len == 300 && memcmp(recvs, msgs + SLOT, 300) == 0);
	send_tagged(2 * SLOT, 40, IBV_TMH_NO_TAG, 0x99, 2);
	wc = next_tm();
	expect(wc, 1, IBV_WC_SUCCESS, IBV_WC_TM_NO_TAG, 0, 0, 0);
	CHECK(wc.byte_len == 40 && memcmp(recvs + SLOT, msgs + 2 * SLOT, 40) == 0);

	/* One unexpected message not yet handled: a new tag asks for a sync and waits. */
	struct ibv_sge sge = { (uintptr_t)(tags + 2 * SLOT), SLOT, tags_mr->lkey };
	struct ibv_ops_wr stale = {
		.wr_id = 6, .opcode = IBV_WR_TAG_ADD, .flags = IBV_OPS_SIGNALED,
		.tm.add = { .recv_wr_id = 6, .sg_list = &sge, .num_sge = 1, .tag = 0x99,
			    .mask = ~0ull },
	};
	CHECK(post_op(&stale) == 0);
	expect(next_tm(), 6, IBV_WC_SUCCESS, IBV_WC_TM_ADD, IBV_WC_TM_SYNC_REQ, 0, 0);
	struct ibv_ops_wr sync = { .wr_id = 27, .opcode = IBV_WR_TAG_SYNC,
				   .flags = IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC,
				   .tm.unexpected_cnt = 1 };
	CHECK(post_op(&sync) == 0);
	expect(next_tm(), 27, IBV_WC_SUCCESS, IBV_WC_TM_SYNC, 0, 0, 0);
	send_tagged(SLOT, 300, IBV_TMH_EAGER, 0x99, 3);
	expect(next_tm(), 6, IBV_WC_SUCCESS, IBV_WC_TM_RECV,
	       IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID, 0x99, 3);
}

/* A rendezvous: the server reads the client's buffer into the tag (MATCH, then DATA_VALID)
 * and tells the client with a FIN into its next receive. */
static void rendezvous(void)
{
	struct ibv_sge fin_sge = { (uintptr_t)fin, 64, fin_mr->lkey };
	struct ibv_recv_wr recv = { .wr_id = 77, .sg_list = &fin_sge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(client, &recv, &bad) == 0);
	add(0x7700, 8, 3, 3 * SLOT);
	char *data = msgs + 4 * SLOT;
	struct ibv_rvh *rvh = (struct ibv_rvh *)(msgs + 3 * SLOT + 16);
	rvh->va = htobe64((uintptr_t)data);
	rvh->rkey = htobe32(msgs_mr->rkey);
	rvh->len = htobe32(3 * SLOT);
	send_tagged(3 * SLOT, 32, IBV_TMH_RNDV, 0x7700, 0x3141);
	expect(next_tm(), 8, IBV_WC_SUCCESS, IBV_WC_TM_RECV, IBV_WC_TM_MATCH, 0x7700, 0x3141);
	struct tm_wc wc = next_tm();
	expect(wc, 8, IBV_WC_SUCCESS, IBV_WC_TM_RECV, IBV_WC_TM_DATA_VALID, 0, 0);
	CHECK(wc.byte_len == 3 * SLOT && memcmp(tags + 3 * SLOT, data, 3 * SLOT) == 0);
	struct ibv_wc done = next_wc(ccq);
	CHECK(done.wr_id == 77 && done.status == IBV_WC_SUCCESS && done.opcode == IBV_WC_RECV &&
	      done.byte_len == sizeof(struct ibv_tmh));
	struct ibv_tmh *tmh = (struct ibv_tmh *)fin;
	CHECK(tmh->opcode == IBV_TMH_FIN && be32toh(tmh->app_ctx) == 0x3141 &&
	      be64toh(tmh->tag) == 0x7700);
}

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	ctx = open_device(argv[1]);
	setup();
	list_operations();
	eager_and_unexpected();
	rendezvous();

	/* A basic SRQ takes no list operations. */
	struct ibv_srq_init_attr basic_attr = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *basic = ibv_create_srq(server->pd, &basic_attr);
	CHECK(basic);
	struct ibv_ops_wr sync = { .opcode = IBV_WR_TAG_SYNC }, *bad;
	CHECK(ibv_post_srq_ops(basic, &sync, &bad) == EINVAL);
	CHECK(ibv_destroy_srq(basic) == 0);

	/* The CQ goes once the QP and the SRQ holding it are gone. */
	CHECK(ibv_destroy_qp(server) == 0 && ibv_destroy_qp(client) == 0);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(scq)) == EBUSY);
	CHECK(ibv_destroy_srq(srq) == 0);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(scq)) == 0);
	puts("ok");
	return 0;
}
