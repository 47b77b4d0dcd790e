"""One engine process of the disaggregated-serving harness: a scheduler and
``--tp`` worker ranks (in this process, each with its own b2bd client and
pool), driving b2b.connector in the order vLLM does:

scheduler: get_num_new_matched_tokens, update_state_after_alloc,
build_connector_meta; each rank: bind_connector_metadata, start_load_kv,
per layer wait_for_layer_load / compute / save_kv_layer, wait_for_save,
get_finished, get_block_ids_with_load_errors, clear_connector_metadata;
scheduler: request_finished.

"Compute" writes each layer's K/V as a function of (request, layer, token,
head) (b2b.connector.testing.Pool); decode checks every byte of every block
of the prompt before it "runs" a request. It serves the router over a
multiprocessing connection (the stand-in for an engine's HTTP API)."""

from __future__ import annotations

import argparse
import collections
import math
import os
import queue
import sys
import threading
import time
from multiprocessing.connection import Listener
from typing import Any, Dict, List, Optional, Set

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))

import b2b  # noqa: E402
from b2b.connector import B2BConnector, Role  # noqa: E402
from b2b.connector.testing import Pool, Request, config  # noqa: E402

AUTH = b"b2b-disagg"


class Req:
    def __init__(self, rid: str, plen: int, seed: int, params: Optional[dict]) -> None:
        self.r = Request(rid, list(range(plen)), dict(params) if params else None, seed=seed)
        self.rid, self.plen, self.seed = rid, plen, seed
        self.ids: List[int] = []
        self.aborted = False
        self.recv_ranks = 0
        self.send_ranks = 0
        self.t_ready = 0


class Engine:
    pool_cls: Any = Pool  # model_engine.py's engines keep their KV in a CUDA pool
    compute_thread = True  # prefill's layers on a thread of their own (a real model's run on its GPU)

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.decode = a.role == "decode"
        extra = dict(kv_layout=a.kv_layout, release_timeout_s=a.release_timeout, load_timeout_s=a.load_timeout,
                     transport=a.transport)
        if a.kv_layout == "HND" and not self.decode:
            extra["head_splits"] = [2]
        mk = lambda rank: config(a.engine_id, socket=a.socket, mode=a.mode, block_size=a.block_size,
                                 tp_size=a.tp, tp_rank=rank, **extra)
        self.timers = collections.Counter()
        self.sched = B2BConnector(mk(0), Role.SCHEDULER)
        self.clients = [b2b.Client(a.socket) for _ in range(a.tp)]
        hp = a.heads // a.tp
        self.pools = [self.pool_cls(c, layers=a.layers, num_blocks=a.num_blocks, block_size=a.block_size, heads=hp,
                           dim=a.dim, kv_layout=a.kv_layout, head0=r * hp) for r, c in enumerate(self.clients)]
        self.workers = [B2BConnector(mk(r), Role.WORKER, client=c) for r, c in enumerate(self.clients)]
        for w, p in zip(self.workers, self.pools):
            w.register_kv_caches(p.caches)
        self.wake = threading.Event()  # the router sent something, or a peer's note arrived
        for w in self.workers:
            w.set_wakeup(self.wake.set)
        self.free = list(range(a.num_blocks))
        self.waiting: "collections.deque[Req]" = collections.deque()
        self.loading: Dict[str, Req] = {}
        self.ready: List[tuple] = []  # (request, its load failed): loaded, to run in the next step
        # Decode's forward passes run on a "device" thread, as a GPU runs
        # them while the engine's loop goes on (and releases the GIL in
        # numpy); finished ones come back as (request, load failed, bad tokens).
        self.device: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self.device_done: "collections.deque[tuple]" = collections.deque()
        # Prefill's layer compute, on its own thread (compute()).
        self.compute_q: "Optional[queue.Queue[Any]]" = queue.Queue() if not self.decode and self.compute_thread else None
        self.device_busy = 0
        # The model's work in a process of its own, as a GPU's (device.py).
        self.gpu: Any = None
        if a.device_process and self.pool_cls is Pool:
            from device import Device

            self.gpu = Device(self.pools, a.compute_nice)
        self.held: Dict[str, Req] = {}
        self.lock = threading.Lock()
        self.inbox: "collections.deque[tuple]" = collections.deque()
        self.conn: Any = None
        self.send_lock = threading.Lock()
        self.stop = False
        self.stats = collections.Counter()
        self.compute_ns = collections.Counter()  # the stand-in for the model's work (not control)
        self.steps = 0
        # Per request, wall-clock ns of its handover steps (engine's and
        # the connector's), reported to the router in "stats".
        self.trace: "collections.OrderedDict[str, Dict[str, int]]" = collections.OrderedDict()
        self.tlock = threading.Lock()  # the router's thread marks arrivals

    def mark(self, rid: str, what: str, t: Optional[int] = None) -> None:
        t = time.time_ns() if t is None else t
        with self.tlock:
            d = self.trace.get(rid)
            if d is None:
                d = self.trace[rid] = {}
                if len(self.trace) > 8192:
                    self.trace.popitem(last=False)
            d[what] = t

    def take_traces(self, rid: str) -> None:
        for w in self.workers:  # the latest rank's time: the request waits for all of them
            for k, v in w.worker.take_trace(rid).items():
                with self.tlock:
                    d = self.trace.setdefault(rid, {})
                    d[k] = max(v, d.get(k, 0))

    # -- the router's side --------------------------------------------------

    def reply(self, *msg: Any) -> None:
        with self.send_lock:
            try:
                self.conn.send(msg)
            except (OSError, EOFError, ValueError):
                pass

    def serve(self, listener: Listener) -> None:
        while not self.stop:
            try:
                self.conn = listener.accept()
            except (OSError, EOFError):
                return
            try:
                while True:
                    m = self.conn.recv()
                    if m[0] == "quit":
                        self.stop = True
                        self.reply("bye")
                        return
                    if m[0] == "req":
                        self.mark(m[1], "inbox")
                    self.inbox.append(m)
                    self.wake.set()
            except (EOFError, OSError):
                continue  # the router reconnects

    def report(self) -> dict:
        wire: List[int] = []
        transfer: List[int] = []
        for w in self.workers:
            wire += w.worker.stats["wire_ns"]
            transfer += w.worker.stats["transfer_ns"]
        st: collections.Counter = collections.Counter()
        for w in self.workers:
            st.update({k: v for k, v in w.worker.stats.items() if k not in ("wire_ns", "transfer_ns")})
        for w in self.workers:
            for rid in list(w.worker.trace):
                self.take_traces(rid)
        with self.tlock:
            trace = dict(self.trace)
        return {"free": len(self.free), "num_blocks": self.a.num_blocks, "wire_ns": wire, "transfer_ns": transfer, "timers_ns": dict(self.timers),
                "stats": dict(self.stats, steps=self.steps), "compute_ns": dict(self.compute_ns), "connector": dict(st), "trace": trace}

    # -- timing of connector calls ---------------------------------------------

    def call(self, name: str, fn: Any, *args: Any) -> Any:
        t = time.perf_counter_ns()
        try:
            return fn(*args)
        finally:
            self.timers[name] += time.perf_counter_ns() - t

    # -- the loop -------------------------------------------------------------

    def take_inbox(self) -> None:
        while self.inbox:
            m = self.inbox.popleft()
            if m[0] == "req":
                _, rid, plen, seed, params = m
                self.waiting.append(Req(rid, plen, seed, params))
            elif m[0] == "abort":
                self.abort(m[1])
            elif m[0] == "stats":  # here, not in the router's thread: the loop owns the connector's state
                self.reply("stats", self.report())

    def abort(self, rid: str) -> None:
        for q in list(self.waiting):
            if q.rid == rid:
                self.waiting.remove(q)
                q.r.status = "FINISHED_ABORTED"
                self.call("request_finished", self.sched.request_finished, q.r, [])
                self.reply("aborted", rid, {})
                return
        q = self.loading.get(rid)
        if q is not None:
            q.aborted = True  # its blocks are freed once the load ended

    def alloc(self, n: int) -> Optional[List[int]]:
        if len(self.free) < n:
            return None
        ids, self.free = self.free[:n], self.free[n:]
        return ids

    def release(self, q: Req) -> None:
        if self.decode:
            for p in self.pools:
                p.scribble(q.ids)  # stale bytes cannot pass a later check
        self.free.extend(q.ids)
        q.ids = []

    def step(self) -> bool:
        self.steps += 1
        self.take_inbox()
        a = self.a
        scheduled: List[Req] = []
        while self.waiting and len(scheduled) < a.max_batch:
            q = self.waiting[0]
            ids = self.alloc(math.ceil(q.plen / a.block_size))
            if ids is None:
                break
            self.waiting.popleft()
            q.ids = ids
            if self.decode:
                n, _ = self.call("get_num_new_matched_tokens", self.sched.get_num_new_matched_tokens, q.r, 0)
                self.call("update_state_after_alloc", self.sched.update_state_after_alloc, q.r, ids, n or 0)
                self.loading[q.rid] = q
            else:
                self.call("update_state_after_alloc", self.sched.update_state_after_alloc, q.r, ids, 0)
                scheduled.append(q)
        meta = self.call("build_connector_meta", self.sched.build_connector_meta, None)
        t_last = 0
        sending: collections.Counter = collections.Counter()
        recving: collections.Counter = collections.Counter()
        errors: Set[int] = set()
        for r, (w, p) in enumerate(zip(self.workers, self.pools)):
            self.call("bind_connector_metadata", w.bind_connector_metadata, meta)
            self.call("start_load_kv", w.start_load_kv, None)
            if scheduled:
                for li, name in enumerate(p.names):
                    self.call("wait_for_layer_load", w.wait_for_layer_load, name)
                    t0 = time.perf_counter_ns()
                    self.compute(lambda li=li, r=r: self.on_device(r, "fill_layers", li, [(q.ids, q.seed, q.plen) for q in scheduled]),
                                 a.device_token_ns * sum(q.plen for q in scheduled))
                    self.compute_ns["prefill"] += time.perf_counter_ns() - t0
                    if li == len(p.names) - 1:
                        # The handover starts once the last layer is
                        # computed: its save_kv_layer (push: its writes'
                        # starts) is part of it.
                        t_last = max(t_last, time.time_ns())
                    self.call("save_kv_layer", w.save_kv_layer, name, p.caches[name], None)
        for w in self.workers:
            self.call("wait_for_save", w.wait_for_save)
            s, rv = self.call("get_finished", w.get_finished, set())
            sending.update(s or ())
            recving.update(rv or ())
            errors |= self.call("get_block_ids_with_load_errors", w.get_block_ids_with_load_errors)
            self.call("clear_connector_metadata", w.clear_connector_metadata)
        # The handover ends here: the connector has told the engine which
        # loads ended (and which failed). What the engine does next in this
        # step (finishing other requests, answering the router) is its own.
        t_ready = time.time_ns()
        # Decode's forward pass: the requests whose KV landed by the last
        # step run (are checked) on the device thread. get_finished came
        # before it, as in vLLM, whose model runner calls get_finished once
        # the forward pass is launched, before the GPU finished it.
        ready, self.ready = self.ready, []
        for q, failed in ready:
            self.launch(q, failed)
        while self.device_done:
            self.finish(*self.device_done.popleft())
        for q in scheduled:  # prefill: one token, then finished
            self.mark(q.rid, "last_layer", t_last)
            delay, params = self.call("request_finished", self.sched.request_finished, q.r, q.ids)
            if delay:
                self.held[q.rid] = q
            else:
                self.release(q)
            self.mark(q.rid, "replied")
            self.reply("ok", q.rid, {"params": params, "t_last_ns": t_last})
        for rid, n in sending.items():
            q = self.held.get(rid)
            if q is not None:
                q.send_ranks += n
                if q.send_ranks >= a.tp:
                    del self.held[rid]
                    self.release(q)
        for rid, n in recving.items():
            q = self.loading.get(rid)
            if q is None:
                continue
            q.recv_ranks += n
            if q.recv_ranks < a.tp:
                continue
            del self.loading[rid]
            self.mark(rid, "ready", t_ready)
            self.take_traces(rid)
            q.t_ready = t_ready
            self.ready.append((q, any(b in errors for b in q.ids)))
        return bool(scheduled or recving or sending or self.inbox or self.ready or self.device_done)

    def launch(self, q: Req, failed: bool) -> None:
        if q.aborted:
            self.release(q)
            self.call("request_finished", self.sched.request_finished, q.r, [])
            self.reply("aborted", q.rid, {})
            return
        self.device_busy += 1
        self.device.put((q, failed))

    def on_device(self, rank: int, op: str, *args: Any) -> Any:
        """Run pool ``rank``'s ``op`` (fill_layers, fill, check) where the
        model's work runs: the device process (device.py), or this thread
        (--device-process 0, and engines whose pools are not host memory).
        One thread calls it: prefill's compute thread, decode's device
        thread."""
        if self.gpu is not None:
            return self.gpu.call(op, rank, *args)
        p = self.pools[rank]
        if op == "fill_layers":
            layer, reqs = args
            for ids, seed, n in reqs:
                p.fill_layer(layer, ids, seed, n)
            return None
        return getattr(p, op)(*args)

    def compute(self, fn: Any, device_ns: int = 0) -> Any:
        """Run a layer's compute (the model's work: on a GPU host, kernels)
        on the prefill's compute thread, and wait for it, as a step waits
        for its kernels. ``device_ns``: the time a GPU would take; the
        thread sleeps out what the CPU work did not take (a GPU's time
        takes no CPU from the control path)."""
        if self.compute_q is None:
            return fn()
        done = threading.Event()
        box: List[Any] = []
        self.compute_q.put((fn, box, done, device_ns))
        done.wait()
        if box and isinstance(box[0], BaseException):
            raise box[0]
        return box[0] if box else None

    def compute_loop(self) -> None:
        self.lower_priority()
        while True:
            fn, box, done, device_ns = self.compute_q.get()
            try:
                t0 = time.perf_counter_ns()
                box.append(fn())
                left = device_ns - (time.perf_counter_ns() - t0)
                if left > 0:
                    time.sleep(left / 1e9)
            except BaseException as e:  # noqa: BLE001 - handed to the step that waits
                box.append(e)
            done.set()

    def lower_priority(self) -> None:
        """The model's work stands in for a GPU's, which takes no CPU from
        the control path (the engine's loop, the connector, the daemons):
        its thread runs at --compute-nice (Linux: a thread's own nice)."""
        if self.a.compute_nice:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.a.compute_nice)

    def device_loop(self) -> None:
        """The stand-in for the GPU: runs each launched request (decode's
        check of every byte; a failed load recomputes first, vLLM's
        policy) and hands it back to the loop."""
        self.lower_priority()
        while True:
            job = self.device.get()
            if job is None:
                return
            q, failed = job
            t0 = time.perf_counter_ns()
            if failed:
                for r in range(len(self.pools)):
                    self.on_device(r, "fill", q.ids, q.seed, q.plen)
            bad = sum(self.on_device(r, "check", q.ids, q.seed, q.plen) for r in range(len(self.pools)))
            self.compute_ns["decode"] += time.perf_counter_ns() - t0
            self.device_done.append((q, failed, bad))
            self.wake.set()

    def finish(self, q: Req, failed: bool, bad: int) -> None:
        self.device_busy -= 1
        if failed:
            self.stats["recomputed"] += 1
        self.stats["verified" if bad == 0 else "corrupt"] += 1
        self.release(q)
        self.call("request_finished", self.sched.request_finished, q.r, q.ids)
        self.reply("ok", q.rid, {"bad_tokens": bad, "load_failed": failed, "t_ready_ns": q.t_ready})

    def loop(self) -> None:
        while not self.stop:
            self.wake.clear()
            if not self.step():
                # Idle: the next step comes with the router's next message,
                # or soon for the connector's notes and transfers (an
                # engine with requests waiting for KV keeps stepping; each
                # step polls get_finished once).
                self.wake.wait(0.0005 if self.loading or self.held or self.device_busy else 0.002)


def main(make: Any = Engine, add_args: Any = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=["prefill", "decode"], required=True)
    ap.add_argument("--engine-id", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--listen", required=True, help="unix socket path for the router")
    ap.add_argument("--mode", default="pull")
    ap.add_argument("--transport", default=None)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--num-blocks", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--kv-layout", default="NHD")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--release-timeout", type=float, default=10.0)
    ap.add_argument("--load-timeout", type=float, default=10.0)
    ap.add_argument("--device-token-ns", type=int, default=0,
                    help="modeled GPU time of one prompt token's layer in prefill: the compute thread sleeps out "
                         "what the CPU work did not take")
    ap.add_argument("--device-process", type=int, default=1,
                    help="1: the model's work runs in a process of its own (device.py), as a GPU's takes no "
                         "interpreter lock; 0: on threads of the engine")
    ap.add_argument("--compute-nice", type=int, default=19,
                    help="nice of the device process, or threads, that stand in for the GPU's work (0: compete with "
                         "the control path)")
    if add_args is not None:
        add_args(ap)
    a = ap.parse_args()
    e = make(a)
    if os.path.exists(a.listen):
        os.unlink(a.listen)
    listener = Listener(a.listen, family="AF_UNIX", authkey=AUTH)
    print("ready", flush=True)
    threading.Thread(target=e.serve, args=(listener,), daemon=True).start()
    threading.Thread(target=e.device_loop, daemon=True).start()
    if e.compute_q is not None:
        threading.Thread(target=e.compute_loop, daemon=True).start()
    try:
        e.loop()
    finally:
        for w in e.workers:
            try:
                w.shutdown()
            except Exception:
                pass



if __name__ == "__main__":
    main()
