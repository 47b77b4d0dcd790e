"""The b2b client: register memory with the local b2bd, move batches of blocks
to a peer, checksum them.

Mirrors the Go client (``client/client.go``). All calls are synchronous and
thread-safe (one gRPC channel per :class:`Client`). Failures reported by the
daemon raise :class:`~b2b.errors.B2BError` subclasses; see :mod:`b2b.errors`.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import threading
import time
import warnings
import weakref
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import grpc
import numpy as np

from . import _cuda
from . import _many
from . import _memfd
from . import _ring_client
from ._many import Blocks  # noqa: F401 - b2b.Blocks, for start_many
from ._pack import (
    check_block_size,
    pack_u32,
    pack_u64,
    unpack_u64,
)
from .errors import (  # noqa: F401 - b2b.client keeps every name it had
    B2BError,
    CALL_ID_KEY,
    check_timeout,
    deadline_after,
    DEADLINE_GRACE,
    error_for_code,
    FailedPreconditionError,
    from_rpc_error,
    InvalidArgumentError,
    new_call_id,
    NotFoundError,
    timeout_ms,
    transfer_deadline,
    UnavailableError,
    WaitTimeoutError,
)
from .v1 import b2b_pb2 as pb
from .v1 import b2b_pb2_grpc as pb_grpc
from ._common import (  # noqa: F401 - b2b.client keeps every name it had
    DEFAULT_SOCKET,
    MAX_MESSAGE_BYTES,
    _ALGORITHM_BY_NAME,
    _ALGORITHM_NAME,
    _MEMORY_NAME,
    _TRANSPORT_BY_NAME,
    _TRANSPORT_NAME,
    _grants,
    _host_port,
    _invalid,
    _is_loopback,
    _op,
    _read_pem,
    _target,
    _tls_credentials,
    _transport,
)
from ._results import (  # noqa: F401 - b2b.client keeps every name it had
    ChecksumResult,
    Notification,
    PhaseTimings,
    RegionInfo,
    Status,
    TransferResult,
    TransportStatus,
    Watch,
)
from ._descriptors import (  # noqa: F401 - b2b.client keeps every name it had
    Descriptors,
)
from ._regions import (  # noqa: F401 - b2b.client keeps every name it had
    CudaRegion,
    HostRegion,
    RegionRef,
    _Region,
    _export_name,
    _region_id,
    _release_ipc_counter,
)
from ._transfers import (  # noqa: F401 - b2b.client keeps every name it had
    PreparedTransfer,
    StreamResult,
    SubmitStream,
    Transfer,
    _CODE_BY_VALUE,
    _END,
    _Pending,
    _RUNNING,
    _STATE_NAME,
    _STATUS_BY_VALUE,
    _interrupts_deferred,
    started,
)

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
    "Blocks",
    "DEFAULT_SOCKET",
    "MAX_MESSAGE_BYTES",
]


# ---------------------------------------------------------------------------
# Client.


_log = logging.getLogger("b2b")

#: Seconds :meth:`Client.close` keeps asking to release a layout or region
#: the daemon refuses as still held, once the client's own transfers were
#: stopped; then the lease takes over.
CLOSE_SETTLE = 0.5


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
            checksums); ``None``: none. Batch transfers take their own
            ``timeout``. Every ``timeout`` of the API is checked alike
            (:func:`b2b.errors.check_timeout`): seconds > 0 or ``None``
            (waits also take 0); ``math.inf``, and anything over
            :data:`b2b.errors.MAX_TIMEOUT` (1e8 s, about three years), is
            taken as MAX_TIMEOUT. Anything else raises InvalidArgumentError.
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
        ring: where prepared submits go without gRPC (docs/ring.md): the
            daemon's submit socket path, ``False`` for gRPC only, or ``None``
            (``$B2B_SUBMIT_SOCKET``, else ``submit.sock`` beside a Unix
            ``address`` if it exists). ``B2B_RING=0`` turns it off. A remote
            daemon, or one that refuses the ring, is served over gRPC.

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
        ring: Union[None, bool, str] = None,
    ) -> None:
        target = _target(address)
        creds = _tls_credentials(address, tls_ca, tls_cert, tls_key, tls_server_name)
        self.address = address
        self.timeout = check_timeout(timeout)
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
        # What close() stops before it releases regions, which these hold:
        # started transfers not yet ended (id -> handle, the id kept even
        # when the handle is dropped) and plans not yet released.
        self._transfers: Dict[int, "weakref.ref[Transfer]"] = {}
        self._plans: set = set()
        self._ring = _ring_client.RingSlot(address, ring)

    # -- plumbing ---------------------------------------------------------

    @property
    def stub(self) -> pb_grpc.B2BStub:
        """The raw generated stub, for calls this class does not wrap."""
        return self._stub

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def ring(self) -> Any:
        """The shared-memory ring prepared submits take (opened on first
        use); ``None`` while the client is on gRPC for them."""
        return None if self._closed else self._ring.get()

    def _ring_submit(self, plan: "PreparedTransfer", timeout: Optional[float]) -> Optional[TransferResult]:
        """A submit of plan through the ring; ``None``: take gRPC."""
        r = self.ring
        return None if r is None else _ring_client.submit(r, plan, timeout)

    def _call(self, method: Any, request: Any, timeout: Optional[float], wait_for_ready: Optional[bool] = None) -> Any:
        if self._closed:
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE, "b2b client is closed")
        timeout = check_timeout(timeout)
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
        timeout = check_timeout(timeout)
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
            # An interrupt inside gRPC's own start of the call can leave one
            # of its locks held, and the channel then hangs: it waits here.
            with _interrupts_deferred():
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
        """Stop what this client started, release the layouts it leased and
        its open regions registered with ``deregister_on_close``, and close
        the channel.

        Its ring, its transfers still running (cancelled: a handle then
        reads ``cancelled``) and its plans go first, for they hold regions
        the daemon would refuse to release. A release still refused ("in
        use" by a peer's batch, "held by" another's layout) after
        :data:`CLOSE_SETTLE` seconds is left to the lease, which frees the
        region once this process's last connection to the daemon closes;
        it is logged at debug level. Only a region that persists, which no
        lease frees, is then warned about."""
        if self._closed:
            return
        with self._lock:
            regions, layouts = list(self._regions), sorted(self._layouts)
        self._ring.close()  # the daemon ends the ring's submits
        self._stop_started()
        # Layouts first: they hold their regions in the daemon.
        held_layouts = [(n, e) for n in layouts for e in [self._close_layout(n)] if e is not None]
        held: List[Tuple[_Region, B2BError]] = []
        for r in regions:
            if r._deregister_on_close:
                try:
                    r.close()
                except FailedPreconditionError as e:
                    held.append((r, e))
                except B2BError as e:
                    warnings.warn(f"b2b: releasing region {r.id} on close: {e}", RuntimeWarning, stacklevel=2)
        # What was stopped above lets go of its regions a moment later.
        end, pause = time.monotonic() + CLOSE_SETTLE, 0.005
        while (held_layouts or held) and time.monotonic() < end:
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
            held_layouts = [(n, e) for n, _ in held_layouts for e in [self._close_layout(n)] if e is not None]
            held = [(r, e) for r, _ in held for e in [self._close_region(r)] if e is not None]
        for name, e in held_layouts:
            _log.debug("b2b: layout %r left to its lease on close: %s", name, e)
        for r, e in held:
            if r.info.persist:
                warnings.warn(f"b2b: releasing region {r.id} on close: {e} (it persists: deregister it later)",
                              RuntimeWarning, stacklevel=2)
            else:
                _log.debug("b2b: region %s left to its lease on close: %s", r.id, e)
        self._closed = True
        self._channel.close()

    def _stop_started(self) -> None:
        """Cancel the transfers this client started that have not ended and
        release its plans: all the calls at once, each answering once
        nothing of it lands any more, within DEADLINE_GRACE. A handle still
        held gets its outcome."""
        transfers, self._transfers = self._transfers, {}
        plans, self._plans = list(self._plans), set()
        calls: List[Tuple[Any, Any]] = []
        try:
            for tid, ref in list(transfers.items()):
                req = pb.CancelTransferRequest(transfer_id=tid)
                calls.append((ref, self._stub.CancelTransfer.future(req, timeout=DEADLINE_GRACE)))
            for h in plans:
                calls.append((None, self._stub.ReleaseTransfer.future(pb.ReleaseTransferRequest(handle=h), timeout=DEADLINE_GRACE)))
        except ValueError:
            pass  # the channel was closed under us: the lease ends them
        for ref, fut in calls:
            try:
                o = fut.result()
            except grpc.RpcError:
                continue  # ended and reported elsewhere (NotFound), or no daemon
            t = None if ref is None else ref()
            if t is not None:
                t._take(o)

    def _close_layout(self, name: str) -> Optional[B2BError]:
        """Deregister leased layout name on close: the refusal of one still
        held (to try again), else ``None``; other failures are warned."""
        try:
            self.deregister_layout(name)
        except NotFoundError:
            pass
        except FailedPreconditionError as e:
            return e
        except B2BError as e:
            warnings.warn(f"b2b: releasing layout {name!r} on close: {e}", RuntimeWarning, stacklevel=3)
        return None

    def _close_region(self, r: _Region) -> Optional[B2BError]:
        """Deregister closed region r again on close (its first try was
        refused as held): the refusal if it still is, else ``None``."""
        try:
            self.deregister(r)
        except NotFoundError:
            r._on_deregistered()
        except FailedPreconditionError as e:
            return e
        except B2BError as e:
            warnings.warn(f"b2b: releasing region {r.id} on close: {e}", RuntimeWarning, stacklevel=3)
            return None
        r._release_local()  # a CUDA region lets go of its tensor once deregistered
        return None

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

    def register_memfd(
        self,
        source: Any,
        offset: int = 0,
        size: int = 0,
        export_name: Optional[str] = None,
        *,
        persist: bool = False,
        deregister_on_close: Optional[bool] = None,
        readers: Sequence[str] = (),
        read_only: bool = False,
        submit_socket: Optional[str] = None,
    ) -> HostRegion:
        """Register memory this process allocated: a :class:`b2b.HostBuffer`
        (:func:`b2b.alloc_host`), a numpy view of one, or a memfd descriptor
        sealed with ``F_SEAL_SHRINK`` (``size`` 0: to its end). The descriptor
        goes to the daemon over its submit socket (``b2bd --submit-socket``;
        ``submit_socket``, else ``$B2B_SUBMIT_SOCKET``, else ``submit.sock``
        beside the API socket); nothing is copied. Memory that cannot be
        shared (a plain numpy array) is refused, naming the allocator. Other
        arguments as in :meth:`register_host`."""
        return _memfd_register(self, source, offset, size, export_name, persist, deregister_on_close, readers, read_only, submit_socket, owns=False)

    def alloc_host(self, size: int, export_name: Optional[str] = None, **kw: Any) -> HostRegion:
        """:func:`b2b.alloc_host` then :meth:`register_memfd`: ``size`` bytes of
        this process's memory as a region (``.array``, ``.buffer``); closing
        the region closes the buffer. Registration costs no page faults."""
        if kw.keys() - {"persist", "deregister_on_close", "readers", "read_only", "submit_socket"}:
            raise TypeError(f"alloc_host: unexpected arguments {sorted(kw)}")
        buf = _memfd.alloc_host(_uint("size", size))
        try:
            return _memfd_register(self, buf, 0, 0, export_name, kw.pop("persist", False), kw.pop("deregister_on_close", None),
                                   kw.pop("readers", ()), kw.pop("read_only", False), kw.pop("submit_socket", None), owns=True)
        except BaseException:
            buf.close()
            raise

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

    def notify_region(self, region: RegionRef, notification: bytes, timeout: Optional[float] = None) -> int:
        """Deliver ``notification`` (1 to 4096 bytes) to one of this
        client's own regions, as a peer's batch would: to its watchers
        (sender ``"local"``), and a key note (:func:`b2b.key_note`) fires
        the transfers armed there on its keys. A transfer armed on a local
        key (``after=b2b.on_note(region, key)``) is then sent the moment
        this is called: resolved and planned already, only its post is
        left. Over the ring when the client has one. Returns the watchers
        that got it."""
        timeout = check_timeout(timeout)
        rid = _region_id(region, "region")
        note = bytes(notification)
        ring = self.ring
        if ring is not None and 0 < len(note) <= _ring_client.MAX_NOTE and 0 < len(rid.encode()) <= _ring_client.MAX_TRIG_REGION:
            return ring.notify(rid, note, self.timeout if timeout is None else timeout)
        return int(self._call(self._stub.NotifyRegion, pb.NotifyRegionRequest(region_id=rid, notification=note),
                              self.timeout if timeout is None else timeout).delivered)

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
        timeout = check_timeout(timeout)
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
            timeout: seconds; ``None`` lets the daemon apply its default
                (``--default-timeout``); ``math.inf``: the longest there is
                (a timeout over the daemon's 24 h is the call's own deadline).
            transport: ``None`` (the daemons choose), ``"tcp"`` or ``"verbs"``.
            descriptors: a pre-packed :class:`Descriptors`, instead of the
                arrays (reuse one across transfers of the same layout).
            notification: optional non-empty payload (at most 4096 bytes)
                delivered to the destination region's watchers (see
                :meth:`watch`) once the batch landed.
        """
        timeout = check_timeout(timeout)
        req = self._batch_request(src, peer, dst_region, src_offsets, dst_offsets, lengths, block_size, transport, descriptors, notification, "batch_transfer", op)
        if not self._closed:
            res = _ring_client.batch(self._ring, req, timeout)
            if res is not None:
                return res
        r = self._transfer_call(self._stub.BatchTransfer, req, timeout)
        return TransferResult.from_proto(r)

    def warm(
        self,
        src: RegionRef,
        peer: str,
        dst_region: Union[str, RegionInfo, _Region],
        timeout: Optional[float] = None,
        transport: Union[None, str, int] = None,
        *,
        op: Union[None, str, int] = None,
    ) -> str:
        """Make ready what the first :meth:`batch_transfer` of ``op`` between
        ``src`` and the peer's ``dst_region`` would otherwise build (the
        connection, the destination's resolution, and on the same host its
        mapping: 75 ms for a 20 GiB GPU pool), moving no byte. Call it when
        the peer's region becomes known (at an engine's handshake), so that
        the first batch costs what the later ones do. It is checked as
        :meth:`batch_transfer` is and may be repeated. Returns the name of
        the transport it made ready."""
        if not isinstance(peer, str):
            raise TypeError(f"peer: expected 'host:port' str, got {type(peer).__name__}")
        kind = _transport(transport)
        req = pb.WarmTransferRequest(
            src_region_id=_region_id(src, "src"),
            peer=peer,
            dst_region=_export_name(dst_region),
            op=_op(op),
            transport_name="" if kind == pb.TRANSPORT_KIND_UNSPECIFIED else _TRANSPORT_NAME[kind],
        )
        return self._transfer_call(self._stub.WarmTransfer, req, timeout).transport_name

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
        transfer from its start (``None``: the daemon's default; over the
        daemon's limit of 1 h, ``math.inf`` included: that limit).
        ``after=(counter, L)`` (a :class:`b2b.stream.Counter`): the daemon
        posts it only once the counter reaches ``L``."""
        req = self._batch_request(src, peer, dst_region, src_offsets, dst_offsets, lengths, block_size, transport, descriptors, notification, "start_transfer", op)
        start = pb.StartTransferRequest(batch=req)
        if after is not None:
            from .stream import trigger_proto  # stream imports this module

            start.after.CopyFrom(trigger_proto(after))
        return self._start(start, timeout)

    def start_submit(self, plan: "PreparedTransfer", timeout: Optional[float] = None) -> "Transfer":
        """A submit of a prepared plan, started async (see :class:`Transfer`);
        through the ring when the client has one."""
        hs = self.start_submits([plan], timeout)
        return hs[0]

    def start_submits(self, plans: Sequence["PreparedTransfer"], timeout: Optional[float] = None) -> List["Transfer"]:
        """Submits of every plan, started async: one publish on the ring (one
        wake of the daemon at most), else one StartTransfer call each.
        ``timeout`` bounds each from its start."""
        plans = list(plans)
        timeout = check_timeout(timeout)
        r = self.ring
        hs = None if r is None else _ring_client.start_submits(self, r, plans, timeout)
        if hs is not None:
            return hs
        return [self._start_submit(p, timeout) for p in plans]

    def wait_all(self, transfers: Sequence["Transfer"], timeout: Optional[float] = None) -> None:
        """Wait until every handle ended (ring handles in one wait, the
        daemon's in one ``WaitTransfers`` call); each keeps its outcome
        (``result``/``error``). ``WaitTimeoutError`` if some still run after
        ``timeout`` seconds: they go on (0: only look)."""
        _ring_client.wait_all(list(transfers), check_timeout(timeout, wait=True))

    def start_many(self, items: Sequence[Any], timeout: Optional[float] = None) -> List["Transfer"]:
        """Start many transfers in one ``StartTransfers`` call (one per 1,024):
        each item a :class:`b2b.Blocks` (a block-id transfer), a
        :class:`PreparedTransfer` (a submit; all plans and a ring: one ring
        publish instead) or a raw ``StartTransferRequest``. Returns a
        :class:`Transfer` per item, in order. Each is checked and started as
        alone; one the daemon refused comes back as a handle that has already
        failed (``id`` 0; ``error`` carries the code and a message naming
        ``requests[i]``), and the others run. ``timeout`` bounds each item
        without its own from its start (``None``: the daemon's default)."""
        return _many.start_many(self, items, check_timeout(timeout))

    def wait_any(self, transfers: Sequence["Transfer"], timeout: Optional[float] = None) -> List["Transfer"]:
        """Wait until at least one handle ended; returns those that have
        (each keeps its outcome). Daemon handles wait in one
        ``WaitTransfers`` call. ``WaitTimeoutError`` if none ended after
        ``timeout`` seconds."""
        return _many.wait_any(self, transfers, timeout)

    def _start_submit(self, plan: "PreparedTransfer", timeout: Optional[float]) -> "Transfer":
        return self._start(pb.StartTransferRequest(submit=pb.SubmitTransferRequest(handle=plan.handle)), timeout)

    def _start(self, req: Any, timeout: Optional[float], remote_ids: Any = None) -> "Transfer":
        """StartTransfer of req; ``timeout`` over the daemon's limit of
        ``timeout_ms`` (1 h) is sent as that limit."""
        ms = timeout_ms(check_timeout(timeout))
        if ms:
            req.timeout_ms = ms
        r = self._call(self._stub.StartTransfer, req, self.timeout)
        return started(self, int(r.transfer_id), remote_ids)

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
        _ring_client.poll(ts)
        ask = [t for t in ts if t._outcome is None and t._pending is None and not isinstance(t, _ring_client.RingTransfer)]
        if ask:
            if self._closed:
                raise UnavailableError(grpc.StatusCode.UNAVAILABLE, "b2b client is closed")
            _many.outcomes(self._stub.PollTransfers, pb.PollTransfersRequest(transfer_ids=[t.id for t in ask]),
                           check_timeout(self.timeout), ask)
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
        it is gone) unless ``persist``. The numbers are checked here as
        :meth:`register_host`'s ``size`` is (an int, else TypeError; a
        uint64, else InvalidArgumentError naming e.g. ``segments[0].offset``),
        so protobuf never refuses them without a name."""
        req = pb.RegisterLayoutRequest(
            name=name,
            num_blocks=_uint("num_blocks", num_blocks),
            export_name=export_name,
            export_to=list(export_to),
            readers=_grants(readers),
            read_only=bool(read_only),
            persist=persist,
        )
        for i, seg in enumerate(segments):
            if not isinstance(seg, (tuple, list)) or len(seg) != 4:
                raise _invalid(f"segments[{i}] {seg!r}: want a 4-tuple (region, offset, block_len, stride)")
            region, offset, block_len, stride = seg
            at = f"segments[{i}]"
            req.segments.add(region_id=_region_id(region, f"{at}.region"), offset=_uint(f"{at}.offset", offset),
                             block_len=_uint(f"{at}.block_len", block_len), stride=_uint(f"{at}.stride", stride))
        layout = self._call(self._stub.RegisterLayout, req, self.timeout if timeout is None else timeout).layout
        if not persist:
            with self._lock:
                self._layouts.add(name)
        return layout

    def deregister_layout(self, name: str, timeout: Optional[float] = None) -> None:
        """Release a layout and its hold on its regions. ``timeout``:
        seconds; ``None``: the client's ``timeout``."""
        self._call(self._stub.DeregisterLayout, pb.DeregisterLayoutRequest(name=name), self.timeout if timeout is None else timeout)
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
        counter reaches ``L``; it implies ``wait=False``. Without ``after``,
        the transfer goes through the ring when the client has one
        (docs/ring.md)."""
        timeout = check_timeout(timeout)
        if after is None and not self._closed:
            if not wait:
                h = _ring_client.start_one(self, Blocks(local_layout, peer, remote_layout, local_ids, remote_ids, op,
                                                        notification, transport, timeout))
                if h is not None:
                    return h
            else:
                res = _ring_client.transfer_blocks(self, self._ring, local_layout, peer, remote_layout, local_ids,
                                                   remote_ids, timeout, transport, op, notification)
                if res is not None:
                    return res
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
        timeout = check_timeout(timeout)
        req = self._batch_request(
            src, peer, dst_region, src_offsets, dst_offsets, lengths, block_size, transport, descriptors, notification, "prepare", op,
            message=pb.PrepareTransferRequest,
        )
        # It reaches the peer (a frozen one holds it to the deadline): the
        # daemon's answer at the deadline names the peer and the phase.
        r = self._transfer_call(self._stub.PrepareTransfer, req, self.timeout if timeout is None else timeout)
        plan = PreparedTransfer(self, r, timeout)
        self._plans.add(plan.handle)  # close() releases it: it pins its source region
        return plan

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


def _memfd_register(c: Client, source: Any, offset: int, size: int, export_name: Optional[str], persist: bool,
                    deregister_on_close: Optional[bool], readers: Sequence[str], read_only: bool,
                    submit_socket: Optional[str], owns: bool) -> HostRegion:
    fd, buf = _memfd.resolve_source(source)
    path = _memfd.submit_socket(c.address, submit_socket)
    sock, token = _memfd.hand_over(path, fd, c.timeout)
    with sock:  # open until RegisterRegion returned: the daemon drops a token whose socket closed
        req = pb.RegisterRegionRequest(
            host_file=pb.HostFile(path=f"{_memfd.TOKEN_PREFIX}{token:016x}", offset=_uint("offset", offset), size=_uint("size", size)),
            export_name=export_name or "",
            persist=bool(persist),
            readers=_grants(readers),
            read_only=bool(read_only),
        )
        resp = c._call(c._stub.RegisterRegion, req, c.timeout)
    info = RegionInfo.from_proto(resp.region)
    dereg = _dereg_default(deregister_on_close, persist)
    if buf is None:  # a bare descriptor: map the registered range here
        mm = mmap.mmap(fd, info.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=info.shm_offset)
        region: HostRegion = HostRegion(c, info, mm, dereg)
    elif info.shm_offset == 0 and info.size == buf.size:
        region = _memfd.MemfdRegion(c, info, buf, owns, dereg)
    else:
        mm = mmap.mmap(buf.fd, info.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=info.shm_offset)
        region = HostRegion(c, info, mm, dereg)
    c._track(region)
    return region


def _uint(name: str, v: Any) -> int:
    """v as a uint64 field named name: checked here, where protobuf would
    raise a ValueError naming no field."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    v = int(v)
    if v < 0 or v >= 1 << 64:
        raise _invalid(f"{name} {v} is not a uint64: want 0 to {(1 << 64) - 1}")
    return v
