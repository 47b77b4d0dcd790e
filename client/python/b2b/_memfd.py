"""Host memory this process allocates itself, registered without a copy.

:func:`alloc_host` makes a memfd sealed against shrinking and maps it: a
:class:`HostBuffer`, usable at once as a numpy array or torch tensor and
pinnable (:meth:`HostBuffer.pin`, ``cudaHostRegister``). ``Client.register_memfd``
hands its descriptor to the daemon over the submit socket (SCM_RIGHTS: gRPC
cannot carry descriptors) and registers it like any host region;
``Client.alloc_host`` does both. The daemon maps the same pages: nothing is
copied, and registering takes no page faults, whatever the size.
"""

from __future__ import annotations

import array
import fcntl
import mmap
import os
import socket
import struct
import weakref
from typing import TYPE_CHECKING, Any, Optional, Sequence, Tuple, Union

import grpc
import numpy as np

from ._common import _invalid
from ._regions import HostRegion
from ._results import RegionInfo
from .errors import B2BError, UnavailableError, error_for_code

if TYPE_CHECKING:
    from .client import Client

# internal/region/fdpass: the frames of a descriptor handover.
HELLO = 0x64666D656D623262  # "b2bmemfd" little-endian
ANSWER_LEN = 48
MAX_MSG = 4096
TOKEN_PREFIX = "memfd:"
ALLOCATOR = "b2b.alloc_host(size) (or Client.alloc_host)"

_buffers: "weakref.WeakValueDictionary[int, HostBuffer]" = weakref.WeakValueDictionary()


class HostBuffer:
    """Host memory of this process that the daemon can map: a memfd sealed
    against shrinking (``F_SEAL_SHRINK``), mapped ``MAP_SHARED`` here.

    Its pages are allocated as they are first touched. It stays valid after
    a region over it is deregistered; :meth:`close` unmaps it (once no numpy
    view of it is alive) and closes the descriptor. A region registered over
    it stays valid in the daemon, which keeps its own mapping, until
    deregistered.
    """

    def __init__(self, size: int) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0 or size > 1 << 46:
            raise _invalid(f"alloc_host: size {size!r}: want 1 to {1 << 46} bytes")
        fd = os.memfd_create("b2b-host", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                mm.madvise(mmap.MADV_HUGEPAGE)  # where shmem huge pages are on request
            except OSError:
                pass
        self.fd: int = fd
        self.size = size
        self._mmap: Optional[mmap.mmap] = mm
        self._array: Optional[np.ndarray] = np.frombuffer(mm, dtype=np.uint8)
        self._pinned = False
        _buffers[id(mm)] = self

    @property
    def mmap(self) -> mmap.mmap:
        if self._mmap is None:
            raise ValueError("host buffer is closed")
        return self._mmap

    @property
    def array(self) -> np.ndarray:
        """A writable numpy ``uint8`` view of the whole buffer (no copy)."""
        if self._array is None:
            raise ValueError("host buffer is closed")
        return self._array

    @property
    def address(self) -> int:
        """The address of the first byte in this process."""
        return int(self.array.__array_interface__["data"][0])

    def as_array(self, dtype: Any, shape: Union[int, Sequence[int]], offset: int = 0) -> np.ndarray:
        """A numpy view of ``shape`` elements of ``dtype`` at byte ``offset``."""
        dt = np.dtype(dtype)
        shape_t: Tuple[int, ...] = (shape,) if isinstance(shape, int) else tuple(shape)
        n = int(np.prod(shape_t)) if shape_t else 1
        if offset < 0 or offset % dt.alignment or offset + n * dt.itemsize > self.size:
            raise _invalid(f"as_array: {n} x {dt} at offset {offset} does not fit the {self.size}-byte buffer aligned to {dt.alignment}")
        return np.frombuffer(self.mmap, dtype=dt, count=n, offset=offset).reshape(shape_t)

    def as_tensor(self, dtype: Any, shape: Union[int, Sequence[int]], offset: int = 0) -> Any:
        """A torch CPU tensor over the same memory (``torch.frombuffer``; torch imported here)."""
        import torch  # pylint: disable=import-outside-toplevel

        shape_t: Tuple[int, ...] = (shape,) if isinstance(shape, int) else tuple(shape)
        n = int(np.prod(shape_t)) if shape_t else 1
        itemsize = torch.empty((), dtype=dtype).element_size()
        if offset < 0 or offset % itemsize or offset + n * itemsize > self.size:
            raise _invalid(f"as_tensor: {n} x {dtype} at offset {offset} does not fit the {self.size}-byte buffer")
        return torch.frombuffer(self.mmap, dtype=dtype, count=n, offset=offset).view(shape_t)

    def pin(self) -> None:
        """Page-lock the buffer for CUDA copies (``cudaHostRegister`` through
        torch): GPU copies to and from it run at pinned speed, and the
        daemon maps the same pages."""
        import torch  # pylint: disable=import-outside-toplevel

        if not torch.cuda.is_available():
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE, "pin: CUDA is not available to torch here")
        err = torch.cuda.cudart().cudaHostRegister(self.address, self.size, 0)
        if int(err) != 0:
            raise B2BError(grpc.StatusCode.INTERNAL, f"pin: cudaHostRegister({self.size} bytes) failed: {err}")
        self._pinned = True

    def close(self) -> None:
        """Unpin, unmap (once no view is alive) and close the descriptor."""
        if self._pinned:
            import torch  # pylint: disable=import-outside-toplevel

            torch.cuda.cudart().cudaHostUnregister(self.address)
            self._pinned = False
        mm, self._mmap, self._array = self._mmap, None, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # views alive: unmapped when the last one is collected
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "HostBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HostBuffer(size={self.size}, fd={self.fd})"


def alloc_host(size: int) -> HostBuffer:
    """Allocate ``size`` bytes of host memory the daemon can map (a sealed memfd)."""
    return HostBuffer(size)


class MemfdRegion(HostRegion):
    """A host region over a :class:`HostBuffer`: ``array`` and ``mmap`` are
    the buffer's. Closing the region closes the buffer only when
    ``Client.alloc_host`` made it."""

    def __init__(self, client: "Client", info: RegionInfo, buf: HostBuffer, owns: bool, deregister_on_close: bool) -> None:
        super().__init__(client, info, buf.mmap, deregister_on_close)
        self.buffer = buf
        self._owns = owns

    def _release_local(self) -> None:
        self._mmap, self._array, self._view = None, None, None
        if self._owns:
            self.buffer.close()


def submit_socket(address: str, explicit: Optional[str] = None) -> str:
    """The submit socket a descriptor goes over: ``explicit``, else
    ``$B2B_SUBMIT_SOCKET``, else ``submit.sock`` beside the API socket."""
    if explicit:
        return os.fspath(explicit)
    env = os.environ.get("B2B_SUBMIT_SOCKET")
    if env:
        return env
    for p in ("unix://", "unix:"):
        if address.startswith(p):
            address = address[len(p):]
            break
    if not address.startswith("/"):
        raise _invalid(f"register_memfd: the daemon at {address!r} is not on a local Unix socket; descriptors cannot reach it")
    return os.path.join(os.path.dirname(address), "submit.sock")


def _buffer_of(source: Any) -> Optional[HostBuffer]:
    """The HostBuffer a numpy array or memoryview is a view of, if any."""
    obj = source
    for _ in range(64):
        if isinstance(obj, mmap.mmap):
            return _buffers.get(id(obj))
        nxt = getattr(obj, "base", None)
        if nxt is None and isinstance(obj, memoryview):
            nxt = obj.obj
        if nxt is None:
            return None
        obj = nxt
    return None


def hand_over(path: str, fd: int, timeout: Optional[float]) -> Tuple[socket.socket, int]:
    """Send fd on the submit socket at path; returns the open socket (keep
    it until RegisterRegion returned) and the daemon's token."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        try:
            s.connect(path)
        except OSError as e:
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE, f"register_memfd needs the daemon's submit socket (b2bd --submit-socket): connect {path}: {e}") from e
        req = struct.pack("<QQ", HELLO, 0)
        s.sendmsg([req], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
        head = _recv_exact(s, ANSWER_LEN)
        tag, code, n, token, _size, _reserved, marker = struct.unpack("<QIIQQQQ", head)
        if marker != HELLO:
            raise error_for_code(grpc.StatusCode.UNIMPLEMENTED, f"register_memfd: the daemon at {path} does not take descriptors (it answered the frame as a submit: a b2bd older than memfd registration)")
        if tag != HELLO or n > MAX_MSG:
            raise error_for_code(grpc.StatusCode.UNIMPLEMENTED, f"register_memfd: answer tag {tag:#x} (want {HELLO:#x}), message {n} bytes: not a daemon that takes descriptors")
        if code != 0:
            msg = _recv_exact(s, n).decode("utf-8", "replace")
            sc = next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)
            raise error_for_code(sc, msg)
        return s, token
    except BaseException:
        s.close()
        raise


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE, "register_memfd: the daemon closed the submit socket (a daemon too old for descriptors?)")
        buf += chunk
    return bytes(buf)


def resolve_source(source: Any) -> Tuple[int, Optional[HostBuffer]]:
    """The descriptor (and buffer, if any) of a register_memfd source."""
    if isinstance(source, HostBuffer):
        return source.fd, source
    if isinstance(source, int) and not isinstance(source, bool):
        return source, None
    buf = _buffer_of(source)
    if buf is not None:
        return buf.fd, buf
    raise _invalid(
        f"register_memfd: a {type(source).__name__}'s memory is anonymous, private to this process: the daemon "
        f"cannot map it. Allocate the pool with {ALLOCATOR} and build the array over it "
        "(buf.as_array(dtype, shape)), or pass a memfd descriptor sealed with F_SEAL_SHRINK"
    )
