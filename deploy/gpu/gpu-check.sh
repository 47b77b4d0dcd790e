#!/usr/bin/env bash
# gpu-check: proves b2bd on a GPU machine (no Go there: bin/ is built
# elsewhere and carried). It
#   0. measures the yardstick: a raw cudaMemcpyBatchAsync of the same 10,000
#      blocks (deploy/gpu/rawbatch.cu, built with nvcc there), beside the other
#      copy strategies (per-block copies, host staging, covering range);
#   1. runs the 10,000-block sweep GPU to GPU over the same-host path (local:
#      CUDA IPC + copy engines) and over TCP, in the same run, every block
#      verified (GPU0 -> GPU1 where there are two GPUs, GPU0 -> GPU0 otherwise),
#      and prints them side by side with the yardstick;
#   2. runs a sweep over each transport with both daemons under Nsight Compute,
#      which must profile no kernel (sms_used is taken from that count), after
#      a positive control showing that ncu does see a kernel when one runs;
#   3. makes two PyTorch processes exchange a CUDA tensor's blocks through
#      their daemons (transport auto: local, since they share the host),
#      checked with torch.equal;
#   4. proves zero SMs per path TWO independent ways (deploy/gpu/smprobe.py):
#      every memory kind and path (cuda0->cuda0, host->cuda0, cuda0->host,
#      cuda0->cuda1 with two GPUs), each over local and tcp:
#      a. ncu: the kernels profiled in the daemons while the path ran (must be 0);
#      b. occupancy: a kernel holding every SM slot of every GPU
#         (deploy/gpu/smprobe.cu) runs while the batch runs; the batch must end
#         in the first half of the spin with no other context time-sliced onto
#         the SMs; positive controls (a 1-block kernel in the probe's process,
#         one in another process) must be caught, or the probe fails.
#      Each path also runs as a triggered transfer (after=(counter, v), the
#      counter written during the spin by the host and by mark_layer_done).
#      gpu-check fails if either proof fails for any path.
# Usage: deploy/gpu/gpu-check.sh [OUT_DIR]
#   env: BIN=bin, SIZES=..., BLOCKS=10000, ITERS=5, TRANSPORTS="local tcp",
#        NCU_TRANSPORTS="local tcp", LOCAL_STREAMS (daemons' --local-streams),
#        TORCH_TRANSPORT=auto, PROBE_SIZES=128,4096,65536, PROBE_MS=400,
#        PROBE_CASES=all (plain, triggered), PROBE_TRIGGER_SIZES=4096
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$top/bin}
OUT=${1:-${OUT:-$top/gpu-check-out}}
mkdir -p "$OUT"
fail=0
step() { printf '\n=== %s\n' "$*"; }

step "machine"
nvidia-smi -L || { echo "gpu-check: no GPU (nvidia-smi failed)"; exit 1; }
ngpu=$(nvidia-smi -L | grep -c '^GPU ')
dst_dev=0; [ "$ngpu" -ge 2 ] && dst_dev=1
echo "GPUs: $ngpu; source cuda:0, destination cuda:$dst_dev"
command -v ncu >/dev/null || for d in /usr/local/cuda/bin /usr/local/cuda-*/bin /opt/nvidia/nsight-compute/*; do
  [ -x "$d/ncu" ] && export PATH=$PATH:$d && break; done
command -v ncu || echo "gpu-check: ncu not found"

step "0. yardstick: raw copy-engine batch GPU0 -> GPU$dst_dev (rawbatch.cu)"
if command -v nvcc >/dev/null && nvcc -O2 -o "$OUT/rawbatch" "$top/deploy/gpu/rawbatch.cu" 2> "$OUT/rawbatch-build.txt"; then
  "$OUT/rawbatch" "${BLOCKS:-10000}" 2>&1 | tee "$OUT/rawbatch.txt" || fail=1
else
  echo "gpu-check: nvcc missing or rawbatch.cu did not build:"; cat "$OUT/rawbatch-build.txt" 2>/dev/null
fi

for tr in ${TRANSPORTS:-local tcp}; do
  step "1. sweep GPU to GPU over $tr, every block verified, against the raw batch copy in the same run"
  "$BIN/b2b-bench" --b2bd "$BIN/b2bd" --transport "$tr" --memory cuda --src-device 0 --dst-device "$dst_dev" \
    ${SIZES:+--sizes "$SIZES"} ${BLOCKS:+--blocks "$BLOCKS"} ${ITERS:+--iters "$ITERS"} --mode adhoc,prepared --yardstick "${YARDSTICK:-raw}" \
    ${LOCAL_STREAMS:+--daemon-arg=--local-streams=$LOCAL_STREAMS} \
    --json "$OUT/gpu-sweep-$tr.json" --plot "$OUT/gpu-sweep-$tr.svg" 2>&1 | tee "$OUT/gpu-sweep-$tr.txt" || fail=1
done
if [ "$dst_dev" -ne 0 ]; then
  for tr in ${TRANSPORTS:-local tcp}; do
    step "1d. same-device sweep GPU0 -> GPU0 over $tr (same-device batches are staged through host memory)"
    "$BIN/b2b-bench" --b2bd "$BIN/b2bd" --transport "$tr" --memory cuda --src-device 0 --dst-device 0 \
      ${SIZES:+--sizes "$SIZES"} ${BLOCKS:+--blocks "$BLOCKS"} ${ITERS:+--iters "$ITERS"} \
      --json "$OUT/gpu-samedev-$tr.json" 2>&1 | tee "$OUT/gpu-samedev-$tr.txt" || fail=1
  done
fi

step "1c. side by side (median ms; raw = rawbatch's batch column)"
python3 - "$OUT" <<'PY' || true
import json, sys, os
out = sys.argv[1]
raw = {}
try:
    for line in open(os.path.join(out, "rawbatch.txt")):
        f = line.split()
        if f and f[0].isdigit():
            raw[int(f[0])] = float(f[1])
except OSError:
    pass
rows = {}
for tr in ("local", "tcp"):
    try:
        rep = json.load(open(os.path.join(out, f"gpu-sweep-{tr}.json")))
    except OSError:
        continue
    for r in rep["rows"]:
        rows.setdefault(r["block_bytes"], {})[tr] = r
# local/tcp: ad hoc BatchTransfer calls; "prep": the same blocks prepared once and submitted
# (SubmitTransfer), where the bench ran that mode; best = the faster of the two against raw.
print(f"{'block':>9} {'local ms':>10} {'local prep':>10} {'tcp ms':>10} {'tcp prep':>10} {'tcp/local':>10} {'raw ms':>8} {'local/raw':>10} {'best/raw':>9} {'verified':>9}")
for b in sorted(rows):
    l, t = rows[b].get("local"), rows[b].get("tcp")
    ms = lambda r: r["median_seconds"] * 1e3 if r and r.get("median_seconds") else None
    pms = lambda r: ms((r or {}).get("prepared"))
    lm, tm, lp, tp = ms(l), ms(t), pms(l), pms(t)
    rm = raw.get(b)
    f = lambda v, p=3: "-" if v is None else f"{v:.{p}f}"
    best = min(x for x in (lm, lp) if x) if (lm or lp) else None
    ver = "/".join(("yes" if x and x.get("verified") else "no") for x in (l, t))
    print(f"{b:>9} {f(lm):>10} {f(lp):>10} {f(tm):>10} {f(tp):>10} {f(tm / lm if lm and tm else None, 2):>10} {f(rm):>8} {f(lm / rm if lm and rm else None, 2):>10} {f(best / rm if best and rm else None, 2):>9} {ver:>9}")
PY

step "2a. ncu positive control: a PyTorch kernel must be seen"
ncu --target-processes all python3 -c 'import torch; x=torch.ones(1<<20, device="cuda"); y=(x*2).sum(); torch.cuda.synchronize(); print("control kernel ran", y.item())' \
  > "$OUT/ncu-control.txt" 2>&1
grep -E '==PROF==|control kernel|No kernels|ERR' "$OUT/ncu-control.txt" | head -5
if grep -q 'No kernels were profiled' "$OUT/ncu-control.txt" || ! grep -q '==PROF== Profiling' "$OUT/ncu-control.txt"; then
  echo "gpu-check: ncu did not see the control kernel; its zero-kernel verdict below would mean nothing"
  fail=1
fi

for tr in ${NCU_TRANSPORTS:-local tcp}; do
  step "2b. sweep over $tr with both daemons under ncu: no kernel may run"
  mkdir -p "$OUT/ncu-$tr"
  "$BIN/b2b-bench" --b2bd "$BIN/b2bd" --transport "$tr" --memory cuda --src-device 0 --dst-device "$dst_dev" \
    --ncu "$OUT/ncu-$tr" --sizes "${NCU_SIZES:-128,4096,65536,2097152}" --blocks "${NCU_BLOCKS:-2000}" \
    --json "$OUT/gpu-ncu-$tr.json" 2>&1 | tee "$OUT/gpu-ncu-$tr.txt" || fail=1
  grep -h -E 'No kernels were profiled|==PROF== Profiling' "$OUT/ncu-$tr"/ncu-daemon-*.log 2>/dev/null | sort | uniq -c
done

step "3. PyTorch processes exchange a CUDA tensor's blocks"
tmp=$(mktemp -d)
peer_a=127.0.0.1:$((20000 + RANDOM % 20000)); peer_b=127.0.0.1:$((20000 + RANDOM % 20000))
"$BIN/b2bd" --node-name torch-a --socket "$tmp/a.sock" --shm-dir "$tmp/shm-a" --peer-listen "$peer_a" --data-listen 127.0.0.1:0 --transport "${TORCH_TRANSPORT:-auto}" --insecure 2> "$OUT/torch-daemon-a.log" &
pa=$!
"$BIN/b2bd" --node-name torch-b --socket "$tmp/b.sock" --shm-dir "$tmp/shm-b" --peer-listen "$peer_b" --data-listen 127.0.0.1:0 --transport "${TORCH_TRANSPORT:-auto}" --insecure 2> "$OUT/torch-daemon-b.log" &
pb=$!
for _ in $(seq 100); do [ -S "$tmp/a.sock" ] && [ -S "$tmp/b.sock" ] && break; sleep 0.1; done
PYTHONPATH=$top/client/python PYTHONUNBUFFERED=1 python3 "$top/client/python/examples/torch_exchange.py" \
  --src-socket "$tmp/a.sock" --dst-socket "$tmp/b.sock" --dst-peer "$peer_b" --src-device 0 --dst-device "$dst_dev" \
  2>&1 | tee "$OUT/torch-exchange.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
kill -TERM $pa $pb; wait $pa; ra=$?; wait $pb; rb=$?
echo "daemons exited: $ra $rb"
[ $ra -eq 0 ] && [ $rb -eq 0 ] || fail=1
rm -rf "$tmp"

export PYTHONPATH=$top/client/python PYTHONUNBUFFERED=1
step "4a. zero SMs, proof 1 of 2, per path: ncu counts the daemons' kernels"
python3 "$top/deploy/gpu/smprobe_verdict_test.py" || fail=1 # the verdict's own table test
python3 "$top/deploy/gpu/smprobe.py" --bin "$BIN" --mode ncu --ncu-dir "$OUT/ncu-paths" --json "$OUT/sm-ncu.json" \
  --sizes "${PROBE_SIZES:-128,4096,65536}" --cases "${PROBE_CASES:-all}" --trigger-sizes "${PROBE_TRIGGER_SIZES:-4096}" 2>&1 | tee "$OUT/sm-ncu.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail=1

step "4b. zero SMs, proof 2 of 2, per path: occupancy probe (smprobe.cu holds every SM slot)"
if nvcc -O2 -o "$OUT/smprobe" "$top/deploy/gpu/smprobe.cu" 2> "$OUT/smprobe-build.txt"; then
  python3 "$top/deploy/gpu/smprobe.py" --bin "$BIN" --mode probe --smprobe "$OUT/smprobe" --json "$OUT/sm-probe.json" \
    --sizes "${PROBE_SIZES:-128,4096,65536}" --ms "${PROBE_MS:-400}" \
    --cases "${PROBE_CASES:-all}" --trigger-sizes "${PROBE_TRIGGER_SIZES:-4096}" 2>&1 | tee "$OUT/sm-probe.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
else
  echo "gpu-check: smprobe.cu did not build (the occupancy proof is required):"; cat "$OUT/smprobe-build.txt"; fail=1
fi

step "4c. zero SMs per path (plain and triggered batches): both proofs"
python3 "$top/deploy/gpu/smprobe.py" summarize "$OUT/sm-ncu.json" "$OUT/sm-probe.json" || fail=1

step "verdict"
[ $fail -eq 0 ] && echo "gpu-check: PASS" || echo "gpu-check: FAIL"
exit $fail
