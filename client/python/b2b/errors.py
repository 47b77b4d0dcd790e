"""Exceptions raised by the b2b client.

Every failure the daemon reports arrives as a gRPC status (a code and a
message that names the field, the index and the limit). :func:`from_rpc_error`
is the one place that turns such a status into a :class:`B2BError` subclass;
the client's local argument checks raise the same classes (with the code the
daemon would have used), so callers catch one family of exceptions whichever
side noticed the problem.
"""

from __future__ import annotations

import math
import numbers
import secrets
import time
from typing import Any, Dict, Optional, Tuple, Type

import grpc

__all__ = [
    "B2BError",
    "NotFoundError",
    "InvalidArgumentError",
    "UnavailableError",
    "DeadlineExceededError",
    "WaitTimeoutError",
    "FailedPreconditionError",
    "ResourceExhaustedError",
    "PermissionDeniedError",
    "AbortedError",
    "AlreadyExistsError",
    "UnimplementedError",
    "CancelledError",
    "from_rpc_error",
    "error_for_code",
    "deadline_after",
]


class B2BError(Exception):
    """A call to the daemon failed.

    Attributes:
        code: the gRPC status code (``grpc.StatusCode``).
        message: the daemon's message (for local checks, the client's).
    """

    #: The status code this class stands for (``None`` on the base class).
    CODE: Optional[grpc.StatusCode] = None

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        name = self.code.name if isinstance(self.code, grpc.StatusCode) else str(self.code)
        return f"{name}: {self.message}"

    def __reduce__(self):  # keep pickling (multiprocessing) working
        return (type(self), (self.code, self.message))


class NotFoundError(B2BError):
    """A region, export name or file does not exist (``NOT_FOUND``)."""

    CODE = grpc.StatusCode.NOT_FOUND


class InvalidArgumentError(B2BError, ValueError):
    """The request is malformed: a bad field, index or length (``INVALID_ARGUMENT``).

    Also a :class:`ValueError`, so it reads naturally to code that validates
    arguments itself.
    """

    CODE = grpc.StatusCode.INVALID_ARGUMENT


class UnavailableError(B2BError):
    """The local daemon, a peer or a device cannot be reached (``UNAVAILABLE``)."""

    CODE = grpc.StatusCode.UNAVAILABLE


class DeadlineExceededError(B2BError):
    """The call's timeout passed before it finished (``DEADLINE_EXCEEDED``)."""

    CODE = grpc.StatusCode.DEADLINE_EXCEEDED


class WaitTimeoutError(DeadlineExceededError, TimeoutError):
    """A handle's ``wait(timeout)`` ran out while the transfer still runs: it
    goes on, and a later ``wait()``, ``done()`` or ``Client.poll`` gets its
    outcome. Also a :class:`TimeoutError`; the transfer's own deadline
    passing is a plain :class:`DeadlineExceededError` outcome instead."""


class FailedPreconditionError(B2BError):
    """Not possible in the current state, e.g. region in use, no GPU (``FAILED_PRECONDITION``)."""

    CODE = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhaustedError(B2BError):
    """A configured limit is exceeded, e.g. too many descriptors (``RESOURCE_EXHAUSTED``)."""

    CODE = grpc.StatusCode.RESOURCE_EXHAUSTED


class PermissionDeniedError(B2BError):
    """The caller may not do this, e.g. a file outside the shm dir (``PERMISSION_DENIED``)."""

    CODE = grpc.StatusCode.PERMISSION_DENIED


class AbortedError(B2BError):
    """A batch was cut off mid-flight; no success is reported for it (``ABORTED``)."""

    CODE = grpc.StatusCode.ABORTED


class AlreadyExistsError(B2BError):
    """An export name is already taken (``ALREADY_EXISTS``)."""

    CODE = grpc.StatusCode.ALREADY_EXISTS


class UnimplementedError(B2BError):
    """The daemon's build or host lacks the feature (``UNIMPLEMENTED``)."""

    CODE = grpc.StatusCode.UNIMPLEMENTED


class CancelledError(B2BError):
    """The transfer was cancelled (:meth:`b2b.Transfer.cancel`, or its client went away)."""

    CODE = grpc.StatusCode.CANCELLED


_BY_CODE: Dict[grpc.StatusCode, Type[B2BError]] = {
    cls.CODE: cls
    for cls in (
        NotFoundError,
        InvalidArgumentError,
        UnavailableError,
        DeadlineExceededError,
        FailedPreconditionError,
        ResourceExhaustedError,
        PermissionDeniedError,
        AbortedError,
        AlreadyExistsError,
        UnimplementedError,
        CancelledError,
    )
}


def error_for_code(code: grpc.StatusCode, message: str) -> B2BError:
    """Build the exception for a status code: the matching subclass, else :class:`B2BError`."""
    return _BY_CODE.get(code, B2BError)(code, message)


def from_rpc_error(err: grpc.RpcError, deadline: Optional[float] = None) -> B2BError:
    """Map a ``grpc.RpcError`` raised by a stub call to a :class:`B2BError`.

    This is the single mapping from gRPC statuses to Python exceptions.
    ``deadline`` is the call's deadline on :func:`time.monotonic`'s clock, if
    it had one: a grpc-go daemon resets a stream with ``RST_STREAM(CANCEL)``
    when the deadline it was sent expires, and that reset can reach this
    process before gRPC's own timer fires, which reports it as ``CANCELLED``.
    A ``CANCELLED`` that arrives once the deadline has passed is therefore
    reported as ``DEADLINE_EXCEEDED``, as grpc-go's client does.
    """
    code = grpc.StatusCode.UNKNOWN
    message = str(err)
    code_fn = getattr(err, "code", None)
    if callable(code_fn):
        c = code_fn()
        if isinstance(c, grpc.StatusCode):
            code = c
    details_fn = getattr(err, "details", None)
    if callable(details_fn):
        d = details_fn()
        if d is not None:
            message = d
    if code == grpc.StatusCode.CANCELLED and deadline is not None and time.monotonic() >= deadline:
        code = grpc.StatusCode.DEADLINE_EXCEEDED
        message = f"deadline exceeded (the daemon reset the call at its deadline: {message})"
    return error_for_code(code, message)


def deadline_after(timeout: Optional[float]) -> Optional[float]:
    """The :func:`time.monotonic` deadline of a call given ``timeout`` seconds (``None``: no deadline).

    Taken before the call starts, so it is never later than gRPC's own deadline.
    """
    return None if timeout is None else time.monotonic() + timeout


#: Request metadata carrying the caller's transfer deadline to the daemon, as
#: relative whole milliseconds (the Go side's ``internal/callerdeadline``).
TIMEOUT_KEY = "b2b-timeout-ms"
#: How much later than the caller's deadline a transfer's gRPC call ends:
#: time for the daemon to stop the data path and answer.
DEADLINE_GRACE = 5.0
_MAX_TIMEOUT_MS = 86_400_000  # the daemon's limit of TIMEOUT_KEY and of a ring record (24 h)
#: The daemon's limit of a request's ``timeout_ms`` field (StartTransfer,
#: WaitTransfer, WaitTransfers, TransferBlocks: 1 h, server/layouts.go);
#: a longer timeout is sent as this (:func:`timeout_ms`).
MAX_FIELD_TIMEOUT_MS = 3_600_000
#: The longest timeout, in seconds, a call is given (about three years):
#: gRPC fails a deadline of about 1e10 s at once (its clock is int64
#: nanoseconds), so :func:`check_timeout` takes anything longer, and
#: ``math.inf`` where a call's ``None`` is not "no limit", as this.
MAX_TIMEOUT = 1e8

_TIMEOUT_RULE = "want seconds > 0 (a number; math.inf: no limit) or None"
_WAIT_RULE = "want seconds >= 0 (a number; 0: do not wait; math.inf: no limit) or None"


def check_timeout(timeout: Any, name: str = "timeout", *, wait: bool = False) -> Optional[float]:
    """The one check of every ``timeout=`` of the API: ``None``, or seconds
    up to :data:`MAX_TIMEOUT`.

    A real number > 0 passes (``wait``: >= 0, where 0 asks without
    waiting), capped at MAX_TIMEOUT. ``math.inf`` is ``None`` for a wait
    (no limit) and MAX_TIMEOUT elsewhere: there ``None`` may mean the
    daemon's default deadline, and inf asks for the longest. NaN,
    negatives (0 too, but for a wait), bools and non-numbers raise
    :class:`InvalidArgumentError` naming ``name``, the value and the rule,
    where they used to reach ``int()`` or gRPC raw.
    """
    if timeout is None:
        return None
    cls = timeout.__class__
    if (cls is float or cls is int) and 0 < timeout <= MAX_TIMEOUT:  # the common case; NaN fails it
        return timeout
    rule = _WAIT_RULE if wait else _TIMEOUT_RULE
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, f"{name} {timeout!r} is a {cls.__name__}: {rule}")
    try:
        t = float(timeout)
    except OverflowError:  # an int past float's range
        t = math.inf if timeout > 0 else -math.inf
    if math.isnan(t) or t < 0 or (t == 0 and not wait):
        raise InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, f"{name} {timeout!r}: {rule}")
    if t > MAX_TIMEOUT:
        return None if wait and t == math.inf else MAX_TIMEOUT
    return timeout if cls is float or cls is int else t


def timeout_ms(timeout: Optional[float], limit: int = MAX_FIELD_TIMEOUT_MS) -> int:
    """A checked timeout (:func:`check_timeout`) as a request's
    ``timeout_ms``: whole milliseconds rounded up (never 0, which means
    none), at most ``limit``, the daemon's; ``None`` is 0."""
    if timeout is None:
        return 0
    return min(limit, max(1, math.ceil(timeout * 1000)))


def transfer_deadline(timeout: Optional[float]) -> Tuple[Optional[float], Optional[Tuple[Tuple[str, str], ...]]]:
    """The gRPC timeout and metadata of a call that moves bytes, given the
    caller's ``timeout`` seconds (checked here: :func:`check_timeout`).

    The caller's deadline goes to the daemon in :data:`TIMEOUT_KEY` and the
    call itself ends :data:`DEADLINE_GRACE` later, so that the
    ``DEADLINE_EXCEEDED`` the caller gets is the daemon's answer, sent once
    the transfer stopped: a pull writes the caller's memory, and no byte may
    land there after the answer. gRPC's own deadline would answer at once,
    whatever the daemon was doing. ``None``, and a timeout over the daemon's
    24 h, are sent without metadata: the call's own deadline (at most
    :data:`MAX_TIMEOUT`) is then the daemon's.
    """
    timeout = check_timeout(timeout)
    if timeout is None:
        return None, None
    ms = math.ceil(timeout * 1000)
    if ms > _MAX_TIMEOUT_MS:
        return timeout, None
    return timeout + DEADLINE_GRACE, ((TIMEOUT_KEY, str(ms)),)


#: Request metadata naming a transfer call, so that an interrupted caller can
#: stop it through the daemon (CancelCall; the Go side's ``internal/callid``).
CALL_ID_KEY = "b2b-call-id"


def new_call_id() -> str:
    """A fresh call id: 128 random bits as 32 hex digits."""
    return secrets.token_hex(16)
