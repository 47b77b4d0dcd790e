"""The shared-memory submission ring from Python (docs/ring.md), without a
C extension: the socket hands over a memfd (SCM_RIGHTS), the mapping is
read and written with struct and ctypes, and the futex calls go through
libc's ``syscall``.

The layout, the records and the index protocol are internal/ring's: a
submission ring of 64-byte records (this process produces, the daemon
consumes) and a completion ring of 256-byte records (the other way), each
with a head, a tail and a sleep flag on cache lines of their own. Indices
run free (mod 2**32). A producer writes its records, then stores its tail,
then swaps the consumer's sleep flag to 0 and makes the wake syscall only
if it was set; a waiting consumer spins briefly, then sets its flag and
sleeps on the tail with FUTEX_WAIT (whose value check closes the race).

The memfd ends with the id arena (internal/ring/arena.go): a block record
with flag FLAG_ARENA points there at its ids (all local, then all remote,
little-endian u32) and its notification. This process allocates the arena
in publish order as a ring buffer (:class:`_Arena`); a record's space is
free again once the daemon's submission head passed the record, for the
daemon copies the ids and the note out before it moves its head.

Memory ordering: the tail store must not pass the record stores, and the
flag read must not pass the tail store. With libatomic both are seq-cst
atomics (``__atomic_exchange_4``). Without it, on x86-64 (whose stores are
not reordered with each other) the tail is a plain aligned store and
every publish makes the wake syscall, which orders it in the kernel;
elsewhere there is no ring and the client stays on gRPC.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import platform
import socket
import struct
import threading
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import grpc

from ._results import Notification
from .errors import MAX_TIMEOUT, B2BError, UnavailableError, check_timeout, error_for_code
from .notes import MAX_KEY_LEN

HELLO = 0x01676E6972623262  # "b2bring\x01": the tag of the daemon's answer frames
HELLO_ARENA = 0x02676E6972623262  # "b2bring\x02": the first frame that asks for a ring with an id arena
ANSWER_LEN = 48  # the raw answer frame: tag u64, code u32, msg_len u32, 32 bytes unused here
REC_LEN, COMP_LEN, COMP_HDR = 64, 256, 48
# A success's last 24 bytes: the daemon's trigger-seen, posted and landed
# times (Unix ns). A daemon before them wrote up to 208 bytes of message
# (MSG_MAX) on a refusal, so the times are read from a success only.
COMP_TIMES = COMP_LEN - 24
MSG_MAX = COMP_LEN - COMP_HDR
HDR_LEN, MAGIC, MAX_ENTRIES = 4096, 0x31474E52, 4096
OFF_MAGIC, OFF_SQN, OFF_CQN, OFF_ARENA = 0, 4, 8, 12
OFF_SQ_HEAD, OFF_SQ_TAIL, OFF_SQ_SLEEP = 64, 128, 192
OFF_CQ_HEAD, OFF_CQ_TAIL, OFF_CQ_SLEEP = 256, 320, 384

OP_PING, OP_SUBMIT, OP_CANCEL, OP_BLOCKS, OP_BATCH, OP_NOTIFY, OP_WATCH = 1, 2, 3, 4, 5, 6, 7
CODE_NOTE = 1 << 16  # a watch's note record (internal/ring/watch.go)
_BODY_LEN = {OP_PING: 0, OP_SUBMIT: 16, OP_CANCEL: 8}
_REC = struct.Struct("<QHHIQQQ24x")  # tag, op, flags, length, three body words, zeros
# A blocks record: tag, op, flags, length, route handle, timeout_ms u32,
# count u32, then MAX_INLINE_IDS (local, remote) u32 pairs, unused ones zero.
MAX_INLINE_IDS = 4
_BLOCKS = struct.Struct("<QHHIQII%dI" % (2 * MAX_INLINE_IDS))
MAX_TIMEOUT_MS = 86_400_000  # a submit's deadline, as the gRPC metadata's
# A blocks record with its ids (and note) in the arena: tag, op, flags
# (FLAG_ARENA), length 40, route handle, timeout_ms u32, count u32, ids_off,
# note_off, note_len u32, reserved u32, zeros.
FLAG_ARENA = 1
_ARENA_REC = struct.Struct("<QHHIQIIQQII8x")
# With FLAG_NOTE too, the transfer waits in the daemon for a key note
# (b2b.notes): length 48, the reserved word is trig_len, then trig_off u64;
# the trigger in the arena: region_len u16, key_len u8, 0, region id, key.
FLAG_NOTE = 2
_ARMED_REC = struct.Struct("<QHHIQIIQQIIQ")
ARENA_UNIT, DEFAULT_ARENA, MAX_ARENA = 4096, 1 << 20, 192 << 20
MAX_ARENA_IDS = 1 << 24  # TransferBlocks' limit of ids per request
MAX_NOTE = 4096  # TransferBlocks' notification limit
MAX_TRIG_REGION = 1024  # a trigger's region id (internal/ring/arena.go, MaxTrigRegion)
# A batch record (always FLAG_ARENA): tag, op, flags, length 16, blob_off,
# blob_len u32, timeout_ms u32, zeros. Its blob (internal/ring/batch.go):
# op u32, the lengths of src_region_id, peer, dst_region and transport_name
# u16 each, the notification's u32, block_length u64, the three packed
# descriptor arrays' lengths u32 each, reserved u32; then the strings, the
# notification and the arrays, back to back.
_BATCH_REC = struct.Struct("<QHHIQII32x")
_BATCH_HDR = struct.Struct("<IHHHHIQIIII")
MAX_BATCH_STRING = 1024
# A successful completion's message is the transport that carried it: the
# known names are looked up, not decoded.
_KIND_NAMES = {b"tcp": "tcp", b"local": "local", b"verbs": "verbs"}
_COMP = struct.Struct("<QIIQQQQ")  # tag, code, msg_len, blocks, bytes, wire_ns, total_ns
_TIMES = struct.Struct("<QQQ")  # at COMP_TIMES: trigger seen, posted, landed
# A success's figures (internal/ring/record.go): at COMP_EXT, past the room
# of its transport's name, magic u32, 0 u32, segments, work_requests, then
# the validate, resolve, plan, post, notify and armed phases (ns); a daemon
# before them wrote none (no magic).
COMP_EXT, EXT_NAME_MAX, EXT_MAGIC = COMP_HDR + 64, 64, 0x31534850
_EXT = struct.Struct("<II8Q")

# Busy-wait before the futex, as the Go side (internal/ring.Spin): only
# where there are more than 2 CPUs to spin on.
SPIN = 200e-6 if len(os.sched_getaffinity(0)) > 2 else 0.0
NAP_NS = 50_000_000  # a sleeping waiter rechecks the daemon's liveness this often

_CODE_BY_VALUE = {c.value[0]: c for c in grpc.StatusCode}
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower())
_X86 = platform.machine().lower() in ("x86_64", "amd64")


class RingUnavailable(Exception):
    """No ring here (no socket, refused, unsupported platform): use gRPC."""


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load_libs() -> Tuple[Optional[ctypes.CDLL], Optional[ctypes.CDLL]]:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.syscall.restype = ctypes.c_long
    atomic = None
    name = ctypes.util.find_library("atomic")
    if name:
        try:
            atomic = ctypes.CDLL(name)
            atomic.__atomic_exchange_4.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int]
            atomic.__atomic_exchange_4.restype = ctypes.c_uint32
        except (OSError, AttributeError):
            atomic = None
    return libc, atomic


_libs: Optional[Tuple[Optional[ctypes.CDLL], Optional[ctypes.CDLL]]] = None


def _libraries() -> Tuple[ctypes.CDLL, Optional[ctypes.CDLL]]:
    global _libs
    if _libs is None:
        _libs = _load_libs()
    libc, atomic = _libs
    if _SYS_FUTEX is None or (atomic is None and not _X86):
        raise RingUnavailable(f"no ring on {platform.machine()} without libatomic")
    return libc, atomic


_SEQ_CST = 5


class _Queue:
    """One direction of the ring, seen from this process."""

    def __init__(self, base: int, mm: mmap.mmap, off_head: int, off_tail: int, off_sleep: int,
                 recs: int, n: int, rec_len: int, libc: ctypes.CDLL, atomic: Optional[ctypes.CDLL]) -> None:
        self.mm, self.recs, self.n, self.rec_len = mm, recs, n, rec_len
        self.head_addr, self.tail_addr, self.sleep_addr = base + off_head, base + off_tail, base + off_sleep
        # Aligned 32-bit loads and stores; on x86-64 loads are acquire and
        # stores release (TSO).
        self.head = ctypes.c_uint32.from_address(self.head_addr)
        self.tail = ctypes.c_uint32.from_address(self.tail_addr)
        self.sleep = ctypes.c_uint32.from_address(self.sleep_addr)
        self._libc = libc
        # getattr: a dunder name written in a class body would be mangled.
        self._xchg = None if atomic is None else getattr(atomic, "__atomic_exchange_4")

    def slot(self, i: int) -> int:
        return self.recs + (i & (self.n - 1)) * self.rec_len

    def publish(self, tail: int) -> None:
        """Make the records before tail visible and wake a sleeping consumer."""
        xchg = self._xchg
        if xchg is not None:
            xchg(self.tail_addr, tail, _SEQ_CST)
            if xchg(self.sleep_addr, 0, _SEQ_CST) != 0:
                self.wake()
        else:
            self.tail.value = tail
            self.wake()  # no store-load fence without libatomic: the syscall orders it

    def consumed(self, head: int) -> None:
        self.head.value = head  # the daemon only reads it to find room

    def wake(self) -> None:
        self._libc.syscall(_SYS_FUTEX, ctypes.c_void_p(self.tail_addr), 1, 0x7FFFFFFF, None, None, 0)

    def wait(self, seen: int, spin: float, timeout_ns: int) -> None:
        """Return once the tail differs from seen, after spinning up to spin
        seconds, then sleeping up to timeout_ns (spurious returns are fine)."""
        tail = self.tail
        if spin > 0:
            end = time.perf_counter() + spin
            while True:
                for _ in range(16):
                    if tail.value != seen:
                        return
                if time.perf_counter() > end:
                    break
                os.sched_yield()
        self.sleep.value = 1  # FUTEX_WAIT's value check, after a full barrier, closes the race
        if tail.value != seen:
            return
        ts = _Timespec(timeout_ns // 1_000_000_000, timeout_ns % 1_000_000_000)
        self._libc.syscall(_SYS_FUTEX, ctypes.c_void_p(self.tail_addr), 0, ctypes.c_uint32(seen), ctypes.byref(ts), None, 0)


class _Arena:
    """The id arena's allocator (see the module's doc): bytes in
    [head, tail) (positions that run on, mod size) belong to records the
    daemon may not have taken yet; a payload never wraps."""

    __slots__ = ("off", "size", "head", "tail", "spans")

    def __init__(self, off: int, size: int) -> None:
        self.off, self.size = off, size
        self.head = self.tail = 0
        self.spans: List[Tuple[int, int]] = []  # (record index, end), oldest first

    def reclaim(self, sq_head: int) -> None:
        spans, i = self.spans, 0
        while i < len(spans) and 0 < ((sq_head - spans[i][0]) & 0xFFFFFFFF) < 0x80000000:
            self.head = spans[i][1]
            i += 1
        if i:
            del spans[:i]
        if not spans:
            self.head = self.tail = 0

    def place(self, n: int, rec: int, sq_head: int) -> Optional[int]:
        """Reserve n bytes (8-aligned) for the record at index rec; the
        arena offset, or ``None`` while records not taken hold the room."""
        self.reclaim(sq_head)
        n = (n + 7) & ~7
        size = self.size
        if n > size:
            return None
        pos = self.tail
        off = pos % size
        if off + n > size:
            pos += size - off
        if pos + n - self.head > size:
            return None
        self.tail = pos + n
        self.spans.append((rec, self.tail))
        return pos % size


class Completion:
    """A completion record: ``code`` 0 is done."""

    __slots__ = ("tag", "code", "msg", "blocks", "bytes", "wire_ns", "total_ns",
                 "trigger_seen_unix_ns", "posted_unix_ns", "landed_unix_ns", "figures")

    def __init__(self, tag: int, code: int, msg: str, blocks: int, nbytes: int, wire_ns: int, total_ns: int,
                 times: Tuple[int, int, int] = (0, 0, 0), figures: Optional[Tuple[int, ...]] = None) -> None:
        self.tag, self.code, self.msg = tag, code, msg
        self.blocks, self.bytes, self.wire_ns, self.total_ns = blocks, nbytes, wire_ns, total_ns
        self.trigger_seen_unix_ns, self.posted_unix_ns, self.landed_unix_ns = times
        # A success's (segments, work_requests, validate_ns, resolve_ns,
        # plan_ns, post_ns, notify_ns, armed_ns); None: the daemon gave none.
        self.figures = figures

    def error(self) -> Optional[B2BError]:
        """The exception SubmitTransfer would have raised; ``None`` if done."""
        if self.code == 0:
            return None
        return error_for_code(_CODE_BY_VALUE.get(self.code, grpc.StatusCode.UNKNOWN), self.msg)


def _answer_error(sock: socket.socket, ans: bytes) -> Optional[B2BError]:
    tag, code, n = struct.unpack_from("<QII", ans)
    if tag != HELLO:
        raise RingUnavailable(f"ring answer tag {tag:#x}, want {HELLO:#x}")
    if code == 0 and n == 0:
        return None
    if n > MSG_MAX:
        raise RingUnavailable(f"ring answer message of {n} bytes, limit {MSG_MAX}")
    msg = _read_full(sock, n)
    return error_for_code(_CODE_BY_VALUE.get(code, grpc.StatusCode.UNKNOWN), msg.decode("utf-8", "replace"))


def _read_full(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        b = sock.recv(n - len(out))
        if not b:
            raise ConnectionError("the daemon closed the submit socket")
        out += b
    return out


class Ring:
    """A ring pair the daemon handed out on its submit socket at ``path``.

    Thread-safe. Every posted tag must be waited for (:meth:`wait`). Errors
    are :class:`~b2b.errors.B2BError` subclasses with the code and message
    SubmitTransfer gives (messages cut at 184 bytes, ending with
    ``...[truncated]``).
    """

    def __init__(self, path: str, entries: int = 0, connect_timeout: float = 5.0, arena: int = 0) -> None:
        libc, atomic = _libraries()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        fd = -1
        try:
            sock.settimeout(connect_timeout)
            try:
                sock.connect(path)
                # sq entries in bits 0-15, the arena in 4 KiB units in
                # 16-31, cq entries in 32-47 (0: the daemon's default).
                sock.sendall(struct.pack("<QQ", HELLO_ARENA, (entries & 0xFFFF) | ((arena // ARENA_UNIT) & 0xFFFF) << 16 | (entries & 0xFFFF) << 32))
                ans, fds, _, _ = socket.recv_fds(sock, ANSWER_LEN, 1)
                if fds:
                    fd = fds[0]
                    for extra in fds[1:]:
                        os.close(extra)
                if not ans:
                    raise RingUnavailable(f"submit socket {path}: closed without an answer")
                ans += _read_full(sock, ANSWER_LEN - len(ans))
                err = _answer_error(sock, ans)
                if err is not None:
                    raise err
                if fd < 0:
                    raise RingUnavailable("ring answer carried no memfd")
                self._mm = self._map(fd)
            except (OSError, ValueError) as e:  # not a submit socket, gone, or a mapping refused
                raise RingUnavailable(f"submit socket {path}: {e}") from e
        except BaseException:
            sock.close()
            raise
        finally:
            if fd >= 0:
                os.close(fd)
        sock.settimeout(None)
        self._sock = sock
        self.path = path
        self.pid = os.getpid()
        mm = self._mm
        sq, cq, arena_len = struct.unpack_from("<III", mm, OFF_SQN)
        self._anchor = ctypes.c_char.from_buffer(mm)  # the mapping's address; pins it while this object lives
        base = ctypes.addressof(self._anchor)
        self.sq = _Queue(base, mm, OFF_SQ_HEAD, OFF_SQ_TAIL, OFF_SQ_SLEEP, HDR_LEN, sq, REC_LEN, libc, atomic)
        self.cq = _Queue(base, mm, OFF_CQ_HEAD, OFF_CQ_TAIL, OFF_CQ_SLEEP, HDR_LEN + sq * REC_LEN, cq, COMP_LEN, libc, atomic)
        self.entries = (sq, cq)
        self.arena = _Arena(HDR_LEN + sq * REC_LEN + cq * COMP_LEN, arena_len)
        self._sq_tail = self.sq.tail.value
        self._cq_head = self.cq.head.value
        self._tag = 0
        self._sq_lock = threading.Lock()
        self._cq_lock = threading.Lock()
        self._pending: Set[int] = set()
        self._done: Dict[int, Completion] = {}
        self._watches: Dict[int, "_WatchState"] = {}  # by tag (watch)
        # Set once the ring ended (close, or the daemon dropped it): every
        # operation raises it. The mapping itself goes with this object, so
        # an operation still running never touches unmapped memory.
        self._dead: Optional[B2BError] = None
        self._watcher = threading.Thread(target=self._watch, name="b2b-ring-watch", daemon=True)
        self._watcher.start()

    @staticmethod
    def _map(fd: int) -> mmap.mmap:
        size = os.fstat(fd).st_size
        limit = HDR_LEN + MAX_ENTRIES * (REC_LEN + COMP_LEN) + MAX_ARENA
        if size < HDR_LEN or size > limit:
            raise RingUnavailable(f"ring fd is {size} bytes, want {HDR_LEN} to {limit}")
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        magic, sq, cq, arena = struct.unpack_from("<IIII", mm, OFF_MAGIC)
        ok = all(2 <= n <= MAX_ENTRIES and n & (n - 1) == 0 for n in (sq, cq))
        ok = ok and (arena == 0 or ARENA_UNIT <= arena <= MAX_ARENA and arena % ARENA_UNIT == 0)
        if not ok or magic != MAGIC or HDR_LEN + sq * REC_LEN + cq * COMP_LEN + arena != size:
            mm.close()
            raise RingUnavailable(f"ring header magic {magic:#x}, {sq}+{cq} entries and {arena} arena bytes in {size} bytes: not a ring")
        return mm

    # -- life ----------------------------------------------------------------

    def _watch(self) -> None:
        """Wait for the daemon to drop the ring (or for close); wake the waiters."""
        err: B2BError = UnavailableError(grpc.StatusCode.UNAVAILABLE, "b2b client: ring is closed")
        try:
            ans = _read_full(self._sock, ANSWER_LEN)
            why = _answer_error(self._sock, ans)
            if why is not None:
                err = error_for_code(why.code, f"b2b client: the daemon dropped the ring: {why.message}")
        except (OSError, RingUnavailable):
            pass
        if self._dead is None:
            self._dead = err
        self.cq.wake()

    @property
    def dead(self) -> Optional[B2BError]:
        """Why the ring ended; ``None`` while it serves."""
        return self._dead

    def close(self) -> None:
        """End the ring: operations in progress raise UnavailableError. Safe twice."""
        if self._dead is None:
            self._dead = UnavailableError(grpc.StatusCode.UNAVAILABLE, "b2b client: ring is closed")
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._watcher.join()
        self._sock.close()
        self.cq.wake()  # waiters see _dead

    def __enter__(self) -> "Ring":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- posting -------------------------------------------------------------

    def _post(self, reqs: Sequence[Tuple[Any, ...]], watch: Optional["_WatchState"] = None) -> List[int]:
        """Post (op, word0, word2) records with one publish; their tags. A
        submit's word2 is its deadline in ms (0: none; the body is then 16
        bytes, else 24). A blocks record is (OP_BLOCKS, route, timeout_ms,
        pairs): pairs a flat list local0, remote0, ... of 1 to
        MAX_INLINE_IDS pairs. ``watch``: the one record is that watch's
        (its tag's completions go to it, from before the record is seen)."""
        if self._dead is not None:
            raise self._dead
        with self._cq_lock:
            tags = []
            for _ in reqs:
                self._tag += 1
                tags.append(self._tag)
            if watch is not None:
                watch.tag = tags[0]
                self._watches[watch.tag] = watch
            else:
                self._pending.update(tags)
            self._drain()  # a caller that posts much before it waits must not overrun the completions
        mm, q = self._mm, self.sq
        i = 0
        try:
            with self._sq_lock:
                while i < len(reqs):
                    if self._dead is not None:
                        raise self._dead
                    h = q.head.value
                    used = (self._sq_tail - h) & 0xFFFFFFFF
                    if used > q.n:
                        raise error_for_code(grpc.StatusCode.INTERNAL, f"ring head {h} against tail {self._sq_tail} of {q.n} entries")
                    free = q.n - used
                    if free == 0:
                        self._pause()
                        continue
                    wrote = 0
                    for _ in range(min(free, len(reqs) - i)):
                        op, w0, w2 = reqs[i][:3]
                        if op in (OP_BATCH, OP_NOTIFY, OP_WATCH):
                            if not self._put_batch(tags[i], w2, reqs[i][3], q, op):
                                break  # the arena is full of records not taken: publish, wait
                        elif op == OP_BLOCKS and len(reqs[i]) > 4:  # in the arena
                            if not self._put_arena(tags[i], reqs[i], q):
                                break  # the arena is full of records not taken: publish, wait
                        elif op == OP_BLOCKS:
                            pairs = reqs[i][3]
                            k = len(pairs) // 2
                            _BLOCKS.pack_into(mm, q.slot(self._sq_tail), tags[i], op, 0, 16 + 8 * k, w0, w2, k,
                                              *pairs, *((0,) * (2 * MAX_INLINE_IDS - len(pairs))))
                        else:
                            n = 24 if w2 else _BODY_LEN[op]
                            _REC.pack_into(mm, q.slot(self._sq_tail), tags[i], op, 0, n, w0, 0, w2)
                        self._sq_tail = (self._sq_tail + 1) & 0xFFFFFFFF
                        i += 1
                        wrote += 1
                    if wrote:
                        q.publish(self._sq_tail)
                    else:
                        self._pause()
        except BaseException:
            with self._cq_lock:
                self._pending.difference_update(tags[i:])
                if watch is not None and i == 0:
                    self._watches.pop(watch.tag, None)  # not posted: forget it
            raise
        return tags

    def _pause(self) -> None:
        """No room for the next record yet: let the daemon go on."""
        if self._cq_lock.acquire(blocking=False):
            try:
                self._drain()  # the daemon may wait for room in ours
            finally:
                self._cq_lock.release()
        time.sleep(20e-6)

    def _put_arena(self, tag: int, req: Tuple[Any, ...], q: _Queue) -> bool:
        """Write an arena blocks record (OP_BLOCKS, route, timeout_ms,
        count, ids, note): ids the packed local then remote ids."""
        _, route, ms, count, ids, note, trig = req
        n = len(ids)
        off = self.arena.place(n + len(note) + len(trig), self._sq_tail, q.head.value)
        if off is None:
            return False
        mm, base = self._mm, self.arena.off + off
        mm[base:base + n] = ids
        if note:
            mm[base + n:base + n + len(note)] = note
        if trig:
            t = base + n + len(note)
            mm[t:t + len(trig)] = trig
            _ARMED_REC.pack_into(mm, q.slot(self._sq_tail), tag, OP_BLOCKS, FLAG_ARENA | FLAG_NOTE, 48, route, ms, count,
                                 off, off + n, len(note), len(trig), off + n + len(note))
            return True
        _ARENA_REC.pack_into(mm, q.slot(self._sq_tail), tag, OP_BLOCKS, FLAG_ARENA, 40, route, ms, count, off, off + n, len(note), 0)
        return True

    def _put_batch(self, tag: int, ms: int, blob: bytes, q: _Queue, op: int = OP_BATCH) -> bool:
        """Write a batch record and its blob (batch_blob) to the arena; or,
        op OP_NOTIFY or OP_WATCH, one of those (ms 0: their reserved word)."""
        off = self.arena.place(len(blob), self._sq_tail, q.head.value)
        if off is None:
            return False
        base = self.arena.off + off
        self._mm[base:base + len(blob)] = blob
        _BATCH_REC.pack_into(self._mm, q.slot(self._sq_tail), tag, op, FLAG_ARENA, 16, off, len(blob), ms)
        return True

    def start_batch(self, blob: bytes, timeout_ms: int = 0) -> int:
        """Post an ad hoc batch (a BatchTransfer; ``blob`` from
        :func:`batch_blob`); its tag for :meth:`wait`."""
        if not 0 <= timeout_ms <= MAX_TIMEOUT_MS:
            raise ValueError(f"timeout_ms {timeout_ms}: want 0 to {MAX_TIMEOUT_MS}")
        if not self.fits(len(blob), 0):
            raise ValueError(f"a batch of {len(blob)} bytes: over the ring's arena of {self.arena.size} bytes")
        return self._post([(OP_BATCH, 0, timeout_ms, blob)])[0]

    def fits(self, id_bytes: int, note_len: int) -> bool:
        """Whether a record's ids (packed, both sides) and note fit the arena."""
        return ((id_bytes + note_len + 7) & ~7) <= self.arena.size

    def _drain(self) -> int:
        """Move completions out of the ring (under _cq_lock); the tail seen."""
        q, mm = self.cq, self._mm
        tail = q.tail.value
        head = self._cq_head
        while head != tail:
            off = q.slot(head)
            tag, code, n, blocks, nbytes, wire, total = _COMP.unpack_from(mm, off)
            w = self._watches.get(tag)
            if w is not None:
                if code == CODE_NOTE:
                    if n <= MSG_MAX:
                        w.part(mm[off + COMP_HDR:off + COMP_HDR + n], blocks, nbytes, wire, total)
                    head = (head + 1) & 0xFFFFFFFF
                    continue
                msg = mm[off + COMP_HDR:off + COMP_HDR + min(n, MSG_MAX)].decode("utf-8", "replace")
                w.ended = Completion(tag, code, msg, blocks, nbytes, wire, total).error()
                del self._watches[tag]
                head = (head + 1) & 0xFFFFFFFF
                continue
            if n == 0:
                msg = ""
            elif n > MSG_MAX:
                code, msg = grpc.StatusCode.INTERNAL.value[0], f"completion message length {n}, limit {MSG_MAX}"
            else:
                raw = mm[off + COMP_HDR:off + COMP_HDR + n]
                msg = _KIND_NAMES.get(raw) if code == 0 else None  # a success names its transport
                if msg is None:
                    msg = raw.decode("utf-8", "replace")
            if tag in self._pending:
                times, figures = (0, 0, 0), None
                if code == 0:
                    times = _TIMES.unpack_from(mm, off + COMP_TIMES)
                    if n <= EXT_NAME_MAX:
                        x = _EXT.unpack_from(mm, off + COMP_EXT)
                        if x[0] == EXT_MAGIC:
                            figures = x[2:]
                self._done[tag] = Completion(tag, code, msg, blocks, nbytes, wire, total, times, figures)
            head = (head + 1) & 0xFFFFFFFF
        if head != self._cq_head:
            self._cq_head = head
            q.consumed(head)
        return tail

    # -- operations ----------------------------------------------------------

    def start(self, handle: int, timeout_ms: int = 0) -> int:
        """Post a submit of the prepared plan ``handle``; its tag for
        :meth:`wait`. ``timeout_ms``: the caller's deadline, which the daemon
        keeps as it keeps a gRPC submit's (0: the daemon's default)."""
        return self.start_many([handle], timeout_ms)[0]

    def start_many(self, handles: Iterable[int], timeout_ms: int = 0) -> List[int]:
        """Post a submit of every plan with one publish (one wake at most)."""
        if not 0 <= timeout_ms <= MAX_TIMEOUT_MS:
            raise ValueError(f"timeout_ms {timeout_ms}: want 0 to {MAX_TIMEOUT_MS}")
        return self._post([(OP_SUBMIT, int(h), timeout_ms) for h in handles])

    def start_blocks(self, route: int, local_ids: Sequence[int], remote_ids: Sequence[int], timeout_ms: int = 0) -> int:
        """Post a block transfer on the bound route ``route``
        (BindBlockRoute): block ``local_ids[i]`` to ``remote_ids[i]``, 1 to
        MAX_INLINE_IDS pairs; its tag for :meth:`wait`."""
        if not 0 <= timeout_ms <= MAX_TIMEOUT_MS:
            raise ValueError(f"timeout_ms {timeout_ms}: want 0 to {MAX_TIMEOUT_MS}")
        if len(local_ids) != len(remote_ids) or not 1 <= len(local_ids) <= MAX_INLINE_IDS:
            raise ValueError(f"{len(local_ids)} local and {len(remote_ids)} remote ids: a ring record carries 1 to {MAX_INLINE_IDS} pairs")
        pairs = [int(x) for ab in zip(local_ids, remote_ids) for x in ab]
        return self._post([(OP_BLOCKS, int(route), timeout_ms, pairs)])[0]

    def start_blocks_many(self, reqs: Sequence[Tuple[Any, ...]]) -> List[int]:
        """Post block transfers with one publish: each (route, timeout_ms,
        local_ids, remote_ids, note[, trigger]), ids as equal-length
        little-endian uint32 numpy arrays (or lists of 1 to MAX_INLINE_IDS
        ints with no note: those ride in the record). Beyond MAX_INLINE_IDS
        pairs, or with a note or a trigger (key_trigger's bytes: the
        transfer waits in the daemon for that key note), the ids, the note
        and the trigger go to the arena. Their tags."""
        recs: List[Tuple[Any, ...]] = []
        for route, ms, lids, rids, note, *more in reqs:
            trig = bytes(more[0]) if more and more[0] else b""
            if not 0 <= ms <= MAX_TIMEOUT_MS:
                raise ValueError(f"timeout_ms {ms}: want 0 to {MAX_TIMEOUT_MS}")
            k = len(lids)
            if k != len(rids) or not (1 if not note else 0) <= k <= MAX_ARENA_IDS or len(note) > MAX_NOTE:
                raise ValueError(f"{k} local and {len(rids)} remote ids, a {len(note)}-byte note: a ring record carries "
                                 f"1 to {MAX_ARENA_IDS} pairs (or none, with a note) and up to {MAX_NOTE} bytes")
            if k <= MAX_INLINE_IDS and not note and not trig:
                pairs = [int(lids[0]), int(rids[0])] if k == 1 else [int(x) for ab in zip(lids, rids) for x in ab]
                recs.append((OP_BLOCKS, int(route), ms, pairs))
                continue
            ids = bytes(lids) + bytes(rids) if isinstance(lids, (bytes, bytearray)) else lids.tobytes() + rids.tobytes()
            if not self.fits(len(ids), len(note) + len(trig)):
                raise ValueError(f"{k} id pairs and a {len(note)}-byte note: over the ring's arena of {self.arena.size} bytes")
            recs.append((OP_BLOCKS, int(route), ms, k, ids, bytes(note), trig))
        return self._post(recs)

    def cancel(self, tag: int, timeout: Optional[float] = None) -> None:
        """Cancel the submit under tag (its wait then reports CANCELLED).
        ``timeout``: seconds to wait for the daemon to take the cancel
        (``None``: no limit); past it, DeadlineExceededError."""
        (t,) = self._post([(OP_CANCEL, int(tag), 0)])
        c = self.wait(t, limit=timeout)
        if c is None:
            self.forget(t)
            raise error_for_code(grpc.StatusCode.DEADLINE_EXCEEDED,
                                 f"b2b client: ring cancel of record {tag}: the daemon did not take it in {timeout} s (stopped or hung?)")
        err = c.error()
        if err is not None:
            raise err

    def notify(self, region_id: str, note: bytes, timeout: Optional[float] = None) -> int:
        """NotifyRegion through the ring: ``note`` to the caller's region
        ``region_id``, its key note firing the transfers armed there on its
        keys; returns the watchers that got it. Raises the daemon's refusal,
        or DeadlineExceededError when the daemon has not answered within
        ``timeout`` seconds (``None``: no limit)."""
        blob = notify_blob(region_id, note)
        if not self.fits(len(blob), 0):
            raise ValueError(f"a {len(blob)}-byte notify: over the ring's arena of {self.arena.size} bytes")
        (t,) = self._post([(OP_NOTIFY, 0, 0, blob)])
        c = self.wait(t, limit=timeout)
        if c is None:
            self.forget(t)  # a note cannot be taken back
            raise error_for_code(grpc.StatusCode.DEADLINE_EXCEEDED,
                                 f"b2b client: ring notify of region {region_id}: the daemon did not answer in {timeout} s (stopped or hung?)")
        err = c.error()
        if err is not None:
            raise err
        return c.blocks

    def watch(self, region_id: str, timeout: float = 10.0) -> "_WatchState":
        """Subscribe this ring to the notes of one of the caller's exported
        regions (op watch): they come back as completions, read by
        :meth:`take_notes`. Returns once subscribed; raises the daemon's
        refusal."""
        timeout = check_timeout(timeout)
        blob = region_id.encode()
        if not 1 <= len(blob) <= MAX_TRIG_REGION:
            raise ValueError(f"region id of {len(blob)} bytes: want 1 to {MAX_TRIG_REGION}")
        w = _WatchState(region_id)
        self._post([(OP_WATCH, 0, 0, blob)], watch=w)
        end = None if timeout is None else time.monotonic() + timeout
        while not w.subscribed and w.ended is None:
            seen = self.completion_tail()
            with self._cq_lock:
                self._drain()
            if w.subscribed or w.ended is not None:
                break
            left = 0.05 if end is None else end - time.monotonic()
            if left <= 0:
                self.cancel_watch(w)
                raise error_for_code(grpc.StatusCode.DEADLINE_EXCEEDED, f"ring watch of {region_id}: not subscribed in {timeout} s")
            self.wait_completion(seen, min(left, 0.05))
        if w.ended is not None:
            raise w.ended
        return w

    def take_notes(self, w: "_WatchState") -> List[Any]:
        """The notes of watch ``w`` that arrived (Notification objects)."""
        return self.take_all_notes([w])[0]

    def take_all_notes(self, ws: Sequence["_WatchState"]) -> List[List[Any]]:
        """take_notes of each watch of ``ws``, with one look at the ring."""
        with self._cq_lock:
            self._drain()
            out = []
            for w in ws:
                out.append(w.notes)
                w.notes = []
        return out

    def cancel_watch(self, w: "_WatchState") -> None:
        """End watch ``w`` (its notes stop; a note already in is kept)."""
        with self._cq_lock:
            live = w.tag in self._watches
        if live and self._dead is None:
            try:
                (t,) = self._post([(OP_CANCEL, w.tag, 0)])
                self.forget(t)
            except B2BError:
                pass

    def ping(self) -> None:
        """One empty round trip through the daemon."""
        (t,) = self._post([(OP_PING, 0, 0)])
        err = self.wait(t).error()
        if err is not None:
            raise err

    def poll(self, tags: Iterable[int]) -> Dict[int, Completion]:
        """The completions among tags that arrived, without waiting; each is
        handed out once (the tag is then no longer in flight)."""
        with self._cq_lock:
            self._drain()
            out = {}
            for t in tags:
                c = self._done.pop(t, None)
                if c is not None:
                    self._pending.discard(t)
                    out[t] = c
            return out

    def wait(self, tag: int, timeout: Optional[float] = None, *, limit: Optional[float] = None) -> Optional[Completion]:
        """The completion of tag; ``None`` if it did not come within timeout
        seconds (the tag stays in flight). ``limit`` (seconds) bounds the
        fast one-tag wait of a synchronous call alike: the daemon answers a
        record at its deadline, so only a daemon that stopped (SIGSTOP, a
        hang) leaves it waiting past its deadline and a grace."""
        if timeout is not None and check_timeout(timeout, wait=True) is not None:  # math.inf: None
            return self.wait_many([tag], timeout)[tag]
        # One tag and no deadline, a synchronous call's wait: wait_many's
        # lists and dicts were a tenth of a ring block transfer's Python time.
        end = None if limit is None else time.monotonic() + limit
        while True:
            with self._cq_lock:
                seen = self._drain()
                c = self._take(tag)
                if c is not None:
                    return c
                self._raise_if_dead((tag,))
            nap = NAP_NS
            if end is not None:
                left = end - time.monotonic()
                if left <= 0:
                    return None
                nap = min(NAP_NS, int(left * 1e9) + 1)
            self.cq.wait(seen, SPIN, nap)

    def wait_many(self, tags: Sequence[int], timeout: Optional[float] = None) -> Dict[int, Optional[Completion]]:
        """Wait for every tag's completion (up to timeout seconds in all):
        tag -> Completion, or ``None`` for one still in flight then."""
        timeout = check_timeout(timeout, wait=True)
        end = None if timeout is None else time.monotonic() + timeout
        want = list(tags)
        out: Dict[int, Optional[Completion]] = {}
        while True:
            with self._cq_lock:
                seen = self._drain()
                for t in want:
                    if t not in out:
                        c = self._take(t)
                        if c is not None:
                            out[t] = c
                if len(out) == len(want):
                    return out
                self._raise_if_dead(t for t in want if t not in out)
            left_ns = NAP_NS
            if end is not None:
                left = end - time.monotonic()
                if left <= 0:
                    for t in want:
                        out.setdefault(t, None)
                    return out
                left_ns = min(NAP_NS, int(left * 1e9) + 1)
            self.cq.wait(seen, SPIN, left_ns)

    def _take(self, tag: int) -> Optional[Completion]:
        """tag's completion if it came (handed out once), under _cq_lock;
        raises if tag is not in flight."""
        if tag not in self._pending:
            raise error_for_code(grpc.StatusCode.FAILED_PRECONDITION, f"b2b client: ring tag {tag} is not in flight")
        c = self._done.pop(tag, None)
        if c is not None:
            self._pending.discard(tag)
        return c

    def _raise_if_dead(self, waiting: Iterable[int]) -> None:
        """Once the ring ended, the tags still waited for leave flight and
        its error is raised (under _cq_lock)."""
        if self._dead is not None:
            self._pending.difference_update(waiting)
            raise self._dead

    def completion_tail(self) -> int:
        """Where the completion ring's producer is: for wait_completion."""
        return self.cq.tail.value

    def wait_completion(self, seen: int, timeout: float) -> int:
        """Sleep until a completion arrives after tail ``seen`` (without
        taking it: poll and wait take completions), at most ``timeout``
        seconds; returns the tail then. For a thread that wakes an engine
        loop when any of its transfers ended."""
        t = check_timeout(timeout, wait=True)
        if self._dead is None:
            self.cq.wait(seen, 0.0, max(1, int((MAX_TIMEOUT if t is None else t) * 1e9)))
        return self.cq.tail.value

    def abandon(self, tag: int) -> None:
        """Give up on tag (its daemon did not answer in time): post its
        cancel without waiting for it, so that a daemon that resumes stops
        the record rather than runs it, and forget both."""
        if self._dead is None:
            try:
                (t,) = self._post([(OP_CANCEL, int(tag), 0)])
                self.forget(t)
            except B2BError:
                pass
        self.forget(tag)

    def forget(self, tag: int) -> None:
        """Stop tracking tag: its completion, when it comes, is dropped."""
        with self._cq_lock:
            self._pending.discard(tag)
            self._done.pop(tag, None)


def batch_blob(req: Any, transport_name: str) -> Optional[bytes]:
    """A BatchTransferRequest (its transport by name) as a batch record's
    blob; ``None`` when a string is longer than a ring batch carries (gRPC
    then answers it)."""
    strs = [req.src_region_id.encode(), req.peer.encode(), req.dst_region.encode(), transport_name.encode()]
    if any(len(x) > MAX_BATCH_STRING for x in strs) or len(req.notification) > MAX_NOTE:
        return None
    d = req.descriptors
    src, dst, lens = d.src_offsets, d.dst_offsets, d.lengths
    hdr = _BATCH_HDR.pack(req.op, *(len(x) for x in strs), len(req.notification), d.block_length, len(src), len(dst), len(lens), 0)
    return b"".join((hdr, *strs, req.notification, src, dst, lens))


class _WatchState:
    """A ring watch (op watch): its notes as they come, reassembled from
    their note records (internal/ring/watch.go), and how it ended."""

    __slots__ = ("region_id", "tag", "subscribed", "ended", "notes", "_buf")

    def __init__(self, region_id: str) -> None:
        self.region_id, self.tag = region_id, 0
        self.subscribed = False
        self.ended: Optional[B2BError] = None
        self.notes: List[Any] = []
        self._buf = bytearray()

    def part(self, raw: bytes, blocks: int, nbytes: int, length: int, at: int) -> None:
        if length == 0:
            self.subscribed = True
            return
        if at != len(self._buf):  # a part out of place (never: one note's parts are posted together): drop the frame
            self._buf = bytearray()
            if at != 0:
                return
        self._buf += raw
        if len(self._buf) < length:
            return
        frame, self._buf = bytes(self._buf), bytearray()
        try:
            s = frame[0]
            sender = frame[1:1 + s].decode("utf-8", "replace")
            (r,) = struct.unpack_from("<H", frame, 1 + s)
            region = frame[3 + s:3 + s + r].decode("utf-8", "replace")
            (dropped,) = struct.unpack_from("<Q", frame, 3 + s + r)
            note = frame[11 + s + r:]
        except (IndexError, struct.error):
            return
        self.notes.append(Notification(region=region, sender=sender, notification=note, blocks=blocks, bytes=nbytes,
                                       dropped=dropped))


def notify_blob(region_id: str, note: bytes) -> bytes:
    """A notify record's blob (internal/ring/notify.go): region id length
    u16, the region id, the notification."""
    r = region_id.encode()
    if not 1 <= len(r) <= MAX_TRIG_REGION:
        raise ValueError(f"region id of {len(r)} bytes: want 1 to {MAX_TRIG_REGION}")
    if not 1 <= len(note) <= MAX_NOTE:
        raise ValueError(f"notification of {len(note)} bytes: want 1 to {MAX_NOTE}")
    return struct.pack("<H", len(r)) + r + bytes(note)


def key_trigger(region_id: str, key: bytes) -> bytes:
    """The arena bytes of a trigger on key notes of ``key`` landing on
    region ``region_id`` (internal/ring/arena.go, AppendTrigger)."""
    r = region_id.encode()
    if not 1 <= len(r) <= MAX_TRIG_REGION or not 1 <= len(key) <= MAX_KEY_LEN:
        raise ValueError(f"a trigger's region id of {len(r)} bytes and key of {len(key)}: want 1 to {MAX_TRIG_REGION} and 1 to {MAX_KEY_LEN}")
    return struct.pack("<HBB", len(r), len(key), 0) + r + bytes(key)
