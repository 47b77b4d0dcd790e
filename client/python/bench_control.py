#!/usr/bin/env python3
"""The Python rows of ``b2b-bench --workload control``, on the bench's own
daemons: per-request cost of a ping, a prepared submit of 1 × 128 B block,
an async start of it polled until its outcome, 64 such starts in one call
and one wait for them all (per request), and a block-id transfer of 1 id ×
64 segments, over gRPC
(``Client(ring=False)``) and over the ring, alternating runs of 100 calls
after 50 of warm-up. Writes a JSON list of rows (workload "control", path
"grpc"|"ring", client "python", op (ping, submit, start_poll,
start_batch64, blocks), calls, us_per_request {median, p99}).

Usage: ``bench_control.py --api SRC.sock --submit SUBMIT.sock --dst-api
DST.sock --peer HOST:PORT --json OUT.json``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the source tree's b2b

import b2b  # noqa: E402

WARMUP, CHUNK = 50, 100
BATCH, BATCH_CALLS, BATCH_CHUNK = 64, 100, 10  # start_batch64: batches per path, in runs of 10
SEGS, NB, BL = 64, 4, 128


def interleave(n: int, grpc_fn, ring_fn, chunk: int = CHUNK):
    """Per-call ns of each, in alternating runs of chunk after WARMUP."""
    out = ([], [])
    total = WARMUP + n
    for i0 in range(0, total, chunk):
        for k, f in enumerate((grpc_fn, ring_fn)):
            for i in range(i0, min(i0 + chunk, total)):
                t = time.perf_counter_ns()
                f()
                d = time.perf_counter_ns() - t
                if i >= WARMUP:
                    out[k].append(d)
    return out


def start_poll(c, plan):
    """One async start of plan, then polls until its outcome (the ring's:
    its completion); raises if it did not succeed."""
    h = c.start_submits([plan])[0]
    while not c.poll([h])[0]:
        os.sched_yield()  # as a polling engine would do other work: the daemons may need this core
    return h.result


def start_batch(c, plan):
    """BATCH starts of plan in one call (gRPC: StartTransfers; ring: one
    publish), then one wait for them all; raises if one did not succeed."""
    hs = c.start_many([plan] * BATCH)
    c.wait_all(hs)
    for h in hs:
        h.result  # noqa: B018 (raises the transfer's error)


def rows(op: str, blocks: int, g, r):
    out = []
    for path, s in (("grpc", g), ("ring", r)):
        a = np.asarray(s, dtype=np.float64) / 1e3
        row = {"workload": "control", "path": path, "client": "python", "op": op, "calls": len(s),
               "us_per_request": {"median": round(float(np.median(a)), 2), "p99": round(float(np.percentile(a, 99)), 2)}}
        if blocks:
            row["blocks"], row["block_bytes"] = blocks, BL
        out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--api", required=True, help="the source daemon's API socket")
    ap.add_argument("--submit", required=True, help="the source daemon's submit socket")
    ap.add_argument("--dst-api", required=True, help="the destination daemon's API socket")
    ap.add_argument("--peer", required=True, help="the destination's peer address")
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    out = []
    tag = f"b2b-bench-control-py-{os.getpid()}"
    with b2b.Client(args.api, ring=args.submit) as cr, b2b.Client(args.api, ring=False) as cg, b2b.Client(args.dst_api) as cb:
        if cr.ring is None:
            raise SystemExit(f"no ring: {cr._ring.reason}")
        g, r = interleave(args.calls, cg.ping, cr.ring.ping)
        out += rows("ping", 0, g, r)
        size = SEGS * NB * BL
        with cr.register_host(size) as src, cb.register_host(size, tag) as dst:
            src.array[:] = np.random.default_rng(3).integers(0, 256, size, dtype=np.uint8)
            off = np.zeros(1, np.uint64)
            pr = cr.prepare(src, args.peer, tag, off, off, block_size=BL)
            pg = cg.prepare(src, args.peer, tag, off, off, block_size=BL)
            g, r = interleave(args.calls, pg.submit, pr.submit)
            if not np.array_equal(src.array[:BL], dst.array[:BL]):
                raise SystemExit("submit: the destination block differs from the source")
            out += rows("submit", 1, g, r)
            g, r = interleave(args.calls, lambda: start_poll(cg, pg), lambda: start_poll(cr, pr))
            out += rows("start_poll", 1, g, r)
            g, r = interleave(BATCH_CALLS, lambda: start_batch(cg, pg), lambda: start_batch(cr, pr), chunk=BATCH_CHUNK)
            out += rows("start_batch64", 1, [d / BATCH for d in g], [d / BATCH for d in r])
            src.array[:BL] = np.random.default_rng(4).integers(0, 256, BL, dtype=np.uint8)  # the ring alone moves fresh bytes
            start_batch(cr, pr)
            if not np.array_equal(src.array[:BL], dst.array[:BL]):
                raise SystemExit("start_batch64: the destination block differs from the source")
            pr.release(), pg.release()
            lay = lambda reg: [(reg, s * BL, BL, SEGS * BL) for s in range(SEGS)]  # noqa: E731
            cr.register_layout(tag, lay(src), NB)
            cb.register_layout(tag, lay(dst), NB, export_name=tag)
            try:
                before = cr.ring._tag
                g, r = interleave(args.calls, lambda: cg.transfer_blocks(tag, args.peer, tag, [1], [2]),
                                  lambda: cr.transfer_blocks(tag, args.peer, tag, [1], [2]))
                if cr.ring._tag - before < args.calls:
                    raise SystemExit("blocks: the ring did not take the transfers")
                a, b = SEGS * BL, 2 * SEGS * BL
                if not np.array_equal(src.array[a:a + SEGS * BL], dst.array[b:b + SEGS * BL]):
                    raise SystemExit("blocks: the destination block differs from the source")
                out += rows("blocks", SEGS, g, r)
            finally:
                cr.deregister_layout(tag)
                cb.deregister_layout(tag)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
