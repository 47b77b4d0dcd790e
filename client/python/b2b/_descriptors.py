"""Descriptors: the block lists of a batch, packed once.
"""

from __future__ import annotations

from typing import Any, Optional

from ._common import _invalid
from ._pack import check_block_size, pack_u64
from .v1 import b2b_pb2 as pb


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
