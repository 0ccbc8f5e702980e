"""Operator and controller verbs: start, stop, restart, unload, placement, lease.

Source: ``reference/infer_lifecycle.rs.txt`` (``start_instance``,
``stop_instance``, ``unload_instance``: adopted servers are never stopped)
and ``reference/host_supervise.rs.txt`` (``expire_lease``).
"""

from __future__ import annotations

from infervisor.adapters.adopted import STOP_REFUSAL
from infervisor.replay import Desired, LifecycleState
from infervisor.replay import events as ev
from infervisor.replay.callers import role_of

from . import common
from .common import (
    STARTABLE,
    after_exit,
    armed_kill,
    begin_termination,
    remaining_s,
    try_start,
    unloading,
)
from .decision import Draft, RefusalKind
from .effects import (
    AbortLoad,
    CancelTimer,
    CheckAnswers,
    CheckStart,
    Kill,
    RemoveWorkdir,
    UnloadModel,
)
from .observations import (
    AnswersChecked,
    LeaseLapsed,
    PlacementVerb,
    RestartVerb,
    StartChecked,
    StartVerb,
    StopVerb,
    UnloadVerb,
)
from .rules import Mode

__all__ = [
    "answers_checked",
    "lease_lapsed",
    "placement",
    "restart_verb",
    "start_checked",
    "start_verb",
    "stop_verb",
    "unload_verb",
]

S = LifecycleState
_UP = frozenset({S.STARTING, S.RUNNING, S.UNHEALTHY})


def start_verb(d: Draft, v: StartVerb) -> None:
    """Idempotent: answer a live instance as it is; refuse one stopping; else check, start.

    An instance already starting, running or unhealthy (the supervisor handles
    that) gets no event and no refusal; one stopping is refused until it has
    stopped; otherwise the start is checked, then made."""
    inst, mode = d.inst, d.rules.mode
    if mode is Mode.ADOPTED:
        if inst.lifecycle not in (S.RUNNING, S.UNHEALTHY):
            d.do(CheckAnswers(by=v.by))
        return  # already adopted and watched
    if inst.lifecycle in _UP:
        return  # already starting or running: nothing to do
    if inst.lifecycle not in STARTABLE:
        d.refuse(
            RefusalKind.INVALID_STATE,
            f"{inst.instance_id} is {inst.lifecycle}: start it once it has stopped",
        )
        return
    if inst.exposed:
        d.refuse(
            RefusalKind.INVALID_STATE,
            "the server was stopped for listening beyond loopback "
            f"({', '.join(inst.exposed)}); reload the instance",
        )
        return
    if unloading(inst):
        d.refuse(
            RefusalKind.INVALID_STATE,
            f"{inst.instance_id} is unloading its model: start it once the unload has ended",
        )
        return
    d.do(CancelTimer(name="restart"))
    try_start(d, v.by, verb=True)


def answers_checked(d: Draft, a: AnswersChecked) -> None:
    """Adopted: an answering server is watched from now on.

    One that answers it is still loading its model is ``starting``: the health
    probes give it the kind's startup allowance (``health._judge_adopted``) and
    record it ready on its first up answer. One already watched (starting,
    running or unhealthy) is left to the probes."""
    if a.why_not is not None:
        d.refuse(
            RefusalKind.ADMISSION,
            f"adopted server is not answering ({a.why_not}); "
            "infervisor does not start adopted servers",
        )
        return
    if d.inst.lifecycle in _UP:
        return
    d.emit(ev.Starting(by=a.by, reset_budget=role_of(a.by) == "operator", at=d.now))
    if not a.loading:
        d.emit(ev.Ready(detail="adopted server answers", at=d.now))


def stop_verb(d: Draft, v: StopVerb) -> None:
    """Stop: SIGTERM, SIGKILL after the grace; a second stop escalates at once."""
    if d.rules.mode is Mode.ADOPTED:
        if role_of(v.by) != "shutdown":
            d.refuse(RefusalKind.REFUSED, STOP_REFUSAL.format(iid=d.inst.instance_id))
        return
    _stop(d, v.by, v.grace_s, v.reason, then="")


def restart_verb(d: Draft, v: RestartVerb) -> None:
    """Stop (when anything runs), then start: one decision; restarts coalesce."""
    inst = d.inst
    if d.rules.mode is Mode.ADOPTED:
        d.refuse(RefusalKind.REFUSED, STOP_REFUSAL.format(iid=inst.instance_id))
        return
    if inst.then == "restart":
        return  # a restart is already under way: this one joins it
    if inst.lifecycle is S.STOPPING:
        d.refuse(
            RefusalKind.INVALID_STATE,
            f"{inst.instance_id} is stopping: start it once it has stopped",
        )
        return
    if d.rules.mode is Mode.PROCESS and inst.process is not None:
        # The weights first: a restart must not take down a server that serves
        # for a launch that would be refused.
        reset = role_of(v.by) == "operator"
        d.do(CheckStart(by=v.by, reset_budget=reset, attempt=0, verb=True, weights_only=True))
        return
    if _has_something(d):
        _stop(d, v.by, v.grace_s, "restart", then="restart")
        return
    if inst.exposed:
        start_verb(d, StartVerb(by=v.by))  # refused with the reason
        return
    d.do(CancelTimer(name="restart"))
    try_start(d, v.by, verb=True)


def start_checked(d: Draft, c: StartChecked) -> None:
    """A start's checks came back: start, or (a restart's pre-check) stop to restart."""
    if not c.precheck:
        common.start_checked(d, c)
        return
    inst = d.inst
    if inst.process is None or inst.then == "restart" or inst.lifecycle is S.STOPPING:
        return  # the server went meanwhile, or a restart is already under way
    if c.model_refusal is not None:
        refusal = f"weights refused before launch: {c.model_refusal}"
        if inst.refusal != refusal:
            d.emit(ev.StartRefused(by=c.by, reason=refusal))
        d.refuse(RefusalKind.ADMISSION, f"{refusal}; the running server was left as it is")
        return
    _stop(d, c.by, d.rules.stop_grace_s, "restart", then="restart")


def unload_verb(d: Draft, v: UnloadVerb) -> None:
    """Stop what runs (the unload grace), then forget the instance."""
    inst, mode = d.inst, d.rules.mode
    if mode is Mode.ADOPTED or not _has_something(d):
        d.do(CancelTimer(name="restart"), CancelTimer(name="kill"))
        if inst.lifecycle is S.STARTING and mode is Mode.OLLAMA:
            d.do(AbortLoad())
        d.emit(ev.Unloaded(by=v.by))
        if mode is Mode.PROCESS:
            d.do(RemoveWorkdir())
        return
    if mode is Mode.PROCESS and inst.lifecycle is S.STOPPING:
        kill_due = armed_kill(inst)
        grace = v.grace_s if kill_due is None else min(v.grace_s, remaining_s(kill_due, d.now))
        grace = max(0.0, grace)  # the stop's kill holds when it is sooner
        d.emit(ev.StopRequested(by=v.by, grace_s=grace, reason="unload", then="unload", at=d.now))
        begin_termination(d, grace)
        return
    _stop(d, v.by, v.grace_s, "unload", then="unload")


def placement(d: Draft, p: PlacementVerb) -> None:
    """A newer generation is applied, an older one ignored; both recorded."""
    current = d.inst.generation
    if p.generation > current:
        d.emit(ev.Replaced(placed_by=p.placed_by, generation=p.generation))
        return
    d.emit(ev.PlacementIgnored(placed_by=p.placed_by, generation=p.generation, current=current))


def lease_lapsed(d: Draft, lease: LeaseLapsed) -> None:
    """Stop a continuous instance another node placed; it stays stopped."""
    inst, rules = d.inst, d.rules
    if rules.mode is Mode.ADOPTED or not rules.continuous or inst.placed_by == rules.node_id:
        return
    # Wanted running is what a controller's placement holds, whatever the
    # lifecycle: a restart whose start was refused (stopped, a restart pending)
    # or an exit awaiting its restart would otherwise start with no controller.
    if inst.desired is not Desired.RUNNING:
        return
    why = f"controller lease expired: no controller heard for {lease.silent_s:.1f} s"
    _stop(d, "lease", rules.stop_grace_s, why, then="")


def _has_something(d: Draft) -> bool:
    """A server process of ours, or a model Ollama holds for us."""
    inst = d.inst
    if d.rules.mode is Mode.PROCESS:
        return inst.process is not None
    return inst.lifecycle in _UP or (inst.ollama_owned is True and inst.reserved_bytes > 0)


def _stop(d: Draft, by: str, grace_s: float, reason: str, *, then: str) -> None:
    inst = d.inst
    settled = inst.lifecycle is S.STOPPED and inst.then != "restart"  # nothing pending
    if not _has_something(d) and (by == "shutdown" or settled):
        d.do(CancelTimer(name="restart"))
        return  # nothing to stop; a shutdown leaves the state as the chain says
    escalate = d.rules.mode is Mode.PROCESS and inst.lifecycle is S.STOPPING
    was_starting = inst.lifecycle is S.STARTING
    kill_due = armed_kill(inst)
    if escalate:
        grace_s = 0.0  # recorded as it is done, so a boot kills at once too
    elif kill_due is not None:
        # A kill already armed (a health kill) holds: a stop never pushes it later.
        grace_s = min(grace_s, max(0.0, remaining_s(kill_due, d.now)))
    d.emit(ev.StopRequested(by=by, grace_s=grace_s, reason=reason, then=then, at=d.now))
    d.do(CancelTimer(name="restart"))
    if d.rules.mode is Mode.PROCESS:
        if escalate:
            d.do(Kill())
        elif d.inst.process is not None:
            begin_termination(d, grace_s)
        else:
            after_exit(d)
        return
    _stop_ollama(d, was_starting=was_starting)


def _stop_ollama(d: Draft, *, was_starting: bool) -> None:
    """Abort a load in flight; unload only what this node loaded."""
    if was_starting:
        d.do(AbortLoad())
    inst = d.inst
    if inst.ollama_owned is True:
        d.do(UnloadModel())  # memory is released once Ollama no longer lists it
        return
    if inst.reserved_bytes:
        d.emit(ev.MemoryReleased(bytes=inst.reserved_bytes))
    after_exit(d)
