"""b2b.connector: a vLLM KV connector (``KVConnectorBase_V1``) over b2bd.

Load it in vLLM with::

    --kv-transfer-config '{"kv_connector": "B2BConnector",
        "kv_connector_module_path": "b2b.connector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"socket": "/run/b2bd/b2bd.sock", "mode": "pull"}}'

It imports without vLLM (then it subclasses a plain stand-in with the same
methods, which the tests and the disaggregated-serving harness drive in the
order vLLM calls them). Pull (the default): decode's ``start_load_kv`` reads
the request's blocks from prefill's exported layout, and the read's
notification tells prefill it may free them. Push: prefill writes each layer
into decode's ids as ``save_kv_layer`` sees it. Handshake metadata, ids for
push, done, failure and release reports all go through b2bd (channel.py).
See docs/connector.md.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Set, Tuple

from ._base import HAVE_VLLM, Base, Role
from .meta import B2BConnectorMetadata, RecvReq, ReleaseReq, SaveReq, Settings
from .scheduler import SchedulerHalf
from .worker import WorkerHalf

__all__ = ["B2BConnector", "B2BConnectorMetadata", "Settings", "Role", "HAVE_VLLM", "RecvReq", "SaveReq",
           "ReleaseReq"]


def _is_scheduler(role: Any) -> bool:
    return getattr(role, "name", str(role)).upper().endswith("SCHEDULER")


class B2BConnector(Base):
    """One object per role, as vLLM makes them: the scheduler's (bookkeeping)
    or a worker rank's (b2bd I/O)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None, *, client: Any = None) -> None:
        try:
            super().__init__(vllm_config, role, kv_cache_config)
        except TypeError:  # older vLLM: (vllm_config, role)
            super().__init__(vllm_config, role)
        self.settings = Settings.from_config(vllm_config)
        self._role_ = role
        self.sched: Optional[SchedulerHalf] = None
        self.worker: Optional[WorkerHalf] = None
        if _is_scheduler(role):
            peer = str(getattr(vllm_config.kv_transfer_config, "kv_connector_extra_config", {}).get("peer_address", ""))
            if not peer:
                import b2b

                with (client or b2b.Client(self.settings.socket)) as c:
                    peer = c.status().peer_address
            self.sched = SchedulerHalf(self.settings, peer)
        else:
            self.worker = WorkerHalf(self.settings, client)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> Optional[str]:
        extra = getattr(vllm_config.kv_transfer_config, "kv_connector_extra_config", None) or {}
        return str(extra.get("kv_layout", "NHD")).upper()

    # -- scheduler side ------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        return self.sched.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self.sched.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any = None) -> B2BConnectorMetadata:
        return self.sched.build_connector_meta(scheduler_output)

    def request_finished(self, request: Any, block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        return self.sched.request_finished(request, block_ids)

    def update_connector_output(self, connector_output: Any) -> None:
        return None

    def take_events(self) -> Tuple[()]:
        return ()

    # -- worker side ---------------------------------------------------------

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        self.worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: Any = None, **kwargs: Any) -> None:
        self.worker.start_load_kv(self._get_connector_metadata())

    def wait_for_layer_load(self, layer_name: str) -> None:
        # A request is scheduled only once its load finished (get_finished's
        # recving): every layer is in place before the forward pass.
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any = None, attn_metadata: Any = None, **kwargs: Any) -> None:
        # Push: the layer goes out. Pull: after the last layer, decode
        # engines that asked for the request hear that it is ready.
        self.worker.save_kv_layer(layer_name, self._get_connector_metadata())

    def wait_for_save(self) -> None:
        # Pushes run on; blocks stay allocated until get_finished reports
        # them sent, so the next step cannot overwrite them.
        return None

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        meta = self._connector_metadata if self.has_connector_metadata() else None
        return self.worker.get_finished(meta)

    def set_wakeup(self, fn: Any) -> None:
        """Not vLLM's (its engine steps without sleeping): ``fn()`` is called,
        from a connector thread, when a peer's note arrives or a transfer
        ends, so an engine that sleeps between steps wakes for it."""
        self.worker.set_wakeup(fn)

    def get_block_ids_with_load_errors(self) -> Set[int]:
        return self.worker.get_block_ids_with_load_errors()

    def get_kv_connector_stats(self) -> Optional[Dict[str, Any]]:
        # vLLM aggregates KVConnectorStats objects across ranks; ours are a
        # plain dict, so under vLLM they are read with b2b_stats() instead.
        return None if HAVE_VLLM else self.b2b_stats()

    def b2b_stats(self) -> Optional[Dict[str, Any]]:
        """Counters of this worker rank: loads, saves, failures, notes, timeouts, recent wire times (ns)."""
        return dict(self.worker.stats) if self.worker is not None else None

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()

    def has_connector_metadata(self) -> bool:
        return getattr(self, "_connector_metadata", None) is not None
