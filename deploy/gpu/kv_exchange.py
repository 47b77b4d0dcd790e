#!/usr/bin/env python3
"""Two PyTorch processes move a request's KV blocks by id through two b2bd daemons (b2b.kv).

"prefill" (this process) fills LAYERS paged tensors [num_blocks, block_size, heads, head_dim]
(vLLM's layout, one per layer and K/V) with a known per-layer, per-block pattern. "decode" (a
spawned process, on its own GPU when --dst-device differs) registers its own pool, zeroed to a
sentinel, exported as a layout. Prefill sends REQUEST random blocks to OTHER random block ids
with Layout.transfer_blocks; decode then checks every received block of every layer with
torch.equal, and that every other block still holds the sentinel.

Defaults are the issue's request: 160 layers, 8 KiB blocks (16 tokens x 2 heads x 128 dims,
bf16), 1,024 blocks per layer, 512 ids per request: 81,920 blocks, 640 MiB.

Usage: kv_exchange.py --src-socket A.sock --dst-socket B.sock --dst-peer HOST:PORT
       [--transport local|tcp|auto] [--src-device 0] [--dst-device 0] [--json OUT.json]
Prints one JSON line (also written to --json); exits 1 if any block is wrong.
"""
import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

# CUDA IPC needs cudaMalloc'd blocks, not expandable segments; the spawned child inherits this.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")

SENTINEL = -1  # int16 0xFFFF: the pattern below never produces it


def block_shape(args):
    """[block_size, heads, head_dim] of bf16 giving --block-bytes."""
    elems = args.block_bytes // 2
    heads, head_dim = args.heads, args.head_dim
    if elems % (heads * head_dim):
        raise SystemExit(f"--block-bytes {args.block_bytes} is not a multiple of heads*head_dim*2 = {heads * head_dim * 2}")
    return elems // (heads * head_dim), heads, head_dim


def pattern(torch, layer, ids, elems, device):
    """Block contents as int16, distinct per layer and block, never SENTINEL."""
    col = torch.arange(elems, device=device, dtype=torch.int64)
    v = (ids.to(torch.int64)[:, None] * 1000003 + layer * 7919 + col[None, :]) % 32749
    return v.to(torch.int16)


def request_ids(args):
    import numpy as np

    rng = np.random.default_rng(args.seed)
    src = rng.choice(args.pool, size=args.request, replace=False)
    dst = rng.choice(args.pool, size=args.request, replace=False)
    return src.astype(np.int64), dst.astype(np.int64)


def decode(args, ready, go, result):
    try:
        import torch
        import b2b

        dev = f"cuda:{args.dst_device}"
        torch.cuda.set_device(args.dst_device)
        bs, h, d = block_shape(args)
        pools = {}
        for layer in range(args.layers):
            t = torch.empty((args.pool, bs, h, d), dtype=torch.bfloat16, device=dev)
            t.view(torch.int16).fill_(SENTINEL)
            pools[f"layer{layer // 2}.{'kv'[layer % 2]}"] = t
        torch.cuda.synchronize()
        with b2b.Client(args.dst_socket, timeout=120) as c:
            c.wait_ready(30)
            lay = b2b.kv.register(c, pools, name="kv-decode", export_name="kv-decode")
            ready.put({"segments": len(lay.segments), "regions": len(lay.regions)})
            if go.get(timeout=1800) != "check":
                lay.close()
                return
            torch.cuda.synchronize()
            src_ids, dst_ids = request_ids(args)
            s = torch.from_numpy(src_ids).to(dev)
            dmask = torch.ones(args.pool, dtype=torch.bool, device=dev)
            dmask[torch.from_numpy(dst_ids).to(dev)] = False
            elems = bs * h * d
            bad = []
            for i, (name, t) in enumerate(pools.items()):
                flat = t.view(torch.int16).view(args.pool, elems)
                got = flat[torch.from_numpy(dst_ids).to(dev)]
                if not torch.equal(got, pattern(torch, i, s, elems, dev)):
                    rows = (got != pattern(torch, i, s, elems, dev)).any(dim=1).nonzero().flatten().tolist()
                    bad.append({"tensor": name, "wrong_entries": rows[:8], "count": len(rows)})
                untouched = flat[dmask]
                if not torch.equal(untouched, torch.full_like(untouched, SENTINEL)):
                    bad.append({"tensor": name, "untouched_blocks_changed": True})
            lay.close()
        result.put({"verified": not bad, "bad": bad[:10]})
    except BaseException as e:  # report, do not hang the parent
        ready.put({"error": f"{type(e).__name__}: {e}"})
        result.put({"verified": False, "error": f"{type(e).__name__}: {e}"})
        raise


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--src-socket", default=os.environ.get("B2B_SRC_SOCKET"), help="prefill daemon's socket (env B2B_SRC_SOCKET)")
    p.add_argument("--dst-socket", default=os.environ.get("B2B_DST_SOCKET"), help="decode daemon's socket (env B2B_DST_SOCKET)")
    p.add_argument("--dst-peer", default=os.environ.get("B2B_DST_PEER"), help="decode daemon's peer address (env B2B_DST_PEER)")
    p.add_argument("--transport", default="auto", choices=["auto", "local", "tcp", "verbs"])
    p.add_argument("--src-device", type=int, default=0)
    p.add_argument("--dst-device", type=int, default=0)
    p.add_argument("--layers", type=int, default=160, help="paged tensors (layers x K/V)")
    p.add_argument("--block-bytes", type=int, default=8192)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--pool", type=int, default=1024, help="blocks per tensor")
    p.add_argument("--request", type=int, default=512, help="ids per request")
    p.add_argument("--iters", type=int, default=5, help="timed transfers of the request (the same blocks each time)")
    p.add_argument("--seed", type=int, default=23)
    p.add_argument("--json", help="also write the summary here")
    args = p.parse_args()
    for k in ("src_socket", "dst_socket", "dst_peer"):
        if not getattr(args, k):
            p.error(f"--{k.replace('_', '-')} (or its env variable) is required")
    if args.request > args.pool:
        p.error("--request must not exceed --pool")

    ctx = mp.get_context("spawn")
    ready, go, result = ctx.Queue(), ctx.Queue(), ctx.Queue()
    rx = ctx.Process(target=decode, args=(args, ready, go, result))
    rx.start()
    summary = {"script": "kv_exchange", "transport_asked": args.transport, "src_device": args.src_device,
               "dst_device": args.dst_device, "layers": args.layers, "block_bytes": args.block_bytes,
               "pool": args.pool, "request": args.request}
    ok = False
    try:
        info = ready.get(timeout=600)
        if "error" in info:
            raise RuntimeError(f"decode process: {info['error']}")
        summary["decode_regions"] = info["regions"]

        import torch
        import b2b

        dev = f"cuda:{args.src_device}"
        torch.cuda.set_device(args.src_device)
        bs, h, d = block_shape(args)
        elems = bs * h * d
        pools = {}
        all_ids = torch.arange(args.pool, device=dev)
        for i in range(args.layers):
            t = torch.empty((args.pool, bs, h, d), dtype=torch.bfloat16, device=dev)
            t.view(torch.int16).view(args.pool, elems).copy_(pattern(torch, i, all_ids, elems, dev))
            pools[f"layer{i // 2}.{'kv'[i % 2]}"] = t
        torch.cuda.synchronize()
        src_ids, dst_ids = request_ids(args)
        with b2b.Client(args.src_socket, timeout=120) as c:
            c.wait_ready(30)
            lay = b2b.kv.register(c, pools, name="kv-prefill")
            summary["prefill_regions"] = len(lay.regions)
            summary["segments"] = len(lay.segments)
            tr = None if args.transport == "auto" else args.transport
            times, r = [], None
            for _ in range(max(1, args.iters)):
                t0 = time.perf_counter()
                r = lay.transfer_blocks(args.dst_peer, "kv-decode", src_ids, dst_ids, transport=tr, timeout=300)
                times.append(time.perf_counter() - t0)
            summary.update(blocks=r.blocks, bytes=r.bytes, transport=r.transport,
                           median_ms=statistics.median(times) * 1e3, min_ms=min(times) * 1e3,
                           phases_ns=r.phases.as_dict() if r.phases else None)
            # The async form, where the daemon has StartTransfer: the same request through a handle.
            try:
                hnd = lay.transfer_blocks(args.dst_peer, "kv-decode", src_ids, dst_ids, transport=tr, timeout=300, wait=False)
                t0 = time.perf_counter()
                ar = hnd.wait(timeout=300)
                summary["async"] = {"blocks": ar.blocks, "ms": (time.perf_counter() - t0) * 1e3, "done": hnd.done()}
            except b2b.UnimplementedError as e:
                summary["async"] = f"unimplemented: {e.message}"
            except b2b.B2BError as e:  # a real failure of the async path: reported, and the run fails
                summary["async"] = f"failed: {e}"
                summary["async_failed"] = True
            lay.close()
        go.put("check")
        res = result.get(timeout=1800)
        summary.update(res)
        ok = (bool(res.get("verified")) and summary.get("blocks") == args.layers * args.request
              and not summary.get("async_failed"))
    except BaseException as e:
        summary["error"] = f"{type(e).__name__}: {e}"
        go.put("stop")
    finally:
        rx.join(120)
        if rx.is_alive():
            rx.kill()
        summary["decode_exit"] = rx.exitcode
    ok = ok and rx.exitcode == 0
    summary["ok"] = ok
    line = json.dumps(summary, sort_keys=True)
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
