/* rdma_cm's multicast calls as librdmacm and the kernel's rdma_cm answer them on RoCE (and
 * rdma_getaddrinfo naming a group as pyverbs does):
 * the argument checks (EINVAL, ENOTSUP, EADDRNOTAVAIL, ENOTSUPP for an IPv6 group), the
 * join event's parameters (the group's GID from our IPv4 GID, hop limit 64, QPN 0xFFFFFF,
 * RDMA_UDP_QKEY, the join's context as private data), the QP attached on a full member's
 * join and not on a send-only one, detached by the leave, and MULTICAST_ERROR when the
 * attach fails (a unicast "group"). Usage: mcast_cm OUR_IPV4. Prints "ok" when every check
 * holds, else names the first that failed. */
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include "common.h"

enum { QKEY = 0x01234567, ENOTSUPP = 524 };

static struct rdma_event_channel *channel;

static struct sockaddr_in ipv4(const char *ip)
{
	struct sockaddr_in addr = { .sin_family = AF_INET };
	CHECK(inet_pton(AF_INET, ip, &addr.sin_addr) == 1);
	return addr;
}

/* The next event, which must be `expected` for `id`; the caller acknowledges it. */
static struct rdma_cm_event *next(struct rdma_cm_id *id, enum rdma_cm_event_type expected)
{
	struct rdma_cm_event *event;
	CHECK(rdma_get_cm_event(channel, &event) == 0);
	if (event->event != expected || event->id != id) {
		fprintf(stderr, "FAILED: %s (status %d), wanted %s\n", rdma_event_str(event->event),
			event->status, rdma_event_str(expected));
		exit(1);
	}
	return event;
}

/* A UD id bound to `ours`, resolved towards `group`, with a UD QP made by rdma_cm. */
static struct rdma_cm_id *resolved(struct sockaddr_in *ours, struct sockaddr_in *group)
{
	struct rdma_cm_id *id;
	CHECK(rdma_create_id(channel, &id, NULL, RDMA_PS_UDP) == 0);
	CHECK(rdma_resolve_addr(id, (struct sockaddr *)ours, (struct sockaddr *)group, 2000) == 0);
	CHECK(rdma_ack_cm_event(next(id, RDMA_CM_EVENT_ADDR_RESOLVED)) == 0);
	struct ibv_qp_init_attr init = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_UD,
	};
	CHECK(rdma_create_qp(id, NULL, &init) == 0);
	return id;
}

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	struct sockaddr_in ours = ipv4(argv[1]), group = ipv4("239.5.5.5");
	struct sockaddr_in unicast = ipv4("10.5.5.5"), wildcard = ipv4("0.0.0.0");
	struct sockaddr_in6 group6 = { .sin6_family = AF_INET6 };
	CHECK(inet_pton(AF_INET6, "ff12::5", &group6.sin6_addr) == 1);
	channel = rdma_create_event_channel();
	CHECK(channel);

	/* A group's address as pyverbs names it: rdma_getaddrinfo with no node and no service
	 * gives back the hints' own source. */
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_UDP,
				       .ai_src_addr = (struct sockaddr *)&group,
				       .ai_src_len = sizeof group },
			     *info;
	CHECK(rdma_getaddrinfo(NULL, NULL, &hints, &info) == 0);
	CHECK(info->ai_src_len == sizeof group && !memcmp(info->ai_src_addr, &group, sizeof group));
	CHECK(info->ai_dst_len == 0 && info->ai_port_space == RDMA_PS_UDP);
	rdma_freeaddrinfo(info);

	/* An id on no device yet: EINVAL, as the kernel's ucma answers. */
	struct rdma_cm_id *unbound;
	CHECK(rdma_create_id(channel, &unbound, NULL, RDMA_PS_UDP) == 0);
	errno = 0;
	CHECK(rdma_join_multicast(unbound, (struct sockaddr *)&group, NULL) == -1 && errno == EINVAL);
	CHECK(rdma_destroy_id(unbound) == 0);

	struct rdma_cm_id *id = resolved(&ours, &group);
	/* librdmacm's own checks of the extended join. */
	struct rdma_cm_join_mc_attr_ex ex = {
		.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
		.join_flags = RDMA_MC_JOIN_FLAG_RESERVED,
		.addr = (struct sockaddr *)&group,
	};
	errno = 0;
	CHECK(rdma_join_multicast_ex(id, &ex, NULL) == -1 && errno == EINVAL);
	ex.join_flags = RDMA_MC_JOIN_FLAG_FULLMEMBER;
	ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_RESERVED;
	errno = 0;
	CHECK(rdma_join_multicast_ex(id, &ex, NULL) == -1 && errno == ENOTSUP);
	ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
	errno = 0;
	CHECK(rdma_join_multicast_ex(id, &ex, NULL) == -1 && errno == EINVAL);
	/* The kernel's: the wildcard is no group; IPv6 groups are not offered on RoCEv2. */
	errno = 0;
	CHECK(rdma_join_multicast(id, (struct sockaddr *)&wildcard, NULL) == -1 && errno == EINVAL);
	errno = 0;
	CHECK(rdma_join_multicast(id, (struct sockaddr *)&group6, NULL) == -1 && errno == ENOTSUPP);
	errno = 0;
	CHECK(rdma_leave_multicast(id, (struct sockaddr *)&group) == -1 && errno == EADDRNOTAVAIL);

	/* A full member's join: the event says how to send to the group, and the QP is attached
	 * (detaching it once works). */
	int context = 42;
	ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
	CHECK(rdma_join_multicast_ex(id, &ex, &context) == 0);
	struct rdma_cm_event *event = next(id, RDMA_CM_EVENT_MULTICAST_JOIN);
	struct rdma_ud_param *ud = &event->param.ud;
	union ibv_gid mgid = ud->ah_attr.grh.dgid;
	static const uint8_t mapped[12] = { [10] = 0xff, [11] = 0xff };
	CHECK(!memcmp(mgid.raw, mapped, 12) && !memcmp(&mgid.raw[12], &group.sin_addr, 4));
	CHECK(ud->ah_attr.is_global == 1 && ud->ah_attr.port_num == 1 && ud->ah_attr.dlid == 0);
	CHECK(ud->ah_attr.grh.sgid_index == 1 && ud->ah_attr.grh.hop_limit == 64);
	CHECK(ud->qp_num == 0xffffff && ud->qkey == QKEY);
	CHECK(ud->private_data == &context && ud->private_data_len == 0);
	CHECK(event->status == 0);
	CHECK(rdma_ack_cm_event(event) == 0);
	CHECK(ibv_detach_mcast(id->qp, &mgid, 0) == 0);
	CHECK(ibv_attach_mcast(id->qp, &mgid, 0) == 0);
	/* The leave detaches it. */
	CHECK(rdma_leave_multicast(id, (struct sockaddr *)&group) == 0);
	CHECK(ibv_detach_mcast(id->qp, &mgid, 0) == EINVAL);

	/* A send-only member's QP is not attached. */
	ex.join_flags = RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
	CHECK(rdma_join_multicast_ex(id, &ex, NULL) == 0);
	CHECK(rdma_ack_cm_event(next(id, RDMA_CM_EVENT_MULTICAST_JOIN)) == 0);
	CHECK(ibv_detach_mcast(id->qp, &mgid, 0) == EINVAL);
	CHECK(rdma_leave_multicast(id, (struct sockaddr *)&group) == 0);

	/* A unicast "group": joined, but the attach ucma_process_join makes fails. */
	CHECK(rdma_join_multicast(id, (struct sockaddr *)&unicast, &context) == 0);
	event = next(id, RDMA_CM_EVENT_MULTICAST_ERROR);
	CHECK(event->status == -1 && event->param.ud.private_data == &context);
	CHECK(rdma_ack_cm_event(event) == 0);
	CHECK(rdma_leave_multicast(id, (struct sockaddr *)&unicast) == 0);

	rdma_destroy_qp(id);
	CHECK(rdma_destroy_id(id) == 0);
	rdma_destroy_event_channel(channel);
	printf("ok\n");
	return 0;
}
