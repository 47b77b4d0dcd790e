#!/usr/bin/env python3
"""Which scatter of many small blocks runs on copy engines only (h2dprobe.cu)?

For every scenario x variant x size: the idle time (best and median of
--reps) and one run while smprobe (another process) holds every SM slot for
--ms ms. A variant that runs a kernel makes the driver time-slice its context
onto the SMs: smprobe sees stalls (gaps >= --gap-us in the spin's timer
reads) in the run's window. Prints a table, writes --json.
Usage: h2dprobe.py --h2dprobe BIN --smprobe BIN [--sizes 128,4096,65536]
"""
import argparse
import json
import subprocess
import sys
import time

VARIANTS = ["batch", "batch_any", "batch_api", "batch_overlap", "batch_hint", "batch_c16", "batch_c256",
            "loop", "loop_htod", "loop2", "loop4"]
SCENARIOS = {"h2d": VARIANTS, "stage": VARIANTS, "d2h": ["batch", "loop", "loop4"]}
# --set 2: where does the copy engine take over (block size, copies a call), and does a busy stream help?
VARIANTS2 = ["single", "batch", "c64", "c256", "c1024", "c4096", "loop", "pre_c256", "pre_loop", "dpre_c256", "gate_c256", "gate_batch", "gate_loop"]
SCENARIOS2 = {"h2d": VARIANTS2, "stage": ["batch", "c256", "pre_c256", "gate_c256", "gate_loop"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--h2dprobe", required=True)
    ap.add_argument("--smprobe", required=True)
    ap.add_argument("--sizes", default="128,4096,65536")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ms", type=float, default=400)
    ap.add_argument("--gap-us", type=float, default=100)
    ap.add_argument("--json", required=True)
    ap.add_argument("--set", type=int, default=1)
    a = ap.parse_args()
    sp = subprocess.Popen([a.smprobe, "--ms", str(a.ms), "--gap-us", str(a.gap_us)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True, bufsize=1)
    hp = subprocess.Popen([a.h2dprobe], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    while True:
        line = sp.stdout.readline()
        if not line:
            sys.exit("smprobe exited before it was ready")
        print("smprobe:", line.strip(), flush=True)
        if line.strip() == "ready":
            break
    line = hp.stdout.readline()
    print("h2dprobe:", line.strip(), flush=True)
    rep = {"h2dprobe": line.strip(), "cases": []}

    def run(scen, var, size, reps):
        hp.stdin.write(f"run {scen} {var} {size} {reps}\n")
        hp.stdin.flush()
        out = hp.stdout.readline().split()
        if not out or out[0] != "result":
            return {"error": " ".join(out)}
        return {k: float(v) for k, v in (kv.split("=") for kv in out[1:])}

    def spun(scen, var, size):
        sp.stdin.write("spin\n")
        sp.stdin.flush()
        t0 = float(sp.stdout.readline().split()[1])
        r = run(scen, var, size, 1)
        t1 = time.monotonic()
        done = dict(kv.split("=", 1) for kv in sp.stdout.readline().split()[1:])
        window_us = (t1 - float(done["launched"])) * 1e6 + 500
        gaps = [] if done["gaps"] == "-" else [g.split("@") for g in done["gaps"].split(",")]
        gaps = [(w, int(ol.split(":")[0]), int(ol.split(":")[1])) for w, ol in gaps]
        inw = [(w, o, l) for w, o, l in gaps if o <= window_us and w.endswith("/0")]  # block 0's stalls
        return {"spin_took_ms": (t1 - t0) * 1e3, "spin_copy_ms": r.get("best_ms"), "error": r.get("error"),
                "stalls": len(inw), "stall_us": sum(l for _, _, l in inw), "gap_blocks": int(done["gap_blocks"]),
                "maxgap_us": float(done["maxgap_us"]), "gaps": done["gaps"],
                "waited": (t1 - t0) * 1e3 > 0.5 * a.ms}

    print(f"{'scenario':<6} {'variant':<14} {'block':>6} {'idle best':>10} {'idle med':>9} {'spun ms':>8} {'stalls':>6} {'stall us':>8} {'gap blks':>8}  verdict", flush=True)
    scens = SCENARIOS if a.set == 1 else SCENARIOS2
    for c in [("h2d", "event", 128)] + [(s, v, z) for s, vs in scens.items() for z in map(int, a.sizes.split(",")) for v in vs
                                        if s == "h2d" or z in (128, 4096, 65536)]:
        scen, var, size = c
        idle = run(scen, var, size, a.reps)
        s = spun(scen, var, size)
        case = {"scenario": scen, "variant": var, "block_bytes": size, "idle": idle, **s}
        case["zero_sm"] = not s["error"] and s["stalls"] == 0 and s["gap_blocks"] == 0 and not s["waited"]
        rep["cases"].append(case)
        f = lambda v: "-" if v is None else f"{v:.2f}"
        print(f"{scen:<6} {var:<14} {size:>6} {f(idle.get('best_ms')):>10} {f(idle.get('median_ms')):>9} {f(s['spin_copy_ms']):>8} "
              f"{s['stalls']:>6} {s['stall_us']:>8} {s['gap_blocks']:>8}  "
              f"{'0 SMs' if case['zero_sm'] else ('ERROR ' + (s['error'] or idle.get('error') or '')) if s['error'] else 'SMs' + (' (waited)' if s['waited'] else '')}",
              flush=True)
    for p in (sp, hp):
        p.stdin.write("quit\n")
        p.stdin.flush()
        p.wait(30)
    json.dump(rep, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
