#!/usr/bin/env python3
"""A small Llama split across two processes: prefill's KV cache moved by b2bd into decode's paged pool.

Both processes build the same Llama-style model from a LlamaConfig with a fixed seed (4 layers,
hidden 512, 8 heads, 2 KV heads, vocab 1000; nothing is downloaded), and check that their
weights are bitwise equal.

* prefill (this process) runs the prompt, copies each layer's K and V into a paged pool (one
  tensor per layer and K/V, [num_blocks, block_size, kv_heads, head_dim], vLLM's layout) at
  scattered block ids, registers the pool with b2b.kv and moves the request's blocks into
  decode's pool at OTHER ids (Layout.transfer_blocks). It then goes on decoding with its own
  cache: the one-process reference.
* decode (a spawned process, on --dst-device) rebuilds the cache from its pool (DynamicCache, or
  the legacy tuple format on an old transformers) and generates greedily --steps tokens,
  recording every step's logits.

The check: the tokens and every step's logits bitwise equal (torch.equal on the raw bits).
Negative controls, in the same run: decode generates again from its pool with one received
block zeroed (a V block of layer 0) and, separately, two received blocks swapped (K of the
last layer); each must make the logits differ, or the script fails (a check that cannot fail
proves nothing).

Usage: kv_llama.py --src-socket A.sock --dst-socket B.sock --dst-peer HOST:PORT
       [--transport local|tcp|auto] [--src-device 0] [--dst-device 0] [--dtypes fp32,bf16]
Prints one JSON line per dtype and a summary line; exits 1 unless every check passed.
"""
import argparse
import hashlib
import json
import math
import multiprocessing as mp
import os
import sys
import time

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")  # CUDA IPC needs cudaMalloc blocks
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


# ---------------------------------------------------------------------------
# The model and its cache, across transformers versions.


def build_model(torch, args, dtype, device):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
    except TypeError:  # an old torch without warn_only
        pass
    cfg = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 2 + args.hidden // 2,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.prompt + args.steps + 64, rms_norm_eps=1e-5, tie_word_embeddings=False,
    )
    try:
        cfg._attn_implementation = args.attn  # read at construction by transformers < 4.48
    except Exception:
        pass
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(cfg)  # initialised on the CPU: the same weights in both processes
    if hasattr(model, "set_attn_implementation"):  # transformers >= 4.56
        try:
            model.set_attn_implementation(args.attn)
        except Exception:
            pass
    model = model.to(dtype=dtype).to(device).eval()
    return model


def weights_digest(torch, model):
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def cache_class():
    try:
        from transformers import DynamicCache

        return DynamicCache
    except ImportError:  # transformers < 4.36: tuples of (k, v)
        return None


def new_cache():
    cls = cache_class()
    return cls() if cls is not None else None


def cache_kv(cache, layers):
    """[(k, v)] per layer, each [batch, kv_heads, seq, head_dim], whatever the cache's format."""
    if isinstance(cache, (tuple, list)):
        return [(cache[i][0], cache[i][1]) for i in range(layers)]
    if getattr(cache, "layers", None) and hasattr(cache.layers[0], "keys"):  # transformers >= 4.56
        return [(cache.layers[i].keys, cache.layers[i].values) for i in range(layers)]
    if hasattr(cache, "key_cache"):  # 4.36 - 4.55
        return [(cache.key_cache[i], cache.value_cache[i]) for i in range(layers)]
    return [tuple(cache[i][:2]) for i in range(layers)]


def cache_from(kv):
    """A cache holding kv, in the format the installed transformers takes."""
    cls = cache_class()
    if cls is None:
        return tuple((k, v) for k, v in kv)
    c = cls()
    for i, (k, v) in enumerate(kv):
        c.update(k, v, i)
    return c


def cache_format():
    cls = cache_class()
    return "legacy-tuples" if cls is None else f"{cls.__module__}.{cls.__name__}.update"


def decode_steps(torch, model, cache, first_token, steps):
    """Greedy decoding from a filled cache: (tokens, per-step logits). Each step's logits are
    kept as (raw bits, float32 copy) numpy arrays: they cross processes by value, and the bits
    are what is compared."""
    tokens, logits = [], []
    tok = torch.tensor([[first_token]], device=next(model.parameters()).device)
    with torch.no_grad():
        for _ in range(steps):
            out = model(input_ids=tok, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            step = out.logits[:, -1, :]
            logits.append((bits(torch, step).cpu().numpy(), step.float().cpu().numpy()))
            tok = step.argmax(dim=-1, keepdim=True)
            tokens.append(int(tok.item()))
    return tokens, logits


def bits(torch, t):
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def same_bits(torch, a, b):
    """Bitwise equality of two steps' logits (torch.equal on their raw bits)."""
    return a[0].dtype == b[0].dtype and a[0].shape == b[0].shape and torch.equal(torch.from_numpy(a[0]), torch.from_numpy(b[0]))


def plan(args):
    """Prompt tokens and the request's block ids on both sides (the same in both processes)."""
    import numpy as np

    rng = np.random.default_rng(args.seed)
    prompt = rng.integers(0, args.vocab, size=args.prompt).tolist()
    nblocks = math.ceil(args.prompt / args.block_size)
    src = rng.choice(args.pool, size=nblocks, replace=False).astype(np.int64)
    dst = rng.choice(args.pool, size=nblocks, replace=False).astype(np.int64)
    return prompt, src, dst


def pool_shape(args):
    return (args.pool, args.block_size, args.kv_heads, args.hidden // args.heads)


def pool_names(args):
    return [f"layer{i}.{kv}" for i in range(args.layers) for kv in ("k", "v")]


def gather(torch, pools, ids, args, seq):
    """The cache's (k, v) per layer from a pool's blocks ``ids``: [1, kv_heads, seq, head_dim]."""
    kv = []
    names = pool_names(args)
    for i in range(args.layers):
        pair = []
        for name in names[2 * i:2 * i + 2]:
            blocks = pools[name][ids]  # [nblocks, block_size, kv_heads, head_dim]
            flat = blocks.reshape(-1, blocks.shape[2], blocks.shape[3])[:seq]  # [seq, kv_heads, head_dim]
            pair.append(flat.transpose(0, 1).unsqueeze(0).contiguous())
        kv.append(tuple(pair))
    return kv


# ---------------------------------------------------------------------------
# Processes.


def decode(args, ready, go, result):
    try:
        import torch
        import b2b

        device = f"cuda:{args.dst_device}"
        torch.cuda.set_device(args.dst_device)
        with b2b.Client(args.dst_socket, timeout=120) as c:
            c.wait_ready(30)
            for dname in args.dtypes:
                dtype = getattr(torch, DTYPES[dname])
                model = build_model(torch, args, dtype, device)
                pools = {n: torch.full(pool_shape(args), float("nan"), dtype=dtype, device=device) for n in pool_names(args)}
                torch.cuda.synchronize()
                lay = b2b.kv.register(c, pools, name=f"llama-decode-{dname}", export_name=f"llama-decode-{dname}")
                ready.put({"dtype": dname, "weights": weights_digest(torch, model),
                           "attn": getattr(model.config, "_attn_implementation", None)})
                msg = go.get(timeout=1800)
                if msg.get("stop"):
                    lay.close()
                    return
                torch.cuda.synchronize()
                _, _, dst = plan(args)
                ids = torch.from_numpy(dst).to(device)
                out = {"dtype": dname}
                kv = gather(torch, pools, ids, args, args.prompt)
                out["tokens"], out["logits"] = decode_steps(torch, model, cache_from(kv), msg["first_token"], args.steps)
                # Negative controls: corrupt one received block in a copy of the pool, decode again.
                controls = {}
                zeroed = dict(pools)
                zeroed["layer0.v"] = pools["layer0.v"].clone()
                zeroed["layer0.v"][int(dst[0])] = 0
                controls["zero_v_block"] = decode_steps(torch, model, cache_from(gather(torch, zeroed, ids, args, args.prompt)),
                                                        msg["first_token"], args.steps)
                if len(dst) > 1:
                    swapped = dict(pools)
                    last = f"layer{args.layers - 1}.k"
                    swapped[last] = pools[last].clone()
                    a, b = int(dst[0]), int(dst[1])
                    swapped[last][a], swapped[last][b] = pools[last][b].clone(), pools[last][a].clone()
                    controls["swap_k_blocks"] = decode_steps(torch, model, cache_from(gather(torch, swapped, ids, args, args.prompt)),
                                                             msg["first_token"], args.steps)
                out["controls"] = controls
                lay.close()
                result.put(out)
                del model, pools
                torch.cuda.empty_cache()
    except BaseException as e:
        err = {"error": f"{type(e).__name__}: {e}"}
        ready.put(err)
        result.put(err)
        raise


def compare(torch, ref_tokens, ref_logits, tokens, logits):
    eq_steps = sum(1 for a, b in zip(ref_logits, logits) if same_bits(torch, a, b))
    first_diff = next((i for i, (a, b) in enumerate(zip(ref_logits, logits)) if not same_bits(torch, a, b)), None)
    max_abs = max((float(abs(a[1] - b[1]).max()) for a, b in zip(ref_logits, logits)), default=0.0)
    return {
        "tokens_equal": tokens == ref_tokens,
        "logits_equal_steps": eq_steps,
        "steps": len(ref_logits),
        "first_differing_step": first_diff,
        "max_abs_logit_diff": max_abs,
        "equal": tokens == ref_tokens and eq_steps == len(ref_logits) == len(logits),
    }


def run_dtype(torch, b2b, c, args, dname, info, go, result):
    device = f"cuda:{args.src_device}"
    dtype = getattr(torch, DTYPES[dname])
    model = build_model(torch, args, dtype, device)
    row = {"script": "kv_llama", "dtype": dname, "transport_asked": args.transport, "src_device": args.src_device,
           "dst_device": args.dst_device, "cache_format": cache_format(), "attn": getattr(model.config, "_attn_implementation", None),
           "weights_equal": weights_digest(torch, model) == info["weights"]}
    prompt, src, dst = plan(args)
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    # Other blocks hold noise, so that a wrong id would be seen.
    pools = {n: torch.randn(pool_shape(args), generator=gen).to(dtype).to(device) for n in pool_names(args)}
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt], device=device), past_key_values=new_cache(), use_cache=True)
    cache = out.past_key_values
    first = int(out.logits[:, -1, :].argmax(dim=-1).item())
    bs = args.block_size
    nblocks = len(src)
    ids = torch.from_numpy(src).to(device)
    for i, (k, v) in enumerate(cache_kv(cache, args.layers)):
        for name, t in ((f"layer{i}.k", k), (f"layer{i}.v", v)):
            seq = t[0].transpose(0, 1)  # [seq, kv_heads, head_dim]
            padded = torch.zeros((nblocks * bs,) + tuple(seq.shape[1:]), dtype=dtype, device=device)
            padded[: seq.shape[0]] = seq
            pools[name][ids] = padded.view(nblocks, bs, seq.shape[1], seq.shape[2])
    torch.cuda.synchronize()
    lay = b2b.kv.register(c, pools, name=f"llama-prefill-{dname}")
    t0 = time.perf_counter()
    r = lay.transfer_blocks(args.dst_peer, f"llama-decode-{dname}", src, dst,
                            transport=None if args.transport == "auto" else args.transport, timeout=120)
    row.update(transfer_ms=(time.perf_counter() - t0) * 1e3, blocks=r.blocks, bytes=r.bytes, transport=r.transport,
               regions=len(lay.regions), segments=len(lay.segments))
    lay.close()
    go.put({"first_token": first})
    # The one-process reference: the same model decoding from its own cache.
    ref_tokens, ref_logits = decode_steps(torch, model, cache, first, args.steps)
    got = result.get(timeout=1800)
    if "error" in got:
        raise RuntimeError(f"decode process: {got['error']}")
    row.update(compare(torch, ref_tokens, ref_logits, got["tokens"], got["logits"]))
    row["controls"] = {}
    for name, (ct, cl) in got["controls"].items():
        cmp = compare(torch, ref_tokens, ref_logits, ct, cl)
        row["controls"][name] = {"detected": not cmp["equal"], "tokens_equal": cmp["tokens_equal"],
                                 "logits_equal_steps": cmp["logits_equal_steps"], "max_abs_logit_diff": cmp["max_abs_logit_diff"]}
    row["controls_detected"] = bool(row["controls"]) and all(x["detected"] for x in row["controls"].values())
    row["ok"] = bool(row["weights_equal"] and row["equal"] and row["controls_detected"]
                     and r.blocks == nblocks * 2 * args.layers)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--src-socket", default=os.environ.get("B2B_SRC_SOCKET"))
    p.add_argument("--dst-socket", default=os.environ.get("B2B_DST_SOCKET"))
    p.add_argument("--dst-peer", default=os.environ.get("B2B_DST_PEER"))
    p.add_argument("--transport", default="auto", choices=["auto", "local", "tcp", "verbs"])
    p.add_argument("--src-device", type=int, default=0)
    p.add_argument("--dst-device", type=int, default=0)
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--prompt", type=int, default=200, help="prompt tokens")
    p.add_argument("--steps", type=int, default=32, help="greedy decode steps")
    p.add_argument("--block-size", type=int, default=16, help="tokens per block")
    p.add_argument("--pool", type=int, default=64, help="blocks per pool tensor")
    p.add_argument("--attn", default="eager", help="attention implementation (eager, sdpa)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--json", help="also write the JSON lines here")
    args = p.parse_args()
    for k in ("src_socket", "dst_socket", "dst_peer"):
        if not getattr(args, k):
            p.error(f"--{k.replace('_', '-')} (or B2B_{k.upper()}) is required")
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for d in args.dtypes:
        if d not in DTYPES:
            p.error(f"--dtypes: {d!r} is not one of {sorted(DTYPES)}")
    if math.ceil(args.prompt / args.block_size) > args.pool:
        p.error("--pool is too small for the prompt")

    ctx = mp.get_context("spawn")
    ready, go, result = ctx.Queue(), ctx.Queue(), ctx.Queue()
    rx = ctx.Process(target=decode, args=(args, ready, go, result))
    rx.start()
    rows = []
    try:
        import torch
        import b2b

        torch.cuda.set_device(args.src_device)
        with b2b.Client(args.src_socket, timeout=120) as c:
            c.wait_ready(30)
            for dname in args.dtypes:
                info = ready.get(timeout=900)
                if "error" in info:
                    raise RuntimeError(f"decode process: {info['error']}")
                try:
                    row = run_dtype(torch, b2b, c, args, dname, info, go, result)
                except BaseException as e:
                    row = {"script": "kv_llama", "dtype": dname, "ok": False, "error": f"{type(e).__name__}: {e}"}
                    go.put({"stop": True})
                    rows.append(row)
                    print(json.dumps(row, sort_keys=True), flush=True)
                    break
                rows.append(row)
                print(json.dumps(row, sort_keys=True), flush=True)
    except BaseException as e:
        rows.append({"script": "kv_llama", "ok": False, "error": f"{type(e).__name__}: {e}"})
        print(json.dumps(rows[-1], sort_keys=True), flush=True)
        go.put({"stop": True})
    finally:
        rx.join(300)
        if rx.is_alive():
            rx.kill()
    ok = len(rows) == len(args.dtypes) and all(r.get("ok") for r in rows) and rx.exitcode == 0
    summary = {"script": "kv_llama", "summary": True, "ok": ok, "decode_exit": rx.exitcode,
               "dtypes": {r.get("dtype", "?"): r.get("ok") for r in rows}, "transport_asked": args.transport,
               "src_device": args.src_device, "dst_device": args.dst_device}
    print(json.dumps(summary, sort_keys=True), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            for r in rows + [summary]:
                f.write(json.dumps(r, sort_keys=True) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
