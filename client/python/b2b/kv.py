"""b2b.kv: a KV cache's tensors as one b2bd layout, and block-id transfers.

An inference engine keeps one paged tensor per layer (and K/V):
``[num_blocks, block_size, kv_heads, head_dim]`` (vLLM's NHD), or
``[num_blocks, kv_heads, block_size, head_dim]`` (HND), or K and V stacked,
``[2, num_blocks, ...]``. :func:`register` turns such a list or dict of
tensors into one layout (docs/kv.md): one segment per tensor (two for a
stacked one), block ``b`` of every segment being row ``b`` of dim 0. A
request then moves blocks by id::

    src = b2b.kv.register(client, kv_caches, name="prefill")
    dst = b2b.kv.register(peer_client, peer_caches, name="decode", export_name="decode")
    src.transfer_blocks(peer_address, "decode", local_ids, remote_ids)

Memory:

* PyTorch CUDA tensors. Each distinct **allocation** (``cuMemGetAddressRange``)
  is registered once as a ``cuda_ipc`` region spanning the tensors in it, so
  views of one pool share one region. torch is not imported here.
* numpy arrays (or CPU torch tensors) living in daemon memory: views from
  :func:`b2b.as_array` / :func:`b2b.as_tensor` of a region this client
  registered. Their region is found by address; nothing is registered.

GPU work is not ordered against transfers: synchronise (``torch.cuda.synchronize()``)
before a transfer reads the tensors, and after one wrote them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import grpc
import numpy as np

from . import _cuda
from ._pack import pack_u32
from .client import (
    Client,
    CudaRegion,
    HostRegion,
    Transfer,
    TransferResult,
    _dereg_default,
    _transport,
)
from .errors import B2BError, InvalidArgumentError
from .stream import Counter, mark_layer_done, trigger_proto  # layer streaming (docs/kv.md)
from .v1 import b2b_pb2 as pb

__all__ = ["register", "Layout", "Segment", "BlocksTransfer", "pack_ids", "Counter", "mark_layer_done"]


def _invalid(msg: str) -> InvalidArgumentError:
    return InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, msg)


def pack_ids(ids: Any, name: str = "ids") -> bytes:
    """Block ids (list, numpy array, torch integer tensor) as packed
    little-endian ``uint32`` bytes, by numpy (no Python loop)."""
    return pack_u32(ids, name)[0]


# ---------------------------------------------------------------------------
# Tensors, described without importing torch.


@dataclass(frozen=True)
class _View:
    """What b2b.kv needs of a tensor or array: where it is and how it is laid out."""

    label: str
    obj: Any  # the tensor or array, kept alive by the layout
    cuda: bool
    device: int
    addr: int  # address of element [0, 0, ...]
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]  # bytes
    itemsize: int

    @property
    def extent(self) -> Tuple[int, int]:
        """``[first byte, end)`` the view touches (it must have elements)."""
        last = sum((n - 1) * s for n, s in zip(self.shape, self.strides))
        return self.addr, self.addr + last + self.itemsize


def _view(label: str, t: Any) -> _View:
    if isinstance(t, np.ndarray):
        return _View(label, t, False, -1, int(t.__array_interface__["data"][0]), tuple(int(n) for n in t.shape),
                     tuple(int(s) for s in t.strides), int(t.itemsize))
    if hasattr(t, "data_ptr") and hasattr(t, "stride") and hasattr(t, "element_size"):  # a torch tensor
        item = int(t.element_size())
        cuda = bool(getattr(t, "is_cuda", False))
        dev = getattr(t, "device", None)
        index = getattr(dev, "index", None)
        return _View(label, t, cuda, int(index) if index is not None else (0 if cuda else -1), int(t.data_ptr()),
                     tuple(int(n) for n in t.shape), tuple(int(s) * item for s in t.stride()), item)
    raise TypeError(f"b2b.kv: tensor {label!r} is {type(t).__name__}: want a torch tensor or a numpy array")


def _sub(v: _View, k: int) -> _View:
    """Row ``k`` of dim 0 (K or V of a stacked tensor)."""
    return _View(f"{v.label}[{k}]", v.obj, v.cuda, v.device, v.addr + k * v.strides[0], v.shape[1:], v.strides[1:], v.itemsize)


def _is_stacked(v: _View, stacked: Optional[bool]) -> bool:
    if stacked is None:
        return len(v.shape) == 5 and v.shape[0] == 2  # vLLM's [2, num_blocks, block_size, heads, head_dim]
    return bool(stacked)


@dataclass(frozen=True)
class _Blocks:
    """One tensor's blocks before a region is known: block ``b`` is the
    ``block_len`` bytes at ``addr + b*stride``; ``rows`` is dim 1's size and
    ``row_bytes`` its bytes (for head slices)."""

    view: _View
    addr: int
    block_len: int
    stride: int
    num_blocks: int
    rows: int
    row_bytes: int


def _blocks(v: _View) -> _Blocks:
    """Dim 0 is the block id; the rest of a block must be contiguous."""
    if not v.shape:
        raise _invalid(f"b2b.kv: tensor {v.label!r} is a scalar: dim 0 must be the block id")
    if any(n == 0 for n in v.shape):
        raise _invalid(f"b2b.kv: tensor {v.label!r} has shape {v.shape}: it has no elements")
    expected = v.itemsize
    for d in range(len(v.shape) - 1, 0, -1):
        if v.shape[d] != 1 and v.strides[d] != expected:
            raise _invalid(
                f"b2b.kv: tensor {v.label!r}: dim {d} has stride {v.strides[d]} bytes, want {expected} "
                f"(shape {v.shape}, strides {v.strides} bytes): the rest of a block must be contiguous"
            )
        expected *= v.shape[d]
    block_len, n = expected, v.shape[0]
    stride = v.strides[0] if n > 1 else block_len
    if stride < block_len:
        raise _invalid(
            f"b2b.kv: tensor {v.label!r}: dim 0 (the block id) has stride {stride} bytes, "
            f"below the block's {block_len} bytes: blocks would overlap"
        )
    rows = v.shape[1] if len(v.shape) > 1 else 1
    return _Blocks(v, v.addr, block_len, stride, n, rows, block_len // rows)


def _flatten(tensors: Union[Sequence[Any], Dict[str, Any]], stacked: Optional[bool]) -> List[_Blocks]:
    if isinstance(tensors, dict):
        items = [(str(k), t) for k, t in tensors.items()]
    elif isinstance(tensors, (list, tuple)):
        items = [(str(i), t) for i, t in enumerate(tensors)]
    else:
        raise TypeError(f"b2b.kv: tensors is {type(tensors).__name__}: want a list or dict of tensors")
    if not items:
        raise _invalid("b2b.kv: no tensors: a layout needs at least one segment")
    out: List[_Blocks] = []
    for label, t in items:
        v = _view(label, t)
        if _is_stacked(v, stacked):
            if len(v.shape) < 2 or v.shape[0] != 2:
                raise _invalid(f"b2b.kv: tensor {label!r} has shape {v.shape}: a stacked K/V tensor is [2, num_blocks, ...]")
            out.extend(_blocks(_sub(v, k)) for k in (0, 1))
        else:
            out.append(_blocks(v))
    n0 = out[0].num_blocks
    for b in out[1:]:
        if b.num_blocks != n0:
            raise _invalid(
                f"b2b.kv: tensor {b.view.label!r} has {b.num_blocks} blocks, tensor {out[0].view.label!r} has {n0}: "
                "every segment of a layout has the same num_blocks"
            )
    if len({b.view.cuda for b in out}) > 1:
        raise _invalid("b2b.kv: tensors mix CUDA and host memory: register each kind as its own layout")
    return out


def _slice(b: _Blocks, heads: Optional[Tuple[int, int]]) -> Tuple[int, int]:
    """``(offset into the block, block_len)`` of a head slice (dim 1)."""
    if heads is None:
        return 0, b.block_len
    start, count = (int(x) for x in heads)
    if start < 0 or count <= 0 or start + count > b.rows:
        raise _invalid(
            f"b2b.kv: heads=({start}, {count}) is outside tensor {b.view.label!r}'s dim 1 of {b.rows} "
            "(heads=(start, count) slices dim 1 of each block: the heads of a heads-first [num_blocks, heads, ...] pool)"
        )
    return start * b.row_bytes, count * b.row_bytes


# ---------------------------------------------------------------------------
# Regions.


def _host_region(client: Client, b: _Blocks) -> HostRegion:
    lo, hi = b.view.extent
    with client._lock:
        regions = [r for r in client._regions if isinstance(r, HostRegion) and not r.closed]
    for r in regions:
        base = int(r.array.ctypes.data)
        if base <= lo and hi <= base + r.size:
            return r
    raise _invalid(
        f"b2b.kv: tensor {b.view.label!r} (bytes {lo:#x}..{hi:#x}) is not in a region this client registered: "
        "host tensors must live in daemon memory (b2b.as_array / b2b.as_tensor of client.register_host(...))"
    )


@dataclass(frozen=True)
class Segment:
    """One segment of a layout: block ``b`` is the ``block_len`` bytes at
    ``offset + b*stride`` in ``region``."""

    tensor: str  # the tensor's key (or index), "[0]"/"[1]" appended for K/V of a stacked one
    region: Any  # HostRegion or CudaRegion
    offset: int
    block_len: int
    stride: int
    num_blocks: int


class Layout:
    """A registered layout over a KV cache's tensors (:func:`register`)."""

    def __init__(self, client: Client, name: str, blocks: List[_Blocks], bases: List[Tuple[Any, int]],
                 owned: List[CudaRegion], heads: Optional[Tuple[int, int]], export_name: str,
                 export_to: Sequence[str]) -> None:
        self.client = client
        self.name = name
        self.export_name = export_name
        self.export_to = tuple(export_to)
        self.heads = heads
        self._blocks = blocks
        self._bases = bases  # per block entry: (region, region's device/host base address)
        self._owned = owned  # regions this layout registered (and releases)
        self._children: List["Layout"] = []
        self._closed = False
        self.persist = False  # set by register(); views follow their parent
        segs = []
        for b, (region, base) in zip(blocks, bases):
            off, blen = _slice(b, heads)
            segs.append(Segment(b.view.label, region, b.addr - base + off, blen, b.stride, b.num_blocks))
        self.segments: Tuple[Segment, ...] = tuple(segs)

    @property
    def regions(self) -> Tuple[Any, ...]:
        """The distinct regions under the layout, in first-use order."""
        seen: Dict[int, Any] = {}
        for s in self.segments:
            seen.setdefault(id(s.region), s.region)
        return tuple(seen.values())

    @property
    def num_blocks(self) -> int:
        return self.segments[0].num_blocks

    @property
    def closed(self) -> bool:
        return self._closed

    def _register(self) -> None:
        self.client.register_layout(
            self.name,
            [(s.region, s.offset, s.block_len, s.stride) for s in self.segments],
            self.num_blocks,
            export_name=self.export_name,
            export_to=self.export_to,
            persist=self.persist,
        )

    def view(self, name: str, heads: Tuple[int, int], export_name: Optional[str] = None,
             export_to: Sequence[str] = ()) -> "Layout":
        """Register another layout over the same regions, exporting only
        ``heads=(start, count)`` of dim 1 of every block: for a peer with
        more tensor parallelism (docs/kv.md, "Several layouts may view the
        same regions"). Closed with this layout."""
        child = Layout(self.client, name, self._blocks, self._bases, [], heads, export_name or "", export_to)
        child.persist = self.persist
        _export_regions(self.client, child.regions, export_name or "", export_to)
        child._register()
        self._children.append(child)
        return child

    def transfer_blocks(
        self,
        peer: str,
        remote_layout: Union[str, "Layout"],
        local_ids: Any,
        remote_ids: Any,
        *,
        timeout: Optional[float] = None,
        transport: Union[None, str, int] = None,
        notification: Optional[bytes] = None,
        wait: bool = True,
        after: Optional[Tuple[Counter, int]] = None,
    ) -> Union[TransferResult, "BlocksTransfer"]:
        """Move block ``local_ids[i]`` of every segment to block
        ``remote_ids[i]`` of the peer's layout exported as ``remote_layout``.

        Ids are lists, numpy arrays or torch integer tensors (packed as
        little-endian uint32 by numpy). ``wait=True`` returns the
        :class:`~b2b.TransferResult` once every byte landed; ``wait=False``
        starts the transfer and returns a handle with ``wait()``, ``done()``
        and ``cancel()`` (StartTransfer). Ids at or above ``num_blocks`` and
        repeated remote ids are refused by the daemon (InvalidArgument naming
        the index); nothing moves then.

        ``after=(counter, L)`` (layer streaming) starts the transfer at once
        but has the daemon post it only when the :class:`Counter` reaches
        ``L`` (:func:`mark_layer_done`); it always returns the handle. The
        timeout runs while it waits (DeadlineExceeded, nothing posted), and
        ``cancel()`` withdraws it.
        """
        if self._closed:
            raise _invalid(f"b2b.kv: layout {self.name!r} is closed")
        remote = remote_layout.export_name if isinstance(remote_layout, Layout) else remote_layout
        if not isinstance(remote, str) or not remote:
            raise _invalid(f"b2b.kv: remote_layout {remote_layout!r}: want the peer layout's export name")
        if wait and after is None:
            return self.client.transfer_blocks(self.name, peer, remote, local_ids, remote_ids, timeout=timeout,
                                               transport=transport, notification=notification)
        req = pb.TransferBlocksRequest(
            local_layout=self.name,
            peer=peer,
            remote_layout=remote,
            local_ids=pack_ids(local_ids, "local_ids"),
            remote_ids=pack_ids(remote_ids, "remote_ids"),
            transport=_transport(transport),
        )
        if notification is not None:
            req.notification = bytes(notification)
        return start_blocks(self.client, req, timeout, remote_ids, after)

    def close(self) -> None:
        """Deregister the layout (and its views), then the CUDA regions it
        registered. Host regions stay the caller's. Safe twice."""
        if self._closed:
            return
        self._closed = True
        errors: List[BaseException] = []
        for c in self._children:
            try:
                c.close()
            except B2BError as e:
                errors.append(e)
        try:
            self.client.deregister_layout(self.name)
        except B2BError as e:
            if e.code != grpc.StatusCode.NOT_FOUND:
                errors.append(e)
        for r in self._owned:
            try:
                r.close(deregister=True)
            except B2BError as e:
                errors.append(e)
        if errors:
            raise errors[0]

    def __enter__(self) -> "Layout":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Layout({self.name!r}, {len(self.segments)} segments x {self.num_blocks} blocks, "
                f"{len(self.regions)} regions{', exported as ' + repr(self.export_name) if self.export_name else ''})")


def _export_regions(client: Client, regions: Iterable[Any], export_name: str, export_to: Sequence[str]) -> None:
    """Peers write only exported regions: export each region of an exported
    layout that is not exported yet, as ``<export_name>.<region id>``."""
    if not export_name:
        return
    for r in regions:
        if not r.export_name:
            client.export(r, f"{export_name}.{r.id}", export_to)


def register(
    client: Client,
    tensors: Union[Sequence[Any], Dict[str, Any]],
    name: str,
    export_name: Optional[str] = None,
    export_to: Sequence[str] = (),
    *,
    heads: Optional[Tuple[int, int]] = None,
    stacked: Optional[bool] = None,
    persist: bool = False,
) -> Layout:
    """Register a KV cache's tensors as one layout named ``name``.

    Args:
        tensors: a list, or a dict (vLLM's ``kv_caches``: layer name to
            tensor), of PyTorch CUDA tensors or of host arrays in daemon
            memory. One segment per tensor, in order.
        export_name: export the layout (and its regions) under this name, for
            peers to write into (the receiving side). ``export_to``: the peer
            identities allowed (empty: every peer).
        heads: ``(start, count)``: export only that slice of dim 1 of every
            block (the heads of a heads-first pool), for a peer with more
            tensor parallelism; see also :meth:`Layout.view`.
        stacked: split ``[2, num_blocks, ...]`` tensors into K and V segments.
            ``None``: split 5-D tensors whose dim 0 is 2 (vLLM's layout).
        persist: CUDA regions outlive this client's connection.

    Raises ``ValueError`` (:class:`~b2b.InvalidArgumentError`) naming the
    tensor when a block is not contiguous, blocks overlap, tensors disagree on
    num_blocks, or a host tensor is not in daemon memory.
    """
    if not isinstance(name, str) or not name:
        raise _invalid("b2b.kv: name is empty: a layout needs a name")
    blocks = _flatten(tensors, stacked)
    if heads is not None:
        for b in blocks:
            _slice(b, heads)  # refuse a bad slice before registering anything
    owned: List[CudaRegion] = []
    bases: List[Tuple[Any, int]] = []
    try:
        if blocks[0].view.cuda:
            bases = _register_cuda(client, blocks, export_name or "", export_to, persist, owned)
        else:
            for b in blocks:
                r = _host_region(client, b)
                bases.append((r, int(r.array.ctypes.data)))
        layout = Layout(client, name, blocks, bases, owned, heads, export_name or "", export_to)
        layout.persist = persist
        _export_regions(client, layout.regions, export_name or "", export_to)
        layout._register()
    except BaseException:
        for r in owned:
            try:
                r.close(deregister=True)
            except B2BError:
                pass
        raise
    return layout


def _register_cuda(client: Client, blocks: List[_Blocks], export_name: str, export_to: Sequence[str],
                   persist: bool, owned: List[CudaRegion]) -> List[Tuple[Any, int]]:
    """One cuda_ipc region per distinct allocation, spanning its tensors."""
    groups: Dict[Tuple[int, int], List[int]] = {}
    ranges: Dict[Tuple[int, int], int] = {}
    for i, b in enumerate(blocks):
        lo, hi = b.view.extent
        base, size = _cuda.address_range(b.view.device, lo)
        if hi > base + size:
            raise _invalid(
                f"b2b.kv: tensor {b.view.label!r} (bytes {lo:#x}..{hi:#x}) runs past its allocation "
                f"({base:#x}, {size} bytes)"
            )
        key = (b.view.device, base)
        groups.setdefault(key, []).append(i)
        ranges[key] = size
    bases: List[Tuple[Any, int]] = [(None, 0)] * len(blocks)
    dereg = _dereg_default(None, persist)
    for n, (key, idx) in enumerate(groups.items()):
        device, base = key
        lo = min(blocks[i].view.extent[0] for i in idx)
        hi = max(blocks[i].view.extent[1] for i in idx)
        first = blocks[idx[0]].view.obj
        share = _cuda.share_range(first, base, lo, hi - lo)
        keep = tuple({id(blocks[i].view.obj): blocks[i].view.obj for i in idx}.values())
        rname = f"{export_name}.r{n}" if export_name else None
        region = client._register_cuda_share(keep, share, rname, export_to, persist, dereg)
        owned.append(region)
        for i in idx:
            bases[i] = (region, lo)
    return bases


# ---------------------------------------------------------------------------
# Async handles.


#: A started block-id transfer: the one handle of every transfer kind
#: (:class:`b2b.Transfer`), with ``remote_ids`` set.
BlocksTransfer = Transfer


def start_blocks(client: Client, req: Any, timeout: Optional[float], remote_ids: Any, after: Any = None) -> Any:
    """StartTransfer for a TransferBlocksRequest, run once ``after``'s
    counter reaches its value (None: at once); returns a :class:`BlocksTransfer`."""
    ms = 0 if timeout is None else max(1, int(math.ceil(timeout * 1000)))
    start = pb.StartTransferRequest(blocks=req, timeout_ms=ms)
    if after is not None:
        start.after.CopyFrom(trigger_proto(after))
    r = client._call(client.stub.StartTransfer, start, client.timeout)
    return Transfer(client, r.transfer_id, remote_ids)
