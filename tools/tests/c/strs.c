/* The str helpers' answers for every value around their enums' ranges, one a line, to be
 * compared between Debian's libibverbs and ours. Usage: strs */
#include <stdio.h>
#include <infiniband/verbs.h>

int main(void)
{
	for (int i = 0; i < 30; i++)
		printf("wc %d %s\n", i, ibv_wc_status_str(i));
	for (int i = 0; i < 25; i++)
		printf("event %d %s\n", i, ibv_event_type_str(i));
	for (int i = -1; i < 10; i++)
		printf("node %d %s\n", i, ibv_node_type_str(i));
	for (int i = 0; i < 8; i++)
		printf("port %d %s\n", i, ibv_port_state_str(i));
	return 0;
}
