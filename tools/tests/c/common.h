/* What the libibverbs test programs share: CHECK, which names the first check that failed
 * and exits 1, and opening a device by name. */
#ifndef ROCE_TEST_COMMON_H
#define ROCE_TEST_COMMON_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#define CHECK(cond)                                                              \
	do {                                                                     \
		if (!(cond)) {                                                   \
			fprintf(stderr, "FAILED line %d: %s (errno %d)\n", __LINE__, \
				#cond, errno);                                   \
			exit(1);                                                 \
		}                                                                \
	} while (0)

/* The device called `name`, opened (the run fails when there is none). */
static struct ibv_context *open_device(const char *name)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_device *device = NULL;
	CHECK(list);
	for (int i = 0; list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			device = list[i];
	CHECK(device);
	struct ibv_context *ctx = ibv_open_device(device);
	CHECK(ctx);
	ibv_free_device_list(list);
	return ctx;
}

#endif
