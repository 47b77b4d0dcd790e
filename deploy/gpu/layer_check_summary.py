#!/usr/bin/env python3
"""layer-check's verdict (deploy/gpu/layer-check.sh): reads the step reports
in OUT and prints a short summary; exit 1 unless every proof passed.

  OUT/layer-stream.json      layer_stream.py, normal run: every block equal,
                             no early post (its pass); figures reported
                             against the issue's targets, not judged
  OUT/layer-stream-ncu.json  layer_stream.py --ncu: 0 kernels in the daemons
                             (complete logs, positive control)
  OUT/sm-probe-trig.json     smprobe.py --mode probe --cases triggered
  OUT/sm-ncu-trig.json       smprobe.py --mode ncu --cases triggered
                             joined case by case: both proofs for every case

Writes OUT/layer-check.json. Run: python3 layer_check_summary.py OUT
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import smprobe  # noqa: E402  (both_proofs)

LAYER_STREAM, LAYER_STREAM_NCU = "layer-stream.json", "layer-stream-ncu.json"
PROBE_TRIG, NCU_TRIG = "sm-probe-trig.json", "sm-ncu-trig.json"


def load(out, name):
    """A step's report, or None when it is missing or unreadable."""
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def layer_stream_lines(rep):
    """The normal run: (lines, ok). ok is the script's own pass (blocks
    equal, no early post, no failed transfer); the ratio and lag targets
    are reported beside each configuration."""
    if rep is None:
        return [f"layer_stream: no report ({LAYER_STREAM}): FAIL"], False
    f = lambda v, p=3: "-" if v is None else f"{v:.{p}f}"
    lines = []
    for c in rep.get("configs", []):
        lag = c.get("lag_post_us") or {}
        lines.append(f"layer_stream {c.get('name', '?'):>14}: compute {f(c.get('layer_compute_ms'))} ms/layer, transfer "
                     f"{f(c.get('layer_transfer_ms'))} ms/layer; tail (a) {f(c.get('tail_a_ms'))} ms, (b) {f(c.get('tail_b_ms'))} ms, "
                     f"ratio {f(c.get('ratio'))} (<= 0.25: {'met' if c.get('meets_ratio') else 'not met'}); "
                     f"write->post p50 {f(lag.get('p50'), 1)} us, p99 {f(lag.get('p99'), 1)} us "
                     f"(p50 <= 20: {'met' if c.get('meets_lag') else 'not met'}); early posts {c.get('early_posts')}")
    ok = rep.get("pass") is True and bool(rep.get("configs"))
    if rep.get("error"):
        lines.append(f"layer_stream: error {rep['error']}")
    lines.append(f"layer_stream: {len(rep.get('configs', []))} configurations, transport {rep.get('transport')}: "
                 f"{'PASS' if ok else 'FAIL'}")
    return lines, ok


def layer_stream_ncu_lines(rep):
    """The --ncu pass: (lines, ok). ok needs the script's pass and ncu's
    verdict (complete logs, 0 kernels, a positive control)."""
    if rep is None:
        return [f"layer_stream --ncu: no report ({LAYER_STREAM_NCU}): FAIL"], False
    n = rep.get("ncu") or {}
    ok = rep.get("pass") is True and n.get("ok") is True
    line = (f"layer_stream --ncu: {n.get('kernels', '-')} kernels in the daemons over "
            f"{sum(len(c.get('runs', [])) for c in rep.get('configs', []))} runs: {'PASS' if ok else 'FAIL'}")
    if n.get("why"):
        line += f" ({'; '.join(n['why'])})"
    if rep.get("error"):
        line += f" error {rep['error']}"
    return [line], ok


def summarize(out):
    """(lines, ok, doc) over every step's report in out."""
    ls, ls_ok = layer_stream_lines(load(out, LAYER_STREAM))
    ln, ln_ok = layer_stream_ncu_lines(load(out, LAYER_STREAM_NCU))
    probe, ncu = load(out, PROBE_TRIG), load(out, NCU_TRIG)
    sp, sp_ok = smprobe.both_proofs(ncu or {}, probe or {})
    if probe is None or ncu is None:
        sp.append(f"smprobe triggered: missing report(s): {[n for n, r in ((PROBE_TRIG, probe), (NCU_TRIG, ncu)) if r is None]}")
        sp_ok = False
    ok = ls_ok and ln_ok and sp_ok
    lines = ["--- layer streaming (normal run)"] + ls + ["--- layer streaming under ncu"] + ln + \
        ["--- zero SMs during triggered transfers (smprobe: occupancy probe and ncu)"] + sp + \
        [f"layer-check: {'PASS' if ok else 'FAIL'} (layer_stream {'ok' if ls_ok else 'FAIL'}, "
         f"its ncu pass {'ok' if ln_ok else 'FAIL'}, triggered zero-SM proofs {'ok' if sp_ok else 'FAIL'})"]
    doc = {"pass": ok, "layer_stream_ok": ls_ok, "layer_stream_ncu_ok": ln_ok, "triggered_zero_sm_ok": sp_ok, "lines": lines}
    return lines, ok, doc


def main(argv):
    if len(argv) != 1:
        print("usage: layer_check_summary.py OUT_DIR", file=sys.stderr)
        return 2
    lines, ok, doc = summarize(argv[0])
    for line in lines:
        print(line)
    with open(os.path.join(argv[0], "layer-check.json"), "w") as f:
        json.dump(doc, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
