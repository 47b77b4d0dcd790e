#!/usr/bin/env bash
# layer-check: layer streaming on a GPU machine (docs/kv.md, "Layer streaming"), in one
# device call. No Go there: bin/ is built elsewhere and carried (BIN). Steps, each under a timeout,
# all under one deadline (TOTAL_S, default 500 s, so the whole run ends within 9 minutes):
#   0. the verdicts' own table tests (no GPU);
#   a. deploy/gpu/layer_stream.py: triggered per-layer transfers against one after the end, every
#      block checked with torch.equal; tail, ratio and lag figures (OUT/layer-stream.json);
#   b. layer_stream.py again with both daemons under Nsight Compute, fewer runs: 0 kernels
#      (OUT/layer-stream-ncu.json, logs in OUT/ncu-layer/);
#   c. zero SMs during triggered transfers, two proofs (deploy/gpu/smprobe.py --cases triggered):
#      every path (cuda0->cuda1 with two GPUs, cuda0->cuda0, host->cuda0, cuda0->host) over local
#      and tcp, each batch armed with after=(counter, v) before smprobe.cu holds every SM slot, the
#      counter written during the spin by the host and by mark_layer_done on a CUDA stream:
#        probe: each lands in the first half of the spin, no SM stall in its window, controls caught
#               (OUT/sm-probe-trig.json);
#        ncu:   0 kernels in the daemons (OUT/sm-ncu-trig.json, logs in OUT/ncu-trig/).
# Then a short summary (deploy/gpu/layer_check_summary.py, OUT/layer-check.json). Exit 1 if any
# step or proof failed.
# Usage: deploy/gpu/layer-check.sh OUT_DIR
#   env: BIN=bin, TOTAL_S=500, LAYER_ARGS, LAYER_NCU_ARGS (extra arguments to layer_stream.py),
#        TRIGGER_SIZES=4096,65536, PROBE_BLOCKS=10000, PROBE_MS=400,
#        T_LAYER=130 T_LAYER_NCU=120 T_BUILD=45 T_PROBE=90 T_NCU=120 (each step's own limit, seconds)
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$top/bin}
OUT=${1:?usage: layer-check.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONPATH=$top/client/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# register_cuda refuses tensors of an expandable-segments allocator (as kv-check.sh)
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:False}
export B2BD_BIN=$BIN/b2bd # layer_check_test.py's live check
deadline=$((SECONDS + ${TOTAL_S:-500}))
fail=0
: > "$OUT/steps.txt"
step() { printf '\n=== %s (%ds left)\n' "$1" $((deadline - SECONDS)); }

# run NAME LIMIT CMD...: CMD under min(LIMIT, time left before the deadline less a margin for the
# kill), output to OUT/NAME.txt; its exit code goes to OUT/steps.txt. timeout sends SIGTERM first:
# the Python drivers then stop their daemons and write their reports.
run() {
  local name=$1 want=$2; shift 2
  local left=$((deadline - SECONDS - 20))
  local t=$((want < left ? want : left))
  if [ "$t" -lt 15 ]; then
    echo "$name: skipped, ${left}s left before the deadline" | tee -a "$OUT/steps.txt"
    fail=1
    return 1
  fi
  echo "($name: limit ${t}s)"
  timeout -k 15 "$t" "$@" 2>&1 | tee "$OUT/$name.txt"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 124 ] && echo "$name: TIMED OUT after ${t}s"
  echo "$name: exit $rc" | tee -a "$OUT/steps.txt"
  [ "$rc" -eq 0 ] || fail=1
  return "$rc"
}

step "machine"
nvidia-smi -L || { echo "layer-check: no GPU (nvidia-smi failed)"; exit 1; }
"$BIN/b2bd" --version || { echo "layer-check: $BIN/b2bd missing"; exit 1; }
for tool in ncu nvcc; do
  command -v "$tool" >/dev/null || for d in /usr/local/cuda/bin /usr/local/cuda-*/bin /opt/nvidia/nsight-compute/*; do
    [ -x "$d/$tool" ] && export PATH=$PATH:$d && break; done
  command -v "$tool" || echo "layer-check: $tool not found"
done
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())' \
  2>&1 | tee "$OUT/versions.txt"

step "0. verdict table tests (no GPU)"
run verdict-tests 30 bash -c "python3 '$top/deploy/gpu/smprobe_verdict_test.py' && python3 '$top/deploy/gpu/layer_check_test.py'"

step "a. layer_stream.py: triggered per layer vs after the end, every block checked"
run layer-stream "${T_LAYER:-130}" python3 "$top/deploy/gpu/layer_stream.py" --bin "$BIN" \
  --json "$OUT/layer-stream.json" ${LAYER_ARGS:-}

step "b. layer_stream.py with both daemons under ncu (fewer runs): 0 kernels"
run layer-stream-ncu "${T_LAYER_NCU:-120}" python3 "$top/deploy/gpu/layer_stream.py" --bin "$BIN" \
  --ncu "$OUT/ncu-layer" --iters 1 --configs comparable --json "$OUT/layer-stream-ncu.json" ${LAYER_NCU_ARGS:-}

step "c0. build the occupancy probe (smprobe.cu)"
run smprobe-build "${T_BUILD:-45}" nvcc -O2 -o "$OUT/smprobe" "$top/deploy/gpu/smprobe.cu"

probe_args=(--bin "$BIN" --cases triggered --trigger-sizes "${TRIGGER_SIZES:-4096,65536}" --blocks "${PROBE_BLOCKS:-10000}")
step "c1. zero SMs during triggered transfers, proof 1 of 2: occupancy probe"
if [ -x "$OUT/smprobe" ]; then
  run sm-probe-trig "${T_PROBE:-90}" python3 "$top/deploy/gpu/smprobe.py" --mode probe --smprobe "$OUT/smprobe" \
    --ms "${PROBE_MS:-400}" --json "$OUT/sm-probe-trig.json" "${probe_args[@]}"
else
  echo "layer-check: no smprobe binary (the occupancy proof is required)" | tee -a "$OUT/steps.txt"; fail=1
fi

step "c2. zero SMs during triggered transfers, proof 2 of 2: ncu"
run sm-ncu-trig "${T_NCU:-120}" python3 "$top/deploy/gpu/smprobe.py" --mode ncu --ncu-dir "$OUT/ncu-trig" \
  --json "$OUT/sm-ncu-trig.json" "${probe_args[@]}"

step "summary"
cat "$OUT/steps.txt"
python3 "$top/deploy/gpu/layer_check_summary.py" "$OUT" || fail=1
echo "layer-check: $([ $fail -eq 0 ] && echo PASS || echo FAIL) in ${SECONDS}s (results in $OUT)"
exit $fail
