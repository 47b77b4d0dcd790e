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

import itertools
import numbers
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import grpc
import numpy as np

from . import _cuda
from ._pack import pack_u32
from .client import (
    Blocks,
    Client,
    CudaRegion,
    HostRegion,
    Transfer,
    TransferResult,
    _dereg_default,
    _op,
    _transport,
)
from ._transfers import started
from .errors import B2BError, InvalidArgumentError, check_timeout, timeout_ms
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
    ``block_len`` bytes at ``addr + b*stride``. ``heads_dim`` is the dim
    holding the heads (``None``: not told, see ``kv_layout``), ``rows`` its
    size, and ``head_bytes`` one head's bytes when the heads are the block's
    outermost dim in memory (a head slice is then one range), else ``None``."""

    view: _View
    addr: int
    block_len: int
    stride: int
    num_blocks: int
    rows: int
    heads_dim: Optional[int] = None
    head_bytes: Optional[int] = None


#: kv_layout names: the dim of one K or V tensor ``[num_blocks, ...]`` that
#: holds the heads (vLLM's names for its cache layouts).
KV_LAYOUTS = {"HND": 1, "NHD": 2}


def _heads_dim(v: _View, kv_layout: Union[None, str, int]) -> Optional[int]:
    if kv_layout is None:
        return None
    if isinstance(kv_layout, str):
        if kv_layout.upper() not in KV_LAYOUTS:
            raise _invalid(f"b2b.kv: kv_layout={kv_layout!r}: want 'HND' ([num_blocks, heads, block_size, head_dim]), "
                           "'NHD' ([num_blocks, block_size, heads, head_dim]) or the dim that holds the heads")
        d = KV_LAYOUTS[kv_layout.upper()]
    elif isinstance(kv_layout, int) and not isinstance(kv_layout, bool):
        d = kv_layout
    else:
        raise TypeError(f"b2b.kv: kv_layout is {type(kv_layout).__name__}: want 'HND', 'NHD' or a dim")
    if not 1 <= d < len(v.shape):
        raise _invalid(f"b2b.kv: kv_layout={kv_layout!r}: tensor {v.label!r} has shape {v.shape}, "
                       f"no dim {d} after the block id (dim 0) to hold the heads")
    return d


def _blocks(v: _View, kv_layout: Union[None, str, int] = None) -> _Blocks:
    """Dim 0 is the block id; the rest of a block must be contiguous: in
    order, or, with ``kv_layout`` told, in any order of its dims (vLLM's
    HND cache viewed as NHD is a permutation of dense storage: the
    block's bytes, the underlying storage's, are registered)."""
    if not v.shape:
        raise _invalid(f"b2b.kv: tensor {v.label!r} is a scalar: dim 0 must be the block id")
    if any(n == 0 for n in v.shape):
        raise _invalid(f"b2b.kv: tensor {v.label!r} has shape {v.shape}: it has no elements")
    hd = _heads_dim(v, kv_layout)
    dims = range(len(v.shape) - 1, 0, -1)
    if hd is not None:  # any order: innermost (smallest stride) first
        dims = sorted((d for d in range(1, len(v.shape)) if v.shape[d] != 1), key=lambda d: (v.strides[d], -d))
    expected = v.itemsize
    for d in dims:
        if v.shape[d] != 1 and v.strides[d] != expected:
            raise _invalid(
                f"b2b.kv: tensor {v.label!r}: dim {d} has stride {v.strides[d]} bytes, want {expected} "
                f"(shape {v.shape}, strides {v.strides} bytes): the rest of a block must be contiguous"
                + ("" if hd is not None else " (a permuted view of dense blocks, such as vLLM's HND cache seen as NHD, "
                   "is accepted with kv_layout='HND' or 'NHD')")
            )
        expected *= v.shape[d]
    block_len, n = expected, v.shape[0]
    stride = v.strides[0] if n > 1 else block_len
    if stride < block_len:
        raise _invalid(
            f"b2b.kv: tensor {v.label!r}: dim 0 (the block id) has stride {stride} bytes, "
            f"below the block's {block_len} bytes: blocks would overlap"
        )
    if hd is None:
        return _Blocks(v, v.addr, block_len, stride, n, v.shape[1] if len(v.shape) > 1 else 1)
    rows = v.shape[hd]
    outer = rows == 1 or v.strides[hd] * rows == block_len
    return _Blocks(v, v.addr, block_len, stride, n, rows, hd, v.strides[hd] if outer and rows > 1 else (block_len if outer else None))


def _flatten(tensors: Union[Sequence[Any], Dict[str, Any]], stacked: Optional[bool],
             kv_layout: Union[None, str, int] = None) -> List[_Blocks]:
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
            out.extend(_blocks(_sub(v, k), kv_layout) for k in (0, 1))
        else:
            out.append(_blocks(v, kv_layout))
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
    """``(offset into the block, block_len)`` of a head slice."""
    if heads is None:
        return 0, b.block_len
    start, count = (int(x) for x in heads)
    if b.heads_dim is None:
        raise _invalid(
            f"b2b.kv: heads=({start}, {count}) needs to be told where tensor {b.view.label!r}'s heads are "
            f"(shape {b.view.shape}): give kv_layout='HND' ([num_blocks, heads, block_size, head_dim]), "
            "'NHD' ([num_blocks, block_size, heads, head_dim], vLLM's default) or the dim that holds the heads"
        )
    if start < 0 or count <= 0 or start + count > b.rows:
        raise _invalid(
            f"b2b.kv: heads=({start}, {count}) is outside tensor {b.view.label!r}'s {b.rows} heads "
            f"(dim {b.heads_dim} of shape {b.view.shape})"
        )
    if count == b.rows:
        return 0, b.block_len
    if b.head_bytes is None:
        raise _invalid(
            f"b2b.kv: heads=({start}, {count}) of tensor {b.view.label!r} (shape {b.view.shape}, strides "
            f"{b.view.strides} bytes): its heads (dim {b.heads_dim}) are not the block's outermost dim in memory, "
            "so a head slice is one piece per token, not one range. Allocate the cache heads-first: vLLM's HND "
            "layout (VLLM_KV_CACHE_LAYOUT=HND, or the connector's get_required_kvcache_layout() returning 'HND'; "
            "its NHD-shaped views of that storage are accepted), or move whole blocks"
        )
    return start * b.head_bytes, count * b.head_bytes


def _heads_arg(blocks: List[_Blocks], heads: Optional[Tuple[int, int]], kv_layout: Union[None, str, int]) -> Optional[Tuple[int, int]]:
    """Check ``heads`` against every tensor before anything is registered."""
    if heads is None:
        return None
    try:
        start, count = heads
    except (TypeError, ValueError):
        raise _invalid(f"b2b.kv: heads={heads!r}: want (start, count)") from None
    for what, x in (("start", start), ("count", count)):
        # int() would truncate 0.5 to 0 and read True as 1 or "2" as 2: a slice other than the one asked.
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
            raise _invalid(f"b2b.kv: heads={heads!r}: {what} {x!r} is {type(x).__name__}: want (start, count) as ints")
    start, count = int(start), int(count)
    for b in blocks:
        _slice(b, (start, count))
    return start, count


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
                 export_to: Sequence[str], readers: Sequence[str] = (), read_only: bool = False) -> None:
        self.client = client
        self.name = name
        self.export_name = export_name
        self.export_to = tuple(export_to)
        self.readers = tuple(_readers(readers))
        self.read_only = bool(read_only)
        self.heads = heads
        self._seq = next(_layout_seq)  # registration order: the oldest covering layout names a region's export
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
            readers=self.readers,
            read_only=self.read_only,
        )
        _open_layouts.add(self)

    def view(self, name: str, heads: Tuple[int, int], export_name: Optional[str] = None,
             export_to: Sequence[str] = (), *, kv_layout: Union[None, str, int] = None, readers: Sequence[str] = (),
             read_only: bool = False) -> "Layout":
        """Register another layout over the same regions, exporting only
        ``heads=(start, count)`` of every block: for a peer with more tensor
        parallelism (docs/kv.md, "Several layouts may view the same
        regions"). ``kv_layout`` says where the heads are, as for
        :func:`register` (needed unless the layout was registered with it). ``readers`` (peer identities, ``"*"``: any) may
        pull from it, ``read_only``: no peer may write it; the regions'
        exports are widened to grant that too (docs/kv.md, Exports). Closed
        with this layout; refused on a closed one."""
        if self._closed:  # its regions may be gone; nothing would close the view
            raise _invalid(f"b2b.kv: layout {self.name!r} is closed: view {name!r} was not registered")
        blocks = self._blocks if kv_layout is None else [_blocks(b.view, kv_layout) for b in self._blocks]
        heads = _heads_arg(blocks, heads, kv_layout)
        child = Layout(self.client, name, blocks, self._bases, [], heads, export_name or "", export_to,
                       readers, read_only)
        child.persist = self.persist
        try:
            _sync_exports(self.client, child.regions, join=child)
            child._register()
        except BaseException:
            _sync_exports(self.client, child.regions, leave=child, errors=[])  # back to the open layouts' grants
            raise
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
        op: Union[None, str, int] = None,
    ) -> Union[TransferResult, "BlocksTransfer"]:
        """Move block ``local_ids[i]`` of every segment to block
        ``remote_ids[i]`` of the peer's layout exported as ``remote_layout``;
        ``op="read"`` pulls instead: block ``remote_ids[i]`` of the peer's
        layout (exported with ``readers`` naming this daemon, or ``"*"``)
        into block ``local_ids[i]`` here (``local_ids`` unique).

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
                                               transport=transport, notification=notification, op=op)
        req = pb.TransferBlocksRequest(
            local_layout=self.name,
            peer=peer,
            remote_layout=remote,
            local_ids=pack_ids(local_ids, "local_ids"),
            remote_ids=pack_ids(remote_ids, "remote_ids"),
            transport=_transport(transport),
            op=_op(op),
        )
        if notification is not None:
            req.notification = bytes(notification)
        return start_blocks(self.client, req, timeout, remote_ids, after)

    def transfer_blocks_many(
        self,
        moves: Sequence[Tuple[Any, ...]],
        *,
        timeout: Optional[float] = None,
        transport: Union[None, str, int] = None,
        op: Union[None, str, int] = None,
    ) -> List["BlocksTransfer"]:
        """Start many block transfers from this layout in one call
        (``StartTransfers``): each move is ``(peer, remote_layout, local_ids,
        remote_ids)`` or that and a ``notification``. Returns a handle per
        move, in order (wait for them with :meth:`b2b.Client.wait_all`, poll
        them with :meth:`b2b.Client.poll`: one call each). A move the daemon
        refused (an id out of range, a layout gone) comes back as a handle
        that has already failed, its error naming ``requests[i]``; the
        others run."""
        if self._closed:
            raise _invalid(f"b2b.kv: layout {self.name!r} is closed")
        items = []
        for i, m in enumerate(moves):
            if len(m) not in (4, 5):
                raise _invalid(f"b2b.kv: moves[{i}] has {len(m)} items: want (peer, remote_layout, local_ids, "
                               f"remote_ids[, notification])")
            remote = m[1].export_name if isinstance(m[1], Layout) else m[1]
            if not isinstance(remote, str) or not remote:
                raise _invalid(f"b2b.kv: moves[{i}] remote_layout {m[1]!r}: want the peer layout's export name")
            items.append(Blocks(self.name, m[0], remote, m[2], m[3], op=op, transport=transport,
                                notification=m[4] if len(m) == 5 else None))
        return self.client.start_many(items, timeout)

    def close(self) -> None:
        """Deregister the layout (and its views), withdraw the region exports
        it made (a peer can no longer write into the pool by name) or hand
        them, narrowed to its grants, to another open exported layout over
        the region, then deregister the CUDA regions it registered. Host
        regions stay the caller's, unexported again. Safe twice."""
        if self._closed:
            return
        self._closed = True
        _open_layouts.discard(self)
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
        _sync_exports(self.client, self.regions, leave=self, errors=errors)
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


#: Open layouts: a region's export serves every open exported layout over
#: it (_sync_exports).
_open_layouts: "weakref.WeakSet[Layout]" = weakref.WeakSet()


def _readers(readers: Sequence[str]) -> List[str]:
    if isinstance(readers, str):
        raise TypeError("readers: expected a sequence of peer identities (or ['*']), got a str")
    return list(readers)


#: The most peers one export may name in export_to or readers (the daemon's limit).
_MAX_GRANTS = 1024

_layout_seq = itertools.count()


@dataclass(frozen=True)
class _Grants:
    """What a region export lets peers do: write it (``to``: those peers,
    empty: any) unless ``read_only``, and read it (``readers``, ``"*"``: any)."""

    to: Tuple[str, ...] = ()
    readers: Tuple[str, ...] = ()
    read_only: bool = False


@dataclass(frozen=True)
class _Export:
    """A region export b2b.kv made, kept on the region (``_kv_export``): its
    name and grants, and the layout it is named after."""

    name: str
    grants: _Grants
    owner: "weakref.ReferenceType[Layout]"


def _union(r: Any, cover: List["Layout"]) -> _Grants:
    """The one export region ``r`` needs for every layout in ``cover``: all
    their readers, writable unless every one is read-only, by the writable
    ones' peers (any peer when one of them names none). A union over the
    daemon's limit is refused, naming the region, two layouts and the grant."""
    writers = [o for o in cover if not o.read_only]
    to: Tuple[str, ...] = ()
    if writers and all(o.export_to for o in writers):
        to = tuple(dict.fromkeys(p for o in writers for p in o.export_to))
    readers = tuple(dict.fromkeys(p for o in cover for p in o.readers))
    if "*" in readers:
        readers = ("*",)
    for field, peers in (("export_to", to), ("readers", readers)):
        if len(peers) > _MAX_GRANTS and len(cover) > 1:
            raise _invalid(
                f"b2b.kv: region {r.id} is under layouts {cover[0].name!r} and {cover[-1].name!r}"
                + (f" (and {len(cover) - 2} more)" if len(cover) > 2 else "")
                + f": its one export would need the union of their {field}, {len(peers)} peers, over the "
                f"daemon's limit of {_MAX_GRANTS} per export; give the layouts separate regions or fewer peers")
    return _Grants(to, readers, not writers)


def _covering(client: Any, r: Any, join: Optional["Layout"], leave: Optional["Layout"]) -> List["Layout"]:
    """The open exported layouts of ``client`` over region ``r``, oldest
    first, with ``join`` (being registered) last and ``leave`` left out."""
    cover = sorted((o for o in list(_open_layouts) if o.client is client and o.export_name and not o._closed
                    and o is not leave and any(x is r for x in o.regions)), key=lambda o: o._seq)
    if join is not None and join.export_name and any(x is r for x in join.regions):
        cover.append(join)
    return cover


def _callers_grants(client: Any) -> Dict[str, _Grants]:
    """Every region's export grants as the daemon holds them, by region id."""
    resp = client._call(client.stub.ListRegions, pb.ListRegionsRequest(), client.timeout)
    return {x.id: _Grants(tuple(x.export_to), tuple(x.readers), bool(x.read_only)) for x in resp.regions}


def _check_callers(r: Any, have: Optional[_Grants], lay: "Layout") -> None:
    """A region the caller exported itself keeps its export (b2b.kv changes
    only the exports it made): refuse a layout that export does not serve,
    now rather than at the first transfer."""
    if have is None:
        return
    need = []
    if lay.readers and not ("*" in have.readers or set(lay.readers) <= set(have.readers)):
        need.append(f"readers {list(lay.readers)} (the export grants readers {list(have.readers)})")
    if not lay.read_only and have.read_only:
        need.append("writers (the export is read-only)")
    elif not lay.read_only and have.to and not (lay.export_to and set(lay.export_to) <= set(have.to)):
        need.append(f"export_to {list(lay.export_to) or 'every peer'} (the export grants export_to {list(have.to)})")
    if need:
        raise _invalid(
            f"b2b.kv: layout {lay.name!r} needs {' and '.join(need)} on region {r.id}, which this client exported "
            f"itself as {r.export_name!r}: b2b.kv changes only the region exports its layouts made. Export the "
            "region with those grants (Client.export), or leave it unexported for the layout to export")


def _sync_exports(client: Any, regions: Iterable[Any], join: Optional["Layout"] = None,
                  leave: Optional["Layout"] = None, errors: Optional[List[BaseException]] = None) -> None:
    """Peers write (and, granted, read) only exported regions, and a region
    has one export: give each region the export its open exported layouts
    need, ``join`` (being registered) counted and ``leave`` (closing, or a
    failed registration) not (docs/kv.md, Exports). The export is named
    after the oldest such layout (``<export_name>.<region id>``, kept while
    that layout is open) and grants their union (:func:`_union`); a region no
    layout covers any more is un-exported. Everything is checked before any
    export changes. ``errors``: collect failures (close) instead of raising."""
    if any(lay is not None and not lay.export_name for lay in (join, leave)):
        return  # a layout not exported grants nothing and names no export
    plan: List[Tuple[Any, Optional["Layout"], str, _Grants]] = []
    callers: Optional[Dict[str, _Grants]] = None
    seen = set()
    for r in regions:
        if id(r) in seen:
            continue
        seen.add(id(r))
        cur: Optional[_Export] = getattr(r, "_kv_export", None)
        if cur is not None and cur.name != r.export_name:
            cur = None  # re-exported since, not by b2b.kv: the caller's
        cover = _covering(client, r, join, leave)
        if cur is None:
            if r.export_name:  # the caller's own export: left as it is
                if join is not None and join in cover:
                    callers = _callers_grants(client) if callers is None else callers
                    _check_callers(r, callers.get(r.id), join)
                continue
            if not cover:
                continue
        if not cover:
            plan.append((r, None, "", _Grants()))
            continue
        held = cur.owner() if cur is not None else None
        owner = held if any(o is held for o in cover) else cover[0]
        name = cur.name if cur is not None and owner is held else f"{owner.export_name}.{r.id}"
        grants = _union(r, cover)
        if cur is None or (cur.name, cur.grants, held) != (name, grants, owner):
            plan.append((r, owner, name, grants))
    for r, owner, name, grants in plan:
        try:
            if owner is None:
                gone = getattr(r, "closed", False) or (leave is not None and any(r is o for o in leave._owned))
                r._kv_export = None
                if not gone:  # else deregistered by the closing layout
                    client.export(r, None)
            else:
                was: Optional[_Export] = getattr(r, "_kv_export", None)
                if was is None or (was.name, was.grants) != (name, grants):  # else only the layout it is named after changed
                    client.export(r, name, grants.to, readers=grants.readers, read_only=grants.read_only)
                r._kv_export = _Export(name, grants, weakref.ref(owner))
        except B2BError as e:
            if errors is None:
                raise
            if owner is not None or e.code != grpc.StatusCode.NOT_FOUND:
                errors.append(e)


def register(
    client: Client,
    tensors: Union[Sequence[Any], Dict[str, Any]],
    name: str,
    export_name: Optional[str] = None,
    export_to: Sequence[str] = (),
    *,
    heads: Optional[Tuple[int, int]] = None,
    kv_layout: Union[None, str, int] = None,
    stacked: Optional[bool] = None,
    persist: bool = False,
    readers: Sequence[str] = (),
    read_only: bool = False,
) -> Layout:
    """Register a KV cache's tensors as one layout named ``name``.

    Args:
        tensors: a list, or a dict (vLLM's ``kv_caches``: layer name to
            tensor), of PyTorch CUDA tensors or of host arrays in daemon
            memory. One segment per tensor, in order.
        export_name: export the layout (and its regions) under this name, for
            peers to write into (the receiving side). ``export_to``: the peer
            identities allowed (empty: every peer).
        heads: ``(start, count)``: export only those heads of every block,
            for a peer with more tensor parallelism; see also
            :meth:`Layout.view`. Needs ``kv_layout``.
        kv_layout: where the heads are in one K or V tensor: ``"HND"``
            (``[num_blocks, heads, block_size, head_dim]``), ``"NHD"``
            (``[num_blocks, block_size, heads, head_dim]``, vLLM's default)
            or the dim's index. A head slice must be one range of each
            block: the heads must be the block's outermost dim in memory
            (HND storage, also when viewed as NHD: vLLM's permuted view of
            an HND cache is registered by its storage); otherwise
            ``ValueError`` says how to allocate the cache. With it, a block
            may be any permutation of dense storage.
        stacked: split ``[2, num_blocks, ...]`` tensors into K and V segments.
            ``None``: split 5-D tensors whose dim 0 is 2 (vLLM's layout).
        persist: CUDA regions outlive this client's connection.
        readers: peer identities (``"*"``: any peer) that may pull from the
            exported layout (``transfer_blocks(..., op="read")`` on their
            side); ``read_only``: no peer may write it. A region shared with
            another exported layout of the client gets one export granting
            what both need (docs/kv.md, Exports).

    Raises ``ValueError`` (:class:`~b2b.InvalidArgumentError`) naming the
    tensor when a block is not contiguous, blocks overlap, tensors disagree on
    num_blocks, or a host tensor is not in daemon memory.
    """
    if not isinstance(name, str) or not name:
        raise _invalid("b2b.kv: name is empty: a layout needs a name")
    blocks = _flatten(tensors, stacked, kv_layout)
    heads = _heads_arg(blocks, heads, kv_layout)  # refuse a bad slice before registering anything
    grants = _readers(readers)
    owned: List[CudaRegion] = []
    bases: List[Tuple[Any, int]] = []
    lay: Optional[Layout] = None
    try:
        if blocks[0].view.cuda:
            bases = _register_cuda(client, blocks, export_name or "", export_to, persist, owned, grants, read_only)
        else:
            for b in blocks:
                r = _host_region(client, b)
                bases.append((r, int(r.array.ctypes.data)))
        lay = Layout(client, name, blocks, bases, owned, heads, export_name or "", export_to, grants, read_only)
        lay.persist = persist
        for r in owned:  # exported as they were registered, with this layout's grants
            if r.export_name:
                r._kv_export = _Export(r.export_name, _union(r, [lay]), weakref.ref(lay))
        _sync_exports(client, lay.regions, join=lay)
        lay._register()
    except BaseException:
        if lay is not None:
            _sync_exports(client, lay.regions, leave=lay, errors=[])
        for r in owned:
            try:
                r.close(deregister=True)
            except B2BError:
                pass
        raise
    return lay


def _register_cuda(client: Client, blocks: List[_Blocks], export_name: str, export_to: Sequence[str],
                   persist: bool, owned: List[CudaRegion], readers: Sequence[str] = (),
                   read_only: bool = False) -> List[Tuple[Any, int]]:
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
        region = client._register_cuda_share(keep, share, rname, export_to, persist, dereg,
                                             readers=readers if export_name else (), read_only=read_only)
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
    ms = timeout_ms(check_timeout(timeout))  # over the daemon's limit (1 h): sent as it
    start = pb.StartTransferRequest(blocks=req, timeout_ms=ms)
    if after is not None:
        start.after.CopyFrom(trigger_proto(after))
    r = client._call(client.stub.StartTransfer, start, client.timeout)
    return started(client, r.transfer_id, remote_ids)
