"""Ollama's ``keep_alive``: the forms it reads, checked before anything is sent.

Source: Ollama's ``api/types.go`` ``Duration.UnmarshalJSON``: a JSON number of
seconds (negative: forever) or a Go duration string (``time.ParseDuration``; a
string without a unit such as ``"-1"`` is refused with a 400), and
``reference/infer_config.rs.txt`` (``keep_alive``: ``5m``, ``30m``, ``-1``;
default ``30m``).

The keep_alive a managed instance sends is :func:`spec_keep_alive`: a pure
function of its spec's ``idle_ttl_s`` and the node's configured keep_alive.

Errors: :class:`~.errors.SpecError`, naming the value and the allowed forms.
"""

from __future__ import annotations

import math
import re

from .errors import SpecError
from .spec import MAX_IDLE_TTL_S

__all__ = [
    "DEFAULT_KEEP_ALIVE",
    "KEEP_ALIVE_MARGIN_S",
    "MAX_IDLE_TTL_S",
    "is_zero",
    "load_keep_alive",
    "parse_keep_alive",
    "spec_keep_alive",
]

DEFAULT_KEEP_ALIVE = "30m"
"""keep_alive sent with a load when none is configured (the reference's default)."""

KEEP_ALIVE_MARGIN_S = 60
"""Seconds Ollama keeps a model beyond the instance's ``idle_ttl_s`` (see
:func:`spec_keep_alive`)."""

_FOREVER_NS = 2**63 - 1  # Go's largest time.Duration
_UNIT_NS = {"ns": 1, "us": 10**3, "µs": 10**3, "μs": 10**3, "ms": 10**6, "s": 10**9}
_UNIT_NS |= {"m": 60 * 10**9, "h": 3600 * 10**9}
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_UNIT = r"(?:ns|us|µs|μs|ms|s|m|h)"
_DURATION = re.compile(rf"[-+]?(?:0|(?:{_NUMBER}{_UNIT})+)")
_PART = re.compile(rf"({_NUMBER})({_UNIT})")
_INTEGER = re.compile(r"[-+]?[0-9]+")
_FORMS = (
    "a whole number of seconds (3600; negative keeps the model loaded forever; 0 unloads it) "
    "or a Go duration string such as '30m', '1h30m', '10s' or '-1m' "
    "(units ns, us, ms, s, m, h; a negative duration keeps the model loaded forever)"
)


def parse_keep_alive(value: str | int | float) -> str | int:
    """Check a keep_alive and give the value to send to Ollama.

    Whole numbers (also as strings: ``"-1"``, ``"3600"``) become an int, sent
    as a JSON number, because Ollama refuses a string without a unit. Duration
    strings are kept as they are. Fractions of a second as a number are
    refused: older Ollama versions truncate them (``0.5`` would unload).

    Raises:
        SpecError: anything else (booleans, NaN, ``"5 m"``, ``"10x"``, a
            duration Go cannot hold), naming the value and the allowed forms.
    """
    invalid = SpecError(f"keep_alive {value!r} is not valid: use {_FORMS}")
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise invalid
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise invalid
    if isinstance(value, str) and not _INTEGER.fullmatch(value):
        if _duration_ns(value) is None:
            raise invalid
        return value
    seconds = int(value)
    if seconds > _FOREVER_NS // 10**9:  # Go cannot hold it as a duration
        raise invalid
    return seconds


def _duration_ns(text: str) -> int | None:
    """Nanoseconds of a Go duration string, or None when Go would refuse it."""
    if not _DURATION.fullmatch(text):
        return None
    total = 0.0
    for number, unit in _PART.findall(text):
        total += float(number) * _UNIT_NS[unit]
    if total > _FOREVER_NS:
        return None
    return -int(total) if text.startswith("-") else int(total)


def is_zero(keep: str | int) -> bool:
    """Whether a checked keep_alive (:func:`parse_keep_alive`) is zero: an unload."""
    return keep == 0 if isinstance(keep, int) else _duration_ns(keep) == 0


def load_keep_alive(keep_alive: str | int | float) -> str | int:
    """:func:`parse_keep_alive` for a load: also refuses a zero duration (``0``,
    ``"0"``, ``"0s"``, ``0.0``, ``"-0m"``), with which Ollama unloads the model
    as soon as it is loaded. Negative values are Ollama's "forever" (its API
    docs: "any negative number which will keep the model loaded in memory").

    Raises:
        SpecError: invalid (see :func:`parse_keep_alive`) or zero, with the reason.
    """
    keep = parse_keep_alive(keep_alive)
    if is_zero(keep):
        raise SpecError(
            f"keep_alive {keep_alive!r} would unload the model as soon as it is loaded: "
            "give a positive duration, or a negative one to keep it loaded forever"
        )
    return keep


def spec_keep_alive(idle_ttl_s: float | None, configured: str | int | float) -> str | int:
    """The keep_alive a managed Ollama instance sends with every load, from its
    spec's ``idle_ttl_s`` (seconds, or None) and the node's configured
    ``ollama_keep_alive`` (``[node]``; default ``30m``).

    ``idle_ttl_s`` None: ``configured``, checked for a load (the behaviour
    before ``idle_ttl_s`` existed; an Ollama model the node loaded stays
    loaded that long after its last request).

    ``idle_ttl_s`` set: the node itself releases the instance (``resting``,
    ``residency.expired``) ``idle_ttl_s`` after its last request, by unloading
    the model. Ollama's own timer must then never fire first, or the model is
    dropped behind the node's back (recorded as a drop, "before its keep_alive
    ran out", and loaded again under the restart policy: a wasted load). But
    Ollama's timer is also what frees the memory when the node is gone (killed,
    or down for longer than that), so it must not be forever. Hence the TTL
    rounded up to whole seconds (Ollama refuses fractions in old versions:
    :func:`parse_keep_alive`) plus :data:`KEEP_ALIVE_MARGIN_S` (60 s): Ollama
    starts its timer when a request ends (``server/sched.go``: the runner's
    reference count drops to 0), no later than the node learns of that end, so
    the margin only has to cover the node's own delay in acting on an expiry
    (its timer or reconcile tick, the append, the unload request), which is
    seconds. A node killed for good leaves the model loaded at most
    ``idle_ttl_s`` + 60 s after its last request.

    Ollama applies a keep_alive per request: a request that carries none gets
    Ollama's default (``OLLAMA_KEEP_ALIVE``, 5 minutes) from its end, and
    Ollama's OpenAI-compatible routes carry none. Whoever forwards a request
    to the model must send this same value for it to hold.

    Returns:
        A whole number of seconds (int) or, for ``idle_ttl_s`` None, the
        configured value in the form :func:`load_keep_alive` gives.

    Raises:
        SpecError: ``idle_ttl_s`` is not a number in (0, 7 days] (field
            ``idle_ttl_s``), or ``configured`` is not a valid non-zero keep_alive.
    """
    if idle_ttl_s is None:
        return load_keep_alive(configured)
    if (
        isinstance(idle_ttl_s, bool)
        or not isinstance(idle_ttl_s, int | float)
        or not math.isfinite(idle_ttl_s)
        or not 0 < idle_ttl_s <= MAX_IDLE_TTL_S
    ):
        raise SpecError(
            f"idle_ttl_s {idle_ttl_s!r}: allowed a number of seconds > 0 and at most "
            f"{MAX_IDLE_TTL_S:g} (7 days), or none",
            field="idle_ttl_s",
        )
    return math.ceil(idle_ttl_s) + KEEP_ALIVE_MARGIN_S
