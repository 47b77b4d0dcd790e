"""Constants and argument checks the client modules share: the daemon's
default socket, message limits, enum names, the channel target and TLS.
"""

from __future__ import annotations

import ipaddress
from typing import List, Optional, Sequence, Tuple, Union

import grpc

from .errors import InvalidArgumentError
from .v1 import b2b_pb2 as pb


#: The daemon's default local API socket.
DEFAULT_SOCKET = "/run/b2bd/b2bd.sock"

#: gRPC message size limit, both ways: room for descriptor lists of a million blocks.
MAX_MESSAGE_BYTES = 128 << 20

_TRANSPORT_BY_NAME = {
    "": pb.TRANSPORT_KIND_UNSPECIFIED,
    "auto": pb.TRANSPORT_KIND_UNSPECIFIED,
    "tcp": pb.TRANSPORT_KIND_TCP,
    "verbs": pb.TRANSPORT_KIND_VERBS,
    "local": pb.TRANSPORT_KIND_LOCAL,
}
_TRANSPORT_NAME = {
    pb.TRANSPORT_KIND_UNSPECIFIED: "unspecified",
    pb.TRANSPORT_KIND_TCP: "tcp",
    pb.TRANSPORT_KIND_VERBS: "verbs",
    pb.TRANSPORT_KIND_LOCAL: "local",
}
_MEMORY_NAME = {
    pb.MEMORY_KIND_UNSPECIFIED: "unspecified",
    pb.MEMORY_KIND_HOST: "host",
    pb.MEMORY_KIND_CUDA: "cuda",
}
_ALGORITHM_BY_NAME = {
    "crc32c": pb.CHECKSUM_ALGORITHM_CRC32C,
    "xxh64": pb.CHECKSUM_ALGORITHM_XXH64,
}
_ALGORITHM_NAME = {
    pb.CHECKSUM_ALGORITHM_UNSPECIFIED: "crc32c",
    pb.CHECKSUM_ALGORITHM_CRC32C: "crc32c",
    pb.CHECKSUM_ALGORITHM_XXH64: "xxh64",
}


def _invalid(msg: str) -> InvalidArgumentError:
    return InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, msg)


def _target(address: str) -> str:
    """A gRPC target for a socket path, ``unix:`` URI or ``host:port``."""
    if not isinstance(address, str) or not address:
        raise TypeError("address must be a non-empty str: a socket path, unix:///path or host:port")
    if address.startswith("/"):
        return "unix://" + address
    return address


def _host_port(address: str) -> Optional[Tuple[str, str]]:
    """(host, port) of a ``host:port`` or ``[v6]:port`` address; None for a
    Unix socket path or URI."""
    if address.startswith("/") or address.startswith("unix:"):
        return None
    rest = address.split("://", 1)[1] if "://" in address else address  # dns:///host:port
    rest = rest.lstrip("/")
    if rest.startswith("["):
        host, _, port = rest[1:].partition("]")
        return host, port.lstrip(":")
    host, sep, port = rest.rpartition(":")
    return (host, port) if sep else (rest, "")


def _is_loopback(host: str) -> bool:
    """As the daemon's auth.IsLoopback: "localhost" or a loopback IP literal."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _read_pem(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise _invalid(f"{what} {path!r}: cannot read it: {e.strerror or e}") from None


def _tls_credentials(
    address: str, ca: Optional[str], cert: Optional[str], key: Optional[str], server_name: Optional[str]
) -> Optional[grpc.ChannelCredentials]:
    """Mutual-TLS credentials for a TCP address, as the Go client's
    auth.LoadPeerTLS + ClientFor; None for plaintext (a socket, or loopback)."""
    given = {"tls_ca": ca, "tls_cert": cert, "tls_key": key}
    hp = _host_port(address)
    if not any(given.values()):
        if server_name:
            raise _invalid("tls_server_name is set without tls_ca, tls_cert and tls_key")
        if hp is not None and not _is_loopback(hp[0]):
            raise _invalid(
                f"address {address!r} is not loopback: b2bd serves its API off loopback only over mutual TLS; "
                "give tls_ca, tls_cert and tls_key (the daemon's --tls-* files or a certificate from the same CA)"
            )
        return None
    missing = [k for k, v in given.items() if not v]
    if missing:
        raise _invalid(f"TLS needs tls_ca, tls_cert and tls_key together: {', '.join(missing)} missing")
    if hp is None:
        raise _invalid(
            f"address {address!r} is a Unix socket: TLS applies to a host:port address (--api-listen); "
            "drop tls_ca, tls_cert and tls_key"
        )
    return grpc.ssl_channel_credentials(
        root_certificates=_read_pem(ca, "tls_ca"),
        private_key=_read_pem(key, "tls_key"),
        certificate_chain=_read_pem(cert, "tls_cert"),
    )


def _transport(t: Union[None, str, int]) -> int:
    if t is None:
        return pb.TRANSPORT_KIND_UNSPECIFIED
    if isinstance(t, str):
        try:
            return _TRANSPORT_BY_NAME[t.lower()]
        except KeyError:
            raise _invalid(
                f"transport {t!r}: want 'auto', 'tcp', 'verbs', 'local' or None (None and 'auto': the daemons choose)"
            ) from None
    if isinstance(t, int) and t in _TRANSPORT_NAME:
        return int(t)
    raise _invalid(f"transport {t!r}: want 'auto', 'tcp', 'verbs', 'local', None or a TransportKind value")


def _op(op: Union[None, str, int]) -> int:
    """A transfer's direction: "write" (push, the default) or "read" (pull)."""
    if op is None or op == "write":
        return pb.TRANSFER_OP_WRITE
    if op == "read":
        return pb.TRANSFER_OP_READ
    if isinstance(op, int) and op in (pb.TRANSFER_OP_WRITE, pb.TRANSFER_OP_READ):
        return int(op)
    raise _invalid(f"op {op!r}: want 'write' (push) or 'read' (pull)")


def _grants(readers: Sequence[str]) -> List[str]:
    if isinstance(readers, str):
        raise TypeError("readers: expected a sequence of peer identities (or ['*']), got a str")
    return list(readers)
