"""Reading old event payloads: upcasters, one version step at a time.

The chain is forever, so replay must read every payload it ever stored: when
an event's shape changes, its old version is upgraded on read by a chain of
small functions registered in :data:`UPCASTERS` (STYLE.md, "Events and state").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from infervisor.chain import StoredEvent

__all__ = ["UPCASTERS", "EventDecodeError", "upcast"]

#: ``(kind, from_version) -> function`` upgrading a raw payload mapping one version.
UPCASTERS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {}


class EventDecodeError(Exception):
    """A stored payload is not a known event (names seq, kind and the problem).

    Attributes:
        seq: the event's seq (None when not known).
        kind: the event's kind (None when not known).
    """

    def __init__(self, message: str, *, seq: int | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.seq = seq
        self.kind = kind


def upcast(stored: StoredEvent, raw: dict[str, Any], into: Any) -> Any:
    """Upgrade the raw payload of `stored` to the current version and convert it
    to `into` (the event union), one :data:`UPCASTERS` step per version.

    Raises:
        EventDecodeError: the payload's tag disagrees with the header, a newer
            version than this code knows, or no upcaster for a step.
    """
    if raw.get("event", stored.kind) != stored.kind:
        raise EventDecodeError(
            f"seq {stored.seq}: payload says {raw.get('event')!r}, the header says {stored.kind!r}",
            seq=stored.seq,
            kind=stored.kind,
        )
    version = int(raw.get("v", 0))
    if version > 1:
        raise EventDecodeError(
            f"seq {stored.seq}: {stored.kind} v{version} was written by a newer infervisor",
            seq=stored.seq,
            kind=stored.kind,
        )
    while version < 1:
        step = UPCASTERS.get((stored.kind, version))
        if step is None:
            raise EventDecodeError(
                f"seq {stored.seq}: no upcaster for {stored.kind} v{version}",
                seq=stored.seq,
                kind=stored.kind,
            )
        raw = step(raw)
        version = int(raw.get("v", version + 1))
    raw["event"] = stored.kind
    return msgspec.convert(raw, into)
