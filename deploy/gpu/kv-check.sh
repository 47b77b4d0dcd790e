#!/usr/bin/env bash
# kv-check: b2b.kv on a GPU machine ("On the GPU host"). No Go there: bin/ is built
# elsewhere and carried (BIN). For each transport it starts two daemons and runs
#   a. deploy/gpu/kv_exchange.py: two PyTorch processes, 160 layer tensors of 1,024 x 8 KiB
#      blocks; a request's 512 blocks (81,920 blocks, 640 MiB) move by id to OTHER ids,
#      every block checked with torch.equal;
#   b. deploy/gpu/kv_llama.py: a small Llama split in two processes, prefill's KV moved into
#      decode's paged pool; tokens and every step's logits bitwise equal to one process's,
#      fp32 and bf16; the negative controls (a zeroed and a swapped block) must be caught;
# on GPU0 -> GPU0, and GPU0 -> GPU1 where there are two GPUs.
# Results: OUT/kv-{exchange,llama}-TRANSPORT-SRCtoDST.{json,txt}, and OUT/kv-check.json (every
# JSON line, one per run). Exit 0 only if every run passed.
# Usage: deploy/gpu/kv-check.sh [OUT_DIR]
#   env: BIN=bin, TRANSPORTS="local tcp", EXCHANGE_ARGS, LLAMA_ARGS (extra arguments), RUN_TIMEOUT=900
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$top/bin}
OUT=${1:-${OUT:-$top/kv-check-out}}
mkdir -p "$OUT"
export PYTHONPATH=$top/client/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:False}
fail=0
step() { printf '\n=== %s\n' "$*"; }

step "machine"
nvidia-smi -L || { echo "kv-check: no GPU (nvidia-smi failed)"; exit 1; }
ngpu=$(nvidia-smi -L | grep -c '^GPU ')
pairs="0:0"; [ "$ngpu" -ge 2 ] && pairs="0:0 0:1"
"$BIN/b2bd" --version || { echo "kv-check: $BIN/b2bd missing"; exit 1; }
python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "gpus", torch.cuda.device_count())' \
  2>&1 | tee "$OUT/versions.txt"

start_daemons() { # $1 = transport; sets tmp, pa, pb, peer_b
  tmp=$(mktemp -d)
  local base=$((20000 + RANDOM % 20000))
  peer_a=127.0.0.1:$base; peer_b=127.0.0.1:$((base + 1))
  "$BIN/b2bd" --node-name kv-a --socket "$tmp/a.sock" --shm-dir "$tmp/shm-a" --peer-listen "$peer_a" \
    --data-listen 127.0.0.1:0 --transport "$1" --insecure --log-level warn 2> "$OUT/daemon-a-$1.log" &
  pa=$!
  "$BIN/b2bd" --node-name kv-b --socket "$tmp/b.sock" --shm-dir "$tmp/shm-b" --peer-listen "$peer_b" \
    --data-listen 127.0.0.1:0 --transport "$1" --insecure --log-level warn 2> "$OUT/daemon-b-$1.log" &
  pb=$!
  for _ in $(seq 200); do [ -S "$tmp/a.sock" ] && [ -S "$tmp/b.sock" ] && return 0; sleep 0.1; done
  echo "kv-check: daemons over $1 did not come up"; tail -5 "$OUT/daemon-a-$1.log" "$OUT/daemon-b-$1.log"
  return 1
}

stop_daemons() {
  kill -TERM "$pa" "$pb" 2>/dev/null; wait "$pa"; local ra=$?; wait "$pb"; local rb=$?
  echo "daemons exited: $ra $rb"
  rm -rf "$tmp"
  [ $ra -eq 0 ] && [ $rb -eq 0 ]
}

run() { # $1 = name, then the command; its output goes to OUT/$1.txt
  local name=$1; shift
  timeout "${RUN_TIMEOUT:-900}" "$@" 2>&1 | tee "$OUT/$name.txt"
  local rc=${PIPESTATUS[0]}
  echo "$name: exit $rc"
  [ "$rc" -eq 0 ] || fail=1
}

for tr in ${TRANSPORTS:-local tcp}; do
  step "daemons over $tr"
  if ! start_daemons "$tr"; then fail=1; stop_daemons; continue; fi
  common=(--src-socket "$tmp/a.sock" --dst-socket "$tmp/b.sock" --dst-peer "$peer_b" --transport "$tr")
  for pair in $pairs; do
    s=${pair%:*}; d=${pair#*:}
    step "a. KV exchange over $tr, GPU$s -> GPU$d (160 x 512 blocks of 8 KiB, to other ids)"
    run "kv-exchange-$tr-${s}to$d" python3 "$top/deploy/gpu/kv_exchange.py" "${common[@]}" \
      --src-device "$s" --dst-device "$d" --json "$OUT/kv-exchange-$tr-${s}to$d.json" ${EXCHANGE_ARGS:-}
    step "b. split Llama over $tr, prefill GPU$s -> decode GPU$d (fp32, bf16; logits bitwise; negative controls)"
    run "kv-llama-$tr-${s}to$d" python3 "$top/deploy/gpu/kv_llama.py" "${common[@]}" \
      --src-device "$s" --dst-device "$d" --json "$OUT/kv-llama-$tr-${s}to$d.json" ${LLAMA_ARGS:-}
  done
  stop_daemons || fail=1
done

step "summary"
cat "$OUT"/kv-exchange-*.json "$OUT"/kv-llama-*.json 2>/dev/null > "$OUT/kv-check.json"
python3 - "$OUT/kv-check.json" <<'PY' || fail=1
import json, sys
rows = [r for r in (json.loads(l) for l in open(sys.argv[1]) if l.strip()) if not r.get("summary")]
bad = 0
for r in rows:
    if r.get("summary"):
        continue
    where = f"{r.get('transport', r.get('transport_asked'))} GPU{r.get('src_device')}->GPU{r.get('dst_device')}"
    if r["script"] == "kv_exchange":
        ph = r.get("phases_ns") or {}
        print(f"exchange {where:<22} blocks {r.get('blocks')} median {r.get('median_ms', 0):.1f} ms "
              f"regions {r.get('prefill_regions')}/{r.get('decode_regions')} validate+plan "
              f"{(ph.get('validate_ns', 0) + ph.get('plan_ns', 0)) / 1e3:.0f} us verified {r.get('verified')} "
              f"async {r.get('async') if isinstance(r.get('async'), str) else ('ok' if r.get('async') else '-')}  "
              f"{'PASS' if r.get('ok') else 'FAIL'}" + (f"  error: {r['error']}" if r.get("error") else ""))
    else:
        c = r.get("controls", {})
        print(f"llama {str(r.get('dtype')):<5} {where:<22} tokens {r.get('tokens_equal')} logits {r.get('logits_equal_steps')}/{r.get('steps')} "
              f"bitwise; controls caught {sum(1 for x in c.values() if x.get('detected'))}/{len(c)}  {'PASS' if r.get('ok') else 'FAIL'}"
              + (f"  error: {r['error']}" if r.get("error") else ""))
    bad += not r.get("ok")
if not rows or bad:
    print(f"kv-check: {bad} of {len(rows)} runs failed"); sys.exit(1)
PY
[ $fail -eq 0 ] && echo "kv-check: PASS" || echo "kv-check: FAIL"
exit $fail
