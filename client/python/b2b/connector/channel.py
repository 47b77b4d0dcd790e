"""The connector's side channel, carried by b2bd itself (no ZMQ).

Each worker rank owns three small host regions in its daemon:

* ``<engine>.meta.r<rank>``: its handshake metadata (JSON, length-prefixed),
  exported readable; a peer pulls it with one read (``fetch_meta``).
* ``<engine>.mbox.r<rank>``: its mailbox, exported writable; a peer sends a
  note to it as a block transfer with no block, the note alone (docs/notes.md),
  which the daemons deliver to the mailbox's watcher
  (``WatchNotifications``), which queues it here.
* scratch: the landing place of metadata reads.

A note is a block-id transfer with no ids (from a layout over the scratch
to the peer's ``<engine>.mboxl.r<rank>`` layout over its mailbox)
carrying the note as its notification: a step's notes start in one
``start_many`` call (over the client's shared-memory ring where it has one)
and are not waited for; a failed one calls its ``on_error`` at a later
:meth:`Channel.reap` or :meth:`Channel.flush`.

Notes are JSON objects with a ``t`` (type) key. Notes queued for one peer
rank during an engine step (``queue``) go out together at ``flush``: as
many as fit b2bd's 4,096-byte notification ride in one envelope
(``{"t": "multi", "n": [...]}``), one write each, instead of one write
per note. The pull of a request's
blocks carries its own note (``pulled``), delivered by the daemon to the
watchers of the prefill pool's first region, which this channel also watches.

Block transfers and the pool's exports go through ``_adapter.py``.
"""

from __future__ import annotations

import hashlib
import json
import queue
import struct
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import b2b

META_SIZE = 60 << 10
SCRATCH = 64 << 10
_NOTE_BYTES = 8
NOTE_LIMIT = 4096
_ENVELOPE = len(b'{"t":"multi","n":[]}')


# A note's write failing: the peer, its daemon or its mailbox is gone.
_SEND_ERRORS = (b2b.B2BError, ConnectionError, TimeoutError, ValueError, KeyError)


def meta_name(engine: str, rank: int) -> str:
    return f"{engine}.meta.r{rank}"


def mbox_name(engine: str, rank: int) -> str:
    return f"{engine}.mbox.r{rank}"


def mbox_layout_name(engine: str, rank: int) -> str:
    """The exported one-block layout over a rank's mailbox that notes are written to."""
    return f"{engine}.mboxl.r{rank}"


def _call(cbs: List[Optional[Callable[[Exception], None]]], e: Exception) -> None:
    for cb in cbs:
        if cb is not None:
            cb(e)


def _keys_len(keys: List[bytes]) -> int:
    """The bytes a key note's header of ``keys`` adds (0 for none)."""
    return len(b2b.notes.KEY_MAGIC) + 1 + sum(1 + len(k) for k in keys) if keys else 0


def note_key(engine: str, what: str) -> bytes:
    """The key of ``what`` of ``engine``'s key notes (16 bytes: names may
    be longer than a key)."""
    return hashlib.blake2b(f"{engine}/{what}".encode(), digest_size=16).digest()


def encode(note: dict) -> bytes:
    b = json.dumps(note, separators=(",", ":")).encode()
    if len(b) > NOTE_LIMIT:
        raise ValueError(f"b2b.connector: a note of {len(b)} bytes is over b2bd's {NOTE_LIMIT}-byte notification limit")
    return b


class Channel:
    """One worker rank's side channel (see the module's doc)."""

    def __init__(self, client: Any, engine: str, rank: int, transport: Optional[str] = None,
                 timeout: float = 10.0) -> None:
        self.client = client
        self.engine = engine
        self.rank = rank
        self.transport = transport
        self.timeout = timeout
        self.notes: "queue.Queue[Tuple[str, dict]]" = queue.Queue()
        self._lock = threading.Lock()
        self._meta = client.register_host(META_SIZE, export_name=meta_name(engine, rank), readers=["*"])
        self._mbox = client.register_host(4096, export_name=mbox_name(engine, rank))
        self._scratch = client.register_host(SCRATCH)
        self._src_layout = f"{engine}.notesrc.r{rank}"
        client.register_layout(self._src_layout, [(self._scratch, 0, _NOTE_BYTES, _NOTE_BYTES)], 1)
        client.register_layout(f"{engine}.mboxl.r{rank}", [(self._mbox, 0, _NOTE_BYTES, _NOTE_BYTES)], 1,
                               export_name=mbox_layout_name(engine, rank))
        # One flush's writes start at a time, in the order their notes were
        # queued (flush, or flush_begin to flush_post).
        self._posting = threading.Lock()
        # Note writes started and not yet seen to end: (handle, on_error callbacks).
        self._inflight: List[Tuple[Any, List[Optional[Callable[[Exception], None]]]]] = []
        self._watches: List[Any] = []
        self._threads: List[threading.Thread] = []
        # Watches on the client's ring (op watch): (ring, its watch, region),
        # read by pump().
        self._ring_watches: List[Tuple[Any, Any, Any]] = []
        self._cache: Dict[Tuple[str, str, int], dict] = {}
        # Notes queued per peer rank until flush: (encoded note, on_error).
        self._out: Dict[Tuple[str, str, int], List[Tuple[bytes, Optional[Callable[[Exception], None]], Optional[bytes]]]] = {}
        # Called (from a watch thread) after notes were queued: an engine
        # that waits between steps wakes for them instead of a timer.
        self.on_note: Optional[Callable[[], None]] = None
        self.watch(self._mbox)

    def publish(self, meta: dict) -> None:
        b = json.dumps(meta, separators=(",", ":")).encode()
        if len(b) + 4 > META_SIZE:
            raise ValueError(f"b2b.connector: handshake metadata of {len(b)} bytes is over {META_SIZE - 4}")
        arr = self._meta.array
        arr[4:4 + len(b)] = memoryview(b)
        arr[0:4] = memoryview(struct.pack("<I", len(b)))

    def fetch_meta(self, peer: str, engine: str, rank: int, fresh: bool = False) -> dict:
        """A peer rank's handshake metadata, pulled through b2bd (cached
        per peer address, engine and rank; ``fresh`` reads it again)."""
        key = (peer, engine, rank)
        if not fresh and key in self._cache:
            return self._cache[key]
        with self._lock:
            self.client.batch_transfer(self._scratch, peer, meta_name(engine, rank), [_NOTE_BYTES], [0],
                                       lengths=[META_SIZE], timeout=self.timeout, op="read",
                                       transport=self.transport)
            arr = self._scratch.array
            n = struct.unpack("<I", bytes(arr[_NOTE_BYTES:_NOTE_BYTES + 4]))[0]
            if n == 0 or n > META_SIZE - 4:
                raise ConnectionError(f"b2b.connector: {engine} rank {rank} at {peer} has published no metadata (length {n})")
            meta = json.loads(bytes(arr[_NOTE_BYTES + 4:_NOTE_BYTES + 4 + n]))
        self._cache[key] = meta
        return meta

    def forget(self, peer: str, engine: str) -> None:
        """Drop cached metadata of a peer engine (it restarted, say)."""
        for k in [k for k in self._cache if k[0] == peer and k[1] == engine]:
            del self._cache[k]

    @property
    def mailbox(self) -> Any:
        """This rank's mailbox region: a transfer armed with
        ``b2b.on_note(chan.mailbox, key)`` starts when a note queued here
        by a peer with ``key`` lands."""
        return self._mbox

    def queue(self, peer: str, engine: str, rank: int, note: dict,
              on_error: Optional[Callable[[Exception], None]] = None, key: Optional[bytes] = None) -> None:
        """Queue ``note`` for a peer rank until :meth:`flush`; ``on_error``
        gets the exception if its write fails (the peer is gone). With
        ``key``, the write that carries it is a key note naming ``key``: it
        starts the peer's transfers armed on it (b2b.notes) in its daemon."""
        self._out.setdefault((peer, engine, rank), []).append((encode(note), on_error, key))

    def flush(self) -> int:
        """Start every queued note, packed per peer rank into as few writes
        as fit, all in one call; returns the writes started. A write that
        fails (now, or later as seen by :meth:`reap`) calls the
        ``on_error`` of each of its notes; the other writes go on."""
        batch = self._pack()
        if batch is None:
            return 0
        with self._posting:
            started = self._start(batch[0])
        return self.flush_settle(started, batch[1])

    def flush_begin(self) -> Optional[Tuple[List[Any], List[List[Optional[Callable[[Exception], None]]]]]]:
        """:meth:`flush` in three parts, for a thread that starts the writes
        without the lock that guards the queue (the worker's), so that the
        engine's calls do not wait for them: here the queued notes are
        taken and their place in the order of writes is held (``None``:
        none queued); :meth:`flush_post` starts them, from any thread, and
        :meth:`flush_settle` (with the queue's lock again) keeps them."""
        batch = self._pack()
        if batch is not None:
            self._posting.acquire()
        return batch

    def flush_post(self, batch: Tuple[List[Any], List[Any]]) -> List[Any]:
        """Start the writes of ``batch`` (from :meth:`flush_begin`); their
        handles, or the exception that refused each."""
        try:
            return self._start(batch[0])
        finally:
            self._posting.release()

    def flush_settle(self, started: List[Any], cbs: List[List[Optional[Callable[[Exception], None]]]]) -> int:
        """Keep the started writes until they are seen to end (:meth:`reap`);
        a refused one calls its notes' ``on_error`` now. The writes started."""
        writes = 0
        for h, cb in zip(started, cbs):
            err = h if isinstance(h, BaseException) else (h.error if h.id == 0 else None)
            if err is not None:
                _call(cb, err)
                continue
            writes += 1
            # Kept until seen to end, callbacks or not: an outcome nobody
            # takes would stay in the client (and the daemon) for good.
            self._inflight.append((h, cb))
        return writes

    def _start(self, items: List[Any]) -> List[Any]:
        try:
            return list(self.client.start_many(items, self.timeout))
        except _SEND_ERRORS as e:
            return [e] * len(items)

    def _pack(self) -> Optional[Tuple[List[Any], List[List[Optional[Callable[[Exception], None]]]]]]:
        """The queued notes as writes, packed per peer rank (the queue is
        emptied), and each write's notes' callbacks; ``None``: none queued."""
        out, self._out = self._out, {}
        items: List[Any] = []
        cbs: List[List[Optional[Callable[[Exception], None]]]] = []
        for (peer, engine, rank), notes in out.items():
            i = 0
            while i < len(notes):
                keys = [notes[i][2]] if notes[i][2] else []
                j, size = i + 1, _ENVELOPE + len(notes[i][0]) + _keys_len(keys)
                while j < len(notes):
                    k = notes[j][2]
                    more = 1 + len(notes[j][0]) + (1 + len(k) + (len(b2b.notes.KEY_MAGIC) + 1 if not keys else 0) if k else 0)
                    if k in keys:
                        more -= 1 + len(k)
                    if size + more > NOTE_LIMIT or (k and k not in keys and len(keys) >= b2b.notes.MAX_KEYS):
                        break
                    size += more
                    if k and k not in keys:
                        keys.append(k)
                    j += 1
                body = notes[i][0] if j == i + 1 else b'{"t":"multi","n":[' + b",".join(n for n, _, _ in notes[i:j]) + b"]}"
                if keys:
                    body = b2b.key_note(keys, body)
                # No block: a note alone (b2bd sends it without a data path's write).
                items.append(b2b.Blocks(self._src_layout, peer, mbox_layout_name(engine, rank), [], [], op="write",
                                        notification=body, transport=self.transport))
                cbs.append([cb for _, cb, _ in notes[i:j]])
                i = j
        return (items, cbs) if items else None

    def arm(self, peer: str, engine: str, rank: int, notes: List[dict], key: bytes, after: Any) -> bool:
        """Start ``notes`` (one envelope, a key note naming ``key``) to a
        peer rank armed on ``after`` (:func:`b2b.on_note` of a region of
        ours): our daemon resolves it now and sends it the moment the key
        lands (:meth:`b2b.Client.notify_region`), with no call from here
        on the way. False if it did not start: send the notes as usual."""
        body = encode(notes[0]) if len(notes) == 1 else b'{"t":"multi","n":[' + b",".join(encode(n) for n in notes) + b"]}"
        body = b2b.key_note([key], body)
        if len(body) > NOTE_LIMIT:
            return False
        try:
            h = self.client.start_many([b2b.Blocks(self._src_layout, peer, mbox_layout_name(engine, rank), [], [], op="write",
                                                   notification=body, transport=self.transport, after=after)], self.timeout)[0]
        except _SEND_ERRORS:
            return False
        if h.id == 0:
            return False
        self._inflight.append((h, []))  # reaped as the other writes; a trigger that never came ends at its timeout
        return True

    @property
    def signals(self) -> Any:
        """The region our armed notes wait on (:meth:`arm`, :meth:`signal`):
        the scratch region, not exported, so only this rank fires them."""
        return self._scratch

    def signal(self, keys: List[bytes]) -> None:
        """Fire the notes armed on ``keys`` (:meth:`arm`): one local note,
        over the client's ring when it has one. Raises if the daemon refused."""
        self.client.notify_region(self._scratch, b2b.key_note(keys))

    def queued(self) -> bool:
        """Whether notes wait for :meth:`flush`."""
        return bool(self._out)

    def pending(self) -> List[Any]:
        """The note writes not yet seen to end (to poll with other handles)."""
        return [h for h, _ in self._inflight]

    def reap(self, poll: bool = True) -> None:
        """See which started note writes ended (``poll``: ask the daemon, in
        one call; else the handles were just polled); a failed one calls
        its notes' ``on_error``."""
        if not self._inflight:
            return
        if poll:
            try:
                self.client.poll(self.pending())
            except _SEND_ERRORS:
                return  # our daemon is unreachable: the connector's timeouts take over
        keep = []
        for h, cb in self._inflight:
            if h.state == "running":  # not h.outcome: that would make the message of each
                keep.append((h, cb))
            elif h.error is not None:
                _call(cb, h.error)
        self._inflight = keep

    def watch(self, region: Any) -> None:
        """Queue every note delivered to ``region`` (an exported region):
        over the client's ring when it has one (its notes come as the
        ring's completions, read by :meth:`pump`), else on a thread that
        reads a WatchNotifications stream."""
        ring = self.client.ring
        if ring is not None and hasattr(ring, "watch"):
            try:
                self._ring_watches.append((ring, ring.watch(region.id), region))
                return
            except (b2b.B2BError, ValueError):
                pass  # the stream then
        self._watch_stream(region)

    @property
    def on_ring(self) -> bool:
        """Whether notes come over the ring (someone must call pump)."""
        return bool(self._ring_watches)

    def pump(self) -> int:
        """Queue the notes the ring's watches received; how many. A watch
        whose ring ended goes over a stream from then on."""
        n = 0
        watches = list(self._ring_watches)
        by_ring: Dict[int, List[Tuple[Any, Any, Any]]] = {}
        for rw in watches:
            by_ring.setdefault(id(rw[0]), []).append(rw)
        for rws in by_ring.values():
            ring = rws[0][0]
            if ring.dead is None:
                for got in ring.take_all_notes([w for _, w, _ in rws]):
                    for x in got:
                        n += self._queue(x)
        for rw in watches:
            ring, w, region = rw
            if w.ended is not None or ring.dead is not None:
                with self._lock:
                    if rw in self._ring_watches:
                        self._ring_watches.remove(rw)
                        ring.cancel_watch(w)
                        try:
                            self._watch_stream(region)
                        except b2b.B2BError:
                            pass  # the daemon is gone: the connector's timeouts take over
        return n

    def _queue(self, n: Any) -> int:
        """Queue the notes of notification ``n``; how many."""
        body = n.notification
        keyed = b2b.parse_key_note(body)
        if keyed is not None:
            body = keyed[1]  # its keys were for the daemon
        try:
            note = json.loads(body)
        except ValueError:
            return 0  # not ours
        at = time.time_ns()  # when it reached this side (the worker's handover marks)
        if isinstance(note, dict) and note.get("t") == "multi":
            k = 0
            for x in note.get("n", ()):
                if isinstance(x, dict) and "t" in x:
                    x["_at"] = at
                    self.notes.put((n.sender, x))
                    k += 1
            return k
        if isinstance(note, dict) and "t" in note:
            note["_at"] = at
            self.notes.put((n.sender, note))
            return 1
        return 0

    def _watch_stream(self, region: Any) -> None:
        w = self.client.watch(region)
        t = threading.Thread(target=self._drain, args=(w,), name=f"b2b-connector-watch-{self.engine}.{self.rank}",
                             daemon=True)
        self._watches.append(w)
        self._threads.append(t)
        t.start()

    def _drain(self, w: Any) -> None:
        try:
            for n in w:
                if not self._queue(n):
                    continue
                cb = self.on_note
                if cb is not None:
                    cb()
        except b2b.B2BError:
            pass  # the daemon went away: the connector's timeouts take over

    def take(self) -> List[Tuple[str, dict]]:
        if self._ring_watches:
            self.pump()
        out = []
        while True:
            try:
                out.append(self.notes.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        for h, _ in self._inflight:  # armed notes never fired hold their trigger's region
            if h.outcome is None:
                try:
                    h.cancel()
                except _SEND_ERRORS:
                    pass
        for ring, w, _ in self._ring_watches:
            ring.cancel_watch(w)
        self._ring_watches = []
        for w in self._watches:
            w.cancel()
        for t in self._threads:
            t.join(timeout=2)
        for name in (self._src_layout, mbox_layout_name(self.engine, self.rank)):
            try:
                self.client.deregister_layout(name)
            except b2b.B2BError:
                pass
        for r in (self._meta, self._mbox, self._scratch):
            try:
                r.close()
            except b2b.B2BError:
                pass
