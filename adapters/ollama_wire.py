"""Ollama's wire types: what its answers say, read without trusting them.

Source: Ollama's ``docs/api.md`` ("List Running Models": ``GET /api/ps``,
``name``/``model``, ``size``, ``size_vram``, ``expires_at``) and its tags,
where ``x`` names ``x:latest``. Nothing here does I/O: :mod:`.ollama` (the API
client) and :mod:`.probe` (the probe's report) read answers with it.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

import msgspec

__all__ = ["MAX_BYTES", "RunningModel", "byte_count", "running_models", "same_model"]


def same_model(a: str, b: str) -> bool:
    """Whether two Ollama tags name the same model (``x`` is ``x:latest``)."""
    return a.removesuffix(":latest") == b.removesuffix(":latest")


class RunningModel(msgspec.Struct, frozen=True):
    """One model Ollama holds in memory, as ``GET /api/ps`` lists it (Ollama's
    docs/api.md "List Running Models").

    Attributes:
        name: the model's tag (``name``, else ``model``).
        size_bytes: ``size``: the memory it takes (RAM and VRAM), bytes; 0 when absent.
        size_vram_bytes: ``size_vram``: the part of it in VRAM, bytes; 0 when absent.
        expires_at_ns: ``expires_at`` (RFC 3339) as ns since the epoch, UTC;
            None when absent or unreadable. Ollama drops the model then unless
            a request renews it (its ``keep_alive``).
    """

    name: str
    size_bytes: int = 0
    size_vram_bytes: int = 0
    expires_at_ns: int | None = None


def running_models(doc: Any) -> list[RunningModel] | None:
    """The entries of an ``/api/ps`` answer; None when it is not a model list."""
    items = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        return None
    found: list[RunningModel] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        name = next((item[f] for f in ("name", "model") if isinstance(item.get(f), str)), None)
        if name is None:
            continue
        found.append(
            RunningModel(
                name=name,
                size_bytes=byte_count(item.get("size")),
                size_vram_bytes=byte_count(item.get("size_vram")),
                expires_at_ns=_rfc3339_ns(item.get("expires_at")),
            )
        )
    return found


#: The largest size taken from Ollama, bytes (8 PiB, more than any node's memory):
#: a larger one is taken as this, so it fits no budget and still fits the chain's
#: signed 64-bit integers once a reservation's overhead is added.
MAX_BYTES = 2**53 - 1


def byte_count(value: Any) -> int:
    """A size as Ollama gives it (``size``, ``size_vram``): a positive JSON
    integer, bytes, at most :data:`MAX_BYTES`; 0 for anything else (absent,
    zero, negative, not a number)."""
    whole = isinstance(value, int) and not isinstance(value, bool)
    return min(value, MAX_BYTES) if whole and value > 0 else 0


_FAR = datetime.datetime(2200, 1, 1, tzinfo=datetime.UTC)  # beyond: "forever"


def _rfc3339_ns(value: Any) -> int | None:
    """ns since the epoch of an RFC 3339 time as Go writes it (nanosecond fractions,
    ``Z`` or an offset); None when it is not one, or too far away to matter
    (Ollama shows "forever" as a date thousands of years ahead)."""
    if not isinstance(value, str):
        return None
    m = _RFC3339.fullmatch(value.strip())
    if m is None:
        return None
    try:
        base = datetime.datetime.fromisoformat(
            m["base"] + (m["zone"] or "+00:00").replace("Z", "+00:00")
        )
    except ValueError:
        return None
    if base.tzinfo is None or base >= _FAR:
        return None
    fraction = (m["frac"] or "").ljust(9, "0")[:9]
    return int(base.timestamp()) * 10**9 + int(fraction or "0")


_RFC3339 = re.compile(
    r"(?P<base>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2})"
    r"(?:\.(?P<frac>\d+))?(?P<zone>Z|[+-]\d{2}:\d{2})"
)
