#!/usr/bin/python3
"""Move 10,000 blocks from one b2bd daemon to another and verify every block:
the Python half of the README's quick start (examples/quickstart/quickstart.sh
runs it against two fresh daemons).

Run it with /usr/bin/python3, which has Debian's python3-grpcio,
python3-protobuf and python3-numpy, and the package on the path::

    PYTHONPATH=client/python /usr/bin/python3 examples/quickstart/quickstart.py \\
        --src /tmp/a/b2bd.sock --dst /tmp/b/b2bd.sock --peer 127.0.0.1:7480

(or ``pip install ./client/python`` into an environment that has grpcio and numpy).
"""

import argparse
import os
import sys

import numpy as np

import b2b

BLOCKS = 10_000
BLOCK_SIZE = 4096
STRIDE = 2 * BLOCK_SIZE  # a gap after every block, so that no two blocks merge into one


def main() -> int:
    p = argparse.ArgumentParser(description="b2bd quick start, Python")
    p.add_argument("--src", default=os.environ.get("B2BD_SOCKET"), help="the sending daemon's local API (default $B2BD_SOCKET)")
    p.add_argument("--dst", required=True, help="the receiving daemon's local API (socket path or host:port)")
    p.add_argument("--peer", required=True, help="the receiving daemon's peer address, host:port")
    args = p.parse_args()
    if not args.src:
        p.error("--src (or $B2BD_SOCKET) is required")

    with b2b.Client(args.src) as a, b2b.Client(args.dst) as b:
        export = f"quickstart-py-{os.getpid()}"
        with b.register_host(BLOCKS * STRIDE, export) as dst, a.register_host(BLOCKS * STRIDE) as src:
            # The region is the application's memory: view it as a pool of
            # BLOCKS slots of STRIDE bytes and fill each slot's block.
            pool = b2b.as_array(src, np.uint8, (BLOCKS, STRIDE))
            pool[:, :BLOCK_SIZE] = np.random.default_rng().integers(0, 256, (BLOCKS, BLOCK_SIZE), dtype=np.uint8)

            # Block i goes from slot i to slot BLOCKS-1-i: gapped on both sides.
            src_offsets = b2b.block_offsets(src, pool)
            dst_offsets = src_offsets[::-1].copy()
            r = a.batch_transfer(src, args.peer, export, src_offsets, dst_offsets, block_size=BLOCK_SIZE, timeout=60)
            print(f"python: {r.blocks} blocks, {r.bytes} bytes over {r.transport} in {r.elapsed * 1e3:.2f} ms")

            # Verify: each daemon hashes every block of its own region.
            want = a.checksum(src, src_offsets, block_size=BLOCK_SIZE, algorithm="xxh64", per_block=True)
            got = b.checksum(dst, dst_offsets, block_size=BLOCK_SIZE, algorithm="xxh64", per_block=True)
            if got.blocks != BLOCKS or not np.array_equal(want.block_digests, got.block_digests):
                print(f"python: FAIL: the destination's {got.blocks} block digests differ from the source's", file=sys.stderr)
                return 1
            print(f"python: verified {got.blocks} blocks (xxh64 of every block on both daemons)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
