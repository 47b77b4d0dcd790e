"""b2b: Python client for b2bd, the per-host daemon that moves batches of
memory blocks between hosts.

Quick start::

    import numpy as np
    import b2b

    with b2b.Client("/run/b2bd/b2bd.sock") as c:
        with c.register_host(1 << 20) as src:
            src.array[:] = 7
            offs = np.arange(0, 1 << 20, 4096, dtype=np.uint64)
            r = c.batch_transfer(src, "peer-host:7470", "dst", offs, offs, block_size=4096)
            print(r.blocks, r.bytes, r.transport, r.elapsed)

Descriptor arrays travel as packed little-endian uint64 bytes, packed with
numpy. Errors are :class:`B2BError` subclasses carrying the gRPC code and the
daemon's message.
"""

from . import client as _client
from . import errors as _errors
from .client import *  # noqa: F401,F403 - the names in client.__all__
from .errors import *  # noqa: F401,F403 - the names in errors.__all__
from . import views as _views
from .views import *  # noqa: F401,F403 - as_array, as_tensor, block_offsets
from ._memfd import HostBuffer, alloc_host  # noqa: F401 - memory this process allocates (docs/host-memory.md)
from . import kv  # noqa: F401 - b2b.kv: KV-cache tensors to layouts (docs/kv.md)
from . import stream  # noqa: F401 - b2b.stream: progress counters, layer marks (docs/kv.md)
from .notes import key_note, on_note, parse_key_note  # noqa: F401 - key notes (docs/notes.md)

__version__ = "0.1.0"

# One list per module, kept there; the package exports their union.
__all__ = [*_client.__all__, *_errors.__all__, *_views.__all__, "key_note", "on_note", "parse_key_note", "HostBuffer", "alloc_host", "__version__"]
