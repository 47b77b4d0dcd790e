#!/usr/bin/env bash
# doctor-vm.sh - runs `b2bd doctor` in both testbed VMs (Soft-RoCE rxe0 on eth0, RDMA up), then B's doctor
# checks A as a peer over mutual TLS, with a verified round trip through both daemons.
#
# On the host (it builds b2bd for the VMs, makes certificates, and boots the pair):
#   flock /work/testbed.lock deploy/rdma-testbed/doctor-vm.sh [--out DIR] [run-pair.sh options...]
# Output in DIR (default $B2B_TESTBED_CACHE/doctor/<time>):
#   doctor-a.json doctor-b.json   `b2bd doctor --json --rdma-netdev eth0` in each VM (and .rc: its exit status)
#   doctor-a.txt  doctor-b.txt    the same checks as text
#   doctor-peer.txt (.rc)         B: `b2bd doctor --peer 10.77.0.1:7470 --peer-api 10.77.0.1:7480 ...`
#   a.log b.log ...               run-pair.sh's logs and consoles
# In the VMs (run-pair.sh runs this same file there, with B2B_ROLE set) each VM starts a daemon with
# --transport auto on rxe0; A serves until B is done.
# Exit status: 0 when no doctor run reported a failing check; the per-run .rc files say which did.
set -euo pipefail
HERE=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

if [ -z "${B2B_ROLE:-}" ]; then
	# ---- host side ------------------------------------------------------------------------------------------
	CACHE=${B2B_TESTBED_CACHE:-$REPO/.cache/rdma-testbed}
	OUT="" pass=()
	while [ $# -gt 0 ]; do
		case $1 in
		--out) OUT=${2:?}; shift 2 ;;
		--out=*) OUT=${1#*=}; shift ;;
		*) pass+=("$1"); shift ;;
		esac
	done
	OUT=${OUT:-$CACHE/doctor/$(date +%Y%m%d-%H%M%S)}
	mkdir -p "$OUT/bin"
	OUT=$(cd "$OUT" && pwd -P)
	rm -f "$OUT"/doctor-*.{json,txt,rc} # A stops when B's doctor-peer.rc appears: never a stale one
	echo "[doctor-vm] building b2bd (cgo, GOAMD64=v1 for the VMs' qemu64 CPU) into $OUT/bin" >&2
	(cd "$REPO" && CGO_ENABLED=1 GOAMD64=v1 go build -o "$OUT/bin/" ./cmd/b2bd)
	"$REPO/deploy/scripts/certs.sh" "$OUT/certs" a=10.77.0.1 b=10.77.0.2 >/dev/null
	rc=0
	"$HERE/run-pair.sh" "$HERE/doctor-vm.sh" "$HERE/doctor-vm.sh" --out "$OUT" --timeout 600 "${pass[@]}" || rc=$?
	for f in doctor-a.txt doctor-b.txt doctor-peer.txt; do
		[ -f "$OUT/$f" ] || continue
		echo "==== $f (exit status $(cat "$OUT/${f%.txt}.rc" 2>/dev/null || echo '?'))"
		cat "$OUT/$f"
	done
	echo "[doctor-vm] JSON reports: $OUT/doctor-a.json $OUT/doctor-b.json" >&2
	[ "$rc" = 0 ] || echo "[doctor-vm] run-pair.sh exit status $rc" >&2
	exit "$rc"
fi

# ---- in a VM --------------------------------------------------------------------------------------------------
: "${B2B_OUT:?}" "${B2B_SELF_IP:?}" "${B2B_PEER_IP:?}"
B2BD=$B2B_OUT/bin/b2bd
certs=$B2B_OUT/certs
dev=${B2B_RDMA_DEV:-rxe0}
log() { printf '[doctor-vm %s] %s\n' "$B2B_ROLE" "$*"; }

# The daemon, for the peer checks (A: the peer; B: the local end of the round trip).
"$B2BD" --node-name "$B2B_ROLE" --socket /run/b2bd.sock --shm-dir /dev/shm/b2bd \
	--peer-listen "$B2B_SELF_IP:7470" --data-listen "$B2B_SELF_IP:7471" --api-listen "$B2B_SELF_IP:7480" \
	--transport auto --calibrate off --rdma-device "$dev" --rdma-netdev eth0 --log-level warn \
	--tls-cert "$certs/$B2B_ROLE.pem" --tls-key "$certs/$B2B_ROLE-key.pem" --tls-ca "$certs/ca.pem" \
	>"$B2B_OUT/b2bd-$B2B_ROLE.log" 2>&1 &
dpid=$!
trap 'kill "$dpid" 2>/dev/null || true; wait "$dpid" 2>/dev/null || true' EXIT
wait_port() { # wait_port HOST PORT SECONDS
	local deadline=$((SECONDS + $3))
	until (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; do
		[ "$SECONDS" -lt "$deadline" ] || return 1
		sleep 0.3
	done
}
wait_port "$B2B_SELF_IP" 7470 60 || log "own daemon did not come up: $(tail -n 5 "$B2B_OUT/b2bd-$B2B_ROLE.log")"

# Host checks, as JSON and as text (the same checks run twice; the text is for people).
rc=0
"$B2BD" doctor --json --rdma-netdev eth0 --shm-dir /dev/shm/b2bd >"$B2B_OUT/doctor-$B2B_ROLE.json" || rc=$?
echo "$rc" >"$B2B_OUT/doctor-$B2B_ROLE.rc"
"$B2BD" doctor --rdma-netdev eth0 --shm-dir /dev/shm/b2bd >"$B2B_OUT/doctor-$B2B_ROLE.txt" || true
log "host checks exit status $rc"
cat "$B2B_OUT/doctor-$B2B_ROLE.txt"

if [ "$B2B_ROLE" = a ]; then
	deadline=$((SECONDS + 400))
	until [ -e "$B2B_OUT/doctor-peer.rc" ] || [ "$SECONDS" -ge "$deadline" ]; do sleep 0.5; done
	exit "$rc"
fi

# B: A as a peer: reachability, TLS trust, transports, and a round trip registered through A's API.
prc=0
if wait_port "$B2B_PEER_IP" 7480 300; then
	"$B2BD" doctor --rdma-netdev eth0 --shm-dir /dev/shm/b2bd --timeout 30s \
		--peer "$B2B_PEER_IP:7470" --socket /run/b2bd.sock --peer-api "$B2B_PEER_IP:7480" \
		--tls-cert "$certs/b.pem" --tls-key "$certs/b-key.pem" --tls-ca "$certs/ca.pem" >"$B2B_OUT/doctor-peer.txt" 2>&1 || prc=$?
else
	echo "A's daemon API never answered" >"$B2B_OUT/doctor-peer.txt"
	prc=1
fi
echo "$prc" >"$B2B_OUT/doctor-peer.rc"
log "peer checks exit status $prc"
cat "$B2B_OUT/doctor-peer.txt"
[ "$rc" = 0 ] && [ "$prc" = 0 ]
