"""numpy arrays and torch tensors over a host region's memory.

b2bd moves bytes between regions it owns (daemon-allocated shared memory, or
files in its ``--shm-dir``); it cannot register memory an application already
allocated on its heap (docs/host-memory.md says why). So an application puts
the buffers it wants to move *in* a region: it registers a region of the size
of its pool and allocates the pool there, as a numpy array or a torch tensor
that views the region's mapping without a copy::

    region = client.register_host(num_blocks * block_bytes, "kv-cache")
    kv = b2b.as_array(region, np.float16, (num_blocks, 2, 16, 8, 128))   # or as_tensor
    offsets = b2b.block_offsets(region, kv, block_ids)                   # descriptors
    client.batch_transfer(region, peer, "kv-cache", offsets, offsets, block_size=kv[0].nbytes)

Bytes written through the view are what the daemon sends; bytes a peer writes
appear in it once the transfer has returned. The view keeps the mapping
alive: closing or deregistering the region never unmaps under a live view.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from .client import HostRegion

__all__ = ["as_array", "as_tensor", "block_offsets"]

Shape = Union[int, Sequence[int], None]


def _host(region: Any, fn: str) -> HostRegion:
    if not isinstance(region, HostRegion):
        raise TypeError(
            f"{fn}: region is {type(region).__name__}, want a HostRegion (from register_host or "
            "register_host_file); GPU memory is registered from a tensor with register_cuda"
        )
    return region


def _layout(region: HostRegion, fn: str, itemsize: int, shape: Shape, offset: int) -> Tuple[Tuple[int, ...], int]:
    """The shape and element count of a view of ``itemsize``-byte elements at
    ``offset``, checked against the region; errors name the value and limit."""
    size = region.size
    if not isinstance(offset, int) or offset < 0:
        raise ValueError(f"{fn}: offset {offset!r} must be an int >= 0")
    if offset % itemsize:
        raise ValueError(f"{fn}: offset {offset} is not a multiple of the element size {itemsize}")
    if offset > size:
        raise ValueError(f"{fn}: offset {offset} is past the end of region {region.id} ({size} bytes)")
    if shape is None:
        count = (size - offset) // itemsize
        dims: Tuple[int, ...] = (count,)
    else:
        dims = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
        if any(d < 0 for d in dims):
            raise ValueError(f"{fn}: shape {dims} has a negative dimension")
        count = math.prod(dims)
    need = count * itemsize
    if offset + need > size:
        raise ValueError(
            f"{fn}: shape {dims} of {itemsize}-byte elements at offset {offset} needs {need} bytes, "
            f"past the end of region {region.id} ({size} bytes; {size - offset} from the offset)"
        )
    return dims, count


def as_array(region: HostRegion, dtype: Any = np.uint8, shape: Shape = None, offset: int = 0) -> np.ndarray:
    """A writable numpy array of ``dtype`` and ``shape`` over the region's
    memory from byte ``offset`` (C order, no copy). ``shape=None``: a flat
    array of as many elements as fit."""
    r = _host(region, "as_array")
    dt = np.dtype(dtype)
    dims, count = _layout(r, "as_array", dt.itemsize, shape, offset)
    return np.frombuffer(r.mmap, dtype=dt, count=count, offset=offset).reshape(dims)


def _torch() -> Any:
    try:
        import torch  # noqa: PLC0415 - optional dependency, imported on first use
    except ImportError as e:
        raise ImportError(
            "as_tensor needs PyTorch (import torch failed); as_array gives numpy views of the same memory"
        ) from e
    return torch


def as_tensor(region: HostRegion, dtype: Any = None, shape: Shape = None, offset: int = 0) -> Any:
    """A writable CPU torch tensor of ``dtype`` (default ``torch.uint8``) and
    ``shape`` over the region's memory from byte ``offset`` (no copy, through
    ``torch.frombuffer``). Needs PyTorch; this package does not depend on it."""
    torch = _torch()
    r = _host(region, "as_tensor")
    dt = torch.uint8 if dtype is None else dtype
    if not isinstance(dt, torch.dtype):
        raise TypeError(f"as_tensor: dtype {dtype!r} is not a torch.dtype")
    itemsize = torch.empty((), dtype=dt).element_size()
    dims, count = _layout(r, "as_tensor", itemsize, shape, offset)
    if count == 0:
        return torch.empty(dims, dtype=dt)  # torch.frombuffer refuses an empty view
    return torch.frombuffer(r.mmap, dtype=dt, count=count, offset=offset).view(dims)


def _base_address(region: HostRegion) -> int:
    return int(region.array.ctypes.data)


def block_offsets(region: HostRegion, pool: Any, block_ids: Any = None) -> np.ndarray:
    """Region offsets (``uint64``, ready as descriptors) of entries of
    ``pool`` along its first axis: ``pool`` is a view from :func:`as_array` or
    :func:`as_tensor` (or a slice of one), ``block_ids`` the indices (default:
    all). Block ``i`` starts at ``pool``'s offset in the region plus ``i``
    times its first-axis stride."""
    r = _host(region, "block_offsets")
    if isinstance(pool, np.ndarray):
        addr, stride, n = int(pool.ctypes.data), int(pool.strides[0]) if pool.ndim else 0, len(pool) if pool.ndim else 1
        nbytes = pool.nbytes
    elif hasattr(pool, "data_ptr") and hasattr(pool, "stride"):  # a torch tensor
        addr, n = int(pool.data_ptr()), int(pool.shape[0]) if pool.dim() else 1
        stride = int(pool.stride(0)) * pool.element_size() if pool.dim() else 0
        nbytes = pool.numel() * pool.element_size()
    else:
        raise TypeError(f"block_offsets: pool is {type(pool).__name__}, want a numpy array or a torch tensor")
    start = addr - _base_address(r)
    if start < 0 or start + nbytes > r.size:
        raise ValueError(f"block_offsets: pool is not inside region {r.id} (it starts {start} bytes from the region's start)")
    ids = np.arange(n, dtype=np.int64) if block_ids is None else np.asarray(block_ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        bad = int(ids[(ids < 0) | (ids >= n)][0])
        raise ValueError(f"block_offsets: block id {bad} is outside the pool's first axis [0, {n})")
    return (start + ids * stride).astype(np.uint64)
