#!/usr/bin/env bash
# auto-check.sh: what --transport auto chooses on a GPU host, in one device
# call:
#   1. a daemon's calibration at start, then a second start reading it back
#      from --calibration-file (b2bctl status of each);
#   2. b2b-bench --workload paths: for host->host, host->cuda0, cuda0->host,
#      cuda0->cuda0 (and cuda0->cuda1 with two GPUs), at each size, auto
#      against every transport, interleaved, every transport's batch
#      verified block by block; auto over the fastest per route and size;
#   3. zero SMs for auto's batches: the occupancy probe and ncu
#      (smprobe.py --transports auto).
# Usage: BIN=dir deploy/gpu/auto-check.sh OUT_DIR
#   env: SIZES=128,4096,65536,2097152 ITERS=12 BLOCKS=10000 STEPS="1 2 3"
set -uo pipefail
top=${TOP:-$(cd "$(dirname "$0")/../.." && pwd)}
BIN=${BIN:-$top/bin}; OUT=${1:?usage: auto-check.sh OUT_DIR}
SIZES=${SIZES:-128,4096,65536,2097152}; ITERS=${ITERS:-12}; BLOCKS=${BLOCKS:-10000}
STEPS=${STEPS:-1 2 3}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
. "$here/steps.sh" # step, want, fail; ncu and nvcc on PATH

step "machine"
nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$BIN/b2bd" --version

if want 1; then
  step "1. calibration at start, then read back from --calibration-file"
  tmp=$(mktemp -d); shm=/dev/shm/b2b-auto-$$
  for run in measured cached; do
    "$BIN/b2bd" --node-name cal --socket "$tmp/s.sock" --shm-dir "$shm" --peer-listen 127.0.0.1:0 --data-listen 127.0.0.1:0 \
      --insecure --calibration-file "$tmp/calibration.json" > "$OUT/calibrate-$run.log" 2>&1 &
    pid=$!
    for _ in $(seq 200); do
      "$BIN/b2bctl" --socket "$tmp/s.sock" status --json 2>/dev/null | grep -q '"state": *"\(done\|cached\|failed\|off\)' && break
      sleep 0.1
    done
    "$BIN/b2bctl" --socket "$tmp/s.sock" status | tee "$OUT/status-$run.txt" | sed -n '/^auto/,$p'
    kill -TERM $pid; wait $pid
  done
  cp "$tmp/calibration.json" "$OUT/calibration.json"
  grep -q 'cached' "$OUT/status-cached.txt" || { echo "the second start did not read the calibration back"; fail=1; }
  rm -rf "$tmp" "$shm"
fi
if want 2; then
  step "2. b2b-bench --workload paths (auto against every transport)"
  "$BIN/b2b-bench" --b2bd "$BIN/b2bd" --workload paths --sizes "$SIZES" --blocks "$BLOCKS" --iters "$ITERS" \
    --json "$OUT/paths.json" 2>&1 | tee "$OUT/paths.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
fi
if want 3; then
  export PYTHONPATH=$top/client/python PYTHONUNBUFFERED=1
  paths='cuda0->cuda0,host->cuda0,cuda0->host'
  step "3a. zero SMs: occupancy probe, auto"
  if nvcc -O2 -o /tmp/smprobe "$here/smprobe.cu" 2> "$OUT/smprobe-build.txt"; then
    python3 "$here/smprobe.py" --bin "$BIN" --mode probe --smprobe /tmp/smprobe --json "$OUT/sm-probe.json" \
      --paths "$paths" --transports auto --sizes 128,4096,65536 --cases plain 2>&1 | tail -n 14 | tee "$OUT/sm-probe.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
  else echo "smprobe.cu did not build"; cat "$OUT/smprobe-build.txt"; fail=1; fi
  step "3b. zero SMs: ncu, auto"
  python3 "$here/smprobe.py" --bin "$BIN" --mode ncu --ncu-dir /tmp/ncu-auto --json "$OUT/sm-ncu.json" \
    --paths "$paths" --transports auto --sizes 128,4096,65536 --cases plain 2>&1 | tail -n 10 | tee "$OUT/sm-ncu.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
fi
step "done"; echo "auto-check: $([ $fail -eq 0 ] && echo PASS || echo FAIL)"
exit $fail
