"""Where the client uses the shared-memory ring (``_ring``): prepared
submits, their async handles and batches of them, when the daemon is local
and offers a ring; gRPC otherwise.

Which socket: ``Client(ring=...)``: ``False`` never; a path: that submit
socket; ``None`` (the default): ``$B2B_SUBMIT_SOCKET``, else
``submit.sock`` beside the API socket (``/run/b2bd/submit.sock`` for the
default ``/run/b2bd/b2bd.sock``) if it exists. ``B2B_RING=0`` turns it off
whatever the option. A daemon reached over TCP gets no ring (its plans are
not the caller's by uid), nor does one that refuses it (no
``--submit-socket``, an old daemon): the client stays on gRPC.
"""

from __future__ import annotations

import math
import os
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import grpc

from ._common import _TRANSPORT_BY_NAME, _TRANSPORT_NAME, _invalid, _op, _transport
from ._pack import as_u32
from ._results import PhaseTimings, TransferResult
from ._ring import (MAX_ARENA_IDS, MAX_INLINE_IDS, MAX_NOTE, MAX_TIMEOUT_MS, MAX_TRIG_REGION, Completion, Ring,  # noqa: F401
                    RingUnavailable, batch_blob, key_trigger)
from ._many import wait_grpc
from ._transfers import LazyOutcome, Transfer, _interrupts_deferred
from .errors import (
    DEADLINE_GRACE,
    B2BError,
    NotFoundError,
    WaitTimeoutError,
    error_for_code,
)
from .v1 import b2b_pb2 as pb

if TYPE_CHECKING:
    from ._transfers import PreparedTransfer
    from .client import Client

SUBMIT_SOCKET_NAME = "submit.sock"
_OFF = ("0", "off", "false", "no")


def submit_socket_for(address: str, option: Union[None, bool, str]) -> Optional[str]:
    """The submit socket whose ring a client of ``address`` uses; ``None``: gRPC only."""
    if option is False or os.environ.get("B2B_RING", "").strip().lower() in _OFF:
        return None
    if address.startswith("unix://"):
        api = address[len("unix://"):]
    elif address.startswith("unix:"):
        api = address[len("unix:"):]
    elif address.startswith("/"):
        api = address
    else:
        return None  # over TCP the daemon cannot tell our uid, which owns the plans
    if isinstance(option, (str, os.PathLike)) and not isinstance(option, bool):
        return os.fspath(option)
    env = os.environ.get("B2B_SUBMIT_SOCKET")
    if env:
        return env
    path = os.path.join(os.path.dirname(api), SUBMIT_SOCKET_NAME)
    return path if os.path.exists(path) else None


class RingSlot:
    """The client's ring, opened on first use; ``get()`` is ``None`` when
    the client is on gRPC. A ring the daemon dropped is opened again once;
    a refusal puts the client on gRPC for good (``reason`` says why)."""

    def __init__(self, address: str, option: Union[None, bool, str]) -> None:
        self.path = submit_socket_for(address, option)
        self._explicit = isinstance(option, str)
        self.reason: Optional[str] = None if self.path else "no submit socket"
        self._ring: Optional[Ring] = None
        self._lock = threading.Lock()
        # Block routes bound on this client's connection (BindBlockRoute),
        # by (local layout, peer, remote layout, transport, op): oldest
        # first, at most MAX_ROUTES.
        self.routes: Dict[Tuple[str, str, str, int, int], int] = {}
        self.routes_lock = threading.Lock()

    def get(self) -> Optional[Ring]:
        r = self._ring
        if r is not None and r.dead is None and r.pid == os.getpid():
            return r
        if self.path is None:
            return None
        with self._lock:
            r = self._ring
            if r is not None and r.pid != os.getpid():
                r = self._ring = None  # a fork's copy: the parent's ring, not ours to touch
            if r is not None and r.dead is None:
                return r
            if r is not None:
                self._ring = None
                r.close()
            try:
                self._ring = Ring(self.path)
            except (RingUnavailable, B2BError) as e:
                self.reason, self.path = f"ring at {self.path}: {e}", None
                if self._explicit:
                    warnings.warn(f"b2b: {self.reason}; using gRPC", RuntimeWarning, stacklevel=3)
                return None
            return self._ring

    def close(self) -> None:
        with self._lock:
            r, self._ring, self.path = self._ring, None, None
        if r is not None and r.pid == os.getpid():
            r.close()


_NOT_FOUND = grpc.StatusCode.NOT_FOUND.value[0]  # an enum's attribute costs a call's microsecond
MAX_ROUTES = 64  # routes a client keeps bound; the daemon allows --max-plans


def _route(client: "Client", slot: RingSlot, key: Tuple[str, str, str, int, int]) -> Optional[int]:
    """The handle of the route key, bound on first use; ``None`` if the
    daemon refuses it (TransferBlocks over gRPC then gives the refusal)."""
    with slot.routes_lock:
        h = slot.routes.get(key)
    if h is not None:
        return h
    req = pb.BindBlockRouteRequest(local_layout=key[0], peer=key[1], remote_layout=key[2], transport=key[3], op=key[4])
    try:
        h = client._call(client._stub.BindBlockRoute, req, client.timeout).handle
    except B2BError:
        return None
    old = []
    with slot.routes_lock:
        won = slot.routes.get(key)
        if won is not None:  # another thread bound it meanwhile: keep one
            h, old = won, [h]
        else:
            slot.routes[key] = h
            while len(slot.routes) > MAX_ROUTES:
                old.append(slot.routes.pop(next(iter(slot.routes))))
    for o in old:
        try:
            client._call(client._stub.ReleaseBlockRoute, pb.ReleaseBlockRouteRequest(handle=o), client.timeout)
        except B2BError:
            pass  # gone with a reconnect already
    return h


def _inline_ids(v: Any, name: str) -> Optional[List[int]]:
    """Ids that fit a ring record (1 to MAX_INLINE_IDS) as a list; ``None``
    for more or none. A short list of ints skips numpy; anything else is
    checked by as_u32, which raises as the gRPC path would."""
    if type(v) in (list, tuple) and 1 <= len(v) <= MAX_INLINE_IDS and all(type(x) is int and 0 <= x <= 0xFFFFFFFF for x in v):
        return list(v)
    try:
        if len(v) > MAX_INLINE_IDS:
            return None  # gRPC's: no point packing twice
    except TypeError:
        pass  # as_u32 says what is wrong with it
    a = as_u32(v, name)
    return a.tolist() if 1 <= a.shape[0] <= MAX_INLINE_IDS else None


def transfer_blocks(client: "Client", slot: RingSlot, local_layout: str, peer: str, remote_layout: str, local_ids: Any,
                    remote_ids: Any, timeout: Optional[float], transport: Any, op: Any,
                    notification: Optional[bytes] = None) -> Optional[TransferResult]:
    """:meth:`Client.transfer_blocks` that waits, through the ring when it
    carries the request (:func:`_carried`); ``None``: take gRPC."""
    ms = _timeout_ms(timeout)
    if ms is None or slot.path is None or not local_layout or not peer or not remote_layout:
        return None
    if notification is None:
        lids, rids = _inline_ids(local_ids, "local_ids"), _inline_ids(remote_ids, "remote_ids")
    else:
        lids = rids = None
    ring = slot.get()
    if ring is None:
        return None
    if lids is None or rids is None or len(lids) != len(rids):
        ids = _carried(ring, local_ids, remote_ids, notification)
        if ids is None:
            return None
        lids, rids = ids
    note = b"" if notification is None else bytes(notification)
    key = (local_layout, peer, remote_layout, _transport(transport), _op(op))
    for attempt in range(2):
        h = _route(client, slot, key)
        if h is None:
            return None
        c = _post_wait(ring, ring.start_blocks_many, [(h, ms, lids, rids, note)], timeout=timeout)
        if _stale_route(slot, key, h, c) and attempt == 0:
            continue  # the connection it was bound on closed (a reconnect): bind again
        err = c.error()
        if err is not None:
            raise err
        return _result(key[3], c)
    return None


def batch(slot: RingSlot, req: Any, timeout: Optional[float]) -> Optional[TransferResult]:
    """:meth:`Client.batch_transfer` of the checked request ``req``
    through the ring, when the ring carries it (its blob fits the arena);
    ``None``: take gRPC. The daemon checks it with BatchTransfer's code."""
    ms = _timeout_ms(timeout)
    if ms is None or slot.path is None:
        return None
    ring = slot.get()
    if ring is None:
        return None
    name = "" if req.transport == pb.TRANSPORT_KIND_UNSPECIFIED else _TRANSPORT_NAME[req.transport]
    blob = batch_blob(req, name)
    if blob is None or not ring.fits(len(blob), 0):
        return None
    c = _post_wait(ring, lambda: [ring.start_batch(blob, ms)], timeout=timeout)
    err = c.error()
    if err is not None:
        raise err
    return _result(req.transport, c)


def _stale_route(slot: RingSlot, key: Tuple[str, str, str, int, int], h: int, c: Completion) -> bool:
    """Whether c refused route h as unknown (its connection closed); the
    route is then forgotten, and the next use binds it again."""
    if c.code != _NOT_FOUND or "block route" not in c.msg:
        return False
    with slot.routes_lock:
        if slot.routes.get(key) == h:
            del slot.routes[key]
    return True


def _carried(ring: Ring, local_ids: Any, remote_ids: Any, notification: Any, extra: int = 0) -> Optional[Tuple[Any, Any]]:
    """The ids as little-endian uint32 arrays when a ring record carries
    them with the notification (1 to MAX_ARENA_IDS pairs of equal count
    that fit the arena, a note of bytes up to MAX_NOTE); ``None``: gRPC.
    Ids that are no ids raise as the gRPC path would."""
    if notification is not None and (not isinstance(notification, (bytes, bytearray, memoryview)) or len(notification) > MAX_NOTE):
        return None  # gRPC's refusal
    lids, rids = as_u32(local_ids, "local_ids"), as_u32(remote_ids, "remote_ids")
    k = lids.shape[0]
    if k != rids.shape[0] or k > MAX_ARENA_IDS or (k == 0 and not notification):  # no ids: a note alone
        return None
    if not ring.fits(8 * k, extra + (0 if notification is None else len(notification))):
        return None
    return lids, rids


def blocks_record(client: "Client", slot: RingSlot, ring: Ring, x: Any, timeout: Optional[float]) -> Optional[Tuple[Any, ...]]:
    """What a ring record of b2b.Blocks x carries: (route key, timeout_ms,
    local ids, remote ids, note), or ``None`` when it goes over gRPC."""
    t = x.timeout if x.timeout is not None else timeout
    ms = _timeout_ms(t)
    if ms is None or not x.local_layout or not x.peer or not x.remote_layout:
        return None
    trig = b""
    if x.after is not None:  # a key-note trigger rides in the arena; a counter's takes gRPC
        a = x.after
        if not isinstance(a, pb.TransferTrigger) or a.counter_region_id or a.counter_offset or a.value:
            return None
        try:
            trig = key_trigger(a.note_region_id, a.note_key)
        except ValueError:
            return None  # gRPC says what is wrong
    ids = _carried(ring, x.local_ids, x.remote_ids, x.notification, len(trig))
    if ids is None:
        return None
    try:
        key = (x.local_layout, x.peer, x.remote_layout, _transport(x.transport), _op(x.op))
    except B2BError:
        return None  # gRPC says what is wrong
    return key, ms, ids[0], ids[1], b"" if x.notification is None else bytes(x.notification), trig


def start_one(client: "Client", x: Any) -> Optional["RingBlocksTransfer"]:
    """``transfer_blocks(..., wait=False)`` of b2b.Blocks x through the
    ring; ``None``: take gRPC."""
    ring = client.ring
    if ring is None:
        return None
    rec = blocks_record(client, client._ring, ring, x, None)
    if rec is None:
        return None
    hs = start_blocks(client, client._ring, ring, [rec], [x.remote_ids])
    return None if hs is None else hs[0]


def start_blocks(client: "Client", slot: RingSlot, ring: Ring, recs: Sequence[Tuple[Any, ...]],
                 remote_ids: Sequence[Any]) -> Optional[List["RingBlocksTransfer"]]:
    """Block transfers of recs (blocks_record's), posted with one publish,
    their routes bound first (cached); ``None`` when a route cannot be
    bound (gRPC then takes them all, and gives the refusal)."""
    routes = []
    for key, *_ in recs:
        h = _route(client, slot, key)
        if h is None:
            return None
        routes.append(h)
    tags: List[int] = []
    try:
        with _interrupts_deferred():
            tags = ring.start_blocks_many([(h, *rec[1:]) for h, rec in zip(routes, recs)])
    except KeyboardInterrupt:
        for t in tags:  # posted, but no handle reaches the caller: stop them
            _settle(ring, t)
        raise
    return [RingBlocksTransfer(client, ring, t, slot, rec[0], h, rid) for t, rec, h, rid in zip(tags, recs, routes, remote_ids)]


def _timeout_ms(timeout: Optional[float]) -> Optional[int]:
    """The record's deadline; ``None`` when the ring cannot carry it (the
    gRPC path then answers it as it always did)."""
    if timeout is None:
        return 0
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        return None
    ms = max(1, int(math.ceil(timeout * 1000)))
    return ms if ms <= MAX_TIMEOUT_MS else None


def _result(transport: int, c: Completion, segments: int = 0, work_requests: int = 0) -> TransferResult:
    """What TransferResult.from_proto makes of the response a completion
    stands for, without the protobuf (a third of the Python side's cost of
    a ring call); ``elapsed`` is the wire phase (the ring carries no other duration)."""
    # Built past the frozen dataclasses' __init__ (an object.__setattr__ per
    # field, 19 in all: 5 us of a 100 us call on the GPU host); a field not
    # set reads its class default, as __init__ would have stored it.
    ph = object.__new__(PhaseTimings)
    ph.__dict__.update(wire_ns=c.wire_ns, total_ns=c.total_ns, trigger_seen_unix_ns=c.trigger_seen_unix_ns,
                       posted_unix_ns=c.posted_unix_ns, landed_unix_ns=c.landed_unix_ns)
    f = c.figures
    if f is not None:  # the response's own, as gRPC gives them
        segments, work_requests = f[0], f[1]
        ph.__dict__.update(validate_ns=f[2], resolve_ns=f[3], plan_ns=f[4], post_ns=f[5], notify_ns=f[6], armed_ns=f[7])
    r = object.__new__(TransferResult)
    # The daemon names the kind that carried it in a success's message.
    r.__dict__.update(blocks=c.blocks, bytes=c.bytes, transport=c.msg or _TRANSPORT_NAME.get(transport) or str(transport),
                      elapsed=c.wire_ns / 1e9, segments=segments, work_requests=work_requests, phases=ph)
    return r


def _response(plan: "PreparedTransfer", c: Completion) -> Any:
    """A BatchTransferResponse from a completion (and the plan's own
    figures where the daemon gave none); ``elapsed_ns`` is the wire phase."""
    r = pb.BatchTransferResponse(
        blocks=c.blocks, bytes=c.bytes, transport=_TRANSPORT_BY_NAME.get(plan.transport, 0),
        segments=plan.segments, work_requests=plan.work_requests, elapsed_ns=c.wire_ns,
        phases=pb.PhaseTimings(wire_ns=c.wire_ns, total_ns=c.total_ns, posted_unix_ns=c.posted_unix_ns,
                               landed_unix_ns=c.landed_unix_ns),
    )
    _figures(r, c)
    return r


def _blocks_response(transport: int, c: Completion) -> Any:
    """A block transfer's BatchTransferResponse from its completion."""
    r = pb.BatchTransferResponse(blocks=c.blocks, bytes=c.bytes, transport=transport, elapsed_ns=c.wire_ns,
                                 phases=pb.PhaseTimings(wire_ns=c.wire_ns, total_ns=c.total_ns,
                                                        trigger_seen_unix_ns=c.trigger_seen_unix_ns,
                                                        posted_unix_ns=c.posted_unix_ns,
                                                        landed_unix_ns=c.landed_unix_ns))
    _figures(r, c)
    return r


def _figures(r: Any, c: Completion) -> None:
    """Put a completion's figures (segments, work requests, phases) in the
    BatchTransferResponse r, where the daemon gave them."""
    f = c.figures
    if f is None:
        return
    r.segments, r.work_requests = f[0], f[1]
    ph = r.phases
    ph.validate_ns, ph.resolve_ns, ph.plan_ns, ph.post_ns, ph.notify_ns, ph.armed_ns = f[2:8]


def _settle(ring: Ring, tag: int) -> None:
    """After an interrupt: cancel tag in the daemon and wait until its
    submit ended there (no byte lands after), or DEADLINE_GRACE (for the
    cancel, and again for the record: a stopped daemon takes neither)."""
    try:
        ring.cancel(tag, DEADLINE_GRACE)
    except B2BError:
        pass  # ended already (NotFound), or no ring: nothing runs for us
    try:
        if ring.wait(tag, DEADLINE_GRACE) is not None:
            return
    except B2BError:
        return
    ring.forget(tag)


def _post_wait(ring: Ring, post: Callable[..., List[int]], *args: Any, timeout: Optional[float] = None) -> Any:
    """Posts one record (``post(*args)`` returns its tag in a list) and
    waits for its completion. A record posted is work the daemon runs: an
    interrupt waits until its tag is in hand (and strikes as the block
    ends), and a wait it cuts short settles the record.

    ``timeout`` is the caller's deadline the record carries (``None``: none,
    the daemon's default applies): the daemon answers by then, so the wait
    gives up DEADLINE_GRACE later, as a gRPC transfer call does, with
    DeadlineExceededError: only a daemon that stopped or hangs gets there.
    The record's cancel is posted (a daemon that resumes stops it) and its
    completion, if it ever comes, is dropped."""
    tag = None
    try:
        with _interrupts_deferred():
            tag = post(*args)[0]
        if timeout is None:
            return ring.wait(tag)
        c = ring.wait(tag, limit=timeout + DEADLINE_GRACE)
        if c is None:
            ring.abandon(tag)
            raise error_for_code(grpc.StatusCode.DEADLINE_EXCEEDED,
                                 f"b2b client: the daemon did not answer ring record {tag} within the caller's deadline "
                                 f"({timeout} s) and {DEADLINE_GRACE} s more: it is stopped or hung")
        return c
    except B2BError:
        raise
    except BaseException:
        if tag is not None:
            _settle(ring, tag)
        raise


def submit(ring: Ring, plan: "PreparedTransfer", timeout: Optional[float]) -> Optional[TransferResult]:
    """:meth:`PreparedTransfer.submit` through the ring; ``None``: take gRPC."""
    ms = _timeout_ms(timeout)
    if ms is None:
        return None
    c = _post_wait(ring, ring.start_many, [plan.handle], ms, timeout=timeout)
    err = c.error()
    if err is not None:
        raise err
    return _result(_TRANSPORT_BY_NAME.get(plan.transport, 0), c, plan.segments, plan.work_requests)


class RingTransfer(Transfer):
    """A :class:`Transfer` of a prepared submit posted on the ring: its
    outcome is the ring's completion. ``id`` is the ring's tag, not a
    daemon transfer id (WaitTransfer does not know it)."""

    __slots__ = ("_ring", "_plan")

    def __init__(self, client: "Client", ring: Ring, tag: int, plan: "PreparedTransfer") -> None:
        super().__init__(client, tag)
        self._ring, self._plan = ring, plan

    def _made(self, c: Completion) -> Any:
        """What makes the done outcome's message from c, when asked for;
        it holds what it needs, not the handle (whose outcome holds it)."""
        tid, plan = self.id, self._plan
        return lambda: pb.TransferOutcome(transfer_id=tid, state=pb.TRANSFER_STATE_DONE, result=_response(plan, c))

    def _land(self, c: Completion) -> None:
        if c.code == 0:
            # The message is made when asked for (LazyOutcome).
            o: Any = LazyOutcome(self.id, pb.TRANSFER_STATE_DONE,
                                 (c.trigger_seen_unix_ns, c.posted_unix_ns, c.landed_unix_ns, c.wire_ns), self._made(c))
        else:
            state = pb.TRANSFER_STATE_CANCELLED if c.code == grpc.StatusCode.CANCELLED.value[0] else pb.TRANSFER_STATE_FAILED
            o = pb.TransferOutcome(transfer_id=self.id, state=state, code=c.code, message=c.msg)
        self._take(o)

    def done(self) -> bool:
        if self._outcome is None:
            for c in self._ring.poll([self.id]).values():
                self._land(c)
        return self._outcome is not None

    def wait(self, timeout: Optional[float] = None) -> TransferResult:
        if timeout is not None and timeout < 0:
            raise _invalid(f"timeout {timeout!r}: want seconds >= 0, or None")
        if self._outcome is None:
            c = self._ring.wait(self.id, timeout)  # an interrupt here leaves the completion in the ring's keeping
            if c is None:
                raise WaitTimeoutError(grpc.StatusCode.DEADLINE_EXCEEDED, f"transfer {self.id} still running after {timeout} s")
            self._land(c)
        return self.result

    def cancel(self) -> bool:
        if self._outcome is None:
            try:
                self._ring.cancel(self.id)
            except NotFoundError:
                pass  # it ended first: its completion is on its way
            try:
                self.wait()
            except B2BError:
                pass  # its outcome, kept (result, error)
        return self._outcome.state == pb.TRANSFER_STATE_CANCELLED

    def __repr__(self) -> str:
        return f"Transfer(ring tag={self.id}, state={self.state})"


class RingBlocksTransfer(RingTransfer):
    """A :class:`Transfer` of a block transfer posted on the ring (a
    record on a bound route): its outcome is the ring's completion, its
    ``id`` the ring's tag. The result's ``transport`` is the route's as
    asked (a route of ``auto`` says ``auto``)."""

    __slots__ = ("_slot", "_key", "_route")

    def __init__(self, client: "Client", ring: Ring, tag: int, slot: RingSlot, key: Tuple[str, str, str, int, int],
                 route: int, remote_ids: Any) -> None:
        Transfer.__init__(self, client, tag, remote_ids)
        self._ring, self._plan = ring, None
        self._slot, self._key, self._route = slot, key, route

    def _made(self, c: Completion) -> Any:
        tid, transport = self.id, self._key[3]
        return lambda: pb.TransferOutcome(transfer_id=tid, state=pb.TRANSFER_STATE_DONE,
                                          result=_blocks_response(transport, c))

    def _land(self, c: Completion) -> None:
        _stale_route(self._slot, self._key, self._route, c)  # a later start binds it again
        super()._land(c)


def start_submits(client: "Client", ring: Ring, plans: Sequence["PreparedTransfer"], timeout: Optional[float]) -> Optional[List[Transfer]]:
    """Submits of every plan, posted with one publish; ``None``: take gRPC."""
    ms = _timeout_ms(timeout)
    if ms is None:
        return None
    tags: List[int] = []
    try:
        with _interrupts_deferred():
            tags = ring.start_many([p.handle for p in plans], ms)
    except KeyboardInterrupt:
        for t in tags:  # posted, but no handle reaches the caller: stop them
            _settle(ring, t)
        raise
    return [RingTransfer(client, ring, t, p) for t, p in zip(tags, plans)]


def poll(transfers: Sequence[Transfer]) -> None:
    """Land the completions that arrived for the ring handles among
    transfers, one drain per ring."""
    by_ring: Dict[int, List[RingTransfer]] = {}
    for t in transfers:
        if isinstance(t, RingTransfer) and t._outcome is None:
            by_ring.setdefault(id(t._ring), []).append(t)
    for ts in by_ring.values():
        got = ts[0]._ring.poll([t.id for t in ts])
        for t in ts:
            c = got.get(t.id)
            if c is not None:
                t._land(c)


def wait_all(transfers: Sequence[Transfer], timeout: Optional[float]) -> None:
    """Wait until every handle ended (ring handles in one wait per ring);
    WaitTimeoutError if some still run after timeout seconds."""
    end = None if timeout is None else time.monotonic() + timeout
    left = lambda: None if end is None else max(0.0, end - time.monotonic())  # noqa: E731
    ring_ts: Dict[int, List[RingTransfer]] = {}
    others = []
    for t in transfers:
        if not isinstance(t, Transfer):
            raise TypeError(f"wait_all: {t!r} is {type(t).__name__}, not a b2b.Transfer handle")
        if t._outcome is not None:
            continue
        if isinstance(t, RingTransfer):
            ring_ts.setdefault(id(t._ring), []).append(t)
        else:
            others.append(t)
    running = 0
    for ts in ring_ts.values():
        got = ts[0]._ring.wait_many([t.id for t in ts], left())
        for t in ts:
            c = got[t.id]
            if c is None:
                running += 1
            else:
                t._land(c)
    # Daemon handles: one WaitTransfers for all (a handle with a call an
    # interrupt left running joins that call instead).
    joined = [t for t in others if t._pending is not None]
    ask = [t for t in others if t._pending is None]
    by_client: Dict[int, List[Transfer]] = {}
    for t in ask:
        by_client.setdefault(id(t._client), []).append(t)
    for ts in by_client.values():
        wait_grpc(ts[0]._client, ts, left(), False)
        running += sum(1 for t in ts if t._outcome is None)
    for t in joined:
        try:
            t.wait(left())
        except WaitTimeoutError:
            running += 1
        except B2BError:
            pass  # the handle keeps its failure
    if running:
        raise WaitTimeoutError(grpc.StatusCode.DEADLINE_EXCEEDED, f"{running} of {len(transfers)} transfers still running after {timeout} s")
