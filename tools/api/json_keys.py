"""A key given twice in one object of a JSON body, which msgspec decodes silently
(the last one wins) and which would then record a value the caller may not have
meant (a newcomer's trial, stop 34: ``{"spec": {"port": 8080, ..., "port": 9090}}``
placed on 9090 without a word). RFC 8259 section 4: names "SHOULD be unique";
with duplicates "the behavior ... is unpredictable". The control API refuses them
(400 naming the key and where it is: tools/api/strict.py).

msgspec has no hook for it, so the body is scanned again by the standard
library's C scanner (``json.loads`` with an ``object_pairs_hook`` that builds
nothing): about 8 us for a typical placement body (286 bytes), beside msgspec's
1.5 us and the whole body check's 16 us before it (bench/body_check.py,
bench/README.md "stop 34"). Only a body found to hold a duplicate is parsed a
third time, to name the object's path.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["duplicated_key"]


class _Twice(Exception):
    """A duplicate was found (the fast scan stops at the first)."""


def _check(pairs: list[tuple[str, Any]]) -> None:
    if len(pairs) > 1 and len(dict(pairs)) != len(pairs):
        raise _Twice


class _Pairs(list[tuple[str, Any]]):
    """An object as its pairs, in order, duplicates kept (the slow pass)."""


def duplicated_key(body: bytes) -> str | None:
    """The first key given twice in one object of ``body`` (JSON text msgspec
    decoded), with its path: ``"spec.port"``, ``"start"`` at the top level,
    ``"spec.env.HOME"``, ``"messages.0.role"``; None when every object's keys are
    distinct (or the text does not parse here)."""
    try:
        json.loads(body, object_pairs_hook=_check)
    except _Twice:
        return _locate(json.loads(body, object_pairs_hook=_Pairs), "")
    except (ValueError, RecursionError):
        return None  # msgspec's decode already judged the text
    return None


def _locate(value: Any, path: str) -> str | None:
    """Where the first duplicate is, depth first in the body's order."""
    if isinstance(value, _Pairs):
        seen: set[str] = set()
        for key, _ in value:
            if key in seen:
                return _joined(path, key)
            seen.add(key)
        items: list[tuple[str, Any]] = [(key, inner) for key, inner in value]
    elif isinstance(value, list):
        items = [(str(i), inner) for i, inner in enumerate(value)]
    else:
        return None
    for key, inner in items:
        found = _locate(inner, _joined(path, key))
        if found is not None:
            return found
    return None


def _joined(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
