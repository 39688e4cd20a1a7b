/* librdmacm's event channel and the calls our librdmacm.so.1 does not offer, answered as
 * rdma-core defines them. rdma_cma.h's declarations are spelled out here (librdmacm-dev is
 * not needed); the layouts are rdma-core 44's. Usage: rdmacm_paths PEER_IPV4.
 * Prints "ok" last when every check passed. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct rdma_event_channel { int fd; };
struct rdma_cm_id;
struct rdma_cm_event {
	struct rdma_cm_id *id;
	struct rdma_cm_id *listen_id;
	int event;
	int status;
	uint64_t param[7];
};
struct rdma_addrinfo {
	int ai_flags, ai_family, ai_qp_type, ai_port_space;
	socklen_t ai_src_len, ai_dst_len;
	struct sockaddr *ai_src_addr, *ai_dst_addr;
	char *ai_src_canonname, *ai_dst_canonname;
	size_t ai_route_len;
	void *ai_route;
	size_t ai_connect_len;
	void *ai_connect;
	struct rdma_addrinfo *ai_next;
};

enum { RDMA_PS_TCP = 0x0106, RDMA_PS_IB = 0x013F };
enum { ADDR_RESOLVED = 0, ROUTE_RESOLVED = 2, ESTABLISHED = 9 };

struct rdma_event_channel *rdma_create_event_channel(void);
void rdma_destroy_event_channel(struct rdma_event_channel *);
int rdma_create_id(struct rdma_event_channel *, struct rdma_cm_id **, void *, int);
int rdma_destroy_id(struct rdma_cm_id *);
int rdma_resolve_addr(struct rdma_cm_id *, struct sockaddr *, struct sockaddr *, int);
int rdma_resolve_route(struct rdma_cm_id *, int);
int rdma_get_cm_event(struct rdma_event_channel *, struct rdma_cm_event **);
int rdma_ack_cm_event(struct rdma_cm_event *);
const char *rdma_event_str(int);
int rdma_join_multicast(struct rdma_cm_id *, struct sockaddr *, void *);
int rsocket(int, int, int);
int rpoll(struct pollfd *, nfds_t, int);
int rdma_set_option(struct rdma_cm_id *, int, int, void *, size_t);
int rdma_getaddrinfo(const char *, const char *, const struct rdma_addrinfo *,
		     struct rdma_addrinfo **);
void rdma_freeaddrinfo(struct rdma_addrinfo *);
void **rdma_get_devices(int *);
void rdma_free_devices(void **);

static int failures;

#define CHECK(cond)                                                              \
	do {                                                                     \
		if (!(cond)) {                                                   \
			printf("FAILED line %d: %s (errno %d)\n", __LINE__, #cond, \
			       errno);                                           \
			failures++;                                              \
		}                                                                \
	} while (0)

/* The next event, waited for with rpoll on the channel's fd (at most 5 s). */
static struct rdma_cm_event *next_event(struct rdma_event_channel *channel)
{
	struct pollfd fd = { .fd = channel->fd, .events = POLLIN };
	struct rdma_cm_event *event = NULL;

	if (rpoll(&fd, 1, 5000) != 1 || !(fd.revents & POLLIN))
		return NULL;
	if (rdma_get_cm_event(channel, &event))
		return NULL;
	printf("event %s status %d\n", rdma_event_str(event->event), event->status);
	return event;
}

static volatile int waiter_returned;

static void *wait_on(void *channel)
{
	struct rdma_cm_event *event;

	rdma_get_cm_event(channel, &event);
	waiter_returned = 1;
	return NULL;
}

/* A channel destroyed while another thread waits on it, as rping's main does at exit while
 * its CM thread waits: the waiter stays blocked, as in rdma-core's read(2), and touches
 * nothing freed (it wakes every 100 ms; a freed channel made it crash). */
static void destroy_while_waited_on(void)
{
	struct rdma_event_channel *waiting = rdma_create_event_channel();
	pthread_t waiter;

	CHECK(waiting);
	if (!waiting || pthread_create(&waiter, NULL, wait_on, waiting))
		return;
	usleep(100000);
	rdma_destroy_event_channel(waiting);
	usleep(500000);
	CHECK(!waiter_returned);
}

static volatile int id_destroyed;

static void *destroy(void *id)
{
	CHECK(rdma_destroy_id(id) == 0);
	id_destroyed = 1;
	return NULL;
}

/* rdma_destroy_id waits until every event of the id that the program took is acked, as
 * rdma-core's does: an event (and a conversion under way in another thread) points into
 * the id. */
static void destroy_waits_for_acks(struct rdma_event_channel *channel, struct sockaddr *peer)
{
	struct rdma_cm_id *id;
	struct rdma_cm_event *event;
	pthread_t destroyer;

	CHECK(rdma_create_id(channel, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, peer, 2000) == 0);
	event = next_event(channel);
	CHECK(event && event->id == id && event->event == ADDR_RESOLVED);
	if (!event || pthread_create(&destroyer, NULL, destroy, id))
		return;
	usleep(300000);
	CHECK(!id_destroyed);
	CHECK(event->id == id);
	CHECK(rdma_ack_cm_event(event) == 0);
	pthread_join(destroyer, NULL);
	CHECK(id_destroyed);
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *channel;
	struct rdma_cm_id *id, *other;
	struct rdma_cm_event *event;
	struct sockaddr_in peer = { .sin_family = AF_INET, .sin_port = htons(7174) };
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *info;
	int tos = 0, count = 0;
	void **devices;

	if (argc != 2 || inet_pton(AF_INET, argv[1], &peer.sin_addr) != 1) {
		fprintf(stderr, "usage: %s PEER_IPV4\n", argv[0]);
		return 2;
	}

	channel = rdma_create_event_channel();
	CHECK(channel && channel->fd >= 0);
	if (!channel)
		return 1;

	/* Nothing waits: a non-blocking channel says EAGAIN. */
	CHECK(fcntl(channel->fd, F_SETFL, fcntl(channel->fd, F_GETFL) | O_NONBLOCK) == 0);
	errno = 0;
	CHECK(rdma_get_cm_event(channel, &event) == -1 && errno == EAGAIN);

	/* An id resolves its address and route; each event wakes the fd. */
	CHECK(rdma_create_id(channel, &id, &tos, RDMA_PS_TCP) == 0);
	/* RDMA_OPTION_ID_TOS takes one byte, as the kernel's ucma_set_option_id. */
	errno = 0;
	CHECK(rdma_set_option(id, 0, 0, &tos, sizeof(tos)) == -1 && errno == EINVAL);
	uint8_t tos_byte = 0x68;
	CHECK(rdma_set_option(id, 0, 0, &tos_byte, sizeof(tos_byte)) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&peer, 2000) == 0);
	event = next_event(channel);
	CHECK(event && event->id == id && event->event == ADDR_RESOLVED && event->status == 0);
	CHECK(*(void **)id != NULL); /* id->verbs: the device the address resolved to */
	if (event)
		CHECK(rdma_ack_cm_event(event) == 0);
	CHECK(rdma_resolve_route(id, 2000) == 0);
	event = next_event(channel);
	CHECK(event && event->id == id && event->event == ROUTE_RESOLVED);
	if (event)
		CHECK(rdma_ack_cm_event(event) == 0);
	errno = 0;
	CHECK(rdma_get_cm_event(channel, &event) == -1 && errno == EAGAIN);

	CHECK(strcmp(rdma_event_str(ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED") == 0);

	/* A TCP id joins no multicast group (the kernel's EINVAL). */
	errno = 0;
	CHECK(rdma_join_multicast(id, (struct sockaddr *)&peer, NULL) == -1 && errno == EINVAL);

	/* What is not offered fails cleanly. */
	errno = 0;
	CHECK(rsocket(AF_INET, SOCK_STREAM, 0) == -1 && errno == ENOSYS);
	errno = 0;
	CHECK(rdma_create_id(channel, &other, NULL, RDMA_PS_IB) == -1 && errno == EOPNOTSUPP);
	errno = 0;
	CHECK(rdma_create_id(channel, NULL, NULL, RDMA_PS_TCP) == -1 && errno == EINVAL);

	/* Addresses in rdma_cm's shape, and the device list. */
	CHECK(rdma_getaddrinfo(argv[1], "7174", &hints, &info) == 0);
	if (info) {
		CHECK(info->ai_family == AF_INET && info->ai_dst_addr && !info->ai_src_addr);
		CHECK(info->ai_dst_addr &&
		      ((struct sockaddr_in *)info->ai_dst_addr)->sin_port == htons(7174));
		rdma_freeaddrinfo(info);
	}
	devices = rdma_get_devices(&count);
	CHECK(devices && count == 1 && devices[0] && !devices[1]);
	if (devices)
		rdma_free_devices(devices);

	CHECK(rdma_destroy_id(id) == 0);
	destroy_waits_for_acks(channel, (struct sockaddr *)&peer);
	rdma_destroy_event_channel(channel);
	destroy_while_waited_on();
	if (failures)
		return 1;
	printf("ok\n");
	return 0;
}
