#!/usr/bin/env python3
"""Two PyTorch processes exchange a CUDA tensor's blocks through their daemons.

The receiver allocates a CUDA tensor, registers it with its daemon through the
tensor's CUDA IPC handle (``register_cuda``) and exports it. The sender fills a
CUDA tensor from a seeded generator, registers it with its own daemon, and
transfers every other block, scattered (block i of the source to slot
``perm[i]`` of the destination). The receiver then rebuilds the expected tensor
from the same seed and checks the result with ``torch.equal``; blocks that were
not written must keep their sentinel value.

Usage: torch_exchange.py --src-socket A.sock --dst-socket B.sock --dst-peer HOST:PORT
       [--src-device 0] [--dst-device 1] [--blocks 10000] [--block-bytes 4096]
"""
import argparse
import multiprocessing as mp
import sys
import time

import numpy as np


def layout(blocks: int, seed: int):
    rng = np.random.default_rng(seed)
    src_slots = np.arange(0, 2 * blocks, 2, dtype=np.uint64)  # every other slot: never adjacent
    dst_slots = rng.permutation(blocks).astype(np.uint64) * 2 + 1
    return src_slots, dst_slots


def receiver(args, ready, done, result):
    import torch
    import b2b

    torch.cuda.set_device(args.dst_device)
    elems = args.block_bytes // 4
    dst = torch.full((2 * args.blocks * elems,), -1, dtype=torch.int32, device=f"cuda:{args.dst_device}")
    torch.cuda.synchronize()
    with b2b.Client(args.dst_socket) as c:
        region = c.register_cuda(dst, export_name="torch-dst")
        ready.set()
        done.wait(600)
        torch.cuda.synchronize()
        gen = torch.Generator(device="cpu").manual_seed(args.seed)
        src = torch.randint(-(2**31), 2**31 - 1, (2 * args.blocks * elems,), dtype=torch.int32, generator=gen)
        src_slots, dst_slots = layout(args.blocks, args.seed)
        expected = torch.full_like(src, -1)
        s = torch.from_numpy(src_slots.astype(np.int64))
        d = torch.from_numpy(dst_slots.astype(np.int64))
        expected.view(-1, elems)[d] = src.view(-1, elems)[s]
        ok = torch.equal(dst.cpu(), expected)
        result.put(("ok" if ok else "MISMATCH", int(region.size)))
        region.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--src-socket", required=True)
    p.add_argument("--dst-socket", required=True)
    p.add_argument("--dst-peer", required=True)
    p.add_argument("--src-device", type=int, default=0)
    p.add_argument("--dst-device", type=int, default=0)
    p.add_argument("--blocks", type=int, default=10000)
    p.add_argument("--block-bytes", type=int, default=4096)
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args()

    ctx = mp.get_context("spawn")
    ready, done, result = ctx.Event(), ctx.Event(), ctx.Queue()
    rx = ctx.Process(target=receiver, args=(args, ready, done, result))
    rx.start()
    if not ready.wait(120):
        print("torch-exchange: receiver did not register its tensor", file=sys.stderr)
        rx.kill()
        return 1

    import torch
    import b2b

    torch.cuda.set_device(args.src_device)
    elems = args.block_bytes // 4
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    src_host = torch.randint(-(2**31), 2**31 - 1, (2 * args.blocks * elems,), dtype=torch.int32, generator=gen)
    src = src_host.to(f"cuda:{args.src_device}")
    torch.cuda.synchronize()
    src_slots, dst_slots = layout(args.blocks, args.seed)
    bb = np.uint64(args.block_bytes)
    with b2b.Client(args.src_socket) as c:
        region = c.register_cuda(src)
        t0 = time.perf_counter()
        r = c.batch_transfer(region, args.dst_peer, "torch-dst", src_slots * bb, dst_slots * bb,
                             block_size=args.block_bytes, timeout=120)
        dt = time.perf_counter() - t0
        region.close()
    done.set()
    verdict, size = result.get(timeout=300)
    rx.join(60)
    print(f"torch-exchange: {r.blocks} blocks x {args.block_bytes} B cuda:{args.src_device} -> cuda:{args.dst_device} "
          f"over {r.transport} in {dt*1e3:.1f} ms; receiver torch.equal: {verdict}")
    return 0 if verdict == "ok" and rx.exitcode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
