#!/bin/bash
# A live incast (issue 25): four senders in four namespaces write to one receiver through a
# bridge namespace whose port to the receiver is the bottleneck: tbf at RATE Mb/s with a
# BUFFER-byte queue (drops beyond it), and `roce ecn-mark` on that port marking CE while a
# virtual queue of the same rate holds more than THRESHOLD bytes (this kernel has no red).
# Each sender runs `ib_write_bw -D SECONDS` under `roce exec` against its own server on the
# receiver's one device. Runs with DCQCN (the default) and without (ROCE_DCQCN=0: CNPs are
# sent but ignored), ROUNDS times each, interleaved, and prints per run:
#   dcqcn=on|off goodput=G (Mb/s, the four senders' sum) utilisation=G/RATE
#   fairness=F (Jain's, over the senders) drops=D (tbf) marked=M (CE marks)
#   cnp_sent=C (receivers' np_cnp_sent) cnp_handled=H (senders' rp_cnp_handled)
#   cnp_ignored=I naks=K (sequence NAKs the senders received: go-back-N after a drop)
#   timeouts=T (the senders' retransmission timeouts)
# Usage (root): tools/bench/incast_live.sh [ROUNDS] [DIR]   (DIR holds roce and the
# libraries, default target/release). Every run is bounded (timeout); the namespaces are
# removed on exit. The senders' links have no speed (veth), so DCQCN's highest rate is LINK
# (rp_max_rate), not the 100 Gb/s default: from 100 Gb/s its fast recovery overshoots.
set -u
ROUNDS=${1:-1}
DIR=${2:-target/release}
ROCE=$(realpath "$DIR/roce")
RATE=${RATE:-200}            # Mb/s
BUFFER=${BUFFER:-256000}     # bytes tbf queues before it drops
THRESHOLD=${THRESHOLD:-30000}
SECONDS_=${SECONDS_:-5}
SIZE=${SIZE:-65536}
LINK=${LINK:-1000}           # Mb/s: the senders' DCQCN highest rate (rp_max_rate)
KNOBS=${KNOBS:-}             # more DCQCN knobs for the senders: rp_ai_rate=1,...
TX_DEPTH=${TX_DEPTH:-128}    # perftest's -t: messages each sender keeps outstanding
# PCAP_DIR: record each sender's frames there (sI-DCQCN.pcap)
N=4
P=il$$
BR=$P-br
RX=$P-rx
TMP=$(mktemp -d /tmp/incast-live.XXXXXX)

cleanup() {
	[ -n "${MARKER:-}" ] && kill -INT "$MARKER" 2>/dev/null
	wait 2>/dev/null
	for ns in "$BR" "$RX" $(seq -f "$P-s%g" 1 $N); do ip netns del "$ns" 2>/dev/null; done
	[ -n "${KEEP:-}" ] || rm -rf "$TMP"
}
trap cleanup EXIT

ip netns add "$BR" && ip netns add "$RX" || exit 1
ip -n "$BR" link add br0 type bridge
ip -n "$BR" link set br0 up
port() { # namespace interface address: a veth from the bridge to the namespace
	ip link add "$2" netns "$1" type veth peer name "b-$2" netns "$BR"
	ip -n "$BR" link set "b-$2" master br0 up
	ip -n "$1" addr add "$3/24" dev "$2"
	ip -n "$1" link set "$2" up
	ip -n "$1" link set lo up
}
port "$RX" rx0 10.90.0.1
for i in $(seq $N); do
	ip netns add "$P-s$i" || exit 1
	port "$P-s$i" "s${i}0" "10.90.0.1$i"
done
# The bottleneck: what leaves the bridge for the receiver.
ip netns exec "$BR" tc qdisc add dev b-rx0 root tbf rate "${RATE}mbit" burst 16k limit "$BUFFER"

listening() { # port: bounded wait for a server in the receiver's namespace
	for _ in $(seq 200); do
		ip netns exec "$RX" ss -Hltn "sport = :$1" | grep -q . && return 0
		sleep 0.05
	done
	return 1
}
sum() { awk -v name="$1" '$1 == name { s += $2 } END { print s + 0 }' "${@:2}"; }

run() { # dcqcn (1|0)
	local dcqcn=$1 drops_before marked clients=() servers=()
	drops_before=$(ip netns exec "$BR" tc -s qdisc show dev b-rx0 | awk '/dropped/ { sub(",", "", $7); print $7; exit }')
	ip netns exec "$BR" "$ROCE" ecn-mark b-rx0 --rate "$RATE" --threshold "$THRESHOLD" \
		>"$TMP/marker" 2>/dev/null &
	MARKER=$!
	for i in $(seq $N); do
		local p=$((18600 + i))
		ip netns exec "$RX" env ROCE_STATS=1 ROCE_DCQCN="$dcqcn" ROCE_DCQCN_PARAMS=rp_max_rate=$LINK,$KNOBS timeout $((SECONDS_ + 60)) \
			"$ROCE" exec -- ib_write_bw -d rx0 -x 1 -F -p $p -D "$SECONDS_" -s "$SIZE" \
			>"$TMP/server$i" 2>&1 &
		servers+=($!)
		listening $p
	done
	for i in $(seq $N); do
		ip netns exec "$P-s$i" env ROCE_STATS=1 ${PCAP_DIR:+ROCE_PCAP=$PCAP_DIR/s$i-$dcqcn.pcap} ROCE_DCQCN="$dcqcn" ROCE_DCQCN_PARAMS=rp_max_rate=$LINK,$KNOBS timeout $((SECONDS_ + 60)) \
			"$ROCE" exec -- ib_write_bw -d "s${i}0" -x 1 -F -p $((18600 + i)) -D "$SECONDS_" \
			-s "$SIZE" -t "$TX_DEPTH" 10.90.0.1 >"$TMP/client$i" 2>&1 &
		clients+=($!)
	done
	wait "${clients[@]}" "${servers[@]}"
	kill -INT "$MARKER"
	wait "$MARKER"
	MARKER=
	local drops
	drops=$(ip netns exec "$BR" tc -s qdisc show dev b-rx0 | awk '/dropped/ { sub(",", "", $7); print $7; exit }')
	marked=$(sed -n 's/.*marked=\([0-9]*\).*/\1/p' "$TMP/marker")
	# The client's result row: bytes, iterations, peak and average MB/s (perftest's MB is 2^20).
	local rates
	for i in $(seq $N); do # a sender without a result row: say why
		grep -q "^ $SIZE " "$TMP/client$i" ||
			echo "sender $i (dcqcn=$dcqcn) failed: $(grep -m3 -iE 'error|fail|couldn' "$TMP/client$i" | tr '\n' ' ')" >&2
	done
	rates=$(for i in $(seq $N); do
		awk -v size="$SIZE" '$1 == size && NF >= 5 { printf "%.1f\n", $4 * 1048576 * 8 / 1e6; exit }' "$TMP/client$i"
	done)
	echo "$rates" | awk -v dcqcn="$dcqcn" -v rate="$RATE" -v drops=$((drops - drops_before)) \
		-v marked="${marked:-?}" \
		-v sent="$(sum np_cnp_sent "$TMP"/server*)" \
		-v handled="$(sum rp_cnp_handled "$TMP"/client*)" \
		-v ignored="$(sum rp_cnp_ignored "$TMP"/client*)" \
		-v naks="$(sum rcvd_seq_err "$TMP"/client*)" \
		-v timeouts="$(sum completer_retry_err "$TMP"/client*)" '
		NF { n++; s += $1; q += $1 * $1; each = each sprintf("%s%.0f", n > 1 ? "," : "", $1) }
		END {
			printf "dcqcn=%s goodput=%.0f utilisation=%.2f fairness=%.3f senders=%d each=%s drops=%s marked=%s cnp_sent=%s cnp_handled=%s cnp_ignored=%s naks=%s timeouts=%s\n",
				dcqcn ? "on" : "off", s, s / rate, n ? s * s / (n * q) : 0, n, each, drops, marked,
				sent, handled, ignored, naks, timeouts
		}'
}

for _ in $(seq "$ROUNDS"); do
	run 1
	run 0
done
