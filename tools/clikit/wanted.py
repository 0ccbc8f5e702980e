"""What an instance is wanted to be, in one set of words for ``status``'s WANTED
column and the verbs' one-line answers (``place``, ``start``, ``stop``, ...,
``run``'s resumed lines, ``fleet place``).

A resting instance (evicted, expired or placed on demand) is started by the
next request or start for it; its desired state reads ``stopped`` though
nobody stopped it, so ``(wanted stopped)`` misread it (a newcomer's trial,
stop 34: ``place --on-demand`` printed ``resting (wanted stopped)``). It is
said by why it rests instead: WANTED ``on-demand``, ``evicted`` or
``expired``; a line ``resting, on demand``.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["state_words", "wanted"]

#: WANTED of a resting instance, by the start of its ``rest_reason``; any other
#: reason (``placed on demand``) is ``on-demand``.
_RESTS_AS = (("evicted", "evicted"), ("idle", "expired"))


class Wanted(Protocol):
    """What the words are made of (an InstanceView or an InstanceRecord)."""

    @property
    def lifecycle(self) -> str: ...
    @property
    def desired(self) -> str: ...
    @property
    def resting(self) -> bool: ...
    @property
    def rest_reason(self) -> str | None: ...


def _rests(r: Wanted) -> bool:
    return bool(r.resting) or r.lifecycle == "resting"


def wanted(r: Wanted) -> str:
    """WANTED: ``evicted`` or ``expired`` for an instance that rests for that,
    ``on-demand`` for one placed on demand that rests since; else the desired
    state (``running``, ``stopped``)."""
    if not _rests(r):
        return r.desired
    why = r.rest_reason or ""
    return next((w for start, w in _RESTS_AS if why.startswith(start)), "on-demand")


def state_words(r: Wanted, already: bool = False) -> str:
    """The state for a one-line answer: ``running (wanted running)``, ``stopped
    (wanted running)``, ``resting, on demand``, ``resting, evicted``; ``already
    running (wanted running)`` for a verb that found it so."""
    state = f"already {r.lifecycle}" if already else str(r.lifecycle)
    if _rests(r):
        return f"{state}, {wanted(r).replace('-', ' ')}"
    return f"{state} (wanted {r.desired})"
