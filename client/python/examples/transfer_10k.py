#!/usr/bin/env python3
"""Transfer 10,000 random-slot blocks between two running b2bd daemons and verify them.

Starts nothing: give it the two daemons' local API sockets and the
destination daemon's peer address::

    python3 transfer_10k.py --src-socket /run/b2bd-a/b2bd.sock \\
        --dst-socket /run/b2bd-b/b2bd.sock --dst-peer 127.0.0.1:7480

Both daemons must run on this host (the script maps both regions to compare
bytes). The source region is filled with random bytes, the blocks are copied
to random, non-adjacent slots of an exported destination region, and every
block is verified twice: per-block CRC32C digests computed by each daemon,
and a numpy byte comparison of both mappings. Exit status 0 on success.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

try:
    import b2b
except ImportError:  # run from the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import b2b


def random_slots(n: int, block: int, gap: int, rng: np.random.Generator):
    """n blocks at random, non-adjacent slots: (offsets, region size)."""
    slot = block + gap
    return rng.permutation(n).astype(np.uint64) * np.uint64(slot), n * slot


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--src-socket", required=True, help="source daemon's local API (socket path, unix:// URI or host:port)")
    p.add_argument("--dst-socket", required=True, help="destination daemon's local API")
    p.add_argument("--dst-peer", required=True, help="destination daemon's peer address, host:port")
    p.add_argument("--blocks", type=int, default=10_000)
    p.add_argument("--block-size", type=int, default=4096)
    p.add_argument("--gap", type=int, default=64, help="bytes between slots, so no blocks merge")
    p.add_argument("--transport", choices=["tcp", "verbs", "local"], default=None, help="default: the daemons choose")
    p.add_argument("--export-name", default=f"transfer-10k-{os.getpid()}")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args()

    rng = np.random.default_rng(args.seed)
    n, bs = args.blocks, args.block_size
    src_off, src_size = random_slots(n, bs, args.gap, rng)
    dst_off, dst_size = random_slots(n, bs, args.gap, rng)

    with b2b.Client(args.src_socket) as a, b2b.Client(args.dst_socket) as b:
        sa, sb = a.status(), b.status()
        print(f"source {sa.node_name} (peer {sa.peer_address}), destination {sb.node_name} (peer {sb.peer_address})")
        with a.register_host(src_size) as src, b.register_host(dst_size, args.export_name) as dst:
            src.array[:] = rng.integers(0, 256, src_size, dtype=np.uint8)

            t0 = time.perf_counter()
            r = a.batch_transfer(
                src, args.dst_peer, dst.export_name, src_off, dst_off,
                block_size=bs, timeout=args.timeout, transport=args.transport,
            )
            wall = time.perf_counter() - t0
            print(
                f"transferred {r.blocks} blocks, {r.bytes} bytes over {r.transport} in {wall * 1e3:.2f} ms "
                f"(daemon data path {r.elapsed * 1e3:.2f} ms, {r.segments} segments, "
                f"{r.bytes / wall / 1e9:.2f} GB/s)"
            )
            if r.blocks != n or r.bytes != n * bs:
                print(f"FAIL: expected {n} blocks / {n * bs} bytes", file=sys.stderr)
                return 1

            # 1. Per-block checksums, computed by each daemon over its own memory.
            cs = a.checksum(src, src_off, block_size=bs, per_block=True)
            cd = b.checksum(dst, dst_off, block_size=bs, per_block=True)
            bad = np.flatnonzero(cs.block_digests != cd.block_digests)
            if bad.size or cs.digest != cd.digest:
                print(f"FAIL: {bad.size} blocks' {cs.algorithm} digests differ, first {bad[:10].tolist()}", file=sys.stderr)
                return 1
            print(f"checksums: {n} per-block {cs.algorithm} digests and the batch digest {cs.digest:#x} match")

            # 2. Byte comparison of both mappings (vectorised gather).
            cols = np.arange(bs, dtype=np.int64)
            got = dst.array[dst_off.astype(np.int64)[:, None] + cols]
            want = src.array[src_off.astype(np.int64)[:, None] + cols]
            diff = np.flatnonzero((got != want).any(axis=1))
            if diff.size:
                print(f"FAIL: {diff.size} blocks differ byte-wise, first {diff[:10].tolist()}", file=sys.stderr)
                return 1
            print(f"bytes: all {n} blocks identical ({n * bs} bytes compared)")
    print("OK")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except b2b.B2BError as e:
        print(f"b2b error: {e}", file=sys.stderr)
        sys.exit(2)
