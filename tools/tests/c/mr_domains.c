/* Memory regions and domains as rdma-core defines them, between two QPs of one device:
 * ibv_rereg_mr (its errno table; new rights, PD and memory under the same keys, each seen by
 * the traffic that follows), on-demand paging (explicit over pages of which one is then
 * unmapped, implicit over the whole address space) and ibv_advise_mr, parent domains (their
 * allocators called for an extended CQ and its memory given back; QPs, regions and traffic
 * in them) and thread domains, fork (unneeded, and a child's copy-on-write does not take the
 * parent's writes). Prints "ok" and exits 0 when every check holds. Usage: mr_domains DEVICE */
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include "rc_pair.h"

enum { LEN = 4096 };

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *a, *b;
static uint8_t *src;
static struct ibv_mr *src_mr;

static void fill(uint8_t *buf, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(i * 131 + seed);
}

/* ibv_rereg_mr's return value and errno. */
static void rereg_answers(struct ibv_mr *mr, int flags, struct ibv_pd *new_pd, void *addr,
			  size_t length, int access, int ret, int err)
{
	errno = 0;
	int got = ibv_rereg_mr(mr, flags, new_pd, addr, length, access);
	if (got != ret || (ret && errno != err)) {
		fprintf(stderr, "FAILED: rereg flags %#x: %d errno %d, wanted %d errno %d\n", flags,
			got, errno, ret, err);
		exit(1);
	}
}

static void rereg_checks(void)
{
	uint8_t *dst = calloc(1, 2 * LEN);
	CHECK(dst);
	struct ibv_mr *mr = ibv_reg_mr(pd, dst, LEN, ALL_ACCESS);
	CHECK(mr);
	uint32_t lkey = mr->lkey, rkey = mr->rkey;
	/* What libibverbs refuses (the region stays valid), then what the device refuses. */
	rereg_answers(mr, 1 << 3, NULL, NULL, 0, 0, IBV_REREG_MR_ERR_INPUT, EINVAL);
	rereg_answers(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, LEN, 0,
		      IBV_REREG_MR_ERR_INPUT, EINVAL);
	rereg_answers(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, dst, 0, 0,
		      IBV_REREG_MR_ERR_INPUT, EINVAL);
	rereg_answers(mr, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, IBV_ACCESS_LOCAL_WRITE,
		      IBV_REREG_MR_ERR_INPUT, EINVAL);
	rereg_answers(mr, 0, NULL, NULL, 0, 0, IBV_REREG_MR_ERR_CMD, EINVAL);
	rereg_answers(mr, IBV_REREG_MR_CHANGE_PD, NULL, NULL, 0, 0, IBV_REREG_MR_ERR_CMD, EINVAL);
	rereg_answers(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_REMOTE_WRITE,
		      IBV_REREG_MR_ERR_CMD, EINVAL);
	rereg_answers(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, 1 << 15,
		      IBV_REREG_MR_ERR_CMD, EINVAL);
	fill(src, LEN, 1);
	CHECK(rdma_write(a, cq, src, src_mr->lkey, (uintptr_t)dst, rkey, LEN) == IBV_WC_SUCCESS);
	CHECK(memcmp(src, dst, LEN) == 0);

	/* Without remote write, the peer's WRITE is a remote access error. */
	rereg_answers(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE, 0, 0);
	CHECK(mr->lkey == lkey && mr->rkey == rkey);
	CHECK(rdma_write(a, cq, src, src_mr->lkey, (uintptr_t)dst, rkey, LEN) ==
	      IBV_WC_REM_ACCESS_ERR);
	rc_pair(a, b);
	rereg_answers(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, ALL_ACCESS, 0, 0);

	/* In another PD, a receive into it fails at b and a hears Remote Operational Error. */
	struct ibv_pd *other = ibv_alloc_pd(ctx);
	CHECK(other);
	rereg_answers(mr, IBV_REREG_MR_CHANGE_PD, other, NULL, 0, 0, 0, 0);
	CHECK(mr->pd == other && ibv_dealloc_pd(other) == EBUSY);
	struct ibv_sge rsge = { .addr = (uintptr_t)dst, .length = LEN, .lkey = lkey };
	struct ibv_recv_wr rwr = { .wr_id = 9, .sg_list = &rsge, .num_sge = 1 }, *rbad;
	CHECK(ibv_post_recv(b, &rwr, &rbad) == 0);
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = LEN, .lkey = src_mr->lkey };
	struct ibv_send_wr send = { .wr_id = 8, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND };
	struct ibv_send_wr *bad;
	CHECK(ibv_post_send(a, &send, &bad) == 0);
	int rem_op = 0, loc_prot = 0;
	for (int i = 0; i < 2; i++) {
		struct ibv_wc got = next_wc(cq);
		rem_op += got.wr_id == 8 && got.status == IBV_WC_REM_OP_ERR;
		loc_prot += got.wr_id == 9 && got.status == IBV_WC_LOC_PROT_ERR;
	}
	CHECK(rem_op == 1 && loc_prot == 1);
	rereg_answers(mr, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, 0, 0, 0);
	CHECK(ibv_dealloc_pd(other) == 0);
	/* Receives of a QP in ERR are flushed into the CQ; RESET forgets them, as mlx5 does. */
	rsge.lkey = src_mr->lkey;
	rsge.addr = (uintptr_t)src;
	CHECK(ibv_post_recv(a, &rwr, &rbad) == 0 && ibv_post_recv(a, &rwr, &rbad) == 0);
	double deadline = now() + 5;
	while (ibv_resize_cq(cq, 1) == 0 && now() < deadline)
		CHECK(ibv_resize_cq(cq, 64) == 0);
	CHECK(ibv_resize_cq(cq, 1) == EINVAL && ibv_resize_cq(cq, 64) == 0);
	rc_pair(a, b);
	struct ibv_wc none;
	CHECK(ibv_poll_cq(cq, 1, &none) == 0);

	/* Over other memory: the old range is gone, the new one is written, same keys. */
	uint8_t *moved = dst + LEN;
	rereg_answers(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, moved, 100, 0, 0, 0);
	CHECK(mr->addr == moved && mr->length == 100 && mr->rkey == rkey);
	CHECK(rdma_write(a, cq, src, src_mr->lkey, (uintptr_t)dst, rkey, 64) ==
	      IBV_WC_REM_ACCESS_ERR);
	rc_pair(a, b);
	fill(src, 100, 5);
	CHECK(rdma_write(a, cq, src, src_mr->lkey, (uintptr_t)moved, rkey, 100) ==
	      IBV_WC_SUCCESS);
	CHECK(memcmp(src, moved, 100) == 0);
	CHECK(rdma_write(a, cq, src, src_mr->lkey, (uintptr_t)moved, rkey, 101) ==
	      IBV_WC_REM_ACCESS_ERR);
	rc_pair(a, b);

	/* An imported region is not the importer's to change (IBV_MR_TYPE_IMPORTED_MR). */
	struct ibv_context *importer = ibv_import_device(dup(ctx->cmd_fd));
	CHECK(importer);
	struct ibv_pd *imported_pd = ibv_import_pd(importer, pd->handle);
	CHECK(imported_pd);
	struct ibv_mr *imported = ibv_import_mr(imported_pd, mr->handle);
	CHECK(imported && imported->rkey == rkey);
	rereg_answers(imported, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE,
		      IBV_REREG_MR_ERR_INPUT, EINVAL);
	ibv_unimport_mr(imported);
	ibv_unimport_pd(imported_pd);
	CHECK(ibv_close_device(importer) == 0);

	CHECK(ibv_dereg_mr(mr) == 0);
	free(dst);
}

static void odp_checks(void)
{
	long page = sysconf(_SC_PAGESIZE);
	uint8_t *pages = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(pages != MAP_FAILED);
	struct ibv_mr *odp = ibv_reg_mr(pd, pages, 2 * page, ALL_ACCESS | IBV_ACCESS_ON_DEMAND);
	CHECK(odp);
	struct ibv_sge sge = { .addr = (uintptr_t)pages, .length = 2 * page, .lkey = odp->lkey };
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH,
			    &sge, 1) == 0);
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 1) == 0);
	CHECK(ibv_advise_mr(pd, 7, 0, &sge, 1) == EOPNOTSUPP);
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 2, &sge, 1) == EINVAL);
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 0) == EINVAL);
	struct ibv_sge plain = { .addr = (uintptr_t)src, .length = 8, .lkey = src_mr->lkey };
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &plain, 1) == EINVAL);
	struct ibv_mr *read_only = ibv_reg_mr(pd, pages, page, IBV_ACCESS_ON_DEMAND);
	CHECK(read_only);
	struct ibv_sge ro = { .addr = (uintptr_t)pages, .length = 8, .lkey = read_only->lkey };
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, 0, &ro, 1) == EPERM);
	CHECK(ibv_dereg_mr(read_only) == 0);

	fill(src, 64, 9);
	CHECK(rdma_write(a, cq, src, src_mr->lkey, (uintptr_t)pages + page, odp->rkey, 64) ==
	      IBV_WC_SUCCESS);
	CHECK(memcmp(src, pages + page, 64) == 0);
	/* The second page goes: a WRITE there fails, the process lives on, a prefetch faults. */
	CHECK(munmap(pages + page, page) == 0);
	CHECK(rdma_write(a, cq, src, src_mr->lkey, (uintptr_t)pages + page, odp->rkey, 64) ==
	      IBV_WC_REM_ACCESS_ERR);
	rc_pair(a, b);
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 1) == EFAULT);
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, 0, &sge, 1) == 0);
	/* Mapped again later: the region reaches the new page with no re-registration. */
	CHECK(mmap(pages + page, page, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == pages + page);
	CHECK(rdma_write(a, cq, src, src_mr->lkey, (uintptr_t)pages + page, odp->rkey, 64) ==
	      IBV_WC_SUCCESS);
	CHECK(memcmp(src, pages + page, 64) == 0);
	/* A local gather from an ODP region too. */
	uint8_t *dst = calloc(1, LEN);
	struct ibv_mr *dst_mr = ibv_reg_mr(pd, dst, LEN, ALL_ACCESS);
	CHECK(dst && dst_mr);
	CHECK(rdma_write(a, cq, pages + page, odp->lkey, (uintptr_t)dst, dst_mr->rkey, 64) ==
	      IBV_WC_SUCCESS);
	CHECK(memcmp(src, dst, 64) == 0);
	CHECK(ibv_dereg_mr(odp) == 0);

	/* Implicit: the whole address space, each address as itself. */
	errno = 0;
	CHECK(!ibv_reg_mr(pd, NULL, SIZE_MAX, ALL_ACCESS) && errno);
	struct ibv_mr *implicit = ibv_reg_mr(pd, NULL, SIZE_MAX, ALL_ACCESS | IBV_ACCESS_ON_DEMAND);
	CHECK(implicit);
	uint8_t *anywhere = malloc(LEN);
	CHECK(anywhere);
	memset(anywhere, 0, LEN);
	fill(src, LEN, 11);
	CHECK(rdma_write(a, cq, src, src_mr->lkey, (uintptr_t)anywhere, implicit->rkey, LEN) ==
	      IBV_WC_SUCCESS);
	CHECK(memcmp(src, anywhere, LEN) == 0);
	CHECK(rdma_write(a, cq, anywhere, implicit->lkey, (uintptr_t)dst, dst_mr->rkey, 128) ==
	      IBV_WC_SUCCESS);
	CHECK(memcmp(src, dst, 128) == 0);
	struct ibv_sge any = { .addr = (uintptr_t)anywhere, .length = LEN, .lkey = implicit->lkey };
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH,
			    &any, 1) == 0);
	CHECK(ibv_dereg_mr(implicit) == 0 && ibv_dereg_mr(dst_mr) == 0);
	CHECK(munmap(pages, 2 * page) == 0);
	free(anywhere);
	free(dst);
}

/* A parent domain's allocator: counts, and serves from the heap or defers to the library. */
static int allocs, frees, defer, fail_next;
static struct { void *ptr; uint64_t type; } given[16];
static uint64_t last_type;
static size_t last_size, last_alignment;
static void *pd_context_seen;

static void *alloc_cb(struct ibv_pd *domain, void *pd_context, size_t size, size_t alignment,
		      uint64_t resource_type)
{
	(void)domain;
	allocs++;
	pd_context_seen = pd_context;
	last_type = resource_type;
	last_size = size;
	last_alignment = alignment;
	if (defer)
		return IBV_ALLOCATOR_USE_DEFAULT;
	if (fail_next) {
		fail_next = 0;
		return NULL;
	}
	void *memory = NULL;
	if (posix_memalign(&memory, alignment < sizeof(void *) ? sizeof(void *) : alignment, size))
		return NULL;
	CHECK(allocs <= 16);
	given[allocs - 1].ptr = memory;
	given[allocs - 1].type = resource_type;
	return memory;
}

static void free_cb(struct ibv_pd *domain, void *pd_context, void *ptr, uint64_t resource_type)
{
	(void)domain;
	(void)pd_context;
	int found = 0;
	for (int i = 0; i < allocs; i++)
		found |= given[i].ptr == ptr && given[i].type == resource_type;
	CHECK(found);
	frees++;
	free(ptr);
}

static void parent_domain_checks(void)
{
	struct ibv_parent_domain_init_attr attr = { .pd = NULL };
	errno = 0;
	CHECK(!ibv_alloc_parent_domain(ctx, &attr) && errno == EINVAL);
	attr.pd = pd;
	attr.comp_mask = 1 << 5;
	errno = 0;
	CHECK(!ibv_alloc_parent_domain(ctx, &attr) && errno == EINVAL);

	struct ibv_td_init_attr td_attr = { .comp_mask = 1 };
	errno = 0;
	CHECK(!ibv_alloc_td(ctx, &td_attr) && errno == EINVAL);
	td_attr.comp_mask = 0;
	struct ibv_td *td = ibv_alloc_td(ctx, &td_attr);
	CHECK(td && td->context == ctx);

	int marker;
	attr = (struct ibv_parent_domain_init_attr){
		.pd = pd,
		.td = td,
		.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
			     IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
		.alloc = alloc_cb,
		.free = free_cb,
		.pd_context = &marker,
	};
	struct ibv_pd *domain = ibv_alloc_parent_domain(ctx, &attr);
	CHECK(domain && domain->context == ctx);
	CHECK(ibv_dealloc_pd(pd) == EBUSY);
	CHECK(ibv_dealloc_td(td) == EBUSY);

	/* An extended CQ in it: its memory comes from the allocator, and goes back to it. */
	struct ibv_cq_init_attr_ex cq_attr = {
		.cqe = 32,
		.wc_flags = IBV_WC_STANDARD_FLAGS,
		.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD,
		.parent_domain = domain,
	};
	struct ibv_cq_ex *dcq = ibv_create_cq_ex(ctx, &cq_attr);
	CHECK(dcq);
	CHECK(allocs == 1 && pd_context_seen == &marker && last_size >= sizeof(struct ibv_cq_ex));
	CHECK(last_type >> 32 == 14 /* RDMA_DRIVER_RXE */ && last_alignment >= 8);
	CHECK(ibv_dealloc_pd(domain) == EBUSY);

	/* QPs, SRQs and regions in the parent domain belong to its PD: traffic flows. QPs and
	 * SRQs are placed by the allocator too; regions and QPs of the plain PD are not. */
	uint8_t *buf = calloc(1, LEN);
	CHECK(buf);
	struct ibv_mr *mr = ibv_reg_mr(domain, buf, LEN, ALL_ACCESS);
	CHECK(mr && mr->pd == domain && allocs == 1);
	struct ibv_qp *c = rc_qp(domain, ibv_cq_ex_to_cq(dcq), ibv_cq_ex_to_cq(dcq));
	CHECK(allocs == 2 && last_type == (14ull << 32 | 1) && last_size >= sizeof(struct ibv_qp_ex));
	struct ibv_qp *d = rc_qp(pd, ibv_cq_ex_to_cq(dcq), ibv_cq_ex_to_cq(dcq));
	CHECK(allocs == 2);
	struct ibv_srq_init_attr srq_attr = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(domain, &srq_attr);
	CHECK(srq && srq->pd == domain && allocs == 3 && last_type == (14ull << 32 | 4));
	CHECK(ibv_destroy_srq(srq) == 0 && frees == 1);
	rc_pair(c, d);
	fill(src, LEN, 21);
	CHECK(rdma_write(d, ibv_cq_ex_to_cq(dcq), src, src_mr->lkey, (uintptr_t)buf, mr->rkey,
			 LEN) == IBV_WC_SUCCESS);
	CHECK(memcmp(src, buf, LEN) == 0);
	CHECK(rdma_write(c, ibv_cq_ex_to_cq(dcq), buf, mr->lkey, (uintptr_t)src, src_mr->rkey,
			 LEN) == IBV_WC_SUCCESS);
	CHECK(ibv_destroy_qp(c) == 0 && frees == 2);
	CHECK(ibv_destroy_qp(d) == 0 && ibv_dereg_mr(mr) == 0 && frees == 2);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(dcq)) == 0);
	CHECK(frees == 3);

	/* An allocator deferring to the library; one that fails. */
	defer = 1;
	dcq = ibv_create_cq_ex(ctx, &cq_attr);
	CHECK(dcq && allocs == 4);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(dcq)) == 0 && frees == 3);
	defer = 0;
	fail_next = 1;
	errno = 0;
	CHECK(!ibv_create_cq_ex(ctx, &cq_attr) && errno == ENOMEM && allocs == 5 && frees == 3);
	CHECK(ibv_dealloc_pd(domain) == 0);
	CHECK(ibv_dealloc_td(td) == 0);

	/* Without allocators, and without a thread domain. */
	attr = (struct ibv_parent_domain_init_attr){ .pd = pd };
	domain = ibv_alloc_parent_domain(ctx, &attr);
	CHECK(domain);
	dcq = ibv_create_cq_ex(ctx, &(struct ibv_cq_init_attr_ex){
					    .cqe = 4,
					    .comp_mask = IBV_CQ_INIT_ATTR_MASK_PD,
					    .parent_domain = domain,
				    });
	CHECK(dcq && allocs == 5);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(dcq)) == 0 && ibv_dealloc_pd(domain) == 0);
	free(buf);
}

/* Fork needs nothing: after a fork, the parent's region still takes the writes (no page
 * the device holds went to the child). */
static void fork_checks(void)
{
	CHECK(ibv_fork_init() == 0);
	CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED);
	uint8_t *dst = calloc(1, LEN);
	struct ibv_mr *mr = ibv_reg_mr(pd, dst, LEN, ALL_ACCESS);
	CHECK(dst && mr);
	pid_t child = fork();
	CHECK(child >= 0);
	if (child == 0) {
		memset(dst, 0xEE, LEN);
		_exit(0);
	}
	int status;
	CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status));
	fill(src, LEN, 31);
	CHECK(rdma_write(a, cq, src, src_mr->lkey, (uintptr_t)dst, mr->rkey, LEN) ==
	      IBV_WC_SUCCESS);
	CHECK(memcmp(src, dst, LEN) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	free(dst);
}

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	ctx = open_device(argv[1]);
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(pd && cq);
	src = calloc(1, LEN);
	src_mr = ibv_reg_mr(pd, src, LEN, ALL_ACCESS);
	CHECK(src && src_mr);
	a = rc_qp(pd, cq, cq);
	b = rc_qp(pd, cq, cq);
	rc_pair(a, b);
	rereg_checks();
	odp_checks();
	parent_domain_checks();
	fork_checks();
	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);
	CHECK(ibv_dereg_mr(src_mr) == 0 && ibv_destroy_cq(cq) == 0 && ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	printf("ok\n");
	return 0;
}
