"""What the node shows of its state: the status view of an instance and of the
memory ledger, as the actors build them and the control API sends them.

Plain msgspec types, apart from the actors that build them
(``actors/view.py``, ``actors/ledger.py``), so that a client of the API
(the operator's commands) decodes them without loading the node.
"""

from __future__ import annotations

import msgspec

from .state import ExitRecord, InstanceState

__all__ = ["InstanceView", "LedgerView", "rest_reason"]


def rest_reason(inst: InstanceState) -> str:
    """Why a resting instance rests: ``evicted for B``, ``idle longer than 60 s``
    or ``placed on demand`` (never run, or not since it was placed); "" when it
    does not rest. Sourced (``residency.evicted``/``.expired``)."""
    if inst.lifecycle.value != "resting":
        return ""
    return inst.rested_for or "placed on demand"


class LedgerView(msgspec.Struct, frozen=True):
    """The budget and what each instance holds, in bytes."""

    budget_bytes: int
    in_use_bytes: int
    reservations: dict[str, int]


class InstanceView(msgspec.Struct, frozen=True, kw_only=True):
    """What ``status`` shows of an instance.

    Attributes:
        lifecycle: the sourced lifecycle state.
        desired: ``running`` or ``stopped``.
        health: last probe verdict (``up``, ``loading``, ``unhealthy``,
            ``unreachable``) or ``""`` before the first probe.
        status: the adapter's status (``map_report``): state and detail.
        since_ns: when the lifecycle state was entered (ns since epoch).
        reserved_bytes: memory the residency ledger holds for it, bytes.
        rss_bytes: observed resident memory of the server's process tree, bytes.
        exposure: who can reach the server (loopback when managed; adopted
            servers are reported as LAN-reachable).
        probe_latency_s: how long the last health probe took, seconds (from
            sending it to its report; None before the first probe).
        misses: consecutive missed health probes now (not sourced: a node
            restart counts from zero); None where nothing probes it (its
            adapter could not be built).
        missed_probes: missed health probes since the node started (ever
            increasing while it runs; not sourced: a node restart counts from
            0); None from a node that does not count them.
        max_restarts: the restart policy's budget (``restarts`` counts against it).
        oom_kills: exits recorded as OOM kills under its memory limit (sourced).
        memory_max_bytes: its memory limit (the spec's), bytes; None: none.
        cgroup_memory_bytes: memory charged to the server's whole tree in its
            cgroup (read when asked), bytes; None without a memory cgroup or
            a running server.
        cpu_seconds: CPU time of the server's whole tree in its cgroup since
            its launch, seconds; None without a cgroup or a running server.
        on_demand, idle_ttl_s, priority, pinned: its spec's residency fields
            (issue 21; ``idle_ttl_s`` in seconds, None: never released).
        resting: it rests (evicted, expired or placed on demand): a request
            or verb for it starts it.
        refusals_folded: starts of it refused for room, identical to the
            ``residency.refused`` recorded before them (within its window), so
            not recorded, since the node started (not sourced: a counter that
            a node restart starts again from 0).
        rest_reason: why it rests (:func:`rest_reason`: ``evicted for B``,
            ``idle longer than 60 s``, ``placed on demand``); "" when it does not.
        last_use_ns: its last use (ns since the epoch, UTC; sourced: a demand,
            ``residency.busy``/``.idle``); None: never used.
        busy: it serves a request now (the node's count of requests in flight).
        embeddings: placed with ``embeddings = true`` (llama-server's
            ``--embeddings``): the front prefers it for ``/v1/embeddings``.
    """

    instance_id: str
    adapter: str
    placed_by: str
    generation: int
    role: str
    flavor: str
    mode: str
    model: str | None
    endpoint: str
    lifecycle: str
    desired: str
    reason: str
    since_ns: int
    pid: int | None
    restarts: int
    health: str
    health_reason: str
    status: str
    status_detail: str | None
    reserved_bytes: int
    rss_bytes: int | None
    exposure: str
    last_exit: ExitRecord | None
    last_seq: int
    probe_latency_s: float | None = None
    misses: int | None = None
    missed_probes: int | None = None
    max_restarts: int | None = None
    oom_kills: int = 0
    memory_max_bytes: int | None = None
    cgroup_memory_bytes: int | None = None
    cpu_seconds: float | None = None
    on_demand: bool = False
    idle_ttl_s: float | None = None
    priority: int = 0
    pinned: bool = False
    resting: bool = False
    last_use_ns: int | None = None
    busy: bool = False
    rest_reason: str = ""
    refusals_folded: int = 0
    embeddings: bool = False
