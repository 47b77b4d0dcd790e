#!/usr/bin/env python3
"""Time the Python client's BatchTransfer of 10,000 x 128 B blocks on loopback.

Reports the median (and p10/p90/min) of ``--iters`` timed transfers after
``--warmup`` untimed ones, with a breakdown:

* pack     -- numpy arrays -> packed descriptors (``b2b.Descriptors``), which
              ``batch_transfer`` does on every call when given arrays;
* rpc      -- the BatchTransfer call itself, descriptors already packed;
* total    -- pack + rpc, i.e. one ``batch_transfer(..., src_offsets, dst_offsets,
              block_size=128)`` call;
* daemon   -- the daemon's own data-path time (``TransferResult.elapsed``), the
              part no client can shave off;
* status   -- an empty Status RPC, the per-call floor of gRPC itself.

Prepared transfers: the same batch planned once (``Client.prepare``), then
``--iters`` timed ``submit()`` calls interleaved with empty ``ping()`` calls
(the floor of a call); ``cmd/b2b-gobench`` (the Go client, built with ``go build``
unless ``--gobench`` names a binary) times Go's prepared ``Submit`` and
``Ping`` against the same daemons in the same run, and the ratio
python/go of the prepared submit is printed (acceptance: at most 1.3).

The layout matches cmd/b2b-bench: each block at the start of a random slot
of block + min(block, 4096) bytes, so no two blocks merge.

Either point it at two running daemons (``--src-socket``, ``--dst-socket``,
``--dst-peer``) or let it start two on loopback (``--b2bd bin/b2bd``). With
``--go-bench bin/b2b-bench`` it also runs the Go bench tool against the same
daemons in the same run and prints the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # the source tree's b2b
sys.path.insert(0, os.path.join(HERE, "tests"))

import b2b  # noqa: E402


def layout(n: int, block: int, rng: np.random.Generator):
    slot = block + min(block, 4096)
    return rng.permutation(n).astype(np.uint64) * np.uint64(slot), n * slot


def summary(xs):
    a = np.asarray(xs) * 1e6  # microseconds
    return {
        "median_us": float(np.median(a)),
        "p10_us": float(np.percentile(a, 10)),
        "p90_us": float(np.percentile(a, 90)),
        "min_us": float(a.min()),
    }


def run_python(args, a: b2b.Client, b: b2b.Client, peer: str) -> dict:
    rng = np.random.default_rng(args.seed)
    n, bs = args.blocks, args.block_size
    so, src_size = layout(n, bs, rng)
    do, dst_size = layout(n, bs, rng)
    name = f"bench-py-{os.getpid()}"
    with a.register_host(src_size) as src, b.register_host(dst_size, name) as dst:
        src.array[:] = rng.integers(0, 256, src_size, dtype=np.uint8)
        d = b2b.Descriptors(so, do, block_size=bs)
        for _ in range(args.warmup):
            a.batch_transfer(src, peer, name, descriptors=d, transport=args.transport, timeout=60)
            a.status()
        pack, rpc, total, daemon, api, status = [], [], [], [], [], []
        for _ in range(args.iters):
            # As batch_transfer(src, peer, name, so, do, block_size=bs) runs it, split in two.
            t0 = time.perf_counter()
            desc = b2b.Descriptors(so, do, block_size=bs)
            t1 = time.perf_counter()
            r = a.batch_transfer(src, peer, name, descriptors=desc, transport=args.transport, timeout=60)
            t2 = time.perf_counter()
            pack.append(t1 - t0)
            rpc.append(t2 - t1)
            total.append(t2 - t0)
            daemon.append(r.elapsed)
            assert r.blocks == n and r.bytes == n * bs, r
        for _ in range(args.iters):
            t0 = time.perf_counter()
            r = a.batch_transfer(src, peer, name, so, do, block_size=bs, transport=args.transport, timeout=60)
            api.append(time.perf_counter() - t0)  # the plain API call, arrays packed inside
            t0 = time.perf_counter()
            a.status()
            status.append(time.perf_counter() - t0)
        # Verify the last batch: per-block checksums on both sides, and the bytes.
        ok = verify(a, b, src, dst, so, do, bs)
        # Prepared: plan once, then submit() interleaved with ping().
        sub, ping, sub_daemon = [], [], []
        with a.prepare(src, peer, name, descriptors=d, transport=args.transport, timeout=60) as plan:
            for _ in range(args.warmup):
                plan.submit()
                a.ping(timeout=60)
            for _ in range(args.iters):
                t0 = time.perf_counter()
                r = plan.submit()
                t1 = time.perf_counter()
                a.ping(timeout=60)
                t2 = time.perf_counter()
                sub.append(t1 - t0)
                ping.append(t2 - t1)
                if r.phases is not None:
                    sub_daemon.append(r.phases.total_ns / 1e9)
            src.array[:] = rng.integers(0, 256, src_size, dtype=np.uint8)
            r = plan.submit()
            assert r.blocks == n and r.bytes == n * bs, r
            ok = ok and verify(a, b, src, dst, so, do, bs)
    return {
        "blocks": n,
        "block_size": bs,
        "iters": args.iters,
        "warmup": args.warmup,
        "transport": r.transport,
        "verified": ok,
        "total": summary(total),
        "pack": summary(pack),
        "rpc": summary(rpc),
        "daemon_data_path": summary(daemon),
        "api_call": summary(api),
        "status_rpc": summary(status),
        "prepared_submit": summary(sub),
        "prepared_submit_daemon": summary(sub_daemon) if sub_daemon else None,
        "ping": summary(ping),
    }


def verify(a, b, src, dst, so, do, bs) -> bool:
    cs = a.checksum(src, so, block_size=bs, per_block=True)
    cd = b.checksum(dst, do, block_size=bs, per_block=True)
    ok = bool(np.array_equal(cs.block_digests, cd.block_digests)) and len(cs.block_digests) == len(so)
    cols = np.arange(bs, dtype=np.int64)
    return ok and bool(np.array_equal(src.array[so.astype(np.int64)[:, None] + cols], dst.array[do.astype(np.int64)[:, None] + cols]))


def gobench_binary(args, tmp: str) -> str:
    if args.gobench:
        return args.gobench
    out = os.path.join(tmp, "gobench")
    subprocess.run(["go", "build", "-o", out, "./cmd/b2b-gobench"], cwd=os.path.dirname(os.path.dirname(HERE)), check=True)
    return out


def run_gobench(args, exe: str, src_api: str, dst_api: str, peer: str) -> dict:
    cmd = [exe, "--src-api", src_api, "--dst-api", dst_api, "--dst-peer", peer, "--blocks", str(args.blocks),
           "--block-size", str(args.block_size), "--iters", str(args.iters), "--warmup", str(args.warmup), "--seed", str(args.seed)]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    return json.loads(p.stdout)


def run_go(args, src_api: str, dst_api: str, peer: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "go.json")
        cmd = [
            args.go_bench, "--src-api", src_api, "--dst-api", dst_api, "--dst-peer", peer,
            "--sizes", str(args.block_size), "--blocks", str(args.blocks), "--iters", str(args.iters),
            "--transport", args.transport or "auto", "--json", out,
        ]
        if args.seed:
            cmd += ["--seed", str(args.seed)]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}")
        with open(out) as f:
            rep = json.load(f)
    rows = rep.get("rows") or []
    row = rows[0] if rows else {}
    med = row.get("median_seconds")
    dp = row.get("data_path_median_seconds")
    res = {"median_us": med * 1e6 if med is not None else None, "daemon_data_path_median_us": dp * 1e6 if dp is not None else None}
    if res["median_us"] is None:
        res["raw"] = rep
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--src-socket")
    p.add_argument("--dst-socket")
    p.add_argument("--dst-peer")
    p.add_argument("--b2bd", help="start two daemons with this binary instead (loopback, TCP)")
    p.add_argument("--go-bench", help="also run this b2b-bench binary against the same daemons")
    p.add_argument("--gobench", help="the prepared-submit Go timer (default: go build ./cmd/b2b-gobench)")
    p.add_argument("--no-go-prepared", action="store_true", help="skip the Go prepared comparison")
    p.add_argument("--blocks", type=int, default=10_000)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1, help="alternate Python and Go this many times")
    p.add_argument("--transport", default="tcp")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()

    daemons = []
    if args.b2bd:
        import daemon_harness

        os.environ["B2BD_BIN"] = os.path.abspath(args.b2bd)
        daemons = [daemon_harness.Daemon("bench-a").start(), daemon_harness.Daemon("bench-b").start()]
        src_api, dst_api, peer = daemons[0].socket, daemons[1].socket, daemons[1].peer_address
    else:
        if not (args.src_socket and args.dst_socket and args.dst_peer):
            p.error("give --src-socket, --dst-socket and --dst-peer, or --b2bd")
        src_api, dst_api, peer = args.src_socket, args.dst_socket, args.dst_peer

    results = {"python": [], "go": [], "go_prepared": []}
    tmp = tempfile.mkdtemp(prefix="bench-vs-go-")
    try:
        gobench = None if args.no_go_prepared else gobench_binary(args, tmp)
        with b2b.Client(src_api) as a, b2b.Client(dst_api) as b:
            for _ in range(args.rounds):
                py = run_python(args, a, b, peer)
                results["python"].append(py)
                t, pk, rp, dm, api, st = (py[k]["median_us"] for k in ("total", "pack", "rpc", "daemon_data_path", "api_call", "status_rpc"))
                print(
                    f"python: {py['blocks']} x {py['block_size']} B over {py['transport']}, median of {py['iters']} "
                    f"(after {py['warmup']} warm-up), verified={py['verified']}\n"
                    f"  total {t:9.1f} us = pack {pk:.1f} us + rpc {rp:.1f} us   "
                    f"(p10 {py['total']['p10_us']:.1f}, p90 {py['total']['p90_us']:.1f})\n"
                    f"  daemon data path {dm:9.1f} us; plain batch_transfer() call {api:.1f} us; empty Status RPC {st:.1f} us"
                )
                ps, pp = py["prepared_submit"], py["ping"]
                pd = py["prepared_submit_daemon"]
                print(
                    f"python prepared: submit median {ps['median_us']:9.1f} us (p10 {ps['p10_us']:.1f}, p90 {ps['p90_us']:.1f})"
                    f"{'' if pd is None else ', daemon %.1f us' % pd['median_us']}; ping {pp['median_us']:.1f} us"
                    f" -> submit/ping = {ps['median_us'] / pp['median_us']:.2f}"
                )
                if gobench:
                    gp = run_gobench(args, gobench, src_api, dst_api, peer)
                    results["go_prepared"].append(gp)
                    ratio = ps["median_us"] / gp["submit"]["median_us"]
                    print(
                        f"go prepared:     submit median {gp['submit']['median_us']:9.1f} us (p10 {gp['submit']['p10_us']:.1f}, "
                        f"p90 {gp['submit']['p90_us']:.1f}), daemon {gp['submit_daemon_us']:.1f} us; ping {gp['ping']['median_us']:.1f} us; "
                        f"ad hoc {gp['adhoc']['median_us']:.1f} us; verified={gp['verified']}\n"
                        f"  -> python/go prepared submit = {ratio:.2f} (target <= 1.3)"
                    )
                if args.go_bench:
                    go = run_go(args, src_api, dst_api, peer)
                    results["go"].append(go)
                    if go.get("median_us"):
                        print(f"go:     median {go['median_us']:9.1f} us (daemon data path {go['daemon_data_path_median_us']:.1f} us)"
                              f"  -> python/go = {t / go['median_us']:.2f}")
                    else:
                        print(f"go: could not read a median from b2b-bench's JSON: {go}")
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        codes = [d.stop() for d in daemons]
        for d in daemons:
            d.cleanup()
        if any(codes):
            print(f"daemon exit codes {codes}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    ok = all(r["verified"] for r in results["python"]) and all(r["verified"] for r in results["go_prepared"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
