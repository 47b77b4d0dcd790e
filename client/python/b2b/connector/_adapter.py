"""Where the connector goes below b2b.kv: b2b.kv cannot yet export a
layout readable (``readers=``) nor pull (``op="read"``), so these use the
client's lower-level calls. When b2b.kv has both, only this module changes."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import b2b

from .channel import encode


def export_pool(client: Any, layout: Any, prefix: str) -> None:
    """Export every region under a b2b.kv layout that is not exported yet,
    writable and readable by every peer (decode reads it, prefill writes it)."""
    for r in layout.regions:
        if not r.export_name:
            client.export(r, f"{prefix}.{r.id}", readers=["*"])


def register_view(client: Any, name: str, segments: Sequence[Tuple[Any, int, int, int]], num_blocks: int,
                  export_name: str = "") -> None:
    """A layout over ``(region, offset, block_len, stride)`` segments of
    regions already registered; exported readable and writable when named."""
    client.register_layout(name, list(segments), num_blocks, export_name=export_name,
                           readers=["*"] if export_name else ())


class Handle:
    """A started transfer as the worker sees it: ``ended`` (set by
    :func:`poll`), ``error`` (None unless it failed or was cancelled),
    ``wire_ns`` of a done one, ``cancel()``. Wraps the client's handle so that
    a change of handle type stays in this module."""

    __slots__ = ("h", "ended", "tallied", "then", "_times")

    def __init__(self, h: Any) -> None:
        self.h = h
        self.ended = False
        self.tallied = False  # its wire time was counted
        self.then: Any = None  # the worker's: a note to send once it ended
        self._times: Optional[Tuple[int, int, int, Optional[int]]] = None

    @property
    def error(self) -> Any:
        return self.h.error if self.ended else None

    def times(self) -> Tuple[int, int, int, Optional[int]]:
        """A done transfer's daemon times, read once: when its trigger
        fired, its first post and its last landing (wall ns; 0: unknown),
        and its wire phase (ns; None: not done). Several requests share a
        read, so each reads them here rather than through the result."""
        t = self._times
        if t is None:
            if not self.ended or self.h.error is not None:
                return 0, 0, 0, None
            # The daemon's marks, not h.result: a TransferResult is a
            # frozen dataclass of 19 fields, 25-30 us on a loaded 2-core
            # host, once per read on the handover's path; a ring handle
            # has them without making its outcome's message at all.
            t = self.h._marks() or (0, 0, 0, None)
            self._times = t
        return t

    @property
    def wire_ns(self) -> Optional[int]:
        return self.times()[3]

    @property
    def trigger_seen_ns(self) -> int:
        """When the daemon saw a triggered transfer's trigger fire (wall ns; 0: unknown)."""
        return self.times()[0]

    @property
    def posted_ns(self) -> int:
        """When the daemon posted the first write (wall ns; 0: unknown)."""
        return self.times()[1]

    @property
    def landed_ns(self) -> int:
        """When the daemon saw the last byte land (wall ns; 0: unknown)."""
        return self.times()[2]

    def cancel(self) -> None:
        if not self.ended:
            self.h.cancel()
            self.ended = True


def poll(client: Any, handles: Sequence[Handle], extra: Sequence[Any] = ()) -> None:
    """One poll for every handle that has not ended, and the client's own
    handles ``extra`` (the channel's note writes) in the same call."""
    ask = [x for x in handles if not x.ended]
    if ask or extra:
        done = client.poll([x.h for x in ask] + list(extra))
        for x, d in zip(ask, done):
            x.ended = bool(d)


def start_many(client: Any, moves: Sequence[dict], timeout: float, transport: Optional[str]) -> List[Any]:
    """Start every move (``local``, ``peer``, ``remote``, ``lids``, ``rids``,
    ``op``, ``note``) in one StartTransfers call: an engine step's starts
    cost one daemon round trip whatever their number. Returns, per move, a
    :class:`Handle`, or the exception that refused it (the others run). A
    failure of the call itself (our daemon unreachable) raises."""
    if not moves:
        return []
    items = [b2b.Blocks(m["local"], m["peer"], m["remote"], m["lids"], m["rids"], op=m["op"], transport=transport,
                        notification=None if m.get("note") is None else encode(m["note"]), after=m.get("after"))
             for m in moves]
    out: List[Any] = []
    for h in client.start_many(items, timeout):
        out.append(h.error if h.id == 0 else Handle(h))
    return out


def start_blocks(client: Any, local_layout: str, peer: str, remote_layout: str, local_ids: Any, remote_ids: Any, *,
                 op: str, note: Optional[dict], timeout: float, transport: Optional[str]) -> Any:
    """Start a block-id transfer (``op``: "read" pulls, "write" pushes) and
    return its handle (``done()``, ``wait()``, ``cancel()``, ``error``)."""
    return Handle(client.transfer_blocks(local_layout, peer, remote_layout, local_ids, remote_ids, timeout=timeout,
                                         transport=transport, op=op, wait=False,
                                         notification=None if note is None else encode(note)))


__all__: List[str] = ["Handle", "export_pool", "poll", "register_view", "start_blocks", "start_many"]
