#!/usr/bin/env bash
# test-rdma.sh - the RDMA end-to-end check (`make test-rdma`, CI on every change).
#
# Boots the two-VM Soft-RoCE testbed (run-pair.sh) and, over rxe0 between the VMs:
#   1. b2bd in each VM with --transport verbs (A = destination 10.77.0.1, B = source 10.77.0.2);
#   2. per block size, B2B_RDMA_REPS mirrored rounds (odd: ib_write_bw default options, ib_write_bw tuned
#      (-q 4 --post_list up to 32), b2b-bench; even: b2b-bench, tuned, default), each moving the bench's bytes
#      (iteration counts match the blocks); the bench in B, two-host mode, batches of N blocks (every block
#      verified), its default modes (ad hoc; prepared too up to 64 KiB);
# then prints per size the median ratio b2bd / ib_write_bw of the rounds and its spread (min-max), against
# the default and the tuned run of the same round, b2bd being ad hoc BatchTransfer (a whole batch per call;
# the prepared submits' own median ratios too), and writes them to rdma-summary.json.
# Absolute numbers are those of an emulated machine (TCG, 1 vCPU per VM); only the ratios mean something.
#
#   deploy/rdma-testbed/test-rdma.sh
#
# Knobs (environment):
#   B2B_RDMA_SIZES        block sizes (default every power of two from 128 B to 2 MiB)
#   B2B_RDMA_MAX_BLOCKS   blocks per batch for small blocks (default 10000, the batch b2bd is built for)
#   B2B_RDMA_BATCH_BYTES  bytes per batch cap that sets the block count of big blocks (default 16 MiB)
#   B2B_RDMA_MIN_BLOCKS   blocks per batch at least (default 20: the tuned ib_write_bw's least, 4 QPs x 5)
#   B2B_RDMA_ITERS        timed batches per size and round (default 3)
#   B2B_RDMA_REPS         rounds per size, mirrored: default, tuned, bench; bench, tuned, default; ... (default 4)
#   B2B_RDMA_READ         1 (default): each round also compares b2bd's RDMA READ with ib_read_bw default and tuned
#                         (the same options), mirrored after the round's WRITE triple; ratios in rdma-summary.json's
#                         "read" entries (op "read"); 0 skips
#   B2B_RDMA_READ_DRIVER  bench (default: b2b-bench --op read in B, two-host mode, so b2bd's READ is a real daemon pull
#                         as its WRITE is a real daemon push) or harness (the verbs transport's Conn.Read driven by
#                         its TestHWReadSource/Sink, no daemons)
#   B2B_RDMA_MODES        the bench's --mode (default empty: its default, ad hoc and prepared up to 64 KiB)
#   B2B_RDMA_SMP          vCPUs per VM (default 1; 2 gives rxe a CPU besides the daemon's)
#   B2B_RDMA_E2E          1 (default) runs the e2e tests over verbs in B before the bench; 0 skips
#   B2B_RDMA_E2E_RUN      which of them (a -test.run pattern; default every TestRemote* but the fault cases,
#                         with the pulls over verbs: TestRemotePull{Trust,Faults,Load,Deadline}, about 1 min;
#                         TestRemoteDeregisterUnderBatches deregisters a region under 12 batches at a time)
#   B2B_RDMA_E2E_COUNT    runs of each of them (-test.count; default 1), to measure a flaky one
#   B2B_RDMA_CANCEL_N     transfers of TestRemoteCancelUnderLoad (default 1000, about 75 s in the VMs)
#   B2B_RDMA_PULL_LOAD    TestRemotePullLoad's CLIENTSxPULLS, 4 blocks of 1 KiB a pull (default 32x30, about 40 s;
#                         a pull takes about 50 ms in the VMs, pushes alike, so the issue's 32x200 takes 4.5 min)
#   B2B_RDMA_FAULTS       1 (default) runs the fault and load cases (TestRemoteFaults) in A before the bench; 0 skips
#   B2B_RDMA_FAULT_TRANSPORTS  transports they cover (default verbs,tcp)
#   B2B_RDMA_FAULT_TRIALS peer-kill trials per transport (default 10)
#   B2B_RDMA_FAULT_LOAD   load run, CLIENTSxBATCHES (default 32x200)
#   B2B_RDMA_FAULT_CASES  which of them run (default all: kill,link,deadline,cut,deregister,acl,load)
#   B2B_RDMA_TIMEOUT      whole-run limit in seconds (default 3000; the fault cases may use 60% of it; CI's limit is 90 minutes)
#   B2B_RDMA_CONFORMANCE  1 (default) runs the transport conformance suite over verbs (TestHWConformance) in A
#   B2B_RDMA_HW_TESTS     the verbs hardware tests run with it (default: the conformance suite, the READ tests,
#                         TestHWRevokeOnNarrowedExport and the deadline tests, the frozen receiver's included;
#                         space-separated names)
#   B2B_RDMA_RAILS        1 (default) runs test-rails.sh (two RDMA devices per VM) after the table; 0 skips
#   B2B_RDMA_KV           1 (default) runs one KV request over verbs after the table (b2b-bench --workload kv,
#                         descriptors against block ids, every block verified); 0 skips
#   B2B_RDMA_KV_ARGS      its size and ops (default "--kv-segments 16 --kv-pool 256 --kv-request 64 --repeat 3 --op both":
#                         pushed and pulled, with the pull/push ratio of the daemon's non-wire time)
#   B2B_RDMA_B2BD, B2B_RDMA_BENCH   prebuilt binaries to use instead of building ./cmd/b2bd, ./cmd/b2b-bench
#   B2B_RDMA_DAEMON_ARGS  extra b2bd flags for both daemons (e.g. "--qps-per-peer=4")
#   B2B_RDMA_OUT          output directory (default .cache/rdma-testbed/test-rdma/<time>)
#   B2B_RDMA_SOAK         1 (default) runs the chaos soak's two-host form in A after the fault cases (b2b-soak
#                         --remote-api B: two local daemons over verbs pushing to and pulling from B's, with kill -9
#                         of a local daemon, worker kills and link flaps of A's eth0; docs/soak.md); its report is
#                         soak-verbs.json in the output's run/, and any non-zero invariant fails the run; 0 skips
#   B2B_RDMA_SOAK_DURATION  its traffic time (default 60s; set-up and settling add about 30 s)
#   B2B_RDMA_SOAK_ARGS    extra b2b-soak flags (e.g. "--workers 6 --chaos-every 2s --seed 1")
# Exit status: 0 when every size moved and verified over verbs; 1 otherwise.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${B2B_TESTBED_CACHE:-$REPO/.cache/rdma-testbed}
SIZES=${B2B_RDMA_SIZES:-128,256,512,1024,2048,4096,8192,16384,32768,65536,131072,262144,524288,1048576,2097152}
MAX_BLOCKS=${B2B_RDMA_MAX_BLOCKS:-10000}
BATCH_BYTES=${B2B_RDMA_BATCH_BYTES:-16777216}
MIN_BLOCKS=${B2B_RDMA_MIN_BLOCKS:-20}
ITERS=${B2B_RDMA_ITERS:-3}
TIMEOUT=${B2B_RDMA_TIMEOUT:-3000}
FAULTS=${B2B_RDMA_FAULTS:-1}
REPS=${B2B_RDMA_REPS:-4}
MODES=${B2B_RDMA_MODES:-}
# The bench's default: prepared next to ad hoc up to this size (bench.DefaultPreparedUpTo).
PREPARED_UP_TO=65536
SMP=${B2B_RDMA_SMP:-1}
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
fi
if [ ! -x "$OUT/bin/verbs.test" ]; then # the READ harness and the conformance suite
	(cd "$REPO" && CGO_ENABLED=1 GOAMD64=v1 go test -c -o "$OUT/bin/verbs.test" ./internal/transport/verbs) || die "build of the verbs tests failed"
	B2BD=${B2BD:-$OUT/bin/b2bd}
	BENCH=${BENCH:-$OUT/bin/b2b-bench}
fi
# The soak's two-host form (no cgo: it only drives daemons), for A.
SOAK=${B2B_RDMA_SOAK:-1}
if [ "$SOAK" = 1 ]; then
	(cd "$REPO" && CGO_ENABLED=0 GOAMD64=v1 go build -o "$OUT/bin/" ./cmd/b2b-soak) || die "build of b2b-soak failed"
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
REPS=$REPS
MODES="$MODES"
E2E_TESTS=${B2B_RDMA_E2E:-1}
E2E_RUN='${B2B_RDMA_E2E_RUN:-^(TestRemote|TestRemoteBlocks|TestRemoteRevoke|TestRemoteDeadline|TestRemoteCancelUnderLoad|TestRemoteDeregisterUnderBatches|TestRemotePull(Trust|Faults|Load|Deadline))\$}'
E2E_COUNT=${B2B_RDMA_E2E_COUNT:-1}
CANCEL_N=${B2B_RDMA_CANCEL_N:-1000}
PULL_LOAD=${B2B_RDMA_PULL_LOAD:-32x30}
B2BD=$B2BD
BENCH=$BENCH
DAEMON_ARGS="${B2B_RDMA_DAEMON_ARGS:-}"
E2E=$OUT/bin/e2e.test
VERBS_TEST=$OUT/bin/verbs.test
READ=${B2B_RDMA_READ:-1}
READ_DRIVER=${B2B_RDMA_READ_DRIVER:-bench}
FAULTS=$FAULTS
FAULT_TRANSPORTS=${B2B_RDMA_FAULT_TRANSPORTS:-verbs,tcp}
FAULT_TRIALS=${B2B_RDMA_FAULT_TRIALS:-10}
FAULT_LOAD=${B2B_RDMA_FAULT_LOAD:-32x200}
FAULT_CASES=${B2B_RDMA_FAULT_CASES:-}
FAULT_TIMEOUT=$((TIMEOUT * 6 / 10))
KV=${B2B_RDMA_KV:-1}
KV_ARGS="${B2B_RDMA_KV_ARGS:---kv-segments 16 --kv-pool 256 --kv-request 64 --repeat 3 --op both}"
EOF
# The soak's parameters (test-rdma-vm.sh, section 2b).
cat >>"$OUT/run/params.env" <<EOF
SOAK=$SOAK
SOAK_BIN=$OUT/bin/b2b-soak
SOAK_DURATION=${B2B_RDMA_SOAK_DURATION:-60s}
SOAK_ARGS="${B2B_RDMA_SOAK_ARGS:-}"
EOF
say "sizes ${SIZES} with blocks ${blocks_list[*]}, $REPS rounds of $ITERS timed batches each; smp $SMP; output $OUT"

rc=0
B2B_TESTBED_QUIET=${B2B_TESTBED_QUIET:-1} "$HERE/run-pair.sh" "$HERE/test-rdma-vm.sh" "$HERE/test-rdma-vm.sh" \
	--out "$OUT/run" --timeout "$TIMEOUT" --grace 30 --smp "$SMP" || rc=$?

# The table, from what the VMs left in the output directory.
python3 - "$OUT/run" "$SIZES" "$REPS" "$SMP" "$PREPARED_UP_TO" <<'EOF' || rc=1
import json, os, statistics, sys
out, sizes, reps, smp = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3]), int(sys.argv[4])
prepared_up_to = int(sys.argv[5])
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}
def spread(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "samples": xs} if xs else None
MODES, ACCEPT = ("adhoc", "prepared"), "adhoc"
summary = {"smp": smp, "rounds": reps,
           "order": "per size, mirrored rounds: odd rounds ib_write_bw default, ib_write_bw tuned, b2b-bench; "
                    "even rounds b2b-bench, ib_write_bw tuned, ib_write_bw default",
           "ratio": "b2bd GB/s (a mode's median batch) / ib_write_bw GB/s of the same round; median and min-max over the rounds",
           "acceptance": "ratio_vs_default and ratio_vs_tuned of a size are those of ad hoc BatchTransfer, the mode the "
                         "bench always runs (a whole batch per call: descriptors, validation, planning, posting, the "
                         "acknowledgement; ib_write_bw times none of its set-up); modes holds each mode's own ratios "
                         "(prepared runs up to %d B), never the better of the two per round, which would be biased" % prepared_up_to,
           "sizes": []}
hdr = "%8s %6s %3s %9s %21s %21s %11s %3s" % ("block", "blocks", "rds", "b2bd GB/s",
      "vs default med(min-max)", "vs tuned med(min-max)", "prep'd d/t", "ok")
print(hdr)
print("-" * len(hdr))
ok = True
for s in sizes:
    per = {m: {"gbps": [], "rdef": [], "rtun": []} for m in MODES}
    pdef, ptun, verified, errors, blocks = [], [], True, [], "-"
    for r in range(1, reps + 1):
        rep = load("bench-%d-r%d.json" % (s, r))
        row = next((x for x in rep.get("rows", []) if x.get("block_bytes") == s), None)
        if rep.get("error"):
            errors.append("round %d: %s" % (r, rep["error"]))
        if row is None or not row.get("verified") or row.get("transport") != "verbs" or row.get("error"):
            verified = False
            if row is None and not rep.get("error"):
                errors.append("round %d: no bench result" % r)
            continue
        blocks = row.get("blocks", "-")
        d = load("perftest-default-%d-r%d.json" % (s, r)).get("gbps", {}).get(str(s), 0)
        t = load("perftest-tuned-%d-r%d.json" % (s, r)).get("gbps", {}).get(str(s), 0)
        if d:
            pdef.append(d)
        if t:
            ptun.append(t)
        got = {}
        for m in MODES:
            mo = row.get(m)
            if mo and mo.get("verified") and mo.get("gbps"):
                got[m] = mo["gbps"]
        for m, g in got.items():
            per[m]["gbps"].append(g)
            if d:
                per[m]["rdef"].append(g / d)
            if t:
                per[m]["rtun"].append(g / t)
    ran = [m for m in MODES if per[m]["gbps"]]
    ok = ok and verified and not errors and ACCEPT in ran
    modes_out = {}
    for m in ran:
        modes_out[m] = {"b2bd_gbps": per[m]["gbps"],
                        "ratio_vs_default": spread(per[m]["rdef"]), "ratio_vs_tuned": spread(per[m]["rtun"])}
    sd, st = spread(per[ACCEPT]["rdef"]), spread(per[ACCEPT]["rtun"])
    summary["sizes"].append({"block_bytes": s, "blocks": blocks, "modes_run": ran,
        "b2bd_gbps": per[ACCEPT]["gbps"], "perftest_default_gbps": pdef, "perftest_tuned_gbps": ptun,
        "ratio_vs_default": dict(sd, against="ib_write_bw default options, the same round", b2bd="ad hoc") if sd else None,
        "ratio_vs_tuned": dict(st, against="ib_write_bw -q 4 --post_list min(32, per-QP count), the same round", b2bd="ad hoc") if st else None,
        "modes": modes_out, "verified": verified, "errors": errors})
    f = lambda x: "%.2f (%.2f-%.2f)" % (x["median"], x["min"], x["max"]) if x else "-"
    def dt(m):
        if m not in modes_out:
            return "-"
        a, b = modes_out[m]["ratio_vs_default"], modes_out[m]["ratio_vs_tuned"]
        return "%s/%s" % ("%.2f" % a["median"] if a else "-", "%.2f" % b["median"] if b else "-")
    print("%8d %6s %3d %9s %21s %21s %11s %3s" % (s, blocks, len(per[ACCEPT]["gbps"]),
          "%.4f" % statistics.median(per[ACCEPT]["gbps"]) if per[ACCEPT]["gbps"] else "-", f(sd), f(st), dt("prepared"),
          "yes" if verified else "NO"))
    for e in errors:
        print("           error: %s" % e)
# READ: b2bd's READ batches against ib_read_bw default and tuned of the same round.
read_entries = []
rd_hdr = "%8s %6s %3s %9s %21s %21s %3s" % ("block", "blocks", "rds", "read GB/s", "vs default med(min-max)", "vs tuned med(min-max)", "ok")
for s in sizes:
    if not any(os.path.exists(os.path.join(out, "perftest-read-%s-%d-r%d.json" % (v, s, r))) for v in ("default", "tuned") for r in range(1, reps + 1)):
        continue
    gb, rdef, rtun, pdef, ptun, errors, verified, blocks = [], [], [], [], [], [], True, "-"
    for r in range(1, reps + 1):
        rep = load("read-%d-r%d.json" % (s, r))
        if "rows" in rep:  # b2b-bench --op read (READ_DRIVER=bench)
            row = next((x for x in rep.get("rows", []) if x.get("block_bytes") == s and x.get("op", "read") == "read"), None) or {}
            res = {"gbps": (row.get("adhoc") or {}).get("gbps") or row.get("gbps"), "verified": row.get("verified"),
                   "blocks": row.get("blocks"), "error": row.get("error") or rep.get("error")}
        else:
            res = rep
        if res.get("error") or not res.get("verified") or not res.get("gbps"):
            verified = False
            errors.append("round %d: %s" % (r, res.get("error") or "no verified READ result"))
            continue
        blocks = res.get("blocks", "-")
        g = res["gbps"]
        gb.append(g)
        d = load("perftest-read-default-%d-r%d.json" % (s, r)).get("gbps", {}).get(str(s), 0)
        t = load("perftest-read-tuned-%d-r%d.json" % (s, r)).get("gbps", {}).get(str(s), 0)
        if d:
            pdef.append(d)
            rdef.append(g / d)
        if t:
            ptun.append(t)
            rtun.append(g / t)
    ok = ok and verified and not errors
    sd, st = spread(rdef), spread(rtun)
    read_entries.append({"op": "read", "block_bytes": s, "blocks": blocks, "b2bd_gbps": gb,
        "perftest_default_gbps": pdef, "perftest_tuned_gbps": ptun,
        "ratio_vs_default": dict(sd, against="ib_read_bw default options, the same round") if sd else None,
        "ratio_vs_tuned": dict(st, against="ib_read_bw -q 4 --post_list min(32, per-QP count), the same round") if st else None,
        "verified": verified, "errors": errors})
if read_entries:
    summary["read"] = read_entries
    summary["read_driver"] = os.environ.get("B2B_RDMA_READ_DRIVER", "bench")
    print()
    print("READ: b2bd (%s) / ib_read_bw of the same round" % summary["read_driver"])
    print(rd_hdr)
    print("-" * len(rd_hdr))
    for e in read_entries:
        f = lambda x: "%.2f (%.2f-%.2f)" % (x["median"], x["min"], x["max"]) if x else "-"
        print("%8d %6s %3d %9s %21s %21s %3s" % (e["block_bytes"], e["blocks"], len(e["b2bd_gbps"]),
              "%.4f" % statistics.median(e["b2bd_gbps"]) if e["b2bd_gbps"] else "-", f(e["ratio_vs_default"]),
              f(e["ratio_vs_tuned"]), "yes" if e["verified"] else "NO"))
        for x in e["errors"]:
            print("           error: %s" % x)
for e in summary["sizes"]:
    e["op"] = "write"
# The sender's rxe counters per run (test-rdma-vm.sh's counters.log): a retransmission timeout
# (completer_retry_err) stalls a QP for the ACK timeout (~67 ms at 14), so a round that hit them is slow for
# reasons of the emulated wire, not of the program; per size, timeouts per million data packets sent.
wire = {}
try:
    with open(os.path.join(out, "counters.log")) as fh:
        for line in fh:
            f = line.split()
            if len(f) < 3:
                continue
            who = {"bench": "b2bd", "bench-read": "b2bd read", "perftest-read": "ib_read_bw " + f[1]}.get(f[0], "ib_write_bw " + f[1])
            size = next((int(x[5:]) for x in f if x.startswith("size=")), None)
            moved = {k: int(v.lstrip("+")) for k, v in (x.split("=", 1) for x in f if "=+" in x)}
            w = wire.setdefault(size, {}).setdefault(who, {"runs": 0, "sent_pkts": 0, "retry_timeouts": 0})
            w["runs"] += 1
            w["sent_pkts"] += moved.get("sent_pkts", 0)
            w["retry_timeouts"] += moved.get("completer_retry_err", 0)
except OSError:
    pass
if wire:
    print("retransmission timeouts of the sender's rxe (completer_retry_err) per million packets sent:")
    for e in summary["sizes"]:
        w = wire.get(e["block_bytes"], {})
        e["wire"] = w
        print("%8d  %s" % (e["block_bytes"], "   ".join("%s %.1f (%d in %d pkts)" % (
            who, 1e6 * v["retry_timeouts"] / v["sent_pkts"] if v["sent_pkts"] else 0, v["retry_timeouts"], v["sent_pkts"])
            for who, v in sorted(w.items()))))
with open(os.path.join(out, "rdma-summary.json"), "w") as fh:
    json.dump(summary, fh, indent=2)
print("ratio = b2bd GB/s / ib_write_bw GB/s of the same round (default options; tuned = -q 4 --post_list up to 32),")
print("median of the rounds and (min-max); rounds mirrored (D T B, B T D, ...). b2bd = ad hoc BatchTransfer (a whole")
print("batch per call); 'prep'd d/t' = prepared submits' median ratio vs default / tuned (the bench runs them up to %d B)." % prepared_up_to)
try:
    print("comparison part: %s s." % open(os.path.join(out, "comparison.seconds")).read().strip())
except OSError:
    pass
print("Emulated hardware (smp=%d per VM): compare ratios only. Summary: %s/rdma-summary.json" % (smp, out))
sys.exit(0 if ok else 1)
EOF

# The KV request over verbs (VM B, section 4b): both modes' table and the non-wire ratio.
if [ "${B2B_RDMA_KV:-1}" = 1 ]; then
	echo
	echo "KV request over verbs ($OUT/run/bench-kv.txt):"
	sed -n '/^ *\(op  *\)\{0,1\}mode /,/^$/p' "$OUT/run/bench-kv.txt" 2>/dev/null || echo "(no result)"
	python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if r["complete"] and all(x["verified"] for x in r["rows"]) else 1)' \
		"$OUT/run/bench-kv.json" 2>/dev/null || { say "KV request over verbs FAILED or not verified"; rc=1; }
fi

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

# The transport contract's conformance suite (internal/transport/transporttest) over verbs:
# TestHWConformance between two verbs transports on VM A's rxe0 (hw-verbs.sh; B powers off at once).
if [ "${B2B_RDMA_CONFORMANCE:-1}" = 1 ]; then
	HW_TESTS=${B2B_RDMA_HW_TESTS:-TestHWConformance TestHWRead TestHWReadOnlyKeyRefusesWrite TestHWReadDeadline TestHWKeyForRekey TestHWRevokeOnNarrowedExport TestHWDeadlineStopsWrites TestHWDeadlineFrozenReceiver TestHWPreparedDeadlineStops}
	conf=$OUT/conformance
	mkdir -p "$conf"
	if [ -x "$OUT/bin/verbs.test" ] || (cd "$REPO" && CGO_ENABLED=1 GOAMD64=v1 go test -c -o "$OUT/bin/verbs.test" ./internal/transport/verbs); then
		# With the conformance suite, the READ hardware tests: checksums at several sizes, a read-only
		# rkey that cannot WRITE (a hand-made WRITE fails at the NIC), a deadline mid-READ, per-access MRs; a
		# narrowed export's rkey refused at the NIC (and the MRs a write-only region holds); deadlines that stop
		# their own batch and keep the connection.
		printf "B2B_HW_TEST=%s\nB2B_HW_RUN='^(%s)\$'\n" "$OUT/bin/verbs.test" "${HW_TESTS// /|}" >"$conf/hw.env"
		B2B_TESTBED_QUIET=1 "$HERE/run-pair.sh" "$HERE/hw-verbs.sh" "$HERE/hw-verbs.sh" --out "$conf" --timeout 900 --grace 30 || {
			say "verbs conformance suite FAILED:"
			grep -E -- '--- FAIL|_test.go:[0-9]+|checks.go:[0-9]+' "$conf/hw-verbs-a.log" 2>/dev/null | head -n 20
			rc=1
		}
		echo
		echo "conformance suite over verbs (TestHWConformance, $conf/hw-verbs-a.log):"
		grep -E -- '^(--- |    --- )(PASS|FAIL|SKIP)|KNOWN GAP' "$conf/hw-verbs-a.log" 2>/dev/null || echo "(no result)"
		for tst in $HW_TESTS; do
			grep -q -- "--- PASS: $tst " "$conf/hw-verbs-a.log" 2>/dev/null || { say "verbs hardware test $tst did not pass"; rc=1; }
		done
	else
		say "build of the verbs tests failed"
		rc=1
	fi
fi

if [ "${B2B_RDMA_RAILS:-1}" = 1 ]; then
	B2B_RAILS_OUT="$OUT/rails" B2B_RDMA_B2BD="$B2BD" "$HERE/test-rails.sh" || rc=1 # two RDMA devices per VM (rails)
fi

# The chaos soak over verbs (A, section 2b): its one-line outcome and invariants from soak-verbs.json.
if [ "$SOAK" = 1 ]; then
	echo
	echo "chaos soak over verbs ($OUT/run/soak-verbs.json):"
	python3 - "$OUT/run/soak-verbs.json" <<'EOF' || rc=1
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    print("  no report: %s" % e)
    sys.exit(1)
inv = ["false_successes", "grant_violations", "late_bytes", "deadline_overruns", "crashes", "leaks", "faults", "hung_workers", "unverified_done"]
d = r.get("detail", {})
print("  %s, %.0f s, seed %d: %d transfers (%.1f/s), %d done (verified), %d cancelled (%d deadline), %d failed; chaos %s" % (
    r.get("mode", "?"), r.get("duration_s", 0), r.get("seed", 0), r.get("transfers", 0), r.get("transfers_per_s", 0), r.get("done", 0),
    r.get("cancelled", 0), r.get("deadline_exceeded", 0), r.get("failed", 0),
    " ".join("%s:%d" % kv for kv in sorted(r.get("chaos_actions", {}).items()))))
print("  " + " ".join("%s=%d" % (k, r.get(k, 0)) for k in inv))
print("  cut transfers re-checked %d (lost %d); worst answer past deadline %.0f ms (%d past 100 ms, within the measured margin), sched delay max %.0f ms" % (
    d.get("cut_transfers_rechecked", 0), d.get("cut_rechecks_lost", 0), d.get("worst_answer_past_deadline_ms", 0),
    d.get("answers_past_100ms_within_margin", 0), d.get("sched_delay_max_ms", 0)))
for v in r.get("violations") or []:
    print("  %s %s %s: %s" % ("note" if "(not counted)" in v["invariant"] else "VIOLATION", v["invariant"], v["kind"], v["detail"]))
for c in r.get("crash_list") or []:
    print("  crash %s: %s" % (c["daemon"], c["exit"]))
for l in r.get("leak_list") or []:
    print("  leak %s %s: %d -> %d (allowed %d)" % (l["daemon"], l["resource"], l["baseline"], l["end"], l["allowed"]))
sys.exit(1 if any(r.get(k, 0) for k in inv) else 0)
EOF
	if [ "$(cat "$OUT/run/soak.rc" 2>/dev/null)" != 0 ]; then
		say "chaos soak over verbs FAILED (rc $(cat "$OUT/run/soak.rc" 2>/dev/null || echo none); $OUT/run/soak-verbs.log):"
		tail -n 20 "$OUT/run/soak-verbs.log" 2>/dev/null || true
		rc=1
	fi
fi

if [ "$rc" != 0 ]; then
	for r in a b; do
		[ -f "$OUT/run/$r.log" ] && { echo "----- VM ${r^^} log -----"; tail -n 60 "$OUT/run/$r.log"; }
	done
	say "FAIL (output: $OUT)"
	exit 1
fi
say "PASS (output: $OUT)"
