"""Disaggregated-serving harness for b2b.connector (docs/connector.md).

Per scenario: two b2bd daemons (prefill's and decode's), a prefill engine
process and a decode engine process (engine.py), and a router here that
sends requests with random prompt lengths, ``--concurrency`` in flight.
Every decoded request's KV is checked byte for byte. Faults are injected
by scenario; a request whose engine died is retried; one that gets no
answer in ``--request-timeout`` counts as hung.

    make disagg ARGS="--json out.json"            # every scenario, 512 requests each
    make test-disagg                              # the short form (fewer requests, exits 1 on a failure)
    deploy/gpu/disagg-model.sh OUT                # --model llama: a real model's KV on GPUs (disagg_model.py)
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Client as MPClient
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "client", "python"))
sys.path.insert(0, os.path.join(REPO, "client", "python", "tests"))

from daemon_harness import Daemon  # noqa: E402
from engine import AUTH  # noqa: E402

# Every engine and daemon this harness started: killed when it exits, by an
# error, a signal (timeout's TERM, Ctrl-C) or normally, so none outlives it.
_CHILDREN: List[subprocess.Popen] = []


def _reap_children() -> None:
    for p in _CHILDREN:
        if p.poll() is None:
            p.kill()


atexit.register(_reap_children)


class EngineGone(Exception):
    pass


class EngineCrashed(Exception):
    """An engine died with no scenario killing it: the row fails at once
    instead of waiting out every request's timeout."""


def router_thread(nice: int) -> None:
    """Lower the calling router thread to ``nice`` (Linux: a thread's own
    nice). The router stands in for a proxy, which runs elsewhere: its
    thread per request in flight (64) must not take the cores from the
    engines and daemons it measures. It is not on the handover's path
    (prefill's last layer to decode's report) but with dispatch after,
    where it stays at 0."""
    if nice:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        except OSError:
            pass


class Link:
    """The router's connection to one engine: many requests in flight,
    answers matched by request id; a dead engine fails every pending one."""

    def __init__(self, path: str, crashed: Any = lambda: None, nice: int = 0) -> None:
        self.path = path
        self.nice = nice  # of its reader thread (router_thread)
        self.crashed = crashed  # why the engine died unplanned, or None
        self.conn: Any = None
        self.pending: Dict[str, Future] = {}
        self.lock = threading.Lock()
        self.gen = 0

    def _connect(self, wait: float = 60.0) -> None:
        deadline = time.monotonic() + wait
        while True:
            try:
                self.conn = MPClient(self.path, family="AF_UNIX", authkey=AUTH)
                break
            except (OSError, EOFError):
                why = self.crashed()
                if why is not None:
                    raise EngineCrashed(why)
                if time.monotonic() > deadline:
                    raise EngineGone(f"engine at {self.path} does not answer")
                time.sleep(0.1)
        self.gen += 1
        threading.Thread(target=self._read, args=(self.conn, self.gen), daemon=True).start()

    def _read(self, conn: Any, gen: int) -> None:
        router_thread(self.nice)
        try:
            while True:
                m = conn.recv()
                key = "__stats" if m[0] == "stats" else (m[1] if len(m) > 1 else "")
                with self.lock:
                    f = self.pending.pop(key, None)
                if f is not None:
                    f.set_result(m)
        except (EOFError, OSError):
            pass
        with self.lock:
            if self.gen == gen:
                self.conn = None
            dead, self.pending = self.pending, {}
        for f in dead.values():
            f.set_exception(EngineGone("engine connection lost"))

    def submit(self, key: str, msg: tuple) -> Future:
        f: Future = Future()
        with self.lock:
            if self.conn is None:
                self._connect()
            self.pending[key] = f
            try:
                self.conn.send(msg)
            except (OSError, ValueError) as e:
                self.pending.pop(key, None)
                self.conn = None
                raise EngineGone(str(e))
        return f

    def send(self, msg: tuple) -> None:
        with self.lock:
            if self.conn is not None:
                try:
                    self.conn.send(msg)
                except (OSError, ValueError):
                    pass


class Proc:
    script = "engine.py"  # model_engine.py in --model llama

    def __init__(self, role: str, daemon: Daemon, args: List[str], workdir: str) -> None:
        self.role, self.daemon, self.args = role, daemon, args
        self.listen = os.path.join(workdir, f"{role}.engine.sock")
        self.log = os.path.join(workdir, f"{role}.engine.log")
        self.p: Optional[subprocess.Popen] = None
        self.killed = False
        self.gen = 0
        self.engine_id = ""

    def start(self, extra: List[str] = ()) -> None:
        # A new engine id per incarnation (vLLM's default is a fresh uuid):
        # a restarted engine's layouts have new names, so a peer still
        # holding the old ids fails cleanly instead of reading new blocks.
        self.gen += 1
        self.engine_id = f"{self.role}-{self.gen}"
        cmd = [sys.executable, os.path.join(HERE, self.script), "--role", self.role, "--socket", self.daemon.socket,
               "--listen", self.listen, "--engine-id", self.engine_id] + self.args + list(extra)
        log = open(self.log, "ab")
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
        _CHILDREN.append(self.p)
        log.close()
        line = self.p.stdout.readline()
        if b"ready" not in line:
            self.p.wait()
            raise RuntimeError(f"{self.role} engine did not start: {open(self.log).read()[-3000:]}")
        self.killed = False  # only now: until the new one runs, the killed one is self.p

    def kill(self) -> None:
        self.killed = True  # a planned death: the router waits for the restart
        if self.p is not None and self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
            self.p.wait()

    def alive(self) -> bool:
        return self.p is not None and self.p.poll() is None

    def crashed(self) -> Optional[str]:
        """Why the engine exited when no scenario killed it (a bug: its
        log's tail), else None."""
        p = self.p  # one process throughout: a restart may replace self.p
        if p is None or self.killed:
            return None
        rc = p.poll()
        if rc is None or self.killed or p is not self.p:
            return None
        try:
            tail = open(self.log).read()[-1500:]
        except OSError:
            tail = ""
        return f"{self.role} engine exited with code {rc} unplanned: {tail}"


def wait_unexported(d: Daemon, engine_id: str, timeout: float = 20.0) -> None:
    """Until the daemon has dropped a dead engine's exports (its client's
    lease ended), so that no pull of the held requests can still succeed."""
    import b2b

    deadline = time.monotonic() + timeout
    with b2b.Client(d.socket) as c:
        while time.monotonic() < deadline:
            if not any(r.export_name.startswith(engine_id + ".") for r in c.list_regions()):
                return
            time.sleep(0.01)
    raise RuntimeError(f"{d.name} still exports {engine_id}'s regions {timeout} s after it died")


def pct(xs: List[float], q: float) -> Optional[float]:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3)


# A request's handover, step by step (wall-clock marks of the engines, the
# connector and the router; docs/connector.md#handover). Prefill's marks
# are prefixed "p.", decode's "d.".
CHAINS = {
    "pull": ["p.last_layer", "p.replied", "routed", "d.inbox", "d.load_begun", "d.started", "d.posted", "d.landed",
             "d.ended", "d.reported", "d.ready"],
    "push": ["p.last_layer", "p.pushed", "p.posted", "p.landed", "d.landed_arrived", "d.landed_seen", "d.reported",
             "d.ready"],
    # pull with decode sent the request at once: decode's read, armed in its
    # daemon on prefill's "where", starts as prefill's "ready" note lands
    # (d.fired); a read not armed in time starts from the note
    # (d.ready_arrived, d.started)
    "pull-together": ["p.last_layer", "p.ready_sent", "d.fired", "d.ready_arrived", "d.started", "d.posted",
                      "d.landed", "d.ended", "d.reported", "d.ready"],
}


def request_wire(mode: str, rids: List[str], ptr: Dict[str, dict], dtr: Dict[str, dict]) -> Tuple[List[float], List[float]]:
    """The measured requests' own wire and transfer times (ms): of the
    transfer each request's handover waited for (decode's read for a pull,
    prefill's last write for a push), its wire phase and its first post to
    last landing. A transfer carries a step's requests, so the transfers'
    own times would weigh a large step's requests as one: the handover's
    p50 is over requests, and so is this."""
    tr = dtr if mode == "pull" else ptr
    wire, transfer = [], []
    for rid in rids:
        t = tr.get(rid, {})
        if "wire_ns" in t:
            wire.append(t["wire_ns"] / 1e6)
        if t.get("posted") and t.get("landed", 0) >= t["posted"]:
            transfer.append((t["landed"] - t["posted"]) / 1e6)
    return wire, transfer


def phases(chain_name: str, rids: List[str], routed: Dict[str, int], ptr: Dict[str, dict], dtr: Dict[str, dict]) -> dict:
    """Median ms of each step of CHAINS[mode] over the measured requests
    (a step missing from a request's marks is skipped for it)."""
    chain = CHAINS[chain_name]
    mode = chain_name.split("-")[0]
    gaps: Dict[str, List[float]] = {f"{a}->{b}": [] for a, b in zip(chain, chain[1:])}
    late_ids = 0
    marks: List[dict] = []
    for rid in rids:
        m = {f"p.{k}": v for k, v in ptr.get(rid, {}).items()}
        m.update({f"d.{k}": v for k, v in dtr.get(rid, {}).items()})
        if rid in routed:
            m["routed"] = routed[rid]
        if mode == "push" and m.get("p.ids_seen", 0) > m.get("p.last_layer", 1 << 62):
            late_ids += 1
        marks.append(m)
        have = [k for k in chain if k in m]
        for a, b in zip(have, have[1:]):  # a step a request skipped (an armed read's "started") joins its neighbours
            gaps.setdefault(f"{a}->{b}", []).append((m[b] - m[a]) / 1e6)
    out = {k: pct(v, 0.5) for k, v in gaps.items() if v}
    if mode == "push":
        out["ids_after_last_layer"] = late_ids  # requests whose ids note reached prefill after its compute
        # Off the path since writes carry their own notes: prefill seeing
        # its writes end and its "done" note (the fallback) reaching decode.
        for a, b in (("p.last_layer", "p.ended"), ("p.ended", "p.done_sent"), ("p.last_layer", "d.done_seen")):
            v = [(x[b] - x[a]) / 1e6 for x in marks if a in x and b in x]
            if v:
                out[f"{a}->{b}"] = pct(v, 0.5)
    return out


def run_scenario(name: str, mode: str, transport: str, dispatch: str, a: argparse.Namespace) -> dict:
    """One row. ``dispatch`` (pull): "after", the router sends a request to
    decode once prefill answered, with prefill's block ids (vLLM's NIXL
    proxy); "together", to both at once, and decode reads when prefill's
    "ready" note comes (push always sends to both at once)."""
    together = mode == "push" or dispatch == "together"
    work = tempfile.mkdtemp(prefix=f"disagg-{name}-")
    # The submit socket beside the API socket: the clients' shared-memory
    # ring (docs/ring.md), which the connector's starts, notes and polls take.
    dargs = ["--transport", transport, "--submit-socket", "{dir}/submit.sock"]
    dp, dd = Daemon("prefill", root=work, extra_args=dargs).start(), Daemon("decode", root=work, extra_args=dargs).start()
    _CHILDREN.extend(d.proc for d in (dp, dd) if d.proc is not None)
    tp_d, kvl, bs_d = 1, "NHD", a.block_size
    if name == "tp_mismatch":
        tp_d, kvl = 2, "HND"
    if name == "block_mismatch":
        bs_d = a.block_size * 2
    common = ["--mode", mode, "--transport", transport, "--layers", str(a.layers), "--heads", str(a.heads),
              "--dim", str(a.dim), "--kv-layout", kvl, "--release-timeout", str(a.release_timeout),
              "--load-timeout", str(a.load_timeout), "--compute-nice", str(a.compute_nice),
              "--device-token-ns", str(a.device_token_ns), "--device-process", str(a.device_process)]
    pool_d = a.num_blocks // 3 if name == "decode_restart" else a.num_blocks
    pre = Proc("prefill", dp, common + ["--tp", "1", "--block-size", str(a.block_size),
                                        "--num-blocks", str(a.num_blocks)], work)
    dec = Proc("decode", dd, common + ["--tp", str(tp_d), "--block-size", str(bs_d)], work)
    pre.start()
    dec.start(["--num-blocks", str(pool_d * a.block_size // bs_d)])
    # Dispatch after: the router relays prefill's answer to decode, on the
    # handover's path, and competes as an engine does.
    nice = a.router_nice if together else 0
    lp, ld = Link(pre.listen, pre.crashed, nice), Link(dec.listen, dec.crashed, nice)
    rng = random.Random(a.seed)
    plens = [rng.randint(a.min_prompt, a.max_prompt) for _ in range(a.requests)]
    aborts = set(rng.sample(range(a.requests), a.requests // 10)) if name == "router_aborts" else set()
    lock = threading.Lock()
    res: Dict[str, Any] = {"verified": 0, "corrupt": 0, "failed_reported": 0, "retried": 0, "hung": 0, "aborted": 0,
                           "handover_ms": [], "errors": []}
    done_count = [0]
    routed: Dict[str, int] = {}  # pull: when the router sent prefill's answer on to decode
    clean: List[str] = []  # requests whose handover is measured
    fault_at = a.requests // 4 if name in ("decode_restart", "prefill_killed") else -1
    fault_state = {"done": False}
    # prefill_killed: prefill dies while decode's pulls of its blocks are
    # due. The router holds the decode requests of prefilled requests at
    # the fault, kills prefill, then lets them go: every one of those
    # pulls must fail, be reported as load errors and be recomputed.
    gate = threading.Event()
    gate.set()
    held = [0]

    def one(i: int) -> None:
        router_thread(nice)
        plen, seed = plens[i], i + 1
        for attempt in range(a.retries + 1):
            rid = f"{i}.{attempt}"
            try:
                pparams = {"do_remote_decode": True}
                if not together:
                    p = lp.submit(rid, ("req", rid, plen, seed, pparams)).result(a.request_timeout)
                    dparams = p[2]["params"]
                    if not gate.is_set():
                        with lock:
                            held[0] += 1
                        gate.wait()
                    with lock:
                        routed[rid] = time.time_ns()
                    fd = ld.submit(rid, ("req", rid, plen, seed, dparams))
                else:
                    dparams = {"do_remote_prefill": True, "remote_engine_id": pre.engine_id, "remote_peer": dp.peer_address,
                               "remote_request_id": rid}
                    fd = ld.submit(rid, ("req", rid, plen, seed, dparams))
                    p = lp.submit(rid, ("req", rid, plen, seed, pparams)).result(a.request_timeout)
                if i in aborts:
                    time.sleep(rng.random() * 0.01)
                    ld.send(("abort", rid))
                d = fd.result(a.request_timeout)
            except EngineCrashed as e:
                with lock:
                    res["errors"].append(f"{rid}: {e}")
                return
            except EngineGone:
                if pre.crashed() or dec.crashed():
                    with lock:
                        res["errors"].append(f"{rid}: {pre.crashed() or dec.crashed()}")
                    return
                with lock:
                    res["retried"] += 1
                time.sleep(0.2)
                continue
            except TimeoutError:
                with lock:
                    res["hung"] += 1
                    res["errors"].append(f"{rid}: no answer in {a.request_timeout} s")
                return
            with lock:
                done_count[0] += 1
                if d[0] == "aborted":
                    res["aborted"] += 1
                    return
                r = d[2]
                if r["bad_tokens"] == 0:
                    res["verified"] += 1
                else:
                    res["corrupt"] += 1
                    res["errors"].append(f"{rid}: {r['bad_tokens']} wrong tokens")
                if r["load_failed"]:
                    res["failed_reported"] += 1
                if not r["load_failed"] and p[2].get("t_last_ns"):
                    res["handover_ms"].append((r["t_ready_ns"] - p[2]["t_last_ns"]) / 1e6)
                    clean.append(rid)
            return
        with lock:
            res["errors"].append(f"{i}: gave up after {a.retries + 1} attempts")

    def faults() -> None:
        while not fault_state["done"]:
            with lock:
                n = done_count[0]
            if fault_at >= 0 and n >= fault_at:
                if name == "decode_restart":
                    deadline = time.monotonic() + 5  # kill it with requests in it
                    while not ld.pending and time.monotonic() < deadline:
                        time.sleep(0.002)
                    dec.kill()
                    dec.start(["--num-blocks", str(a.num_blocks * 2 * a.block_size // bs_d)])
                elif together:  # decode waits for notes that a dead prefill never sends
                    deadline = time.monotonic() + 5
                    while not lp.pending and time.monotonic() < deadline:
                        time.sleep(0.002)
                    pre.kill()
                    pre.start()
                else:
                    gate.clear()
                    deadline = time.monotonic() + 5
                    while held[0] < max(1, a.concurrency // 4) and time.monotonic() < deadline:
                        time.sleep(0.005)
                    gone = pre.engine_id
                    pre.kill()
                    wait_unexported(dp, gone)
                    gate.set()
                    pre.start()
                return
            time.sleep(0.01)

    ft = threading.Thread(target=faults, daemon=True)
    ft.start()
    t0 = time.monotonic()
    with ThreadPoolExecutor(a.concurrency) as ex:
        list(ex.map(one, range(a.requests)))
    wall = time.monotonic() - t0
    fault_state["done"] = True
    crash = pre.crashed() or dec.crashed()
    if crash is not None:  # a bug, not a scenario: fail the row now
        for x in (pre, dec):
            x.kill()
        dp.stop()
        dd.stop()
        return {"scenario": name, "mode": mode, "transport": transport, "dispatch": dispatch, "ok": False,
                "errors": [crash] + res["errors"][:9], "workdir": work}
    # Every block back in both pools (held prefill blocks come back by
    # their pulls, release notes or the release timeout).
    stats = {}
    deadline = time.monotonic() + a.release_timeout + 5
    while True:
        stats = {k: l.submit("__stats", ("stats",)).result(30)[1] for k, l in (("prefill", lp), ("decode", ld))}
        leaked = sum(s["num_blocks"] - s["free"] for s in stats.values())
        if leaked == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for l in (lp, ld):
        l.send(("quit",))
    time.sleep(0.2)
    for pr in (pre, dec):
        pr.kill()
    dp.stop()
    dd.stop()
    wire, transfer = request_wire(mode, clean, stats["prefill"]["trace"], stats["decode"]["trace"])
    if a.trace:  # every measured request's handover and marks, for a look at the tail
        with open(f"{a.trace}.{name}.{mode}.{transport}.{'together' if together else 'after'}.json", "w") as f:
            json.dump({"requests": clean, "handover_ms": res["handover_ms"],
                       "prefill": {r: stats["prefill"]["trace"].get(r) for r in clean},
                       "decode": {r: stats["decode"]["trace"].get(r) for r in clean}}, f)
    if not wire:  # no request carried its transfer's times: the transfers' own
        wire = [w / 1e6 for s in stats.values() for w in s["wire_ns"]]
        transfer = [w / 1e6 for s in stats.values() for w in s.get("transfer_ns", ())]
    ctl_ns = sum(sum(s["timers_ns"].values()) for s in stats.values())
    completed = res["verified"] + res["corrupt"] + res["aborted"]
    row = {
        "scenario": name, "mode": mode, "transport": transport, "dispatch": "together" if together else "after",
        "requests": a.requests,
        "verified": res["verified"], "corrupt": res["corrupt"], "failed_reported": res["failed_reported"],
        "retried": res["retried"], "aborted": res["aborted"], "hung": res["hung"], "leaked_blocks": leaked,
        "handover_p50_ms": pct(res["handover_ms"], 0.5), "handover_p99_ms": pct(res["handover_ms"], 0.99),
        "wire_p50_ms": pct(wire, 0.5), "transfer_p50_ms": pct(transfer, 0.5),
        "phases_p50_ms": phases(mode if mode == "push" or not together else "pull-together", clean, routed, stats["prefill"]["trace"], stats["decode"]["trace"]),
        "control_us_per_request": round(ctl_ns / 1e3 / max(1, completed), 1),
        "wall_s": round(wall, 2), "tp": f"1->{tp_d}", "block_size": f"{a.block_size}->{bs_d}",
        "connector": {k: s["connector"] for k, s in stats.items()},
        "timers_ms": {k: {n: round(v / 1e6, 1) for n, v in s["timers_ns"].items()} for k, s in stats.items()},
        "compute_ms": {k: {n: round(v / 1e6, 1) for n, v in s["compute_ns"].items()} for k, s in stats.items()},
        "steps": {k: s["stats"].get("steps") for k, s in stats.items()},
        "errors": res["errors"][:10],
    }
    ok = (row["hung"] == 0 and row["corrupt"] == 0 and leaked == 0 and not res["errors"]
          and row["verified"] + row["aborted"] == a.requests)
    if name in ("steady", "tp_mismatch", "block_mismatch"):
        # No fault: every load must have moved the bytes (a recompute would
        # pass the check too, and hide a broken transfer path).
        ok = ok and row["failed_reported"] == 0 and row["retried"] == 0
    if name == "prefill_killed" and not together:
        ok = ok and row["failed_reported"] > 0  # the held pulls must have failed and been reported
    if name == "prefill_killed" and together:
        ok = ok and row["failed_reported"] + row["retried"] > 0
    if name == "decode_restart":
        ok = ok and row["retried"] > 0  # the requests in it were lost and sent again
    row["ok"] = ok
    if ok:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    else:
        row["workdir"] = work
    return row


# (scenario, mode, transport, dispatch): pull rows send each request to
# decode together with prefill unless "after" (vLLM's NIXL proxy order).
SCENARIOS = [
    ("steady", "pull", "tcp", "together"), ("steady", "pull", "local", "together"),
    ("steady", "push", "tcp", "together"), ("steady", "push", "local", "together"),
    ("steady", "pull", "tcp", "after"), ("steady", "pull", "local", "after"),
    ("decode_restart", "pull", "tcp", "together"), ("prefill_killed", "pull", "tcp", "together"),
    ("prefill_killed", "pull", "tcp", "after"), ("prefill_killed", "push", "tcp", "together"),
    ("router_aborts", "pull", "tcp", "together"), ("tp_mismatch", "pull", "tcp", "together"),
    ("tp_mismatch", "push", "tcp", "together"), ("block_mismatch", "pull", "tcp", "together"),
    ("block_mismatch", "pull", "tcp", "after"), ("decode_restart", "push", "tcp", "together"),
]


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # atexit then reaps the children
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--short", action="store_true", help="make test-disagg: 48 requests, 16 in flight")
    ap.add_argument("--scenario", action="append",
                    help="name[:mode[:transport[:dispatch]]] (repeatable); default all")
    ap.add_argument("--min-prompt", type=int, default=16)
    ap.add_argument("--max-prompt", type=int, default=512)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--num-blocks", type=int, default=3072)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--release-timeout", type=float, default=8.0)
    ap.add_argument("--load-timeout", type=float, default=8.0)
    ap.add_argument("--request-timeout", type=float, default=60.0)
    ap.add_argument("--retries", type=int, default=3)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--device-token-ns", type=int, default=350,
                    help="modeled GPU time of one prompt token's layer in prefill (ns); the stand-in's CPU work "
                         "counts toward it, and its thread sleeps out the rest, taking no CPU (0: the CPU work alone)")
    ap.add_argument("--router-nice", type=int, default=19,
                    help="nice of the router's threads, a stand-in for a proxy that runs elsewhere (0: they compete "
                         "with the engines and daemons for the cores); rows with dispatch after, where the router "
                         "relays prefill's answer on the handover's path, keep 0")
    ap.add_argument("--trace", metavar="PREFIX",
                    help="per row, write PREFIX.SCENARIO.MODE.TRANSPORT.DISPATCH.json: each measured request's "
                         "handover and the engines' marks (wall-clock ns)")
    ap.add_argument("--device-process", type=int, default=1,
                    help="1: each engine's model work runs in a process of its own (device.py), as a GPU's "
                         "takes no interpreter lock from the engine; 0: on the engine's threads")
    ap.add_argument("--compute-nice", type=int, default=19,
                    help="nice of the engines' device processes (or threads) that stand in for GPU work (prefill's layers, decode's check); "
                         "0 makes them compete with the control path for the CPU")
    import disagg_model

    disagg_model.add_args(ap)
    a = ap.parse_args()
    if a.model == "llama":  # a real model on GPUs: its own router (disagg_model.py)
        return disagg_model.main(a)
    if a.short:
        a.requests, a.concurrency = min(a.requests, 48), min(a.concurrency, 16)
    todo = SCENARIOS
    if a.scenario:
        todo = []
        for s in a.scenario:
            parts = s.split(":")
            todo += [x for x in SCENARIOS if x[0] == parts[0] and (len(parts) < 2 or x[1] == parts[1])
                     and (len(parts) < 3 or x[2] == parts[2]) and (len(parts) < 4 or x[3] == parts[3])]
    rows = []
    for sc in todo:
        row = run_scenario(*sc, a)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("connector", "timers_ms", "compute_ms")}), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "args": vars(a)}, f, indent=1)
    bad = [r for r in rows if not r["ok"]]
    for r in bad:
        print(f"FAIL {r['scenario']} {r['mode']} {r['transport']}: {r['errors']} (logs in {r.get('workdir')})",
              file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
