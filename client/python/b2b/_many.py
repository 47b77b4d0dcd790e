"""Batched starts and waits: an engine step starts all of its transfers in
one ``StartTransfers`` call and waits for many handles in one
``WaitTransfers`` call, so its daemon round trips do not grow with the
number of requests (docs/kv.md, "Batched starts and polls").
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple, Union

import grpc

from ._common import _invalid, _op, _transport
from ._pack import pack_u32
from ._transfers import PreparedTransfer, Transfer, _Pending, _interrupts_deferred, started
from .errors import UnavailableError, WaitTimeoutError, check_timeout, deadline_after, from_rpc_error, timeout_ms
from .v1 import b2b_pb2 as pb

if TYPE_CHECKING:
    from .client import Client

#: The daemon's limit of requests per StartTransfers call;
#: :meth:`Client.start_many` splits longer lists into calls of this many.
MAX_START_TRANSFERS = 1024

#: Ids per WaitTransfers call (the daemon's poll limit).
MAX_WAIT_IDS = 1 << 16


@dataclass(frozen=True)
class Blocks:
    """One block-id transfer for :meth:`Client.start_many`: the arguments
    of :meth:`Client.transfer_blocks` (``wait=False``). ``timeout`` bounds
    it from its start; ``None``: the one given to ``start_many``. It is
    checked when the item is made (:func:`b2b.errors.check_timeout`)."""

    local_layout: str
    peer: str
    remote_layout: str
    local_ids: Any
    remote_ids: Any
    op: Union[None, str, int] = None
    notification: Optional[bytes] = None
    transport: Union[None, str, int] = None
    timeout: Optional[float] = None
    #: A trigger (``b2b.on_note(region, key)``): the transfer waits in the
    #: daemon until it fires. ``None``: it starts at once.
    after: Any = None

    def __post_init__(self) -> None:
        # A bad timeout is refused here, naming the item's field, and never
        # reaches the ring's or the request's arithmetic.
        object.__setattr__(self, "timeout", check_timeout(self.timeout, "Blocks.timeout"))

    def request(self) -> Any:
        """The ``StartTransferRequest`` (ids packed by numpy)."""
        req = pb.TransferBlocksRequest(
            local_layout=self.local_layout,
            peer=self.peer,
            remote_layout=self.remote_layout,
            local_ids=pack_u32(self.local_ids, "local_ids")[0],
            remote_ids=pack_u32(self.remote_ids, "remote_ids")[0],
            transport=_transport(self.transport),
            op=_op(self.op),
        )
        if self.notification is not None:
            req.notification = bytes(self.notification)
        out = pb.StartTransferRequest(blocks=req, timeout_ms=_ms(self.timeout))
        if self.after is not None:
            if not isinstance(self.after, pb.TransferTrigger):
                raise _invalid(f"after {self.after!r}: want b2b.on_note(region, key)")
            out.after.CopyFrom(self.after)
        return out


def _ms(timeout: Optional[float]) -> int:
    """A start's timeout_ms: checked, and over the daemon's limit sent as it."""
    return timeout_ms(check_timeout(timeout))


def _refused(client: "Client", res: Any, sent: int = -1, item: int = -1) -> Transfer:
    """A handle for a request the daemon refused: it has already failed,
    with the daemon's code and message (naming the request's index: the
    caller's ``item`` where the call carried it as ``sent``)."""
    msg = res.message
    if item != sent and msg.startswith(f"requests[{sent}]: "):
        msg = f"requests[{item}]: " + msg[len(f"requests[{sent}]: "):]
    t = Transfer(client, 0)
    t._take(pb.TransferOutcome(transfer_id=0, state=pb.TRANSFER_STATE_FAILED, code=res.code, message=msg))
    return t


def start_many(client: "Client", items: Sequence[Any], timeout: Optional[float]) -> List[Transfer]:
    """See :meth:`Client.start_many`."""
    from . import _ring_client  # it imports this module

    items = list(items)
    if items and all(isinstance(x, PreparedTransfer) for x in items) and client.ring is not None:
        return client.start_submits(items, timeout)
    out: List[Optional[Transfer]] = [None] * len(items)
    # The block transfers a ring record carries go in one publish.
    ring = client.ring if any(isinstance(x, Blocks) for x in items) else None
    if ring is not None:
        slot = client._ring
        at, recs = [], []
        for i, x in enumerate(items):
            rec = _ring_client.blocks_record(client, slot, ring, x, timeout) if isinstance(x, Blocks) else None
            if rec is not None:
                at.append(i)
                recs.append(rec)
        taken = set(at)
        rest = [i for i in range(len(items)) if i not in taken]
        reqs, rids = _requests([items[i] for i in rest], timeout)  # every item checked before any starts
        hs = _ring_client.start_blocks(client, slot, ring, recs, [items[i].remote_ids for i in at]) if recs else None
        if hs is None:  # a route not bound: gRPC takes them all, and answers the refusal
            rest = list(range(len(items)))
            reqs, rids = _requests(items, timeout)
        for i, h in zip(at, hs or ()):
            out[i] = h
    else:
        rest = list(range(len(items)))
        reqs, rids = _requests(items, timeout)
    for i, h in zip(rest, _start_grpc(client, reqs, rids, rest)):
        out[i] = h
    return out  # type: ignore[return-value]


def _requests(items: Sequence[Any], timeout: Optional[float]) -> Tuple[List[Any], List[Any]]:
    """The StartTransferRequests of items and their remote ids."""
    default_ms = _ms(timeout)
    reqs, rids = [], []
    for i, x in enumerate(items):
        if isinstance(x, Blocks):
            r, rid = x.request(), x.remote_ids
        elif isinstance(x, PreparedTransfer):
            r, rid = pb.StartTransferRequest(submit=pb.SubmitTransferRequest(handle=x.handle)), None
        elif isinstance(x, pb.StartTransferRequest):
            r, rid = x, None
        else:
            raise TypeError(f"start_many: items[{i}] is {type(x).__name__}: want b2b.Blocks, a PreparedTransfer "
                            f"or a StartTransferRequest")
        if not r.timeout_ms and default_ms:
            r = pb.StartTransferRequest.FromString(r.SerializeToString()) if r is x else r
            r.timeout_ms = default_ms
        reqs.append(r)
        rids.append(rid)
    return reqs, rids


def _start_grpc(client: "Client", reqs: Sequence[Any], rids: Sequence[Any], index: Sequence[int]) -> List[Transfer]:
    """Start reqs (the caller's items index[i]) in StartTransfers calls
    (one per MAX_START_TRANSFERS)."""
    out: List[Transfer] = []
    for at in range(0, len(reqs), MAX_START_TRANSFERS):
        part = reqs[at:at + MAX_START_TRANSFERS]
        # A start returns at once; an interrupt held back until it did
        # cannot lose the ids of transfers already running.
        with _interrupts_deferred():
            r = client._call(client.stub.StartTransfers, pb.StartTransfersRequest(requests=part), client.timeout)
        if len(r.results) != len(part):
            raise UnavailableError(grpc.StatusCode.INTERNAL,
                                   f"start_many: {len(part)} requests, the daemon answered {len(r.results)} results")
        for k, res in enumerate(r.results):
            out.append(_refused(client, res, k, index[at + k]) if res.code else started(client, res.transfer_id, rids[at + k]))
    return out


def outcomes(call: Any, req: Any, rpc_timeout: Optional[float], ts: Sequence[Transfer]) -> None:
    """One call that answers handles ``ts``' outcomes in order
    (WaitTransfers, PollTransfers): each lands in its handle. Interrupted,
    the call goes on and each handle keeps it, so an outcome the daemon
    hands over once is not lost."""
    deadline = deadline_after(rpc_timeout)
    with _interrupts_deferred():
        fut = call.future(req, timeout=rpc_timeout)
    try:
        r = fut.result()
    except grpc.RpcError as e:
        raise from_rpc_error(e, deadline) from e
    except BaseException:
        for i, t in enumerate(ts):
            t._keep(_Pending(fut, i))
        raise
    for t, o in zip(ts, r.outcomes):
        t._take(o)


def wait_grpc(client: "Client", ts: Sequence[Transfer], timeout: Optional[float], any_one: bool) -> None:
    """One WaitTransfers for daemon handles ``ts`` (none ended, none with
    a call running): their outcomes land in them. Interrupted, the call
    goes on and its answers land in the handles, as a poll's. A timeout
    over the daemon's limit of timeout_ms takes more calls."""
    if client.closed:
        raise UnavailableError(grpc.StatusCode.UNAVAILABLE, "b2b client is closed")
    timeout = check_timeout(timeout, wait=True)
    end = None if timeout is None else time.monotonic() + timeout
    for at in range(0, len(ts), MAX_WAIT_IDS):
        part = ts[at:at + MAX_WAIT_IDS]
        while part:
            req = pb.WaitTransfersRequest(transfer_ids=[t.id for t in part], any=any_one)
            rpc_timeout = None
            more = False  # the wait is longer than one call may ask
            if end is not None:
                left = max(0.0, end - time.monotonic())
                req.timeout_ms = timeout_ms(left)
                more = req.timeout_ms < left * 1000
                rpc_timeout = req.timeout_ms / 1000 + 30.0  # the daemon answers RUNNING at timeout_ms
            outcomes(client.stub.WaitTransfers, req, rpc_timeout, part)
            running = [t for t in part if t._outcome is None]
            if not more or (any_one and len(running) < len(part)):
                break
            part = running  # an ended id is reported once: ask only for the others


def wait_any(client: "Client", transfers: Sequence[Transfer], timeout: Optional[float]) -> List[Transfer]:
    """See :meth:`Client.wait_any`."""
    from . import _ring_client  # it imports this module

    timeout = check_timeout(timeout, wait=True)
    ts = list(transfers)
    if not ts:
        return []
    end = None if timeout is None else time.monotonic() + timeout
    client.poll(ts)  # no wait: ring completions land, and ended handles answer at once
    pause = 0.0005
    while True:
        done = [t for t in ts if t._outcome is not None]
        if done:
            return done
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            raise WaitTimeoutError(grpc.StatusCode.DEADLINE_EXCEEDED, f"none of {len(ts)} transfers ended in {timeout} s")
        ring = [t for t in ts if isinstance(t, _ring_client.RingTransfer)]
        ask = [t for t in ts if t._pending is None and not isinstance(t, _ring_client.RingTransfer)]
        if not ring and len(ask) == len(ts):
            wait_grpc(client, ask, left, True)  # one call: the daemon wakes us at the first end
            continue
        # Ring handles (or calls an interrupt left running) beside daemon
        # handles: no one call waits for both; look at each in turn.
        step = pause if left is None else min(pause, left)
        if ask:
            wait_grpc(client, ask, step, True)
        else:
            time.sleep(step)
        pause = min(pause * 2, 0.05)
        client.poll(ts)
