#!/bin/bash
# test-rdma-vm.sh - runs in both VMs of test-rdma.sh (role from B2B_ROLE); parameters in $B2B_OUT/params.env.
#   A (10.77.0.1): ib_write_bw servers; then the fault and load cases (e2e TestRemoteFaults, which runs its own
#                  b2bd here so it can kill -9 it and take eth0 down); then the destination b2bd (API on
#                  10.77.0.1:7480) for B's e2e tests and bench.
#   B (10.77.0.2): ib_write_bw clients, then the source b2bd (API on 10.77.0.2:7480 for A's fault cases), and,
#                  once A's fault cases are done, the e2e tests over verbs and b2b-bench (two-host, --transport verbs).
# The VMs meet over the wire (TCP ports) and through files in $B2B_OUT (shared with the host).
set -euo pipefail
HERE=$(dirname "$(readlink -f "$0")")
: "${B2B_ROLE:?run me through run-pair.sh}" "${B2B_PEER_IP:?}" "${B2B_SELF_IP:?}" "${B2B_OUT:?}"
# shellcheck source=/dev/null
. "$B2B_OUT/params.env"
dev=${B2B_RDMA_DEV:-rxe0}
# shellcheck disable=SC2153 # SIZES and BLOCKS come from params.env
read -r -a sizes <<<"$SIZES"
# shellcheck disable=SC2153
read -r -a blocks <<<"$BLOCKS"
log() { printf '[vm %s %s] %s\n' "$B2B_ROLE" "$(date +%T)" "$*"; }

gid=$("$HERE/gid-index.sh" "$dev" 1 "$B2B_SELF_IP")
# A permanent neighbour entry for the peer (run-pair.sh's fixed MACs): on a starved host the ARP entry went
# stale mid-run and rxe's queued packets hit a NULL dereference in rxe_skb_tx_dtor (kernel panic in A, seen
# once in an interleaved run while the host was busy); with no ARP resolution on the wire that path is gone.
case $B2B_ROLE in a) peer_mac=52:54:00:77:00:02 ;; *) peer_mac=52:54:00:77:00:01 ;; esac
ip neigh replace "$B2B_PEER_IP" lladdr "$peer_mac" dev eth0 nud permanent 2>/dev/null || log "could not pin the peer's neighbour entry"
log "dev=$dev gid_index=$gid sizes=${sizes[*]} blocks=${blocks[*]}"

# ---- perftest, interleaved with the bench (section 4) --------------------------------------------------------
# At each size, REPS rounds of ib_write_bw default, ib_write_bw tuned (-q 4 --post_list 32) and one b2b-bench
# batch set, mirrored (see round_variants), so drift of this emulated machine hits both sides alike. One
# server/client pair per (size, round, variant), each on its own port so a client never reaches a stale server;
# A starts each server as soon as the one before it ended, so it is waiting in accept() when B's client comes.
# Iterations match the blocks of the size. The tuned run's -n counts per QP and must be a multiple of
# --post_list: it is blocks/4 rounded up, with --post_list 32, or the per-QP count itself when that is
# below 32 (at least 5, perftest's minimum, so test-rdma.sh's blocks are at least 20), so that both runs move
# the bench's bytes (a fixed --post_list 32 made the tuned run move 128 messages, 4-16x a bench batch of 8-32
# big blocks, and compared a stream with a batch).
REPS=${REPS:-4}
MODES=${MODES:-}
# Mirrored rounds (A B C C B A): odd rounds run ib_write_bw default, tuned, then the bench; even rounds the
# bench, tuned, then default. A drift within a pair of rounds, or a cost one step leaves to the next (the
# previous bench's clean-up in the daemons, a cold cache), then falls on both sides alike.
round_variants() { if (($1 % 2)); then echo default tuned; else echo tuned default; fi; }
# (No process substitution in here: the VMs' chroot has no /dev/fd.)
perftest_args() { # perftest_args SIZE BLOCKS VARIANT PORT -> sets pt_args
	local s=$1 n=$2 variant=$3 port=$4
	[ "$n" -lt 5 ] && n=5 # perftest's minimum
	local nq=$(((n + 3) / 4)) # per QP, at least perftest's minimum
	[ "$nq" -lt 5 ] && nq=5
	local pl=32
	[ "$nq" -lt "$pl" ] && pl=$nq
	# shellcheck disable=SC2017 # rounding up to a multiple of the post list is the point
	local nt=$(((nq + pl - 1) / pl * pl))
	pt_args=(-d "$dev" -i 1 -x "$gid" -F -s "$s" -p "$port")
	if [ "$variant" = tuned ]; then pt_args+=(-n "$nt" -q 4 --post_list "$pl"); else pt_args+=(-n "$n"); fi
}
# READ: with READ=1 each round also runs ib_read_bw default and tuned (the same options) and a b2bd
# READ batch set, mirrored the same way, right after the round's WRITE triple; B is ib_read_bw's client, so B
# reads A's memory, as b2bd's READ does. READ_DRIVER=bench (the default) runs `b2b-bench --op read` in B against
# the daemons: B's daemon pulls from A's, a real daemon pull as the WRITE side is a real daemon push.
# READ_DRIVER=harness drives the verbs transport's Conn.Read directly instead (TestHWReadSource in A for the whole
# comparison, TestHWReadSink in B per size and round: the same transport code and defaults, no daemons).
READ=${READ:-0}
READ_DRIVER=${READ_DRIVER:-bench}
pt_tool=ib_write_bw # perftest_server/perftest_client run this one
perftest_server() { # perftest_server SIZE BLOCKS VARIANT PORT: serves once
	# Started as soon as the previous run ended, so it waits in accept() (idle) by the time B's client comes:
	# the client then does not wait for a server's start-up under emulation. No polling here while it runs:
	# the only poller in A is the 1 Hz bench.done check below, the same while ib_write_bw and the bench run.
	perftest_args "$@"
	timeout 600 "$pt_tool" "${pt_args[@]}" >/dev/null 2>&1 &
	echo $! >/tmp/b2b-perftest-server.pid
	local src=0
	wait $! || src=$?
	[ "$src" = 0 ] || log "$pt_tool server $1 $3 failed (rc $src)"
}
perftest_client() { # perftest_client SIZE BLOCKS VARIANT PORT -> prints GB/s (0 on failure)
	perftest_args "$@"
	local out rc res deadline=$((SECONDS + 120))
	while :; do
		rc=0
		out=$(timeout 120 "$pt_tool" "${pt_args[@]}" "$B2B_PEER_IP" 2>&1) || rc=$?
		if [ "$rc" != 0 ] && grep -q "Couldn't connect" <<<"$out" && [ "$SECONDS" -lt "$deadline" ]; then
			sleep 0.3
			continue
		fi
		break
	done
	# Result line: #bytes #iterations BW-peak BW-average MsgRate, BW in MiB/s.
	res=$(awk '$1 ~ /^[0-9]+$/ && NF >= 5 { print $4 }' <<<"$out" | tail -n 1)
	if [ -z "$res" ]; then
		log "$pt_tool $1 $3: no result (rc $rc): $(tail -n 3 <<<"$out" | tr '\n' ' ')" >&2
		res=0
	fi
	awk -v m="$res" 'BEGIN { printf "%.6f", m * 1048576 / 1e9 }'
}

certs=$B2B_OUT/certs
# ---- 2. fault and load cases (A runs them against B's daemon, started below in B) -----------------------------
if [ "$B2B_ROLE" = a ]; then
	if [ "${FAULTS:-0}" = 1 ] && [ -x "${E2E:-}" ]; then
		deadline=$((SECONDS + 300))
		until (exec 3<>"/dev/tcp/$B2B_PEER_IP/7480") 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; do sleep 0.3; done
		log "fault and load cases (TestRemoteFaults, transports ${FAULT_TRANSPORTS})"
		frc=0
		B2B_FAULTS_B2BD="$B2BD" B2B_FAULTS_SELF="$B2B_SELF_IP" B2B_FAULTS_REMOTE_API="$B2B_PEER_IP:7480" \
			B2B_FAULTS_REMOTE_PEER="$B2B_PEER_IP:7470" B2B_FAULTS_NETDEV=eth0 B2B_FAULTS_RDMA_DEV="$dev" \
			B2B_FAULTS_TRANSPORTS="$FAULT_TRANSPORTS" B2B_FAULTS_TRIALS="$FAULT_TRIALS" B2B_FAULTS_LOAD="$FAULT_LOAD" B2B_FAULTS_CASES="${FAULT_CASES:-}" B2B_FAULTS_LOGDIR="$B2B_OUT" \
			B2B_E2E_TLS_CERT="$certs/a.pem" B2B_E2E_TLS_KEY="$certs/a-key.pem" B2B_E2E_TLS_CA="$certs/ca.pem" \
			"$E2E" -test.run '^TestRemoteFaults$' -test.v -test.timeout "${FAULT_TIMEOUT}s" >"$B2B_OUT/faults.log" 2>&1 || frc=$?
		grep -E '^(FAULT|LOAD|--- |PASS|FAIL|ok)|_test.go' "$B2B_OUT/faults.log" || true
		echo "$frc" >"$B2B_OUT/faults.rc"
		[ "$frc" = 0 ] || log "fault and load cases FAILED (rc $frc; $B2B_OUT/faults.log)"
	else
		echo skipped >"$B2B_OUT/faults.rc"
	fi
fi

# ---- 2b. the chaos soak's two-host form over verbs (A, against B's daemon; docs/soak.md) -------------------------
if [ "$B2B_ROLE" = a ]; then
	if [ "${SOAK:-0}" = 1 ]; then
		deadline=$((SECONDS + 300))
		until (exec 3<>"/dev/tcp/$B2B_PEER_IP/7480") 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; do sleep 0.3; done
		log "chaos soak over verbs for $SOAK_DURATION (b2b-soak --remote-api $B2B_PEER_IP:7480)"
		src=0
		# shellcheck disable=SC2086 # SOAK_ARGS: word splitting wanted
		"$SOAK_BIN" --b2bd "$B2BD" --remote-api "$B2B_PEER_IP:7480" --self "$B2B_SELF_IP" --transport verbs --rdma-device "$dev" \
			--netdev eth0 --neigh "$B2B_PEER_IP=$peer_mac" --tls-cert "$certs/a.pem" --tls-key "$certs/a-key.pem" --tls-ca "$certs/ca.pem" \
			--duration "$SOAK_DURATION" --json "$B2B_OUT/soak-verbs.json" --keep $SOAK_ARGS >"$B2B_OUT/soak-verbs.log" 2>&1 || src=$?
		# The local daemons' logs (--keep leaves them in the state directory the report names).
		sd=$(sed -n 's/.*"state_dir": "\(.*\)".*/\1/p' "$B2B_OUT/soak-verbs.json" 2>/dev/null | head -n 1)
		if [ -n "$sd" ]; then
			for f in "$sd"/*.log; do [ -f "$f" ] && cp "$f" "$B2B_OUT/soak-daemon-${f##*/}"; done
			rm -rf "$sd"
		fi
		tail -n 1 "$B2B_OUT/soak-verbs.log" || true
		echo "$src" >"$B2B_OUT/soak.rc"
		[ "$src" = 0 ] || log "chaos soak over verbs FAILED (rc $src; $B2B_OUT/soak-verbs.log)"
	else
		echo skipped >"$B2B_OUT/soak.rc"
	fi
fi

# ---- 3. daemons ---------------------------------------------------------------------------------------------
# --calibrate off: the peer is the other VM, for which auto goes by rank; the
# same-host calibration would only load this VM's one emulated CPU.
daemon_args=(--node-name "$B2B_ROLE" --socket /run/b2bd.sock --shm-dir /dev/shm/b2bd --calibrate off
	--peer-listen "$B2B_SELF_IP:7470" --data-listen "$B2B_SELF_IP:7471" --transport auto --log-level warn
	--tls-cert "$certs/$B2B_ROLE.pem" --tls-key "$certs/$B2B_ROLE-key.pem" --tls-ca "$certs/ca.pem")
# Each API is also served over mutual TLS on the wire: B's for A's fault cases, A's for B's bench.
daemon_args+=(--api-listen "$B2B_SELF_IP:7480")
# The verbs flags exist once the daemon has the verbs transport wired in.
daemon_args+=(--rdma-device "$dev")
# shellcheck disable=SC2206 # word splitting wanted
[ -n "${DAEMON_ARGS:-}" ] && daemon_args+=($DAEMON_ARGS)
log "starting b2bd ${daemon_args[*]}"
"$B2BD" "${daemon_args[@]}" >"$B2B_OUT/b2bd-$B2B_ROLE.log" 2>&1 &
dpid=$!
# shellcheck disable=SC2317 # called from traps
stop_daemon() {
	kill "$dpid" 2>/dev/null || true
	wait "$dpid" 2>/dev/null || true
}
trap stop_daemon EXIT
wait_port() { # wait_port HOST PORT SECONDS
	local deadline=$((SECONDS + $3))
	until (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; do
		kill -0 "$dpid" 2>/dev/null || {
			log "b2bd exited: $(tail -n 5 "$B2B_OUT/b2bd-$B2B_ROLE.log")"
			return 1
		}
		[ "$SECONDS" -ge "$deadline" ] && return 1
		sleep 0.3
	done
}
wait_port "$B2B_SELF_IP" 7470 60 || {
	log "b2bd did not come up"
	exit 1
}

if [ "$B2B_ROLE" = a ]; then
	# ib_write_bw servers in the order B asks for them (section 4), in the background; here, until B's bench
	# is done, a 1 Hz check (uniform over ib_write_bw's runs and the bench's, so it costs both alike).
	if [ "$READ" = 1 ] && [ "$READ_DRIVER" = harness ]; then
		# The READ harness's source: its region and read key, served to each of B's sinks. The region holds the
		# biggest batch with a quarter to spare (its blocks take random slots), at least 32 MiB.
		read_region=$((32 << 20))
		for k in "${!sizes[@]}"; do
			b=$((sizes[k] * blocks[k] * 5 / 4 + (1 << 20)))
			[ "$b" -gt "$read_region" ] && read_region=$b
		done
		B2B_READ_SOURCE=1 B2B_READ_REGION="$read_region" B2B_RDMA_DEV="$dev" "$VERBS_TEST" -test.run '^TestHWReadSource$' -test.v -test.timeout 7200s \
			>"$B2B_OUT/read-source.log" 2>&1 &
		read_source=$!
	fi
	(
		port=18515
		for k in "${!sizes[@]}"; do
			for ((rep = 1; rep <= REPS; rep++)); do
				for variant in $(round_variants "$rep"); do
					pt_tool=ib_write_bw perftest_server "${sizes[$k]}" "${blocks[$k]}" "$variant" "$port"
					port=$((port + 1))
				done
				[ "$READ" = 1 ] || continue
				for variant in $(round_variants "$rep"); do
					pt_tool=ib_read_bw perftest_server "${sizes[$k]}" "${blocks[$k]}" "$variant" "$port"
					port=$((port + 1))
				done
			done
		done
	) &
	servers=$!
	deadline=$((SECONDS + 7200))
	until [ -e "$B2B_OUT/bench.done" ] || [ "$SECONDS" -ge "$deadline" ]; do
		kill -0 "$dpid" 2>/dev/null || {
			log "b2bd died: $(tail -n 5 "$B2B_OUT/b2bd-a.log")"
			exit 1
		}
		sleep 1
	done
	# B is done: a server still waiting (B failed early) goes; timeout passes the TERM on to ib_write_bw.
	kill "$servers" 2>/dev/null || true
	[ -f /tmp/b2b-perftest-server.pid ] && kill "$(cat /tmp/b2b-perftest-server.pid)" 2>/dev/null || true
	wait "$servers" 2>/dev/null || true
	if [ -n "${read_source:-}" ]; then
		kill "$read_source" 2>/dev/null || true # B told it "done"; this only catches a B that failed early
		wait "$read_source" 2>/dev/null || true
	fi
	log "bench done; stopping"
	[ "$(cat "$B2B_OUT/faults.rc")" = 0 ] || [ "$(cat "$B2B_OUT/faults.rc")" = skipped ]
	exit $?
fi

# ---- 4. bench (B) -------------------------------------------------------------------------------------------
trap 'touch "$B2B_OUT/bench.done"; stop_daemon' EXIT
# A's fault cases use this daemon first; A's own daemon comes up after them.
deadline=$((SECONDS + FAULT_TIMEOUT + 60))
until [ -e "$B2B_OUT/faults.rc" ] || [ "$SECONDS" -ge "$deadline" ]; do sleep 0.5; done
# Then A's chaos soak (section 2b), which uses this daemon too.
deadline=$((SECONDS + 1800))
until [ -e "$B2B_OUT/soak.rc" ] || [ "${SOAK:-0}" != 1 ] || [ "$SECONDS" -ge "$deadline" ]; do sleep 0.5; done
wait_port "$B2B_PEER_IP" 7480 120 || {
	log "the destination daemon's API never answered"
	exit 1
}
# The destination's API is only served off its host over mutual TLS: B's certificate opens it.
tls=(--tls-cert "$certs/b.pem" --tls-key "$certs/b-key.pem" --tls-ca "$certs/ca.pem")
rc=0

# ---- 4a. end-to-end over verbs: verified transfers and the bad inputs that apply to verbs ---------------
if [ "${E2E_TESTS:-1}" = 1 ] && [ -x "${E2E:-}" ]; then
	log "e2e tests over verbs"
	B2B_E2E_SRC_API=unix:///run/b2bd.sock B2B_E2E_DST_API="$B2B_PEER_IP:7480" B2B_E2E_DST_PEER="$B2B_PEER_IP:7470" \
		B2B_E2E_TLS_CERT="$certs/b.pem" B2B_E2E_TLS_KEY="$certs/b-key.pem" B2B_E2E_TLS_CA="$certs/ca.pem" \
		B2B_E2E_CANCEL_N="${CANCEL_N:-1000}" B2B_E2E_PULL_LOAD="${PULL_LOAD:-32x30}" \
		B2B_E2E_B2BD="$B2BD" B2B_E2E_SELF="$B2B_SELF_IP" B2B_E2E_RDMA_DEV="$dev" \
		"$E2E" -test.run "${E2E_RUN:-^(TestRemote|TestRemoteBlocks|TestRemoteRevoke|TestRemoteDeadline|TestRemoteCancelUnderLoad|TestRemoteDeregisterUnderBatches|TestRemotePull(Trust|Faults|Load|Deadline))\$}" -test.count "${E2E_COUNT:-1}" -test.v -test.timeout 600s 2>&1 | tee "$B2B_OUT/e2e.log" | grep -E '^(=== RUN|--- |PASS|FAIL|ok)|_test.go' || true
	grep -q '^PASS' "$B2B_OUT/e2e.log" || { log "e2e over verbs FAILED"; rc=1; }
fi
# Per size, REPS mirrored rounds (odd: ib_write_bw default, tuned, bench; even: bench, tuned, default).
# test-rdma.sh takes each bench against the two ib_write_bw runs of its own round (their median and spread
# over the rounds). The bench runs its default modes (MODES empty): ad hoc and prepared up to 64 KiB, ad hoc
# above.
bench_args=()
[ -n "$MODES" ] && bench_args+=(--mode "$MODES")
# rxe's port counters around each run (B, the sender): data packets sent, acks received, and the requester's
# retransmissions (completer_retry_err) and NAKs (rcvd_seq_err, rcvd_rnr_err), so a slow round shows whether the
# wire lost packets. Written as one line per run to counters.log; only counters that moved.
hwc=/sys/class/infiniband/$dev/ports/1/hw_counters
declare -A snap_prev=() snap_cur=()
snap() { # the counters now in snap_cur, the previous snap in snap_prev (no forks: the VM is emulated)
	local f v k
	snap_prev=()
	for k in "${!snap_cur[@]}"; do snap_prev[$k]=${snap_cur[$k]}; done
	for f in "$hwc"/*; do read -r v 2>/dev/null <"$f" && snap_cur[${f##*/}]=$v; done
	return 0 # a device without counters is not a failure
}
counters() { # counters LABEL: the moves since the last snap, one line appended to counters.log
	local k out=""
	snap
	for k in "${!snap_cur[@]}"; do
		[ -n "${snap_prev[$k]:-}" ] && [ "${snap_cur[$k]}" != "${snap_prev[$k]}" ] && out+=" $k=+$((snap_cur[$k] - snap_prev[$k]))"
	done
	printf '%s%s\n' "$1" "$out" >>"$B2B_OUT/counters.log"
}
run_bench() { # of size $s, $n blocks, round $rep
	log "bench size=$s blocks=$n round=$rep"
	snap
	"$BENCH" --src-api unix:///run/b2bd.sock --dst-api "$B2B_PEER_IP:7480" --dst-peer "$B2B_PEER_IP:7470" "${tls[@]}" \
		--transport verbs --sizes "$s" --blocks "$n" --full --iters "$ITERS" --timeout 300s "${bench_args[@]}" \
		--yardstick none --ping-calls 20 --json "$B2B_OUT/bench-$s-r$rep.json" 2>&1 || rc=1
	counters "bench size=$s round=$rep"
}
run_read() { # b2bd READ of size $s, $n blocks, round $rep (see READ_DRIVER)
	log "read size=$s blocks=$n round=$rep"
	snap
	if [ "$READ_DRIVER" = bench ]; then
		# The daemons' pull: b2b-bench --op read writes its usual JSON (rows carry op).
		"$BENCH" --src-api unix:///run/b2bd.sock --dst-api "$B2B_PEER_IP:7480" --dst-peer "$B2B_PEER_IP:7470" "${tls[@]}" \
			--transport verbs --sizes "$s" --blocks "$n" --full --iters "$ITERS" --timeout 300s --mode adhoc --op read \
			--yardstick none --ping-calls 20 --json "$B2B_OUT/read-$s-r$rep.json" 2>&1 || rc=1
	else
		B2B_READ_SINK=1 B2B_RDMA_DEV="$dev" B2B_READ_SIZE="$s" B2B_READ_BLOCKS="$n" B2B_READ_ITERS="$ITERS" \
			B2B_READ_JSON="$B2B_OUT/read-$s-r$rep.json" "$VERBS_TEST" -test.run '^TestHWReadSink$' -test.v -test.timeout 600s \
			>>"$B2B_OUT/read-sink.log" 2>&1 || rc=1
	fi
	counters "bench-read size=$s round=$rep"
}
perftest_round() { # perftest_round TOOL OP: the round's default and tuned runs of TOOL, results as perftest-OP-...
	local tool=$1 op=$2 variant g rate
	for variant in $(round_variants "$rep"); do
		snap
		g=$(pt_tool=$tool perftest_client "$s" "$n" "$variant" "$port")
		counters "perftest-$op $variant size=$s round=$rep"
		log "$tool $variant size=$s round=$rep $g GB/s"
		# A failed run (0) is left out: the bench then has nothing to compare with in that round.
		rate="\"$s\": $g"
		[ "$g" = 0.000000 ] && rate=""
		printf '{"run": "%s %s, round %d", "gbps": {%s}}\n' "$tool" "$variant" "$rep" "$rate" >"$B2B_OUT/$3-$variant-$s-r$rep.json"
		port=$((port + 1))
	done
}
port=18515
t0=$SECONDS
for k in "${!sizes[@]}"; do
	s=${sizes[$k]} n=${blocks[$k]}
	for ((rep = 1; rep <= REPS; rep++)); do
		if ((rep % 2 == 0)); then run_bench; fi
		perftest_round ib_write_bw write perftest
		if ((rep % 2)); then run_bench; fi
		[ "$READ" = 1 ] || continue
		# The same round's READ triple, mirrored as the WRITE one.
		if ((rep % 2 == 0)); then run_read; fi
		perftest_round ib_read_bw read perftest-read
		if ((rep % 2)); then run_read; fi
	done
done
if [ "$READ" = 1 ] && [ "$READ_DRIVER" = harness ]; then
	B2B_READ_SINK=1 B2B_READ_DONE=1 B2B_RDMA_DEV="$dev" B2B_READ_JSON=/dev/null "$VERBS_TEST" -test.run '^TestHWReadSink$' \
		>>"$B2B_OUT/read-sink.log" 2>&1 || log "could not tell the READ source the comparison is over"
fi
log "comparison (ib_write_bw and bench, ${#sizes[@]} sizes x $REPS rounds) took $((SECONDS - t0)) s"
echo "$((SECONDS - t0))" >"$B2B_OUT/comparison.seconds"

# ---- 4b. a KV request over verbs: descriptors against block ids, every block of every segment verified ----
if [ "${KV:-1}" = 1 ]; then
	read -r -a kv_args <<<"$KV_ARGS"
	log "bench --workload kv ${kv_args[*]}"
	"$BENCH" --src-api unix:///run/b2bd.sock --dst-api "$B2B_PEER_IP:7480" --dst-peer "$B2B_PEER_IP:7470" "${tls[@]}" \
		--transport verbs --workload kv "${kv_args[@]}" --timeout 300s --json "$B2B_OUT/bench-kv.json" >"$B2B_OUT/bench-kv.txt" 2>&1 || {
		log "bench --workload kv FAILED"
		rc=1
	}
fi
exit $rc
