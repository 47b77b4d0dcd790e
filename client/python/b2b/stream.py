"""Layer streaming with zero SMs (docs/kv.md, "Layer streaming").

A :class:`Counter` is a 64-bit word in a host region the daemon allocated
(one page, leased to this client like any region). It is mapped here,
registered with ``cuMemHostRegister(DEVICEMAP)`` and given a device pointer,
so that a CUDA stream can write it with ``cuStreamWriteValue64``: a stream
memory operation, run by the stream's front end after the work queued before
it, with no kernel and no SM. :func:`mark_layer_done` issues that write.

A transfer started with ``after=(counter, L)`` waits in the daemon until the
counter reaches ``L`` and then runs; nothing is posted before, its deadline
runs while it waits (DeadlineExceeded), and ``cancel()`` withdraws it.

The CUDA driver (``libcuda.so.1``) is loaded at run time with ctypes, as the
daemon loads it; nothing here needs torch, though a ``torch.cuda.Stream`` is
accepted wherever a stream is.

Typical prefill loop::

    counter = b2b.stream.Counter(client)
    handles = [b2b.stream.transfer_blocks(client, f"kv-L{l}", peer, f"kv-L{l}", ids, ids,
                                          after=(counter, l + 1)) for l in range(n)]
    for l in range(n):
        run_layer(l)
        b2b.stream.mark_layer_done(torch.cuda.current_stream(), counter, l + 1)
    for h in handles:
        h.wait()
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Optional, Tuple, Union

import grpc
import numpy as np

from .client import Client, HostRegion, Transfer, _transport
from ._transfers import started
from .errors import InvalidArgumentError, check_timeout, timeout_ms
from .v1 import b2b_pb2 as pb

__all__ = ["Counter", "mark_layer_done", "transfer_blocks", "TriggeredTransfer", "trigger_proto", "CudaDriverError"]

#: Flags of the driver API used here (cuda.h).
CU_MEMHOSTREGISTER_DEVICEMAP = 0x02
CU_STREAM_WRITE_VALUE_DEFAULT = 0x0
CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712

COUNTER_PAGE = 4096


class CudaDriverError(RuntimeError):
    """A CUDA driver call failed; ``code`` is the CUresult."""

    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call} failed: {name} ({code})")
        self.call, self.code, self.name = call, code, name


def _invalid(msg: str) -> InvalidArgumentError:
    return InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, msg)


def _pack_ids(ids: Any, name: str) -> bytes:
    """Block ids (a list, numpy array or torch integer tensor) as packed
    little-endian uint32."""
    if hasattr(ids, "detach"):  # torch
        ids = ids.detach().cpu().numpy()
    a = np.asarray(ids)
    if a.ndim != 1 or not (a.size == 0 or np.issubdtype(a.dtype, np.integer)):
        raise _invalid(f"{name}: want a 1-D sequence of integers, got dtype {a.dtype} shape {a.shape}")
    if a.size and (int(a.min()) < 0 or int(a.max()) >= 1 << 32):
        raise _invalid(f"{name}: ids must be in [0, 2^32), got {int(a.min())}..{int(a.max())}")
    return np.ascontiguousarray(a, dtype="<u4").tobytes()


class _Driver:
    """The few driver entry points, resolved once from libcuda.so.1.

    Versioned symbols first: ``cuStreamWriteValue64_v2`` is the one CUDA
    11.7+ enables by default (the unversioned one needed the driver's
    stream-memory-ops option before CUDA 12); ``cuMemHostRegister_v2`` and
    ``cuMemHostGetDevicePointer_v2`` are what cuda.h maps the plain names to.
    """

    def __init__(self, lib: Any = None) -> None:
        if lib is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as e:
                raise CudaDriverError("dlopen libcuda.so.1", -1, str(e)) from None
        self.lib = lib
        c_void_p, c_uint, c_uint64, c_size_t, c_int = ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int
        self.cuInit = self._fn(("cuInit",), [c_uint])
        self.cuGetErrorName = self._fn(("cuGetErrorName",), [c_int, ctypes.POINTER(ctypes.c_char_p)])
        self.cuCtxGetCurrent = self._fn(("cuCtxGetCurrent",), [ctypes.POINTER(c_void_p)])
        self.cuCtxSetCurrent = self._fn(("cuCtxSetCurrent",), [c_void_p])
        self.cuDeviceGet = self._fn(("cuDeviceGet",), [ctypes.POINTER(c_int), c_int])
        self.cuDevicePrimaryCtxRetain = self._fn(("cuDevicePrimaryCtxRetain",), [ctypes.POINTER(c_void_p), c_int])
        self.cuMemHostRegister = self._fn(("cuMemHostRegister_v2", "cuMemHostRegister"), [c_void_p, c_size_t, c_uint])
        self.cuMemHostUnregister = self._fn(("cuMemHostUnregister",), [c_void_p])
        self.cuMemHostGetDevicePointer = self._fn(
            ("cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer"), [ctypes.POINTER(c_uint64), c_void_p, c_uint])
        self.cuStreamWriteValue64 = self._fn(
            ("cuStreamWriteValue64_v2", "cuStreamWriteValue64"), [c_void_p, c_uint64, c_uint64, c_uint])
        self.check("cuInit", self.cuInit(0))

    def _fn(self, names: Tuple[str, ...], argtypes: list) -> Any:
        for n in names:
            f = getattr(self.lib, n, None)
            if f is not None:
                if isinstance(f, ctypes._CFuncPtr):  # not a test's stand-in
                    f.argtypes, f.restype = argtypes, ctypes.c_int
                return f
        raise CudaDriverError(f"dlsym {names[0]}", -1, "symbol not found in libcuda.so.1")

    def error_name(self, code: int) -> str:
        s = ctypes.c_char_p()
        if self.cuGetErrorName(code, ctypes.byref(s)) == 0 and s.value:
            return s.value.decode()
        return "CUDA_ERROR_UNKNOWN"

    def check(self, call: str, code: int) -> None:
        if code != 0:
            raise CudaDriverError(call, code, self.error_name(code))

    def ensure_context(self, device: int) -> None:
        """Make a context current on this thread: the caller's (torch's)
        if there is one, else ``device``'s primary context."""
        cur = ctypes.c_void_p()
        self.check("cuCtxGetCurrent", self.cuCtxGetCurrent(ctypes.byref(cur)))
        if cur.value:
            return
        dev = ctypes.c_int()
        self.check("cuDeviceGet", self.cuDeviceGet(ctypes.byref(dev), device))
        ctx = ctypes.c_void_p()
        self.check("cuDevicePrimaryCtxRetain", self.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value))
        self.check("cuCtxSetCurrent", self.cuCtxSetCurrent(ctx))


_driver: Optional[_Driver] = None
_driver_lock = threading.Lock()


def _cuda() -> _Driver:
    global _driver
    with _driver_lock:
        if _driver is None:
            _driver = _Driver()
        return _driver


def _stream_handle(stream: Any) -> int:
    """A CUstream from a torch.cuda.Stream (``cuda_stream``), a raw handle
    (int), or None: torch's current stream if torch is loaded, else the
    legacy default stream (0)."""
    if stream is None:
        import sys

        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.current_stream().cuda_stream)
        return 0
    h = getattr(stream, "cuda_stream", stream)
    if isinstance(h, bool) or not isinstance(h, int) or h < 0:
        raise _invalid(f"stream {stream!r}: want a torch.cuda.Stream, a CUstream handle (int) or None")
    return h


class Counter:
    """A progress counter: the 64-bit word at ``offset`` of a host region.

    ``Counter(client)`` asks the daemon for one page (leased to this client:
    it goes when the client does). Pass ``region`` (a :class:`~b2b.HostRegion`
    of yours) and ``offset`` (a multiple of 8) to put several counters in
    one page. ``device`` picks the GPU whose primary context registers the
    page when no context is current (torch's, once it touched CUDA, is used
    otherwise). ``cuda=False`` skips the CUDA registration: a host-written
    counter (tests, and daemons' CPU-only checks).
    """

    def __init__(self, client: Client, region: Optional[HostRegion] = None, offset: int = 0, *,
                 device: int = 0, cuda: bool = True) -> None:
        if not isinstance(offset, int) or offset < 0 or offset % 8:
            raise _invalid(f"counter offset {offset!r}: want a non-negative multiple of 8")
        self.client = client
        self._own = region is None
        self.region: HostRegion = client.register_host(COUNTER_PAGE) if region is None else region
        if offset + 8 > self.region.size:
            raise _invalid(f"counter offset {offset} + 8 is past the end of region {self.region.id} ({self.region.size} bytes)")
        self.offset = offset
        arr = self.region.array
        self._word = arr[offset:offset + 8].view(np.uint64)  # an aligned 8-byte view: loads and stores are whole
        self._base = int(arr.ctypes.data)
        self._registered = False
        self.device_ptr = 0
        if cuda:
            self._register(device)

    def _register(self, device: int) -> None:
        d = _cuda()
        d.ensure_context(device)
        rc = d.cuMemHostRegister(ctypes.c_void_p(self._base), self.region.size, CU_MEMHOSTREGISTER_DEVICEMAP)
        if rc != CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:  # another Counter of the same page did it
            d.check("cuMemHostRegister", rc)
            self._registered = True
        dp = ctypes.c_uint64()
        d.check("cuMemHostGetDevicePointer",
                d.cuMemHostGetDevicePointer(ctypes.byref(dp), ctypes.c_void_p(self._base + self.offset), 0))
        self.device_ptr = int(dp.value)

    @property
    def region_id(self) -> str:
        return self.region.id

    @property
    def value(self) -> int:
        """The counter, read from host memory."""
        return int(self._word[0])

    def set(self, value: int) -> None:
        """Write the counter from the host (a reset between runs, when no
        stream write is pending; tests)."""
        self._word[0] = np.uint64(value)

    def after(self, value: int) -> Tuple["Counter", int]:
        """``(self, value)``, for ``after=``."""
        return (self, value)

    def close(self) -> None:
        """Unregister from CUDA and, if this counter allocated its page,
        deregister it. Safe twice."""
        if self._registered:
            self._registered = False
            d = _cuda()
            d.check("cuMemHostUnregister", d.cuMemHostUnregister(ctypes.c_void_p(self._base)))
        self._word = None
        if self._own and not self.region.closed:
            self.region.close()

    def __enter__(self) -> "Counter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Counter({self.region.id}+{self.offset}, device_ptr={self.device_ptr:#x})"


def mark_layer_done(stream: Any, counter: Counter, layer: int) -> None:
    """Queue on ``stream`` a write of ``layer`` into ``counter``
    (``cuStreamWriteValue64``, CU_STREAM_WRITE_VALUE_DEFAULT: ordered after
    the stream's earlier work, with a memory barrier before it). No kernel
    runs. Returns at once; the write happens when the stream reaches it."""
    if not counter.device_ptr:
        raise _invalid(f"{counter!r} is not registered with CUDA (Counter(..., cuda=True))")
    if not isinstance(layer, int) or layer < 0 or layer >= 1 << 64:
        raise _invalid(f"layer {layer!r}: want an integer in [0, 2^64)")
    d = _cuda()
    d.check("cuStreamWriteValue64",
            d.cuStreamWriteValue64(ctypes.c_void_p(_stream_handle(stream)), counter.device_ptr, layer, CU_STREAM_WRITE_VALUE_DEFAULT))


def trigger_proto(after: Tuple[Counter, int]) -> Any:
    """``StartTransferRequest.after`` for ``(counter, value)``."""
    try:
        counter, value = after
    except (TypeError, ValueError):
        raise _invalid(f"after {after!r}: want (counter, value)") from None
    if not isinstance(counter, Counter):
        raise _invalid(f"after[0] {counter!r}: want a b2b.stream.Counter")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value >= 1 << 64:
        raise _invalid(f"after[1] {value!r}: want an integer in [0, 2^64)")
    return pb.TransferTrigger(counter_region_id=counter.region_id, counter_offset=counter.offset, value=value)


#: A started (possibly triggered) transfer: the one handle of every
#: transfer kind (:class:`b2b.Transfer`). ``outcome`` is the raw
#: ``TransferOutcome`` once it ended, whose ``result.phases`` carries
#: ``trigger_seen_unix_ns``, ``posted_unix_ns`` and ``landed_unix_ns``.
TriggeredTransfer = Transfer


def transfer_blocks(client: Client, local_layout: str, peer: str, remote_layout: str, local_ids: Any, remote_ids: Any, *,
                    after: Optional[Tuple[Counter, int]] = None, timeout: Optional[float] = None,
                    transport: Union[None, str, int] = None, notification: Optional[bytes] = None) -> TriggeredTransfer:
    """Start a block-id transfer (as :meth:`~b2b.Client.transfer_blocks`),
    run once ``after``'s counter reaches its value (``None``: at once).
    ``timeout`` (seconds) bounds it from the start, the armed wait included."""
    req = pb.TransferBlocksRequest(local_layout=local_layout, peer=peer, remote_layout=remote_layout,
                                   local_ids=_pack_ids(local_ids, "local_ids"),
                                   remote_ids=_pack_ids(remote_ids, "remote_ids"), transport=_transport(transport))
    if notification is not None:
        req.notification = bytes(notification)
    ms = timeout_ms(check_timeout(timeout))  # over the daemon's limit (1 h): sent as it
    start = pb.StartTransferRequest(blocks=req, timeout_ms=ms)
    if after is not None:
        start.after.CopyFrom(trigger_proto(after))
    r = client._call(client.stub.StartTransfer, start, client.timeout)
    return started(client, r.transfer_id, remote_ids)
