"""``disagg.py --model llama``: the harness with a real model on a GPU host.

Per mode (pull, push): two b2bd daemons, a prefill engine on
``--prefill-device`` and a decode engine on ``--decode-device``
(model_engine.py: a transformers Llama, random weights from a fixed seed,
KV in paged CUDA pools that b2b.connector moves), and a router here that
sends ``--requests`` requests with random prompt lengths, ``--concurrency``
in flight. The router computes each request's one-process reference on the
prefill GPU (the same model, its own cache) and compares every decoded
step's logits bit for bit. One request per mode is the negative control:
decode alters one of its received blocks, and the comparison must catch it.

    B2BD_BIN=bin/b2bd python3 deploy/disagg/disagg.py --model llama --decode-device 1 --json out.json
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List

import disagg
import model_engine


def add_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("--model llama")
    g.add_argument("--model", default="synthetic", choices=["synthetic", "llama"],
                   help="llama: engines run a transformers Llama on GPUs (model_engine.py)")
    g.add_argument("--modes", default="pull,push")
    g.add_argument("--prefill-device", type=int, default=0)
    g.add_argument("--decode-device", type=int, default=0)
    g.add_argument("--model-transport", default="local", help="the daemons' transport in --model mode")
    model_engine.add_model_args(g, prefix="model-")


def model_args(a: argparse.Namespace) -> List[str]:
    return ["--hidden", str(a.model_hidden), "--attn-heads", str(a.model_attn_heads), "--kv-heads", str(a.model_kv_heads),
            "--vocab", str(a.model_vocab), "--dtype", a.model_dtype, "--seed", str(a.model_seed),
            "--max-positions", str(a.model_max_positions), "--steps", str(a.steps)]


class ModelProc(disagg.Proc):
    script = "model_engine.py"


def reference_model(a: argparse.Namespace) -> Any:
    ns = argparse.Namespace(hidden=a.model_hidden, attn_heads=a.model_attn_heads, kv_heads=a.model_kv_heads,
                            vocab=a.model_vocab, dtype=a.model_dtype, seed=a.model_seed,
                            max_positions=a.model_max_positions, steps=a.steps)
    return model_engine.Llama(ns, a.layers, a.prefill_device)


def compare(torch: Any, m: Any, ref: tuple, tokens: List[int], logits: List[bytes]) -> dict:
    import numpy as np

    rt, rl = ref
    eq = [i < len(logits) and rl[i].tobytes() == logits[i] for i in range(len(rl))]
    diff = 0.0
    for i, b in enumerate(logits[: len(rl)]):
        got = torch.from_numpy(np.frombuffer(b, dtype=rl[i].dtype).copy()).view(m.dtype).float()
        want = torch.from_numpy(rl[i].copy()).view(m.dtype).float()
        diff = max(diff, float((got - want).abs().max()))
    return {"equal": all(eq) and len(logits) == len(rl) and tokens == rt, "equal_steps": sum(eq),
            "first_differing_step": next((i for i, e in enumerate(eq) if not e), None),
            "tokens_equal": tokens == rt, "max_abs_logit_diff": diff}


def run_mode(mode: str, a: argparse.Namespace, m: Any, refs: Dict[int, tuple], plens: List[int], alter: int) -> dict:
    work = tempfile.mkdtemp(prefix=f"disagg-model-{mode}-")
    tr = a.model_transport
    dp = disagg.Daemon("prefill", root=work, extra_args=["--transport", tr]).start()
    dd = disagg.Daemon("decode", root=work, extra_args=["--transport", tr]).start()
    disagg._CHILDREN.extend(d.proc for d in (dp, dd) if d.proc is not None)
    common = ["--mode", mode, "--transport", tr, "--layers", str(a.layers), "--heads", str(a.model_kv_heads),
              "--dim", str(a.model_hidden // a.model_attn_heads), "--kv-layout", "NHD", "--tp", "1",
              "--block-size", str(a.block_size), "--num-blocks", str(a.num_blocks),
              "--release-timeout", str(a.release_timeout), "--load-timeout", str(a.load_timeout)] + model_args(a)
    pre = ModelProc("prefill", dp, common + ["--device", str(a.prefill_device)], work)
    dec = ModelProc("decode", dd, common + ["--device", str(a.decode_device), "--alter-request", str(alter)], work)
    t_start = time.monotonic()
    pre.start()
    dec.start()
    start_s = time.monotonic() - t_start
    lp, ld = disagg.Link(pre.listen), disagg.Link(dec.listen)
    lock = threading.Lock()
    reqs: List[dict] = []
    errors: List[str] = []

    def one(i: int) -> None:
        rid, plen, seed = f"{i}.0", plens[i], i + 1
        pparams = {"do_remote_decode": True}
        try:
            if mode == "pull":
                p = lp.submit(rid, ("req", rid, plen, seed, pparams)).result(a.request_timeout)
                fd = ld.submit(rid, ("req", rid, plen, seed, p[2]["params"]))
            else:
                dparams = {"do_remote_prefill": True, "remote_engine_id": pre.engine_id,
                           "remote_peer": dp.peer_address, "remote_request_id": rid}
                fd = ld.submit(rid, ("req", rid, plen, seed, dparams))
                p = lp.submit(rid, ("req", rid, plen, seed, pparams)).result(a.request_timeout)
            d = fd.result(a.request_timeout)
        except Exception as e:  # a hang or a dead engine: this request fails
            with lock:
                errors.append(f"{rid}: {type(e).__name__}: {e}")
            return
        r = d[2]
        row = {"request": i, "prompt_tokens": plen, "blocks": -(-plen // a.block_size), "altered": r.get("altered", False),
               "load_failed": r.get("load_failed")}
        if "logits" in r:
            row.update(compare(m.torch, m, refs[i], r["tokens"], r["logits"]))
            row["decode_ms"] = round(r["decode_ms"], 2)
        if p[2].get("t_last_ns") and r.get("t_ready_ns"):
            row["handover_ms"] = round((r["t_ready_ns"] - p[2]["t_last_ns"]) / 1e6, 3)
        with lock:
            reqs.append(row)

    t0 = time.monotonic()
    with ThreadPoolExecutor(a.concurrency) as ex:
        list(ex.map(one, range(len(plens))))
    wall = time.monotonic() - t0
    deadline = time.monotonic() + a.release_timeout + 5
    while True:  # every block back in both pools
        stats = {k: l.submit("__stats", ("stats",)).result(30)[1] for k, l in (("prefill", lp), ("decode", ld))}
        leaked = sum(s["num_blocks"] - s["free"] for s in stats.values())
        if leaked == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for l in (lp, ld):
        l.send(("quit",))
    time.sleep(0.2)
    for pr in (pre, dec):
        pr.kill()
    dp.stop()
    dd.stop()
    reqs.sort(key=lambda r: r["request"])
    clean = [r for r in reqs if not r["altered"]]
    control = [r for r in reqs if r["altered"]]
    hand = [r["handover_ms"] for r in clean if "handover_ms" in r]
    row = {
        "model": "llama", "mode": mode, "transport": tr, "prefill_device": a.prefill_device,
        "decode_device": a.decode_device, "dtype": a.model_dtype, "steps": a.steps, "requests": len(plens),
        "concurrency": a.concurrency, "verified_bitwise": sum(1 for r in clean if r.get("equal")),
        "clean_requests": len(clean), "load_failed": sum(1 for r in reqs if r.get("load_failed")),
        "control_request": alter, "control_caught": bool(control) and not control[0].get("equal", True),
        "control": control[0] if control else None, "leaked_blocks": leaked, "errors": errors[:10],
        "handover_p50_ms": disagg.pct(hand, 0.5), "handover_max_ms": max(hand) if hand else None,
        "decode_p50_ms": disagg.pct([r["decode_ms"] for r in clean if "decode_ms" in r], 0.5),
        "wire_p50_ms": disagg.pct([w / 1e6 for s in stats.values() for w in s["wire_ns"]], 0.5),
        "engines_start_s": round(start_s, 1), "wall_s": round(wall, 2),
        "connector": {k: s["connector"] for k, s in stats.items()}, "per_request": reqs,
    }
    row["ok"] = (not errors and leaked == 0 and row["load_failed"] == 0 and row["control_caught"]
                 and row["verified_bitwise"] == len(clean) == len(plens) - 1)
    if row["ok"]:
        shutil.rmtree(work, ignore_errors=True)
    else:
        row["workdir"] = work
    return row


def main(a: argparse.Namespace) -> int:
    import json

    rng = random.Random(a.seed)
    if a.min_prompt < 2:
        raise SystemExit(f"--min-prompt {a.min_prompt}: decode computes the last prompt token, so at least 2")
    plens = [rng.randint(a.min_prompt, min(a.max_prompt, a.model_max_positions - a.steps - 1)) for _ in range(a.requests)]
    alter = rng.randrange(a.requests)
    t0 = time.monotonic()
    try:
        m = reference_model(a)
    except ImportError as e:
        raise SystemExit(f"--model llama needs torch, transformers and a GPU (deploy/gpu/disagg-model.sh): {e}") from e
    refs = {i: m.reference(model_engine.prompt_tokens(i + 1, n, a.model_vocab)) for i, n in enumerate(plens)}
    ref_s = time.monotonic() - t0
    rows = []
    for mode in [x.strip() for x in a.modes.split(",") if x.strip()]:
        row = run_mode(mode, a, m, refs, plens, alter)
        row["reference_s"] = round(ref_s, 2)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("per_request", "connector")}), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "args": vars(a)}, f, indent=1)
    bad = [r for r in rows if not r["ok"]]
    for r in bad:
        print(f"FAIL llama {r['mode']} GPU{r['prefill_device']}->GPU{r['decode_device']}: {r['errors']} "
              f"(logs in {r.get('workdir')})", file=sys.stderr)
    return 1 if bad or not rows else 0
