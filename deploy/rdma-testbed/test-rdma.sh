#!/usr/bin/env bash
# test-rdma.sh - the RDMA end-to-end check (`make test-rdma`, CI on every change).
#
# Boots the two-VM Soft-RoCE testbed (run-pair.sh) and, over rxe0 between the VMs:
#   1. ib_write_bw (perftest) for each block size with an iteration count matching the blocks: default
#      options, and a tuned run (-q 4 --post_list 32);
#   2. b2bd in each VM with --transport verbs (A = destination 10.77.0.1, B = source 10.77.0.2);
#   3. b2b-bench in B, two-host mode, one batch of N blocks per size (every block verified by the bench);
# then prints per size: b2bd GB/s, perftest GB/s (default and tuned) and the ratio b2bd / best perftest.
# Absolute numbers are those of an emulated machine (TCG, 1 vCPU per VM); only the ratios mean something.
#
#   deploy/rdma-testbed/test-rdma.sh
#
# Knobs (environment):
#   B2B_RDMA_SIZES        block sizes (default every power of two from 128 B to 2 MiB)
#   B2B_RDMA_MAX_BLOCKS   blocks per batch for small blocks (default 2000)
#   B2B_RDMA_BATCH_BYTES  bytes per batch cap that sets the block count of big blocks (default 16 MiB)
#   B2B_RDMA_MIN_BLOCKS   blocks per batch at least (default 4)
#   B2B_RDMA_ITERS        timed batches per size (default 3)
#   B2B_RDMA_FAULTS       1 (default) runs the fault and load cases (TestRemoteFaults) in A before the bench; 0 skips
#   B2B_RDMA_FAULT_TRANSPORTS  transports they cover (default verbs,tcp)
#   B2B_RDMA_FAULT_TRIALS peer-kill trials per transport (default 10)
#   B2B_RDMA_FAULT_LOAD   load run, CLIENTSxBATCHES (default 32x200)
#   B2B_RDMA_TIMEOUT      whole-run limit in seconds (default 3000; the fault cases may use 60% of it; CI's limit is 90 minutes)
#   B2B_RDMA_B2BD, B2B_RDMA_BENCH   prebuilt binaries to use instead of building ./cmd/b2bd, ./cmd/b2b-bench
#   B2B_RDMA_DAEMON_ARGS  extra b2bd flags for both daemons (e.g. "--qps-per-peer=4")
#   B2B_RDMA_OUT          output directory (default .cache/rdma-testbed/test-rdma/<time>)
# Exit status: 0 when every size moved and verified over verbs; 1 otherwise.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${B2B_TESTBED_CACHE:-$REPO/.cache/rdma-testbed}
SIZES=${B2B_RDMA_SIZES:-128,256,512,1024,2048,4096,8192,16384,32768,65536,131072,262144,524288,1048576,2097152}
MAX_BLOCKS=${B2B_RDMA_MAX_BLOCKS:-2000}
BATCH_BYTES=${B2B_RDMA_BATCH_BYTES:-16777216}
MIN_BLOCKS=${B2B_RDMA_MIN_BLOCKS:-4}
ITERS=${B2B_RDMA_ITERS:-3}
TIMEOUT=${B2B_RDMA_TIMEOUT:-3000}
FAULTS=${B2B_RDMA_FAULTS:-1}
OUT=${B2B_RDMA_OUT:-$CACHE/test-rdma/$(date +%Y%m%d-%H%M%S)}

say() { printf '[test-rdma] %s\n' "$*" >&2; }
die() {
	say "ERROR: $*"
	exit 1
}

mkdir -p "$OUT/bin" "$OUT/run"
OUT=$(cd "$OUT" && pwd -P)

# Daemons authenticate each other with mutual TLS: a throw-away CA and one certificate per VM.
"$REPO/deploy/scripts/certs.sh" "$OUT/run/certs" a=10.77.0.1 b=10.77.0.2 >/dev/null || die "certs.sh failed"

# Binaries: built for the VMs' qemu64 CPU (GOAMD64=v1) with cgo, since verbs needs it.
B2BD=${B2B_RDMA_B2BD:-}
BENCH=${B2B_RDMA_BENCH:-}
if [ -z "$B2BD" ] || [ -z "$BENCH" ]; then
	say "building b2bd and b2b-bench"
	(cd "$REPO" && CGO_ENABLED=1 GOAMD64=v1 go build -o "$OUT/bin/" ./cmd/b2bd ./cmd/b2b-bench) || die "build failed"
	(cd "$REPO" && CGO_ENABLED=1 GOAMD64=v1 go test -c -o "$OUT/bin/e2e.test" ./internal/e2e) || die "build of the e2e tests failed"
	B2BD=${B2BD:-$OUT/bin/b2bd}
	BENCH=${BENCH:-$OUT/bin/b2b-bench}
fi
# The VMs see the host's root, but not its private /tmp: run copies from the output directory.
for v in B2BD BENCH; do
	f=$(readlink -f "${!v}")
	[ -x "$f" ] || die "$v: not an executable: ${!v}"
	if [ "$(dirname "$f")" != "$OUT/bin" ]; then
		cp "$f" "$OUT/bin/" || die "copy $f"
		f=$OUT/bin/$(basename "$f")
	fi
	printf -v "$v" '%s' "$f"
done

# b2bd must have the verbs transport built in (its --rdma-* flags). The usage text is captured
# first: `b2bd -h | grep -q` would fail under pipefail when grep stops reading early.
usage=$("$B2BD" -h 2>&1 || true)
grep -q -- '-rdma-device' <<<"$usage" || die "$B2BD has no verbs transport (no --rdma-device flag)"

# Blocks per size: MAX_BLOCKS, fewer for big blocks so a batch stays near BATCH_BYTES.
blocks_list=()
for s in ${SIZES//,/ }; do
	[[ $s =~ ^[1-9][0-9]*$ ]] || die "B2B_RDMA_SIZES: not a byte count: $s"
	n=$((BATCH_BYTES / s))
	[ "$n" -gt "$MAX_BLOCKS" ] && n=$MAX_BLOCKS
	[ "$n" -lt "$MIN_BLOCKS" ] && n=$MIN_BLOCKS
	blocks_list+=("$n")
done

cat >"$OUT/run/params.env" <<EOF
SIZES="${SIZES//,/ }"
BLOCKS="${blocks_list[*]}"
ITERS=$ITERS
B2BD=$B2BD
BENCH=$BENCH
DAEMON_ARGS="${B2B_RDMA_DAEMON_ARGS:-}"
E2E=$OUT/bin/e2e.test
FAULTS=$FAULTS
FAULT_TRANSPORTS=${B2B_RDMA_FAULT_TRANSPORTS:-verbs,tcp}
FAULT_TRIALS=${B2B_RDMA_FAULT_TRIALS:-10}
FAULT_LOAD=${B2B_RDMA_FAULT_LOAD:-32x200}
FAULT_TIMEOUT=$((TIMEOUT * 6 / 10))
EOF
say "sizes ${SIZES} with blocks ${blocks_list[*]}, $ITERS timed batches each; output $OUT"

rc=0
B2B_TESTBED_QUIET=${B2B_TESTBED_QUIET:-1} "$HERE/run-pair.sh" "$HERE/test-rdma-vm.sh" "$HERE/test-rdma-vm.sh" \
	--out "$OUT/run" --timeout "$TIMEOUT" --grace 30 || rc=$?

# The table, from what the VMs left in the output directory.
python3 - "$OUT/run" "$SIZES" <<'EOF' || rc=1
import json, os, sys
out, sizes = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}
pdef, ptun = load("perftest-default.json"), load("perftest-tuned.json")
rows = {}
for name in sorted(os.listdir(out)):
    if name.startswith("bench-") and name.endswith(".json"):
        rep = load(name)
        for r in rep.get("rows", []):
            rows[r["block_bytes"]] = r
        if rep.get("error"):
            print("bench %s: %s" % (name, rep["error"]))
hdr = "%10s %7s %10s %8s %10s %13s %10s %11s %9s %9s" % ("block", "blocks", "b2bd GB/s", "WRs", "transport",
      "perftest GB/s", "ratio", "tuned GB/s", "ratio", "verified")
print(hdr)
print("-" * len(hdr))
ok = True
for s in sizes:
    r = rows.get(s, {"error": "no bench result"})
    g = r.get("gbps")
    pd, pt = pdef.get(str(s)), ptun.get(str(s))
    ratio = lambda p: "%.2f" % (g / p) if g and p else "-"
    fmt = lambda x: "%.4f" % x if x else "-"
    verified = bool(r.get("verified"))
    transport = r.get("transport", "-")
    if not verified or transport != "verbs" or r.get("error"):
        ok = False
    print("%10d %7s %10s %8s %10s %13s %10s %11s %9s %9s" % (s, r.get("blocks", "-"), fmt(g), r.get("work_requests", "-"),
          transport, fmt(pd), ratio(pd), fmt(pt), ratio(pt), "yes" if verified else "NO"))
    if r.get("error"):
        print("           error: %s" % r["error"])
print("ratio = b2bd GB/s / ib_write_bw GB/s: default options, and tuned (-q 4 --post_list 32); the bench JSON's")
print("perftest_gbps / ratio_vs_perftest use the better of the two. Emulated hardware: compare ratios only.")
sys.exit(0 if ok else 1)
EOF

# The fault table and load figures from A's TestRemoteFaults.
if [ "$FAULTS" = 1 ]; then
	echo
	echo "fault | transport | trials | outcomes | worst detection | data verified"
	grep -E '^(FAULT|LOAD) ' "$OUT/run/faults.log" 2>/dev/null || echo "(no fault results: see $OUT/run/faults.log)"
	if [ "$(cat "$OUT/run/faults.rc" 2>/dev/null)" != 0 ]; then
		say "fault and load cases FAILED:"
		grep -E -- '--- FAIL|_test.go:[0-9]+' "$OUT/run/faults.log" 2>/dev/null | head -n 20
		rc=1
	fi
fi

B2B_RAILS_OUT="$OUT/rails" B2B_RDMA_B2BD="$B2BD" "$HERE/test-rails.sh" || rc=1 # two RDMA devices per VM (rails)

if [ "$rc" != 0 ]; then
	for r in a b; do
		[ -f "$OUT/run/$r.log" ] && { echo "----- VM ${r^^} log -----"; tail -n 60 "$OUT/run/$r.log"; }
	done
	say "FAIL (output: $OUT)"
	exit 1
fi
say "PASS (output: $OUT)"
