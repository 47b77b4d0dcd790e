#!/usr/bin/env bash
# test-rails.sh - two RDMA devices per host (rails) on the Soft-RoCE testbed: run-pair.sh --wires 2 gives each
# VM rxe0 on eth0 (10.77.0.0/24) and rxe1 on eth1 (10.78.0.0/24), two virtual wires. Called by test-rdma.sh
# (`make test-rdma`); runs alone as well:
#
#   deploy/rdma-testbed/test-rails.sh
#
# Trials (internal/transport/verbs/rails/railvm, in VM A against VM B's daemon over both rails):
#   affinity        the rails each daemon ranked for its regions from the VMs' own sysfs, as logged and listed
#   stripe          batches striped over both rails, every block verified (CRC32C per block, both sides)
#   pull-one-wire   eth1 taken down mid-batch: the batch completes on rxe0 and verifies; the failover is counted
#   pull-both-wires eth0 and eth1 down mid-batch: the error code and its time against the deadline (30 s)
#   sweep           per block size, the same batch through a one-rail daemon and the two-rail one (best of 3,
#                   verified): GB/s each and the ratio two / one
# Knobs: B2B_RAILS_SIZES (default 4096,65536,262144,1048576,2097152), B2B_RAILS_RUN (test filter, default
# TestRails), B2B_RAILS_TIMEOUT (2400 s), B2B_RAILS_DAEMON_ARGS, B2B_RAILS_OUT, B2B_RDMA_B2BD (prebuilt b2bd).
# Exit status: 0 when every trial passed.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${B2B_TESTBED_CACHE:-$REPO/.cache/rdma-testbed}
SIZES=${B2B_RAILS_SIZES:-4096,65536,262144,1048576,2097152}
TIMEOUT=${B2B_RAILS_TIMEOUT:-2400}
OUT=${B2B_RAILS_OUT:-$CACHE/test-rails/$(date +%Y%m%d-%H%M%S)}
say() { printf '[test-rails] %s\n' "$*" >&2; }
die() {
	say "ERROR: $*"
	exit 1
}
mkdir -p "$OUT/bin" "$OUT/run"
OUT=$(cd "$OUT" && pwd -P)
"$REPO/deploy/scripts/certs.sh" "$OUT/run/certs" a=10.77.0.1 b=10.77.0.2 >/dev/null || die "certs.sh failed"
say "building b2bd and the trials (cgo, GOAMD64=v1 for the VMs' qemu64)"
if [ -n "${B2B_RDMA_B2BD:-}" ]; then
	cp "$(readlink -f "$B2B_RDMA_B2BD")" "$OUT/bin/b2bd" || die "copy $B2B_RDMA_B2BD"
else
	(cd "$REPO" && CGO_ENABLED=1 GOAMD64=v1 go build -o "$OUT/bin/" ./cmd/b2bd) || die "build failed"
fi
(cd "$REPO" && CGO_ENABLED=1 GOAMD64=v1 go test -c -o "$OUT/bin/railvm.test" ./internal/transport/verbs/rails/railvm) || die "build of the trials failed"
cat >"$OUT/run/params.env" <<EOT
B2BD=$OUT/bin/b2bd
RAILVM=$OUT/bin/railvm.test
SIZES=$SIZES
RAILS_RUN=${B2B_RAILS_RUN:-TestRails}
DAEMON_ARGS="${B2B_RAILS_DAEMON_ARGS:-}"
VM_TIMEOUT=$((TIMEOUT - 120))
EOT
rc=0
B2B_TESTBED_QUIET=${B2B_TESTBED_QUIET:-1} "$HERE/run-pair.sh" "$HERE/test-rails-vm.sh" "$HERE/test-rails-vm.sh" \
	--wires 2 --out "$OUT/run" --timeout "$TIMEOUT" --grace 30 || rc=$?
echo "== rails (two RDMA devices per VM, two wires) =="
grep -hE 'RAILS|rails chosen|rail ready' "$OUT/run/rails.log" "$OUT/run/b2bd-a2.log" "$OUT/run/b2bd-b.log" 2>/dev/null |
	sed -E 's/^ +//' || true
if [ -f "$OUT/run/rails-sweep.json" ]; then
	python3 - "$OUT/run/rails-sweep.json" <<'EOT' || true
import json, sys
rows = json.load(open(sys.argv[1]))
print("%10s %7s %14s %15s %7s %22s %7s" % ("block", "blocks", "1 rail GB/s", "2 rails GB/s", "ratio", "2 rails, 2 QPs GB/s", "ratio"))
for r in rows:
    print("%10d %7d %14.4f %15.4f %6.2fx %22.4f %6.2fx" % (r["size"], r["blocks"], r["one_rail_gbps"], r["two_rails_gbps"], r["ratio"],
          r.get("two_rails_half_qps_gbps", 0), r.get("ratio_half_qps", 0)))
print("same run, same VMs, every block verified; emulated hardware: compare the ratios only")
EOT
fi
[ "$(cat "$OUT/run/rails.rc" 2>/dev/null)" = 0 ] || rc=1
if [ "$rc" != 0 ]; then
	grep -E -- '--- FAIL|_test.go:[0-9]+' "$OUT/run/rails.log" 2>/dev/null | head -n 20 || true
	for r in a b; do
		[ -f "$OUT/run/$r.log" ] && { echo "----- VM ${r^^} log -----"; tail -n 40 "$OUT/run/$r.log"; }
	done
	say "FAIL (output: $OUT)"
	exit 1
fi
say "PASS (output: $OUT)"
