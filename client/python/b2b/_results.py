"""Plain results of the daemon's calls: region info, transfer and checksum
results, status, notifications.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import grpc
import numpy as np

from ._common import _MEMORY_NAME, _TRANSPORT_NAME
from .errors import from_rpc_error


# ---------------------------------------------------------------------------
# Plain results.


@dataclass(frozen=True)
class RegionInfo:
    """A region as the daemon describes it."""

    id: str
    export_name: str
    size: int
    kind: str  # "host" or "cuda"
    shm_path: str = ""
    shm_offset: int = 0
    cuda_device: int = 0
    active_batches: int = 0
    registered_with: Tuple[str, ...] = ()
    owner: str = ""  # "uid 1000", or a TLS identity over TCP
    pid: int = 0  # the registering process (0: unknown, a TCP caller)
    age_ns: int = 0  # since it was registered
    persist: bool = False  # False: released when its client's last connection closes

    @classmethod
    def from_proto(cls, r: Any) -> "RegionInfo":
        return cls(
            id=r.id,
            export_name=r.export_name,
            size=int(r.size),
            kind=_MEMORY_NAME.get(r.kind, str(r.kind)),
            shm_path=r.shm_path,
            shm_offset=int(r.shm_offset),
            cuda_device=int(r.cuda_device),
            active_batches=int(r.active_batches),
            registered_with=tuple(r.registered_with_names) or tuple(_TRANSPORT_NAME.get(k, str(k)) for k in r.registered_with),
            owner=r.owner,
            pid=int(r.pid),
            age_ns=int(r.age_ns),
            persist=bool(r.persist),
        )


@dataclass(frozen=True)
class PhaseTimings:
    """Where a call's time went inside the daemon, in nanoseconds
    (``PhaseTimings`` in the proto). A phase the call skipped is 0: a
    prepared submit does not decode, validate or plan."""

    decode_ns: int = 0  # receive and decode the request
    validate_ns: int = 0  # fields, regions, descriptor bounds and overlaps
    resolve_ns: int = 0  # the data path to the peer and the destination's key
    plan_ns: int = 0  # merge, split, build the work requests / frames
    post_ns: int = 0  # hand the work to the NIC or the sockets
    wire_ns: int = 0  # wait until every byte landed and the ack came back
    notify_ns: int = 0  # deliver the notification
    total_ns: int = 0  # the handler's whole time
    # Triggered transfers (b2b.stream): the time armed; and wall-clock
    # times (Unix ns, as time.time_ns() on the daemon's host) when the
    # watcher saw the counter's value, the first write was posted, and the
    # last was acknowledged (every byte landed). The last two on every transfer.
    armed_ns: int = 0
    trigger_seen_unix_ns: int = 0
    posted_unix_ns: int = 0
    landed_unix_ns: int = 0

    @classmethod
    def from_proto(cls, p: Any) -> "PhaseTimings":
        return cls(
            int(p.decode_ns), int(p.validate_ns), int(p.resolve_ns), int(p.plan_ns),
            int(p.post_ns), int(p.wire_ns), int(p.notify_ns), int(p.total_ns),
            int(p.armed_ns), int(p.trigger_seen_unix_ns), int(p.posted_unix_ns), int(p.landed_unix_ns),
        )

    def as_dict(self) -> Dict[str, int]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


@dataclass(frozen=True)
class TransferResult:
    """What a finished :meth:`Client.batch_transfer` or
    :meth:`PreparedTransfer.submit` reports."""

    blocks: int
    bytes: int
    transport: str  # the transport that carried it: "tcp", "verbs" or "local"
    elapsed: float  # seconds on the daemon's data path
    segments: int = 0  # after merging adjacent blocks
    work_requests: int = 0  # verbs: WRs posted; tcp: wire frames
    phases: Optional[PhaseTimings] = None  # the daemon's breakdown, when it sent one

    @property
    def elapsed_ns(self) -> int:
        return int(round(self.elapsed * 1e9))

    @classmethod
    def from_proto(cls, r: Any) -> "TransferResult":
        return cls(
            int(r.blocks),
            int(r.bytes),
            r.transport_name or _TRANSPORT_NAME.get(r.transport, str(r.transport)),
            r.elapsed_ns / 1e9,
            int(r.segments),
            int(r.work_requests),
            PhaseTimings.from_proto(r.phases) if r.HasField("phases") else None,
        )


@dataclass(frozen=True)
class ChecksumResult:
    """A :meth:`Client.checksum` answer.

    ``block_digests`` is a read-only ``uint64`` array (one digest per block)
    when ``per_block`` was set, else ``None``. ``digest`` is one number that
    covers every listed byte and their order; b2bd computes it as the same
    hash over the per-block digests packed as little-endian uint64s.
    """

    digest: int
    algorithm: str
    blocks: int
    bytes: int
    block_digests: Optional[np.ndarray] = None


@dataclass(frozen=True)
class TransportStatus:
    kind: str
    available: bool
    detail: str


@dataclass(frozen=True)
class Status:
    """The daemon's identity, transports and counters (``StatusResponse``)."""

    version: str
    node_name: str
    peer_address: str
    transports: Tuple[TransportStatus, ...]
    cuda_available: bool
    cuda_detail: str
    regions: int
    batches_sent: int
    batches_received: int
    batches_failed: int
    bytes_sent: int
    bytes_received: int
    max_descriptors: int
    peers_connected: int
    #: Async transfers running, and held (running, or ended and not yet reported).
    transfers_in_flight: int = 0
    transfers_held: int = 0

    @classmethod
    def from_proto(cls, s: Any) -> "Status":
        return cls(
            version=s.version,
            node_name=s.node_name,
            peer_address=s.peer_address,
            transports=tuple(
                TransportStatus(t.kind_name or _TRANSPORT_NAME.get(t.kind, str(t.kind)), bool(t.available), t.detail)
                for t in s.transports
            ),
            cuda_available=bool(s.cuda_available),
            cuda_detail=s.cuda_detail,
            regions=int(s.regions),
            batches_sent=int(s.batches_sent),
            batches_received=int(s.batches_received),
            batches_failed=int(s.batches_failed),
            bytes_sent=int(s.bytes_sent),
            bytes_received=int(s.bytes_received),
            max_descriptors=int(s.max_descriptors),
            peers_connected=int(s.peers_connected),
            transfers_in_flight=int(s.transfers_in_flight),
            transfers_held=int(s.transfers_held),
        )


@dataclass(frozen=True)
class Notification:
    """A sender's note about a batch that fully landed in a watched region."""

    region: str  # export name the batch was written to
    sender: str  # the sending daemon's node name
    notification: bytes  # the sender's payload
    blocks: int
    bytes: int
    dropped: int  # notifications lost before this one because the watcher fell behind


class Watch:
    """An open :meth:`Client.watch` stream: iterate it to receive
    :class:`Notification` objects as batches land. ``cancel()`` (or leaving a
    ``with`` block) ends the iteration."""

    def __init__(self, call: Any, deadline: Optional[float] = None) -> None:
        self._call = call
        self._deadline = deadline
        self._cancelled = False

    def __iter__(self) -> "Watch":
        return self

    def __next__(self) -> Notification:
        try:
            n = next(self._call)
        except grpc.RpcError as e:
            if self._cancelled and e.code() == grpc.StatusCode.CANCELLED:
                raise StopIteration from None
            raise from_rpc_error(e, self._deadline) from e
        return Notification(
            region=n.region,
            sender=n.sender,
            notification=n.notification,
            blocks=int(n.blocks),
            bytes=int(n.bytes),
            dropped=int(n.dropped),
        )

    def cancel(self) -> None:
        """Stop watching; a pending or later ``next()`` ends the iteration."""
        self._cancelled = True
        self._call.cancel()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.cancel()
