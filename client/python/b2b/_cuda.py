"""PyTorch CUDA tensors to ``CudaIpc`` registrations.

Nothing here imports torch: the tensor is used through its own methods (duck
typing), so the package works without torch installed and the arithmetic can
be tested with a stand-in object.

``UntypedStorage._share_cuda_()`` (torch/csrc/StorageSharing.cpp, PyTorch 2.x)
returns an 8-tuple::

    (device,                 # int: CUDA device index of the storage
     handle,                 # bytes: IPC handle of the *base* cudaMalloc block
     storage_size_bytes,     # int: the storage's size (not the base block's)
     storage_offset_bytes,   # int: where the storage starts inside the base block
     ref_counter_handle,     # bytes: shm file name of the producer's ref counter
     ref_counter_offset,     # int: slot in that file
     event_handle,           # bytes: cudaIpcEventHandle recorded at share time
     event_sync_required)    # bool

b2b uses fields 0-3 to build ``CudaIpc{device, ipc_handle, offset, size}``
and keeps 4-5 to give the producer's ref count back when the region is
released (the daemon plays the role of the consumer process, which normally
decrements it). Fields 6-7 are not used: the caller orders GPU work against
transfers itself (``torch.cuda.synchronize()`` before a transfer reads the
tensor, and after one writes it).

The handle's format depends on the PyTorch version:

* older releases: the raw 64-byte ``cudaIpcMemHandle_t``;
* newer releases (``CUDACachingAllocator::shareIpcHandle`` writes a
  ``ShareableHandle``): one version byte, one type byte, then the payload. Type
  ``'c'`` (a plain cudaMalloc block) carries the 64-byte ``cudaIpcMemHandle_t``;
  type ``'e'`` (``expandable_segments:True``) carries cuMem exports, which
  cannot be opened with ``cuIpcOpenMemHandle`` and are refused here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

import grpc

from .errors import InvalidArgumentError

#: sizeof(cudaIpcMemHandle_t) == sizeof(CUipcMemHandle).
CUDA_IPC_HANDLE_SIZE = 64
_TYPE_CUDA_MALLOC = ord("c")
_TYPE_EXPANDABLE_SEGMENT = ord("e")


def _invalid(msg: str) -> InvalidArgumentError:
    return InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, msg)


def ipc_mem_handle(handle: bytes) -> bytes:
    """Extract the 64-byte ``cudaIpcMemHandle_t`` from a ``_share_cuda_`` handle."""
    handle = bytes(handle)
    n = len(handle)
    if n == CUDA_IPC_HANDLE_SIZE:
        return handle  # unversioned: the raw handle
    if n >= 2 and handle[1] == _TYPE_EXPANDABLE_SEGMENT:
        raise _invalid(
            "cuda tensor: its memory comes from an expandable segment "
            "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), which has no cudaIpcMemHandle; "
            "allocate it with expandable_segments:False "
            "(torch.cuda.memory._set_allocator_settings('expandable_segments:False'))"
        )
    if n == 2 + CUDA_IPC_HANDLE_SIZE and handle[1] == _TYPE_CUDA_MALLOC:
        return handle[2:]  # versioned ShareableHandle: [version]['c'][cudaIpcMemHandle_t]
    raise _invalid(
        f"cuda tensor: unrecognised CUDA IPC handle from _share_cuda_ ({n} bytes, "
        f"starting {handle[:2].hex()}): expected a 64-byte cudaIpcMemHandle or a versioned 'c' handle"
    )


@dataclass(frozen=True)
class CudaShare:
    """What ``register_cuda`` sends, and what it must give back on release."""

    device: int
    ipc_handle: bytes  # 64 bytes
    offset: int  # bytes from the start of the base allocation to the tensor's first element
    size: int  # the tensor's bytes
    ref_counter_handle: Optional[bytes]
    ref_counter_offset: int
    release_counter: Optional[Callable[[bytes, int], Any]]


def share_tensor(tensor: Any) -> CudaShare:
    """Share a contiguous CUDA tensor's memory through CUDA IPC.

    The registered range is exactly the tensor's elements::

        offset = storage_offset_bytes                      # storage inside the base block
               + tensor.storage_offset() * element_size    # tensor inside its storage
        size   = tensor.numel() * element_size
    """
    if not getattr(tensor, "is_cuda", False):
        raise _invalid(f"cuda tensor: tensor is on {getattr(tensor, 'device', '?')}, not a CUDA device")
    if not tensor.is_contiguous():
        raise _invalid(
            "cuda tensor: tensor is not contiguous: its bytes are not one range; "
            "register tensor.contiguous() (or the base tensor it is a view of)"
        )
    elem = int(tensor.element_size())
    nbytes = int(tensor.numel()) * elem
    if nbytes == 0:
        raise _invalid("cuda tensor: tensor has no elements: a region needs at least one byte")
    storage, share = _share_storage(tensor, "register_cuda")
    storage_size_bytes, storage_offset_bytes = share[2], share[3]
    begin = int(tensor.storage_offset()) * elem
    if begin + nbytes > int(storage_size_bytes):
        raise _invalid(
            f"cuda tensor: elements [{begin}, {begin + nbytes}) run past its storage's {int(storage_size_bytes)} bytes"
        )
    return _cuda_share(storage, share, int(storage_offset_bytes) + begin, nbytes)


def _share_storage(tensor: Any, who: str) -> Tuple[Any, Tuple[Any, ...]]:
    """``tensor``'s storage and what its ``_share_cuda_`` says: (device,
    IPC handle, storage size, storage offset in the handle's block, ref
    counter handle, ref counter offset, ...). ``who`` names the caller
    that needs PyTorch 2.0."""
    if not hasattr(tensor, "untyped_storage"):
        raise _invalid(f"cuda tensor: {who} needs PyTorch 2.0 or newer (Tensor.untyped_storage)")
    storage = tensor.untyped_storage()
    share: Tuple[Any, ...] = storage._share_cuda_()
    if len(share) < 4:
        raise _invalid(f"cuda tensor: _share_cuda_ returned {len(share)} fields, expected 8")
    if share[1] is None:
        raise _invalid("cuda tensor: its storage has no memory to share")
    return storage, share


def _cuda_share(storage: Any, share: Tuple[Any, ...], offset: int, size: int) -> CudaShare:
    """The :class:`CudaShare` of ``size`` bytes at ``offset`` in the block
    that ``share`` (from :func:`_share_storage`) names, with PyTorch's IPC
    ref counter where it gives one."""
    ref_h = share[4] if len(share) > 4 else None
    ref_off = int(share[5]) if len(share) > 5 and share[5] is not None else 0
    return CudaShare(
        device=int(share[0]),
        ipc_handle=ipc_mem_handle(share[1]),
        offset=offset,
        size=size,
        ref_counter_handle=ref_h if ref_h else None,
        ref_counter_offset=ref_off,
        release_counter=getattr(type(storage), "_release_ipc_counter_cuda", None),
    )


# ---------------------------------------------------------------------------
# Allocations: which cudaMalloc block a device pointer lies in (b2b.kv).

_libcuda: Any = None


def _driver() -> Any:
    """libcuda, loaded at run time as the daemon loads it (nothing links it)."""
    global _libcuda
    if _libcuda is not None:
        return _libcuda
    import ctypes  # noqa: PLC0415

    lib = None
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        raise OSError("b2b.kv: libcuda.so.1 (the CUDA driver) could not be loaded; CUDA tensors need it")
    u64p, szp = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t)
    lib.cuInit.argtypes = [ctypes.c_uint]
    lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    lib.cuCtxPushCurrent_v2.argtypes = [ctypes.c_void_p]
    lib.cuCtxPopCurrent_v2.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.cuMemGetAddressRange_v2.argtypes = [u64p, szp, ctypes.c_uint64]
    release = getattr(lib, "cuDevicePrimaryCtxRelease_v2", None) or lib.cuDevicePrimaryCtxRelease
    release.argtypes = [ctypes.c_int]
    lib.b2b_release = release
    _check(lib, lib.cuInit(0), "cuInit")
    _libcuda = lib
    return lib


def _check(lib: Any, rc: int, what: str) -> None:
    if rc == 0:
        return
    import ctypes  # noqa: PLC0415

    name = ctypes.c_char_p()
    try:
        lib.cuGetErrorName(rc, ctypes.byref(name))
    except Exception:  # an old driver: the number alone
        pass
    label = name.value.decode() if name.value else "CUresult"
    raise OSError(f"b2b.kv: {what} failed: {label} ({rc})")


def address_range(device: int, ptr: int) -> Tuple[int, int]:
    """``(base, size)`` of the allocation holding device pointer ``ptr``
    (``cuMemGetAddressRange``), with ``device``'s primary context pushed for
    the call, so that it works from any thread."""
    import ctypes  # noqa: PLC0415

    cu = _driver()
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    _check(cu, cu.cuDeviceGet(ctypes.byref(dev), int(device)), f"cuDeviceGet({device})")
    _check(cu, cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), f"cuDevicePrimaryCtxRetain({device})")
    try:
        _check(cu, cu.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
        try:
            base, size = ctypes.c_uint64(), ctypes.c_size_t()
            _check(cu, cu.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)),
                   f"cuMemGetAddressRange({ptr:#x} on device {device})")
            return int(base.value), int(size.value)
        finally:
            popped = ctypes.c_void_p()
            cu.cuCtxPopCurrent_v2(ctypes.byref(popped))
    finally:
        cu.b2b_release(dev)


def share_range(tensor: Any, alloc_base: int, start: int, size: int) -> CudaShare:
    """Share ``[start, start+size)`` (device addresses) of the allocation at
    ``alloc_base`` (from :func:`address_range`) through the IPC handle of
    ``tensor``'s storage, which lies in that allocation.

    The driver says where the allocation is; PyTorch's handle names its own
    base block, at ``storage.data_ptr() - storage_offset_bytes``. The two must
    agree, or the offset sent would point elsewhere: refused, naming both.
    """
    storage, share = _share_storage(tensor, "b2b.kv")
    storage_offset_bytes = share[3]
    torch_base = int(storage.data_ptr()) - int(storage_offset_bytes)
    if torch_base != alloc_base:
        raise _invalid(
            f"cuda tensor: cuMemGetAddressRange puts its allocation at {alloc_base:#x}, but PyTorch's IPC "
            f"handle names a block at {torch_base:#x}; b2b.kv cannot tell which memory the handle opens"
        )
    if start < alloc_base or size <= 0:
        raise _invalid(f"cuda tensor: range [{start:#x}, +{size}) is not inside the allocation at {alloc_base:#x}")
    return _cuda_share(storage, share, start - alloc_base, size)
