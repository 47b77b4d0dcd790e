#!/usr/bin/env python3
"""Table tests of the triggered zero-SM verdicts (no GPU): smprobe.py's
judge_spin, trigger_order_problems, triggered_probe_verdict and both_proofs,
and layer_check_summary.py over synthetic reports. With a b2bd binary
(B2BD_BIN, else bin/b2bd), also a live check of smprobe.start_batch_after
between two loopback daemons with a host-written counter: the batch waits
for the write and the order check passes, and a counter already at its
value makes the order check fail.
Run: python3 deploy/gpu/layer_check_test.py"""
import copy
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
import layer_check_summary as lcs  # noqa: E402
import smprobe as sp  # noqa: E402

SPIN_MS = 400.0
T_LAUNCH = 100.0  # smprobe's launched time (CLOCK_MONOTONIC s)
T0 = T_LAUNCH + 0.002  # every block resident


def done(gaps="-", resident="1"):
    return {"launched": str(T_LAUNCH), "spin_end": str(T0 + 0.4), "control_launched": str(T0 + 0.2),
            "control_done": str(T0 + 0.4005), "resident": resident, "maxgap_us": "3.0", "gap_blocks": "0",
            "blocks": "8448", "gaps": gaps}


GOOD_TRIG = {"armed_before_write": True, "write_unix_ns": 1_000_000_000, "seen_unix_ns": 1_000_004_000,
             "posted_unix_ns": 1_000_009_000}


def check(name, got, want, bad):
    if got != want:
        bad.append(f"{name}: got {got!r}, want {want!r}")


def spin_cases(bad):
    # (name, done line, action end after T0 in s, want sm_free, want preempted)
    cases = [
        ("quiet, early", done(), 0.010, True, False),
        ("quiet, late (waited for the spin)", done(), 0.390, False, False),
        ("a stall inside its window", done("0/0@5000:400"), 0.010, False, True),
        ("a stall after its window (the in-process control)", done("0/0@200000:400"), 0.010, True, False),
        ("not every block resident", done(resident="0"), 0.010, False, False),
    ]
    for name, d, took, want_free, want_pre in cases:
        r = sp.judge_spin(d, T0, T0 + took, SPIN_MS)
        check(f"judge_spin {name}: sm_free", r["sm_free"], want_free, bad)
        check(f"judge_spin {name}: preempted", r["preempted"], want_pre, bad)
    check("parse_done", sp.parse_done("done a=1 gaps=-"), {"a": "1", "gaps": "-"}, bad)
    try:
        sp.parse_done("spinning 1.0")
        bad.append("parse_done accepted a line that is not done")
    except RuntimeError:
        pass


def order_cases(bad):
    cases = [
        ("held until the write, seen and posted after", {}, 0),
        ("not armed when written (ran at once)", {"armed_before_write": False}, 1),
        ("seen before the write", {"seen_unix_ns": 999_000_000}, 1),
        ("seen and posted before the write", {"seen_unix_ns": 999_000_000, "posted_unix_ns": 999_500_000}, 2),
        ("no trigger time (not triggered)", {"seen_unix_ns": 0}, 1),
        ("no posted time", {"posted_unix_ns": 0}, 1),
        ("no write time", {"write_unix_ns": 0}, 1),
    ]
    for name, change, nwhy in cases:
        why = sp.trigger_order_problems(dict(GOOD_TRIG, **change))
        check(f"trigger_order_problems {name}: problems {why}", len(why), nwhy, bad)

    quiet = sp.judge_spin(done(), T0, T0 + 0.010, SPIN_MS)
    stalled = sp.judge_spin(done("1/0@3000:450"), T0, T0 + 0.010, SPIN_MS)
    late = sp.judge_spin(done(), T0, T0 + 0.300, SPIN_MS)
    cases = [
        ("quiet and in order", quiet, GOOD_TRIG, True),
        ("a stall in its window (the stream write time-sliced in)", stalled, GOOD_TRIG, False),
        ("landed in the second half (the write waited for the spin)", late, GOOD_TRIG, False),
        ("quiet but posted before the write", quiet, dict(GOOD_TRIG, posted_unix_ns=1), False),
    ]
    for name, r, t, want in cases:
        ok, why = sp.triggered_probe_verdict(r, t)
        check(f"triggered_probe_verdict {name} ({why})", ok, want, bad)
        check(f"triggered_probe_verdict {name}: a reason with every FAIL", bool(why), not want, bad)


def case(path, tr, size, ok, trigger=None, **kw):
    c = {"path": path, "transport": tr, "block_bytes": size, "ok": ok, **kw}
    if trigger:
        c["trigger"] = trigger
    return c


def proof_cases(bad):
    plain = case("cuda0->cuda1", "local", 4096, True, ncu_kernels=0)
    trig = case("cuda0->cuda1", "local", 4096, True, "stream", ncu_kernels=0)
    pplain = case("cuda0->cuda1", "local", 4096, True, took_ms=8.0, spin_left_ms=390.0, gaps_in_window=[])
    ptrig = case("cuda0->cuda1", "local", 4096, True, "stream", took_ms=9.0, spin_left_ms=389.0, gaps_in_window=[])
    rep = lambda cs, ok=True, controls=(): {"cases": list(cs), "controls": list(controls), "pass": ok}
    control = {"name": "control: 1-block kernel, other process", "took_ms": 0.5, "gaps_in_window": ["0/0@1:400"], "ok": True}
    cases = [
        ("every case passes both", rep([plain, trig]), rep([pplain, ptrig], controls=[control]), True),
        # The plain and the triggered case of one path, size and transport are two cases: a kernel
        # counted in one must not be hidden behind the other's zero (a key without the trigger
        # let the last of them stand for both).
        ("ncu saw a kernel in the plain case only", rep([dict(plain, ok=False, ncu_kernels=1), trig], ok=False),
         rep([pplain, ptrig]), False),
        ("ncu saw a kernel in the triggered case only", rep([plain, dict(trig, ok=False, ncu_kernels=2)], ok=False),
         rep([pplain, ptrig]), False),
        ("the probe failed the triggered case", rep([plain, trig]),
         rep([pplain, dict(ptrig, ok=False, why=["SM stalls in its window: 0/0@10:400"])], ok=False), False),
        ("a probe case without its ncu case", rep([plain]), rep([pplain, ptrig]), False),
        ("the ncu report failed as a whole (its log verdict)", rep([plain, trig], ok=False), rep([pplain, ptrig]), False),
        ("the probe report failed as a whole (a control)", rep([plain, trig]), rep([pplain, ptrig], ok=False), False),
        ("no probe cases", rep([plain, trig]), rep([]), False),
        ("no reports at all", {}, {}, False),
    ]
    for name, ncu, probe, want in cases:
        lines, ok = sp.both_proofs(ncu, probe)
        check(f"both_proofs {name}", ok, want, bad)
        if not lines or ("proven both ways" not in lines[-1]):
            bad.append(f"both_proofs {name}: no closing line: {lines[-1:]}")
    # The reason of a failed case reaches its line.
    lines, _ = sp.both_proofs(rep([plain, trig]), rep([pplain, dict(ptrig, ok=False, why=["landed 300.0 ms into the spin"])]))
    if not any("stream" in l and "FAIL" in l and "landed 300.0 ms" in l for l in lines):
        bad.append(f"both_proofs: the failed triggered case's line lacks its reason: {lines}")


def summary_cases(bad):
    good = {
        lcs.LAYER_STREAM: {"pass": True, "transport": "local", "configs": [
            {"name": "comparable", "layer_compute_ms": 1.1, "layer_transfer_ms": 1.0, "tail_a_ms": 1.2, "tail_b_ms": 30.0,
             "ratio": 0.04, "meets_ratio": True, "lag_post_us": {"p50": 9.0, "p99": 30.0}, "meets_lag": True,
             "early_posts": 0, "runs": [{}] * 10}]},
        lcs.LAYER_STREAM_NCU: {"pass": True, "ncu": {"ok": True, "kernels": 0, "why": []},
                               "configs": [{"name": "comparable", "runs": [{}, {}]}]},
        lcs.PROBE_TRIG: {"pass": True, "controls": [], "cases": [
            case("host->cuda0", "tcp", 4096, True, "host", took_ms=9.0, spin_left_ms=389.0, gaps_in_window=[])]},
        lcs.NCU_TRIG: {"pass": True, "cases": [case("host->cuda0", "tcp", 4096, True, "host", ncu_kernels=0)]},
    }

    def with_change(name, key, fn):
        reports = copy.deepcopy(good)
        fn(reports, key)
        return name, reports

    def drop(r, k):
        del r[k]

    def set_(path, value):
        def fn(r, k):
            d = r[k]
            for p in path[:-1]:
                d = d[p]
            d[path[-1]] = value
        return fn
    cases = [
        ("everything passed", good, True),
        with_change("layer_stream saw a wrong block", lcs.LAYER_STREAM, set_(["pass"], False)) + (False,),
        with_change("layer_stream ran no configuration", lcs.LAYER_STREAM, set_(["configs"], [])) + (False,),
        with_change("layer_stream's report is missing", lcs.LAYER_STREAM, drop) + (False,),
        with_change("ncu saw kernels in layer_stream's daemons", lcs.LAYER_STREAM_NCU, set_(["ncu", "ok"], False)) + (False,),
        with_change("layer_stream --ncu was cut short", lcs.LAYER_STREAM_NCU, drop) + (False,),
        with_change("the triggered probe failed", lcs.PROBE_TRIG, set_(["pass"], False)) + (False,),
        with_change("the triggered ncu run is missing", lcs.NCU_TRIG, drop) + (False,),
    ]
    # A figure that misses the targets is reported, not failed.
    missed = copy.deepcopy(good)
    missed[lcs.LAYER_STREAM]["configs"][0].update(ratio=0.6, meets_ratio=False, meets_lag=False)
    cases.append(("the ratio target missed (a figure, not a proof)", missed, True))
    for name, reports, want in cases:
        out = tempfile.mkdtemp(prefix="layer-check-test-")
        try:
            for fname, r in reports.items():
                with open(os.path.join(out, fname), "w") as f:
                    json.dump(r, f)
            lines, ok, doc = lcs.summarize(out)
            check(f"summary {name}", ok, want, bad)
            check(f"summary {name}: doc pass", doc["pass"], want, bad)
            if not lines[-1].startswith(f"layer-check: {'PASS' if want else 'FAIL'}"):
                bad.append(f"summary {name}: last line {lines[-1]!r}")
        finally:
            shutil.rmtree(out, ignore_errors=True)


def live_cases(bad):
    """start_batch_after against two real daemons (host memory, loopback)."""
    binary = os.environ.get("B2BD_BIN") or os.path.join(HERE, "..", "..", "bin", "b2bd")
    if not os.access(binary, os.X_OK):
        print(f"live check skipped: no b2bd at {binary} (set B2BD_BIN)")
        return 0
    try:
        import numpy as np
        import b2b
        from b2b import stream
        from b2b.v1 import b2b_pb2 as pb
    except ImportError as e:
        print(f"live check skipped: {e}")
        return 0
    tmp = tempfile.mkdtemp(prefix="smprobe-")
    d = sp.Daemons(os.path.dirname(os.path.abspath(binary)), tmp)
    ca, cb = b2b.Client(d.socks[0], timeout=60), b2b.Client(d.socks[1], timeout=60)
    ran = 0
    try:
        n, size = 1000, 4096
        src = ca._call(ca._stub.RegisterRegion, pb.RegisterRegionRequest(host_alloc=pb.HostAlloc(size=2 * n * size)), 30).region.id
        cb._call(cb._stub.RegisterRegion, pb.RegisterRegionRequest(host_alloc=pb.HostAlloc(size=2 * n * size), export_name="dst"), 30)
        ca._call(ca._stub.Status, pb.StatusRequest(), 30)
        counter = stream.Counter(ca, cuda=False)
        so = (np.arange(n, dtype=np.uint64) * 2) * np.uint64(size)
        do = (np.arange(n - 1, -1, -1, dtype=np.uint64) * 2 + 1) * np.uint64(size)
        for tr in ("tcp", "local"):
            # In order: armed, then written; the daemon must see and post after the write.
            v = counter.value + 1
            h = sp.start_batch_after(ca, src, d.peers[1], "dst", so, do, size, tr, (counter, v), 30)
            # Polled for 0.2 s: a correct trigger stays armed whatever the timing; one that did not
            # hold would let the batch end here (and its post would come before the write below).
            armed, deadline = True, time.monotonic() + 0.2
            while armed and time.monotonic() < deadline:
                armed = not h.done()
            t = {"armed_before_write": armed, "write_unix_ns": time.time_ns()}
            counter.set(v)
            res = h.wait(timeout=30)
            t.update(seen_unix_ns=res.phases.trigger_seen_unix_ns, posted_unix_ns=res.phases.posted_unix_ns)
            check(f"live {tr}: blocks moved", res.blocks, n, bad)
            check(f"live {tr}: order problems of a transfer held until its write", sp.trigger_order_problems(t), [], bad)
            # Out of order: the counter is already at the value, so the batch runs at once; a
            # "write" recorded afterwards must be found later than the daemon's post.
            h = sp.start_batch_after(ca, src, d.peers[1], "dst", so, do, size, tr, (counter, v), 30)
            res = h.wait(timeout=30)
            t = {"armed_before_write": False, "write_unix_ns": time.time_ns(),
                 "seen_unix_ns": res.phases.trigger_seen_unix_ns, "posted_unix_ns": res.phases.posted_unix_ns}
            why = sp.trigger_order_problems(t)
            if not any("before the counter was written" in w for w in why):
                bad.append(f"live {tr}: a post before the recorded write was not caught: {why} {t}")
            ran += 1
        counter.close()
    finally:
        ca.close()
        cb.close()
        stops = d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(os.path.join(sp.SHM_ROOT, os.path.basename(tmp)), ignore_errors=True)
    check("live: daemons exited cleanly", [s["rc"] for s in stops], [0, 0], bad)
    return ran


def main():
    bad = []
    spin_cases(bad)
    order_cases(bad)
    proof_cases(bad)
    summary_cases(bad)
    live = live_cases(bad)
    for b in bad:
        print("FAIL", b)
    print(f"layer_check_test: {len(bad)} failures; live transports checked: {live}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
