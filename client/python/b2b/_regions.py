"""Regions: host memory mapped from the daemon's shm files, and CUDA memory
shared with it.
"""

from __future__ import annotations

import mmap
import warnings
from typing import TYPE_CHECKING, Any, Optional, Union

import numpy as np

from . import _cuda
from ._common import _invalid
from ._results import RegionInfo
from .errors import B2BError, NotFoundError

if TYPE_CHECKING:  # annotations only: client.py imports this module
    from .client import Client


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
