"""Stand-ins for the vLLM objects the connector reads, and a KV pool in
daemon memory whose every byte is a function of (request, layer, K/V,
token, head, element): for the tests and the disaggregated-serving harness."""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

import b2b

_M = np.uint64(0xFFFFFFFFFFFFFFFF)


def config(engine_id: str, *, socket: str, mode: str = "pull", block_size: int = 16, tp_size: int = 1,
           tp_rank: int = 0, **extra: Any) -> Any:
    """A vllm_config with the fields the connector reads."""
    e = {"socket": socket, "mode": mode, "tp_size": tp_size, "tp_rank": tp_rank}
    e.update(extra)
    return SimpleNamespace(
        kv_transfer_config=SimpleNamespace(engine_id=engine_id, kv_connector_extra_config=e,
                                           kv_connector="B2BConnector", kv_connector_module_path="b2b.connector"),
        cache_config=SimpleNamespace(block_size=block_size),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp_size),
    )


@dataclass
class Request:
    request_id: str
    prompt_token_ids: List[int]
    kv_transfer_params: Optional[Dict[str, Any]] = None
    status: str = "FINISHED_LENGTH_CAPPED"
    seed: int = 0


def _mix(tokens: np.ndarray, heads: np.ndarray, dim: int, base: int) -> np.ndarray:
    """uint16 values, shape (tokens, heads, dim): a hash of (token, head, element, base)."""
    with np.errstate(over="ignore"):
        t = tokens.astype(np.uint64)[:, None, None] * np.uint64(0x27D4EB2F165667B1)
        h = heads.astype(np.uint64)[None, :, None] * np.uint64(0x165667B19E3779F9)
        d = np.arange(dim, dtype=np.uint64)[None, None, :] * np.uint64(0x61C8864680B583EB)
        v = (t + h + d + np.uint64(base & 0xFFFFFFFFFFFFFFFF)) & _M
        v ^= v >> np.uint64(29)
        v = (v * np.uint64(0xBF58476D1CE4E5B9)) & _M
        v ^= v >> np.uint64(32)
    return (v & np.uint64(0xFFFF)).astype(np.uint16)


_TABLES: Dict[Any, np.ndarray] = {}


def _table(layer: int, kv: int, ntok: int, nheads: int, dim: int) -> np.ndarray:
    """The (layer, K/V, token, head, element) hash for tokens < ntok and
    heads < nheads, computed once and grown on demand."""
    key = (layer, kv, dim)
    t = _TABLES.get(key)
    if t is None or t.shape[0] < ntok or t.shape[1] < nheads:
        n = max(ntok, 1024, 0 if t is None else t.shape[0])
        h = max(nheads, 8, 0 if t is None else t.shape[1])
        t = _TABLES[key] = _mix(np.arange(n), np.arange(h), dim, layer * 0x85EBCA77C2B2AE3D + kv * 0xC2B2AE3D27D4EB2F)
    return t


def _key(seed: int, layer: int, kv: int) -> int:
    """The 16-bit key of (request, layer, K/V): _mix's hash in Python ints."""
    m = 0xFFFFFFFFFFFFFFFF
    v = (seed * 0x9E3779B97F4A7C15 + layer * 0x94D049BB133111EB + kv * 0xBF58476D1CE4E5B9) & m
    v ^= v >> 29
    v = (v * 0xBF58476D1CE4E5B9) & m
    v ^= v >> 32
    return v & 0xFFFF


def pattern(seed: int, layer: int, kv: int, tokens: np.ndarray, heads: np.ndarray, dim: int) -> np.ndarray:
    """uint16 values, shape (tokens, heads, dim): a (layer, K/V, token,
    head, element) hash XOR a 16-bit key of (request, layer, K/V). A block
    of another token, head, layer or K/V differs in nearly every element;
    one of another request unless its 8 keys of a 4-layer model all
    collide. The tables make checking every byte of a request cheap next
    to the engine work it stands in for."""
    k = _key(seed, layer, kv)
    tab = _table(layer, kv, int(tokens.max()) + 1 if len(tokens) else 0, int(heads.max()) + 1 if len(heads) else 0, dim)
    return tab[tokens][:, heads] ^ np.uint16(k)


class Pool:
    """``layers`` stacked K/V tensors ``[2, num_blocks, ...]`` (NHD:
    ``[bs, heads, dim]`` per block; HND: ``[heads, bs, dim]``) in one host
    region of the daemon. ``head0`` is this rank's first global head."""

    def __init__(self, client: Any, *, layers: int, num_blocks: int, block_size: int, heads: int, dim: int,
                 kv_layout: str = "NHD", head0: int = 0) -> None:
        self.layers, self.num_blocks, self.block_size = layers, num_blocks, block_size
        self.heads, self.dim, self.kv_layout, self.head0 = heads, dim, kv_layout, head0
        blk = (block_size, heads, dim) if kv_layout == "NHD" else (heads, block_size, dim)
        shape = (layers, 2, num_blocks) + blk
        self.region = client.register_host(int(np.prod(shape)) * 2)
        self.array = b2b.as_array(self.region, np.uint16, shape=shape)
        self.caches = {f"model.layers.{i}.self_attn": self.array[i] for i in range(layers)}
        self.names = list(self.caches)

    def spec(self) -> dict:
        """What :meth:`mapped` needs to open this pool's memory in another
        process (the disaggregated harness's stand-in for a GPU)."""
        info = self.region.info
        return dict(path=info.shm_path, offset=info.shm_offset, size=info.size, layers=self.layers,
                    num_blocks=self.num_blocks, block_size=self.block_size, heads=self.heads, dim=self.dim,
                    kv_layout=self.kv_layout, head0=self.head0)

    @classmethod
    def mapped(cls, path: str, offset: int, size: int, **geometry: Any) -> "Pool":
        """The pool of :meth:`spec` over the same memory, mapped here (no
        daemon client): fill_layer, fill, check and scribble work on it."""
        self = cls.__new__(cls)
        for k in ("layers", "num_blocks", "block_size", "heads", "dim", "kv_layout", "head0"):
            setattr(self, k, geometry[k])
        blk = (self.block_size, self.heads, self.dim) if self.kv_layout == "NHD" else (self.heads, self.block_size, self.dim)
        shape = (self.layers, 2, self.num_blocks) + blk
        fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        try:
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)
        finally:
            os.close(fd)
        self.region = None
        self.array = np.frombuffer(mm, dtype=np.uint16, count=int(np.prod(shape))).reshape(shape)
        self.caches = {f"model.layers.{i}.self_attn": self.array[i] for i in range(self.layers)}
        self.names = list(self.caches)
        return self

    def block_bytes(self) -> int:
        return self.layers * 2 * self.block_size * self.heads * self.dim * 2

    def _keys(self, seed: int) -> np.ndarray:
        """_key of every (layer, K/V) of request ``seed``, ``(layers, 2)``."""
        return np.array([[_key(seed, layer, kv) for kv in (0, 1)] for layer in range(self.layers)], dtype=np.uint16)

    def _split(self, ids: Sequence[int], ntokens: int) -> Tuple[np.ndarray, int, int]:
        """The ids of the request's whole blocks, their number, and the
        tokens in its last, partly used block (0: none)."""
        nb = ntokens // self.block_size
        return np.asarray(ids[:nb], dtype=np.int64), nb, ntokens - nb * self.block_size

    def fill_layer(self, layer: int, ids: Sequence[int], seed: int, ntokens: int) -> None:
        """Write layer ``layer``'s K and V of the request's ``ntokens``
        tokens (pattern()), whole blocks in one numpy assignment: the
        stand-in for a GPU's work must leave the host's CPU to the control
        path it measures. The unused tail of a last block is left as is."""
        v = self._tables(ntokens)[layer, :, :ntokens] ^ self._keys(seed)[layer][:, None, None, None]  # (2, tok, h, d)
        whole, nb, tail = self._split(ids, ntokens)
        arr, n = self.array[layer], nb * self.block_size
        body = v[:, :n].reshape(2, nb, self.block_size, self.heads, self.dim)
        if self.kv_layout == "NHD":
            arr[:, whole] = body
            if tail:
                arr[:, ids[nb], :tail] = v[:, n:]
        else:
            arr[:, whole] = body.transpose(0, 1, 3, 2, 4)
            if tail:
                arr[:, ids[nb], :, :tail] = v[:, n:].transpose(0, 2, 1, 3)

    def fill(self, ids: Sequence[int], seed: int, ntokens: int) -> None:
        for layer in range(self.layers):
            self.fill_layer(layer, ids, seed, ntokens)

    def _tables(self, ntokens: int) -> np.ndarray:
        """pattern()'s tables of every layer and K/V for this pool's heads,
        ``(layers, 2, tokens, heads, dim)``, grown on demand."""
        t = getattr(self, "_tab", None)
        if t is None or t.shape[2] < ntokens:
            n = max(ntokens, 1024)
            heads = np.arange(self.head0, self.head0 + self.heads)
            t = self._tab = np.stack([np.stack([_table(layer, kv, n, self.head0 + self.heads, self.dim)[:n][:, heads]
                                                for kv in (0, 1)]) for layer in range(self.layers)])
        return t

    def check(self, ids: Sequence[int], seed: int, ntokens: int) -> int:
        """Tokens of the request whose K or V of any layer is wrong (0: every
        byte right): pattern() of every layer and K/V at once."""
        want = self._tables(ntokens)[:, :, :ntokens] ^ self._keys(seed)[:, :, None, None, None]  # (l, 2, tok, h, d)
        whole, nb, tail = self._split(ids, ntokens)
        n, L = nb * self.block_size, self.layers
        got = self.array[:, :, whole]  # (l, 2, nb, block...)
        if self.kv_layout == "HND":
            got = got.transpose(0, 1, 2, 4, 3, 5)
        bad = int((got.reshape(L, 2, n, self.heads, self.dim) != want[:, :, :n]).any(axis=(0, 1, 3, 4)).sum())
        if tail:
            last = self.array[:, :, ids[nb]]  # (l, 2, block...)
            last = last[:, :, :tail] if self.kv_layout == "NHD" else last[:, :, :, :tail].transpose(0, 1, 3, 2, 4)
            bad += int((last != want[:, :, n:]).any(axis=(0, 1, 3, 4)).sum())
        return bad

    def scribble(self, ids: Sequence[int]) -> None:
        """Overwrite blocks so that stale bytes cannot pass a check."""
        self.array[:, :, np.asarray(ids, dtype=np.int64)] = 0xA5A5

    def close(self) -> None:
        if self.region is not None:
            self.region.close()
