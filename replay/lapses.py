"""What a lapsed controller lease stopped, read from the chain (issue 19).

A heartbeat's answer names the instances the lapse of that controller's lease
stopped, and that nothing has started since: the controller decides whether
to start them again (the node does not). The answer comes from the chain, not
from the supervisor's memory, so a node restart between the lapse and the
heartbeat answers the same.

An instance is held by the lapse of ``ctl1``'s lease when, of the events that
set what it is wanted to do (``instance.placed``, ``instance.starting``,
``instance.stop_requested``; a shutdown's stop sets nothing and is passed
over), the last is a stop by ``lease:ctl1`` (replay/callers.py). A stop an
older node recorded as ``lease`` (one lease for the node) names no
controller, so no heartbeat lists it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from infervisor.chain import SqliteChain, StoredEvent

from . import events as ev
from .callers import Role, lease_source

__all__ = ["WANTED_KINDS", "held_by_lapse", "lapse_stopped"]

_STOP = ev.StopRequested.__struct_config__.tag
#: The event kinds that set what an instance is wanted to do.
WANTED_KINDS = frozenset(
    str(t.__struct_config__.tag) for t in (ev.Placed, ev.Starting, ev.StopRequested)
)


def held_by_lapse(events: Iterable[StoredEvent], controller: str) -> bool:
    """True when the last of ``events`` (one instance's, in seq order, of
    :data:`WANTED_KINDS`) that is not a shutdown's is a stop by ``lease:controller``."""
    last = None
    for stored in events:
        if stored.kind in WANTED_KINDS and stored.source != Role.SHUTDOWN:
            last = stored
    return last is not None and last.kind == _STOP and last.source == lease_source(controller)


def lapse_stopped(
    chain_path: str | os.PathLike[str], controller: str, candidates: Iterable[str]
) -> list[str]:
    """Of ``candidates`` (instance ids), those the lapse of ``controller``'s lease
    stopped and nothing started since, sorted.

    Raises:
        ChainIOError: the chain cannot be read.
    """
    chain = SqliteChain.open_readonly(chain_path)
    try:
        held = [
            iid
            for iid in candidates
            if held_by_lapse(chain.events(subject=iid, kinds=WANTED_KINDS), controller)
        ]
    finally:
        chain.close()
    return sorted(held)
