/* What libfabric's verbs provider (and its RxM) asks of librdmacm, as the kernel's rdma_cm
 * answers, between a server and a client in two namespaces:
 *   - the server binds "localhost" as libfabric does (rdma_getaddrinfo with RAI_PASSIVE and
 *     no service): a loopback address binds no device, as the wildcard (id->verbs stays
 *     NULL), and port 0 takes a port at once, which rdma_get_src_port reports;
 *   - the client's id starts synchronous and moves to a channel with rdma_migrate_id: its
 *     rdma_resolve_route then reports ROUTE_RESOLVED on that channel;
 *   - RDMA_MAX_RESP_RES/RDMA_MAX_INIT_DEPTH (0xFF) ask for the device's most, and a depth
 *     above the device's is EINVAL;
 *   - the active side's ESTABLISHED carries the REP's private data and the settled depths.
 * Usage: cm_for_libfabric server | cm_for_libfabric client SERVER_IPV4 PORT
 * The server prints "port N" once it listens; each side prints "ok" last when every check
 * held, else names the first that failed. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include "common.h"

static const char REQ_DATA[] = "libfabric's request";
static const char REP_DATA[] = "libfabric's reply";

/* The next event on `channel`, which must be `expected`. */
static struct rdma_cm_event *expect(struct rdma_event_channel *channel, int expected)
{
	struct rdma_cm_event *event;
	CHECK(rdma_get_cm_event(channel, &event) == 0);
	if (event->event != expected) {
		fprintf(stderr, "FAILED: %s (status %d), wanted %s\n", rdma_event_str(event->event),
			event->status, rdma_event_str(expected));
		exit(1);
	}
	return event;
}

static struct ibv_qp_init_attr qp_attr(void)
{
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	return attr;
}

static int server(void)
{
	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP };
	struct rdma_addrinfo *info;
	CHECK(rdma_getaddrinfo("localhost", NULL, &hints, &info) == 0);
	CHECK(info->ai_src_addr && info->ai_src_addr->sa_family == AF_INET);
	CHECK(ntohl(((struct sockaddr_in *)info->ai_src_addr)->sin_addr.s_addr) == INADDR_LOOPBACK);
	struct rdma_event_channel *channel = rdma_create_event_channel();
	CHECK(channel);
	struct rdma_cm_id *listener;
	CHECK(rdma_create_id(channel, &listener, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(listener, info->ai_src_addr) == 0);
	rdma_freeaddrinfo(info);
	CHECK(listener->verbs == NULL);
	uint16_t port = ntohs(rdma_get_src_port(listener));
	CHECK(port != 0);
	struct sockaddr_in *bound = (struct sockaddr_in *)rdma_get_local_addr(listener);
	CHECK(ntohl(bound->sin_addr.s_addr) == INADDR_LOOPBACK && ntohs(bound->sin_port) == port);
	CHECK(rdma_listen(listener, 4) == 0);
	printf("port %u\n", port);
	fflush(stdout);

	/* A request to the interface's address reaches the listener on localhost. */
	struct rdma_cm_event *request = expect(channel, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *id = request->id;
	CHECK(id->verbs != NULL);
	struct rdma_conn_param *asked = &request->param.conn;
	CHECK(asked->private_data_len >= sizeof(REQ_DATA));
	CHECK(!memcmp(asked->private_data, REQ_DATA, sizeof(REQ_DATA)));
	CHECK(asked->responder_resources > 1 && asked->initiator_depth > 1);
	CHECK(rdma_ack_cm_event(request) == 0);
	struct ibv_qp_init_attr attr = qp_attr();
	CHECK(rdma_create_qp(id, NULL, &attr) == 0);
	struct ibv_device_attr device;
	CHECK(ibv_query_device(id->verbs, &device) == 0);
	struct rdma_conn_param param = {
		.private_data = REP_DATA,
		.private_data_len = sizeof(REP_DATA),
		.responder_resources = (uint8_t)(device.max_qp_rd_atom + 1),
		.initiator_depth = RDMA_MAX_INIT_DEPTH,
	};
	/* More than the device holds is refused (when it is not 0xFF). */
	if (device.max_qp_rd_atom < 0xFE) {
		errno = 0;
		CHECK(rdma_accept(id, &param) == -1 && errno == EINVAL);
	}
	param.responder_resources = RDMA_MAX_RESP_RES;
	CHECK(rdma_accept(id, &param) == 0);
	struct rdma_cm_event *established = expect(channel, RDMA_CM_EVENT_ESTABLISHED);
	CHECK(rdma_ack_cm_event(established) == 0);
	struct rdma_cm_event *gone = expect(channel, RDMA_CM_EVENT_DISCONNECTED);
	CHECK(rdma_ack_cm_event(gone) == 0);
	rdma_destroy_qp(id);
	CHECK(rdma_destroy_id(id) == 0);
	CHECK(rdma_destroy_id(listener) == 0);
	rdma_destroy_event_channel(channel);
	printf("ok\n");
	return 0;
}

static int client(const char *server_ip, const char *port)
{
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(atoi(port)) };
	CHECK(inet_pton(AF_INET, server_ip, &to.sin_addr) == 1);
	/* Synchronous (no channel): rdma_resolve_addr waits for its own event. */
	struct rdma_cm_id *id;
	CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&to, 2000) == 0);
	CHECK(id->verbs != NULL);
	/* Asynchronous from here on: the events come on the new channel. */
	struct rdma_event_channel *channel = rdma_create_event_channel();
	CHECK(channel);
	CHECK(rdma_migrate_id(id, channel) == 0);
	CHECK(id->channel == channel);
	CHECK(rdma_resolve_route(id, 2000) == 0);
	CHECK(rdma_ack_cm_event(expect(channel, RDMA_CM_EVENT_ROUTE_RESOLVED)) == 0);
	struct ibv_qp_init_attr attr = qp_attr();
	CHECK(rdma_create_qp(id, NULL, &attr) == 0);
	struct ibv_device_attr device;
	CHECK(ibv_query_device(id->verbs, &device) == 0);
	struct rdma_conn_param param = {
		.private_data = REQ_DATA,
		.private_data_len = sizeof(REQ_DATA),
		.responder_resources = RDMA_MAX_RESP_RES,
		.initiator_depth = RDMA_MAX_INIT_DEPTH,
		.retry_count = 7,
		.rnr_retry_count = 7,
	};
	CHECK(rdma_connect(id, &param) == 0);
	struct rdma_cm_event *established = expect(channel, RDMA_CM_EVENT_ESTABLISHED);
	/* The REP's private data and what was settled, as the kernel reports them. */
	struct rdma_conn_param *reply = &established->param.conn;
	CHECK(reply->private_data_len >= sizeof(REP_DATA));
	CHECK(!memcmp(reply->private_data, REP_DATA, sizeof(REP_DATA)));
	CHECK(reply->responder_resources >= 1 &&
	      reply->responder_resources <= device.max_qp_rd_atom);
	CHECK(reply->initiator_depth >= 1 &&
	      reply->initiator_depth <= device.max_qp_init_rd_atom);
	CHECK(reply->qp_num != 0);
	CHECK(rdma_ack_cm_event(established) == 0);
	struct ibv_qp_attr qp;
	struct ibv_qp_init_attr init;
	CHECK(ibv_query_qp(id->qp, &qp, IBV_QP_STATE, &init) == 0);
	CHECK(qp.qp_state == IBV_QPS_RTS);
	CHECK(rdma_disconnect(id) == 0);
	CHECK(rdma_ack_cm_event(expect(channel, RDMA_CM_EVENT_DISCONNECTED)) == 0);
	rdma_destroy_qp(id);
	CHECK(rdma_destroy_id(id) == 0);
	rdma_destroy_event_channel(channel);
	printf("ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "server"))
		return server();
	if (argc == 4 && !strcmp(argv[1], "client"))
		return client(argv[2], argv[3]);
	fprintf(stderr, "usage: cm_for_libfabric server | cm_for_libfabric client IPV4 PORT\n");
	return 2;
}
