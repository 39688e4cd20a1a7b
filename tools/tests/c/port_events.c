/* The port follows its interface, as rxe's follows its netdev: with the device open,
 * `ip link set DEVICE down` raises IBV_EVENT_PORT_ERR (element.port_num 1) on async_fd and
 * ibv_query_port then says IBV_PORT_DOWN; `up` raises IBV_EVENT_PORT_ACTIVE and the port
 * is IBV_PORT_ACTIVE again. Prints "ok" and exits 0 when every check holds; otherwise
 * names the first that failed. Runs ip(8): only in a namespace of its own.
 * Usage: port_events DEVICE */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define CHECK(cond)                                                              \
	do {                                                                     \
		if (!(cond)) {                                                   \
			fprintf(stderr, "FAILED line %d: %s (errno %d)\n", __LINE__, \
				#cond, errno);                                   \
			return 1;                                                \
		}                                                                \
	} while (0)

/* The port's state as ibv_query_port reports it, or -1. */
static int port_state(struct ibv_context *ctx)
{
	struct ibv_port_attr attr;
	if (ibv_query_port(ctx, 1, &attr))
		return -1;
	return attr.state;
}

/* Sets the link up or down with ip(8); 0 on success. */
static int set_link(const char *device, const char *how)
{
	char command[128];
	snprintf(command, sizeof command, "ip link set dev %s %s", device, how);
	return system(command);
}

/* Waits (at most 10 s) for the next async event and returns its type and port, or -1. */
static int next_port_event(struct ibv_context *ctx, int *port)
{
	struct pollfd pfd = { .fd = ctx->async_fd, .events = POLLIN };
	if (poll(&pfd, 1, 10000) != 1)
		return -1;
	struct ibv_async_event event;
	if (ibv_get_async_event(ctx, &event))
		return -1;
	*port = event.element.port_num;
	ibv_ack_async_event(&event);
	return event.event_type;
}

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	/* A hang fails the run rather than the test's timeout. */
	alarm(40);
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_device *device = NULL;
	CHECK(list);
	for (int i = 0; list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
			device = list[i];
	CHECK(device);
	struct ibv_context *ctx = ibv_open_device(device);
	CHECK(ctx);
	ibv_free_device_list(list);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd);

	int flags = fcntl(ctx->async_fd, F_GETFL);
	CHECK(flags >= 0 && fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) == 0);
	struct ibv_async_event event;
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &event) == -1 && errno == EAGAIN);
	CHECK(port_state(ctx) == IBV_PORT_ACTIVE);

	int port = 0;
	CHECK(set_link(argv[1], "down") == 0);
	CHECK(next_port_event(ctx, &port) == IBV_EVENT_PORT_ERR && port == 1);
	CHECK(port_state(ctx) == IBV_PORT_DOWN);
	/* One event per change. */
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &event) == -1 && errno == EAGAIN);

	CHECK(set_link(argv[1], "up") == 0);
	port = 0;
	CHECK(next_port_event(ctx, &port) == IBV_EVENT_PORT_ACTIVE && port == 1);
	CHECK(port_state(ctx) == IBV_PORT_ACTIVE);

	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	printf("ok\n");
	return 0;
}
