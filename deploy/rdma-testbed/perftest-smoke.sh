#!/bin/bash
# perftest-smoke.sh - runs in both VMs of run-pair.sh (role from B2B_ROLE): ib_write_bw server in A,
# client in B, over rxe0 with the RoCE v2 IPv4 GID, for a couple of message sizes.
#
#   deploy/rdma-testbed/run-pair.sh "$PWD/deploy/rdma-testbed/perftest-smoke.sh" \
#                                   "$PWD/deploy/rdma-testbed/perftest-smoke.sh"
#
# Knobs: B2B_SMOKE_TESTS="SIZE:ITERS ..." (default "4096:2000 65536:1000"). Each test uses its own TCP port
# (18515, 18516, ...) for perftest's out-of-band exchange, so a client can never reach the previous
# test's server. B retries its client until A's server answers (B2B_SMOKE_CONNECT_WAIT, default 180 s per
# test: A may boot much later than B on a busy host).
set -euo pipefail
HERE=$(dirname "$(readlink -f "$0")")
: "${B2B_ROLE:?run me through run-pair.sh}" "${B2B_PEER_IP:?}" "${B2B_SELF_IP:?}"
dev=${B2B_RDMA_DEV:-rxe0}
tests=${B2B_SMOKE_TESTS:-4096:2000 65536:1000}

gid=$("$HERE/gid-index.sh" "$dev" 1 "$B2B_SELF_IP")
echo "smoke: role=$B2B_ROLE dev=$dev gid_index=$gid ($(cat "/sys/class/infiniband/$dev/ports/1/gids/$gid"))"
ibv_devinfo -d "$dev" | grep -E 'state|active_mtu|link_layer' || true

port=18515
for t in $tests; do
	size=${t%%:*} iters=${t#*:}
	args=(-d "$dev" -i 1 -x "$gid" -F -s "$size" -n "$iters" -p "$port")
	case $B2B_ROLE in
	a)
		echo "smoke: server ib_write_bw ${args[*]}"
		ib_write_bw "${args[@]}"
		;;
	b)
		echo "smoke: client ib_write_bw ${args[*]} $B2B_PEER_IP"
		deadline=$((SECONDS + ${B2B_SMOKE_CONNECT_WAIT:-180}))
		while :; do
			rc=0
			out=$(ib_write_bw "${args[@]}" "$B2B_PEER_IP" 2>&1) || rc=$?
			# Connection refused: the server is not up yet (still booting or finishing the previous test).
			if [ "$rc" != 0 ] && grep -q "Couldn't connect" <<<"$out" && [ "$SECONDS" -lt "$deadline" ]; then
				sleep 0.3
				continue
			fi
			echo "$out"
			[ "$rc" = 0 ] || exit "$rc"
			bw=$(awk '$1 ~ /^[0-9]+$/ && NF >= 5 { print }' <<<"$out" | tail -n 1)
			[ -n "$bw" ] || {
				echo "smoke: no result line from ib_write_bw" >&2
				exit 1
			}
			read -r _ _ peak avg rate <<<"$bw"
			echo "smoke: RESULT size=$size iters=$iters bw_avg=${avg}MB/s bw_peak=${peak}MB/s msg_rate=${rate}Mpps"
			echo "$size $iters $avg $rate" >>"$B2B_OUT/smoke-results.txt"
			break
		done
		;;
	*)
		echo "smoke: unknown role $B2B_ROLE" >&2
		exit 2
		;;
	esac
	port=$((port + 1))
done
echo "smoke: $B2B_ROLE done"
