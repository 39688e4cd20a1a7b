#!/bin/bash
# The device switch's costs (issue 22), measured in one run, rounds interleaved:
#   lone: one perftest pair between two namespaces, each side alone on its device, in three
#     ways: `direct` (ROCE_SWITCH=0, the device opened by the process as before switches),
#     `lent` (the default: the switch lends the lone process the device) and `ring`
#     (`roce switch IFACE --no-lend` on both ends: every frame through the switch);
#     ib_send_bw -s 64 (MsgRate, Mpps) and ib_send_lat -s 64 (t_typical, µs: half a round
#     trip);
#   pairs: N ib_send_bw -s 64 -D SECONDS pairs at once, N servers on one device and N clients
#     on the other (so N processes per device, through the switch when N > 1): each client's
#     MsgRate and their sum.
# Usage (root): tools/bench/switch.sh ROUNDS [DIR]   (DIR holds roce and the libraries,
# default target/release). Prints one line per measurement. Every run is bounded (timeout);
# the namespaces and switches are removed on exit.
set -u
ROUNDS=${1:?rounds}
DIR=${2:-target/release}
ROCE=$(realpath "$DIR/roce")
A=swb-a-$$
B=swb-b-$$
MODES=${MODES:-"direct lent ring"}
PAIRS=${PAIRS:-"1 2 4"}
BW_ITERS=${BW_ITERS:-100000}
LAT_ITERS=${LAT_ITERS:-5000}
SECONDS_=${SECONDS_:-3}
SWITCHES=()

cleanup() {
	for pid in "${SWITCHES[@]}"; do kill -INT "$pid" 2>/dev/null; done
	wait 2>/dev/null
	ip netns del "$A" 2>/dev/null
	ip netns del "$B" 2>/dev/null
	rm -f /tmp/swb-*.$$
}
trap cleanup EXIT
ip netns add "$A" && ip netns add "$B" || exit 1
ip link add swba0 netns "$A" type veth peer name swbb0 netns "$B"
ip -n "$A" addr add 10.89.0.1/24 dev swba0
ip -n "$B" addr add 10.89.0.2/24 dev swbb0
ip -n "$A" link set swba0 mtu 9000 up
ip -n "$B" link set swbb0 mtu 9000 up

# Waits (bounded) until something listens on TCP port $1 in namespace A.
listening() {
	for _ in $(seq 200); do
		ip netns exec "$A" ss -Hltn "sport = :$1" | grep -q . && return 0
		sleep 0.05
	done
	return 1
}

# mode test args...: one pair, server in A, client in B; prints the client's result row.
lone() {
	local mode=$1
	shift
	local env=(env ROCE_BACKEND=native)
	[ "$mode" = direct ] && env+=(ROCE_SWITCH=0)
	if [ "$mode" = ring ]; then
		ip netns exec "$A" "$ROCE" switch swba0 --no-lend 2>/dev/null &
		SWITCHES+=($!)
		ip netns exec "$B" "$ROCE" switch swbb0 --no-lend 2>/dev/null &
		SWITCHES+=($!)
		sleep 0.3
	fi
	ip netns exec "$A" "${env[@]}" timeout 60 "$ROCE" exec -- "$@" -d swba0 -x 1 -F \
		>/tmp/swb-s.$$ 2>&1 &
	local server=$!
	listening 18515
	ip netns exec "$B" "${env[@]}" timeout 60 "$ROCE" exec -- "$@" -d swbb0 -x 1 -F 10.89.0.1 \
		>/tmp/swb-c.$$ 2>&1
	wait $server
	if [ "$mode" = ring ]; then
		kill -INT "${SWITCHES[@]}" 2>/dev/null
		wait "${SWITCHES[@]}" 2>/dev/null
		SWITCHES=()
	fi
	awk '$1 == "64" && NF >= 5 { print; exit }' /tmp/swb-c.$$
}

# n: n pairs at once; prints each client's MsgRate and the sum.
pairs() {
	local n=$1 servers=() clients=() i
	for i in $(seq "$n"); do
		ip netns exec "$A" env ROCE_BACKEND=native timeout 60 "$ROCE" exec -- \
			ib_send_bw -s 64 -D "$SECONDS_" -p $((18600 + i)) -d swba0 -x 1 -F \
			>/tmp/swb-s$i.$$ 2>&1 &
		servers+=($!)
	done
	for i in $(seq "$n"); do listening $((18600 + i)); done
	for i in $(seq "$n"); do
		ip netns exec "$B" env ROCE_BACKEND=native timeout 60 "$ROCE" exec -- \
			ib_send_bw -s 64 -D "$SECONDS_" -p $((18600 + i)) -d swbb0 -x 1 -F 10.89.0.1 \
			>/tmp/swb-c$i.$$ 2>&1 &
		clients+=($!)
	done
	wait "${clients[@]}" "${servers[@]}"
	for i in $(seq "$n"); do
		awk '$1 == "64" && NF >= 5 { print $NF; exit }' /tmp/swb-c$i.$$
	done | awk '{ printf "%s ", $1; sum += $1 } END { printf "sum %.4f\n", sum }'
}

echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$ROUNDS"); do
	for mode in $MODES; do
		echo "round $round $mode send_bw: $(lone "$mode" ib_send_bw -s 64 -n "$BW_ITERS")"
		echo "round $round $mode send_lat: $(lone "$mode" ib_send_lat -s 64 -n "$LAT_ITERS")"
	done
	for n in $PAIRS; do
		echo "round $round pairs $n: $(pairs "$n")"
	done
done
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
