"""Health: probe verdicts, misses, the stability reset, and the reconcile tick.

Source: ``reference/host_supervise.rs.txt`` (``judge``: misses make an
instance unhealthy; an unhealthy managed process is killed and restarted
under the policy; after the stability period the restart count clears).
"""

from __future__ import annotations

from infervisor.adapters.probe import Health, HealthKind, ServerReport
from infervisor.adapters.status import map_report
from infervisor.replay import Desired, InstanceState, LifecycleState
from infervisor.replay import events as ev
from infervisor.replay.state import elapsed_s

from ..kinds import HealthSample, Healthy, Unhealthy, judge
from .common import after_exit, begin_termination, try_start
from .decision import Draft
from .observations import ProbeResult, Tick
from .process import restart_due
from .rules import Mode, Rules, Tracking

__all__ = ["probe_result", "probe_token", "tick", "wants_probe"]

S = LifecycleState
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


def probe_token(inst: InstanceState) -> int:
    """What a probe is for: the server's pid (0 when there is no process)."""
    return inst.process.pid if inst.process is not None else 0


def probe_result(d: Draft, p: ProbeResult) -> None:
    """Judge one probe: a miss counts toward unhealthy; an answer clears misses."""
    inst = d.inst
    if not wants_probe(inst, d.rules) or p.token != probe_token(inst):
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
        d.track(Tracking(misses=0))
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
    if health.kind is HealthKind.UP:
        d.track(Tracking(misses=0))
        if inst.lifecycle is S.UNHEALTHY:
            what = "ollama" if d.rules.mode is Mode.OLLAMA else "adopted server"
            d.emit(ev.Recovered(detail=f"{what} answers again"))
        else:
            _stable_check(d)
        return
    misses = d.tracking.misses + 1
    d.track(Tracking(misses=misses))
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
        d.track(Tracking(misses=0))
        if not verdict.serving or inst.lifecycle is S.RUNNING:
            return
        if starting or inst.up_since is None:
            d.emit(ev.Ready(detail="adopted server answers", at=d.now))
        else:
            d.emit(ev.Recovered(detail="adopted server answers again"))
        return
    misses = d.tracking.misses + 1
    d.track(Tracking(misses=misses))
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
    d.track(Tracking(misses=misses))
    if not at_once and misses < d.rules.supervision.miss_limit:
        return
    d.emit(ev.Unhealthy(misses=misses, reason=reason))
    if d.inst.desired is Desired.RUNNING:
        grace = d.rules.health_kill_grace_s
        d.emit(ev.Terminating(cause=f"killed: {reason}", grace_s=grace, at=d.now))
        begin_termination(d, grace)


def _uptime(d: Draft) -> float:
    up = d.inst.up_since
    return elapsed_s(up, d.now) if up is not None else 0.0


def _stable_check(d: Draft) -> None:
    """Up for the stability period: the restart count clears (every managed kind)."""
    inst = d.inst
    if inst.lifecycle is not S.RUNNING or not inst.restarts or d.rules.mode is Mode.ADOPTED:
        return
    uptime = _uptime(d)
    if inst.up_since is not None and uptime >= d.rules.supervision.restart.stable_after_s:
        d.emit(ev.StableAgain(uptime_s=uptime))


def tick(d: Draft, _: Tick) -> None:
    """Reconcile: act toward the desired state; retry refused starts."""
    inst = d.inst
    if d.rules.mode is Mode.ADOPTED:
        return
    _stable_check(d)
    if inst.desired is not Desired.RUNNING or inst.exposed:
        return
    if inst.lifecycle is S.EXITED:
        after_exit(d)
    elif inst.lifecycle is S.RESTARTING:
        restart_due(d)
    elif inst.lifecycle in (S.STOPPED, S.LOADED) and not _unload_in_flight(d):
        try_start(d, inst.then_by or "supervisor" if inst.then == "restart" else "supervisor")


def _unload_in_flight(d: Draft) -> bool:
    inst = d.inst
    return d.rules.mode is Mode.OLLAMA and inst.ollama_owned is True and inst.reserved_bytes > 0


def _models_note(report: ServerReport | None) -> str:
    if report is None or not report.models:
        return ""
    return "models: " + ", ".join(report.models[:4])
