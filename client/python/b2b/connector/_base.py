"""The base class and role enum: vLLM's when vllm imports, else plain
stand-ins with the same names, so that b2b.connector works (and is tested)
without vLLM."""

from __future__ import annotations

import enum
from typing import Any

try:  # pragma: no cover - only where vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
        KVConnectorBase_V1 as Base,
        KVConnectorMetadata as MetadataBase,
        KVConnectorRole as Role,
    )

    HAVE_VLLM = True
except Exception:  # ImportError, or a vLLM too old/new to import cleanly
    HAVE_VLLM = False

    class Role(enum.Enum):  # type: ignore[no-redef]
        SCHEDULER = 0
        WORKER = 1

    class MetadataBase:  # type: ignore[no-redef]
        """What the scheduler hands the workers each step."""

    class Base:  # type: ignore[no-redef]
        """Stand-in for KVConnectorBase_V1: keeps the config, role and the
        bound metadata as vLLM's base does."""

        def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
            self._vllm_config = vllm_config
            self._role = role
            self._kv_cache_config = kv_cache_config
            self._connector_metadata: Any = None

        @property
        def role(self) -> Any:
            return self._role

        def bind_connector_metadata(self, connector_metadata: Any) -> None:
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def _get_connector_metadata(self) -> Any:
            assert self._connector_metadata is not None, "no connector metadata bound"
            return self._connector_metadata

        def has_connector_metadata(self) -> bool:
            return self._connector_metadata is not None
