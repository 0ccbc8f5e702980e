"""Durations as the reasons of events say them (timelines, status, watch lines).

One rule for every duration in a reason, so none reads ``grace 0.774663 s``
beside ``grace 5 s`` (a newcomer's trial, stop 33: a boot resuming a stop in
flight recorded what was left of its grace, a float, and the reason showed it
unrounded). The event keeps the exact value (it drives timers and replay);
only the text is rounded.
"""

from __future__ import annotations

import math

__all__ = ["seconds"]


def seconds(value: float) -> str:
    """``value`` seconds for a reason: three significant digits, whole seconds from
    100 s up, trailing zeros dropped, never an exponent: ``0.775 s``, ``5 s``,
    ``2.5 s``, ``12.3 s``, ``300 s``, ``0.0004 s``."""
    if not math.isfinite(value):
        return f"{value} s"
    size = abs(value)
    if size >= 100 or size == 0:
        return f"{value:.0f} s"
    digits = max(0, 2 - math.floor(math.log10(size)))
    text = f"{round(value, digits):.{digits}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return f"{text} s"
