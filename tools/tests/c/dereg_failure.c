/* ibv_dereg_mr that fails keeps the region, as rdma-core's does (the kernel's answer comes
 * before anything is freed): the program may still read it, its PD stays busy, and asking
 * again gives the same answer. The failure is made by closing the sockets ibv_open_device
 * opened, so that the engine's next receive fails (run with ROCE_BACKEND=udp and
 * ROCE_PROGRESS=caller, so the program's own poll drives it). Prints "ok" and exits 0 when
 * every check holds. Usage: dereg_failure DEVICE */
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common.h"

#define MAX_FD 1024

/* Marks in `open_fds` every socket this process has open. */
static void sockets(char *open_fds)
{
	DIR *dir = opendir("/proc/self/fd");
	CHECK(dir);
	struct dirent *entry;
	while ((entry = readdir(dir))) {
		int fd = atoi(entry->d_name);
		struct stat st;
		if (fd > 2 && fd < MAX_FD && fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode))
			open_fds[fd] = 1;
	}
	closedir(dir);
}

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	static char before[MAX_FD], after[MAX_FD];
	sockets(before);
	struct ibv_context *ctx = open_device(argv[1]);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	static char buf[4096];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr);
	uint32_t lkey = mr->lkey;
	struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	CHECK(cq);

	/* Take the engine's sockets away: its next receive fails, and so does the device. */
	sockets(after);
	int closed = 0;
	for (int fd = 0; fd < MAX_FD; fd++)
		if (after[fd] && !before[fd])
			closed += close(fd) == 0;
	CHECK(closed > 0);
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(cq, 1, &wc) < 0);

	int failed = ibv_dereg_mr(mr);
	CHECK(failed != 0);
	/* Still ours: readable, still counted by its PD, and failing the same way again. */
	CHECK(mr->lkey == lkey && mr->addr == buf && mr->pd == pd);
	CHECK(ibv_dealloc_pd(pd) == EBUSY);
	CHECK(ibv_dereg_mr(mr) == failed);
	printf("ok\n");
	return 0;
}
