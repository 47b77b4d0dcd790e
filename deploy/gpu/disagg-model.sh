#!/usr/bin/env bash
# disagg-model: the disaggregated-serving harness with a real model on a GPU host, in one call.
# deploy/disagg/disagg.py --model llama (a transformers Llama, random weights from a fixed seed,
# KV in paged CUDA pools moved by b2b.connector) for both modes (pull, push) on GPU0 -> GPU0 and,
# where there are two GPUs, GPU0 -> GPU1: every request's decoded steps' logits compared bit for
# bit with a one-process reference; one request per run has a received block altered and must
# be caught.
# Results: OUT/disagg-model-0toD.json (rows per mode, each request's comparison), .txt logs,
# OUT/versions.txt. Exit 0 only if every run passed.
# Usage: deploy/gpu/disagg-model.sh [OUT_DIR]
#   env: BIN=bin (b2bd, built elsewhere: no Go there), ARGS (more disagg.py arguments),
#        REQUESTS=16 CONCURRENCY=8 RUN_TIMEOUT=240
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$top/bin}
OUT=${1:-${OUT:-$top/disagg-model-out}}
mkdir -p "$OUT"
export PYTHONPATH=$top/client/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:False}
export B2BD_BIN=$BIN/b2bd
fail=0
nvidia-smi -L || { echo "disagg-model: no GPU (nvidia-smi failed)"; exit 1; }
ngpu=$(nvidia-smi -L | grep -c '^GPU ')
dsts="0"; [ "$ngpu" -ge 2 ] && dsts="0 1"
"$B2BD_BIN" --version || { echo "disagg-model: $B2BD_BIN missing"; exit 1; }
python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "gpus", torch.cuda.device_count(), torch.cuda.get_device_name(0))' \
  2>&1 | tee "$OUT/versions.txt"
for d in $dsts; do
  printf '\n=== llama, prefill GPU0 -> decode GPU%s, pull and push  [%s]\n' "$d" "$(date -u +%T)"
  timeout "${RUN_TIMEOUT:-240}" python3 "$top/deploy/disagg/disagg.py" --model llama --modes pull,push \
    --prefill-device 0 --decode-device "$d" --requests "${REQUESTS:-16}" --concurrency "${CONCURRENCY:-8}" \
    --min-prompt 17 --max-prompt 300 --json "$OUT/disagg-model-0to$d.json" ${ARGS:-} 2>&1 | tee "$OUT/disagg-model-0to$d.txt"
  rc=${PIPESTATUS[0]}
  echo "GPU0 -> GPU$d: exit $rc"
  [ "$rc" -eq 0 ] || fail=1
done
# An engine's log, where a run failed (the harness keeps its directory).
for f in /tmp/disagg-model-*/*.engine.log; do [ -f "$f" ] && { echo "--- $f"; tail -30 "$f"; }; done
echo "disagg-model: $([ $fail -eq 0 ] && echo PASS || echo FAIL)"
exit $fail
