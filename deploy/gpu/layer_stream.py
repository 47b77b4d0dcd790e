#!/usr/bin/env python3
"""Layer streaming with zero SMs: the demo and measurement (docs/kv.md,
"Layer streaming").

Two daemons on this host: A (the prefill's) and B (the decode's). This process
plays both applications: a "prefill" on GPU 0 runs N layers of real work (a
matmul chain, h = tanh(h @ W_l)), writes layer l's K and V blocks from the
layer's output, and after each layer marks a progress counter with
b2b.stream.mark_layer_done (cuStreamWriteValue64: no kernel). The "decode"
side owns a KV pool on GPU 1 (GPU 0 when there is one GPU), registered with
daemon B and exported; each layer is also a layout of its own on both sides.

Each configuration runs, alternately and --iters times each:
  (a) triggered: before the GPU work is queued, N transfers are started, the
      one of layer l with after=(counter, l); each moves layer l's blocks as
      soon as the daemon sees the counter reach l;
  (b) after the end: one transfer of every layer's blocks, started with
      after=(counter, N) (the same trigger machinery, so the comparison is of
      the pipelining alone, not of a host reaction).

Reported per configuration:
  * tail: time from the last layer's end to the last byte landed, for (a) and
    (b), median over the iterations, and their ratio (target <= 0.25 where
    compute and transfer are comparable). "Last layer's end" is when the
    counter's last value became visible in host memory (t_vis, below);
    "landed" is the daemon's landed_unix_ns (its last write acknowledged by
    the destination: every byte had landed).
  * lag per layer, (a) only: from the counter write to the post.
      - t_vis: after queuing all work, this process spins on the counter's
        host mapping and stamps time.time_ns() when each value appears: the
        write as the host (and the daemon's watcher) can first see it.
      - t_gpu: a torch.cuda.Event recorded just before each counter write,
        converted to host time through a reference event whose host time is
        known to within a window (the reference recorded on an idle stream
        and synchronized, best of 20; the window is reported).
      - from the daemon (PhaseTimings): trigger_seen_unix_ns (the watcher saw
        the value) and posted_unix_ns (the first write handed to the
        transport).
    lag_seen = seen - t_vis, lag_post = posted - t_vis, lag_post_gpu =
    posted - t_gpu: median and p99 over every layer of every (a) run.
  * every destination block is checked with torch.equal against its source.

Configurations: "comparable" sizes the matmul so that a layer's compute is
about one layer's transfer time (both measured first); "compute-bound"
(compute about 4x the transfer) and "transfer-bound" (about 1/4) show what
happens when they are not comparable. --configs picks.

--ncu DIR runs both daemons under Nsight Compute (as smprobe.py does) and
fails unless their logs are complete and show 0 kernels, with a positive
control; run it as a separate pass (ncu slows the daemons' CUDA calls).

Needs: torch with CUDA, the b2b client on PYTHONPATH, b2bd in --bin, and the
daemons' --shm-dir on tmpfs (/dev/shm), where cuMemHostRegister can pin the
counter page. Exit 1 on a wrong block, a failed transfer or a failed ncu
verdict; the figures themselves are reported, not judged, except that the
report says whether the ratio and the median lag meet the issue's targets.

  PYTHONPATH=client/python python3 deploy/gpu/layer_stream.py --bin bin --json layer-stream.json
"""
import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import smprobe  # noqa: E402  (Daemons, ncu helpers)


def log(*a):
    print(*a, flush=True)


def pct(xs, q):
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(math.ceil(q / 100 * len(s))) - 1)] if q > 0 else s[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="bin", help="directory holding b2bd")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=256, help="KV blocks per layer and K/V moved per transfer")
    ap.add_argument("--block-bytes", type=int, default=16384, help="bytes of one block of one layer's K (or V)")
    ap.add_argument("--iters", type=int, default=5, help="runs of each of (a) and (b) per configuration")
    ap.add_argument("--configs", default="comparable,compute-bound,transfer-bound")
    ap.add_argument("--transport", default="", help="'' (daemon's choice), tcp, local or verbs")
    ap.add_argument("--ncu", default="", help="run the daemons under ncu, logs in this directory")
    ap.add_argument("--json", default="layer-stream.json")
    args = ap.parse_args()
    smprobe.exit_on_sigterm()  # timeout(1)'s SIGTERM still stops the daemons (finally below)

    import torch
    import b2b
    from b2b import stream

    if not torch.cuda.is_available():
        log("no CUDA device")
        return 1
    ngpu = torch.cuda.device_count()
    src_dev, dst_dev = 0, (1 if ngpu > 1 else 0)
    torch.cuda.set_device(src_dev)
    torch.ones(1, device=f"cuda:{src_dev}")  # torch's primary context is current: the counter registers in it
    N, NB, BB = args.layers, args.blocks, args.block_bytes

    tmp = tempfile.mkdtemp(prefix="layerstream-")
    report = {"layers": N, "blocks": NB, "block_bytes": BB, "gpus": ngpu, "src_device": src_dev, "dst_device": dst_dev,
              "bytes_per_layer": 2 * NB * BB, "configs": [], "method": {
                  "t_vis": "host spin on the counter's mapping after queuing all work; time.time_ns() at each new value",
                  "t_gpu": "torch.cuda.Event just before each counter write, converted through a reference event "
                           "(recorded on the idle stream and synchronized; best window of 20)",
                  "landed": "PhaseTimings.landed_unix_ns: the last write acknowledged by the destination daemon",
                  "b": "one transfer of all layers with after=(counter, N)"}}
    control = None
    if args.ncu:
        os.makedirs(args.ncu, exist_ok=True)
        control = smprobe.ncu_control(args.ncu)
        log(f"ncu positive control: {control['kernels']} kernel(s), log complete: {control['complete']}")
    d = smprobe.Daemons(args.bin, tmp, args.ncu or None)
    ca, cb = b2b.Client(d.socks[0], timeout=120), b2b.Client(d.socks[1], timeout=120)
    peer_b = d.peers[1]
    fail = False
    try:
        # KV pools: [layer, K/V, block, bytes], one region a side; segment
        # (l, k) starts at ((l*2+k)*NB)*BB. The decode side's ids are a
        # permutation, so ids really are mapped.
        src = torch.zeros((N, 2, NB, BB), dtype=torch.uint8, device=f"cuda:{src_dev}")
        dst = torch.zeros((N, 2, NB, BB), dtype=torch.uint8, device=f"cuda:{dst_dev}")
        ra = ca.register_cuda(src)
        rb = cb.register_cuda(dst, "ls-kv")
        seg = lambda r, layers: [(r, ((l * 2 + k) * NB) * BB, BB, BB) for l in layers for k in range(2)]
        for l in range(N):
            ca.register_layout(f"ls-L{l}", seg(ra, [l]), NB)
            cb.register_layout(f"ls-L{l}", seg(rb, [l]), NB, export_name=f"ls-L{l}")
        ca.register_layout("ls-all", seg(ra, range(N)), NB)
        cb.register_layout("ls-all", seg(rb, range(N)), NB, export_name="ls-all")
        src_ids = np.arange(NB, dtype=np.uint32)
        dst_ids = np.random.default_rng(25).permutation(NB).astype(np.uint32)
        dst_ids_t = torch.as_tensor(dst_ids.astype(np.int64), device=f"cuda:{dst_dev}")
        counter = stream.Counter(ca, device=src_dev)
        log(f"counter {counter}; daemons {d.socks}; {N} layers x 2 x {NB} blocks x {BB} B = {2 * NB * BB / 1e6:.2f} MB a layer")

        # One layer's transfer time, synchronous, median of 7 (after a warm-up).
        times = []
        for i in range(8):
            t0 = time.perf_counter()
            r = ca.transfer_blocks("ls-L0", peer_b, "ls-L0", src_ids.tolist(), dst_ids.tolist(), transport=args.transport or None)
            if i:
                times.append(time.perf_counter() - t0)
        t_layer = statistics.median(times)
        report["layer_transfer_ms"] = t_layer * 1e3
        report["transport"] = r.transport
        log(f"one layer's transfer: {t_layer * 1e3:.3f} ms over {r.transport} ({2 * NB * BB / t_layer / 1e9:.2f} GB/s)")

        def layer_ms(m, reps=5):
            w = torch.randn(m, m, device=f"cuda:{src_dev}", dtype=torch.bfloat16) / math.sqrt(m)
            h = torch.randn(m, m, device=f"cuda:{src_dev}", dtype=torch.bfloat16)
            for _ in range(2):
                h = torch.tanh(h @ w)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(reps):
                h = torch.tanh(h @ w)
            e1.record()
            e1.synchronize()
            return e0.elapsed_time(e1) / reps

        # Matmul sizes and their per-layer times, to pick each configuration's.
        sizes = {}
        m = 256
        while m <= 32768:
            sizes[m] = layer_ms(m)
            if sizes[m] > 8 * t_layer * 1e3:
                break
            m = int(m * 1.25) // 64 * 64
        report["matmul_ms"] = sizes
        want = {"comparable": 1.0, "compute-bound": 4.0, "transfer-bound": 0.25}

        def pick(ratio):
            target = ratio * t_layer * 1e3
            return min(sizes, key=lambda k: abs(math.log(max(sizes[k], 1e-6) / target)))

        # Reference event for t_gpu: the best (narrowest) of 20 windows.
        def calibrate():
            best = None
            for _ in range(20):
                torch.cuda.synchronize()
                ev = torch.cuda.Event(enable_timing=True)
                t0 = time.time_ns()
                ev.record()
                ev.synchronize()
                t1 = time.time_ns()
                if best is None or t1 - t0 < best[2] - best[1]:
                    best = (ev, t0, t1)
            return best[0], (best[1] + best[2]) // 2, best[2] - best[1]

        run_no = [0]

        def one_run(mode, m, weights, h0):
            """mode "a" (per layer) or "b" (after the end); returns the run's figures."""
            base = run_no[0] * (N + 1)
            run_no[0] += 1
            dst.zero_()
            torch.cuda.synchronize(dst_dev)
            torch.cuda.synchronize(src_dev)
            ref, ref_ns, window = calibrate()
            if mode == "a":
                hs = [stream.transfer_blocks(ca, f"ls-L{l}", peer_b, f"ls-L{l}", src_ids, dst_ids,
                                             after=(counter, base + l + 1), timeout=60, transport=args.transport or None)
                      for l in range(N)]
            else:
                hs = [stream.transfer_blocks(ca, "ls-all", peer_b, "ls-all", src_ids, dst_ids,
                                             after=(counter, base + N), timeout=60, transport=args.transport or None)]
            s = torch.cuda.current_stream()
            evs = []
            h = h0
            for l in range(N):
                h = torch.tanh(h @ weights[l])
                hb = h.reshape(-1).view(torch.uint8)
                need = src[l].numel()
                reps = -(-need // hb.numel())
                src[l].view(-1).copy_((hb.repeat(reps) if reps > 1 else hb)[:need])
                ev = torch.cuda.Event(enable_timing=True)
                ev.record(s)
                evs.append(ev)
                stream.mark_layer_done(s, counter, base + l + 1)
            # Stamp each value as it appears in host memory.
            t_vis = [0] * N
            last = base
            deadline = time.time() + 120
            while last < base + N:
                v = counter.value
                if v != last:
                    now = time.time_ns()
                    for k in range(last + 1, v + 1):
                        t_vis[k - base - 1] = now
                    last = v
                elif time.time() > deadline:
                    raise RuntimeError(f"counter stuck at {v - base} of {N}")
            outs = [x.wait(timeout=120) for x in hs]
            torch.cuda.synchronize(src_dev)
            t_gpu = [ref_ns + int(ref.elapsed_time(e) * 1e6) for e in evs]
            ok = all(torch.equal(dst[l][:, dst_ids_t], src[l].to(f"cuda:{dst_dev}")) for l in range(N))
            landed = max(o.phases.landed_unix_ns for o in outs)
            res = {"mode": mode, "tail_ms": (landed - t_vis[-1]) / 1e6, "ok": ok, "calibration_window_us": window / 1e3,
                   "compute_ms": (t_vis[-1] - t_vis[0]) / 1e6 * N / max(N - 1, 1)}
            if mode == "a":
                res["lag_seen_us"] = [(o.phases.trigger_seen_unix_ns - t_vis[l]) / 1e3 for l, o in enumerate(outs)]
                res["lag_post_us"] = [(o.phases.posted_unix_ns - t_vis[l]) / 1e3 for l, o in enumerate(outs)]
                res["lag_post_gpu_us"] = [(o.phases.posted_unix_ns - t_gpu[l]) / 1e3 for l, o in enumerate(outs)]
                res["vis_after_gpu_us"] = [(t_vis[l] - t_gpu[l]) / 1e3 for l in range(N)]
                # Inside the daemon, from the trigger to the post: the transfer's
                # goroutine waking, validation, resolution (cached 1 s), plan.
                res["seen_to_post_us"] = [(o.phases.posted_unix_ns - o.phases.trigger_seen_unix_ns) / 1e3 for o in outs]
                res["resolve_us"] = [o.phases.resolve_ns / 1e3 for o in outs]
                res["early_posts"] = sum(1 for l, o in enumerate(outs) if o.phases.trigger_seen_unix_ns < t_gpu[l] - window)
            return res

        for name in [c for c in args.configs.split(",") if c]:
            if name not in want:
                log(f"unknown config {name}; known: {list(want)}")
                return 1
            m = pick(want[name])
            g = torch.Generator(device=f"cuda:{src_dev}").manual_seed(25)
            weights = [torch.randn(m, m, device=f"cuda:{src_dev}", dtype=torch.bfloat16, generator=g) / math.sqrt(m) for _ in range(N)]
            h0 = torch.randn(m, m, device=f"cuda:{src_dev}", dtype=torch.bfloat16, generator=g)
            one_run("a", m, weights, h0)  # warm-up, not counted
            runs = []
            for i in range(args.iters):
                for mode in ("a", "b") if i % 2 == 0 else ("b", "a"):
                    r = one_run(mode, m, weights, h0)
                    runs.append(r)
                    if not r["ok"]:
                        log(f"{name} run {i} ({mode}): a destination block differs from its source")
                        fail = True
            ta = [r["tail_ms"] for r in runs if r["mode"] == "a"]
            tb = [r["tail_ms"] for r in runs if r["mode"] == "b"]
            lag = lambda key: [x for r in runs if r["mode"] == "a" for x in r[key]]
            c = {"name": name, "matmul": m, "layer_compute_ms": sizes[m], "layer_transfer_ms": t_layer * 1e3,
                 "tail_a_ms": statistics.median(ta), "tail_b_ms": statistics.median(tb),
                 "ratio": statistics.median(ta) / statistics.median(tb),
                 "early_posts": sum(r.get("early_posts", 0) for r in runs), "runs": runs}
            for key in ("lag_seen_us", "lag_post_us", "lag_post_gpu_us", "vis_after_gpu_us", "seen_to_post_us", "resolve_us"):
                xs = lag(key)
                c[key] = {"p50": pct(xs, 50), "p99": pct(xs, 99), "min": min(xs), "max": max(xs), "n": len(xs)}
            c["meets_ratio"] = c["ratio"] <= 0.25
            c["meets_lag"] = c["lag_post_us"]["p50"] <= 20
            report["configs"].append(c)
            log(f"{name:>14}: matmul {m} ({sizes[m]:.3f} ms/layer vs transfer {t_layer * 1e3:.3f} ms/layer); "
                f"tail (a) {c['tail_a_ms']:.3f} ms, (b) {c['tail_b_ms']:.3f} ms, ratio {c['ratio']:.3f}"
                f"{' (target <= 0.25: met)' if c['meets_ratio'] else ''}")
            log(f"{'':>14}  lag counter->seen p50 {c['lag_seen_us']['p50']:.1f} us p99 {c['lag_seen_us']['p99']:.1f}; "
                f"->post p50 {c['lag_post_us']['p50']:.1f} us p99 {c['lag_post_us']['p99']:.1f}; "
                f"gpu event->post p50 {c['lag_post_gpu_us']['p50']:.1f} us p99 {c['lag_post_gpu_us']['p99']:.1f} "
                f"(host saw the write {c['vis_after_gpu_us']['p50']:.1f} us after the event, p50); early posts: {c['early_posts']}")
            log(f"{'':>14}  in the daemon: seen->post p50 {c['seen_to_post_us']['p50']:.1f} us p99 {c['seen_to_post_us']['p99']:.1f} "
                f"(resolve p50 {c['resolve_us']['p50']:.1f} us, max {c['resolve_us']['max']:.1f})")
            if c["early_posts"]:
                fail = True
        counter.close()
    except Exception as e:  # the report still gets written
        import traceback
        traceback.print_exc()
        report["error"] = repr(e)
        fail = True
    finally:
        ca.close()
        cb.close()
        stops = d.stop()
        report["daemon_exit"] = [s["rc"] for s in stops]
        if args.ncu:
            logs = [smprobe.parse_ncu_log(p) for p in d.logs]
            ok, why = smprobe.ncu_verdict(control, logs, stops)
            report["ncu"] = {"ok": ok, "why": why, "kernels": sum(l["kernels"] or 0 for l in logs), "control": control}
            log(f"ncu: {report['ncu']['kernels']} kernels in the daemons; verdict {'PASS' if ok else 'FAIL'} {why}")
            fail |= not ok
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(os.path.join(smprobe.SHM_ROOT, os.path.basename(tmp)), ignore_errors=True)
    report["pass"] = not fail
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    log(f"layer_stream.py: {'PASS' if not fail else 'FAIL'} (report {args.json})")
    return 1 if fail else 0


if __name__ == "__main__":
    sys.exit(main())
