"""Transfer handles: prepared transfers, the async transfer handle and the
submit stream.
"""

from __future__ import annotations

import functools
import itertools
import queue
import _signal
import signal
import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import grpc

from ._common import _TRANSPORT_NAME
from ._results import PhaseTimings, TransferResult
from .errors import (
    B2BError,
    CALL_ID_KEY,
    DEADLINE_GRACE,
    FailedPreconditionError,
    NotFoundError,
    UnavailableError,
    WaitTimeoutError,
    check_timeout,
    deadline_after,
    error_for_code,
    from_rpc_error,
    new_call_id,
    timeout_ms,
    transfer_deadline,
)
from .v1 import b2b_pb2 as pb

_SIGINT = int(signal.SIGINT)

if TYPE_CHECKING:  # annotations only: client.py imports this module
    from .client import Client


# ---------------------------------------------------------------------------
# Prepared transfers.

_STATUS_BY_VALUE = {c.value[0]: c for c in grpc.StatusCode}


class PreparedTransfer:
    """A batch layout the daemon validated, merged and planned once
    (:meth:`Client.prepare`); :meth:`submit` runs it again and again.

    The plan pins its source region in the daemon until :meth:`release` (or
    leaving a ``with`` block, or the client's connection closing). A submit
    of a plan whose peer restarted, or whose destination was re-registered or
    re-exported, raises ``FailedPreconditionError``: prepare it again.

    Attributes mirror ``PrepareTransferResponse``: ``handle``, ``blocks``,
    ``bytes``, ``transport``, ``segments``, ``work_requests`` and ``phases``
    (the preparation's own :class:`PhaseTimings`).
    """

    __slots__ = (
        "_client", "_req", "_submit", "_released", "handle", "blocks", "bytes",
        "transport", "segments", "work_requests", "phases", "timeout", "__weakref__",
    )

    def __init__(self, client: "Client", r: Any, timeout: Optional[float]) -> None:
        self._client = client
        self.handle = int(r.handle)
        self.blocks = int(r.blocks)
        self.bytes = int(r.bytes)
        self.transport = _TRANSPORT_NAME.get(r.transport, str(r.transport))
        self.segments = int(r.segments)
        self.work_requests = int(r.work_requests)
        self.phases = PhaseTimings.from_proto(r.phases) if r.HasField("phases") else None
        #: Default deadline of :meth:`submit`, seconds (``None``: the daemon's default).
        self.timeout = check_timeout(timeout)
        # The request is serialised once; submit hands these bytes to gRPC.
        self._req = pb.SubmitTransferRequest(handle=self.handle).SerializeToString()
        self._submit = client._submit_raw
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def submit(self, timeout: Optional[float] = None) -> TransferResult:
        """Run the plan: returns once every byte landed at the peer and its
        daemon acknowledged the batch (as :meth:`Client.batch_transfer`).
        ``timeout`` defaults to the one given to :meth:`Client.prepare`."""
        if self._released:
            raise FailedPreconditionError(
                grpc.StatusCode.FAILED_PRECONDITION, f"prepared transfer {self.handle} was released: prepare it again"
            )
        timeout = self.timeout if timeout is None else check_timeout(timeout)
        res = self._client._ring_submit(self, timeout)
        if res is not None:
            return res
        deadline = deadline_after(timeout)
        rpc_timeout, md = transfer_deadline(timeout)
        try:
            r = self._client._interruptible(self._submit, self._req, rpc_timeout, md)
        except grpc.RpcError as e:
            raise from_rpc_error(e, deadline) from e
        except ValueError as e:  # the channel was closed
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE, f"b2b client is closed: {e}") from e
        return TransferResult.from_proto(r)

    def release(self) -> None:
        """Free the plan in the daemon (its source region is let go); a
        second call does nothing. A plan with submits in flight is freed when
        they end."""
        if self._released:
            return
        self._released = True
        self._client._plans.discard(self.handle)
        if self._client.closed:
            return  # the daemon frees the plans of a closed connection
        self._client._call(self._client._stub.ReleaseTransfer, pb.ReleaseTransferRequest(handle=self.handle), self._client.timeout)

    def __enter__(self) -> "PreparedTransfer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.release()
        except NotFoundError:
            pass  # already gone in the daemon (its connection was reset)

    def __repr__(self) -> str:
        state = "released" if self._released else "live"
        return (
            f"PreparedTransfer(handle={self.handle}, blocks={self.blocks}, bytes={self.bytes}, "
            f"transport={self.transport!r}, {state})"
        )


_RUNNING = pb.TRANSFER_STATE_RUNNING
_STATE_NAME = {
    pb.TRANSFER_STATE_RUNNING: "running",
    pb.TRANSFER_STATE_DONE: "done",
    pb.TRANSFER_STATE_FAILED: "failed",
    pb.TRANSFER_STATE_CANCELLED: "cancelled",
}


class _Pending:
    """A call of a handle's (WaitTransfer, CancelTransfer, or a poll naming
    it at ``index``) that an interrupt left running: its answer may be the
    outcome the daemon reports only once."""

    __slots__ = ("fut", "index")

    def __init__(self, fut: Any, index: Optional[int]) -> None:
        self.fut, self.index = fut, index

    def outcome(self) -> Any:
        """The call's answer for the handle; ``None`` if the call failed."""
        f = self.fut
        if f.cancelled() or f.exception() is not None:
            return None
        r = f.result()
        return r if self.index is None else r.outcomes[self.index]



class LazyOutcome:
    """A done transfer's ``TransferOutcome``, made only when its message is
    asked for (:attr:`Transfer.outcome`, :attr:`Transfer.result`): a ring
    completion says the state, code and message at once, and most handles
    are asked nothing more (a connector's note writes, polled every engine
    step), while the message (a ``BatchTransferResponse`` and its phases)
    took 10-30 us a handle to build on a loaded 2-core host. ``times`` are
    the daemon's marks of a done transfer (:meth:`Transfer._marks`)."""

    __slots__ = ("transfer_id", "state", "code", "message", "times", "_make", "_pb")

    def __init__(self, transfer_id: int, state: int, times: Any, make: Any) -> None:
        self.transfer_id, self.state, self.code, self.message = transfer_id, state, 0, ""
        self.times = times
        self._make, self._pb = make, None

    def proto(self) -> Any:
        """The ``TransferOutcome`` message (made once)."""
        if self._pb is None:
            self._pb, self._make = self._make(), None
        return self._pb

    def __getattr__(self, name: str) -> Any:  # result, HasField, ...: the message's
        return getattr(self.proto(), name)


class _interrupts_deferred:
    """Holds Ctrl-C (SIGINT with Python's default handler) back until the
    block ends, then raises it. Only the main thread gets signals, and a
    handler the application installed itself is left alone.

    A class over _signal, not a generator over signal: signal's functions
    wrap every number and handler in an enum, which made this 14 us of a
    50 us ring submit."""

    __slots__ = ("pending", "armed")

    def __enter__(self) -> "_interrupts_deferred":
        self.pending: list = []
        self.armed = threading.current_thread() is threading.main_thread() and \
            _signal.getsignal(_SIGINT) is _signal.default_int_handler
        if self.armed:
            _signal.signal(_SIGINT, lambda signum, frame: self.pending.append(signum))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.armed:
            _signal.signal(_SIGINT, _signal.default_int_handler)
            if self.pending:
                raise KeyboardInterrupt


class Transfer:
    """The one handle of every async transfer: :meth:`Client.start_transfer`,
    :meth:`Client.start_submit`, ``transfer_blocks(..., wait=False)`` or
    ``after=...`` (``Client``, :mod:`b2b.kv`, :mod:`b2b.stream`).

    The daemon reports a transfer's outcome once; the handle keeps it, so
    :meth:`wait`, :meth:`done`, :attr:`result` and :attr:`error` may be asked
    again. An outcome the daemon handed over is never lost: not by a
    :meth:`Client.poll` of mixed handles, not by an interrupt
    (``KeyboardInterrupt``) during :meth:`wait`, whose call goes on and whose
    answer the next :meth:`wait` (or :meth:`done`) takes. The transfer
    belongs to the client's connection: closing the client cancels it.
    Usage::

        h = c.transfer_blocks("kv", peer, "kv", src_ids, dst_ids, wait=False)
        ...
        if h.done():
            r = h.result          # TransferResult, or raises the failure
        h.wait(timeout=5)         # WaitTimeoutError (a TimeoutError) if still running
        h.cancel()                # returns once no byte of it lands any more
    """

    __slots__ = ("_client", "id", "_outcome", "_pending", "remote_ids", "_tracked", "__weakref__")

    def __init__(self, client: "Client", transfer_id: int, remote_ids: Any = None) -> None:
        self._client = client
        #: The daemon's id of the transfer (never 0).
        self.id = int(transfer_id)
        #: A block transfer's destination ids as given (for an engine's
        #: ``get_block_ids_with_load_errors``); ``None`` for other kinds.
        self.remote_ids = remote_ids
        self._outcome: Any = None
        self._pending: Optional[_Pending] = None
        self._tracked = False  # in the client's _transfers (started)

    def __init_subclass__(cls, **kw: Any) -> None:
        """A handle kind's own ``wait`` (the ring's) takes its timeout
        through :func:`check_timeout` too, as this class's does: one rule
        for every handle."""
        super().__init_subclass__(**kw)
        own = cls.__dict__.get("wait")
        if own is None or getattr(own, "_checks_timeout", False):
            return

        @functools.wraps(own)
        def wait(self: "Transfer", timeout: Optional[float] = None) -> TransferResult:
            return own(self, check_timeout(timeout, wait=True))

        wait._checks_timeout = True  # type: ignore[attr-defined]
        cls.wait = wait  # type: ignore[method-assign]

    def _take(self, o: Any) -> bool:
        if self._outcome is not None:
            return True
        if o.state != _RUNNING:
            self._outcome = o
            if self._tracked:
                self._client._transfers.pop(self.id, None)
            return True
        return False

    def _keep(self, p: _Pending) -> None:
        """Keep p, interrupted, until it answers; its answer lands here."""
        self._pending = p

        def landed(_f: Any) -> None:
            o = p.outcome()
            if o is not None:
                self._take(o)
            if self._pending is p:
                self._pending = None

        p.fut.add_done_callback(landed)

    def _join(self, timeout: Optional[float]) -> bool:
        """Wait for a call an interrupt left running; ``False`` if it is
        still out after ``timeout`` seconds."""
        p = self._pending
        if p is None:
            return True
        try:
            p.fut.result(timeout=timeout)
        except grpc.FutureTimeoutError:
            return False
        except grpc.RpcError:
            pass
        o = p.outcome()
        if o is not None:
            self._take(o)
        if self._pending is p:
            self._pending = None
        return True

    def _ask(self, method: Any, req: Any, rpc_timeout: Optional[float]) -> Any:
        """One call answering this transfer's outcome (WaitTransfer,
        CancelTransfer); interrupted, it goes on and is kept (:meth:`_keep`)."""
        c = self._client
        if c._closed:
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE, "b2b client is closed")
        deadline = deadline_after(rpc_timeout)
        fut = None
        try:
            # An interrupt that struck while the call was being started
            # would lose the call, and with it an outcome the daemon hands
            # over once: it waits until the call is in hand.
            with _interrupts_deferred():
                fut = method.future(req, timeout=rpc_timeout)
            o = fut.result()
        except grpc.RpcError as e:
            raise from_rpc_error(e, deadline) from e
        except BaseException:
            if fut is not None:
                self._keep(_Pending(fut, None))
            raise
        self._take(o)
        return o

    @property
    def client(self) -> "Client":
        return self._client

    @property
    def outcome(self) -> Any:
        """The daemon's raw ``TransferOutcome`` once the transfer ended
        (``result.phases`` carries the trigger times), else ``None``."""
        o = self._outcome
        if type(o) is LazyOutcome:
            o = self._outcome = o.proto()
        return o

    def _marks(self) -> Any:
        """A done transfer's daemon marks (trigger_seen_unix_ns,
        posted_unix_ns, landed_unix_ns, wire_ns), without making its
        outcome's message where the handle has them at hand (a ring
        completion's); ``None`` while it runs or once it failed."""
        o = self._outcome
        if o is None or o.state != pb.TRANSFER_STATE_DONE:
            return None
        if type(o) is LazyOutcome and o.times is not None:
            return o.times
        ph = o.result.phases if o.HasField("result") and o.result.HasField("phases") else None
        if ph is None:
            return 0, 0, 0, None
        return int(ph.trigger_seen_unix_ns or 0), int(ph.posted_unix_ns or 0), int(ph.landed_unix_ns or 0), int(ph.wire_ns)

    @property
    def state(self) -> str:
        """``"running"`` (as far as the handle knows), ``"done"``, ``"failed"`` or ``"cancelled"``."""
        return "running" if self._outcome is None else _STATE_NAME.get(self._outcome.state, str(self._outcome.state))

    @property
    def failed(self) -> bool:
        """``True`` once the transfer ended failed or cancelled."""
        return self._outcome is not None and self._outcome.state != pb.TRANSFER_STATE_DONE

    @property
    def error(self) -> Optional[B2BError]:
        """The failure of a failed or cancelled transfer; ``None`` otherwise."""
        o = self._outcome
        if o is None or o.state == pb.TRANSFER_STATE_DONE:
            return None
        code = _CODE_BY_VALUE.get(o.code, grpc.StatusCode.UNKNOWN)
        if o.state == pb.TRANSFER_STATE_CANCELLED and code == grpc.StatusCode.OK:
            code = grpc.StatusCode.CANCELLED
        return error_for_code(code, o.message or f"transfer {self.id} {_STATE_NAME.get(o.state, o.state)}")

    @property
    def result(self) -> Optional[TransferResult]:
        """The :class:`TransferResult` once done; raises the failure of a
        failed or cancelled transfer; ``None`` while it runs (poll with
        :meth:`done` or wait with :meth:`wait`)."""
        o = self._outcome
        if o is None:
            return None
        if o.state == pb.TRANSFER_STATE_DONE:
            return TransferResult.from_proto(o.result)
        raise self.error

    def done(self) -> bool:
        """Poll the daemon (no waiting): ``True`` once the transfer ended."""
        if self._outcome is None:
            self._client.poll([self])
        return self._outcome is not None

    def wait(self, timeout: Optional[float] = None) -> TransferResult:
        """Wait until the transfer ends and return its :class:`TransferResult`;
        raise its failure (``CancelledError`` once cancelled). With
        ``timeout`` (seconds; 0: only look) and the transfer still running
        then, raise :class:`WaitTimeoutError` (a ``TimeoutError``): the
        transfer goes on."""
        timeout = check_timeout(timeout, wait=True)
        end = None if timeout is None else time.monotonic() + timeout
        if self._outcome is None and not self._join(timeout):
            raise WaitTimeoutError(grpc.StatusCode.DEADLINE_EXCEEDED, f"transfer {self.id} still running after {timeout} s")
        while self._outcome is None:
            req = pb.WaitTransferRequest(transfer_id=self.id)
            rpc_timeout = None
            more = False  # a wait longer than the daemon's limit: asked again
            if end is not None:
                left = max(0.0, end - time.monotonic())
                req.timeout_ms = timeout_ms(left)
                more = req.timeout_ms < left * 1000
                rpc_timeout = req.timeout_ms / 1000 + 30.0  # the daemon answers RUNNING at timeout_ms
            if not self._take(self._ask(self._client._stub.WaitTransfer, req, rpc_timeout)) and not more:
                raise WaitTimeoutError(grpc.StatusCode.DEADLINE_EXCEEDED, f"transfer {self.id} still running after {timeout} s")
        return self.result

    def cancel(self) -> bool:
        """Cancel the transfer; returns once no byte of it lands any more.
        ``True`` if it was cancelled, ``False`` if it had ended otherwise
        (its outcome is kept: see :attr:`result`). Bounded by the client's
        ``timeout``, as its other control calls are: a daemon that does not
        answer in time (frozen) raises ``DeadlineExceededError``, and the
        handle stays running as far as it knows."""
        if self._outcome is None:
            try:
                self._ask(self._client._stub.CancelTransfer, pb.CancelTransferRequest(transfer_id=self.id), self._client.timeout)
            except NotFoundError:
                # A call of ours an interrupt left running may have taken the
                # outcome first: it is ours.
                if self._pending is None:
                    raise
                self._join(None)
                if self._outcome is None:
                    raise
        return self._outcome.state == pb.TRANSFER_STATE_CANCELLED

    def __repr__(self) -> str:
        return f"Transfer(id={self.id}, state={self.state})"


def started(client: "Client", transfer_id: int, remote_ids: Any = None) -> Transfer:
    """The handle of a transfer the daemon started for ``client``, kept in
    its ``_transfers`` until the outcome lands: :meth:`Client.close`
    cancels those still running before it releases regions they use."""
    t = Transfer(client, transfer_id, remote_ids)
    client._transfers[t.id] = weakref.ref(t)
    t._tracked = True
    return t


_CODE_BY_VALUE = {c.value[0]: c for c in grpc.StatusCode}


@dataclass(frozen=True)
class StreamResult:
    """One completion of a :class:`SubmitStream`: the caller's ``tag`` and
    either ``result`` or ``error`` (what a unary submit would have raised)."""

    tag: int
    result: Optional[TransferResult] = None
    error: Optional[B2BError] = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def get(self) -> TransferResult:
        """The result, or raise the error."""
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


_END = object()


class SubmitStream:
    """Many submits on one ``SubmitStream`` call (:meth:`Client.submit_stream`).

    :meth:`submit` queues a plan under a tag and returns at once; iterate the
    stream (or call :meth:`next_result`) for :class:`StreamResult` objects in
    completion order, tags matched to the submits. :meth:`done_sending` ends
    the requests; the iteration then ends after the last result. ``close()``
    (or leaving a ``with`` block) stops what is still in flight through the
    daemon (CancelCall with the stream's :data:`CALL_ID_KEY`): it returns
    once the daemon answered that no submit of the stream can land any more.
    """

    def __init__(self, client: "Client", timeout: Optional[float]) -> None:
        timeout = check_timeout(timeout)
        if client.closed:
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE, "b2b client is closed")
        self._q: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._deadline = deadline_after(timeout)
        rpc_timeout, md = transfer_deadline(timeout)
        self._client = client
        self._call_id = new_call_id()
        self._call = client._stream_raw(
            iter(self._q.get, _END), timeout=rpc_timeout, metadata=(md or ()) + ((CALL_ID_KEY, self._call_id),)
        )
        self._tags = itertools.count(1)
        self._sending = True
        self._closed = False

    def submit(self, plan: PreparedTransfer, tag: Optional[int] = None) -> int:
        """Queue a submit of ``plan``; returns its tag (``tag``, or the next
        of 1, 2, ... when ``None``)."""
        if not self._sending:
            raise FailedPreconditionError(grpc.StatusCode.FAILED_PRECONDITION, "submit stream: done_sending was called")
        if plan._released:
            raise FailedPreconditionError(
                grpc.StatusCode.FAILED_PRECONDITION, f"prepared transfer {plan.handle} was released: prepare it again"
            )
        if tag is None:
            tag = next(self._tags)
        self._q.put(pb.SubmitStreamRequest(tag=tag, handle=plan.handle).SerializeToString())
        return tag

    def done_sending(self) -> None:
        """No more submits: the daemon answers those in flight, then ends the stream."""
        if self._sending:
            self._sending = False
            self._q.put(_END)

    def next_result(self) -> StreamResult:
        """The next completion (blocks); ``StopIteration`` once the stream ended."""
        try:
            r = next(self._call)
        except grpc.RpcError as e:
            if self._closed and e.code() == grpc.StatusCode.CANCELLED:
                raise StopIteration from None
            raise from_rpc_error(e, self._deadline) from e
        if r.code:
            code = _STATUS_BY_VALUE.get(r.code, grpc.StatusCode.UNKNOWN)
            return StreamResult(int(r.tag), None, error_for_code(code, r.message))
        return StreamResult(int(r.tag), TransferResult.from_proto(r.result))

    def __iter__(self) -> "SubmitStream":
        return self

    def __next__(self) -> StreamResult:
        return self.next_result()

    def close(self) -> None:
        """Stop sending and stop the submits in flight through the daemon:
        CancelCall answers once the stream ended there, so nothing of a
        cancelled pull lands after this returns. Without that answer within
        :data:`DEADLINE_GRACE` seconds the call is cancelled here. Results
        not yet read are lost."""
        if self._closed:
            return
        self._closed = True
        self.done_sending()
        try:
            if not self._call.done():
                self._client._stub.CancelCall(pb.CancelCallRequest(call_id=self._call_id), timeout=DEADLINE_GRACE)
        except Exception:  # pylint: disable=broad-except
            pass  # no daemon to stop it: cancelled here below
        finally:
            self._call.cancel()

    def __enter__(self) -> "SubmitStream":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()
