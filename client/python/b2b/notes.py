"""Key notes (docs/notes.md): a notification that starts with a list of
keys. Landing on a region it reaches the region's watchers whole, as any
notification, and it also starts, in the daemon, every transfer armed on
the region with one of its keys (``after=b2b.on_note(region, key)``): a
pull that waits for its source's "ready" starts the moment the note lands,
with no round trip through this process."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union

from ._common import _invalid
from .v1 import b2b_pb2 as pb

KEY_MAGIC = b"\x00b2bkeys"
MAX_KEYS = 255
MAX_KEY_LEN = 64

Key = Union[bytes, str]


def _key(k: Key, what: str) -> bytes:
    b = k.encode() if isinstance(k, str) else bytes(k)
    if not 1 <= len(b) <= MAX_KEY_LEN:
        raise _invalid(f"{what} is {len(b)} bytes: want 1 to {MAX_KEY_LEN}")
    return b


def key_note(keys: Sequence[Key], payload: bytes = b"") -> bytes:
    """The notification bytes of a key note naming ``keys`` (1 to 255, each
    1 to 64 bytes; str is UTF-8), followed by ``payload``."""
    if isinstance(keys, (str, bytes, bytearray, memoryview)):  # one key, which would split into its characters
        raise _invalid(f"keys is one {type(keys).__name__} ({bytes(keys[:16]) if not isinstance(keys, str) else keys[:16]!r}): "
                       f"give a list of keys, e.g. key_note([key])")
    if not 1 <= len(keys) <= MAX_KEYS:
        raise _invalid(f"keys: {len(keys)} of them: want 1 to {MAX_KEYS}")
    out = bytearray(KEY_MAGIC)
    out.append(len(keys))
    for i, k in enumerate(keys):
        b = _key(k, f"keys[{i}]")
        out.append(len(b))
        out += b
    out += payload
    return bytes(out)


def parse_key_note(b: bytes) -> Optional[Tuple[List[bytes], bytes]]:
    """(keys, payload) of a key note; ``None`` if ``b`` is not one."""
    if not b.startswith(KEY_MAGIC) or len(b) <= len(KEY_MAGIC):
        return None
    n, at = b[len(KEY_MAGIC)], len(KEY_MAGIC) + 1
    if n == 0:
        return None
    keys = []
    for _ in range(n):
        if at >= len(b):
            return None
        ln = b[at]
        at += 1
        if ln == 0 or ln > MAX_KEY_LEN or at + ln > len(b):
            return None
        keys.append(bytes(b[at:at + ln]))
        at += ln
    return keys, bytes(b[at:])


def on_note(region: Any, key: Key) -> Any:
    """``after=`` for a transfer that starts once a key note naming ``key``
    lands on ``region`` (a region of this client's: a :class:`Region` or its
    id)."""
    rid = region if isinstance(region, str) else getattr(region, "id", None)
    if not isinstance(rid, str) or not rid:
        raise _invalid(f"on_note: region {region!r}: want a b2b Region or its id")
    return pb.TransferTrigger(note_region_id=rid, note_key=_key(key, "key"))


__all__ = ["KEY_MAGIC", "key_note", "on_note", "parse_key_note"]
