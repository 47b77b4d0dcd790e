"""Descriptor packing: array-likes to the wire's packed little-endian uint64 bytes.

Every path is a numpy operation on the whole array (one conversion, one
``tobytes`` copy); nothing loops over elements in Python.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import grpc
import numpy as np

from .errors import InvalidArgumentError

_U64LE = np.dtype("<u8")


def _one_d(values: Any, name: str, items: str) -> np.ndarray:
    """``values`` as a 1-D ndarray of its own dtype (an ndarray as it is).
    Raises :class:`TypeError` for bytes, strings and what numpy cannot read
    as an array, and :class:`InvalidArgumentError` for another shape;
    ``items`` ("integers") says in messages what the array holds."""
    if isinstance(values, np.ndarray):
        a = values
    elif isinstance(values, (bytes, bytearray, memoryview, str)):
        raise TypeError(f"{name}: expected an array of {items}, got {type(values).__name__}")
    else:
        try:
            a = np.asarray(values)
        except (TypeError, ValueError) as e:  # ragged lists and the like
            raise TypeError(f"{name}: cannot be read as an array of integers: {e}") from None
    if a.ndim != 1:
        raise InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, f"{name} must be a 1-D array of {items}, got shape {a.shape}")
    return a


def as_u64(values: Any, name: str) -> np.ndarray:
    """Return ``values`` as a 1-D little-endian uint64 ndarray, copying only if needed.

    Accepts numpy arrays of any integer dtype, lists/tuples of ints and
    buffer-protocol objects such as ``array.array('Q')``. Raises
    :class:`TypeError` for non-integer data and :class:`InvalidArgumentError`
    for a wrong shape or negative values (which uint64 cannot hold).
    """
    a = _one_d(values, name, "integers")
    kind = a.dtype.kind
    if kind == "u":
        pass
    elif kind == "i":
        if a.size and a.min() < 0:
            i = int(np.argmax(a < 0))
            raise InvalidArgumentError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{name}[{i}] = {int(a[i])} is negative: offsets and lengths are uint64",
            )
    elif a.size == 0 and kind in "fb" and not isinstance(values, np.ndarray):
        pass  # np.asarray([]) is float64; an empty list is just empty
    else:
        raise TypeError(f"{name}: expected integers, got dtype {a.dtype}")
    if a.dtype != _U64LE:
        a = a.astype(_U64LE)
    return a


def pack_u64(values: Any, name: str) -> Tuple[bytes, int]:
    """Pack ``values`` to packed little-endian uint64 bytes; return ``(bytes, count)``."""
    a = as_u64(values, name)
    return a.tobytes(), a.shape[0]


def unpack_u64(data: bytes) -> np.ndarray:
    """Read packed little-endian uint64s as a (read-only) numpy uint64 array, without copying."""
    return np.frombuffer(data, dtype=_U64LE)


def check_block_size(block_size: Optional[int], name: str = "block_size") -> int:
    """Validate a uniform block length; return it as an int (0 when ``None``)."""
    if block_size is None:
        return 0
    if isinstance(block_size, (bool, np.bool_)) or not isinstance(block_size, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(block_size).__name__}")
    v = int(block_size)
    if v <= 0:
        raise InvalidArgumentError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{name} is {v}: every block needs a length > 0",
        )
    if v >= 1 << 64:
        raise InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, f"{name} {v} does not fit in a uint64")
    return v


_U32LE = np.dtype("<u4")


def as_u32(values: Any, name: str) -> np.ndarray:
    """Return block ids as a 1-D little-endian uint32 ndarray, copying only if needed.

    Accepts numpy arrays and lists of ints, and torch integer tensors (CPU
    or CUDA: moved to the host first). Ids must fit a uint32; whether they
    are below a layout's ``num_blocks`` is the daemon's check. Raises
    :class:`TypeError` for non-integer data and :class:`InvalidArgumentError`
    naming the index and value otherwise.
    """
    if hasattr(values, "detach") and hasattr(values, "cpu") and hasattr(values, "numpy"):
        values = values.detach().cpu().numpy()  # a torch tensor: one copy to the host at most
    a = _one_d(values, name, "integer ids")
    kind = a.dtype.kind
    if a.size == 0 and kind in "fb" and not isinstance(values, np.ndarray):
        return np.empty(0, dtype=_U32LE)  # np.asarray([]) is float64
    if kind not in "iu":
        raise TypeError(f"{name}: expected integer ids, got dtype {a.dtype}")
    if a.size and a.dtype.itemsize >= 4 and (kind == "i" or a.dtype.itemsize > 4):
        bad = (a < 0) | (a > 0xFFFFFFFF) if kind == "i" else a > 0xFFFFFFFF
        if bad.any():
            i = int(np.argmax(bad))
            raise InvalidArgumentError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{name}[{i}] = {int(a[i])} does not fit a uint32 block id (0 to {0xFFFFFFFF})",
            )
    elif a.size and kind == "i" and (a < 0).any():
        i = int(np.argmax(a < 0))
        raise InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, f"{name}[{i}] = {int(a[i])} is negative: block ids are uint32")
    if a.dtype != _U32LE:
        a = a.astype(_U32LE)
    return a


def pack_u32(values: Any, name: str) -> Tuple[bytes, int]:
    """Pack block ids to packed little-endian uint32 bytes; return ``(bytes, count)``."""
    a = as_u32(values, name)
    return a.tobytes(), a.shape[0]
