#!/usr/bin/env python3
"""Time the Python client's ring round trip against its gRPC call, same run.

Starts two daemons on loopback (the source with ``--submit-socket``) unless
pointed at running ones, then alternates runs of ``--calls`` calls of each
pair, ``--rounds`` times, and reports per-call medians (µs) and ring/gRPC:

* ping        -- ``Client.ring.ping()`` vs ``Client.ping()`` (gRPC Ping);
* submit_1    -- ``PreparedTransfer.submit()`` of 1 × 128 B block, through
                 the ring (the default client) vs ``Client(ring=False)``;
* submit_10k  -- the same of 10,000 × 128 B blocks (random, unmerged slots);
* blocks_64seg -- ``Client.transfer_blocks`` of 1 id of a 64-segment layout
                 of 128 B blocks, through the ring (a bound route) vs gRPC
                 (TransferBlocks); the landed bytes are checked;
* many_64x32  -- ``Client.start_many`` of 64 ``b2b.Blocks`` of 32 ids each
                 with a JSON notification (a KV connector's step), then
                 ``wait_all``: per request, the start alone (``start``) and
                 start plus wait (``step``); ring (id arena records, one
                 publish) vs ``Client(ring=False)`` (StartTransfers,
                 WaitTransfers). Runs of ``--calls // 10`` steps.

Usage: ``python3 client/python/bench_ring.py [--b2bd bin/b2bd] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # the source tree's b2b
sys.path.insert(0, os.path.join(HERE, "tests"))

import b2b  # noqa: E402


class _Done(Exception):
    """Ends a run of --only early with its figures."""

    def __init__(self, out: dict) -> None:
        super().__init__("done")
        self.out = out


def per_call(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def pair(ring_fn, grpc_fn, calls: int, rounds: int) -> dict:
    ring_fn(), grpc_fn()  # warm
    r, g = [], []
    for _ in range(rounds):
        r.append(per_call(ring_fn, calls))
        g.append(per_call(grpc_fn, calls))
    rm, gm = float(np.median(r)) * 1e6, float(np.median(g)) * 1e6
    return {"ring_us": round(rm, 2), "grpc_us": round(gm, 2), "ratio": round(rm / gm, 4)}


def blocks_64seg(cr, cg, cb, peer: str, args) -> dict:
    """1 id × 64 segments: ring (cr) against gRPC (cg), block 1 to block 2."""
    segs, nb, bl = 64, 4, 128
    with cr.register_host(segs * nb * bl) as src, cb.register_host(segs * nb * bl, "bench-ring-kv") as dst:
        lay = lambda r: [(r, s * bl, bl, segs * bl) for s in range(segs)]  # noqa: E731
        cr.register_layout("bench-ring-src", lay(src), nb)
        cb.register_layout("bench-ring-dst", lay(dst), nb, export_name="bench-ring-dst")
        src.array[:] = np.random.default_rng(2).integers(0, 256, src.size, dtype=np.uint8)
        try:
            before = cr.ring._tag
            ring_fn = lambda: cr.transfer_blocks("bench-ring-src", peer, "bench-ring-dst", [1], [2])  # noqa: E731
            grpc_fn = lambda: cg.transfer_blocks("bench-ring-src", peer, "bench-ring-dst", [1], [2])  # noqa: E731
            out = pair(ring_fn, grpc_fn, args.calls, args.rounds)
            if cr.ring._tag - before < args.calls:
                raise SystemExit("blocks_64seg: the ring path did not take the transfers")
            a, b = segs * bl, 2 * segs * bl
            if not np.array_equal(src.array[a:a + segs * bl], dst.array[b:b + segs * bl]):
                raise SystemExit("blocks_64seg: the destination block differs from the source")
        finally:
            cr.deregister_layout("bench-ring-src")
            cb.deregister_layout("bench-ring-dst")
    return out


def many_64x32(cr, cg, cb, peer: str, args) -> dict:
    """64 block transfers × 32 ids with notes in one start_many, waited
    for in one wait_all: ring (cr) against gRPC (cg)."""
    n, ids, segs, bl = 64, 32, 2, 128
    pool = 2 * n * ids
    rng = np.random.default_rng(3)
    with cr.register_host(segs * pool * bl) as src_r, cg.register_host(segs * pool * bl) as src_g, \
            cb.register_host(segs * pool * bl, "bench-many-kv") as dst:
        lay = lambda r: [(r, s * bl, bl, segs * bl) for s in range(segs)]  # noqa: E731
        cr.register_layout("bench-many-src-r", lay(src_r), pool)
        cg.register_layout("bench-many-src-g", lay(src_g), pool)
        cb.register_layout("bench-many-dst", lay(dst), pool, export_name="bench-many-dst")
        src_r.array[:] = rng.integers(0, 256, src_r.size, dtype=np.uint8)
        src_g.array[:] = src_r.array
        perm = rng.permutation(pool).astype(np.uint32)
        moves = [(rng.permutation(pool)[:ids].astype(np.uint32), perm[i * ids:(i + 1) * ids]) for i in range(n)]
        notes = [json.dumps({"req_id": f"req-{i}", "blocks": ids, "engine": 0}).encode() for i in range(n)]

        def items(src):
            return [b2b.Blocks(src, peer, "bench-many-dst", l, r, notification=nt) for (l, r), nt in zip(moves, notes)]

        ir, ig = items("bench-many-src-r"), items("bench-many-src-g")

        def step(c, its):
            t0 = time.perf_counter()
            hs = c.start_many(its, timeout=30)
            t1 = time.perf_counter()
            c.wait_all(hs, timeout=60)
            t2 = time.perf_counter()
            for h in hs:
                if h.failed:
                    raise SystemExit(f"many_64x32: {h.error}")
            return t1 - t0, t2 - t0

        try:
            step(cr, ir), step(cg, ig)  # warm: routes bound, connections up
            before = cr.ring._tag
            steps = max(3, args.calls // 10)
            rs, rt, gs, gt = [], [], [], []
            for _ in range(args.rounds):
                for c, its, s_out, t_out in ((cr, ir, rs, rt), (cg, ig, gs, gt)):
                    got = [step(c, its) for _ in range(steps)]
                    s_out.append(sum(g[0] for g in got) / (steps * n))
                    t_out.append(sum(g[1] for g in got) / (steps * n))
            if cr.ring._tag - before < steps * n:
                raise SystemExit("many_64x32: the ring path did not take the transfers")
            for s in range(segs):
                for l, r in moves:
                    for i, j in zip(l.tolist(), r.tolist()):
                        a, b = (i * segs + s) * bl, (j * segs + s) * bl
                        if not np.array_equal(src_r.array[a:a + bl], dst.array[b:b + bl]):
                            raise SystemExit("many_64x32: a destination block differs from the source")
        finally:
            cr.deregister_layout("bench-many-src-r")
            cg.deregister_layout("bench-many-src-g")
            cb.deregister_layout("bench-many-dst")
    med = lambda v: float(np.median(v)) * 1e6  # noqa: E731
    return {"start": {"ring_us": round(med(rs), 2), "grpc_us": round(med(gs), 2), "ratio": round(med(rs) / med(gs), 4)},
            "step": {"ring_us": round(med(rt), 2), "grpc_us": round(med(gt), 2), "ratio": round(med(rt) / med(gt), 4)}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--b2bd", help="b2bd binary (default $B2BD_BIN or bin/b2bd)")
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--only", help="run only this op (e.g. many_64x32)")
    args = ap.parse_args()
    if args.b2bd:
        os.environ["B2BD_BIN"] = args.b2bd
    from daemon_harness import Daemon

    da = Daemon("bench-ring-a", extra_args=["--submit-socket", "{dir}/submit.sock"]).start()
    db = Daemon("bench-ring-b").start()
    try:
        with b2b.Client(da.socket) as cr, b2b.Client(da.socket, ring=False) as cg, b2b.Client(db.socket) as cb:
            if cr.ring is None:
                raise SystemExit(f"no ring: {cr._ring.reason}")
            rng = np.random.default_rng(1)
            if args.only == "many_64x32":
                out = many_64x32(cr, cg, cb, db.peer_address, args)
                out = {"many_64x32_start": out["start"], "many_64x32_step": out["step"]}
                raise _Done(out)
            out = {"ping": pair(cr.ring.ping, cg.ping, args.calls, args.rounds)}
            n, bs = 10_000, 128
            slot = bs + bs
            so = rng.permutation(n).astype(np.uint64) * np.uint64(slot)
            do = rng.permutation(n).astype(np.uint64) * np.uint64(slot)
            with cr.register_host(n * slot) as src_r, cg.register_host(n * slot) as src_g, \
                    cb.register_host(n * slot, "bench-ring") as _dst:
                for name, k in (("submit_1", 1), ("submit_10k", n)):
                    pr = cr.prepare(src_r, db.peer_address, "bench-ring", so[:k], do[:k], block_size=bs)
                    pg = cg.prepare(src_g, db.peer_address, "bench-ring", so[:k], do[:k], block_size=bs)
                    calls = args.calls if k == 1 else max(10, args.calls // 5)
                    out[name] = pair(pr.submit, pg.submit, calls, args.rounds)
                    pr.release()
                    pg.release()
                out["blocks_64seg"] = blocks_64seg(cr, cg, cb, db.peer_address, args)
            m = many_64x32(cr, cg, cb, db.peer_address, args)
            out["many_64x32_start"], out["many_64x32_step"] = m["start"], m["step"]
    except _Done as d:
        out = d.out
    finally:
        da.stop(), db.stop()
        da.cleanup(), db.cleanup()
    out["host"] = {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()]}
    print(f"{'op':<16} {'ring µs':>9} {'gRPC µs':>9} {'ring/gRPC':>10}")
    for k in ("ping", "submit_1", "submit_10k", "blocks_64seg", "many_64x32_start", "many_64x32_step"):
        if k not in out:
            continue
        v = out[k]
        print(f"{k:<16} {v['ring_us']:>9.1f} {v['grpc_us']:>9.1f} {v['ratio']:>10.3f}")
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
