#!/usr/bin/env bash
# session-run.sh: one device call for the release's GPU figures (binaries built here, carried in BIN):
#   doctor on the GPU host; host-memory TCP ad hoc vs prepared with the phase breakdown (a 32-core host,
#   next to the build machine's figures); then gpu-check (GPU0 -> GPU1 over local and TCP, ad hoc and
#   prepared, raw copy-engine yardstick, ncu zero kernels, the PyTorch exchange).
# Usage: BIN=.gpubin deploy/gpu/session-run.sh OUT_DIR
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$top/bin}; OUT=${1:?usage: session-run.sh OUT_DIR}
mkdir -p "$OUT"
echo "=== doctor"; "$BIN/b2bd" --version
"$BIN/b2bd" doctor 2>&1 | tee "$OUT/doctor.txt"; echo "doctor exit: ${PIPESTATUS[0]}"
"$BIN/b2bd" doctor --json > "$OUT/doctor.json" 2>&1; echo "doctor --json exit: $?"
echo "=== host memory over TCP, ad hoc vs prepared"
"$BIN/b2b-bench" --b2bd "$BIN/b2bd" --transport tcp --memory host --sizes 128,4096,65536 --mode adhoc,prepared \
  --iters 40 --breakdown --yardstick none --json "$OUT/host-tcp-modes.json" 2>&1 | tee "$OUT/host-tcp-modes.txt"
echo "=== host memory over the same-host path, ad hoc vs prepared"
"$BIN/b2b-bench" --b2bd "$BIN/b2bd" --transport local --memory host --sizes 128,4096,65536 --mode adhoc,prepared \
  --iters 40 --breakdown --yardstick none --json "$OUT/host-local-modes.json" 2>&1 | tee "$OUT/host-local-modes.txt"
echo "=== gpu-check"
BIN=$BIN "$top/deploy/gpu/gpu-check.sh" "$OUT/gpu-check"
