"""What every instance actor of a node shares (:class:`InstanceContext`), and
the rules the decision core decides an instance by (:func:`rules_for`)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pykka

from infervisor.adapters.prober import Prober
from infervisor.adapters.proc.containment import Containment, no_containment
from infervisor.adapters.spec import InstanceSpec

from .append import ChainAppend
from .clock import Clock
from .core.rules import Mode, Rules
from .core.supervision import Supervision
from .probe_loop import Gates
from .settings import NodeSettings
from .view_board import ViewBoard

__all__ = ["InstanceContext", "rules_for"]

#: Probe workers for contexts built without a node (tests); a node passes its own pool.
_SHARED_FALLBACK = ThreadPoolExecutor(max_workers=2, thread_name_prefix="probe")


@dataclass(frozen=True)
class InstanceContext:
    """What every instance actor of a node shares (read-only).

    ``chain`` records decisions (:class:`~.append.WriterAppend` on a node, a
    :class:`~.append_fake.FakeAppend` in tests). ``ledger`` is the residency
    ledger actor, or None when the node has no memory budget. ``engine`` is
    the node's prober (the probes seam, adapters/prober.py): it makes the plain
    probes of every instance (over HTTP, on one event loop, each with its own
    timeout: a hung server delays no other probe), the deep health checks and an
    adopted start's check; ``probes`` runs the others (an adapter whose probe
    does more than HTTP, or a node without an engine).
    """

    node_id: str
    chain: ChainAppend
    clock: Clock
    settings: NodeSettings
    ledger: pykka.ActorRef[Any] | None = None
    probes: Executor = field(default_factory=lambda: _SHARED_FALLBACK)
    engine: Prober | None = None
    #: Told the instance id when a decision of the instance's own unloaded it (a
    #: boot finishing an unload the last node began): the host forgets it then.
    gone: Callable[[str], None] = field(default=lambda _iid: None)
    #: How managed servers are contained (cgroups, or process groups only).
    containment: Containment = field(default_factory=no_containment)
    #: Each instance's probe loop, where the supervisor asks whether a reconcile
    #: tick wakes it (None: every tick is told, as in tests without a node).
    gates: Gates | None = None
    #: Told ``(instance id, by, cause)`` when a start the node decided itself does
    #: not fit (``AskRoom``): the node makes room and asks the start again
    #: (actors/room_asks.py). Never blocks; without a node, nothing is done.
    room: Callable[[str, str, str], None] = field(default=lambda _iid, _by, _cause: None)
    #: Where each instance posts its view for ``list`` (a node's is shared by all).
    views: ViewBoard = field(default_factory=ViewBoard)


def rules_for(
    mode: Mode, spec: InstanceSpec, served_model: str | None, ctx: InstanceContext,
    supervision: Supervision,
) -> Rules:  # fmt: skip
    """An instance's rules for the decision core, from its spec and the node's settings."""
    s = ctx.settings
    return Rules(
        mode=mode,
        flavor=spec.flavor,
        served_model=served_model,
        continuous=spec.continuous,
        supervision=supervision,
        node_id=ctx.node_id,
        stop_grace_s=s.stop_grace_s,
        health_kill_grace_s=s.health_kill_grace_s,
        reserve_overhead_bytes=s.reserve_overhead_bytes,
        idle_ttl_s=spec.idle_ttl_s,
        priority=spec.priority,
        pinned=spec.pinned,
    )
