#!/usr/bin/env python3
"""samedev_table.py OUT_DIR: the same-device sweeps of samedev-check.sh side by
side (median ms per size; 'prep' = prepared submits; '1st' = the first, warm-up
batch of the ad hoc mode), with rawbatch's GPU0 -> GPU0 batch (device copies,
SMs) and raw staged copy from the same call."""
import json
import os
import sys


def rows(path):
    try:
        rep = json.load(open(path))
    except (OSError, ValueError):
        return {}
    out = {}
    for r in rep.get("rows", []):
        out[r["block_bytes"]] = r
    return out


def ms(m, key="median_seconds"):
    return None if not m or m.get(key) is None else m[key] * 1e3


def main():
    out = sys.argv[1]
    raw = {}
    try:
        for line in open(os.path.join(out, "rawbatch.txt")):
            f = line.split()
            if f and f[0].isdigit():
                raw[int(f[0])] = (float(f[1]), float(f[3]))
    except OSError:
        pass
    runs = {}
    for name in ("local-new", "local-old", "tcp"):
        runs[name] = rows(os.path.join(out, f"samedev-{name}.json"))
        runs[name].update(rows(os.path.join(out, f"samedev-big-{name}.json")))
    sizes = sorted({b for r in runs.values() for b in r})
    f = lambda v: "-" if v is None else (f"{v:.1f}" if v >= 100 else f"{v:.2f}")
    head = ["block"]
    for name in runs:
        head += [name, "prep", "1st"]
    head += ["new/tcp", "raw batch", "raw stage", "verified"]
    print(" ".join(f"{h:>10}" for h in head))
    for b in sizes:
        cells, med = [str(b)], {}
        ver = []
        for name, r in runs.items():
            row = r.get(b)
            a, p = (row or {}).get("adhoc"), (row or {}).get("prepared")
            med[name] = min(x for x in (ms(a), ms(p), 1e18) if x is not None)
            cells += [f(ms(a)), f(ms(p)), f(ms(a, "first_seconds"))]
            ver.append("-" if not row else ("yes" if all(m.get("verified") for m in (a, p) if m) else "NO"))
        n, t = med.get("local-new"), med.get("tcp")
        cells.append(f"{n / t:.2f}" if n and t and n < 1e17 and t < 1e17 else "-")
        rb = raw.get(b, (None, None))
        cells += [f(rb[0]), f(rb[1] if rb[1] and rb[1] > 0 else None), "/".join(ver)]
        print(" ".join(f"{c:>10}" for c in cells))


if __name__ == "__main__":
    main()
