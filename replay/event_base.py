"""The base every chain event derives from: the chain's event shape.

A frozen msgspec Struct tagged by its ``event`` field (the chain ``kind``), with
the payload version ``v`` (1: current; older ones are upgraded on read,
replay/upcast.py). Untracked by the garbage collector (``gc=False``): an event
holds no reference cycle, and replay decodes one per stored row.
"""

from __future__ import annotations

import msgspec

__all__ = ["EventBase"]


class EventBase(msgspec.Struct, frozen=True, kw_only=True, tag_field="event", gc=False):
    """A chain event: subclasses give their ``tag`` (the kind) and their fields."""

    v: int = 1
