from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

ACCESS_READ: Access
ACCESS_WRITE: Access
CHECKSUM_ALGORITHM_CRC32C: ChecksumAlgorithm
CHECKSUM_ALGORITHM_UNSPECIFIED: ChecksumAlgorithm
CHECKSUM_ALGORITHM_XXH64: ChecksumAlgorithm
DESCRIPTOR: _descriptor.FileDescriptor
MEMORY_KIND_CUDA: MemoryKind
MEMORY_KIND_HOST: MemoryKind
MEMORY_KIND_UNSPECIFIED: MemoryKind
TRANSFER_OP_READ: TransferOp
TRANSFER_OP_WRITE: TransferOp
TRANSFER_STATE_CANCELLED: TransferState
TRANSFER_STATE_DONE: TransferState
TRANSFER_STATE_FAILED: TransferState
TRANSFER_STATE_RUNNING: TransferState
TRANSFER_STATE_UNSPECIFIED: TransferState
TRANSPORT_KIND_LOCAL: TransportKind
TRANSPORT_KIND_TCP: TransportKind
TRANSPORT_KIND_UNSPECIFIED: TransportKind
TRANSPORT_KIND_VERBS: TransportKind

class BatchTransferRequest(_message.Message):
    __slots__ = ["descriptors", "dst_region", "notification", "op", "peer", "src_region_id", "transport", "transport_name"]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    DST_REGION_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATION_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    SRC_REGION_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_NAME_FIELD_NUMBER: _ClassVar[int]
    descriptors: Descriptors
    dst_region: str
    notification: bytes
    op: TransferOp
    peer: str
    src_region_id: str
    transport: TransportKind
    transport_name: str
    def __init__(self, src_region_id: _Optional[str] = ..., peer: _Optional[str] = ..., dst_region: _Optional[str] = ..., descriptors: _Optional[_Union[Descriptors, _Mapping]] = ..., transport: _Optional[_Union[TransportKind, str]] = ..., notification: _Optional[bytes] = ..., op: _Optional[_Union[TransferOp, str]] = ..., transport_name: _Optional[str] = ...) -> None: ...

class BatchTransferResponse(_message.Message):
    __slots__ = ["blocks", "bytes", "elapsed_ns", "phases", "segments", "transport", "transport_name", "work_requests"]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_NS_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_NAME_FIELD_NUMBER: _ClassVar[int]
    WORK_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    blocks: int
    bytes: int
    elapsed_ns: int
    phases: PhaseTimings
    segments: int
    transport: TransportKind
    transport_name: str
    work_requests: int
    def __init__(self, blocks: _Optional[int] = ..., bytes: _Optional[int] = ..., transport: _Optional[_Union[TransportKind, str]] = ..., segments: _Optional[int] = ..., work_requests: _Optional[int] = ..., elapsed_ns: _Optional[int] = ..., phases: _Optional[_Union[PhaseTimings, _Mapping]] = ..., transport_name: _Optional[str] = ...) -> None: ...

class BindBlockRouteRequest(_message.Message):
    __slots__ = ["local_layout", "op", "peer", "remote_layout", "transport", "transport_name"]
    LOCAL_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    REMOTE_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_NAME_FIELD_NUMBER: _ClassVar[int]
    local_layout: str
    op: TransferOp
    peer: str
    remote_layout: str
    transport: TransportKind
    transport_name: str
    def __init__(self, local_layout: _Optional[str] = ..., peer: _Optional[str] = ..., remote_layout: _Optional[str] = ..., transport: _Optional[_Union[TransportKind, str]] = ..., op: _Optional[_Union[TransferOp, str]] = ..., transport_name: _Optional[str] = ...) -> None: ...

class BindBlockRouteResponse(_message.Message):
    __slots__ = ["handle"]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    handle: int
    def __init__(self, handle: _Optional[int] = ...) -> None: ...

class Calibration(_message.Message):
    __slots__ = ["elapsed_ns", "file", "rows", "state"]
    ELAPSED_NS_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    elapsed_ns: int
    file: str
    rows: _containers.RepeatedCompositeFieldContainer[CalibrationRow]
    state: str
    def __init__(self, state: _Optional[str] = ..., elapsed_ns: _Optional[int] = ..., rows: _Optional[_Iterable[_Union[CalibrationRow, _Mapping]]] = ..., file: _Optional[str] = ...) -> None: ...

class CalibrationRow(_message.Message):
    __slots__ = ["block_bytes", "blocks", "chosen", "failed", "median_ns", "same_device", "to", "why"]
    class FailedEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class MedianNsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    FROM_FIELD_NUMBER: _ClassVar[int]
    MEDIAN_NS_FIELD_NUMBER: _ClassVar[int]
    SAME_DEVICE_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    block_bytes: int
    blocks: int
    chosen: str
    failed: _containers.ScalarMap[str, str]
    median_ns: _containers.ScalarMap[str, int]
    same_device: bool
    to: MemoryKind
    why: str
    def __init__(self, to: _Optional[_Union[MemoryKind, str]] = ..., same_device: bool = ..., block_bytes: _Optional[int] = ..., blocks: _Optional[int] = ..., median_ns: _Optional[_Mapping[str, int]] = ..., failed: _Optional[_Mapping[str, str]] = ..., chosen: _Optional[str] = ..., why: _Optional[str] = ..., **kwargs) -> None: ...

class CancelCallRequest(_message.Message):
    __slots__ = ["call_id"]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    def __init__(self, call_id: _Optional[str] = ...) -> None: ...

class CancelCallResponse(_message.Message):
    __slots__ = ["in_flight"]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    in_flight: bool
    def __init__(self, in_flight: bool = ...) -> None: ...

class CancelTransferRequest(_message.Message):
    __slots__ = ["transfer_id"]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    transfer_id: int
    def __init__(self, transfer_id: _Optional[int] = ...) -> None: ...

class ChecksumRequest(_message.Message):
    __slots__ = ["algorithm", "block_length", "lengths", "offsets", "per_block", "region_id"]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    BLOCK_LENGTH_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    algorithm: ChecksumAlgorithm
    block_length: int
    lengths: bytes
    offsets: bytes
    per_block: bool
    region_id: str
    def __init__(self, region_id: _Optional[str] = ..., offsets: _Optional[bytes] = ..., lengths: _Optional[bytes] = ..., block_length: _Optional[int] = ..., algorithm: _Optional[_Union[ChecksumAlgorithm, str]] = ..., per_block: bool = ...) -> None: ...

class ChecksumResponse(_message.Message):
    __slots__ = ["algorithm", "block_digests", "blocks", "bytes", "digest"]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    algorithm: ChecksumAlgorithm
    block_digests: bytes
    blocks: int
    bytes: int
    digest: int
    def __init__(self, digest: _Optional[int] = ..., block_digests: _Optional[bytes] = ..., algorithm: _Optional[_Union[ChecksumAlgorithm, str]] = ..., blocks: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class CudaAlloc(_message.Message):
    __slots__ = ["device", "size"]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    device: int
    size: int
    def __init__(self, device: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class CudaIpc(_message.Message):
    __slots__ = ["device", "ipc_handle", "offset", "size"]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    IPC_HANDLE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    device: int
    ipc_handle: bytes
    offset: int
    size: int
    def __init__(self, device: _Optional[int] = ..., ipc_handle: _Optional[bytes] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class DeregisterLayoutRequest(_message.Message):
    __slots__ = ["name"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeregisterLayoutResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class DeregisterRegionRequest(_message.Message):
    __slots__ = ["region_id"]
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    region_id: str
    def __init__(self, region_id: _Optional[str] = ...) -> None: ...

class DeregisterRegionResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class Descriptors(_message.Message):
    __slots__ = ["block_length", "dst_offsets", "lengths", "src_offsets"]
    BLOCK_LENGTH_FIELD_NUMBER: _ClassVar[int]
    DST_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    SRC_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    block_length: int
    dst_offsets: bytes
    lengths: bytes
    src_offsets: bytes
    def __init__(self, src_offsets: _Optional[bytes] = ..., dst_offsets: _Optional[bytes] = ..., lengths: _Optional[bytes] = ..., block_length: _Optional[int] = ...) -> None: ...

class ExportRegionRequest(_message.Message):
    __slots__ = ["export_name", "export_to", "read_only", "readers", "region_id"]
    EXPORT_NAME_FIELD_NUMBER: _ClassVar[int]
    EXPORT_TO_FIELD_NUMBER: _ClassVar[int]
    READERS_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    export_name: str
    export_to: _containers.RepeatedScalarFieldContainer[str]
    read_only: bool
    readers: _containers.RepeatedScalarFieldContainer[str]
    region_id: str
    def __init__(self, region_id: _Optional[str] = ..., export_name: _Optional[str] = ..., export_to: _Optional[_Iterable[str]] = ..., readers: _Optional[_Iterable[str]] = ..., read_only: bool = ...) -> None: ...

class ExportRegionResponse(_message.Message):
    __slots__ = ["region"]
    REGION_FIELD_NUMBER: _ClassVar[int]
    region: Region
    def __init__(self, region: _Optional[_Union[Region, _Mapping]] = ...) -> None: ...

class HandshakeRequest(_message.Message):
    __slots__ = ["kinds", "node_name", "protocol_version"]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    kinds: _containers.RepeatedScalarFieldContainer[str]
    node_name: str
    protocol_version: int
    def __init__(self, protocol_version: _Optional[int] = ..., node_name: _Optional[str] = ..., kinds: _Optional[_Iterable[str]] = ...) -> None: ...

class HandshakeResponse(_message.Message):
    __slots__ = ["adverts", "instance_id", "node_name", "protocol_version"]
    class AdvertsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    ADVERTS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    adverts: _containers.ScalarMap[str, bytes]
    instance_id: int
    node_name: str
    protocol_version: int
    def __init__(self, protocol_version: _Optional[int] = ..., node_name: _Optional[str] = ..., instance_id: _Optional[int] = ..., adverts: _Optional[_Mapping[str, bytes]] = ...) -> None: ...

class HostAlloc(_message.Message):
    __slots__ = ["size"]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    size: int
    def __init__(self, size: _Optional[int] = ...) -> None: ...

class HostFile(_message.Message):
    __slots__ = ["offset", "path", "size"]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    offset: int
    path: str
    size: int
    def __init__(self, path: _Optional[str] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class Layout(_message.Message):
    __slots__ = ["export_name", "export_to", "name", "num_blocks", "persist", "read_only", "readers", "segments"]
    EXPORT_NAME_FIELD_NUMBER: _ClassVar[int]
    EXPORT_TO_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PERSIST_FIELD_NUMBER: _ClassVar[int]
    READERS_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    export_name: str
    export_to: _containers.RepeatedScalarFieldContainer[str]
    name: str
    num_blocks: int
    persist: bool
    read_only: bool
    readers: _containers.RepeatedScalarFieldContainer[str]
    segments: _containers.RepeatedCompositeFieldContainer[LayoutSegment]
    def __init__(self, name: _Optional[str] = ..., segments: _Optional[_Iterable[_Union[LayoutSegment, _Mapping]]] = ..., num_blocks: _Optional[int] = ..., export_name: _Optional[str] = ..., export_to: _Optional[_Iterable[str]] = ..., readers: _Optional[_Iterable[str]] = ..., read_only: bool = ..., persist: bool = ...) -> None: ...

class LayoutSegment(_message.Message):
    __slots__ = ["block_len", "offset", "region_id", "stride"]
    BLOCK_LEN_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    STRIDE_FIELD_NUMBER: _ClassVar[int]
    block_len: int
    offset: int
    region_id: str
    stride: int
    def __init__(self, region_id: _Optional[str] = ..., offset: _Optional[int] = ..., block_len: _Optional[int] = ..., stride: _Optional[int] = ...) -> None: ...

class ListLayoutsRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ListLayoutsResponse(_message.Message):
    __slots__ = ["layouts"]
    LAYOUTS_FIELD_NUMBER: _ClassVar[int]
    layouts: _containers.RepeatedCompositeFieldContainer[Layout]
    def __init__(self, layouts: _Optional[_Iterable[_Union[Layout, _Mapping]]] = ...) -> None: ...

class ListRegionsRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ListRegionsResponse(_message.Message):
    __slots__ = ["regions"]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    regions: _containers.RepeatedCompositeFieldContainer[Region]
    def __init__(self, regions: _Optional[_Iterable[_Union[Region, _Mapping]]] = ...) -> None: ...

class Notification(_message.Message):
    __slots__ = ["blocks", "bytes", "dropped", "notification", "region", "sender"]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATION_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    blocks: int
    bytes: int
    dropped: int
    notification: bytes
    region: str
    sender: str
    def __init__(self, region: _Optional[str] = ..., sender: _Optional[str] = ..., notification: _Optional[bytes] = ..., blocks: _Optional[int] = ..., bytes: _Optional[int] = ..., dropped: _Optional[int] = ...) -> None: ...

class NotifyRegionRequest(_message.Message):
    __slots__ = ["notification", "region_id"]
    NOTIFICATION_FIELD_NUMBER: _ClassVar[int]
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    notification: bytes
    region_id: str
    def __init__(self, region_id: _Optional[str] = ..., notification: _Optional[bytes] = ...) -> None: ...

class NotifyRegionResponse(_message.Message):
    __slots__ = ["delivered"]
    DELIVERED_FIELD_NUMBER: _ClassVar[int]
    delivered: int
    def __init__(self, delivered: _Optional[int] = ...) -> None: ...

class NotifyRequest(_message.Message):
    __slots__ = ["blocks", "bytes", "notification", "region", "sender", "seq"]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATION_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    blocks: int
    bytes: int
    notification: bytes
    region: str
    sender: str
    seq: int
    def __init__(self, region: _Optional[str] = ..., sender: _Optional[str] = ..., notification: _Optional[bytes] = ..., blocks: _Optional[int] = ..., bytes: _Optional[int] = ..., seq: _Optional[int] = ...) -> None: ...

class NotifyResponse(_message.Message):
    __slots__ = ["code", "delivered", "message", "seq"]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    code: int
    delivered: int
    message: str
    seq: int
    def __init__(self, delivered: _Optional[int] = ..., seq: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class PhaseTimings(_message.Message):
    __slots__ = ["armed_ns", "decode_ns", "landed_unix_ns", "notify_ns", "plan_ns", "post_ns", "posted_unix_ns", "resolve_ns", "total_ns", "trigger_seen_unix_ns", "validate_ns", "wire_ns"]
    ARMED_NS_FIELD_NUMBER: _ClassVar[int]
    DECODE_NS_FIELD_NUMBER: _ClassVar[int]
    LANDED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    NOTIFY_NS_FIELD_NUMBER: _ClassVar[int]
    PLAN_NS_FIELD_NUMBER: _ClassVar[int]
    POSTED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    POST_NS_FIELD_NUMBER: _ClassVar[int]
    RESOLVE_NS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NS_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_SEEN_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_NS_FIELD_NUMBER: _ClassVar[int]
    WIRE_NS_FIELD_NUMBER: _ClassVar[int]
    armed_ns: int
    decode_ns: int
    landed_unix_ns: int
    notify_ns: int
    plan_ns: int
    post_ns: int
    posted_unix_ns: int
    resolve_ns: int
    total_ns: int
    trigger_seen_unix_ns: int
    validate_ns: int
    wire_ns: int
    def __init__(self, decode_ns: _Optional[int] = ..., validate_ns: _Optional[int] = ..., resolve_ns: _Optional[int] = ..., plan_ns: _Optional[int] = ..., post_ns: _Optional[int] = ..., wire_ns: _Optional[int] = ..., notify_ns: _Optional[int] = ..., total_ns: _Optional[int] = ..., armed_ns: _Optional[int] = ..., trigger_seen_unix_ns: _Optional[int] = ..., posted_unix_ns: _Optional[int] = ..., landed_unix_ns: _Optional[int] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class PingResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class PollTransfersRequest(_message.Message):
    __slots__ = ["transfer_ids"]
    TRANSFER_IDS_FIELD_NUMBER: _ClassVar[int]
    transfer_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, transfer_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PollTransfersResponse(_message.Message):
    __slots__ = ["outcomes"]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[TransferOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[TransferOutcome, _Mapping]]] = ...) -> None: ...

class PrepareTransferRequest(_message.Message):
    __slots__ = ["descriptors", "dst_region", "notification", "op", "peer", "src_region_id", "transport", "transport_name"]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    DST_REGION_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATION_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    SRC_REGION_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_NAME_FIELD_NUMBER: _ClassVar[int]
    descriptors: Descriptors
    dst_region: str
    notification: bytes
    op: TransferOp
    peer: str
    src_region_id: str
    transport: TransportKind
    transport_name: str
    def __init__(self, src_region_id: _Optional[str] = ..., peer: _Optional[str] = ..., dst_region: _Optional[str] = ..., descriptors: _Optional[_Union[Descriptors, _Mapping]] = ..., transport: _Optional[_Union[TransportKind, str]] = ..., notification: _Optional[bytes] = ..., op: _Optional[_Union[TransferOp, str]] = ..., transport_name: _Optional[str] = ...) -> None: ...

class PrepareTransferResponse(_message.Message):
    __slots__ = ["blocks", "bytes", "handle", "phases", "segments", "transport", "transport_name", "work_requests"]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_NAME_FIELD_NUMBER: _ClassVar[int]
    WORK_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    blocks: int
    bytes: int
    handle: int
    phases: PhaseTimings
    segments: int
    transport: TransportKind
    transport_name: str
    work_requests: int
    def __init__(self, handle: _Optional[int] = ..., blocks: _Optional[int] = ..., bytes: _Optional[int] = ..., transport: _Optional[_Union[TransportKind, str]] = ..., segments: _Optional[int] = ..., work_requests: _Optional[int] = ..., phases: _Optional[_Union[PhaseTimings, _Mapping]] = ..., transport_name: _Optional[str] = ...) -> None: ...

class RailRegistration(_message.Message):
    __slots__ = ["affinity", "device", "path", "preferred", "rail", "rkey"]
    AFFINITY_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_FIELD_NUMBER: _ClassVar[int]
    RAIL_FIELD_NUMBER: _ClassVar[int]
    RKEY_FIELD_NUMBER: _ClassVar[int]
    affinity: str
    device: str
    path: str
    preferred: bool
    rail: int
    rkey: int
    def __init__(self, rail: _Optional[int] = ..., device: _Optional[str] = ..., rkey: _Optional[int] = ..., path: _Optional[str] = ..., affinity: _Optional[str] = ..., preferred: bool = ...) -> None: ...

class RailStatus(_message.Message):
    __slots__ = ["bytes_sent", "detail", "device", "failovers", "last_error", "rail", "reconnects", "up"]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    FAILOVERS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    RAIL_FIELD_NUMBER: _ClassVar[int]
    RECONNECTS_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    bytes_sent: int
    detail: str
    device: str
    failovers: int
    last_error: str
    rail: int
    reconnects: int
    up: bool
    def __init__(self, rail: _Optional[int] = ..., device: _Optional[str] = ..., detail: _Optional[str] = ..., up: bool = ..., last_error: _Optional[str] = ..., failovers: _Optional[int] = ..., reconnects: _Optional[int] = ..., bytes_sent: _Optional[int] = ...) -> None: ...

class Region(_message.Message):
    __slots__ = ["active_batches", "age_ns", "cuda_device", "cuda_ipc_handle", "cuda_ipc_offset", "export_name", "export_to", "id", "kind", "owner", "persist", "pid", "rails", "read_only", "readers", "registered_with", "registered_with_names", "shm_offset", "shm_path", "size"]
    ACTIVE_BATCHES_FIELD_NUMBER: _ClassVar[int]
    AGE_NS_FIELD_NUMBER: _ClassVar[int]
    CUDA_DEVICE_FIELD_NUMBER: _ClassVar[int]
    CUDA_IPC_HANDLE_FIELD_NUMBER: _ClassVar[int]
    CUDA_IPC_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EXPORT_NAME_FIELD_NUMBER: _ClassVar[int]
    EXPORT_TO_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PERSIST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RAILS_FIELD_NUMBER: _ClassVar[int]
    READERS_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_WITH_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_WITH_NAMES_FIELD_NUMBER: _ClassVar[int]
    SHM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SHM_PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    active_batches: int
    age_ns: int
    cuda_device: int
    cuda_ipc_handle: bytes
    cuda_ipc_offset: int
    export_name: str
    export_to: _containers.RepeatedScalarFieldContainer[str]
    id: str
    kind: MemoryKind
    owner: str
    persist: bool
    pid: int
    rails: _containers.RepeatedCompositeFieldContainer[RailRegistration]
    read_only: bool
    readers: _containers.RepeatedScalarFieldContainer[str]
    registered_with: _containers.RepeatedScalarFieldContainer[TransportKind]
    registered_with_names: _containers.RepeatedScalarFieldContainer[str]
    shm_offset: int
    shm_path: str
    size: int
    def __init__(self, id: _Optional[str] = ..., export_name: _Optional[str] = ..., size: _Optional[int] = ..., kind: _Optional[_Union[MemoryKind, str]] = ..., shm_path: _Optional[str] = ..., shm_offset: _Optional[int] = ..., cuda_device: _Optional[int] = ..., cuda_ipc_handle: _Optional[bytes] = ..., cuda_ipc_offset: _Optional[int] = ..., active_batches: _Optional[int] = ..., registered_with: _Optional[_Iterable[_Union[TransportKind, str]]] = ..., export_to: _Optional[_Iterable[str]] = ..., rails: _Optional[_Iterable[_Union[RailRegistration, _Mapping]]] = ..., owner: _Optional[str] = ..., pid: _Optional[int] = ..., age_ns: _Optional[int] = ..., persist: bool = ..., readers: _Optional[_Iterable[str]] = ..., read_only: bool = ..., registered_with_names: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterLayoutRequest(_message.Message):
    __slots__ = ["export_name", "export_to", "name", "num_blocks", "persist", "read_only", "readers", "segments"]
    EXPORT_NAME_FIELD_NUMBER: _ClassVar[int]
    EXPORT_TO_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PERSIST_FIELD_NUMBER: _ClassVar[int]
    READERS_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    export_name: str
    export_to: _containers.RepeatedScalarFieldContainer[str]
    name: str
    num_blocks: int
    persist: bool
    read_only: bool
    readers: _containers.RepeatedScalarFieldContainer[str]
    segments: _containers.RepeatedCompositeFieldContainer[LayoutSegment]
    def __init__(self, name: _Optional[str] = ..., segments: _Optional[_Iterable[_Union[LayoutSegment, _Mapping]]] = ..., num_blocks: _Optional[int] = ..., export_name: _Optional[str] = ..., export_to: _Optional[_Iterable[str]] = ..., readers: _Optional[_Iterable[str]] = ..., read_only: bool = ..., persist: bool = ...) -> None: ...

class RegisterLayoutResponse(_message.Message):
    __slots__ = ["layout"]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    layout: Layout
    def __init__(self, layout: _Optional[_Union[Layout, _Mapping]] = ...) -> None: ...

class RegisterRegionRequest(_message.Message):
    __slots__ = ["cuda_alloc", "cuda_ipc", "export_name", "export_to", "host_alloc", "host_file", "persist", "read_only", "readers"]
    CUDA_ALLOC_FIELD_NUMBER: _ClassVar[int]
    CUDA_IPC_FIELD_NUMBER: _ClassVar[int]
    EXPORT_NAME_FIELD_NUMBER: _ClassVar[int]
    EXPORT_TO_FIELD_NUMBER: _ClassVar[int]
    HOST_ALLOC_FIELD_NUMBER: _ClassVar[int]
    HOST_FILE_FIELD_NUMBER: _ClassVar[int]
    PERSIST_FIELD_NUMBER: _ClassVar[int]
    READERS_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    cuda_alloc: CudaAlloc
    cuda_ipc: CudaIpc
    export_name: str
    export_to: _containers.RepeatedScalarFieldContainer[str]
    host_alloc: HostAlloc
    host_file: HostFile
    persist: bool
    read_only: bool
    readers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, host_alloc: _Optional[_Union[HostAlloc, _Mapping]] = ..., host_file: _Optional[_Union[HostFile, _Mapping]] = ..., cuda_alloc: _Optional[_Union[CudaAlloc, _Mapping]] = ..., cuda_ipc: _Optional[_Union[CudaIpc, _Mapping]] = ..., export_name: _Optional[str] = ..., export_to: _Optional[_Iterable[str]] = ..., readers: _Optional[_Iterable[str]] = ..., read_only: bool = ..., persist: bool = ...) -> None: ...

class RegisterRegionResponse(_message.Message):
    __slots__ = ["region"]
    REGION_FIELD_NUMBER: _ClassVar[int]
    region: Region
    def __init__(self, region: _Optional[_Union[Region, _Mapping]] = ...) -> None: ...

class ReleaseBlockRouteRequest(_message.Message):
    __slots__ = ["handle"]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    handle: int
    def __init__(self, handle: _Optional[int] = ...) -> None: ...

class ReleaseBlockRouteResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ReleaseTransferRequest(_message.Message):
    __slots__ = ["handle"]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    handle: int
    def __init__(self, handle: _Optional[int] = ...) -> None: ...

class ReleaseTransferResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ResolveLayoutRequest(_message.Message):
    __slots__ = ["access", "name"]
    ACCESS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    access: Access
    name: str
    def __init__(self, name: _Optional[str] = ..., access: _Optional[_Union[Access, str]] = ...) -> None: ...

class ResolveLayoutResponse(_message.Message):
    __slots__ = ["bound_age_ns", "name", "num_blocks", "regions", "segments"]
    BOUND_AGE_NS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    bound_age_ns: int
    name: str
    num_blocks: int
    regions: _containers.RepeatedCompositeFieldContainer[ResolvedLayoutRegion]
    segments: _containers.RepeatedCompositeFieldContainer[ResolvedSegment]
    def __init__(self, name: _Optional[str] = ..., num_blocks: _Optional[int] = ..., regions: _Optional[_Iterable[_Union[ResolvedLayoutRegion, _Mapping]]] = ..., segments: _Optional[_Iterable[_Union[ResolvedSegment, _Mapping]]] = ..., bound_age_ns: _Optional[int] = ...) -> None: ...

class ResolveRegionRequest(_message.Message):
    __slots__ = ["access", "name"]
    ACCESS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    access: Access
    name: str
    def __init__(self, name: _Optional[str] = ..., access: _Optional[_Union[Access, str]] = ...) -> None: ...

class ResolveRegionResponse(_message.Message):
    __slots__ = ["bound_age_ns", "device", "keys", "kind", "name", "size"]
    class KeysEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    BOUND_AGE_NS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    bound_age_ns: int
    device: int
    keys: _containers.ScalarMap[str, bytes]
    kind: MemoryKind
    name: str
    size: int
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ..., kind: _Optional[_Union[MemoryKind, str]] = ..., keys: _Optional[_Mapping[str, bytes]] = ..., device: _Optional[int] = ..., bound_age_ns: _Optional[int] = ...) -> None: ...

class ResolvedLayoutRegion(_message.Message):
    __slots__ = ["device", "keys", "kind", "name", "size"]
    class KeysEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    device: int
    keys: _containers.ScalarMap[str, bytes]
    kind: MemoryKind
    name: str
    size: int
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ..., keys: _Optional[_Mapping[str, bytes]] = ..., kind: _Optional[_Union[MemoryKind, str]] = ..., device: _Optional[int] = ...) -> None: ...

class ResolvedSegment(_message.Message):
    __slots__ = ["block_len", "offset", "region", "stride"]
    BLOCK_LEN_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    STRIDE_FIELD_NUMBER: _ClassVar[int]
    block_len: int
    offset: int
    region: int
    stride: int
    def __init__(self, region: _Optional[int] = ..., offset: _Optional[int] = ..., block_len: _Optional[int] = ..., stride: _Optional[int] = ...) -> None: ...

class SignalRequest(_message.Message):
    __slots__ = ["kind", "payload"]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    kind: str
    payload: bytes
    def __init__(self, kind: _Optional[str] = ..., payload: _Optional[bytes] = ...) -> None: ...

class SignalResponse(_message.Message):
    __slots__ = ["payload"]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    def __init__(self, payload: _Optional[bytes] = ...) -> None: ...

class StartTransferRequest(_message.Message):
    __slots__ = ["after", "batch", "blocks", "submit", "timeout_ms"]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    after: TransferTrigger
    batch: BatchTransferRequest
    blocks: TransferBlocksRequest
    submit: SubmitTransferRequest
    timeout_ms: int
    def __init__(self, batch: _Optional[_Union[BatchTransferRequest, _Mapping]] = ..., submit: _Optional[_Union[SubmitTransferRequest, _Mapping]] = ..., blocks: _Optional[_Union[TransferBlocksRequest, _Mapping]] = ..., timeout_ms: _Optional[int] = ..., after: _Optional[_Union[TransferTrigger, _Mapping]] = ...) -> None: ...

class StartTransferResponse(_message.Message):
    __slots__ = ["transfer_id"]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    transfer_id: int
    def __init__(self, transfer_id: _Optional[int] = ...) -> None: ...

class StartTransferResult(_message.Message):
    __slots__ = ["code", "message", "transfer_id"]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    transfer_id: int
    def __init__(self, transfer_id: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class StartTransfersRequest(_message.Message):
    __slots__ = ["requests"]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[StartTransferRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[StartTransferRequest, _Mapping]]] = ...) -> None: ...

class StartTransfersResponse(_message.Message):
    __slots__ = ["results"]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[StartTransferResult]
    def __init__(self, results: _Optional[_Iterable[_Union[StartTransferResult, _Mapping]]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ["batches_failed", "batches_received", "batches_sent", "bytes_received", "bytes_sent", "calibration", "cuda_available", "cuda_detail", "goroutines", "lease_holders", "max_descriptors", "node_name", "open_fds", "peer_address", "peers_connected", "persistent_regions", "regions", "transfers_held", "transfers_in_flight", "transports", "version"]
    BATCHES_FAILED_FIELD_NUMBER: _ClassVar[int]
    BATCHES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    BATCHES_SENT_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_FIELD_NUMBER: _ClassVar[int]
    CUDA_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    CUDA_DETAIL_FIELD_NUMBER: _ClassVar[int]
    GOROUTINES_FIELD_NUMBER: _ClassVar[int]
    LEASE_HOLDERS_FIELD_NUMBER: _ClassVar[int]
    MAX_DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    OPEN_FDS_FIELD_NUMBER: _ClassVar[int]
    PEERS_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PERSISTENT_REGIONS_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    TRANSFERS_HELD_FIELD_NUMBER: _ClassVar[int]
    TRANSFERS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORTS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    batches_failed: int
    batches_received: int
    batches_sent: int
    bytes_received: int
    bytes_sent: int
    calibration: Calibration
    cuda_available: bool
    cuda_detail: str
    goroutines: int
    lease_holders: int
    max_descriptors: int
    node_name: str
    open_fds: int
    peer_address: str
    peers_connected: int
    persistent_regions: int
    regions: int
    transfers_held: int
    transfers_in_flight: int
    transports: _containers.RepeatedCompositeFieldContainer[TransportStatus]
    version: str
    def __init__(self, version: _Optional[str] = ..., node_name: _Optional[str] = ..., peer_address: _Optional[str] = ..., transports: _Optional[_Iterable[_Union[TransportStatus, _Mapping]]] = ..., cuda_available: bool = ..., cuda_detail: _Optional[str] = ..., regions: _Optional[int] = ..., batches_sent: _Optional[int] = ..., batches_received: _Optional[int] = ..., bytes_sent: _Optional[int] = ..., bytes_received: _Optional[int] = ..., batches_failed: _Optional[int] = ..., max_descriptors: _Optional[int] = ..., peers_connected: _Optional[int] = ..., goroutines: _Optional[int] = ..., open_fds: _Optional[int] = ..., persistent_regions: _Optional[int] = ..., lease_holders: _Optional[int] = ..., transfers_in_flight: _Optional[int] = ..., transfers_held: _Optional[int] = ..., calibration: _Optional[_Union[Calibration, _Mapping]] = ...) -> None: ...

class SubmitStreamRequest(_message.Message):
    __slots__ = ["handle", "tag"]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    handle: int
    tag: int
    def __init__(self, tag: _Optional[int] = ..., handle: _Optional[int] = ...) -> None: ...

class SubmitStreamResponse(_message.Message):
    __slots__ = ["code", "message", "result", "tag"]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    result: BatchTransferResponse
    tag: int
    def __init__(self, tag: _Optional[int] = ..., result: _Optional[_Union[BatchTransferResponse, _Mapping]] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class SubmitTransferRequest(_message.Message):
    __slots__ = ["handle"]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    handle: int
    def __init__(self, handle: _Optional[int] = ...) -> None: ...

class TransferBlocksRequest(_message.Message):
    __slots__ = ["local_ids", "local_layout", "notification", "op", "peer", "remote_ids", "remote_layout", "timeout_ms", "transport", "transport_name"]
    LOCAL_IDS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATION_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    REMOTE_IDS_FIELD_NUMBER: _ClassVar[int]
    REMOTE_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_NAME_FIELD_NUMBER: _ClassVar[int]
    local_ids: bytes
    local_layout: str
    notification: bytes
    op: TransferOp
    peer: str
    remote_ids: bytes
    remote_layout: str
    timeout_ms: int
    transport: TransportKind
    transport_name: str
    def __init__(self, local_layout: _Optional[str] = ..., peer: _Optional[str] = ..., remote_layout: _Optional[str] = ..., local_ids: _Optional[bytes] = ..., remote_ids: _Optional[bytes] = ..., notification: _Optional[bytes] = ..., timeout_ms: _Optional[int] = ..., transport: _Optional[_Union[TransportKind, str]] = ..., op: _Optional[_Union[TransferOp, str]] = ..., transport_name: _Optional[str] = ...) -> None: ...

class TransferOutcome(_message.Message):
    __slots__ = ["code", "message", "result", "state", "transfer_id"]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    result: BatchTransferResponse
    state: TransferState
    transfer_id: int
    def __init__(self, transfer_id: _Optional[int] = ..., state: _Optional[_Union[TransferState, str]] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., result: _Optional[_Union[BatchTransferResponse, _Mapping]] = ...) -> None: ...

class TransferTrigger(_message.Message):
    __slots__ = ["counter_offset", "counter_region_id", "note_key", "note_region_id", "value"]
    COUNTER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COUNTER_REGION_ID_FIELD_NUMBER: _ClassVar[int]
    NOTE_KEY_FIELD_NUMBER: _ClassVar[int]
    NOTE_REGION_ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    counter_offset: int
    counter_region_id: str
    note_key: bytes
    note_region_id: str
    value: int
    def __init__(self, counter_region_id: _Optional[str] = ..., counter_offset: _Optional[int] = ..., value: _Optional[int] = ..., note_region_id: _Optional[str] = ..., note_key: _Optional[bytes] = ...) -> None: ...

class TransportStatus(_message.Message):
    __slots__ = ["available", "connections", "detail", "kind", "kind_name", "memory_regions", "queue_pairs", "rails"]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    KIND_NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_REGIONS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_PAIRS_FIELD_NUMBER: _ClassVar[int]
    RAILS_FIELD_NUMBER: _ClassVar[int]
    available: bool
    connections: int
    detail: str
    kind: TransportKind
    kind_name: str
    memory_regions: int
    queue_pairs: int
    rails: _containers.RepeatedCompositeFieldContainer[RailStatus]
    def __init__(self, kind: _Optional[_Union[TransportKind, str]] = ..., available: bool = ..., detail: _Optional[str] = ..., connections: _Optional[int] = ..., queue_pairs: _Optional[int] = ..., memory_regions: _Optional[int] = ..., rails: _Optional[_Iterable[_Union[RailStatus, _Mapping]]] = ..., kind_name: _Optional[str] = ...) -> None: ...

class WaitTransferRequest(_message.Message):
    __slots__ = ["timeout_ms", "transfer_id"]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    timeout_ms: int
    transfer_id: int
    def __init__(self, transfer_id: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class WaitTransfersRequest(_message.Message):
    __slots__ = ["any", "timeout_ms", "transfer_ids"]
    ANY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_IDS_FIELD_NUMBER: _ClassVar[int]
    any: bool
    timeout_ms: int
    transfer_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, transfer_ids: _Optional[_Iterable[int]] = ..., timeout_ms: _Optional[int] = ..., any: bool = ...) -> None: ...

class WarmTransferRequest(_message.Message):
    __slots__ = ["dst_region", "op", "peer", "src_region_id", "transport_name"]
    DST_REGION_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    SRC_REGION_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_NAME_FIELD_NUMBER: _ClassVar[int]
    dst_region: str
    op: TransferOp
    peer: str
    src_region_id: str
    transport_name: str
    def __init__(self, src_region_id: _Optional[str] = ..., peer: _Optional[str] = ..., dst_region: _Optional[str] = ..., op: _Optional[_Union[TransferOp, str]] = ..., transport_name: _Optional[str] = ...) -> None: ...

class WarmTransferResponse(_message.Message):
    __slots__ = ["elapsed_ns", "transport_name"]
    ELAPSED_NS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_NAME_FIELD_NUMBER: _ClassVar[int]
    elapsed_ns: int
    transport_name: str
    def __init__(self, transport_name: _Optional[str] = ..., elapsed_ns: _Optional[int] = ...) -> None: ...

class WatchNotificationsRequest(_message.Message):
    __slots__ = ["region_id"]
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    region_id: str
    def __init__(self, region_id: _Optional[str] = ...) -> None: ...

class WatchTransfersRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class MemoryKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class TransportKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class TransferOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class Access(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class ChecksumAlgorithm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class TransferState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
