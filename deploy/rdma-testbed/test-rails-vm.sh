#!/bin/bash
# test-rails-vm.sh - runs in both VMs of test-rails.sh (run-pair.sh --wires 2: rxe0 on eth0, rxe1 on eth1).
#   B (10.77.0.2): the destination b2bd over both rails (--rdma-device rxe0,rxe1), API on 10.77.0.2:7480;
#                  stops once A wrote $B2B_OUT/a.done.
#   A (10.77.0.1): two source daemons, one over both rails and one over rxe0 only (the sweep's yardstick),
#                  then the trials (internal/transport/verbs/rails/railvm: affinity, striping, one wire pulled, both
#                  wires pulled, the sweep); the wires are pulled here in A (the netdev taken down with one ioctl).
set -euo pipefail
: "${B2B_ROLE:?run me through run-pair.sh}" "${B2B_OUT:?}" "${B2B_RDMA_DEV2:?run-pair.sh --wires 2}"
# shellcheck source=/dev/null
. "$B2B_OUT/params.env"
log() { printf '[vm %s %s] %s\n' "$B2B_ROLE" "$(date +%T)" "$*"; }
certs=$B2B_OUT/certs
tls=(--tls-cert "$certs/$B2B_ROLE.pem" --tls-key "$certs/$B2B_ROLE-key.pem" --tls-ca "$certs/ca.pem")
pids=()
# shellcheck disable=SC2317 # called from the trap
stop() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap stop EXIT
daemon() { # daemon NAME ARGS...
	local name=$1
	shift
	log "starting b2bd $name: $*"
	"$B2BD" --node-name "$name" --socket "/run/b2bd-$name.sock" --shm-dir "/dev/shm/b2bd-$name" --transport verbs \
		--log-level info "${tls[@]}" "$@" >"$B2B_OUT/b2bd-$name.log" 2>&1 &
	pids+=($!)
}
wait_port() { # wait_port HOST PORT SECONDS
	local deadline=$((SECONDS + $3))
	until (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; do
		[ "$SECONDS" -ge "$deadline" ] && return 1
		sleep 0.3
	done
}
log "devices: $(ls /sys/class/infiniband | tr '\n' ' ')"
for d in /sys/class/infiniband/*; do
	log "$(basename "$d"): $(cat "$d/ports/1/state"), parent $(cat "$d/parent" 2>/dev/null), sysfs $(readlink -f "/sys/class/net/$(cat "$d/parent" 2>/dev/null)/device" 2>/dev/null), numa $(cat "$(readlink -f "/sys/class/net/$(cat "$d/parent")/device")/../numa_node" 2>/dev/null)"
done

if [ "$B2B_ROLE" = b ]; then
	daemon b --peer-listen "$B2B_SELF_IP:7470" --data-listen "$B2B_SELF_IP:7471" --api-listen "$B2B_SELF_IP:7480" \
		--rdma-device "$B2B_RDMA_DEV,$B2B_RDMA_DEV2" ${DAEMON_ARGS:-}
	wait_port "$B2B_SELF_IP" 7480 120 || { log "b2bd b did not come up"; exit 1; }
	log "b2bd b up; waiting for A's trials"
	deadline=$((SECONDS + ${VM_TIMEOUT:-2400}))
	until [ -e "$B2B_OUT/a.done" ] || [ "$SECONDS" -ge "$deadline" ]; do
		kill -0 "${pids[0]}" 2>/dev/null || { log "b2bd b died: $(tail -n 5 "$B2B_OUT/b2bd-b.log")"; exit 1; }
		sleep 1
	done
	grep -E 'rail|Rail' "$B2B_OUT/b2bd-b.log" | head -n 40 || true
	exit 0
fi

rc=0
daemon a2 --peer-listen "$B2B_SELF_IP:7470" --data-listen "$B2B_SELF_IP:7471" --rdma-device "$B2B_RDMA_DEV,$B2B_RDMA_DEV2" ${DAEMON_ARGS:-}
daemon a1 --peer-listen "$B2B_SELF_IP:7570" --data-listen "$B2B_SELF_IP:7571" --rdma-device "$B2B_RDMA_DEV" ${DAEMON_ARGS:-}
# The slice policy's alternative: two rails with half the QPs each (as many QPs in flight as one rail).
daemon a3 --peer-listen "$B2B_SELF_IP:7670" --data-listen "$B2B_SELF_IP:7671" --rdma-device "$B2B_RDMA_DEV,$B2B_RDMA_DEV2" --qps-per-peer 2 ${DAEMON_ARGS:-}
{ wait_port "$B2B_SELF_IP" 7470 120 && wait_port "$B2B_SELF_IP" 7570 120 && wait_port "$B2B_SELF_IP" 7670 120; } || {
	log "local daemons did not come up: $(tail -n 5 "$B2B_OUT"/b2bd-a*.log)"
	touch "$B2B_OUT/a.done"
	exit 1
}
wait_port "$B2B_PEER_IP" 7480 300 || { log "b2bd b not reachable"; touch "$B2B_OUT/a.done"; exit 1; }
log "trials: $RAILS_RUN"
B2B_RAILS_A2=/run/b2bd-a2.sock B2B_RAILS_A1=/run/b2bd-a1.sock B2B_RAILS_A3=/run/b2bd-a3.sock B2B_RAILS_B_API="$B2B_PEER_IP:7480" \
	B2B_RAILS_B_PEER="$B2B_PEER_IP:7470" B2B_RAILS_SIZES="$SIZES" \
	B2B_E2E_TLS_CERT="$certs/a.pem" B2B_E2E_TLS_KEY="$certs/a-key.pem" B2B_E2E_TLS_CA="$certs/ca.pem" \
	"$RAILVM" -test.run "$RAILS_RUN" -test.v -test.timeout "${VM_TIMEOUT:-2400}s" >"$B2B_OUT/rails.log" 2>&1 || rc=$?
grep -E 'RAILS|^(--- |PASS|FAIL|ok)|_test.go' "$B2B_OUT/rails.log" || true
log "the daemon's affinity choice (b2bd a2):"
grep -E 'rail ready|rails chosen|rails connected|rail down|rail failed|rail back|port not ACTIVE|port ACTIVE' "$B2B_OUT/b2bd-a2.log" | head -n 60 || true
echo "$rc" >"$B2B_OUT/rails.rc"
touch "$B2B_OUT/a.done"
exit "$rc"
