"""Health: probe verdicts, misses, the stability reset, and the reconcile tick.

Source: ``reference/host_supervise.rs.txt`` (``judge``: misses make an
instance unhealthy; an unhealthy managed process is killed and restarted
under the policy; after the stability period the restart count clears).
"""

from __future__ import annotations

import msgspec

from infervisor.adapters.probe import Health, HealthKind, ServerReport
from infervisor.adapters.status import map_report
from infervisor.replay import Desired, InstanceState, LifecycleState
from infervisor.replay import events as ev
from infervisor.replay.state import elapsed_s

from ..kinds import HealthSample, Healthy, Unhealthy, judge
from . import ollama
from .common import after_exit, begin_termination, try_start, unloading
from .decision import Draft
from .observations import DeepChecked, ProbeResult, Tick
from .process import restart_due
from .rules import Mode, Rules

__all__ = [
    "NODE_LATE_S",
    "deep_checked",
    "probe_result",
    "probe_token",
    "tick",
    "wants_deep",
    "wants_probe",
]

S = LifecycleState
#: A failed probe whose own timeout fired this many seconds late was not timed
#: by the server: the node did not run (stopped, frozen, starved), and a paused
#: node cannot probe. It is neither a miss nor an answer; the next tick probes again.
NODE_LATE_S = 3.0
_SUFFIX = {
    Mode.OLLAMA: "infervisor does not start ollama",
    Mode.ADOPTED: "adopted servers are not restarted",
}


def wants_probe(inst: InstanceState, rules: Rules) -> bool:
    """Whether a health tick should probe the server now."""
    if inst.desired is not Desired.RUNNING and rules.mode is not Mode.PROCESS:
        return False
    if rules.mode is Mode.PROCESS:
        return (
            inst.process is not None
            and inst.terminating is None
            and rules.supervision.probe == "http"
            and inst.lifecycle in (S.STARTING, S.RUNNING)
        )
    return inst.lifecycle in (S.STARTING, S.RUNNING, S.UNHEALTHY)  # ollama, adopted


def wants_deep(inst: InstanceState, rules: Rules) -> bool:
    """Whether a deep health check (one real token) may run now: the kind asks
    for them (``deep_interval_s`` > 0) and the server is serving (or, when it is
    not ours to restart, unhealthy: a deep check that answers again recovers it)."""
    if rules.supervision.deep_interval_s <= 0 or not wants_probe(inst, rules):
        return False
    if rules.mode is Mode.PROCESS:
        return inst.lifecycle is S.RUNNING
    return inst.lifecycle in (S.RUNNING, S.UNHEALTHY)


def deep_checked(d: Draft, c: DeepChecked) -> None:
    """A failed deep check is recorded and counted like a missed probe; a token clears them.

    ``miss_limit`` failures in a row make the instance unhealthy (a managed
    process is killed and restarted under the policy). Failures while it is
    already unhealthy are counted, not recorded again; a probe that answers
    does not clear them (its health endpoint is what cannot be trusted)."""
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
    if misses < rules.supervision.miss_limit:
        return
    why = f"deep health: {reason}"
    if rules.mode is Mode.PROCESS:
        _unhealthy_kill(d, misses, why)
    else:
        d.emit(ev.Unhealthy(misses=misses, reason=f"{why}; {_SUFFIX[rules.mode]}"))


def _set_misses(d: Draft, misses: int) -> None:
    """Consecutive missed probes (the deep-check count is kept apart)."""
    d.track(msgspec.structs.replace(d.tracking, misses=misses))


def probe_token(inst: InstanceState) -> int:
    """What a probe is for: the server's pid (0 when there is no process)."""
    return inst.process.pid if inst.process is not None else 0


def probe_result(d: Draft, p: ProbeResult) -> None:
    """Judge one probe: a miss counts toward unhealthy; an answer clears misses.

    A probe that timed out while the node itself was not running (its timeout
    fired more than :data:`NODE_LATE_S` late: a pause, issue 17) is not judged.
    """
    inst = d.inst
    if not wants_probe(inst, d.rules) or p.token != probe_token(inst):
        return
    if p.report.health.node_late_s > NODE_LATE_S:
        return
    if d.rules.mode is Mode.PROCESS:
        _judge_process(d, p)
    else:
        _judge_watched(d, p.report)


def _judge_process(d: Draft, p: ProbeResult) -> None:
    inst, rules = d.inst, d.rules
    starting = inst.lifecycle is S.STARTING
    if p.failure is not None and starting:
        _miss(d, f"the server reported: {p.failure}", at_once=True)
        return
    status = map_report(
        rules.flavor, rules.served_model, p.report, alive=True, adopted=False, load=None
    )
    sample = HealthSample(
        status=status, continuous=rules.continuous, starting=starting, elapsed_s=_uptime(d)
    )
    verdict = judge(rules.supervision, sample)
    if isinstance(verdict, Unhealthy):
        health = p.report.health
        unreachable = health.kind is HealthKind.UNREACHABLE
        # A server that served and stopped answering is not "starting".
        why = f"not answering: {health.reason}" if unreachable and not starting else verdict.reason
        _miss(d, why)
    elif isinstance(verdict, Healthy):
        _set_misses(d, 0)
        if not verdict.serving:
            return
        if starting:
            d.emit(ev.Ready(detail=_models_note(p.report), at=d.now))
        else:
            _stable_check(d)


def _judge_watched(d: Draft, report: ServerReport) -> None:
    if d.rules.mode is Mode.ADOPTED:
        _judge_adopted(d, report)
        return
    inst, health = d.inst, report.health
    if health.kind is HealthKind.UP and inst.lifecycle is S.STARTING:
        ollama.load_progress(d, report, _starting_for(d))
        if d.inst.lifecycle is not S.STARTING:
            return
    if health.kind is HealthKind.UP:
        _set_misses(d, 0)
        if inst.lifecycle is S.UNHEALTHY and d.tracking.deep_misses == 0:
            what = "ollama" if d.rules.mode is Mode.OLLAMA else "adopted server"
            d.emit(ev.Recovered(detail=f"{what} answers again"))
        else:
            _stable_check(d)
        return
    misses = d.tracking.misses + 1
    _set_misses(d, misses)
    if inst.lifecycle is S.RUNNING and misses >= d.rules.supervision.miss_limit:
        why = f"{health.kind}: {health.reason}; {_SUFFIX[d.rules.mode]}"
        d.emit(ev.Unhealthy(misses=misses, reason=why))


def _judge_adopted(d: Draft, report: ServerReport) -> None:
    """An adopted server, judged by its health alone with the kind's startup allowance.

    While ``starting`` (it answered loading when started) the kind's judge
    applies as to a managed server: loading is healthy within the startup
    deadline, extended while it still loads up to the cap, timed from the
    recorded ``instance.starting``. Its first up answer records it ready (an
    unhealthy one that never served is recorded ready too, else recovered).
    Misses beyond the allowance make it unhealthy, with a reason naming what
    the server said; it is never signalled nor restarted.
    """
    inst, rules, health = d.inst, d.rules, report.health
    starting = inst.lifecycle is S.STARTING
    # No model check and no process: up is serving, unreachable is a miss (as before).
    status = map_report(rules.flavor, None, report, alive=False, adopted=True, load=None)
    sample = HealthSample(
        status=status, continuous=True, starting=starting, elapsed_s=_starting_for(d)
    )
    verdict = judge(rules.supervision, sample)
    if isinstance(verdict, Healthy):
        _set_misses(d, 0)
        if not verdict.serving or inst.lifecycle is S.RUNNING:
            return
        if inst.lifecycle is S.UNHEALTHY and d.tracking.deep_misses:
            return  # its health answers, but it still gives no token
        if starting or inst.up_since is None:
            d.emit(ev.Ready(detail="adopted server answers", at=d.now))
        else:
            d.emit(ev.Recovered(detail="adopted server answers again"))
        return
    misses = d.tracking.misses + 1
    _set_misses(d, misses)
    if inst.lifecycle is S.UNHEALTHY or misses < rules.supervision.miss_limit:
        return
    why = _said(health)
    if starting and health.kind is HealthKind.LOADING and isinstance(verdict, Unhealthy):
        why = f"{why}, still {verdict.reason}"  # past the startup allowance
    d.emit(ev.Unhealthy(misses=misses, reason=f"{why}; {_SUFFIX[Mode.ADOPTED]}"))


#: What a server said when its probe's health carries no reason of its own.
_SAID_BY_KIND = {
    # The probe's only loading answer: llama.cpp's (and mlx-lm's) /health (adapters/probe.py).
    HealthKind.LOADING: 'HTTP 503 "Loading model"',
    HealthKind.UNHEALTHY: "answered unhealthy, without a reason",
    HealthKind.UNREACHABLE: "no answer",
    HealthKind.UP: "up",
}


def _said(health: Health) -> str:
    """What the server said, never empty: the health kind and the probe's reason."""
    return f"{health.kind}: {health.reason or _SAID_BY_KIND[health.kind]}"


def _starting_for(d: Draft) -> float:
    """Seconds since the start was recorded. While ``starting``, ``since_ns`` is the
    ``instance.starting`` event's timestamp (the only start time the chain keeps for
    an adopted server: wall clock, comparable across node restarts)."""
    if d.inst.lifecycle is not S.STARTING:
        return 0.0
    return max(0.0, (d.now.wall_ns - d.inst.since_ns) / 1e9)


def _miss(d: Draft, reason: str, *, at_once: bool = False) -> None:
    """A managed process: enough misses make it unhealthy, and it is killed."""
    misses = d.tracking.misses + 1
    _set_misses(d, misses)
    if not at_once and misses < d.rules.supervision.miss_limit:
        return
    _unhealthy_kill(d, misses, reason)


def _unhealthy_kill(d: Draft, misses: int, reason: str) -> None:
    """Unhealthy; a managed process still wanted running is killed (then restarted)."""
    d.emit(ev.Unhealthy(misses=misses, reason=reason))
    if d.inst.desired is Desired.RUNNING:
        grace = d.rules.health_kill_grace_s
        d.emit(ev.Terminating(cause=f"killed: {reason}", grace_s=grace, at=d.now))
        begin_termination(d, grace)


def _uptime(d: Draft) -> float:
    up = d.inst.up_since
    return elapsed_s(up, d.now) if up is not None else 0.0


def _stable_check(d: Draft) -> None:
    """Up for the stability period and healthy at this moment: the restart count clears.

    Called on a probe that answered up (a ``process`` kind, which has no probe,
    on the tick: a live process is its health). A server with a missed probe or
    a failed deep check still counted is not stable, however long it has run
    (``reference/infer_lifecycle.rs.txt``: the count clears only on a probe
    answering ``Health::Up`` after ``stable_after``)."""
    inst = d.inst
    if inst.lifecycle is not S.RUNNING or not inst.restarts or d.rules.mode is Mode.ADOPTED:
        return
    if d.tracking.misses or d.tracking.deep_misses:
        return
    uptime = _uptime(d)
    if inst.up_since is not None and uptime >= d.rules.supervision.restart.stable_after_s:
        d.emit(ev.StableAgain(uptime_s=uptime))


def tick(d: Draft, _: Tick) -> None:
    """Reconcile: act toward the desired state; retry refused starts."""
    inst = d.inst
    if d.rules.mode is Mode.ADOPTED:
        return
    if d.rules.mode is Mode.PROCESS and d.rules.supervision.probe == "process":
        _stable_check(d)  # no probe to wait for: a live process is healthy
    if inst.desired is not Desired.RUNNING or inst.exposed:
        return
    if inst.lifecycle is S.EXITED:
        after_exit(d)
    elif inst.lifecycle is S.RESTARTING:
        restart_due(d)
    elif inst.lifecycle in (S.STOPPED, S.LOADED) and not unloading(inst):
        try_start(d, inst.then_by or "supervisor" if inst.then == "restart" else "supervisor")


def _models_note(report: ServerReport | None) -> str:
    if report is None or not report.models:
        return ""
    return "models: " + ", ".join(report.models[:4])
