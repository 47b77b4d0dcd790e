"""The connector's worker half: registers the KV cache with b2bd, moves
blocks (pull: decode reads; push: prefill writes each layer as computed) and
reports what finished and what failed. Every message between the two sides
goes through b2bd (channel.py)."""

from __future__ import annotations

import collections
import functools
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

import b2b

from ._adapter import export_pool, poll, register_view, start_many
from .channel import NOTE_LIMIT, Channel, note_key
from .meta import RecvReq, SaveReq, Settings

# Push ids per note: 256 ids of up to 10 digits fit b2bd's 4,096-byte
# notification with the rest of the note.
IDS_PER_NOTE = 256

# A pulled note's bytes besides its requests' ids.
_PULLED_NOTE = len('{"t":"pulled","reqs":{}}')
_LANDED_NOTE = len('{"t":"landed","reqs":{}}')
_ARMED_READY = 32  # requests per armed "ready" note (one that does not fit 4 KiB is sent as before)


def _locked(fn: Any) -> Any:
    """The engine's calls and the channel's watch thread (which acts on a
    peer's note at once: starts a read on "ready", a push on late ids,
    answers a late "want") take turns on the worker's state. Notes that
    came while the engine's call held it are acted on as the call ends,
    not at the engine's next get_finished (a step later)."""
    @functools.wraps(fn)
    def f(self: "WorkerHalf", *a: Any, **k: Any) -> Any:
        with self._lock:
            self._calls += 1  # under the lock: only its holder counts
            try:
                return fn(self, *a, **k)
            finally:
                self._calls -= 1
                if self._notes_due and self._calls == 0:  # the outermost call's end
                    self._act_on_notes(flush=False)  # the flusher sends: the engine's call returns now
    return f


def tail_ids(remote: List[int], local: List[int], m: int) -> Tuple[List[int], List[int]]:
    """The (remote, local) block ids a load moves: the local blocks hold the
    request's last tokens (decode's own prefix cache held the first ones,
    as vLLM allocates only the uncomputed blocks), so they take the tail of
    the remote ids; a decode block holds m remote blocks. Raises ValueError
    when there are more local blocks than the remote ids fill (the load
    would report blocks nothing wrote)."""
    need = -(-len(remote) // m)  # local blocks the whole request fills
    if len(local) > need:
        raise ValueError(f"b2b.connector: {len(local)} local blocks to load, but the remote side sent {len(remote)} "
                         f"block ids, which fill {need}")
    return remote[(need - len(local)) * m:], local


def _note_key(x: Any) -> Optional[bytes]:
    """A "where" note's key (hex), or None when it is not a usable one
    (a peer's note is input: a bad one must not break the engine's step)."""
    try:
        k = bytes.fromhex(x) if isinstance(x, str) else b""
    except ValueError:
        return None
    return k if 1 <= len(k) <= b2b.notes.MAX_KEY_LEN else None


def encode_str(x: str) -> str:
    return json.dumps(x)


# Errors of a transfer, a note or a metadata read: the peer, its daemon or
# its layout is gone, or refused us. Anything else is a bug and propagates.
_IO_ERRORS = (b2b.B2BError, ConnectionError, TimeoutError, ValueError, KeyError)


@dataclass
class _Load:
    """Decode: one request being loaded."""

    req: RecvReq
    deadline: float
    handles: List[Any] = field(default_factory=list)
    error: Optional[str] = None
    done: bool = False  # push: prefill said every layer landed
    landed: int = 0  # push: layers whose write's note arrived
    # pull on "ready": prefill's block ids, from its note (the RecvReq is
    # shared by every rank: not written to)
    ready_ids: Optional[List[int]] = None
    # pull on "where": the reads were armed in our daemon on the "ready"
    # note's key, and start there when it lands
    armed: bool = False
    arm_key: bytes = b""  # the key of prefill's "ready" note that starts them
    where_ids: Optional[List[int]] = None  # "where"'s ids when its key was unusable: read on "ready"

    def remote_ids(self) -> Optional[List[int]]:
        """Prefill's block ids to read; None while there are none (push, or a pull waiting for "ready")."""
        return self.req.remote_block_ids if self.req.remote_block_ids is not None else self.ready_ids


@dataclass
class _Save:
    """Prefill, push: one request's layers going out."""

    req: SaveReq
    deadline: float
    layers_done: Set[int] = field(default_factory=set)
    dsts: Dict[int, dict] = field(default_factory=dict)  # decode rank -> its ids note
    sent: Dict[int, Set[int]] = field(default_factory=dict)  # decode rank -> layers pushed to it
    want: int = 1  # decode ranks per prefill rank (decode TP / prefill TP)
    handles: List[Any] = field(default_factory=list)
    error: Optional[str] = None


def physical(t: Any) -> Any:
    """A view of a KV tensor with the dims inside a block in memory order.

    vLLM hands HND caches over as permuted views (logical ``[2, blocks,
    block_size, heads, dim]``, heads-first in memory); b2b.kv wants each
    block's dims outermost first. Dims up to the block id stay put; the
    rest are ordered by stride, largest first. A no-op on a contiguous pool."""
    shape = tuple(int(n) for n in t.shape)
    lead = 2 if len(shape) == 5 and shape[0] == 2 else 1  # stacked K/V, then the block id
    strides = tuple(int(s) for s in (t.strides if hasattr(t, "__array_interface__") else t.stride()))
    rest = sorted(range(lead, len(shape)), key=lambda d: (-strides[d], d))
    order = list(range(lead)) + rest
    if order == list(range(len(shape))):
        return t
    return t.transpose(order) if hasattr(t, "__array_interface__") else t.permute(*order)


def _sliced(segs: List[Tuple[Any, int, int, int]], k: int, j: int) -> List[Tuple[Any, int, int, int]]:
    """Part ``j`` of ``k`` of every block: dim 1 cut in ``k`` (heads of an
    HND pool, tokens of an NHD one)."""
    out = []
    for region, off, blen, stride in segs:
        if blen % k:
            raise ValueError(f"b2b.connector: a block of {blen} bytes does not split in {k}")
        part = blen // k
        out.append((region, off + j * part, part, stride))
    return out


class WorkerHalf:
    def __init__(self, settings: Settings, client: Any = None) -> None:
        self.s = settings
        self.client = client or b2b.Client(settings.socket)
        self._own_client = client is None
        self.peer_address = self.client.status().peer_address
        self.chan: Optional[Channel] = None
        self._wakeup: Optional[Any] = None
        self._ring_watch: Optional[threading.Thread] = None
        self._stopping = threading.Event()
        # get_finished's notes that nothing waits on ("pulled", "release",
        # "done") go out from a thread of ours once the call returned
        # (_flush_later): the engine's step does not wait for their writes.
        self._flusher: Optional[threading.Thread] = None
        self._swept = 0.0  # _take_notes' last sweep of stale state (monotonic s)
        self._flush_due = threading.Event()
        # Reads' "pulled" notes, seen due in get_finished's poll: made and
        # queued by the flusher (_flush_loop), not in the engine's call
        # (encoding one took 20-25 us there, on the report's path).
        self._then_due: List[Tuple[str, str, dict]] = []
        self.last_note_error = ""  # the latest exception of acting on notes on the watch thread
        self.layout: Any = None
        self._layers: Dict[str, int] = {}
        self._segs: List[Tuple[Any, int, int, int]] = []
        self._layer_segs: List[List[Tuple[Any, int, int, int]]] = []
        self._names: List[str] = []  # layouts registered here, deregistered at shutdown
        self._sub: Dict[Tuple[int, int], str] = {}
        self._lock = threading.RLock()
        # Set by the watch thread when notes came while the engine's call
        # held the lock: the call acts on them as it ends (_locked).
        self._notes_due = False
        self._calls = 0  # engine calls holding the lock, nested ones included (_locked)
        # decode
        self._loads: Dict[str, _Load] = {}
        self._by_remote: Dict[str, str] = {}
        self._load_errors: Set[int] = set()
        # prefill
        self._held: Dict[str, float] = {}  # pull: request -> release deadline
        self._pulled: Dict[str, Tuple[int, int, float]] = {}  # request -> (notes seen, expected, first seen)
        self._released: Dict[str, float] = {}
        self._saves: Dict[str, _Save] = {}
        self._early_ids: Dict[str, Tuple[Dict[int, dict], float]] = {}  # push ids before the request's compute
        self._ids_parts: Dict[str, Tuple[Dict[int, dict], float]] = {}  # push ids arriving in parts
        self._pushes: List[Tuple[List[dict], List[Tuple[_Save, dict]], int, List[int]]] = []  # writes to start
        # pull, decode sent before prefill finished: requests being computed
        # (block ids, layers done) and the decode ranks that want a "ready"
        # note for each (a want may come before the request's compute).
        self._computing: Dict[str, Tuple[List[int], Set[int], float, bytes]] = {}  # ids, layers, since, "ready" key
        self._step = 0  # prefill steps that computed layers (their "ready" keys)
        # In every key: a restarted engine of the same id must not name a key
        # its predecessor used (a peer's daemon remembers keys it saw).
        self._incarnation = os.urandom(8).hex()
        self._wants: Dict[str, Tuple[Dict[int, dict], float]] = {}
        # Pull, prefill: "ready" notes armed in our daemon when "where" went
        # (_arm_ready), and those due to fire at this call's end (_fire_ready).
        self._to_arm: List[Tuple[dict, str, bytes]] = []
        self._to_fire: List[Tuple[dict, str, bytes]] = []
        # Push, prefill: this step's layer writes armed in our daemon at its
        # start (_arm_pushes), by layer: the local key that sends them.
        self._push_step = 0
        self._armed_layers: Dict[int, bytes] = {}
        self._ready_parts: Dict[str, Tuple[Dict[int, dict], float]] = {}  # decode: "ready" notes arriving in parts
        self.stats = {"loads": 0, "load_failures": 0, "saves": 0, "save_failures": 0, "notes_sent": 0,
                      "timeouts": 0, "pull_starts": 0, "push_starts": 0, "push_armed": 0, "ready_armed": 0}
        self.stats["wire_ns"] = collections.deque(maxlen=4096)  # the latest transfers' wire time
        # ... and their whole data path in the daemon: first post to last
        # landing (the wire phase leaves out the copy of a same-host
        # transfer and the socket writes of a tcp one, which move the bytes)
        self.stats["transfer_ns"] = collections.deque(maxlen=4096)
        # Wall-clock times (ns) of each request's handover steps, for an
        # engine's own accounting (take_trace); bounded like wire_ns.
        self.trace: "collections.OrderedDict[str, Dict[str, int]]" = collections.OrderedDict()

    def set_wakeup(self, fn: Optional[Any]) -> None:
        """Call ``fn()`` (from a connector thread) whenever a note from a
        peer arrives (a landed push, a ready or failure report, a pulled
        ack) or a transfer on the client's ring ends. An engine that sleeps
        between steps while loads are outstanding wakes on it instead of a
        timer (vLLM's engine steps without sleeping; this is for engines
        that do not)."""
        self._wakeup = fn
        if fn is not None:
            self._start_ring_watch()

    def _start_ring_watch(self) -> None:
        """A thread that sleeps on the client's ring: a transfer's end and
        (when the channel watches over the ring) a peer's note come
        through it; it acts on notes at once and wakes the engine."""
        if self._ring_watch is None:
            self._ring_watch = threading.Thread(target=self._watch_ring, daemon=True,
                                                name=f"b2b-connector-ring-{self.s.engine_id}.{self.s.tp_rank}")
            self._ring_watch.start()

    def _on_notes(self) -> None:
        """A peer's notes arrived (called on the channel's watch thread):
        act on them now rather than at the engine's next get_finished, so
        that the engine's step is not on the handover's path, then wake
        the engine for what it must report."""
        # Not waiting for the engine: while one of its calls holds the
        # state, that call acts on the notes as it ends (_locked), and this
        # thread goes on reading.
        self._notes_due = True
        chan, batch = self.chan, None
        if self._lock.acquire(blocking=False):
            try:
                self._act_on_notes(flush=None)
                if chan is not None:
                    batch = chan.flush_begin()
            finally:
                self._lock.release()
        if batch is not None:
            # The answers' writes start without the lock, as the flusher's:
            # an engine call that comes meanwhile does not wait for them.
            try:
                started = chan.flush_post(batch)
                with self._lock:
                    chan.flush_settle(started, batch[1])
            except Exception as e:  # noqa: BLE001 - a bug here must not kill this thread
                with self._lock:
                    self.stats["note_errors"] = self.stats.get("note_errors", 0) + 1
                    self.last_note_error = f"{type(e).__name__}: {e}"
        fn = self._wakeup
        if fn is not None:
            fn()

    def _act_on_notes(self, flush: Optional[bool] = True) -> None:
        """Take the peers' notes and act on them: reads on "ready", pushes
        on late ids, "where" and "ready" answers, sent now (flush), by the
        flusher thread (False), or left queued for the caller (None). The
        lock is held."""
        self._notes_due = False
        try:
            if self.chan is not None and not self._stopping.is_set():
                self._take_notes()
                self._start_pushes()
                if flush:
                    self.chan.flush()
                elif flush is not None:
                    self._flush_later()
        except Exception as e:  # noqa: BLE001 - a bug here must not kill the caller; get_finished retries
            self.stats["note_errors"] = self.stats.get("note_errors", 0) + 1
            self.last_note_error = f"{type(e).__name__}: {e}"

    def _watch_ring(self) -> None:
        ring, seen = None, 0
        while not self._stopping.is_set():
            r = self.client.ring if not self._stopping.is_set() else None
            if r is None:
                self._stopping.wait(0.05)
                continue
            if r is not ring:
                ring, seen = r, r.completion_tail()
            now = ring.wait_completion(seen, 0.05)
            chan = self.chan
            if chan is not None and chan.on_ring and chan.pump() and chan.on_note is not None:
                chan.on_note()  # acts on them, then wakes the engine (_on_notes)
            elif now != seen:
                fn = self._wakeup
                if fn is not None:
                    fn()
            seen = now

    def _flush_later(self) -> None:
        """Have the flusher thread send the queued notes and the due
        "pulled" ones (under the lock, so once the engine's call returned)."""
        if self.chan is None or not (self._then_due or self.chan.queued()):
            return
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._flush_loop, daemon=True,
                                             name=f"b2b-connector-notes-{self.s.engine_id}.{self.s.tp_rank}")
            self._flusher.start()
        self._flush_due.set()

    def _flush_loop(self) -> None:
        while True:
            self._flush_due.wait()
            if self._stopping.is_set():
                return
            self._flush_due.clear()
            try:
                with self._lock:
                    chan = self.chan
                    if chan is None or self._stopping.is_set():
                        continue
                    due, self._then_due = self._then_due, []
                    for peer, engine, note in due:
                        self._note_prefill(peer, engine, note)
                    batch = chan.flush_begin()
                if batch is None:
                    continue
                # The writes start without the lock: the engine's next call
                # does not wait for them (a ring post wakes our daemon,
                # which took the poster's core for 0.1-0.3 ms here).
                started = chan.flush_post(batch)
                with self._lock:
                    chan.flush_settle(started, batch[1])
            except Exception as e:  # noqa: BLE001 - a bug here must not kill the thread; the next flush retries
                with self._lock:
                    self.stats["note_errors"] = self.stats.get("note_errors", 0) + 1
                    self.last_note_error = f"{type(e).__name__}: {e}"

    def _trace_of(self, rid: str) -> Dict[str, int]:
        t = self.trace.get(rid)
        if t is None:
            t = self.trace[rid] = {}
            if len(self.trace) > 4096:
                self.trace.popitem(last=False)
        return t

    def _mark(self, rid: str, what: str, last: bool = False, at: int = 0) -> None:
        t = self._trace_of(rid)
        if last or what not in t:
            t[what] = at or time.time_ns()

    def _mark_wire(self, rid: str, ts: List[Tuple[int, int, int, Optional[int]]]) -> None:
        """Keep, in the request's trace as ``wire_ns`` (a duration, not a
        time), the wire phase of the transfer that ended last: the one the
        request's handover waited for (a read or write carries several
        requests, so the engine's per-transfer wire times weigh a large
        step's requests as one)."""
        last = max((x for x in ts if x[3] is not None), key=lambda x: x[2], default=None)
        if last is not None:
            t = self.trace.get(rid)
            if t is not None:
                t["wire_ns"] = int(last[3])

    @_locked
    def take_trace(self, rid: str) -> Dict[str, int]:
        """The handover times recorded for ``rid`` (and forget them)."""
        return self.trace.pop(rid, {})

    # -- names --------------------------------------------------------------

    def _local(self, what: str) -> str:
        return f"{self.s.engine_id}.r{self.s.tp_rank}{what}"

    def _export(self, what: str, rank: Optional[int] = None, engine: Optional[str] = None) -> str:
        return f"{engine or self.s.engine_id}.kv.r{self.s.tp_rank if rank is None else rank}{what}"

    def _register(self, name: str, segs: List[Tuple[Any, int, int, int]], export_name: str = "") -> None:
        register_view(self.client, name, segs, self.layout.num_blocks, export_name)
        self._names.append(name)

    # -- registration -------------------------------------------------------

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        s = self.s
        if isinstance(kv_caches, dict):
            kv_caches = {k: physical(v) for k, v in kv_caches.items()}
        else:
            kv_caches = [physical(v) for v in kv_caches]
        self.layout = b2b.kv.register(self.client, kv_caches, name=self._local(""))
        export_pool(self.client, self.layout, self._export(""))  # peers read (pull) and write (push) it
        self._segs = [(g.region, g.offset, g.block_len, g.stride) for g in self.layout.segments]
        keys = list(kv_caches.keys()) if isinstance(kv_caches, dict) else [str(i) for i in range(len(kv_caches))]
        self._layers = {k: i for i, k in enumerate(keys)}
        per = len(self._segs) // len(keys)
        self._layer_segs = [self._segs[i * per:(i + 1) * per] for i in range(len(keys))]
        self._register(self._local(".x"), self._segs, self._export(""))
        for i, ls in enumerate(self._layer_segs):
            self._register(self._local(f".L{i}"), ls, self._export(f".L{i}"))
        splits = {}
        for k in s.head_splits:
            for j in range(k):
                self._register(self._local(f".h{k}.{j}"), _sliced(self._segs, k, j), self._export(f".h{k}.{j}"))
                splits[f"h{k}.{j}"] = self._export(f".h{k}.{j}")
                if s.mode == "push":  # each layer's head slice, pushed as computed
                    for i, ls in enumerate(self._layer_segs):
                        self._register(self._local(f".L{i}.h{k}.{j}"), _sliced(ls, k, j))
        self.chan = Channel(self.client, s.engine_id, s.tp_rank, s.transport, timeout=max(5.0, s.load_timeout))
        self.chan.on_note = self._on_notes
        # Pulls' notes land on the pool's first region; in push mode each
        # layer's write carries a note too, delivered on that layer's
        # first region: watch each distinct one once.
        watched = {id(self.layout.segments[0].region)}
        self.chan.watch(self.layout.segments[0].region)
        if s.mode == "push":
            for ls in self._layer_segs:
                if id(ls[0][0]) not in watched:
                    watched.add(id(ls[0][0]))
                    self.chan.watch(ls[0][0])
        if self.chan.on_ring:  # its notes come as ring completions: someone must read them
            self._start_ring_watch()
        self.chan.publish({
            "engine": s.engine_id, "rank": s.tp_rank, "tp_size": s.tp_size, "block_size": s.block_size,
            "kv_layout": s.kv_layout, "num_blocks": self.layout.num_blocks, "layers": len(keys),
            "block_lens": [g[2] for g in self._segs], "full": self._export(""), "splits": splits,
            "peer": self.peer_address, "mode": s.mode,
        })

    def _sub_layout(self, m: int, j: int) -> str:
        """A local layout over part ``j`` of ``m`` of each block (a prefill
        block of 1/m of ours: NHD, tokens first)."""
        name = self._sub.get((m, j))
        if name is None:
            name = self._local(f".s{m}.{j}")
            self._register(name, _sliced(self._segs, m, j))
            self._sub[(m, j)] = name
        return name

    # -- decode: loads -------------------------------------------------------

    def _plan_pull(self, r: RecvReq, remote_ids: List[int]) -> Tuple[int, List[Tuple[str, str, List[int], List[int]]], int]:
        """(prefill rank, [(local layout, remote layout, local ids, remote ids)], notes that rank expects)."""
        s = self.s
        m0 = self.chan.fetch_meta(r.remote_peer, r.remote_engine, 0)
        ptp, pbs = int(m0["tp_size"]), int(m0["block_size"])
        if s.tp_size % ptp or s.block_size % pbs:
            raise ValueError(f"b2b.connector: decode TP {s.tp_size}, block {s.block_size} over prefill TP {ptp}, "
                             f"block {pbs}: want whole multiples")
        k, m = s.tp_size // ptp, s.block_size // pbs
        if k > 1 and m > 1:
            raise ValueError("b2b.connector: mismatched TP and block size together are not supported")
        prank = s.tp_rank // k
        pm = m0 if prank == 0 else self.chan.fetch_meta(r.remote_peer, r.remote_engine, prank)
        rb, lb = tail_ids(list(remote_ids), list(r.local_block_ids), m)
        if k > 1:
            key = f"h{k}.{s.tp_rank % k}"
            if key not in pm["splits"]:
                raise ValueError(f"b2b.connector: prefill {r.remote_engine} rank {prank} exports no {key} head slice "
                                 f"(kv_layout HND and head_splits [{k}] there)")
            return prank, [(self._local(".x"), pm["splits"][key], lb, rb)], k
        if m > 1:
            if s.kv_layout != "NHD":
                raise ValueError("b2b.connector: a larger decode block needs kv_layout NHD (tokens first)")
            plans = []
            for j in range(min(m, len(rb))):
                rem = rb[j::m]
                loc = [lb[i // m] for i in range(j, len(rb), m)]
                plans.append((self._sub_layout(m, j), pm["full"], loc, rem))
            return prank, plans, len(plans)
        return prank, [(self._local(".x"), pm["full"], lb, rb)], 1

    @_locked
    def start_load_kv(self, meta: Any) -> None:
        s = self.s
        if s.mode == "push" and getattr(meta, "reqs_to_save", None):
            self._arm_pushes(meta)
        for rel in meta.reqs_to_release.values():
            self._note_prefill(rel.remote_peer, rel.remote_engine, {"t": "release", "req": rel.remote_request_id})
        pulls: Dict[Tuple[str, str, str], List[Tuple[str, _Load, List[int], List[int], int]]] = {}
        pushed: List[str] = []
        for rid, r in meta.reqs_to_recv.items():
            ld = _Load(r, time.monotonic() + s.load_timeout)
            self._loads[rid] = ld
            self._by_remote[r.remote_request_id] = rid
            self.stats["loads"] += 1
            self._mark(rid, "load_begun")
            if r.bad is not None:  # malformed params: reported as load errors, prefill freed
                ld.error = r.bad
                continue
            if not r.local_block_ids:  # decode's own prefix cache holds the whole prompt: nothing to load
                ld.done = True  # reported at get_finished; prefill frees its blocks now
                self._note_prefill(r.remote_peer, r.remote_engine, {"t": "release", "req": r.remote_request_id})
                continue
            try:
                if r.wait_ready:  # pull: ask prefill to say when the request is ready, and where
                    prank = self._pull_source(r)
                    self.chan.queue(r.remote_peer, r.remote_engine, prank, {
                        "t": "want", "req": r.remote_request_id, "peer": self.peer_address, "engine": s.engine_id,
                        "rank": s.tp_rank, "arm": True}, on_error=lambda e, ld=ld: self._unsent(ld, e))
                    self.stats["notes_sent"] += 1
                    continue
                if r.remote_block_ids is None:  # push: tell prefill where to write
                    prank, k = self._push_source(r)
                    ids = r.local_block_ids
                    parts = max(1, -(-len(ids) // IDS_PER_NOTE))  # a note is at most 4 KiB
                    for part in range(parts):
                        self.chan.queue(r.remote_peer, r.remote_engine, prank, {
                            "t": "ids", "req": r.remote_request_id, "part": part, "parts": parts,
                            "ids": ids[part * IDS_PER_NOTE:(part + 1) * IDS_PER_NOTE], "peer": self.peer_address,
                            "engine": s.engine_id, "rank": s.tp_rank, "k": k, "slice": s.tp_rank % k},
                            on_error=lambda e, ld=ld: self._unsent(ld, e))
                        self.stats["notes_sent"] += 1
                    pushed.append(rid)
                    continue
                prank, plans, expect = self._plan_pull(r, r.remote_block_ids)
                for local, remote, lids, rids in plans:
                    pulls.setdefault((local, r.remote_peer, remote), []).append((rid, ld, lids, rids, expect))
            except _IO_ERRORS as e:
                ld.error = f"{type(e).__name__}: {e}"
                self.chan.forget(r.remote_peer, r.remote_engine)
        self._start_pulls(pulls)
        self.chan.flush()  # this step's ids and release notes, packed per prefill rank
        for rid in pushed:
            self._mark(rid, "ids_sent")

    def _unsent(self, ld: _Load, e: Exception) -> None:
        """Push: the ids note of a load could not be written (prefill is gone)."""
        if ld.error is None:
            ld.error = f"{type(e).__name__}: {e}"
        self.chan.forget(ld.req.remote_peer, ld.req.remote_engine)

    def _start_pulls(self, pulls: Dict[Tuple[str, str, str], List[Tuple[str, _Load, List[int], List[int], int]]],
                     arm: bool = False) -> None:
        """One read per (local layout, prefill peer, remote layout) for all
        of this step's requests, not one per request: a start is a daemon
        round trip, the step's dominant cost with many requests in flight.
        The read's note names every request in it (as many as fit a note;
        more start another read); prefill counts one note per request and
        read. A failed read fails every request in it (each is reported in
        get_block_ids_with_load_errors). Every read of the step starts in
        one StartTransfers call."""
        s = self.s
        moves: List[dict] = []
        chunks: List[List[Tuple[str, _Load, List[int], List[int], int]]] = []
        for (local, peer, remote), items in pulls.items():
            i = 0
            while i < len(items):
                reqs: Dict[str, int] = {}
                size = _PULLED_NOTE
                j = i
                while j < len(items):
                    key = items[j][1].req.remote_request_id
                    add = 0 if key in reqs else len(encode_str(key)) + 12
                    if reqs and (size + add > NOTE_LIMIT or (arm and items[j][1].arm_key != items[i][1].arm_key)):
                        break
                    reqs[key] = items[j][4]
                    size += add
                    j += 1
                chunk, i = items[i:j], j
                mv = {"local": local, "peer": peer, "remote": remote, "op": "read",
                      "lids": [b for it in chunk for b in it[2]], "rids": [b for it in chunk for b in it[3]],
                      "note": {"t": "pulled", "reqs": reqs}}
                if arm:  # one read per "ready" key: the requests prefill computed in one step
                    mv["after"] = b2b.on_note(self.chan.mailbox, chunk[0][1].arm_key)
                    # Its "pulled" goes as a note once we see it end, not with
                    # the read: the read's end then waits for no Notify.
                    mv["then"] = (peer, chunk[0][1].req.remote_engine, mv.pop("note"))
                moves.append(mv)
                chunks.append(chunk)
        if not moves:
            return
        try:
            started = start_many(self.client, moves, s.load_timeout, s.transport)
        except _IO_ERRORS as e:
            started = [e] * len(moves)
        for m, chunk, h in zip(moves, chunks, started):
            if isinstance(h, BaseException):
                for _, ld, _, _, _ in chunk:
                    if ld.error is None:
                        ld.error = f"{type(h).__name__}: {h}"
                self.chan.forget(m["peer"], chunk[0][1].req.remote_engine)
                continue
            self.stats["pull_starts"] += 1
            h.then = m.get("then")
            for rid, ld, _, _, _ in chunk:
                ld.handles.append(h)
                ld.armed = ld.armed or arm
                self._mark(rid, "armed" if arm else "started", last=True)

    def _pull_source(self, r: RecvReq) -> int:
        """Pull: the prefill rank whose blocks this rank reads."""
        if self.s.tp_size == 1:
            return 0
        ptp = int(self.chan.fetch_meta(r.remote_peer, r.remote_engine, 0)["tp_size"])
        if self.s.tp_size % ptp:
            raise ValueError(f"b2b.connector: decode TP {self.s.tp_size} over prefill TP {ptp}: want a whole multiple")
        return self.s.tp_rank // (self.s.tp_size // ptp)

    def _ready(self, rid: str, ids: List[int], at: int,
               pulls: Dict[Tuple[str, str, str], List[Tuple[str, _Load, List[int], List[int], int]]]) -> None:
        """Pull: prefill said request ``rid`` (its id) is ready in blocks
        ``ids``: plan its read into ``pulls``, started with the others."""
        lrid = self._by_remote.get(rid, "")
        ld = self._loads.get(lrid)
        if ld is None or not ld.req.wait_ready or ld.ready_ids is not None or ld.error is not None:
            return
        if at:
            self._mark(lrid, "ready_arrived", at=at)
        ld.ready_ids = ids
        try:
            _, plans, expect = self._plan_pull(ld.req, ids)
        except _IO_ERRORS as e:
            ld.error = f"{type(e).__name__}: {e}"
            return
        for local, remote, lids, rids in plans:
            pulls.setdefault((local, ld.req.remote_peer, remote), []).append((lrid, ld, lids, rids, expect))

    def _push_source(self, r: RecvReq) -> Tuple[int, int]:
        """Push: (the prefill rank that writes our blocks, decode ranks per
        prefill rank). Prefill writes its blocks one for one into ours, so
        the block sizes must be equal (a pull reads across sizes)."""
        m0 = self.chan.fetch_meta(r.remote_peer, r.remote_engine, 0)
        ptp, pbs = int(m0["tp_size"]), int(m0["block_size"])
        if self.s.tp_size % ptp or pbs != self.s.block_size:
            raise ValueError(f"b2b.connector: push from prefill TP {ptp}, block {pbs} to decode TP {self.s.tp_size}, "
                             f"block {self.s.block_size}: want a whole TP multiple and equal blocks")
        k = self.s.tp_size // ptp
        return self.s.tp_rank // k, k

    def _note_prefill(self, peer: str, engine: str, note: dict) -> None:
        """Queue a note to prefill (sent at the step's flush); if prefill is
        gone or restarted, its own timeout frees the blocks."""
        self.chan.queue(peer, engine, 0 if self.s.tp_size == 1 else self._prefill_rank(peer, engine), note)
        self.stats["notes_sent"] += 1

    def _prefill_rank(self, peer: str, engine: str) -> int:
        try:
            ptp = int(self.chan.fetch_meta(peer, engine, 0)["tp_size"])
        except _IO_ERRORS:
            return 0
        return self.s.tp_rank // max(1, self.s.tp_size // ptp)

    def _tally(self, handles: List[Any]) -> None:
        """Keep the wire and data-path times of each done transfer once
        (reads are shared by requests)."""
        for h in handles:
            if not h.tallied and h.wire_ns is not None:
                h.tallied = True
                self.stats["wire_ns"].append(h.wire_ns)
                posted, landed = h.posted_ns, h.landed_ns
                if posted and landed >= posted:
                    self.stats["transfer_ns"].append(landed - posted)

    def _loaded(self, rid: str, handles: List[Any], seen: int) -> None:
        """A load whose reads all ended well: tally them (once each) and
        put the daemon's times in the request's trace, those of the read
        that ended last, as the request waits for all (the wire phase: of
        the read that landed last; see _mark_wire)."""
        stats = self.stats
        fired = posted = landed = 0
        wire, wire_at = None, -1
        for h in handles:
            f, p, l, w = h.times()
            if not h.tallied and w is not None:
                h.tallied = True
                stats["wire_ns"].append(w)
                if p and l >= p:
                    stats["transfer_ns"].append(l - p)
            fired, posted, landed = max(fired, f), max(posted, p), max(landed, l)
            if w is not None and l > wire_at:
                wire, wire_at = w, l
        t = self._trace_of(rid)
        for what, at in (("fired", fired), ("posted", posted), ("landed", landed), ("ended", seen)):
            if at and what not in t:
                t[what] = at
        if wire is not None:
            t["wire_ns"] = int(wire)

    def _finish_loads(self, recving: Set[str]) -> None:
        """Report the loads that ended: every read done, or failed, or the
        load timed out. Every request reported in a step waits for the
        whole call, so a step that ends many keeps it lean: one pass to
        find them, one timestamp for their report."""
        if not self._loads:
            return
        now, seen = time.monotonic(), time.time_ns()
        ended = []
        for rid, ld in self._loads.items():
            if ld.error is None:
                if ld.remote_ids() is None:  # push, or a pull not yet ready
                    if not ld.done and now < ld.deadline:
                        continue
                elif now < ld.deadline and not all(h.ended for h in ld.handles):
                    continue
            ended.append((rid, ld))
        for rid, ld in ended:
            r = ld.req
            if ld.error is None:
                if ld.remote_ids() is None:
                    if not ld.done:
                        ld.error = f"no word from prefill {r.remote_engine} in {self.s.load_timeout} s"
                        self.stats["timeouts"] += 1
                else:
                    if not all(h.ended for h in ld.handles):
                        for h in ld.handles:
                            try:
                                h.cancel()
                            except _IO_ERRORS:
                                pass
                        self.stats["timeouts"] += 1
                        ld.error = f"not loaded in {self.s.load_timeout} s"
                    else:
                        err = next((h.error for h in ld.handles if h.error is not None), None)
                        if err is not None:
                            ld.error = str(err)
                        else:
                            self._loaded(rid, ld.handles, seen)
            if ld.error is not None:
                self._load_errors.update(r.local_block_ids)
                self.stats["load_failures"] += 1
                if ld.remote_ids() is not None or r.wait_ready:
                    self._note_prefill(r.remote_peer, r.remote_engine, {"t": "release", "req": r.remote_request_id})
            del self._loads[rid]
            self._by_remote.pop(r.remote_request_id, None)
            recving.add(rid)
        if ended:
            done = time.time_ns()
            for rid, _ in ended:
                self._mark(rid, "reported", at=done)

    # -- prefill: saves (push) ----------------------------------------------

    @_locked
    def save_kv_layer(self, layer_name: str, meta: Any) -> None:
        li = self._layers.get(layer_name)
        if li is None:
            return
        now = time.monotonic()
        if self.s.mode == "pull":
            self._announce(li, meta, now)
            return
        key = self._armed_layers.pop(li, None)
        if key is not None:  # the writes armed at the step's start, first
            self._fire_layer(li, key, meta)
        groups: Dict[Tuple[str, str, int, int, int], List[Tuple[_Save, dict]]] = {}
        for rid, r in meta.reqs_to_save.items():
            sv = self._save(rid, r, now)
            sv.layers_done.add(li)
            for rank, d in sv.dsts.items():
                if sv.error is None and li not in sv.sent[rank]:
                    key = (d["peer"], d["engine"], rank, int(d.get("k", 1)), int(d.get("slice", 0)))
                    groups.setdefault(key, []).append((sv, d))
        for items in groups.values():
            self._push(items, [li])
        self._start_pushes()

    def _arm_pushes(self, meta: Any) -> None:
        """Push, at a step's start: the writes of every layer of the step's
        requests whose decode ids are here, armed in our daemon, one local
        key per layer; save_kv_layer fires a layer's with one local note
        (_fire_layer), resolved and planned already. The layers of ids that
        come later go as before."""
        now = time.monotonic()
        self._push_step += 1
        self._armed_layers = {}
        groups: Dict[Tuple[str, str, int, int, int], List[Tuple[_Save, dict]]] = {}
        for rid, r in meta.reqs_to_save.items():
            sv = self._save(rid, r, now)
            for rank, d in sv.dsts.items():
                if sv.error is None and not sv.sent[rank]:
                    groups.setdefault((d["peer"], d["engine"], rank, int(d.get("k", 1)), int(d.get("slice", 0))), []).append((sv, d))
        if not groups:
            return
        keys = {li: f"{self._incarnation}.p{self._push_step}.L{li}".encode() for li in range(len(self._layer_segs))}
        for items in groups.values():
            for li, key in keys.items():
                self._push(items, [li], after=b2b.on_note(self.chan.signals, key))
        self._start_pushes(armed=True)
        self._armed_layers = keys

    def _fire_layer(self, li: int, key: bytes, meta: Any) -> None:
        """Send layer ``li``'s armed writes (_arm_pushes). A refused note
        fails the step's saves (decode hears "failed"); their writes end at
        their deadline."""
        try:
            self.chan.signal([key])
        except _IO_ERRORS as e:
            for rid in meta.reqs_to_save:
                sv = self._saves.get(rid)
                if sv is not None and sv.error is None:
                    sv.error = f"layer {li}'s armed writes not sent: {type(e).__name__}: {e}"
            return
        for rid in meta.reqs_to_save:
            self._mark(rid, "pushed", last=True)

    def _announce(self, li: int, meta: Any, now: float) -> None:
        """Pull: count layer ``li`` of the step's requests; once a
        request's last layer is computed, send "ready" (its block ids) to
        every decode rank that wants it, at once: decode reads without
        waiting for this step to end and the router to pass it on."""
        sent = False
        if li == 0:
            self._step += 1
        for rid, r in meta.reqs_to_save.items():
            c = self._computing.get(rid)
            if c is None:
                # The requests of one step are computed together: their
                # "ready" notes share a key, and a decode rank reads the
                # ones it armed on it in one transfer.
                c = self._computing[rid] = (list(r.block_ids), set(), now, note_key(self.s.engine_id, f"{self._incarnation}.r{self.s.tp_rank}.step{self._step}"))
            c[1].add(li)
            if len(c[1]) == len(self._layer_segs):
                self._mark(rid, "computed")
                sent |= self._send_ready(rid)
            else:
                sent |= self._send_where(rid)
        self._fire_ready()
        if sent:
            self.chan.flush()
        self._arm_ready()

    def _arm_ready(self) -> None:
        """Arm the "ready" notes of the requests whose "where" just went
        (one note per decode rank and step, a key note naming the step's
        key) in our daemon, on a local key of the step: at the last layer
        one local note (_fire_ready) sends them all, resolved already.
        A rank whose note did not arm gets "ready" as before."""
        todo, self._to_arm = self._to_arm, []
        groups: Dict[Tuple[str, str, int, bytes], List[Tuple[dict, str]]] = {}
        for d, rid, key in todo:
            groups.setdefault((d["peer"], d["engine"], int(d["rank"]), key), []).append((d, rid))
        for (peer, engine, rank, key), items in groups.items():
            for i in range(0, len(items), _ARMED_READY):
                part = items[i:i + _ARMED_READY]
                if self.chan.arm(peer, engine, rank, [{"t": "ready", "req": rid} for _, rid in part], key,
                                 b2b.on_note(self.chan.signals, key + b"L")):
                    self.stats["ready_armed"] += len(part)
                    for d, rid in part:
                        d["_rarm"] = True

    def _fire_ready(self) -> None:
        """Send the armed "ready" notes of the requests computed in this
        call: one local note for their steps' keys. If it fails, send them
        as before."""
        todo, self._to_fire = self._to_fire, []
        if not todo:
            return
        try:
            self.chan.signal(sorted({key + b"L" for _, _, key in todo}))
        except _IO_ERRORS:
            for d, rid, key in todo:
                self.chan.queue(d["peer"], d["engine"], int(d["rank"]), {"t": "ready", "req": rid}, key=key)
                self.stats["notes_sent"] += 1
            self.chan.flush()

    def _ids_notes(self, t: str, rid: str, ids: List[int]) -> List[dict]:
        parts = max(1, -(-len(ids) // IDS_PER_NOTE))
        return [{"t": t, "req": rid, "part": part, "parts": parts, "ids": ids[part * IDS_PER_NOTE:(part + 1) * IDS_PER_NOTE]}
                for part in range(parts)]

    def _send_where(self, rid: str) -> bool:
        """Queue "where" (its block ids) for ``rid``, still being computed,
        to each decode rank that wants it and has not had it: that rank
        arms its reads in its daemon on the "ready" note's key, so that
        they start the moment "ready" lands. True if any was queued."""
        c, w = self._computing.get(rid), self._wants.get(rid)
        if c is None or w is None:
            return False
        sent = False
        for d in w[0].values():
            if d.get("_where") or not d.get("arm"):
                continue
            for n in self._ids_notes("where", rid, c[0]):
                n["key"] = c[3].hex()
                self.chan.queue(d["peer"], d["engine"], int(d["rank"]), n)
                self.stats["notes_sent"] += 1
            d["_where"] = sent = True
            self._to_arm.append((d, rid, c[3]))
        return sent

    def _send_ready(self, rid: str) -> bool:
        """Queue "ready" for ``rid`` to each decode rank that wants it, if
        its layers are all computed; True if any was queued. Its write is a
        key note (channel.note_key): the reads a rank armed on "where"
        start in its daemon as it lands; a rank that had no "where" reads
        the ids it carries."""
        c, w = self._computing.get(rid), self._wants.get(rid)
        if c is None or w is None or len(c[1]) < len(self._layer_segs):
            return False
        key = c[3]
        for d in w[0].values():
            if d.get("_rarm"):  # armed in our daemon: fired at this call's end
                self._to_fire.append((d, rid, key))
                self.stats["notes_sent"] += 1
                continue
            notes = [{"t": "ready", "req": rid}] if d.get("_where") else self._ids_notes("ready", rid, c[0])
            for n in notes:
                self.chan.queue(d["peer"], d["engine"], int(d["rank"]), n, key=key)
                self.stats["notes_sent"] += 1
        del self._wants[rid]
        self._mark(rid, "ready_sent", last=True)
        return True

    def _save(self, rid: str, r: Any, now: float) -> _Save:
        """Request ``rid``'s save, made on first sight with the decode ids
        that came before it."""
        sv = self._saves.get(rid)
        if sv is None:
            sv = self._saves[rid] = _Save(r, now + self.s.release_timeout)
            early = self._early_ids.pop(rid, None)
            if early is not None:
                for d in early[0].values():
                    self._add_dst(sv, d)
        return sv

    def _add_dst(self, sv: _Save, d: dict) -> None:
        rank = int(d["rank"])
        sv.want = int(d.get("k", 1))
        sv.dsts[rank] = d
        sv.sent.setdefault(rank, set())

    def _push(self, items: List[Tuple[_Save, dict]], layers: List[int], after: Any = None) -> None:
        """Push ``layers`` of requests to one decode rank (every ``d`` of
        ``items`` names the same one): all layers at once (ids came late),
        else layer by layer; with k decode ranks per prefill rank, head
        slice ``d["slice"]`` of k. One write per layer for all the requests
        (a start is a daemon round trip); each write's note tells decode,
        once its bytes landed, how many layers of which requests it carried,
        so decode has a request once all of them did, without waiting for
        this side to poll the writes and send "done". The writes are queued
        here and started together by :meth:`_start_pushes`."""
        d0 = items[0][1]
        rank = int(d0["rank"])
        k, j = int(d0.get("k", 1)), int(d0.get("slice", 0))
        cut = "" if k == 1 else f".h{k}.{j}"
        if len(layers) == len(self._layer_segs):
            pairs = [(self._local(cut or ".x"), self._export("", rank, d0["engine"]))]
        else:
            pairs = [(self._local(f".L{li}{cut}"), self._export(f".L{li}", rank, d0["engine"])) for li in layers]
        i = 0
        while i < len(items):
            reqs: Dict[str, int] = {}
            size, jj = _LANDED_NOTE, i
            while jj < len(items):
                add = len(encode_str(items[jj][0].req.req_id)) + 12
                if reqs and size + add > NOTE_LIMIT:
                    break
                reqs[items[jj][0].req.req_id] = len(layers) // len(pairs)
                size += add
                jj += 1
            chunk, i = items[i:jj], jj
            src: List[int] = []
            dst: List[int] = []
            for sv, d in chunk:
                try:
                    mine, theirs = tail_ids(list(sv.req.block_ids), list(d["ids"]), 1)
                except ValueError as e:  # decode wants blocks this request has not: it fails there ("failed")
                    sv.error = sv.error or str(e)
                    reqs.pop(sv.req.req_id, None)
                    continue
                src += mine
                dst += theirs
            moves = [{"local": local, "peer": d0["peer"], "remote": remote, "op": "write", "lids": src, "rids": dst,
                      "note": {"t": "landed", "reqs": reqs}, "after": after} for local, remote in pairs]
            self._pushes.append((moves, chunk, rank, layers))

    def _start_pushes(self, armed: bool = False) -> None:
        """Start the writes :meth:`_push` queued, all in one StartTransfers
        call. A chunk's layers count as sent once every write of it started
        (``armed``: once it waits in our daemon for its layer's key)."""
        jobs, self._pushes = self._pushes, []
        moves = [m for job in jobs for m in job[0]]
        if not moves:
            return
        try:
            started = start_many(self.client, moves, self.s.load_timeout, self.s.transport)
        except _IO_ERRORS as e:
            started = [e] * len(moves)
        at = 0
        for ms, chunk, rank, layers in jobs:
            hs, at = started[at:at + len(ms)], at + len(ms)
            failed = next((h for h in hs if isinstance(h, BaseException)), None)
            for h in hs:
                if not isinstance(h, BaseException):
                    self.stats["push_starts"] += 1
                    self.stats["push_armed"] += int(armed)
                    for sv, _ in chunk:
                        sv.handles.append(h)
            if failed is not None:
                for sv, _ in chunk:
                    sv.error = sv.error or f"{type(failed).__name__}: {failed}"
                continue
            for sv, _ in chunk:
                sv.sent[rank].update(layers)
                self._mark(sv.req.req_id, "armed" if armed else "pushed", last=True)

    def _finish_saves(self, sending: Set[str]) -> None:
        nl = len(self._layer_segs)
        done: List[str] = []
        now = time.monotonic()
        live = {id(h) for r, sv in self._saves.items() if r not in self._released for h in sv.handles}
        for rid, sv in list(self._saves.items()):
            if rid in self._released:
                for h in sv.handles:
                    if id(h) in live:
                        continue  # it carries other requests' layers too: it runs on
                    try:
                        h.cancel()
                    except _IO_ERRORS:
                        pass
            elif sv.error is None:
                if (len(sv.dsts) < sv.want or any(len(x) < nl for x in sv.sent.values())
                        or any(not h.ended for h in sv.handles)):
                    if now < sv.deadline:
                        continue
                    self.stats["timeouts"] += 1
                    sv.error = "timed out"
                errs = [h.error for h in sv.handles if h.error is not None]
                if errs and sv.error is None:
                    sv.error = str(errs[0])
                if sv.error is None:
                    self._tally(sv.handles)
                    # The daemon's times of the last write: the one decode waits for.
                    ts = [h.times() for h in sv.handles]
                    for i, what in ((1, "posted"), (2, "landed")):
                        t = max((x[i] for x in ts), default=0)
                        if t:
                            self._mark(rid, what, at=t)
                    self._mark_wire(rid, ts)
                    self._mark(rid, "ended")
            note = {"t": "done", "req": rid} if sv.error is None else {"t": "failed", "req": rid, "why": sv.error[:512]}
            for d in sv.dsts.values() if rid not in self._released else ():
                # Sent with the step's other notes; if that decode rank is
                # gone, its deadline reports the load.
                self.chan.queue(d["peer"], d["engine"], int(d["rank"]), note)
                self.stats["notes_sent"] += 1
                done.append(rid)
            self.stats["saves"] += 1
            if sv.error is not None:
                self.stats["save_failures"] += 1
            del self._saves[rid]
            self._released.pop(rid, None)
            sending.add(rid)
        for rid in done:
            self._mark(rid, "done_sent")  # queued: get_finished sends them once it returned

    # -- notes ---------------------------------------------------------------

    def _take_notes(self) -> None:
        now = time.monotonic()
        pulls: Dict[Tuple[str, str, str], List[Tuple[str, _Load, List[int], List[int], int]]] = {}
        armed: Dict[Tuple[str, str, str], List[Tuple[str, _Load, List[int], List[int], int]]] = {}
        for _, n in self.chan.take():
            t, rid = n.get("t"), str(n.get("req", ""))
            if t == "want":  # pull: a decode rank asks for "ready"
                self._wants.setdefault(rid, ({}, now))[0][int(n.get("rank", 0))] = n
                if not self._send_ready(rid):
                    self._send_where(rid)
            elif t == "where":  # pull: prefill's ids of a request still being computed, maybe in parts
                got = self._ready_parts.setdefault(rid, ({}, now))[0]
                got[int(n.get("part", 0))] = n
                if len(got) >= int(n.get("parts", 1)):
                    del self._ready_parts[rid]
                    ids = [int(i) for k in sorted(got) for i in got[k]["ids"]]
                    ld = self._loads.get(self._by_remote.get(rid, ""))
                    key = _note_key(n.get("key"))
                    if ld is not None and key is None:
                        ld.where_ids = ids  # no usable key to arm on: read these when "ready" comes
                        continue
                    if ld is not None:
                        ld.arm_key = key
                    self._ready(rid, ids, 0, armed)
            elif t == "ready":  # pull: prefill computed the request; its ids (unless "where" had them), maybe in parts
                lrid = self._by_remote.get(rid, "")
                ld = self._loads.get(lrid)
                if ld is not None and ld.armed:
                    self._mark(lrid, "ready_seen", at=int(n.get("_at", 0)))  # the daemon started the reads
                    continue
                if "ids" not in n:
                    if ld is not None and ld.where_ids is not None:
                        self._ready(rid, ld.where_ids, int(n.get("_at", 0)), pulls)
                    continue
                got = self._ready_parts.setdefault(rid, ({}, now))[0]
                got[int(n.get("part", 0))] = n
                if len(got) >= int(n.get("parts", 1)):
                    del self._ready_parts[rid]
                    self._ready(rid, [int(i) for k in sorted(got) for i in got[k]["ids"]], int(n.get("_at", 0)), pulls)
            elif t == "pulled":  # one read's requests (or, from an older decode, one request)
                reqs = n.get("reqs")
                for rid, want in (reqs.items() if isinstance(reqs, dict) else ((rid, n.get("n", 1)),)):
                    self._mark(rid, "pulled_seen")
                    seen, _, first = self._pulled.get(rid, (0, 0, now))
                    self._pulled[rid] = (seen + 1, int(want), first)
            elif t == "release":
                self._released[rid] = now
            elif t == "ids":
                self._mark(rid, "ids_seen")
                key = f"{rid}#{n.get('rank', 0)}"  # each decode rank sends its own parts
                got = self._ids_parts.setdefault(key, ({}, now))[0]
                got[int(n.get("part", 0))] = n
                if len(got) < int(n.get("parts", 1)):
                    continue
                del self._ids_parts[key]
                n = dict(n, ids=[i for k in sorted(got) for i in got[k]["ids"]])
                sv = self._saves.get(rid)
                if sv is None:
                    self._early_ids.setdefault(rid, ({}, now))[0][int(n.get("rank", 0))] = n
                else:
                    self._add_dst(sv, n)
                    todo = sorted(sv.layers_done - sv.sent[int(n["rank"])])
                    if todo and sv.error is None:
                        self._push([(sv, n)], todo)
            elif t == "landed":  # a write's requests and how many layers of each it carried
                reqs = n.get("reqs")
                for rid, nl in (reqs.items() if isinstance(reqs, dict) else ()):
                    ld = self._loads.get(self._by_remote.get(rid, ""))
                    if ld is not None:
                        ld.landed += int(nl)
                        if ld.landed >= len(self._layer_segs) and not ld.done:
                            self._mark(self._by_remote[rid], "landed_arrived", at=int(n.get("_at", 0)))
                            self._mark(self._by_remote[rid], "landed_seen")
                            ld.done = True
            elif t in ("done", "failed"):
                ld = self._loads.get(self._by_remote.get(rid, ""))
                if ld is not None:
                    self._mark(self._by_remote[rid], "done_seen")
                    if t == "done":
                        ld.done = True
                    else:
                        ld.error = f"prefill reported: {n.get('why', 'failed')}"
        self._start_pulls(pulls)
        self._start_pulls(armed, arm=True)
        self._fire_ready()
        self._arm_ready()
        if now - self._swept < 0.05:
            return
        self._swept = now
        # Forget notes about requests this side never learns of (every
        # 50 ms: a sweep walks every request in flight).
        for d in (self._released, self._early_ids, self._ids_parts, self._wants, self._ready_parts):
            for rid in [r for r, v in d.items() if now - (v if isinstance(v, float) else v[1]) > self.s.release_timeout
                        and r not in self._held and r not in self._saves]:
                del d[rid]
        for rid in [r for r, v in self._pulled.items() if now - v[2] > self.s.release_timeout and r not in self._held]:
            del self._pulled[rid]
        for rid in [r for r, v in self._computing.items() if now - v[2] > self.s.release_timeout and r not in self._held]:
            del self._computing[rid]  # never finished here (aborted): its wants time out at decode

    def _finish_held(self, meta: Any, sending: Set[str]) -> None:
        if meta is not None:
            self._held.update(meta.reqs_to_send)
        now = time.monotonic()
        for rid, deadline in list(self._held.items()):
            seen, want, _ = self._pulled.get(rid, (0, 1, now))
            if seen >= want or rid in self._released or now >= deadline:
                if now >= deadline and seen < want and rid not in self._released:
                    self.stats["timeouts"] += 1
                del self._held[rid]
                self._pulled.pop(rid, None)
                self._computing.pop(rid, None)
                self._released.pop(rid, None)
                sending.add(rid)

    def _poll(self) -> None:
        """One PollTransfers for every outstanding read and write, whatever
        their number (they are shared by requests)."""
        pending = {id(h): h for sv in self._saves.values() for h in sv.handles}
        pending.update((id(h), h) for ld in self._loads.values() for h in ld.handles)
        notes = self.chan.pending()
        if pending or notes:
            try:
                poll(self.client, list(pending.values()), notes)
            except _IO_ERRORS:
                return  # our daemon is unreachable: the deadlines end them
            self.chan.reap(poll=False)
            for h in pending.values():
                if h.ended and h.then is not None:  # a read's "pulled", sent (by the flusher) now that it ended
                    then, h.then = h.then, None
                    if h.error is None:
                        self._then_due.append(then)

    @_locked
    def get_finished(self, meta: Any) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        sending: Set[str] = set()
        recving: Set[str] = set()
        if self.chan is None:
            return None, None
        self._take_notes()
        self._start_pushes()  # writes for ids that came after their layers
        self._poll()
        self._finish_held(meta, sending)
        self._finish_saves(sending)
        self._finish_loads(recving)
        self._flush_later()  # "pulled", "done" and the release notes of failed loads
        return sending or None, recving or None

    @_locked
    def get_block_ids_with_load_errors(self) -> Set[int]:
        out, self._load_errors = self._load_errors, set()
        return out

    def shutdown(self) -> None:
        self._stopping.set()
        self._flush_due.set()
        if self._flusher is not None:
            self._flusher.join(timeout=2)
        if self._ring_watch is not None:
            self._ring_watch.join(timeout=2)
        for ld in self._loads.values():
            for h in ld.handles:
                try:
                    h.cancel()
                except _IO_ERRORS:
                    pass
        for sv in self._saves.values():
            for h in sv.handles:
                try:
                    h.cancel()
                except _IO_ERRORS:
                    pass
        if self.chan is not None:
            with self._lock:  # what the flusher had not sent yet
                try:
                    self.chan.flush()
                except Exception:  # noqa: BLE001 - shutting down: a peer's timeout covers a lost note
                    pass
            self.chan.close()
        for name in self._names:
            try:
                self.client.deregister_layout(name)
            except _IO_ERRORS:
                pass
        if self.layout is not None:
            try:
                self.layout.close()
            except _IO_ERRORS:
                pass
        if self._own_client:
            self.client.close()
