#!/usr/bin/env python3
"""Zero SMs, proven per path two independent ways (gpu-check steps 4 and 5).

Starts two b2bd daemons on this host (transport auto, so both the local
path and TCP are built) and moves 10,000 gapped blocks over every memory
kind and path: cuda0->cuda0 (same device), host->cuda0, cuda0->host, and
cuda0->cuda1 where there are two GPUs; each over local and over tcp.

--mode ncu:   both daemons run under Nsight Compute; for each path the
              kernels ncu profiled in the daemons while it ran are counted
              (must be 0). The daemons are stopped with SIGTERM sent to the
              b2bd process itself (found by SO_PEERCRED on its socket, as
              b2b-bench does), never to ncu, so ncu sees them exit. PASS needs,
              from the logs alone: a positive control (ncu over one PyTorch
              kernel) counted by the same parser, and for each daemon a log
              where ncu attached to that pid and saw it exit, with no ==ERROR==
              and 0 kernels. ncu's exit code is recorded, not judged (its
              meaning is not documented where we looked; it was 9 when the old
              stop signalled ncu's children). A missing or cut log is FAIL.
--mode probe: for each path a batch starts the moment smprobe (smprobe.cu)
              holds every SM slot of every GPU for --ms ms. The batch used no
              SMs when it finished in the first half of the spin and no other
              context was time-sliced onto the SMs meanwhile (no gap in the
              spin's globaltimer reads). Two positive controls must be caught,
              or the probe cannot tell and fails: a 1-block kernel in
              smprobe's own process (must wait for the spin), and a 1-block
              PyTorch kernel in this process (another context, like a daemon).

Triggered cases (--cases triggered or all; docs/kv.md, "Layer streaming"):
the same paths, each batch started with StartTransfer after=(counter, v) on
a b2b.stream.Counter of daemon A BEFORE the probe holds the SMs (and seen
still armed 20 ms later). The counter is then written, in probe mode while
every SM slot is held, by one of --trigger-writers:
  host:   a store to the counter's host mapping (numpy);
  stream: b2b.stream.mark_layer_done on a CUDA stream of this process
          (cuStreamWriteValue64: a stream memory operation, no kernel).
Judged as the plain cases (probe: landed in the first half of the spin, no
SM stall in its window; ncu: 0 kernels in the daemons), and besides, in
both modes, the order: the daemon must report that it saw the value and
posted no earlier than the write (trigger_seen/posted_unix_ns against
time.time_ns() taken just before the write, one clock on one host).

Writes a JSON report (--json) and prints one line per case; exit 1 when a
path or a control fails.

  smprobe.py summarize NCU.json PROBE.json   joins the two reports case by
  case (gpu-check step 4c, layer-check) and exits 1 unless every case passed
  both proofs.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np


def log(*a):
    print(*a, flush=True)


# Host regions live in --shm-dir, which must be tmpfs as in production
# (/dev/shm/b2bd): the kernel refuses long-term pins (cuMemHostRegister:
# CUDA_ERROR_INVALID_VALUE) of file pages on a disk file system, and host-GPU
# batches over local then run from pageable memory, on the SMs.
SHM_ROOT = "/dev/shm"


class Daemons:
    def __init__(self, bin_dir, tmp, ncu_dir=None):
        self.tmp, self.procs, self.logs, self.peers, self.socks = tmp, [], [], [], []
        self.ncu = bool(ncu_dir)
        for name in ("a", "b"):
            peer = f"127.0.0.1:{random.randint(20000, 40000)}"
            sock = os.path.join(tmp, f"{name}.sock")
            args = [os.path.join(bin_dir, "b2bd"), "--node-name", f"probe-{name}", "--socket", sock,
                    "--shm-dir", os.path.join(SHM_ROOT, os.path.basename(tmp), f"shm-{name}"), "--peer-listen", peer,
                    "--data-listen", "127.0.0.1:0", "--transport", "auto", "--insecure"]
            logf = os.path.join(ncu_dir or tmp, f"daemon-{name}.log")
            if ncu_dir:
                args = ["ncu", "--target-processes", "all", "--log-file", os.path.join(ncu_dir, f"ncu-daemon-{name}.log")] + args
            self.procs.append(subprocess.Popen(args, stdout=open(logf, "w"), stderr=subprocess.STDOUT, start_new_session=True))
            self.logs.append(os.path.join(ncu_dir, f"ncu-daemon-{name}.log") if ncu_dir else logf)
            self.peers.append(peer)
            self.socks.append(sock)
        deadline = time.time() + 120
        while not all(os.path.exists(s) for s in self.socks):
            if time.time() > deadline or any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"daemons did not start; logs in {self.logs}")
            time.sleep(0.1)

    def daemon_pids(self):
        """The b2bd processes themselves (under ncu they are not our children):
        the peer of each daemon's API socket, as b2b-bench finds them."""
        pids = []
        for p, sock in zip(self.procs, self.socks):
            try:
                pids.append(peer_pid(sock))
            except OSError:
                pids.append(None if self.ncu else p.pid)
        return pids

    def stop(self):
        """SIGTERM each daemon (b2bd drains and exits 0) and wait for ncu to
        write its summary. Never signals ncu itself unless the daemon did not
        exit: a stop that needed that is reported (killed), and makes the ncu
        verdict FAIL, as the log may be cut short."""
        pids = self.daemon_pids()
        out = []
        for p, pid in zip(self.procs, pids):
            r = {"daemon_pid": pid, "rc": None, "killed": False}
            if pid is None:
                r["error"] = "daemon pid not found (its socket did not answer)"
            else:
                try:
                    os.kill(pid, signal.SIGTERM)
                except OSError as e:
                    r["error"] = f"SIGTERM {pid}: {e}"
            out.append(r)
        for p, r in zip(self.procs, out):
            try:
                r["rc"] = p.wait(120)
            except subprocess.TimeoutExpired:
                r["killed"] = True
                p.terminate()
                try:
                    r["rc"] = p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    r["rc"] = p.wait()
        return out


def peer_pid(sock_path):
    """The pid of the process listening on a Unix socket (SO_PEERCRED)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(10)
        s.connect(sock_path)
        pid, _, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        return pid
    finally:
        s.close()


NCU_CONNECTED = re.compile(r"^==PROF== Connected to process (\d+)", re.M)
NCU_DISCONNECTED = re.compile(r"^==PROF== Disconnected from process (\d+)", re.M)
NCU_PROFILING = re.compile(r'^==PROF== Profiling "', re.M)
NCU_ERROR = re.compile(r"^==ERROR==.*$", re.M)


def parse_ncu_log(path):
    """What one ncu log says. complete: ncu attached to a process and saw it
    exit, so its kernel count covers the process's whole life: every
    Connected has its Disconnected, or, for a process that launched no
    kernel, ncu's closing "No kernels were profiled" (seen on CUDA 13's ncu:
    it then prints no Disconnected line)."""
    try:
        text = open(path, errors="replace").read()
    except OSError as e:
        return {"path": path, "exists": False, "error": str(e), "complete": False, "kernels": None}
    conn, disc = NCU_CONNECTED.findall(text), NCU_DISCONNECTED.findall(text)
    return {"path": path, "exists": True, "connected": conn, "disconnected": disc,
            "kernels": len(NCU_PROFILING.findall(text)), "errors": NCU_ERROR.findall(text),
            "no_kernels_said": "No kernels were profiled" in text,
            "complete": bool(conn) and (set(conn) <= set(disc) or "==WARNING== No kernels were profiled" in text)}


def ncu_verdict(control, daemons, stops):
    """PASS only when the positive control shows this ncu's log format is
    parsed (a kernel counted in a complete log) and every daemon's log is
    complete, without errors, with 0 kernels, after a clean SIGTERM stop.
    ncu's exit code is recorded, not judged: the log is the evidence."""
    why = []
    if not (control.get("complete") and (control.get("kernels") or 0) >= 1):
        why.append(f"positive control not parsed (log {control.get('path')}: complete={control.get('complete')}, "
                   f"kernels={control.get('kernels')}): a zero below would mean nothing")
    for lg, st in zip(daemons, stops):
        name = os.path.basename(lg["path"])
        if not lg.get("exists"):
            why.append(f"{name}: missing ({lg.get('error')})")
            continue
        if not lg["complete"]:
            why.append(f"{name}: incomplete (connected {lg['connected']}, disconnected {lg['disconnected']})")
        if lg["errors"]:
            why.append(f"{name}: ncu errors {lg['errors'][:3]}")
        if lg["kernels"] != 0:
            why.append(f"{name}: {lg['kernels']} kernels profiled")
        if st.get("killed") or st.get("error"):
            why.append(f"{name}: the daemon was not stopped cleanly ({st})")
        if st.get("daemon_pid") is not None and str(st["daemon_pid"]) not in lg["connected"]:
            why.append(f"{name}: ncu never attached to the daemon (pid {st['daemon_pid']}, attached {lg['connected']})")
    return not why, why


def ncu_control(ncu_dir):
    """Positive control: ncu over a process that runs one real kernel."""
    path = os.path.join(ncu_dir, "ncu-control.log")
    code = ('import torch; x = torch.ones(1 << 20, device="cuda"); y = (x * 2).sum(); '
            'torch.cuda.synchronize(); print("control kernel ran", y.item())')
    r = subprocess.run(["ncu", "--target-processes", "all", "--log-file", path, sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=600)
    out = parse_ncu_log(path)
    out["rc"] = r.returncode
    return out


def prof_count(path):
    try:
        return len(re.findall(r'==PROF== Profiling "', open(path, errors="replace").read()))
    except OSError:
        return 0


def parse_done(line):
    """smprobe's "done k=v ..." line as a dict."""
    f = line.split()
    if not f or f[0] != "done":
        raise RuntimeError(f"smprobe: expected a done line, got {line!r}")
    return dict(kv.split("=", 1) for kv in f[1:])


def judge_spin(done, t0, t1, spin_ms):
    """Judge an action that ran from t0 (every SM slot held; CLOCK_MONOTONIC
    seconds, as smprobe prints it) to t1, from smprobe's done line: it used
    no SMs when it ended in the first half of the spin, every block was
    resident, and no other context was time-sliced onto the SMs in its
    window (no gap in the spin's globaltimer reads)."""
    spin_end, ctl, ctl0 = float(done["spin_end"]), float(done["control_done"]), float(done["control_launched"])
    sec = spin_ms / 1e3
    # A gap (another context time-sliced onto the SMs) counts against
    # the action when it starts before the action ended: offsets are
    # from each block's start, which is after the launch.
    window_us = (t1 - float(done["launched"])) * 1e6 + 500
    gaps = [] if done["gaps"] == "-" else [g.split("@") for g in done["gaps"].split(",")]
    gaps = [(w, int(ol.split(":")[0]), int(ol.split(":")[1])) for w, ol in gaps]
    r = {"t0": t0, "took_ms": (t1 - t0) * 1e3, "spin_left_ms": (spin_end - t1) * 1e3,
         "maxgap_us": float(done["maxgap_us"]), "gap_blocks": int(done["gap_blocks"]), "blocks": int(done["blocks"]),
         "resident": done["resident"] == "1", "control_waited": ctl >= spin_end - 0.1 * sec and ctl - ctl0 >= 0.2 * sec,
         "gaps": done["gaps"], "window_us": window_us}
    r["gaps_in_window"] = [f"{w}@{o}:{l}" for w, o, l in gaps if o <= window_us]
    r["preempted"] = bool(r["gaps_in_window"])
    r["early"] = (t1 - t0) <= 0.5 * sec
    r["sm_free"] = r["early"] and not r["preempted"] and r["resident"]
    return r


def trigger_order_problems(t):
    """What is wrong with one triggered transfer's order, from its record:
    armed_before_write (still running 20 ms after its start, before the
    write), write_unix_ns (time.time_ns() just before the counter write),
    and the daemon's trigger_seen_unix_ns and posted_unix_ns (the same
    clock: one host). Empty when the trigger held the transfer until the
    write and the daemon saw the value and posted after it."""
    why = []
    if not t.get("armed_before_write"):
        why.append("the transfer had ended before its counter was written: the trigger did not hold it")
    w, seen, posted = t.get("write_unix_ns") or 0, t.get("seen_unix_ns") or 0, t.get("posted_unix_ns") or 0
    if not w:
        why.append("no write time recorded")
    if not seen:
        why.append("the daemon reported no trigger_seen time: the transfer did not wait for a trigger")
    elif w and seen < w:
        why.append(f"the daemon saw the value {(w - seen) / 1e3:.1f} us before it was written")
    if not posted:
        why.append("the daemon reported no posted time")
    elif w and posted < w:
        why.append(f"posted {(w - posted) / 1e3:.1f} us before the counter was written")
    return why


def triggered_probe_verdict(r, t):
    """A triggered case under the probe: the spin's verdict (judge_spin) and
    the trigger's order. Returns (ok, why)."""
    why = list(trigger_order_problems(t))
    if not r.get("resident"):
        why.append("the spin's blocks were not all resident: the probe did not hold every SM slot")
    if r.get("preempted"):
        why.append(f"SM stalls in its window: {' '.join(r.get('gaps_in_window', []))}")
    if not r.get("early"):
        why.append(f"landed {r.get('took_ms', 0):.1f} ms into the spin, not in its first half")
    return not why, why


def case_key(c):
    """A case's identity across the ncu and probe reports."""
    return (c["path"], c["transport"], c["block_bytes"], c.get("trigger") or "")


def both_proofs(ncu, probe):
    """Join an ncu and a probe report case by case. Returns (lines, ok): ok
    only when both reports passed, the probe has cases, and every probe case
    passed and has an ncu case of the same key that passed."""
    nc = {case_key(c): c for c in ncu.get("cases", [])}
    f = lambda v, p=1: "-" if v is None else f"{v:.{p}f}"
    lines = [f"{'path':<14} {'transport':<9} {'block':>7} {'trigger':>8} {'carried by':>10} {'ncu kernels':>11} "
             f"{'probe: took ms':>14} {'spin left ms':>12} {'SM stalls':>9}  verdict"]
    bad = 0
    for c in probe.get("cases", []):
        n = nc.get(case_key(c), {})
        k = n.get("ncu_kernels")
        ok = c.get("ok") is True and n.get("ok") is True
        bad += not ok
        lines.append(f"{c['path']:<14} {c['transport']:<9} {c['block_bytes']:>7} {c.get('trigger') or '-':>8} "
                     f"{c.get('carried_by', '-'):>10} {('-' if k is None else k):>11} {f(c.get('took_ms'), 2):>14} "
                     f"{f(c.get('spin_left_ms')):>12} {len(c.get('gaps_in_window', [])):>9}  "
                     f"{'0 SMs (both proofs)' if ok else 'FAIL'}" + (f"  ({'; '.join(c['why'])})" if c.get("why") else ""))
    for c in probe.get("controls", []):
        lines.append(f"  {c['name']:<40} took {c['took_ms']:.2f} ms, SM stalls in its window {c.get('gaps_in_window')}, "
                     f"caught as expected: {c['ok']}")
    missing = [case_key(c) for c in ncu.get("cases", []) if case_key(c) not in {case_key(p) for p in probe.get("cases", [])}]
    if missing:
        lines.append(f"  ncu cases the probe did not run: {missing}")
    ok = bool(probe.get("cases")) and not bad and probe.get("pass") is True and ncu.get("pass") is True
    ntrig = sum(1 for c in probe.get("cases", []) if c.get("trigger"))
    lines.append(f"zero SMs {'proven' if ok else 'NOT proven'} both ways for every case "
                 f"({len(probe.get('cases', []))} cases, {ntrig} triggered; {bad} failed; "
                 f"probe report pass={probe.get('pass')}, ncu report pass={ncu.get('pass')})")
    return lines, ok


def summarize_main(argv):
    if len(argv) != 2:
        print("usage: smprobe.py summarize NCU.json PROBE.json", file=sys.stderr)
        return 2

    def load(n):
        try:
            with open(n) as fh:
                return json.load(fh)
        except (OSError, ValueError) as e:
            print(f"smprobe summarize: {n}: {e}")
            return {"cases": [], "controls": []}
    lines, ok = both_proofs(load(argv[0]), load(argv[1]))
    for line in lines:
        print(line)
    return 0 if ok else 1


def start_batch_after(c, src, peer, dst, so, do, size, transport, after, timeout):
    """StartTransfer of a batch with after=(counter, value)."""
    return c.start_transfer(src, peer, dst, so, do, block_size=size, timeout=timeout, transport=transport, after=after)


def exit_on_sigterm():
    """Turn the first SIGTERM (timeout(1)) into SystemExit, so that finally
    blocks stop the daemons and write the report."""
    def on_term(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--mode", choices=("ncu", "probe"), required=True)
    ap.add_argument("--smprobe", help="--mode probe: the built smprobe")
    ap.add_argument("--ncu-dir", help="--mode ncu: where the daemons' ncu logs go")
    ap.add_argument("--json", required=True)
    ap.add_argument("--blocks", type=int, default=10000)
    ap.add_argument("--sizes", default="4096,65536")
    ap.add_argument("--transports", default="local,tcp")
    ap.add_argument("--paths", default="", help="comma-separated subset of the paths (e.g. cuda0->cuda0); all when empty")
    ap.add_argument("--ms", type=float, default=400)
    ap.add_argument("--gap-us", type=float, default=100)
    ap.add_argument("--cases", choices=("all", "plain", "triggered"), default="all",
                    help="plain batches, triggered ones (after=(counter, v)), or both")
    ap.add_argument("--trigger-sizes", default="4096", help="block sizes of the triggered cases")
    ap.add_argument("--trigger-writers", default="host,stream",
                    help="who writes the counter: host (a store to its mapping), stream (mark_layer_done)")
    args = ap.parse_args()
    exit_on_sigterm()

    import b2b
    from b2b.v1 import b2b_pb2 as pb
    import torch

    ngpu = torch.cuda.device_count()
    sizes = [int(s) for s in args.sizes.split(",")]
    tsizes = [int(s) for s in args.trigger_sizes.split(",")]
    writers = [w for w in args.trigger_writers.split(",") if w]
    for w in writers:
        if w not in ("host", "stream"):
            ap.error(f"--trigger-writers: {w!r} is neither host nor stream")
    transports = args.transports.split(",")
    # (block size, counter writer or None) per path and transport
    variants = ([(z, None) for z in sizes] if args.cases in ("all", "plain") else []) + \
        ([(z, w) for z in tsizes for w in writers] if args.cases in ("all", "triggered") else [])
    region = 2 * args.blocks * max(z for z, _ in variants)
    paths = [("cuda0->cuda0", ("cuda", 0), ("cuda", 0)), ("host->cuda0", ("host", 0), ("cuda", 0)),
             ("cuda0->host", ("cuda", 0), ("host", 0))]
    if ngpu >= 2:
        paths.append(("cuda0->cuda1", ("cuda", 0), ("cuda", 1)))
    if args.paths:
        want = args.paths.split(",")
        unknown = [p for p in want if p not in [q[0] for q in paths]]
        if unknown:
            ap.error(f"--paths: {unknown} not among {[q[0] for q in paths]}")
        paths = [q for q in paths if q[0] in want]

    tmp = tempfile.mkdtemp(prefix="smprobe-")
    if args.ncu_dir:
        os.makedirs(args.ncu_dir, exist_ok=True)
    report_control = None
    if args.mode == "ncu":
        report_control = ncu_control(args.ncu_dir)
        log(f"ncu positive control: {report_control['kernels']} kernel(s) profiled, log complete: "
            f"{report_control['complete']}, ncu exit {report_control['rc']}")
    d = Daemons(args.bin, tmp, args.ncu_dir if args.mode == "ncu" else None)
    ca, cb = b2b.Client(d.socks[0], timeout=120), b2b.Client(d.socks[1], timeout=120)
    report = {"mode": args.mode, "gpus": ngpu, "blocks": args.blocks, "spin_ms": args.ms, "cases": [], "controls": [],
              "cases_run": args.cases}
    fail = False
    completed = False
    probe = None
    counter = None
    try:
        def reg(c, kind, dev, name):
            if kind == "host":
                req = pb.RegisterRegionRequest(host_alloc=pb.HostAlloc(size=region), export_name=name or "")
            else:
                req = pb.RegisterRegionRequest(cuda_alloc=pb.CudaAlloc(device=dev, size=region), export_name=name or "")
            return c._call(c._stub.RegisterRegion, req, 120).region.id

        srcs = {("host", 0): reg(ca, "host", 0, None)}
        dsts = {("host", 0): "dst-host"}
        reg(cb, "host", 0, "dst-host")
        for g in range(min(ngpu, 2)):
            srcs[("cuda", g)] = reg(ca, "cuda", g, None)
            dsts[("cuda", g)] = f"dst-cuda{g}"
            reg(cb, "cuda", g, f"dst-cuda{g}")
        st = ca._call(ca._stub.Status, pb.StatusRequest(), 30)
        report["local_detail"] = next((t.detail for t in st.transports if t.kind == pb.TRANSPORT_KIND_LOCAL), "")
        log("local transport:", report["local_detail"])

        if any(w for _, w in variants):
            from b2b import stream as b2bstream
            torch.zeros(1, device="cuda:0")  # torch's primary context is current: the counter registers in it
            torch.cuda.synchronize()
            counter = b2bstream.Counter(ca, device=0)
            tstream = torch.cuda.Stream(device=0)
            report["counter"] = repr(counter)
            log(f"triggered cases: counter {counter}, writers {writers}, sizes {tsizes}")

        if args.mode == "probe":
            probe = subprocess.Popen([args.smprobe, "--ms", str(args.ms), "--gap-us", str(args.gap_us),
                                      "--devices", ",".join(str(g) for g in range(min(ngpu, 2)))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
            while True:
                line = probe.stdout.readline()
                if not line:
                    raise RuntimeError("smprobe exited before it was ready")
                log("smprobe:", line.strip())
                if line.startswith("ready dev="):
                    report.setdefault("devices", []).append(line.strip())
                if line.strip() == "ready":
                    break
            xs = torch.zeros(1, device="cuda:0")
            xs += 1
            torch.cuda.synchronize()

        def spin(action):
            """Run action() the moment every SM slot is held; judge it."""
            probe.stdin.write("spin\n")
            probe.stdin.flush()
            line = probe.stdout.readline().split()
            assert line and line[0] == "spinning", line
            t0 = float(line[1])
            err = None
            try:
                action()
            except Exception as e:  # read the done line first: the next spin must find its own
                err = e
            t1 = time.monotonic()
            done = parse_done(probe.stdout.readline())
            if err is not None:
                raise err
            return judge_spin(done, t0, t1, args.ms)

        def verdict_line(name, r):
            v = "0 SMs" if r["sm_free"] else ("used SMs (preempted)" if r["preempted"] else "used SMs or inconclusive (waited)")
            return (f"{name:<34} took {r['took_ms']:8.2f} ms, spin left {r['spin_left_ms']:7.1f} ms, "
                    f"SM stalls in its window: {' '.join(r['gaps_in_window']) or 'none'} (all: {r['gaps']}), "
                    f"in-process control waited: {r['control_waited']} -> {v}")

        if args.mode == "probe":
            # Positive control: a kernel of another process's context (PyTorch here, like a daemon's).
            def torch_kernel():
                xs.add_(1)
                torch.cuda.synchronize()
            for _ in range(2):
                r = spin(torch_kernel)
                r["name"] = "control: 1-block kernel, other process"
                r["ok"] = (not r["sm_free"]) and r["control_waited"] and r["resident"]
                report["controls"].append(r)
                log(verdict_line(r["name"], r), "| control caught" if r["ok"] else "| CONTROL NOT CAUGHT: the probe cannot tell")
                fail |= not r["ok"]
            r = spin(lambda: None)
            r["name"] = "control: nothing (the spin alone)"
            r["ok"] = r["sm_free"] and r["control_waited"]
            report["controls"].append(r)
            log(verdict_line(r["name"], r), "| quiet" if r["ok"] else "| NOT QUIET: gaps without any other work")
            fail |= not r["ok"]

        value = [0]  # the counter's last value handed out: every triggered start waits for a new one

        def arm(sk, dk, so, do, size, tr):
            """Start a batch that waits for the counter's next value; its record."""
            value[0] += 1
            h = start_batch_after(ca, srcs[sk], d.peers[1], dsts[dk], so, do, size, tr, (counter, value[0]), 120)
            time.sleep(0.02)  # not a sync: the record's armed_before_write asks whether it still waits now
            return {"value": value[0], "handle": h, "armed_before_write": not h.done()}

        def fire(t, writer):
            """Write the counter's value (a host store, or a stream write on
            tstream), see it in host memory, and wait for the transfer."""
            v, h = t["value"], t.pop("handle")
            t["writer"] = writer
            t["write_unix_ns"], t["write_mono"] = time.time_ns(), time.monotonic()
            if writer == "host":
                counter.set(v)
            else:
                b2bstream.mark_layer_done(tstream, counter, v)
            limit = time.monotonic() + 10
            while counter.value < v:
                if time.monotonic() > limit:
                    try:
                        h.cancel()
                    except Exception as e:
                        log(f"cancel of transfer {h.id}: {e}")
                    raise RuntimeError(f"the counter's write of {v} ({writer}) was not visible in host memory after 10 s")
            t["visible_mono"] = time.monotonic()
            res = h.wait(timeout=60)
            ph = res.phases
            t["seen_unix_ns"] = ph.trigger_seen_unix_ns if ph else 0
            t["posted_unix_ns"] = ph.posted_unix_ns if ph else 0
            t["landed_unix_ns"] = ph.landed_unix_ns if ph else 0
            us = lambda k: (t[k] - t["write_unix_ns"]) / 1e3 if t[k] else None
            t["write_to_seen_us"], t["write_to_post_us"], t["write_to_landed_us"] = us("seen_unix_ns"), us("posted_unix_ns"), us("landed_unix_ns")
            t["carried_by"] = res.transport
            return res

        def trigger_line(t):
            f = lambda v: "-" if v is None else f"{v:.1f}"
            vis = t.get("visible_ms_into_spin")
            return (f" | after({t['writer']}): " + ("" if vis is None else f"write visible {vis:.2f} ms into the spin, ") +
                    f"write->seen {f(t.get('write_to_seen_us'))} us, ->post {f(t.get('write_to_post_us'))} us, "
                    f"armed before the write: {t.get('armed_before_write')}")

        for pname, sk, dk in paths:
            for tr in transports:
                for size, writer in variants:
                    n = args.blocks
                    so = (np.arange(n, dtype=np.uint64) * 2) * np.uint64(size)
                    do = (np.arange(n - 1, -1, -1, dtype=np.uint64) * 2 + 1) * np.uint64(size)

                    def batch():
                        return ca.batch_transfer(srcs[sk], d.peers[1], dsts[dk], so, do, block_size=size, timeout=120, transport=tr)
                    name = f"{pname} {tr} {size} B" + (f" after({writer})" if writer else "")
                    case = {"path": pname, "transport": tr, "block_bytes": size, "blocks": n}
                    if writer:
                        case["trigger"] = writer
                    try:
                        for _ in range(2):
                            res = batch()  # warm-up: connections, mappings
                        case["carried_by"] = res.transport
                        if writer:
                            fire(arm(sk, dk, so, do, size, tr), writer)  # warm-up of the trigger's path
                        if args.mode == "ncu":
                            before = sum(prof_count(l) for l in d.logs)
                            t0 = time.monotonic()
                            trig = []
                            for _ in range(3):
                                if writer:
                                    t = arm(sk, dk, so, do, size, tr)
                                    fire(t, writer)
                                    trig.append(t)
                                else:
                                    batch()
                            case["ms"] = (time.monotonic() - t0) / 3 * 1e3
                            case["ncu_kernels"] = sum(prof_count(l) for l in d.logs) - before
                            case["ok"] = case["ncu_kernels"] == 0
                            extra = ""
                            if writer:
                                # ms: from the write to the last byte landed (the start and its 20 ms wait excluded)
                                case["ms"] = sum(t["write_to_landed_us"] or 0 for t in trig) / len(trig) / 1e3
                                case["triggers"] = trig
                                case["why"] = [w for t in trig for w in trigger_order_problems(t)]
                                case["ok"] = case["ok"] and not case["why"]
                                extra = trigger_line(trig[-1]) + (f" | ORDER: {'; '.join(case['why'])}" if case["why"] else "")
                            log(f"{name:<34}: {case['ms']:8.2f} ms/batch, ncu kernels in the daemons: {case['ncu_kernels']}{extra}")
                        elif writer:
                            t = arm(sk, dk, so, do, size, tr)
                            r = spin(lambda: fire(t, writer))
                            t["visible_ms_into_spin"] = (t["visible_mono"] - r["t0"]) * 1e3
                            case.update(r)
                            case["trigger_detail"] = t
                            case["ok"], case["why"] = triggered_probe_verdict(r, t)
                            log(verdict_line(name, r) + trigger_line(t) + (f" | FAIL: {'; '.join(case['why'])}" if case["why"] else ""))
                        else:
                            r = spin(batch)
                            case.update(r)
                            case["ok"] = r["sm_free"]
                            log(verdict_line(name, r))
                    except Exception as e:  # a path that fails is reported, and fails the check
                        case["error"], case["ok"] = str(e), False
                        log(f"{name}: ERROR {e}")
                    fail |= not case["ok"]
                    report["cases"].append(case)
        completed = True
    finally:
        if probe:
            try:
                probe.stdin.write("quit\n")
                probe.stdin.flush()
                probe.wait(30)
            except Exception:
                probe.kill()
        if counter is not None:
            try:
                counter.close()
            except Exception as e:  # the daemons' stop below still runs
                log(f"counter close: {e}")
        ca.close()
        cb.close()
        stops = d.stop()
        report["daemon_stop"] = stops
        report["daemon_exit"] = [s["rc"] for s in stops]
        if args.mode == "ncu":
            logs = [parse_ncu_log(l) for l in d.logs]
            ok, why = ncu_verdict(report_control, logs, stops)
            report["ncu_control"], report["ncu_logs"], report["ncu_ok"], report["ncu_why"] = report_control, logs, ok, why
            report["ncu_total_kernels"] = sum(l["kernels"] or 0 for l in logs)
            report["ncu_no_kernels_said"] = all(l.get("no_kernels_said") for l in logs)
            log(f"ncu: {report['ncu_total_kernels']} kernels in the daemons in all; logs complete: "
                f"{[l['complete'] for l in logs]}; 'No kernels were profiled' in both: {report['ncu_no_kernels_said']}; "
                f"ncu exit codes {report['daemon_exit']} (recorded, not judged)")
            for w in why:
                log("ncu verdict:", w)
            fail |= not ok
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(os.path.join(SHM_ROOT, os.path.basename(tmp)), ignore_errors=True)
        # Written even when interrupted (SIGTERM from timeout) or failed early: pass needs every case run.
        fail |= not completed
        report["pass"] = not fail
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
        log(f"smprobe.py --mode {args.mode} --cases {args.cases}: {'PASS' if not fail else 'FAIL'}"
            + ("" if completed else " (did not run to the end)"))
    return 1 if fail else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "summarize":
        sys.exit(summarize_main(sys.argv[2:]))
    sys.exit(main())
