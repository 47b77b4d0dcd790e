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

from .client import (
    DEFAULT_SOCKET,
    MAX_MESSAGE_BYTES,
    ChecksumResult,
    Client,
    CudaRegion,
    Descriptors,
    HostRegion,
    Notification,
    PhaseTimings,
    PreparedTransfer,
    RegionInfo,
    Status,
    StreamResult,
    SubmitStream,
    TransferResult,
    TransportStatus,
    Watch,
)
from .errors import (
    AbortedError,
    AlreadyExistsError,
    B2BError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnavailableError,
    UnimplementedError,
    error_for_code,
    from_rpc_error,
)

__version__ = "0.1.0"

__all__ = [
    "Client",
    "HostRegion",
    "CudaRegion",
    "RegionInfo",
    "Descriptors",
    "TransferResult",
    "ChecksumResult",
    "Status",
    "TransportStatus",
    "Notification",
    "Watch",
    "PhaseTimings",
    "PreparedTransfer",
    "SubmitStream",
    "StreamResult",
    "DEFAULT_SOCKET",
    "MAX_MESSAGE_BYTES",
    "B2BError",
    "NotFoundError",
    "InvalidArgumentError",
    "UnavailableError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "ResourceExhaustedError",
    "PermissionDeniedError",
    "AbortedError",
    "AlreadyExistsError",
    "UnimplementedError",
    "from_rpc_error",
    "error_for_code",
    "__version__",
]
