"""What the scheduler half hands the worker half each step, and the
settings both read from vLLM's config (or a stand-in with the same fields)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ._base import MetadataBase


@dataclass
class RecvReq:
    """Decode: load a request's blocks (pull: from ``remote_block_ids``;
    push: tell prefill where to write)."""

    req_id: str
    local_block_ids: List[int]
    remote_engine: str
    remote_peer: str
    remote_request_id: str
    remote_block_ids: Optional[List[int]] = None  # None in push mode, and in pull until prefill's "ready"
    # Pull, with the request sent to decode before prefill finished it (no
    # remote_block_ids yet): ask prefill for a "ready" note with its ids
    # and read as soon as it comes, instead of waiting for the router.
    wait_ready: bool = False
    # Why the request's kv_transfer_params cannot be loaded (malformed ids):
    # the worker fails its load, so the engine recomputes it.
    bad: Optional[str] = None


@dataclass
class SaveReq:
    """Prefill: a request being computed. Push: its layers go to decode as
    computed. Pull: decode engines that asked ("want") get a "ready" note
    with its block ids once its last layer is computed."""

    req_id: str
    block_ids: List[int]


@dataclass
class ReleaseReq:
    """Decode: a request that will not load (aborted, or all cached): prefill may free."""

    req_id: str
    remote_engine: str
    remote_peer: str
    remote_request_id: str


class B2BConnectorMetadata(MetadataBase):
    def __init__(self) -> None:
        self.reqs_to_recv: Dict[str, RecvReq] = {}
        self.reqs_to_save: Dict[str, SaveReq] = {}
        self.reqs_to_send: Dict[str, float] = {}  # prefill, pull: held until pulled, by this deadline (monotonic)
        self.reqs_to_release: Dict[str, ReleaseReq] = {}

    def __repr__(self) -> str:
        return (f"B2BConnectorMetadata(recv={len(self.reqs_to_recv)}, save={len(self.reqs_to_save)}, "
                f"send={len(self.reqs_to_send)}, release={len(self.reqs_to_release)})")


@dataclass
class Settings:
    engine_id: str
    mode: str  # "pull" or "push"
    socket: str
    block_size: int
    tp_size: int
    tp_rank: int
    transport: Optional[str]
    kv_layout: str  # "NHD" or "HND"
    release_timeout: float  # prefill frees unclaimed blocks after this
    load_timeout: float  # decode gives up on a load after this
    head_splits: List[int] = field(default_factory=list)

    @classmethod
    def from_config(cls, vllm_config: Any) -> "Settings":
        kt = vllm_config.kv_transfer_config
        extra = dict(getattr(kt, "kv_connector_extra_config", None) or {})
        mode = str(extra.get("mode", "pull"))
        if mode not in ("pull", "push"):
            raise ValueError(f"b2b.connector: kv_connector_extra_config mode {mode!r}: want 'pull' or 'push'")
        par = getattr(vllm_config, "parallel_config", None)
        tp = int(extra.get("tp_size", getattr(par, "tensor_parallel_size", 1) or 1))
        rank = extra.get("tp_rank")
        if rank is None:
            rank = _vllm_tp_rank()
        layout = str(extra.get("kv_layout", "NHD")).upper()
        if layout not in ("NHD", "HND"):
            raise ValueError(f"b2b.connector: kv_layout {layout!r}: want 'NHD' or 'HND'")
        return cls(
            engine_id=str(getattr(kt, "engine_id", None) or extra.get("engine_id") or "engine"),
            mode=mode,
            socket=str(extra.get("socket", "/run/b2bd/b2bd.sock")),
            block_size=int(vllm_config.cache_config.block_size),
            tp_size=tp,
            tp_rank=int(rank),
            transport=extra.get("transport"),
            kv_layout=layout,
            release_timeout=float(extra.get("release_timeout_s", 120.0)),
            load_timeout=float(extra.get("load_timeout_s", 60.0)),
            head_splits=[int(k) for k in extra.get("head_splits", [2] if layout == "HND" else [])],
        )


def _vllm_tp_rank() -> int:
    try:  # pragma: no cover - only under vLLM
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank  # type: ignore

        return int(get_tensor_model_parallel_rank())
    except Exception:
        return 0
