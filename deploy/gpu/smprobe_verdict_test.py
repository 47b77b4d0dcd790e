#!/usr/bin/env python3
"""Table test of smprobe.py's ncu verdict on synthetic ncu logs (no GPU):
only a complete, error-free, zero-kernel log of the daemon ncu attached to,
stopped cleanly, beside a parsed positive control, passes.
Run: python3 deploy/gpu/smprobe_verdict_test.py"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import smprobe as sp  # noqa: E402


def main():
    d = tempfile.mkdtemp(prefix="smprobe-verdict-")

    def log(name, text):
        p = os.path.join(d, name)
        open(p, "w").write(text)
        return sp.parse_ncu_log(p)

    conn, disc = "==PROF== Connected to process 22 (/x/b2bd)\n", "==PROF== Disconnected from process 22\n"
    ctl = log("c.log", '==PROF== Connected to process 10 (/usr/bin/python3)\n==PROF== Profiling "k": 0%....100% - 9 passes\n'
              "==PROF== Disconnected from process 10\n")
    good = log("a.log", conn + disc + "==WARNING== No kernels were profiled.\n")
    clean = {"daemon_pid": 22, "rc": 0, "killed": False}
    cases = [
        ("zero kernels, complete", ctl, good, clean, True),
        ("zero kernels, no summary line but complete", ctl, log("n.log", conn + disc), clean, True),
        ("zero kernels as CUDA 13's ncu logs it (no Disconnected)", ctl, log("w.log", conn + "==WARNING== No kernels were profiled.\n"), clean, True),
        ("control not parsed", log("e0.log", ""), good, clean, False),
        ("control saw no kernel", log("c0.log", "==PROF== Connected to process 10 (p)\n==PROF== Disconnected from process 10\n"), good, clean, False),
        ("log cut short", ctl, log("b.log", conn), clean, False),
        ("log missing", ctl, sp.parse_ncu_log(os.path.join(d, "nope.log")), clean, False),
        ("log empty", ctl, log("e.log", ""), clean, False),
        ("another process", ctl, good, dict(clean, daemon_pid=99), False),
        ("daemon killed", ctl, good, dict(clean, killed=True, rc=-9), False),
        ("kernel profiled", ctl, log("k.log", conn + '==PROF== Profiling "k": 100%\n' + disc), clean, False),
        ("ncu error", ctl, log("r.log", conn + "==ERROR== boom\n" + disc), clean, False),
    ]
    bad = 0
    for name, c, lg, st, want in cases:
        ok, why = sp.ncu_verdict(c, [lg], [st])
        if ok != want:
            bad += 1
            print(f"FAIL {name}: verdict {ok}, want {want}: {why}")
    print(f"{len(cases) - bad}/{len(cases)} ncu verdict cases as expected")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
