#!/usr/bin/env bash
# samedev-check.sh: the same-device (GPU0 -> GPU0) figures in one device call,
# every yardstick in the same call:
#   0. rawbatch.cu on one GPU: one cudaMemcpyBatchAsync GPU0 -> GPU0 (SMs) and
#      a raw host-staged copy (D2H gather, H2D scatter), 10,000 blocks;
#   1. the staged path in one process, plan by plan, each hop alone
#      (local.test -test.run TestGPUStagedSameDevice);
#   2. b2b-bench GPU0 -> GPU0, 10,000 blocks, every block verified: local with
#      this build, local with OLD's b2bd (the build before), tcp; ad hoc and
#      prepared, first batches in the JSON (first_seconds);
#   3. zero SMs for cuda0->cuda0 over local: the occupancy probe and ncu
#      (smprobe.py --paths cuda0->cuda0);
#   4. the 2 MiB sweeps (slow: 20 GB a region).
# Usage: BIN=dir [OLD=path/to/old/b2bd] deploy/gpu/samedev-check.sh OUT_DIR
#   env: SIZES=128,4096,65536 BIG=2097152 ITERS=5 BLOCKS=10000 STEPS="0 1 2 3 4"
set -uo pipefail
top=${TOP:-$(cd "$(dirname "$0")/../.." && pwd)}
BIN=${BIN:-$top/bin}; OUT=${1:?usage: samedev-check.sh OUT_DIR}
OLD=${OLD:-}
SIZES=${SIZES:-128,4096,65536}; BIG=${BIG:-2097152}; ITERS=${ITERS:-5}; BLOCKS=${BLOCKS:-10000}
STEPS=${STEPS:-0 1 2 3 4}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
. "$here/steps.sh" # step, want, fail; ncu and nvcc on PATH

step "machine"
nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$BIN/b2bd" --version; [ -n "$OLD" ] && "$OLD" --version

sweep() { # name b2bd transport sizes modes iters
  "$BIN/b2b-bench" --b2bd "$2" --transport "$3" --memory cuda --src-device 0 --dst-device 0 --sizes "$4" \
    --blocks "$BLOCKS" --iters "$6" --mode "$5" --yardstick none --breakdown \
    --json "$OUT/samedev-$1.json" > "$OUT/samedev-$1.txt" 2>&1 || { echo "sweep $1 failed"; fail=1; }
  grep -E '^ *[0-9]+ ' "$OUT/samedev-$1.txt" | head -20
}

if want 0; then
  step "0. rawbatch GPU0 -> GPU0 (batch: device copies on SMs; stage: raw D2H gather + H2D scatter)"
  if nvcc -O2 -o /tmp/rawbatch "$here/rawbatch.cu" 2> "$OUT/rawbatch-build.txt"; then
    /tmp/rawbatch "$BLOCKS" 2>&1 | tee "$OUT/rawbatch.txt"
  else echo "rawbatch did not build"; cat "$OUT/rawbatch-build.txt"; fi
fi
if want 1; then
  step "1. in-process staged plans (local.test)"
  B2B_STAGE_SIZES=$SIZES,$BIG "$BIN/local.test" -test.run TestGPUStagedSameDevice -test.v -test.timeout 300s 2>&1 \
    | tee "$OUT/stage-plans.txt" | grep -E 'stage|PASS|FAIL|ok|skip'
fi
if want 2; then
  for v in "local-new $BIN/b2bd local" ${OLD:+"local-old $OLD local"} "tcp $BIN/b2bd tcp"; do
    set -- $v; step "2. sweep $1"; sweep "$1" "$2" "$3" "$SIZES" adhoc,prepared "$ITERS"
  done
fi
if want 3; then
  export PYTHONPATH=$top/client/python PYTHONUNBUFFERED=1
  step "3a. zero SMs: occupancy probe, cuda0->cuda0 local"
  if nvcc -O2 -o /tmp/smprobe "$here/smprobe.cu" 2> "$OUT/smprobe-build.txt"; then
    python3 "$here/smprobe.py" --bin "$BIN" --mode probe --smprobe /tmp/smprobe --json "$OUT/sm-probe.json" \
      --paths cuda0-\>cuda0 --transports local,tcp --sizes "$SIZES" --cases plain 2>&1 | tail -n 12 | tee "$OUT/sm-probe.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
  else echo "smprobe.cu did not build"; cat "$OUT/smprobe-build.txt"; fail=1; fi
  step "3b. zero SMs: ncu, cuda0->cuda0 local"
  python3 "$here/smprobe.py" --bin "$BIN" --mode ncu --ncu-dir /tmp/ncu-paths --json "$OUT/sm-ncu.json" \
    --paths cuda0-\>cuda0 --transports local --sizes "$SIZES" --cases plain 2>&1 | tail -n 8 | tee "$OUT/sm-ncu.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
fi
if want 4; then
  for v in "big-local-new $BIN/b2bd local" ${OLD:+"big-local-old $OLD local"} "big-tcp $BIN/b2bd tcp"; do
    set -- $v; step "4. sweep $1 at $BIG"; sweep "$1" "$2" "$3" "$BIG" adhoc 3
  done
fi
step "5. side by side (median ms)"
python3 "$here/samedev_table.py" "$OUT" 2>&1 | tee "$OUT/table.txt"
step "done"; echo "samedev-check: $([ $fail -eq 0 ] && echo PASS || echo FAIL)"
exit $fail
