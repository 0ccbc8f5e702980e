"""A managed server process (llama.cpp, mlx-lm): its rules, and the table that
reads every observation of a process instance in one place (:data:`RULES`).

Source: ``reference/infer_lifecycle.rs.txt`` (stop by SIGTERM then SIGKILL
of the group; a managed server listening beyond loopback is stopped and held
until reloaded; an unhealthy managed process is killed and restarted under
the policy) and ``reference/host_supervise.rs.txt`` (``judge``).
"""

from __future__ import annotations

from typing import Any

from infervisor.adapters.probe import HealthKind
from infervisor.adapters.status import classify
from infervisor.replay import Desired, LifecycleState
from infervisor.replay import events as ev
from infervisor.replay.state import Then, later

from . import observations as o
from . import residency, verbs
from .boot import boot_process
from .common import (
    after_exit,
    begin_termination,
    describe_exit,
    record_stop,
    remaining_s,
    resets_budget,
    start_checked,
    timer_due,
)
from .decision import Draft, RefusalKind, Rule
from .effects import CancelTimer, CheckStart, Kill, Reap, RemoveWorkdir, Spawn, Timer
from .health import (
    deep_checked,
    judged,
    models_note,
    reconcile,
    set_misses,
    stable_check,
    uptime,
)
from .observations import GroupGone, ListenersSeen, ProcessExited, SpawnFailed, SpawnSucceeded
from .supervision import HealthSample, Healthy, ProbeMethod, Unhealthy, judge

__all__ = ["ON_UNLOAD", "RULES", "stop"]

S = LifecycleState
_OUTPUT_TAIL = 2048


def spawned(d: Draft, s: SpawnSucceeded) -> None:
    """Record the server's identity; a ``process`` kind is healthy once alive."""
    inst = d.inst
    if inst.lifecycle is not S.STARTING or inst.launch_token != s.token:
        return
    d.emit(
        ev.Spawned(
            pid=s.pid,
            pgid=s.pgid,
            start_time=s.start_time,
            boot_id=s.boot_id,
            argv=s.argv,
            at=d.now,
        )
    )
    if d.rules.supervision.probe is ProbeMethod.PROCESS:
        d.emit(ev.Ready(detail="alive (process kind: a live process is healthy)", at=d.now))


def spawn_failed(d: Draft, f: SpawnFailed) -> None:
    """The program could not run: an exit like any other (the policy decides)."""
    if d.inst.lifecycle is not S.STARTING or d.inst.launch_token != f.token:
        return
    d.emit(ev.Exited(pid=None, exit_code=None, signal=None, reason=f.reason))
    d.refuse(RefusalKind.SPAWN, f.reason)
    after_exit(d)


def process_exited(d: Draft, e: ProcessExited) -> None:
    """The leader exited: reap what is left of its tree (a stop's grace first).

    A stop in progress gives the rest of the tree what is left of its grace
    (the children clean up too); a crash ends the rest at once."""
    inst = d.inst
    if inst.process is None or inst.process.pid != e.pid:
        return
    term = inst.terminating
    left = 0.0 if term is None else max(0.0, remaining_s(later(term.at, term.grace_s), d.now))
    d.do(Reap(grace_s=left))


def group_gone(d: Draft, g: GroupGone) -> None:
    """Nothing of the group is left: record the exit, then decide what follows."""
    inst = d.inst
    if inst.process is None or inst.process.pid != g.pid:
        return
    cause = inst.terminating.cause if inst.terminating is not None else _unasked(g)
    if g.oom_killed:
        cause = f"killed by the kernel's OOM killer (memory limit {g.memory_max_bytes} bytes)"
    reason = f"{cause}: {describe_exit(g.exit_code, g.signal)}"
    if g.note:
        reason += f"; {g.note}"
    d.emit(
        ev.Exited(
            pid=g.pid,
            exit_code=g.exit_code,
            signal=g.signal,
            reason=reason,
            output_tail=g.output_tail[-_OUTPUT_TAIL:],
            oom_killed=g.oom_killed,
            memory_max_bytes=g.memory_max_bytes if g.oom_killed else None,
        )
    )
    d.do(CancelTimer(name=Timer.KILL))
    after_exit(d)


def _unasked(g: GroupGone) -> str:
    """The cause of an exit nobody here asked for."""
    return "exited on its own" if g.signal is None else "killed by a signal infervisor did not send"


def listeners_seen(d: Draft, seen: ListenersSeen) -> None:
    """Our own server answering beyond loopback is stopped and held until reloaded."""
    inst = d.inst
    if inst.process is None or not seen.owned_beyond:
        return
    if inst.terminating is not None or inst.lifecycle is S.STOPPING:
        return
    d.emit(ev.Exposed(addresses=list(seen.owned_beyond)))
    grace = d.rules.exposure_grace_s
    d.emit(ev.Terminating(cause="stopped: listening beyond loopback", grace_s=grace, at=d.now))
    d.do(CancelTimer(name=Timer.RESTART))
    begin_termination(d, grace)


# ---------------------------------------------------------------- verbs
def stop(d: Draft, by: str, grace_s: float, reason: str, then: Then) -> None:
    """SIGTERM the group, SIGKILL after the grace; a second stop kills at once."""
    inst = d.inst
    escalate = inst.lifecycle is S.STOPPING
    holds = inst.process is not None
    grace = record_stop(d, by, grace_s, reason, then=then, holds_something=holds, escalate=escalate)
    if grace is None:
        return
    if escalate:
        d.do(Kill())
    elif d.inst.process is not None:
        begin_termination(d, grace)
    else:
        after_exit(d)


def stop_verb(d: Draft, v: o.StopVerb) -> None:
    """Stop: SIGTERM, SIGKILL after the grace; a second stop escalates at once."""
    stop(d, v.by, v.grace_s, v.reason, Then.NOTHING)


def restart_verb(d: Draft, v: o.RestartVerb) -> None:
    """Check the weights first (a restart must not take down a server that serves
    for a launch that would be refused), then stop and start as one decision."""
    inst = d.inst
    if inst.process is not None and inst.then != Then.RESTART and inst.lifecycle is not S.STOPPING:
        reset = resets_budget(v.by)
        d.do(CheckStart(by=v.by, reset_budget=reset, attempt=0, verb=True, weights_only=True))
        return
    verbs.restart(d, v, holds_something=inst.process is not None, stop=stop)


def checked(d: Draft, c: o.StartChecked) -> None:
    """A start's checks came back: launch the server, or (a restart's pre-check
    of the weights) stop it to restart; a refused pre-check leaves it running."""
    if not c.precheck:
        token = f"{d.inst.instance_id[:12]}-{d.inst.last_seq + 1}"
        start_checked(d, c, token=token, launch=Spawn(token=token))
        return
    inst = d.inst
    if inst.process is None or inst.then == Then.RESTART or inst.lifecycle is S.STOPPING:
        return  # the server went meanwhile, or a restart is already under way
    if c.model_refusal is not None:
        refusal = f"weights refused before launch: {c.model_refusal}"
        if inst.refusal != refusal:
            d.emit(ev.StartRefused(by=c.by, reason=refusal))
        d.refuse(RefusalKind.ADMISSION, f"{refusal}; the running server was left as it is")
        return
    stop(d, c.by, d.rules.stop_grace_s, "restart", Then.RESTART)


def unload_verb(d: Draft, v: o.UnloadVerb) -> None:
    """Stop the server (the unload's grace), then forget the instance and its workdir."""
    inst = d.inst
    if inst.process is None:
        d.do(CancelTimer(name=Timer.RESTART), CancelTimer(name=Timer.KILL))
        d.emit(ev.Unloaded(by=v.by))
        return
    if inst.lifecycle is S.STOPPING:
        grace = record_stop(d, v.by, v.grace_s, "unload", then=Then.UNLOAD, holds_something=True)
        begin_termination(d, grace or 0.0)
        return
    stop(d, v.by, v.grace_s, "unload", Then.UNLOAD)


def lease_lapsed(d: Draft, lease: o.LeaseLapsed) -> None:
    """Stop a continuous instance the lapsed controller placed; it stays stopped
    (``verbs.lease_lapsed``)."""
    verbs.lease_lapsed(d, lease, stop)


# ---------------------------------------------------------------- health
def probe_result(d: Draft, p: o.ProbeResult) -> None:
    """Judge one probe with the kind's judge: a miss counts toward unhealthy (and a
    kill); an answer clears the misses, makes a starting server ready, and clears
    the restart budget once up for the stability period."""
    if not judged(d, p):
        return
    inst, rules = d.inst, d.rules
    starting = inst.lifecycle is S.STARTING
    if p.failure is not None and starting:
        _miss(d, f"the server reported: {p.failure}", at_once=True)
        return
    status, phase = classify(
        rules.flavor, rules.served_model, p.report, alive=True, adopted=False, load=None
    )
    sample = HealthSample(
        status=status,
        phase=phase,
        continuous=rules.continuous,
        starting=starting,
        elapsed_s=uptime(d),
    )
    verdict = judge(rules.supervision, sample)
    if isinstance(verdict, Unhealthy):
        health = p.report.health
        unreachable = health.kind is HealthKind.UNREACHABLE
        # A server that served and stopped answering is not "starting".
        why = f"not answering: {health.reason}" if unreachable and not starting else verdict.reason
        _miss(d, why)
    elif isinstance(verdict, Healthy):
        set_misses(d, 0)
        if not verdict.serving:
            return
        if starting:
            d.emit(ev.Ready(detail=models_note(p.report), at=d.now))
        else:
            stable_check(d)


def _miss(d: Draft, reason: str, *, at_once: bool = False) -> None:
    """Enough misses in a row make the server unhealthy, and it is killed."""
    misses = d.tracking.misses + 1
    set_misses(d, misses)
    if not at_once and misses < d.rules.supervision.miss_limit:
        return
    unhealthy_kill(d, misses, reason)


def unhealthy_kill(d: Draft, misses: int, reason: str) -> None:
    """Unhealthy; a server still wanted running is killed (then restarted)."""
    d.emit(ev.Unhealthy(misses=misses, reason=reason))
    if d.inst.desired is Desired.RUNNING:
        grace = d.rules.health_kill_grace_s
        d.emit(ev.Terminating(cause=f"killed: {reason}", grace_s=grace, at=d.now))
        begin_termination(d, grace)


def deep_result(d: Draft, c: o.DeepChecked) -> None:
    """A failed deep check counts like a miss: ``miss_limit`` in a row kill the
    server (restarted under the policy); a token clears them."""
    deep_checked(d, c, unhealthy_kill)


def tick(d: Draft, _: o.Tick) -> None:
    """Reconcile toward the desired state; a ``process`` kind (no probe: a live
    process is its health) clears its restart budget once up long enough."""
    if d.rules.supervision.probe is ProbeMethod.PROCESS:
        stable_check(d)
    reconcile(d)


#: Every observation of a managed process and the rule that decides it.
RULES: dict[type[Any], Rule] = {
    o.StartVerb: verbs.start_verb,
    o.StopVerb: stop_verb,
    o.RestartVerb: restart_verb,
    o.UnloadVerb: unload_verb,
    o.PlacementVerb: verbs.placement,
    o.LeaseLapsed: lease_lapsed,
    o.StartChecked: checked,
    o.SpawnSucceeded: spawned,
    o.SpawnFailed: spawn_failed,
    o.ProcessExited: process_exited,
    o.GroupGone: group_gone,
    o.TimerDue: timer_due,
    o.ListenersSeen: listeners_seen,
    o.ProbeResult: probe_result,
    o.DeepChecked: deep_result,
    o.Tick: tick,
    o.BootSeen: boot_process,
    **residency.rules_with(stop, tick),
}
#: What forgetting a process instance cleans up: its working directory (and cgroup).
ON_UNLOAD = (RemoveWorkdir(),)
