"""The b2b client: register memory with the local b2bd, move batches of blocks
to a peer, checksum them.

Mirrors the Go client (``client/client.go``). All calls are synchronous and
thread-safe (one gRPC channel per :class:`Client`). Failures reported by the
daemon raise :class:`~b2b.errors.B2BError` subclasses; see :mod:`b2b.errors`.
"""

from __future__ import annotations

import mmap
import os
import threading
import warnings
import weakref
from dataclasses import dataclass
import ipaddress
import itertools
import math
import queue
import time
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import grpc
import numpy as np

from . import _cuda
from ._pack import check_block_size, pack_u32, pack_u64, unpack_u64
from .errors import (
    B2BError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
    WaitTimeoutError,
    error_for_code,
    deadline_after,
    from_rpc_error,
    transfer_deadline,
    CALL_ID_KEY,
    DEADLINE_GRACE,
    new_call_id,
)
from .v1 import b2b_pb2 as pb
from .v1 import b2b_pb2_grpc as pb_grpc

__all__ = [
    "Client",
    "HostRegion",
    "CudaRegion",
    "RegionInfo",
    "Descriptors",
    "TransferResult",
    "ChecksumResult",
    "Status",
    "TransportStatus",
    "Notification",
    "Watch",
    "PhaseTimings",
    "PreparedTransfer",
    "SubmitStream",
    "StreamResult",
    "Transfer",
    "DEFAULT_SOCKET",
    "MAX_MESSAGE_BYTES",
]

#: The daemon's default local API socket.
DEFAULT_SOCKET = "/run/b2bd/b2bd.sock"

#: gRPC message size limit, both ways: room for descriptor lists of a million blocks.
MAX_MESSAGE_BYTES = 128 << 20

_TRANSPORT_BY_NAME = {
    "": pb.TRANSPORT_KIND_UNSPECIFIED,
    "auto": pb.TRANSPORT_KIND_UNSPECIFIED,
    "tcp": pb.TRANSPORT_KIND_TCP,
    "verbs": pb.TRANSPORT_KIND_VERBS,
    "local": pb.TRANSPORT_KIND_LOCAL,
}
_TRANSPORT_NAME = {
    pb.TRANSPORT_KIND_UNSPECIFIED: "unspecified",
    pb.TRANSPORT_KIND_TCP: "tcp",
    pb.TRANSPORT_KIND_VERBS: "verbs",
    pb.TRANSPORT_KIND_LOCAL: "local",
}
_MEMORY_NAME = {
    pb.MEMORY_KIND_UNSPECIFIED: "unspecified",
    pb.MEMORY_KIND_HOST: "host",
    pb.MEMORY_KIND_CUDA: "cuda",
}
_ALGORITHM_BY_NAME = {
    "crc32c": pb.CHECKSUM_ALGORITHM_CRC32C,
    "xxh64": pb.CHECKSUM_ALGORITHM_XXH64,
}
_ALGORITHM_NAME = {
    pb.CHECKSUM_ALGORITHM_UNSPECIFIED: "crc32c",
    pb.CHECKSUM_ALGORITHM_CRC32C: "crc32c",
    pb.CHECKSUM_ALGORITHM_XXH64: "xxh64",
}


def _invalid(msg: str) -> InvalidArgumentError:
    return InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, msg)


def _target(address: str) -> str:
    """A gRPC target for a socket path, ``unix:`` URI or ``host:port``."""
    if not isinstance(address, str) or not address:
        raise TypeError("address must be a non-empty str: a socket path, unix:///path or host:port")
    if address.startswith("/"):
        return "unix://" + address
    return address


def _host_port(address: str) -> Optional[Tuple[str, str]]:
    """(host, port) of a ``host:port`` or ``[v6]:port`` address; None for a
    Unix socket path or URI."""
    if address.startswith("/") or address.startswith("unix:"):
        return None
    rest = address.split("://", 1)[1] if "://" in address else address  # dns:///host:port
    rest = rest.lstrip("/")
    if rest.startswith("["):
        host, _, port = rest[1:].partition("]")
        return host, port.lstrip(":")
    host, sep, port = rest.rpartition(":")
    return (host, port) if sep else (rest, "")


def _is_loopback(host: str) -> bool:
    """As the daemon's auth.IsLoopback: "localhost" or a loopback IP literal."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _read_pem(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise _invalid(f"{what} {path!r}: cannot read it: {e.strerror or e}") from None


def _tls_credentials(
    address: str, ca: Optional[str], cert: Optional[str], key: Optional[str], server_name: Optional[str]
) -> Optional[grpc.ChannelCredentials]:
    """Mutual-TLS credentials for a TCP address, as the Go client's
    auth.LoadPeerTLS + ClientFor; None for plaintext (a socket, or loopback)."""
    given = {"tls_ca": ca, "tls_cert": cert, "tls_key": key}
    hp = _host_port(address)
    if not any(given.values()):
        if server_name:
            raise _invalid("tls_server_name is set without tls_ca, tls_cert and tls_key")
        if hp is not None and not _is_loopback(hp[0]):
            raise _invalid(
                f"address {address!r} is not loopback: b2bd serves its API off loopback only over mutual TLS; "
                "give tls_ca, tls_cert and tls_key (the daemon's --tls-* files or a certificate from the same CA)"
            )
        return None
    missing = [k for k, v in given.items() if not v]
    if missing:
        raise _invalid(f"TLS needs tls_ca, tls_cert and tls_key together: {', '.join(missing)} missing")
    if hp is None:
        raise _invalid(
            f"address {address!r} is a Unix socket: TLS applies to a host:port address (--api-listen); "
            "drop tls_ca, tls_cert and tls_key"
        )
    return grpc.ssl_channel_credentials(
        root_certificates=_read_pem(ca, "tls_ca"),
        private_key=_read_pem(key, "tls_key"),
        certificate_chain=_read_pem(cert, "tls_cert"),
    )


def _transport(t: Union[None, str, int]) -> int:
    if t is None:
        return pb.TRANSPORT_KIND_UNSPECIFIED
    if isinstance(t, str):
        try:
            return _TRANSPORT_BY_NAME[t.lower()]
        except KeyError:
            raise _invalid(
                f"transport {t!r}: want 'auto', 'tcp', 'verbs', 'local' or None (None and 'auto': the daemons choose)"
            ) from None
    if isinstance(t, int) and t in _TRANSPORT_NAME:
        return int(t)
    raise _invalid(f"transport {t!r}: want 'auto', 'tcp', 'verbs', 'local', None or a TransportKind value")


def _op(op: Union[None, str, int]) -> int:
    """A transfer's direction: "write" (push, the default) or "read" (pull)."""
    if op is None or op == "write":
        return pb.TRANSFER_OP_WRITE
    if op == "read":
        return pb.TRANSFER_OP_READ
    if isinstance(op, int) and op in (pb.TRANSFER_OP_WRITE, pb.TRANSFER_OP_READ):
        return int(op)
    raise _invalid(f"op {op!r}: want 'write' (push) or 'read' (pull)")


def _grants(readers: Sequence[str]) -> List[str]:
    if isinstance(readers, str):
        raise TypeError("readers: expected a sequence of peer identities (or ['*']), got a str")
    return list(readers)


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
            registered_with=tuple(_TRANSPORT_NAME.get(k, str(k)) for k in r.registered_with),
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
            _TRANSPORT_NAME.get(r.transport, str(r.transport)),
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
                TransportStatus(_TRANSPORT_NAME.get(t.kind, str(t.kind)), bool(t.available), t.detail)
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


# ---------------------------------------------------------------------------
# Descriptors.


class Descriptors:
    """A packed descriptor list: block ``i`` copies ``lengths[i]`` (or
    ``block_size``) bytes from ``src_offsets[i]`` to ``dst_offsets[i]``.

    Packing happens once, here (numpy, no per-element Python work); pass the
    object to :meth:`Client.batch_transfer` as ``descriptors=`` to reuse it
    across transfers with the same layout. Arrays may be numpy arrays of any
    integer dtype, lists of ints or ``array.array('Q')``. Only cheap checks are
    made (types, shapes, lengths agree, no negatives); the daemon checks bounds.
    """

    __slots__ = ("_msg", "count")

    def __init__(
        self,
        src_offsets: Any,
        dst_offsets: Any,
        lengths: Any = None,
        block_size: Optional[int] = None,
    ) -> None:
        src, n = pack_u64(src_offsets, "descriptors.src_offsets")
        dst, m = pack_u64(dst_offsets, "descriptors.dst_offsets")
        if m != n:
            raise _invalid(
                f"descriptors.dst_offsets has {m} entries, src_offsets has {n}: they must be equal"
            )
        lens = b""
        if lengths is not None and block_size is not None:
            raise _invalid("descriptors: lengths and block_size are both set: give one")
        if lengths is None and block_size is None:
            raise _invalid("descriptors: neither lengths nor block_size is set")
        if lengths is not None:
            lens, k = pack_u64(lengths, "descriptors.lengths")
            if k != n:
                raise _invalid(
                    f"descriptors.lengths has {k} entries, src_offsets has {n}: they must be equal"
                )
        self._msg = pb.Descriptors(
            src_offsets=src,
            dst_offsets=dst,
            lengths=lens,
            block_length=check_block_size(block_size),
        )
        #: Number of blocks.
        self.count = n

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        bl = self._msg.block_length
        return f"Descriptors(count={self.count}, {'block_size=%d' % bl if bl else 'per-block lengths'})"


# ---------------------------------------------------------------------------
# Regions.


class _Region:
    """Common part of host and CUDA regions: identity and release."""

    def __init__(self, client: "Client", info: RegionInfo, deregister_on_close: bool) -> None:
        self._client = client
        self._info = info
        self._deregister_on_close = deregister_on_close
        self._deregistered = False
        self._closed = False

    @property
    def info(self) -> RegionInfo:
        """The daemon's description of the region when it was registered (or last exported)."""
        return self._info

    @property
    def id(self) -> str:
        """The daemon-assigned region ID."""
        return self._info.id

    @property
    def size(self) -> int:
        """The region's size in bytes."""
        return self._info.size

    @property
    def export_name(self) -> str:
        """The name peers write into it by ("" when not exported)."""
        return self._info.export_name

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def deregistered(self) -> bool:
        """Whether this object has released the region in the daemon."""
        return self._deregistered

    def _set_info(self, info: RegionInfo) -> None:
        self._info = info

    def _on_deregistered(self) -> None:
        self._deregistered = True

    def _release_local(self) -> None:
        """Drop this process's hold on the memory (override)."""

    def close(self, deregister: Optional[bool] = None) -> None:
        """Release the region here and, if asked, in the daemon.

        ``deregister`` defaults to the ``deregister_on_close`` the region was
        registered with (``True`` unless said otherwise). A region the daemon
        no longer knows is not an error. Other daemon errors (for example
        ``FailedPreconditionError`` while a batch uses the region) are raised
        after the local mapping is released; the region then stays registered
        and can be deregistered later with :meth:`Client.deregister`.
        """
        if self._closed:
            return
        self._closed = True
        dereg = self._deregister_on_close if deregister is None else deregister
        err: Optional[B2BError] = None
        if dereg and not self._deregistered and not self._client.closed:
            try:
                self._client.deregister(self)
            except NotFoundError:
                self._on_deregistered()
            except B2BError as e:
                err = e
        self._client._forget(self)
        self._release_local()
        if err is not None:
            raise err

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"{type(self).__name__}(id={self.id!r}, size={self.size}, "
            f"export_name={self.export_name!r}, {state})"
        )


class HostRegion(_Region):
    """Host memory shared with the daemon: a shared-memory file mapped
    ``MAP_SHARED`` both here and in the daemon.

    ``array`` (numpy ``uint8``) and ``memoryview`` are views of the mapping:
    bytes written through them are what the daemon sends, and bytes a peer
    writes show up in them once the transfer has returned.
    """

    def __init__(self, client: "Client", info: RegionInfo, mm: mmap.mmap, deregister_on_close: bool) -> None:
        super().__init__(client, info, deregister_on_close)
        self._mmap: Optional[mmap.mmap] = mm
        self._array: Optional[np.ndarray] = None
        self._view: Optional[memoryview] = None

    def _live(self) -> mmap.mmap:
        if self._mmap is None:
            raise ValueError(f"region {self.id} is closed")
        return self._mmap

    @property
    def mmap(self) -> mmap.mmap:
        """The ``mmap`` object itself."""
        return self._live()

    @property
    def array(self) -> np.ndarray:
        """A writable numpy ``uint8`` view of the whole region (no copy)."""
        if self._array is None:
            self._array = np.frombuffer(self._live(), dtype=np.uint8)
        return self._array

    @property
    def memoryview(self) -> memoryview:
        """A writable ``memoryview`` of the whole region (no copy)."""
        if self._view is None:
            self._view = memoryview(self._live())
        return self._view

    @property
    def shm_path(self) -> str:
        return self._info.shm_path

    def _release_local(self) -> None:
        """Unmap. If views handed out earlier are still alive, the mapping
        stays valid until the last of them is gone (it is never pulled from
        under a live numpy array)."""
        mm, self._mmap = self._mmap, None
        self._array = None
        if self._view is not None:
            try:
                self._view.release()
            except BufferError:
                pass  # a view of the view is still alive
            self._view = None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # outstanding exports: unmapped when the last one is collected


class CudaRegion(_Region):
    """A PyTorch CUDA tensor's memory, registered through a CUDA IPC handle.

    The region's bytes are exactly the tensor's (``offset 0`` is its first
    element). The object keeps the tensor alive until it is closed. GPU work
    is not ordered against transfers by b2b: synchronise (for example
    ``torch.cuda.synchronize()``) before a transfer reads the tensor and
    after one writes it.
    """

    def __init__(self, client: "Client", info: RegionInfo, tensor: Any, share: _cuda.CudaShare, deregister_on_close: bool) -> None:
        super().__init__(client, info, deregister_on_close)
        self._tensor = tensor
        self._share: Optional[_cuda.CudaShare] = share

    @property
    def tensor(self) -> Any:
        """The registered tensor (``None`` once closed)."""
        return self._tensor

    @property
    def device(self) -> int:
        return self._info.cuda_device

    @property
    def ipc_offset(self) -> int:
        """Byte offset of the tensor inside the allocation the IPC handle names."""
        return self._share.offset if self._share is not None else 0

    def _on_deregistered(self) -> None:
        super()._on_deregistered()
        # The daemon has closed its IPC mapping: hand the producer's ref count back.
        share, self._share = self._share, None
        if share is not None:
            _release_ipc_counter(share)

    def _release_local(self) -> None:
        if self._deregistered:
            self._tensor = None
        # Still registered (deregister=False, or it failed): the daemon may map
        # the memory, so the tensor stays referenced here.


def _release_ipc_counter(share: _cuda.CudaShare) -> None:
    if share.release_counter is None or not share.ref_counter_handle:
        return
    try:
        share.release_counter(share.ref_counter_handle, share.ref_counter_offset)
    except Exception as e:  # best effort, as in torch itself
        warnings.warn(f"b2b: releasing the CUDA IPC ref counter failed: {e}", RuntimeWarning, stacklevel=3)


RegionRef = Union[str, _Region, RegionInfo]


def _region_id(r: RegionRef, what: str) -> str:
    if isinstance(r, str):
        return r
    if isinstance(r, (_Region, RegionInfo)):
        return r.id
    raise TypeError(f"{what}: expected a region object or region ID str, got {type(r).__name__}")


def _export_name(r: Union[str, _Region, RegionInfo]) -> str:
    if isinstance(r, str):
        return r
    if isinstance(r, (_Region, RegionInfo)):
        if not r.export_name:
            raise _invalid(f"dst_region: region {r.id} is not exported: give its export name")
        return r.export_name
    raise TypeError(f"dst_region: expected an export name str, got {type(r).__name__}")


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
        self.timeout = timeout
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
        timeout = self.timeout if timeout is None else timeout
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

    __slots__ = ("_client", "id", "_outcome", "_pending", "remote_ids", "__weakref__")

    def __init__(self, client: "Client", transfer_id: int, remote_ids: Any = None) -> None:
        self._client = client
        #: The daemon's id of the transfer (never 0).
        self.id = int(transfer_id)
        #: A block transfer's destination ids as given (for an engine's
        #: ``get_block_ids_with_load_errors``); ``None`` for other kinds.
        self.remote_ids = remote_ids
        self._outcome: Any = None
        self._pending: Optional[_Pending] = None

    def _take(self, o: Any) -> bool:
        if self._outcome is not None:
            return True
        if o.state != _RUNNING:
            self._outcome = o
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
        fut = method.future(req, timeout=rpc_timeout)
        try:
            o = fut.result()
        except grpc.RpcError as e:
            raise from_rpc_error(e, deadline) from e
        except BaseException:
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
        return self._outcome

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
        ``timeout`` (seconds) and the transfer still running then, raise
        :class:`WaitTimeoutError` (a ``TimeoutError``): the transfer goes on."""
        if timeout is not None and timeout < 0:
            raise _invalid(f"timeout {timeout!r}: want seconds >= 0, or None")
        end = None if timeout is None else time.monotonic() + timeout
        if self._outcome is None and not self._join(timeout):
            raise WaitTimeoutError(grpc.StatusCode.DEADLINE_EXCEEDED, f"transfer {self.id} still running after {timeout} s")
        if self._outcome is None:
            req = pb.WaitTransferRequest(transfer_id=self.id)
            rpc_timeout = None
            if end is not None:
                left = max(0.0, end - time.monotonic())
                req.timeout_ms = max(1, int(left * 1000))
                rpc_timeout = left + 30.0  # the daemon answers RUNNING at timeout_ms
            if not self._take(self._ask(self._client._stub.WaitTransfer, req, rpc_timeout)):
                raise WaitTimeoutError(grpc.StatusCode.DEADLINE_EXCEEDED, f"transfer {self.id} still running after {timeout} s")
        return self.result

    def cancel(self) -> bool:
        """Cancel the transfer; returns once no byte of it lands any more.
        ``True`` if it was cancelled, ``False`` if it had ended otherwise
        (its outcome is kept: see :attr:`result`)."""
        if self._outcome is None:
            try:
                self._ask(self._client._stub.CancelTransfer, pb.CancelTransferRequest(transfer_id=self.id), None)
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


# ---------------------------------------------------------------------------
# Client.


def _dereg_default(deregister_on_close: Optional[bool], persist: bool) -> bool:
    """A region that is to persist is not released by closing it, unless asked."""
    return (not persist) if deregister_on_close is None else bool(deregister_on_close)



def _notification_bytes(notification: Any) -> bytes:
    """A notification is bytes: an int would become that many zero bytes."""
    if not isinstance(notification, (bytes, bytearray, memoryview)):
        raise TypeError(f"notification: expected bytes, got {type(notification).__name__}")
    return bytes(notification)

class Client:
    """A connection to the local b2bd.

    Args:
        address: the daemon's local API: a Unix socket path
            (``"/run/b2bd/b2bd.sock"``), a ``"unix:///path"`` URI, or ``"host:port"``
            (a daemon started with ``--api-listen``).
        timeout: deadline in seconds for control calls (registration, status,
            checksums). Batch transfers take their own ``timeout``.
        options: extra gRPC channel options, appended to the client's.
        tls_ca, tls_cert, tls_key: PEM file paths, all three together, for a
            daemon's ``--api-listen`` off loopback, which takes mutual TLS
            only (the daemon's ``--tls-*`` files, or a client certificate from
            the same CA): the daemon's certificate is checked against
            ``tls_ca`` and must name the host in ``address`` (or
            ``tls_server_name``); ours is checked by the daemon, and regions
            registered over it belong to our certificate's identity. Not for a
            Unix socket, where the kernel says who calls.
        tls_server_name: the name the daemon's certificate must carry, when it
            is not the host in ``address`` (an IP address, say).

    Use as a context manager, or call :meth:`close`. Closing the client
    releases the regions it registered that are still open and were
    registered with ``deregister_on_close=True``.

    Regions are leased to this process: unless registered with
    ``persist=True``, the daemon releases them when the process's last
    connection to it closes, so a client that crashes or is killed leaves
    nothing registered behind.
    """

    def __init__(
        self,
        address: str = DEFAULT_SOCKET,
        *,
        timeout: Optional[float] = 60.0,
        options: Optional[List[Tuple[str, Any]]] = None,
        tls_ca: Optional[str] = None,
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
        tls_server_name: Optional[str] = None,
    ) -> None:
        target = _target(address)
        creds = _tls_credentials(address, tls_ca, tls_cert, tls_key, tls_server_name)
        self.address = address
        self.timeout = timeout
        opts: List[Tuple[str, Any]] = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.enable_http_proxy", 0),  # a local daemon: never through a proxy
            # Retry a (re)starting local daemon quickly. (Not min_reconnect_backoff_ms:
            # gRPC also uses it as the connect timeout.)
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2000),
            # A connection of its own: the daemon ties prepared plans to the
            # client's connection (only it may submit them; they are freed
            # when it closes). gRPC would otherwise share one connection
            # between all channels of a process with the same target.
            ("grpc.use_local_subchannel_pool", 1),
            # The daemon also leases the regions registered here to this
            # process's connections: an idle channel must keep its
            # connection (gRPC's default drops it after 30 idle minutes).
            ("grpc.client_idle_timeout_ms", 2**31 - 1),
        ]
        if creds is not None and tls_server_name:
            opts.append(("grpc.ssl_target_name_override", tls_server_name))
        opts.extend(options or [])
        if creds is None:
            self._channel = grpc.insecure_channel(target, options=opts)
        else:
            self._channel = grpc.secure_channel(target, creds, options=opts)
        self._stub = pb_grpc.B2BStub(self._channel)
        # The submit paths take requests serialised once, in advance (bytes
        # pass through a None serializer): a submit is the gRPC call alone.
        self._submit_raw = self._channel.unary_unary(
            "/b2b.v1.B2B/SubmitTransfer",
            request_serializer=None,
            response_deserializer=pb.BatchTransferResponse.FromString,
        )
        self._stream_raw = self._channel.stream_stream(
            "/b2b.v1.B2B/SubmitStream",
            request_serializer=None,
            response_deserializer=pb.SubmitStreamResponse.FromString,
        )
        self._closed = False
        self._lock = threading.Lock()
        self._regions: "weakref.WeakSet[_Region]" = weakref.WeakSet()
        self._layouts: set = set()  # leased layouts this client registered

    # -- plumbing ---------------------------------------------------------

    @property
    def stub(self) -> pb_grpc.B2BStub:
        """The raw generated stub, for calls this class does not wrap."""
        return self._stub

    @property
    def closed(self) -> bool:
        return self._closed

    def _call(self, method: Any, request: Any, timeout: Optional[float], wait_for_ready: Optional[bool] = None) -> Any:
        if self._closed:
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE, "b2b client is closed")
        deadline = deadline_after(timeout)
        try:
            return method(request, timeout=timeout, wait_for_ready=wait_for_ready)
        except grpc.RpcError as e:
            raise from_rpc_error(e, deadline) from e

    def _transfer_call(self, method: Any, request: Any, timeout: Optional[float]) -> Any:
        """:meth:`_call` for a call that moves bytes: the daemon answers at
        the caller's deadline, once the transfer stopped (transfer_deadline)."""
        if self._closed:
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE, "b2b client is closed")
        deadline = deadline_after(timeout)
        rpc_timeout, md = transfer_deadline(timeout)
        try:
            return self._interruptible(method, request, rpc_timeout, md)
        except grpc.RpcError as e:
            raise from_rpc_error(e, deadline) from e

    def _interruptible(self, method: Any, request: Any, rpc_timeout: Optional[float], md: Any) -> Any:
        """Makes a transfer call whose interruption (``KeyboardInterrupt``, or
        any exception raised into this thread while it waits) reaches the
        daemon as CancelCall, with the call's id (:data:`CALL_ID_KEY`), before
        the interrupt is raised again. CancelCall answers once the call ended
        (or, for a call that has not arrived yet, makes the daemon refuse it),
        so no byte of a pull lands after the interrupt, wherever it struck.
        Without that answer within :data:`DEADLINE_GRACE` seconds the call is
        cancelled here."""
        call_id = new_call_id()
        fut = None
        try:
            fut = method.future(request, timeout=rpc_timeout, metadata=(md or ()) + ((CALL_ID_KEY, call_id),))
            return fut.result()
        except grpc.RpcError:
            raise
        except BaseException:
            try:
                self._stub.CancelCall(pb.CancelCallRequest(call_id=call_id), timeout=DEADLINE_GRACE)
            except Exception:  # pylint: disable=broad-except
                pass  # no daemon to stop it: cancelled here below
            finally:
                if fut is not None:
                    fut.cancel()
            raise

    def _track(self, r: _Region) -> None:
        with self._lock:
            self._regions.add(r)

    def _forget(self, r: _Region) -> None:
        with self._lock:
            self._regions.discard(r)

    def close(self) -> None:
        """Release open regions registered with ``deregister_on_close`` and close the channel."""
        if self._closed:
            return
        with self._lock:
            regions, layouts = list(self._regions), sorted(self._layouts)
        # Layouts first: they hold their regions in the daemon.
        for name in layouts:
            try:
                self.deregister_layout(name)
            except NotFoundError:
                pass
            except B2BError as e:
                warnings.warn(f"b2b: releasing layout {name!r} on close: {e}", RuntimeWarning, stacklevel=2)
        for r in regions:
            if r._deregister_on_close:
                try:
                    r.close()
                except B2BError as e:
                    warnings.warn(f"b2b: releasing region {r.id} on close: {e}", RuntimeWarning, stacklevel=2)
        self._closed = True
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.address!r}{', closed' if self._closed else ''})"

    def wait_ready(self, timeout: float = 10.0) -> "Status":
        """Wait up to ``timeout`` seconds for the daemon to answer; return its status."""
        resp = self._call(self._stub.Status, pb.StatusRequest(), timeout, wait_for_ready=True)
        return Status.from_proto(resp)

    # -- regions ----------------------------------------------------------

    def register_host(
        self,
        size: int,
        export_name: Optional[str] = None,
        *,
        persist: bool = False,
        deregister_on_close: Optional[bool] = None,
        readers: Sequence[str] = (),
        read_only: bool = False,
    ) -> HostRegion:
        """Ask the daemon for ``size`` bytes of shared host memory and map it here.

        Args:
            size: bytes (> 0).
            export_name: if set, peers can write into the region under this name.
            readers: peers that may also read (pull from) the export; ``["*"]``:
                every authenticated peer. Empty (the default): write-only.
            read_only: no peer may write the export.
            persist: keep the region registered after this process's
                connections to the daemon close (exit, crash, kill); by default
                it is leased to them and released with the last one.
            deregister_on_close: whether :meth:`HostRegion.close` (and leaving a
                ``with`` block) also releases the region in the daemon; by
                default, unless ``persist``.
        """
        size = _uint("size", size)
        req = pb.RegisterRegionRequest(
            host_alloc=pb.HostAlloc(size=size),
            export_name=export_name or "",
            persist=bool(persist),
            readers=_grants(readers),
            read_only=bool(read_only),
        )
        resp = self._call(self._stub.RegisterRegion, req, self.timeout)
        return self._map_host(resp.region, _dereg_default(deregister_on_close, persist))

    def register_host_file(
        self,
        path: str,
        offset: int = 0,
        size: int = 0,
        export_name: Optional[str] = None,
        *,
        persist: bool = False,
        deregister_on_close: Optional[bool] = None,
    ) -> HostRegion:
        """Register ``[offset, offset+size)`` of an existing file in the daemon's
        shm directory (``size`` 0: to the end of the file) and map it here.

        ``path`` may be absolute or relative to the daemon's shm directory;
        ``offset`` must be page-aligned. The daemon does not delete the file.
        ``persist`` and ``deregister_on_close`` as in :meth:`register_host`.
        """
        path = os.fspath(path)
        req = pb.RegisterRegionRequest(
            host_file=pb.HostFile(path=path, offset=_uint("offset", offset), size=_uint("size", size)),
            export_name=export_name or "",
            persist=bool(persist),
        )
        resp = self._call(self._stub.RegisterRegion, req, self.timeout)
        return self._map_host(resp.region, _dereg_default(deregister_on_close, persist))

    def _map_host(self, r: Any, deregister_on_close: bool) -> HostRegion:
        info = RegionInfo.from_proto(r)
        try:
            fd = os.open(info.shm_path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
            try:
                mm = mmap.mmap(
                    fd,
                    info.size,
                    flags=mmap.MAP_SHARED,
                    prot=mmap.PROT_READ | mmap.PROT_WRITE,
                    offset=info.shm_offset,
                )
            finally:
                os.close(fd)
        except (OSError, ValueError, OverflowError) as e:
            try:
                self._call(self._stub.DeregisterRegion, pb.DeregisterRegionRequest(region_id=info.id), self.timeout)
            except B2BError:
                pass
            raise OSError(
                getattr(e, "errno", None) or 0,
                f"b2b: map region {info.id} ({info.shm_path}, {info.size} bytes at {info.shm_offset}): {e}",
            ) from e
        region = HostRegion(self, info, mm, deregister_on_close)
        self._track(region)
        return region

    def register_cuda(
        self,
        tensor: Any,
        export_name: Optional[str] = None,
        *,
        persist: bool = False,
        deregister_on_close: Optional[bool] = None,
    ) -> CudaRegion:
        """Register a contiguous PyTorch CUDA tensor through its CUDA IPC handle.

        The region covers exactly the tensor's elements. Uses
        ``tensor.untyped_storage()._share_cuda_()`` (PyTorch 2.x): its device,
        IPC handle, and the storage's byte offset in the base allocation, to
        which ``tensor.storage_offset() * tensor.element_size()`` is added.
        Tensors from an expandable-segments allocator are refused. torch is
        not imported by this package; the tensor's own methods are used.
        ``persist`` and ``deregister_on_close`` as in :meth:`register_host`.
        """
        deregister_on_close = _dereg_default(deregister_on_close, persist)
        return self._register_cuda_share(tensor, _cuda.share_tensor(tensor), export_name, (), persist, deregister_on_close)

    def _register_cuda_share(
        self,
        keep: Any,
        share: _cuda.CudaShare,
        export_name: Optional[str],
        export_to: Sequence[str],
        persist: bool,
        deregister_on_close: bool,
        *,
        readers: Sequence[str] = (),
        read_only: bool = False,
    ) -> CudaRegion:
        """Register the CUDA IPC range ``share`` names; the region keeps
        ``keep`` (the tensor or tensors over that memory) alive. ``b2b.kv``
        registers a whole allocation shared by several tensors this way."""
        req = pb.RegisterRegionRequest(
            cuda_ipc=pb.CudaIpc(device=share.device, ipc_handle=share.ipc_handle, offset=share.offset, size=share.size),
            export_name=export_name or "",
            export_to=list(export_to),
            readers=_grants(readers),
            read_only=bool(read_only),
            persist=bool(persist),
        )
        try:
            resp = self._call(self._stub.RegisterRegion, req, self.timeout)
        except BaseException:
            _release_ipc_counter(share)  # the daemon did not keep it open
            raise
        region = CudaRegion(self, RegionInfo.from_proto(resp.region), keep, share, deregister_on_close)
        self._track(region)
        return region

    def export(
        self,
        region: RegionRef,
        name: Optional[str],
        export_to: Sequence[str] = (),
        *,
        readers: Sequence[str] = (),
        read_only: bool = False,
    ) -> RegionInfo:
        """Set (or with ``None``/"" clear) a region's export name; ``export_to``
        lists the peer identities allowed to write it (empty: every peer), and
        ``readers`` who may read it (narrowing either revokes the old key)."""
        resp = self._call(
            self._stub.ExportRegion,
            pb.ExportRegionRequest(
                region_id=_region_id(region, "region"),
                export_name=name or "",
                export_to=list(export_to),
                readers=_grants(readers),
                read_only=bool(read_only),
            ),
            self.timeout,
        )
        info = RegionInfo.from_proto(resp.region)
        if isinstance(region, _Region):
            region._set_info(info)
        return info

    def deregister(self, region: RegionRef) -> None:
        """Release a region in the daemon. Fails with ``FailedPreconditionError``
        while a batch uses it. Does not unmap a :class:`HostRegion` here (see
        :meth:`HostRegion.close`)."""
        self._call(
            self._stub.DeregisterRegion,
            pb.DeregisterRegionRequest(region_id=_region_id(region, "region")),
            self.timeout,
        )
        if isinstance(region, _Region):
            region._on_deregistered()

    def list_regions(self) -> List[RegionInfo]:
        """All regions registered with the daemon (by any client)."""
        resp = self._call(self._stub.ListRegions, pb.ListRegionsRequest(), self.timeout)
        return [RegionInfo.from_proto(r) for r in resp.regions]

    def status(self) -> Status:
        """The daemon's version, peer address, transports and counters."""
        return Status.from_proto(self._call(self._stub.Status, pb.StatusRequest(), self.timeout))

    def watch(self, region: RegionRef, timeout: Optional[float] = None) -> Watch:
        """Subscribe to the notifications senders attach to batches written
        into a local exported region (its current export name is watched).

        Returns once the daemon has confirmed the subscription, so every batch
        that lands after this call is seen. ``timeout`` bounds the whole
        stream (``None``: until cancelled). Usage::

            with client.watch(dst) as w:
                for n in w:
                    print(n.sender, n.notification, n.blocks)
        """
        if self._closed:
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE, "b2b client is closed")
        deadline = deadline_after(timeout)
        call = self._stub.WatchNotifications(
            pb.WatchNotificationsRequest(region_id=_region_id(region, "region")), timeout=timeout
        )
        call.initial_metadata()  # the daemon sends headers once subscribed
        if call.done():  # refused (unknown region, ...) before subscribing
            try:
                next(call)
            except grpc.RpcError as e:
                raise from_rpc_error(e, deadline) from e
            except StopIteration:
                pass
        return Watch(call, deadline)

    # -- data -------------------------------------------------------------

    def batch_transfer(
        self,
        src: RegionRef,
        peer: str,
        dst_region: Union[str, RegionInfo, _Region],
        src_offsets: Any = None,
        dst_offsets: Any = None,
        lengths: Any = None,
        block_size: Optional[int] = None,
        timeout: Optional[float] = None,
        transport: Union[None, str, int] = None,
        *,
        descriptors: Optional[Descriptors] = None,
        notification: Optional[bytes] = None,
        op: Union[None, str, int] = None,
    ) -> TransferResult:
        """Write blocks of local region ``src`` into the peer's exported region
        (``op="read"``: pull the peer's blocks at ``dst_offsets`` into ``src``
        at ``src_offsets``; the export must grant this daemon read access).

        Block ``i`` copies ``lengths[i]`` bytes (or ``block_size`` for all) from
        ``src_offsets[i]`` in ``src`` to ``dst_offsets[i]`` in ``dst_region``.
        Returns once every byte has landed and the peer acknowledged the batch.

        Args:
            src: the local source region (object or ID).
            peer: the destination daemon's peer address, ``host:port``.
            dst_region: the destination's export name (or a region object
                carrying one).
            src_offsets, dst_offsets, lengths: integer arrays (numpy, list,
                ``array('Q')``), packed with numpy.
            block_size: uniform block length, instead of ``lengths``.
            timeout: seconds; ``None`` lets the daemon apply its default.
            transport: ``None`` (the daemons choose), ``"tcp"`` or ``"verbs"``.
            descriptors: a pre-packed :class:`Descriptors`, instead of the
                arrays (reuse one across transfers of the same layout).
            notification: optional non-empty payload (at most 4096 bytes)
                delivered to the destination region's watchers (see
                :meth:`watch`) once the batch landed.
        """
        req = self._batch_request(src, peer, dst_region, src_offsets, dst_offsets, lengths, block_size, transport, descriptors, notification, "batch_transfer", op)
        r = self._transfer_call(self._stub.BatchTransfer, req, timeout)
        return TransferResult.from_proto(r)

    def _batch_request(
        self, src, peer, dst_region, src_offsets, dst_offsets, lengths, block_size, transport, descriptors, notification, what, op=None,
        message: Any = pb.BatchTransferRequest,
    ) -> Any:
        """The checked request of a batch: ``message`` is BatchTransferRequest
        or PrepareTransferRequest (the same fields); ``what`` names the
        caller in errors."""
        descriptors = _descriptors(descriptors, src_offsets, dst_offsets, lengths, block_size, what)
        if not isinstance(peer, str):
            raise TypeError(f"peer: expected 'host:port' str, got {type(peer).__name__}")
        req = message(
            src_region_id=_region_id(src, "src"),
            peer=peer,
            dst_region=_export_name(dst_region),
            descriptors=descriptors._msg,
            transport=_transport(transport),
            op=_op(op),
        )
        if notification is not None:
            req.notification = _notification_bytes(notification)
        return req

    def start_transfer(
        self,
        src: RegionRef,
        peer: str,
        dst_region: Union[str, RegionInfo, _Region],
        src_offsets: Any = None,
        dst_offsets: Any = None,
        lengths: Any = None,
        block_size: Optional[int] = None,
        timeout: Optional[float] = None,
        transport: Union[None, str, int] = None,
        *,
        descriptors: Optional[Descriptors] = None,
        notification: Optional[bytes] = None,
        op: Union[None, str, int] = None,
        after: Optional[Tuple[Any, int]] = None,
    ) -> "Transfer":
        """:meth:`batch_transfer`, started async: returns a :class:`Transfer`
        handle at once (bad input is refused here). ``timeout`` bounds the
        transfer from its start (``None``: the daemon's default).
        ``after=(counter, L)`` (a :class:`b2b.stream.Counter`): the daemon
        posts it only once the counter reaches ``L``."""
        req = self._batch_request(src, peer, dst_region, src_offsets, dst_offsets, lengths, block_size, transport, descriptors, notification, "start_transfer", op)
        start = pb.StartTransferRequest(batch=req)
        if after is not None:
            from .stream import trigger_proto  # stream imports this module

            start.after.CopyFrom(trigger_proto(after))
        return self._start(start, timeout)

    def start_submit(self, plan: "PreparedTransfer", timeout: Optional[float] = None) -> "Transfer":
        """A submit of a prepared plan, started async (see :class:`Transfer`)."""
        return self._start(pb.StartTransferRequest(submit=pb.SubmitTransferRequest(handle=plan.handle)), timeout)

    def _start(self, req: Any, timeout: Optional[float], remote_ids: Any = None) -> "Transfer":
        if timeout is not None:
            if timeout <= 0:
                raise _invalid(f"timeout {timeout!r}: want seconds > 0, or None for the daemon's default")
            req.timeout_ms = max(1, int(math.ceil(timeout * 1000)))
        r = self._call(self._stub.StartTransfer, req, self.timeout)
        return Transfer(self, int(r.transfer_id), remote_ids)

    def poll(self, transfers: Sequence["Transfer"]) -> List[bool]:
        """Ask for every handle's state in one call, without waiting; returns
        ``done()`` of each (an ended one keeps its outcome in its handle).
        Any handle kind mixes (they are all :class:`Transfer`). A handle with
        a call an interrupt left running is not asked again: that call's
        answer is its outcome. Interrupted, the poll goes on and its answers
        land in the handles."""
        ts = list(transfers)
        for t in ts:
            if not isinstance(t, Transfer):
                raise TypeError(f"poll: {t!r} is {type(t).__name__}, not a b2b.Transfer handle")
            if t._pending is not None and t._pending.fut.done():
                t._join(0)
        ask = [t for t in ts if t._outcome is None and t._pending is None]
        if ask:
            if self._closed:
                raise UnavailableError(grpc.StatusCode.UNAVAILABLE, "b2b client is closed")
            deadline = deadline_after(self.timeout)
            fut = self._stub.PollTransfers.future(pb.PollTransfersRequest(transfer_ids=[t.id for t in ask]), timeout=self.timeout)
            try:
                r = fut.result()
            except grpc.RpcError as e:
                raise from_rpc_error(e, deadline) from e
            except BaseException:
                for i, t in enumerate(ask):
                    t._keep(_Pending(fut, i))
                raise
            for t, o in zip(ask, r.outcomes):
                t._take(o)
        return [t._outcome is not None for t in ts]

    # -- layouts and block-id transfers (docs/kv.md) -------------------------

    def register_layout(
        self,
        name: str,
        segments: Sequence[Tuple[RegionRef, int, int, int]],
        num_blocks: int,
        export_name: str = "",
        export_to: Sequence[str] = (),
        timeout: Optional[float] = None,
        persist: bool = False,
        *,
        readers: Sequence[str] = (),
        read_only: bool = False,
    ) -> Any:
        """Register a block table: ``segments`` are ``(region, offset,
        block_len, stride)``; block ``b`` of a segment is the ``block_len``
        bytes at ``offset + b*stride``. Returns the daemon's ``Layout``.
        Like regions, the layout is leased to this client (deregistered when
        it is gone) unless ``persist``."""
        req = pb.RegisterLayoutRequest(
            name=name,
            num_blocks=num_blocks,
            export_name=export_name,
            export_to=list(export_to),
            readers=_grants(readers),
            read_only=bool(read_only),
            persist=persist,
        )
        for region, offset, block_len, stride in segments:
            req.segments.add(region_id=_region_id(region, "segments"), offset=offset, block_len=block_len, stride=stride)
        layout = self._call(self._stub.RegisterLayout, req, timeout).layout
        if not persist:
            with self._lock:
                self._layouts.add(name)
        return layout

    def deregister_layout(self, name: str, timeout: Optional[float] = None) -> None:
        """Release a layout and its hold on its regions."""
        self._call(self._stub.DeregisterLayout, pb.DeregisterLayoutRequest(name=name), timeout)
        with self._lock:
            self._layouts.discard(name)

    def transfer_blocks(
        self,
        local_layout: str,
        peer: str,
        remote_layout: str,
        local_ids: Any,
        remote_ids: Any,
        timeout: Optional[float] = None,
        transport: Union[None, str, int] = None,
        *,
        notification: Optional[bytes] = None,
        op: Union[None, str, int] = None,
        wait: bool = True,
        after: Optional[Tuple[Any, int]] = None,
    ) -> Union[TransferResult, "Transfer"]:
        """Move block ``local_ids[i]`` of every segment of ``local_layout`` to
        block ``remote_ids[i]`` of the peer's exported ``remote_layout``
        (``op="read"``: the other way, a pull; ``local_ids`` must then be
        unique). Ids are lists, numpy arrays or torch integer tensors, packed
        as little-endian uint32 by numpy (no Python loop). Returns once every
        byte landed and was acknowledged; with ``wait=False``, returns a
        :class:`Transfer` handle at once (``timeout`` then bounds the transfer
        from its start). ``after=(counter, L)`` (a
        :class:`b2b.stream.Counter`): the daemon posts it only once the
        counter reaches ``L``; it implies ``wait=False``."""
        req = pb.TransferBlocksRequest(
            local_layout=local_layout,
            peer=peer,
            remote_layout=remote_layout,
            local_ids=pack_u32(local_ids, "local_ids")[0],
            remote_ids=pack_u32(remote_ids, "remote_ids")[0],
            transport=_transport(transport),
            op=_op(op),
        )
        if notification is not None:
            req.notification = _notification_bytes(notification)
        if after is not None:
            from .stream import trigger_proto  # stream imports this module

            start = pb.StartTransferRequest(blocks=req)
            start.after.CopyFrom(trigger_proto(after))
            return self._start(start, timeout, remote_ids)
        if not wait:
            return self._start(pb.StartTransferRequest(blocks=req), timeout, remote_ids)
        return TransferResult.from_proto(self._transfer_call(self._stub.TransferBlocks, req, timeout))

    # -- prepared transfers -----------------------------------------------

    def prepare(
        self,
        src: RegionRef,
        peer: str,
        dst_region: Union[str, RegionInfo, _Region],
        src_offsets: Any = None,
        dst_offsets: Any = None,
        lengths: Any = None,
        block_size: Optional[int] = None,
        timeout: Optional[float] = None,
        transport: Union[None, str, int] = None,
        *,
        descriptors: Optional[Descriptors] = None,
        notification: Optional[bytes] = None,
        op: Union[None, str, int] = None,
    ) -> PreparedTransfer:
        """Plan a batch once (validate, merge, split, resolve, connect, build
        the data path's work) and return a :class:`PreparedTransfer` whose
        :meth:`~PreparedTransfer.submit` runs it. Arguments as
        :meth:`batch_transfer`; ``timeout`` bounds the preparation and is the
        default deadline of every submit. Usage::

            with client.prepare(src, peer, "kv", so, do, block_size=4096) as plan:
                for step in range(steps):
                    plan.submit()
        """
        req = self._batch_request(
            src, peer, dst_region, src_offsets, dst_offsets, lengths, block_size, transport, descriptors, notification, "prepare", op,
            message=pb.PrepareTransferRequest,
        )
        r = self._call(self._stub.PrepareTransfer, req, self.timeout if timeout is None else timeout)
        return PreparedTransfer(self, r, timeout)

    def submit_stream(self, timeout: Optional[float] = None) -> SubmitStream:
        """Open a ``SubmitStream``: many submits in flight on one call, each
        result tagged (see :class:`SubmitStream`). ``timeout`` bounds the
        whole stream."""
        return SubmitStream(self, timeout)

    def pipeline(
        self, plans: Iterable[PreparedTransfer], depth: int = 8, timeout: Optional[float] = None
    ) -> Iterator[StreamResult]:
        """Submit every plan of ``plans`` on one stream with up to ``depth`` in
        flight; yield a :class:`StreamResult` per plan, in completion order,
        its ``tag`` the plan's index in ``plans``. A failed submit is a result
        with ``error`` set (``result.get()`` raises it); the others go on."""
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise _invalid(f"depth {depth!r}: want an int >= 1")
        with self.submit_stream(timeout) as s:
            it = iter(plans)
            tag = inflight = 0
            for plan in itertools.islice(it, depth):
                s.submit(plan, tag)
                tag += 1
                inflight += 1
            if inflight < depth:
                s.done_sending()
            while inflight:
                r = s.next_result()
                inflight -= 1
                if s._sending:
                    plan = next(it, None)
                    if plan is None:
                        s.done_sending()
                    else:
                        s.submit(plan, tag)
                        tag += 1
                        inflight += 1
                yield r

    def ping(self, timeout: Optional[float] = None) -> None:
        """An empty call: the floor of a call on this connection."""
        self._call(self._stub.Ping, pb.PingRequest(), self.timeout if timeout is None else timeout)

    def checksum(
        self,
        region: RegionRef,
        offsets: Any,
        lengths: Any = None,
        block_size: Optional[int] = None,
        algorithm: str = "crc32c",
        per_block: bool = False,
        timeout: Optional[float] = None,
    ) -> ChecksumResult:
        """Hash blocks of a local region, computed by the daemon.

        ``digest`` covers every listed byte and the block order (see
        :class:`ChecksumResult`); with ``per_block`` the result also carries
        one digest per block as a numpy ``uint64`` array. ``algorithm`` is
        ``"crc32c"`` or ``"xxh64"``. Offsets may overlap; bounds are checked
        by the daemon.
        """
        try:
            alg = _ALGORITHM_BY_NAME[algorithm.lower()]
        except (KeyError, AttributeError):
            raise _invalid(f"algorithm {algorithm!r}: want 'crc32c' or 'xxh64'") from None
        offs, n = pack_u64(offsets, "offsets")
        lens = b""
        if lengths is not None and block_size is not None:
            raise _invalid("lengths and block_size are both set: give one")
        if lengths is None and block_size is None:
            raise _invalid("neither lengths nor block_size is set")
        if lengths is not None:
            lens, k = pack_u64(lengths, "lengths")
            if k != n:
                raise _invalid(f"lengths has {k} entries, offsets has {n}: they must be equal")
        req = pb.ChecksumRequest(
            region_id=_region_id(region, "region"),
            offsets=offs,
            lengths=lens,
            block_length=check_block_size(block_size),
            algorithm=alg,
            per_block=bool(per_block),
        )
        r = self._call(self._stub.Checksum, req, self.timeout if timeout is None else timeout)
        return ChecksumResult(
            digest=int(r.digest),
            algorithm=_ALGORITHM_NAME.get(r.algorithm, str(r.algorithm)),
            blocks=int(r.blocks),
            bytes=int(r.bytes),
            block_digests=unpack_u64(r.block_digests) if per_block else None,
        )


def _descriptors(d: Any, src_offsets: Any, dst_offsets: Any, lengths: Any, block_size: Any, what: str) -> Descriptors:
    if d is None:
        return Descriptors(src_offsets, dst_offsets, lengths, block_size)
    if not isinstance(d, Descriptors):
        raise TypeError(f"descriptors: expected b2b.Descriptors, got {type(d).__name__}")
    if src_offsets is not None or dst_offsets is not None or lengths is not None or block_size is not None:
        raise TypeError(f"{what}: give either descriptors= or the offset arrays, not both")
    return d


def _uint(name: str, v: Any) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    v = int(v)
    if v < 0 or v >= 1 << 64:
        raise _invalid(f"{name} {v} is not a uint64")
    return v

