#!/bin/bash
# The hot path's goals (issue 24), measured in one run as ratios, interleaved over builds:
#   roce demo's `ceiling` line (rate64, write, read against the raw AF_XDP ceiling);
#   ib_send_lat / ib_write_lat -s 64 through `roce exec` (default progress) against
#   `roce perf send_lat / write_lat` (t_typical, µs);
#   ib_send_bw / ib_write_bw -s 64 through `roce exec` against `roce perf` (Mpps).
# Usage (root): tools/bench/hot_path.sh ROUNDS DIR...   where each DIR holds a build's roce,
# libibverbs.so, librdmacm.so, libmlx5.so and libefa.so (e.g. target/release). Prints one
# line per measurement: `build test figure`. Every run is bounded (timeout); the namespaces
# are removed on exit.
set -u
ROUNDS=${1:?rounds}
shift
BUILDS=("$@")
A=hpb-a-$$
B=hpb-b-$$
TESTS=${TESTS:-"demo send_lat write_lat send_bw write_bw"}
LAT_ITERS=${LAT_ITERS:-5000}
BW_ITERS=${BW_ITERS:-100000}
# Extra arguments to `roce demo`, e.g. "--bytes 4G": longer phases average over more of the
# machine's drift (each is still interleaved with its ceiling).
DEMO_ARGS=${DEMO_ARGS:-}

cleanup() {
	ip netns del "$A" 2>/dev/null
	ip netns del "$B" 2>/dev/null
}
trap cleanup EXIT
ip netns add "$A" && ip netns add "$B" || exit 1
ip link add hpba0 netns "$A" type veth peer name hpbb0 netns "$B"
ip -n "$A" addr add 10.87.0.1/24 dev hpba0
ip -n "$B" addr add 10.87.0.2/24 dev hpbb0
ip -n "$A" link set hpba0 mtu 9000 up
ip -n "$B" link set hpbb0 mtu 9000 up

# server_cmd... :: client_cmd...: runs the server in B, then the client in A (retried while
# the server is not listening yet); prints the client's output then the server's.
pair() {
	local server=() client=()
	while [ "$1" != :: ]; do server+=("$1"); shift; done
	shift
	client=("$@")
	ip netns exec "$B" timeout 60 "${server[@]}" >/tmp/hpb-server.$$ 2>&1 &
	local pid=$!
	for _ in $(seq 50); do
		sleep 0.2
		ip netns exec "$A" timeout 60 "${client[@]}" >/tmp/hpb-client.$$ 2>&1 && break
	done
	wait $pid
	cat /tmp/hpb-client.$$ /tmp/hpb-server.$$
}

# The t_typical column of a perftest latency row, or roce perf's.
typical() { awk '$1 == "64" && NF >= 5 { print $5; exit }'; }
# The MsgRate column of a perftest bandwidth row (Mpps).
msgrate() { awk '$1 == "64" && NF >= 5 { print $NF; exit }'; }

for round in $(seq "$ROUNDS"); do
	for dir in "${BUILDS[@]}"; do
		roce="$dir/roce"
		exec_=("$roce" exec --lib-dir "$dir" --)
		for test in $TESTS; do
			case $test in
			demo)
				# shellcheck disable=SC2086 # DEMO_ARGS is a list of words
				out=$(timeout 300 "$roce" demo $DEMO_ARGS 2>/dev/null)
				rate=$(echo "$out" | awk '/64 B message rate/ { print $(NF-4) }')
				raw=$(echo "$out" | awk '/raw AF_XDP, 64 B payload frames/ { print $(NF-4) }')
				echo "$dir round$round demo rate64=$rate raw64=$raw $(echo "$out" | grep '^ceiling')"
				;;
			send_lat | write_lat)
				perftest=ib_$test
				ours=$(pair "${exec_[@]}" "$perftest" -x 1 -F -s 64 -n "$LAT_ITERS" -d hpbb0 :: \
					"${exec_[@]}" "$perftest" -x 1 -F -s 64 -n "$LAT_ITERS" -d hpba0 10.87.0.2 | typical)
				perf=$(pair "$roce" perf "$test" -s 64 -n "$LAT_ITERS" -d hpbb0 :: \
					"$roce" perf "$test" -s 64 -n "$LAT_ITERS" -d hpba0 10.87.0.2 | typical)
				echo "$dir round$round $test exec=$ours perf=$perf"
				;;
			send_bw | write_bw)
				perftest=ib_$test
				ours=$(pair "${exec_[@]}" "$perftest" -x 1 -F -s 64 -n "$BW_ITERS" -d hpbb0 :: \
					"${exec_[@]}" "$perftest" -x 1 -F -s 64 -n "$BW_ITERS" -d hpba0 10.87.0.2 | msgrate)
				perf=$(pair "$roce" perf "$test" -s 64 -n "$BW_ITERS" -d hpbb0 :: \
					"$roce" perf "$test" -s 64 -n "$BW_ITERS" -d hpba0 10.87.0.2 | msgrate)
				echo "$dir round$round $test exec=$ours perf=$perf"
				;;
			esac
		done
	done
done
rm -f /tmp/hpb-server.$$ /tmp/hpb-client.$$
