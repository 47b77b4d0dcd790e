#!/usr/bin/env bash
# local-streams-ab: GPU0 -> GPU1 over local against the raw batch, in rounds (the copy engines' time
# for many small peer copies is bimodal, so compare within a round): each round runs rawbatch, then
# the prepared sweep with every --local-streams value in STREAMS. Needs two GPUs and nvcc.
# Usage: BIN=.gpubin deploy/gpu/local-streams-ab.sh OUT_DIR   (env: ROUNDS=3, STREAMS="1 4", MODE=prepared)
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$top/bin}; OUT=${1:?usage: local-streams-ab.sh OUT_DIR}
mkdir -p "$OUT"
nvcc -O2 -o "$OUT/rawbatch" "$top/deploy/gpu/rawbatch.cu" || exit 1
for r in $(seq 1 "${ROUNDS:-3}"); do
  "$OUT/rawbatch" 10000 > "$OUT/raw-$r.txt" 2>&1; grep -v "^block" "$OUT/raw-$r.txt"
  for ls in ${STREAMS:-1 4}; do
    timeout 300 "$BIN/b2b-bench" --b2bd "$BIN/b2bd" --transport local --memory cuda --src-device 0 --dst-device 1 \
      --sizes 128,4096,65536,262144,2097152 --iters 9 --mode "${MODE:-prepared}" --yardstick none \
      --daemon-arg=--local-streams="$ls" --json "$OUT/r$r-s$ls.json" > "$OUT/r$r-s$ls.txt" 2>&1
    python3 - "$OUT/r$r-s$ls.json" "$r" "$ls" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
cells = []
for x in d["rows"]:
    m = x.get("prepared") or x.get("adhoc") or {}
    cells.append("%d:%.2f" % (x["block_bytes"], m.get("median_seconds", 0) * 1e3))
print("round", sys.argv[2], "streams", sys.argv[3], " ".join(cells))
PY
  done
done
