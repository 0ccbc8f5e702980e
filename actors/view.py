"""The status view of an instance, built from what its actor already knows.

A view has two parts. Most of it changes only when the instance's actor
changes it (its sourced state after an applied event, its tracking, the last
socket and process tables it was told): :func:`post_of` captures that part on
the actor's thread as a :class:`Posted`, which the actor posts on the node's
:class:`~.view_board.ViewBoard` after each change. The rest changes without
the actor: the last probe's report and latency (the probe engine keeps them;
a steady probe wakes no actor), the restarts still inside the budget's window
(time), an Ollama load's progress (its thread), and the cgroup's memory and
CPU (read when asked). :func:`compose` adds that part when the view is read,
so ``status`` (composed on the actor's thread) and ``list`` (composed from the
board on the caller's, issue 22) build the same view the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import msgspec

from infervisor.adapters.adopted import AdoptedServer
from infervisor.adapters.ollama_load import OllamaLoad
from infervisor.adapters.probe import ServerReport
from infervisor.adapters.proc.cgroups import InstanceCgroup
from infervisor.adapters.server import ServerAdapter
from infervisor.adapters.spec import Flavor
from infervisor.adapters.status import map_report
from infervisor.replay import InstanceState
from infervisor.replay.policy import RestartPolicy, restarts_in_window
from infervisor.replay.state import Stamp
from infervisor.replay.views import InstanceView, rest_reason

from .core.health import probe_token, wants_probe
from .core.rules import Mode, Rules, Tracking
from .core.supervision import Supervision
from .effects_runner import EffectRunner
from .stand_in import UnbuiltServer

__all__ = ["LiveProbes", "Posted", "Viewed", "build_view", "compose", "describe", "post_of"]

#: Lifecycle states in which the last exit is what the operator needs to know.
_AFTER_AN_EXIT = frozenset({"exited", "restarting", "failed"})
#: How much of a crash's output the reason quotes.
_TAIL_LINES = 2
_TAIL_CHARS = 200


class LiveProbes(Protocol):
    """Where the last probe's report and latency are kept (the instance's probe
    loop, :class:`~.probe_loop.ProbeLoop`): written by the probe engine, read
    from any thread."""

    @property
    def report(self) -> ServerReport | None: ...

    def report_of(self, token: int) -> ServerReport | None: ...

    @property
    def latency_s(self) -> float | None: ...


class Viewed(Protocol):
    """What a view is built from: the instance actor's parts."""

    state: InstanceState
    adapter: ServerAdapter

    @property
    def probes(self) -> LiveProbes: ...

    rules: Rules
    supervision: Supervision
    effects: EffectRunner
    listeners: dict[int, list[str]] | None
    rss_seen: tuple[int, int] | None
    fault: str
    tracking: Tracking
    missed_probes: int

    def now(self) -> Stamp: ...


@dataclass(frozen=True, slots=True)
class Posted:
    """An instance's view as its actor last posted it (:func:`post_of`), and
    where :func:`compose` reads what of it changes without the actor.

    Attributes:
        view: the view with every field the actor changes; the live fields
            (probe, restarts, cgroup accounting) are filled by :func:`compose`.
        owner: the actor that posted it (a revived actor's post replaces its
            predecessor's; only the owner's own post is taken off the board).
        probes: the probe loop's last report and latency (live).
        probed: the state is one that is probed (its report is shown).
        token: the server the report must be of (its pid; 0 without a process).
        flavor, served_model, alive, adopted: what the report is mapped with.
        load: an Ollama load in progress while starting (its state is live).
        state, policy, now: the restart window's inputs (``windowed``: the
            count depends on the time; else ``view.restarts`` holds).
        cgroup: the running server's cgroup (memory and CPU read when composed).
    """

    view: InstanceView
    owner: object
    probes: LiveProbes
    probed: bool
    token: int
    flavor: Flavor
    served_model: str | None
    alive: bool
    adopted: bool
    load: OllamaLoad | None
    state: InstanceState
    policy: RestartPolicy
    now: Callable[[], Stamp]
    windowed: bool
    cgroup: InstanceCgroup | None


def build_view(actor: Viewed) -> InstanceView:
    """Combine sourced state, the last probe and the live server into one view."""
    return compose(post_of(actor))


def post_of(actor: Viewed) -> Posted:
    """What of ``actor``'s view only its actor changes, captured now (on its thread)."""
    state, adapter = actor.state, actor.adapter
    pid = state.process.pid if state.process is not None else None
    policy = actor.supervision.restart
    windowed = policy.window_s is not None and state.restarts != 0
    proc = actor.effects.proc
    load = actor.effects.load
    return Posted(
        view=_fixed_view(actor, pid, windowed),
        owner=actor,
        probes=actor.probes,
        probed=wants_probe(state, actor.rules),
        token=probe_token(state),
        flavor=adapter.spec.flavor,
        served_model=adapter.served_model,
        alive=pid is not None,
        adopted=actor.rules.mode is Mode.ADOPTED,
        load=load if state.lifecycle.value == "starting" else None,
        state=state,
        policy=policy,
        now=actor.now,
        windowed=windowed,
        cgroup=proc.cgroup if proc is not None and pid is not None else None,
    )


def compose(posted: Posted) -> InstanceView:
    """The view of ``posted`` as of now: the last probe's report and latency,
    the restarts inside the window, the cgroup's memory and CPU (any thread)."""
    probes = posted.probes
    # Only a report of this server (its pid): the last one of the process before a
    # start or restart read "running"/"up" beside lifecycle starting (stop 33's trial).
    report = probes.report_of(posted.token) if posted.probed else None
    status, detail = _mapped(posted, report)
    restarts = posted.view.restarts
    if posted.windowed:
        restarts = restarts_in_window(posted.state, posted.policy, posted.now())
    cgroup = posted.cgroup
    return msgspec.structs.replace(
        posted.view,
        restarts=restarts,
        health=report.health.kind.value if report is not None else "",
        health_reason=report.health.reason if report is not None else "",
        status=status,
        status_detail=detail,
        probe_latency_s=probes.latency_s,
        cgroup_memory_bytes=cgroup.memory_bytes() if cgroup is not None else None,
        cpu_seconds=cgroup.cpu_seconds() if cgroup is not None else None,
    )


def _fixed_view(actor: Viewed, pid: int | None, windowed: bool) -> InstanceView:
    """Every field of the view its actor changes (the live ones empty)."""
    state, adapter = actor.state, actor.adapter
    spec = adapter.spec
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
        restarts=0 if windowed else state.restarts,
        health="",
        health_reason="",
        status="",
        status_detail=None,
        reserved_bytes=state.reserved_bytes,
        rss_bytes=_rss(actor.rss_seen, pid),
        exposure=exposure,
        last_exit=state.last_exit,
        last_seq=state.last_seq,
        misses=actor.tracking.misses,
        missed_probes=actor.missed_probes,
        max_restarts=actor.supervision.restart.max_restarts,
        oom_kills=state.oom_kills,
        memory_max_bytes=spec.memory_max_bytes,
        on_demand=spec.on_demand,
        idle_ttl_s=spec.idle_ttl_s,
        priority=spec.priority,
        pinned=spec.pinned,
        embeddings=spec.embeddings,
        resting=state.lifecycle.value == "resting",
        rest_reason=rest_reason(state),
        refusals_folded=actor.tracking.refusals_folded_total,
        last_use_ns=state.last_use_ns,
        busy=actor.tracking.serving > 0,
    )


def _mapped(posted: Posted, report: ServerReport | None) -> tuple[str, str | None]:
    """The status and detail the last report maps to (adapters/status.py) while
    the state is one that is probed; else "" and None."""
    if report is None:
        return "", None
    load = posted.load.state if posted.load is not None else None
    mapped = map_report(
        posted.flavor,
        posted.served_model,
        report,
        alive=posted.alive,
        adopted=posted.adopted,
        load=load,
    )
    return mapped.state.value, mapped.detail


def _exposure(adapter: ServerAdapter, listeners: dict[int, list[str]] | None) -> str:
    """Where the server listens: an adopted server's as last observed; a managed
    one binds loopback only (see ARCHITECTURE.md, "Adapters")."""
    if isinstance(adapter, AdoptedServer):
        return adapter.exposure(listeners)
    if isinstance(adapter, UnbuiltServer) and adapter.adopted:
        return "unknown (not observed)"
    return "loopback (managed)"


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
