"""Health every mode shares: probe pacing, misses, deep checks, the stability
reset and the reconcile tick. Each mode judges its probes in its own module
(``process.py``, ``ollama.py``, ``adopted.py``) with these pieces.

Source: ``reference/host_supervise.rs.txt`` (``judge``: misses make an
instance unhealthy; an unhealthy managed process is killed and restarted
under the policy; after the stability period the restart count clears).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from infervisor.adapters.probe import Health, HealthKind, ServerReport
from infervisor.replay import Desired, InstanceState, LifecycleState
from infervisor.replay import events as ev
from infervisor.replay.callers import Role
from infervisor.replay.state import Then, elapsed_s

from .common import after_exit, demand_pending, restart_due, try_start, unloading
from .decision import Draft
from .observations import DeepChecked, ProbeResult
from .rules import Mode, Rules
from .supervision import ProbeMethod

__all__ = [
    "NODE_LATE_S",
    "OnUnhealthy",
    "deep_checked",
    "judged",
    "models_note",
    "probe_token",
    "reconcile",
    "said",
    "set_misses",
    "stable_check",
    "starting_for",
    "uptime",
    "wants_deep",
    "wants_probe",
    "watched_miss",
]

S = LifecycleState
#: A failed probe whose own timeout fired this many seconds late was not timed
#: by the server: the node did not run (stopped, frozen, starved), and a paused
#: node cannot probe. It is neither a miss nor an answer; the next tick probes again.
NODE_LATE_S = 3.0


def _probes_process(inst: InstanceState, rules: Rules) -> bool:
    return (
        inst.process is not None
        and inst.terminating is None
        and rules.supervision.probe is ProbeMethod.HTTP
        and inst.lifecycle in (S.STARTING, S.RUNNING)
    )


def _probes_watched(inst: InstanceState, rules: Rules) -> bool:
    return inst.desired is Desired.RUNNING and inst.lifecycle in (
        S.STARTING,
        S.RUNNING,
        S.UNHEALTHY,
    )


#: When a health tick probes, per mode: a managed process of ours while it has
#: no termination in flight; an Ollama model or adopted server while wanted.
_PROBES = {
    Mode.PROCESS: _probes_process,
    Mode.OLLAMA: _probes_watched,
    Mode.ADOPTED: _probes_watched,
}
#: The states a deep check may run in, per mode: a process only while running
#: (an unhealthy one is being killed); a server not ours to restart also while
#: unhealthy (a deep check that answers again recovers it).
_DEEP_STATES = {
    Mode.PROCESS: frozenset({S.RUNNING}),
    Mode.OLLAMA: frozenset({S.RUNNING, S.UNHEALTHY}),
    Mode.ADOPTED: frozenset({S.RUNNING, S.UNHEALTHY}),
}


def wants_probe(inst: InstanceState, rules: Rules) -> bool:
    """Whether a health tick should probe the server now."""
    return _PROBES[rules.mode](inst, rules)


def wants_deep(inst: InstanceState, rules: Rules) -> bool:
    """Whether a deep health check (one real token) may run now: the kind asks
    for them (``deep_interval_s`` > 0), a probe would run, and the server is in
    a state its mode checks deeply."""
    if rules.supervision.deep_interval_s <= 0 or not wants_probe(inst, rules):
        return False
    return inst.lifecycle in _DEEP_STATES[rules.mode]


#: What a mode does once an instance is unhealthy: ``unhealthy(draft, misses, reason)``.
OnUnhealthy = Callable[[Draft, int, str], None]


def deep_checked(d: Draft, c: DeepChecked, unhealthy: OnUnhealthy) -> None:
    """A failed deep check is recorded and counted like a missed probe; a token clears them.

    ``miss_limit`` failures in a row make the instance unhealthy (``unhealthy``
    says what the mode does then). Failures while it is already unhealthy are
    counted, not recorded again; a probe that answers does not clear them (its
    health endpoint is what cannot be trusted)."""
    inst, rules = d.inst, d.rules
    if not wants_deep(inst, rules) or c.token != probe_token(inst):
        return
    if c.error is None:
        d.track(msgspec.structs.replace(d.tracking, deep_misses=0))
        if inst.lifecycle is S.UNHEALTHY and d.tracking.misses == 0:
            d.emit(ev.Recovered(detail="a deep health check gave a token again"))
        return
    misses = d.tracking.deep_misses + 1
    d.track(msgspec.structs.replace(d.tracking, deep_misses=misses))
    if inst.lifecycle is not S.RUNNING:
        return  # already unhealthy (and said why): one row per failure would pile up
    reason = f"no token of completion: {c.error}"
    d.emit(ev.DeepHealthFailed(misses=misses, reason=reason))
    if misses >= rules.supervision.miss_limit:
        unhealthy(d, misses, f"deep health: {reason}")


def set_misses(d: Draft, misses: int) -> None:
    """Consecutive missed probes (the deep-check count is kept apart)."""
    d.track(msgspec.structs.replace(d.tracking, misses=misses))


def probe_token(inst: InstanceState) -> int:
    """What a probe is for: the server's pid (0 when there is no process)."""
    return inst.process.pid if inst.process is not None else 0


def judged(d: Draft, p: ProbeResult) -> bool:
    """Whether a probe is to be judged: it was for this server, now, and its
    timeout did not fire while the node itself was not running (more than
    :data:`NODE_LATE_S` late: a pause, issue 17)."""
    if not wants_probe(d.inst, d.rules) or p.token != probe_token(d.inst):
        return False
    return p.report.health.node_late_s <= NODE_LATE_S


def watched_miss(d: Draft, health: Health, suffix: str) -> None:
    """A server not ours to restart missed a probe: ``miss_limit`` in a row make
    a running one unhealthy, the reason naming what it said and ``suffix``."""
    misses = d.tracking.misses + 1
    set_misses(d, misses)
    if d.inst.lifecycle is S.RUNNING and misses >= d.rules.supervision.miss_limit:
        d.emit(ev.Unhealthy(misses=misses, reason=f"{health.kind}: {health.reason}; {suffix}"))


#: What a server said when its probe's health carries no reason of its own.
_SAID_BY_KIND = {
    # The probe's only loading answer: llama.cpp's (and mlx-lm's) /health (adapters/probe.py).
    HealthKind.LOADING: 'HTTP 503 "Loading model"',
    HealthKind.UNHEALTHY: "answered unhealthy, without a reason",
    HealthKind.UNREACHABLE: "no answer",
    HealthKind.UP: "up",
}


def said(health: Health) -> str:
    """What the server said, never empty: the health kind and the probe's reason."""
    return f"{health.kind}: {health.reason or _SAID_BY_KIND[health.kind]}"


def starting_for(d: Draft) -> float:
    """Seconds since the start was recorded. While ``starting``, ``since_ns`` is the
    ``instance.starting`` event's timestamp (the only start time the chain keeps for
    an adopted server: wall clock, comparable across node restarts)."""
    if d.inst.lifecycle is not S.STARTING:
        return 0.0
    return max(0.0, (d.now.wall_ns - d.inst.since_ns) / 1e9)


def uptime(d: Draft) -> float:
    """Seconds the current server has been up (0 when it is not)."""
    up = d.inst.up_since
    return elapsed_s(up, d.now) if up is not None else 0.0


def stable_check(d: Draft) -> None:
    """Up for the stability period and healthy at this moment: the restart count clears.

    Called on a probe that answered up (a ``process`` kind, which has no probe,
    on the tick: a live process is its health). A server with a missed probe or
    a failed deep check still counted is not stable, however long it has run
    (``reference/infer_lifecycle.rs.txt``: the count clears only on a probe
    answering ``Health::Up`` after ``stable_after``)."""
    inst = d.inst
    if inst.lifecycle is not S.RUNNING or not inst.restarts:
        return
    if d.tracking.misses or d.tracking.deep_misses:
        return
    up = uptime(d)
    if inst.up_since is not None and up >= d.rules.supervision.restart.stable_after_s:
        d.emit(ev.StableAgain(uptime_s=up))


def reconcile(d: Draft) -> None:
    """Act toward the desired state: finish an exit, start a restart that fell
    due, retry a refused start (not while an Ollama unload is in flight)."""
    inst = d.inst
    if inst.desired is not Desired.RUNNING or inst.exposed:
        return
    if demand_pending(inst):
        return  # the node makes room for it, then starts it (actors/node_residency.py)
    if inst.lifecycle is S.EXITED:
        after_exit(d)
    elif inst.lifecycle is S.RESTARTING:
        restart_due(d)
    elif inst.lifecycle is S.STOPPED and not unloading(inst):
        restarting = inst.then == Then.RESTART
        try_start(d, inst.then_by or Role.SUPERVISOR if restarting else Role.SUPERVISOR)


def models_note(report: ServerReport | None) -> str:
    """The models a server lists, for a readiness detail (empty when none)."""
    if report is None or not report.models:
        return ""
    return "models: " + ", ".join(report.models[:4])
