"""The connector's scheduler half: pure bookkeeping, no I/O (the workers
do every transfer and note)."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

from .meta import B2BConnectorMetadata, RecvReq, ReleaseReq, SaveReq, Settings


def flat_ids(ids: Any) -> List[int]:
    """Block ids as a list, from a list or from vLLM's per-group form (a
    tuple of lists): one KV cache group only (no hybrid models yet)."""
    ids = list(ids or ())
    if ids and isinstance(ids[0], (list, tuple)):
        if len(ids) > 1 and any(len(g) for g in ids[1:]):
            raise ValueError(f"b2b.connector: block ids of {len(ids)} KV cache groups: one group is supported")
        ids = list(ids[0])
    out = []
    for i, b in enumerate(ids):
        if isinstance(b, bool) or not isinstance(b, (int, str)) and not hasattr(b, "__index__"):
            raise TypeError(f"[{i}] is {b!r} ({type(b).__name__}): want a block id (an int)")
        try:
            out.append(int(b))
        except ValueError:
            raise ValueError(f"[{i}] is {b!r}: want a block id (an int)") from None
    return out


def _block_ids(blocks: Any) -> List[int]:
    """vLLM's KVCacheBlocks (its blocks not yet cached), or plain ids."""
    if blocks is None:
        return []
    if hasattr(blocks, "get_unhashed_block_ids_all_groups"):
        return flat_ids(blocks.get_unhashed_block_ids_all_groups())
    if hasattr(blocks, "get_unhashed_block_ids"):
        return flat_ids(blocks.get_unhashed_block_ids())
    if hasattr(blocks, "get_block_ids"):
        return flat_ids(blocks.get_block_ids())
    return flat_ids(blocks)


def _prompt_len(request: Any) -> int:
    ids = getattr(request, "prompt_token_ids", None)
    return len(ids) if ids is not None else int(request.num_prompt_tokens)


class SchedulerHalf:
    def __init__(self, settings: Settings, peer_address: str = "") -> None:
        self.s = settings
        self.peer_address = peer_address  # our daemon's, given to decode in kv_transfer_params
        self._recv: Dict[str, RecvReq] = {}
        self._save: Dict[str, SaveReq] = {}
        self._send: Dict[str, float] = {}
        self._release: Dict[str, ReleaseReq] = {}

    # -- decode -------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        p = getattr(request, "kv_transfer_params", None) or {}
        if not p.get("do_remote_prefill"):
            return 0, False
        # Every prompt token not computed here comes from prefill, loaded
        # asynchronously (the request waits for get_finished's recving).
        count = _prompt_len(request) - num_computed_tokens
        return (count, True) if count > 0 else (0, False)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        p = getattr(request, "kv_transfer_params", None) or {}
        rid = str(request.request_id)
        if p.get("do_remote_decode"):
            self._save[rid] = SaveReq(rid, _block_ids(blocks))
            return
        if not p.get("do_remote_prefill"):
            return
        p["do_remote_prefill"] = False  # once: a preempted request recomputes
        remote = (str(p.get("remote_engine_id", "")), str(p.get("remote_peer", "")),
                  str(p.get("remote_request_id", rid)))
        if num_external_tokens <= 0:
            self._release[rid] = ReleaseReq(rid, *remote)  # nothing to load: let prefill free
            return
        rb = p.get("remote_block_ids")
        bad = None
        if rb is not None:
            try:
                rb = flat_ids(rb)
            except (TypeError, ValueError) as e:  # a peer's params are input: fail the load, not the scheduler
                rb, bad = [], f"kv_transfer_params.remote_block_ids: {e}"
        self._recv[rid] = RecvReq(rid, _block_ids(blocks), remote[0], remote[1], remote[2], rb,
                                  wait_ready=rb is None and self.s.mode == "pull", bad=bad)

    def build_connector_meta(self, scheduler_output: Any = None) -> B2BConnectorMetadata:
        m = B2BConnectorMetadata()
        m.reqs_to_recv, self._recv = self._recv, {}
        m.reqs_to_save, self._save = self._save, {}
        m.reqs_to_send, self._send = self._send, {}
        m.reqs_to_release, self._release = self._release, {}
        return m

    # -- both ---------------------------------------------------------------

    def request_finished(self, request: Any, block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        p = getattr(request, "kv_transfer_params", None) or {}
        rid = str(request.request_id)
        if p.get("do_remote_prefill"):
            # Decode side, finished before it ever loaded (aborted while
            # waiting): prefill holds the blocks; tell it to free them.
            p["do_remote_prefill"] = False
            self._release[rid] = ReleaseReq(rid, str(p.get("remote_engine_id", "")), str(p.get("remote_peer", "")),
                                            str(p.get("remote_request_id", rid)))
            self._recv.pop(rid, None)
            return False, None
        if not p.get("do_remote_decode"):
            return False, None
        status = getattr(request, "status", "FINISHED_LENGTH_CAPPED")
        if not str(getattr(status, "name", status)).upper().endswith("FINISHED_LENGTH_CAPPED"):
            # Aborted (or stopped otherwise): decode will not read it, free now.
            self._save.pop(rid, None)
            return False, None
        block_ids = flat_ids(block_ids)
        delay = len(block_ids) > 0
        if delay and self.s.mode == "pull":
            self._send[rid] = time.monotonic() + self.s.release_timeout
        params = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "mode": self.s.mode,
            "remote_engine_id": self.s.engine_id,
            "remote_peer": self.peer_address,
            "remote_request_id": rid,
            "remote_block_ids": [int(b) for b in block_ids],
            "remote_block_size": self.s.block_size,
            "tp_size": self.s.tp_size,
        }
        return delay, params
