"""The residency events (issue 21): what is loaded within the node's memory
budget, and why. Members of :data:`.events.Event` (the chain's one union) and
re-exported there; their own module keeps events.py short.

Every one has an instance as its subject. ``residency.evicted`` and
``residency.expired`` are appended in the transaction of the instance's
``instance.stop_requested`` (``then = "rest"``), which moves it; the others
change no lifecycle state. Byte counts are bytes; times are ns since the
epoch, UTC. Decided by ``actors/core/residency.py``.
"""

from __future__ import annotations

import msgspec

from .event_base import EventBase

__all__ = [
    "REFUSAL_WINDOW_S",
    "Candidate",
    "ResidencyBusy",
    "ResidencyDemanded",
    "ResidencyEvicted",
    "ResidencyExpired",
    "ResidencyIdle",
    "ResidencyRefused",
    "no_room",
]


class Candidate(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One instance holding memory when an eviction was weighed, as it was then.

    Attributes:
        instance_id: the instance.
        last_use_ns: when it was last used (None: never).
        priority: its spec's priority (-1000..1000).
        pinned: never evicted.
        held_bytes: what it held in the ledger, bytes.
        busy: it was serving a request.
        chosen: it was evicted.
        why_not: why it could not be evicted ("" when it could).
    """

    instance_id: str
    last_use_ns: int | None
    priority: int
    pinned: bool
    held_bytes: int
    busy: bool
    chosen: bool
    why_not: str = ""


class ResidencyDemanded(EventBase, frozen=True, tag="residency.demanded"):
    """A start a request or verb asked for is made: in the transaction of its
    ``instance.starting`` when it fits, or before the evictions that make room
    for it. ``request``: the request id (or ``verb``); ``model``: the name asked
    for; ``by``: who asked. The instance is wanted running from here (a node
    killed before the start decides it again at boot); its start is a use
    (``last_use_ns``). A refused start records none."""

    request: str
    model: str
    by: str


class ResidencyEvicted(EventBase, frozen=True, tag="residency.evicted"):
    """The instance is evicted to make room for ``for_instance``, which needs
    ``needed_bytes`` beside ``in_use_bytes`` of ``budget_bytes``; this eviction
    frees ``freed_bytes``. ``candidates``: every holder weighed, least recently
    used first, the ones chosen marked. ``cause``: why ``for_instance`` starts
    (``request ID by WHO``, ``a start by WHO``, ``its restart after an exit
    (attempt N)``, ``its start at boot ...``; empty in chains written before
    stop 32). Its stop (``then = "rest"``) is in the same transaction."""

    for_instance: str
    needed_bytes: int
    freed_bytes: int
    budget_bytes: int
    in_use_bytes: int
    candidates: list[Candidate]
    cause: str = ""


class ResidencyExpired(EventBase, frozen=True, tag="residency.expired"):
    """Idle since ``idle_since_ns`` for longer than its ``idle_ttl_s`` (seconds):
    released to ``resting``. Its stop (``then = "rest"``) is in the same transaction."""

    idle_since_ns: int
    idle_ttl_s: float


class ResidencyRefused(EventBase, frozen=True, tag="residency.refused"):
    """A start of the instance did not fit and nothing could be evicted: it needs
    ``needed_bytes`` beside ``in_use_bytes`` of ``budget_bytes``; ``held`` is the
    ledger then (instance id to bytes), ``candidates`` why none could go. The
    start that asked is refused (the instance stays as it was, and it is no
    use). Identical refusals (the same numbers) within
    :data:`REFUSAL_WINDOW_S` of it record nothing; ``folded`` counts those
    since the previous ``residency.refused`` of the instance, as far as the
    node counted them (a node restart counts from 0)."""

    needed_bytes: int
    budget_bytes: int
    in_use_bytes: int
    held: dict[str, int]
    candidates: list[Candidate]
    folded: int = 0


#: How long identical refusals of one instance's start fold into the last
#: ``residency.refused``, seconds (counted in metrics, not chain rows).
REFUSAL_WINDOW_S = 60.0


class ResidencyBusy(EventBase, frozen=True, tag="residency.busy"):
    """The instance began serving requests (it was idle): it is not evicted or
    expired while busy. Recorded once per busy spell, not per request."""


class ResidencyIdle(EventBase, frozen=True, tag="residency.idle"):
    """The instance serves no request since ``idle_since_ns``: its last use."""

    idle_since_ns: int


def no_room(needed_bytes: int, in_use_bytes: int, budget_bytes: int) -> str:
    """The refusal a ``residency.refused`` folds into the instance's ``refusal``
    (a demand refused again for the same numbers records nothing more)."""
    return (
        f"no room: needs {needed_bytes} bytes beside {in_use_bytes} in use of {budget_bytes}, "
        "and nothing can be evicted"
    )
