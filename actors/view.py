"""The status view of an instance, built from what its actor already knows."""

from __future__ import annotations

from typing import Any, Protocol

from infervisor.adapters.adopted import AdoptedServer
from infervisor.adapters.probe import ServerReport
from infervisor.adapters.server import ServerAdapter
from infervisor.adapters.status import map_report
from infervisor.replay import InstanceState
from infervisor.replay.policy import restarts_in_window
from infervisor.replay.state import Stamp
from infervisor.replay.views import InstanceView, rest_reason

from .core.health import wants_probe
from .core.rules import Mode, Rules, Tracking
from .core.supervision import Supervision
from .effects_runner import EffectRunner
from .stand_in import UnbuiltServer

__all__ = ["Viewed", "build_view", "describe"]

#: Lifecycle states in which the last exit is what the operator needs to know.
_AFTER_AN_EXIT = frozenset({"exited", "restarting", "failed"})
#: How much of a crash's output the reason quotes.
_TAIL_LINES = 2
_TAIL_CHARS = 200


class Viewed(Protocol):
    """What a view is built from: the instance actor's parts."""

    state: InstanceState
    adapter: ServerAdapter

    @property
    def report(self) -> ServerReport | None: ...

    @property
    def probe_latency_s(self) -> float | None: ...

    rules: Rules
    supervision: Supervision
    effects: EffectRunner
    listeners: dict[int, list[str]] | None
    rss_seen: tuple[int, int] | None
    fault: str
    tracking: Tracking
    missed_probes: int

    def now(self) -> Stamp: ...


def build_view(actor: Viewed) -> InstanceView:
    """Combine sourced state, the last probe and the live server into one view."""
    state, adapter = actor.state, actor.adapter
    spec = adapter.spec
    pid = state.process.pid if state.process is not None else None
    report, status, detail = _observed(actor, pid)
    exposure = _exposure(adapter, actor.listeners)
    if state.exposed:
        exposure = f"stopped: listened beyond loopback on {', '.join(state.exposed)}"
    reason = describe(state, actor.fault)
    if isinstance(adapter, UnbuiltServer):
        reason = f"cannot be started: {adapter.problem}"
    return InstanceView(
        instance_id=state.instance_id,
        adapter=adapter.adapter_id,
        placed_by=state.placed_by,
        generation=state.generation,
        role=spec.role,
        flavor=spec.flavor.value,
        mode=spec.mode.value,
        model=adapter.served_model,
        endpoint=spec.base_url,
        lifecycle=state.lifecycle.value,
        desired=state.desired.value,
        reason=reason,
        since_ns=state.since_ns,
        pid=pid,
        restarts=restarts_in_window(state, actor.supervision.restart, actor.now()),
        health=report.health.kind.value if report is not None else "",
        health_reason=report.health.reason if report is not None else "",
        status=status,
        status_detail=detail,
        reserved_bytes=state.reserved_bytes,
        rss_bytes=_rss(actor.rss_seen, pid),
        exposure=exposure,
        last_exit=state.last_exit,
        last_seq=state.last_seq,
        probe_latency_s=actor.probe_latency_s,
        misses=actor.tracking.misses,
        missed_probes=actor.missed_probes,
        max_restarts=actor.supervision.restart.max_restarts,
        oom_kills=state.oom_kills,
        memory_max_bytes=spec.memory_max_bytes,
        on_demand=spec.on_demand,
        idle_ttl_s=spec.idle_ttl_s,
        priority=spec.priority,
        pinned=spec.pinned,
        resting=state.lifecycle.value == "resting",
        rest_reason=rest_reason(state),
        refusals_folded=actor.tracking.refusals_folded_total,
        last_use_ns=state.last_use_ns,
        busy=actor.tracking.serving > 0,
        **_accounting(actor.effects, pid),
    )


def _observed(actor: Viewed, pid: int | None) -> tuple[ServerReport | None, str, str | None]:
    """The last probe's report while the state is one that is probed, and the
    status and detail it maps to (adapters/status.py); else None, "" and None."""
    state, adapter, report = actor.state, actor.adapter, actor.report
    if report is None or not wants_probe(state, actor.rules):
        return None, "", None
    load = actor.effects.load.state if actor.effects.load is not None else None
    mapped = map_report(
        adapter.spec.flavor,
        adapter.served_model,
        report,
        alive=pid is not None,
        adopted=actor.rules.mode is Mode.ADOPTED,
        load=load if state.lifecycle.value == "starting" else None,
    )
    return report, mapped.state.value, mapped.detail


def _exposure(adapter: ServerAdapter, listeners: dict[int, list[str]] | None) -> str:
    """Where the server listens: an adopted server's as last observed; a managed
    one binds loopback only (see ARCHITECTURE.md, "Adapters")."""
    if isinstance(adapter, AdoptedServer):
        return adapter.exposure(listeners)
    if isinstance(adapter, UnbuiltServer) and adapter.adopted:
        return "unknown (not observed)"
    return "loopback (managed)"


def _accounting(effects: EffectRunner, pid: int | None) -> dict[str, Any]:
    """Memory and CPU of the server's whole tree, from its cgroup (read now:
    status is asked rarely; health ticks never read them)."""
    proc = effects.proc
    cgroup = proc.cgroup if proc is not None and pid is not None else None
    if cgroup is None:
        return {}
    return {"cgroup_memory_bytes": cgroup.memory_bytes(), "cpu_seconds": cgroup.cpu_seconds()}


def _rss(seen: tuple[int, int] | None, pid: int | None) -> int | None:
    """The tree RSS the last reconcile tick saw (bytes), if it was of this pid:
    status never reads the process table itself."""
    if seen is None or pid is None or seen[0] != pid:
        return None
    return seen[1]


def describe(state: InstanceState, fault: str = "") -> str:
    """The reason column: the last transition's reason, then what the operator
    needs to act on: a start refused since (its cause), the last lines of a
    crashed server's output, and a fault of the actor."""
    parts = [state.reason] if state.reason else []
    if state.refusal and state.refusal not in state.reason:
        parts.append(f"start refused: {state.refusal}")
    exit_ = state.last_exit
    if exit_ is not None and state.lifecycle.value in _AFTER_AN_EXIT:
        output = last_lines(exit_.output_tail)
        if output:
            parts.append(f"output: {output}")
    reason = "; ".join(parts)
    return f"{reason} [fault: {fault}]" if fault else reason


def last_lines(text: str, lines: int = _TAIL_LINES, limit: int = _TAIL_CHARS) -> str:
    """The last ``lines`` non-empty lines of ``text`` joined by " | ", cut to
    its last ``limit`` characters ("..." marks a cut)."""
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    joined = " | ".join(kept)
    return joined if len(joined) <= limit else "..." + joined[-(limit - 3) :]
