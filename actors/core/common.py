"""What every mode shares: the restart policy after an exit, what follows a
stop, starts and their refusals, recording a stop, terminations, the restart
timer, and time arithmetic. No function here looks at the mode: what differs
is passed in by the mode's own rules (process.py, ollama.py, adopted.py)."""

from __future__ import annotations

import signal

from infervisor.replay import Desired, InstanceState, LifecycleState
from infervisor.replay import events as ev
from infervisor.replay import residency_events as rev
from infervisor.replay.callers import Role, role_of
from infervisor.replay.policy import (
    Exhausted,
    RestartPolicy,
    decide_restart,
    jitter_unit,
    restarts_in_window,
)
from infervisor.replay.state import Stamp, Then, later

from .decision import Draft, RefusalKind
from .effects import ArmTimer, AskRoom, CancelTimer, CheckStart, Effect, Kill, Terminate, Timer
from .observations import StartChecked, TimerDue

__all__ = [
    "STARTABLE",
    "after_exit",
    "armed_kill",
    "begin_termination",
    "demand_pending",
    "describe_exit",
    "node_decided",
    "record_stop",
    "remaining_s",
    "resets_budget",
    "restart_due",
    "scheduled_attempt",
    "start_cause",
    "start_checked",
    "timer_due",
    "try_start",
    "unloading",
]

S = LifecycleState
#: States a start may leave.
STARTABLE = frozenset(
    {S.LOADED, S.STOPPED, S.EXITED, S.FAILED, S.FINISHED, S.RESTARTING, S.RESTING}
)


def demand_pending(inst: InstanceState) -> bool:
    """A demand was recorded (``residency.demanded``) and its start was not: the
    node's demand goes on (making room first); boot resumes it the same way."""
    return inst.demanded and inst.lifecycle in STARTABLE


def unloading(inst: InstanceState) -> bool:
    """An unload of this node's Ollama model is in flight: stopped, the model
    ours and still reserved, and no failure of the unload recorded."""
    return (
        inst.lifecycle in (S.STOPPED, S.RESTING)
        and inst.ollama_owned is True
        and inst.reserved_bytes > 0
        and not inst.unload_error
    )


def armed_kill(inst: InstanceState) -> Stamp | None:
    """When the SIGKILL of a termination in flight is due (None: none in flight)."""
    term = inst.terminating
    if term is None or inst.process is None:
        return None
    return later(term.at, term.grace_s)


def scheduled_attempt(inst: InstanceState, policy: RestartPolicy) -> int:
    """The attempt number the scheduled restart was recorded with
    (``instance.restart_scheduled``), so its ``instance.starting`` says the same:
    the restarts counted in the window at the moment it was decided (all of
    them since the last clear when the policy has no window)."""
    if policy.window_s is None or not inst.restart_stamps:
        return inst.restarts
    return restarts_in_window(inst, policy, inst.restart_stamps[-1])


def remaining_s(due: Stamp, now: Stamp) -> float:
    """Seconds until ``due`` (negative once past): monotonic within one boot."""
    if due.boot_id and due.boot_id == now.boot_id:
        return due.mono_s - now.mono_s
    return (due.wall_ns - now.wall_ns) / 1e9


def describe_exit(exit_code: int | None, sig: int | None) -> str:
    """``exit code 1``, ``signal 9 (SIGKILL)``, or that the status is unknown."""
    if sig is not None:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "?"
        return f"signal {sig} ({name})"
    if exit_code is not None:
        return f"exit code {exit_code}"
    return "exit status unknown"


def begin_termination(d: Draft, grace_s: float) -> None:
    """SIGTERM now; the ``kill`` timer brings SIGKILL after ``grace_s``."""
    d.do(Terminate(), ArmTimer(name=Timer.KILL, due=later(d.now, grace_s)))


def after_exit(d: Draft) -> None:
    """The server is gone: finish a stop, or apply the restart policy."""
    inst = d.inst
    if inst.lifecycle is S.STOPPED:
        _follow_stop(d)
        return
    if inst.lifecycle is S.RESTING:
        return  # evicted or expired: it rests until a demand
    if inst.lifecycle is not S.EXITED or inst.desired is not Desired.RUNNING:
        return
    code = inst.last_exit.exit_code if inst.last_exit is not None else None
    if code == 0 and not d.rules.continuous:
        d.emit(ev.Finished(exit_code=0))
        return
    _schedule_restart(d, inst.reason)


def _schedule_restart(d: Draft, reason: str) -> None:
    inst = d.inst
    policy = d.rules.supervision.restart
    unit = jitter_unit(inst.instance_id, inst.restarts, inst.last_seq)
    decision = decide_restart(inst, policy, d.now, unit)
    if isinstance(decision, Exhausted):
        why = f"restart budget spent ({decision.attempts} restarts): {reason}"
        d.emit(ev.Failed(attempts=decision.attempts, reason=why))
        return
    due = later(d.now, decision.delay_s)
    d.emit(
        ev.RestartScheduled(
            attempt=decision.attempt, delay_s=decision.delay_s, reason=reason, at=d.now, due=due
        )
    )
    d.do(ArmTimer(name=Timer.RESTART, due=due))


def _follow_stop(d: Draft) -> None:
    """What the stop was for: an unload forgets, a restart starts again."""
    inst = d.inst
    if inst.then == Then.UNLOAD:
        d.emit(ev.Unloaded(by=inst.then_by or Role.OPERATOR))
    elif inst.then == Then.RESTART:
        try_start(d, inst.then_by or Role.OPERATOR)


def resets_budget(by: str) -> bool:
    """Only an operator's start clears the restart budget (``RestartPolicy``)."""
    return role_of(by) == Role.OPERATOR


def try_start(
    d: Draft,
    by: str,
    *,
    attempt: int = 0,
    verb: bool = False,
    demand: bool = False,
    request: str = "",
    model: str = "",
    planned: bool = False,
) -> None:
    """Ask for the start checks (address, memory); :func:`start_checked` goes on.
    ``demand``: a start whose memory refusal the node answers by making room
    (a request's, or a verb's through the node). ``request``/``model``: a
    request's, recorded as ``residency.demanded`` with the start. ``planned``:
    the node planned room for it already (a memory refusal is recorded)."""
    reset = resets_budget(by)
    d.do(
        CheckStart(
            by=by,
            reset_budget=reset,
            attempt=attempt,
            verb=verb,
            demand=demand,
            request=request,
            model=model,
            planned=planned,
        )
    )


def start_checked(d: Draft, c: StartChecked, *, token: str, launch: Effect) -> None:
    """Start over a free address, on verified weights, with the memory reserved,
    then ``launch`` (a spawn with launch ``token``, or Ollama's residency check);
    or record the refusal once per cause (a refused restart keeps its attempt
    and is tried again)."""
    inst = d.inst
    if inst.lifecycle not in STARTABLE or inst.exposed:
        return
    if not c.verb and inst.desired is not Desired.RUNNING and inst.then != Then.RESTART:
        return  # stopped meanwhile
    refusal = _refusal(c)
    if refusal is not None and c.demand and refusal == c.memory_refusal:
        d.refuse(RefusalKind.MEMORY, refusal)  # the node makes room, or records residency.refused
        return
    if refusal is not None and refusal == c.memory_refusal and node_decided(c):
        d.do(AskRoom(by=c.by, cause=start_cause(inst, c.by, c.attempt)))
        return  # the node makes room, or records residency.refused (once per cause)
    if refusal is not None:
        # Once per cause; but a demand's refusal always, as it ends the demand its
        # own ``residency.demanded`` began (replay/instance_rules.py), whatever came before.
        if inst.refusal != refusal or demand_pending(inst):
            d.emit(ev.StartRefused(by=c.by, reason=refusal))
        if c.verb:
            admission = c.taken is not None or c.model_refusal is not None
            d.refuse(RefusalKind.ADMISSION if admission else RefusalKind.MEMORY, refusal)
        elif inst.then == Then.RESTART:
            d.refuse(RefusalKind.FAILED, refusal)  # answers a restart verb still waiting
        return
    if c.request and not inst.demanded:  # a request's start: a use, with the start
        d.emit(rev.ResidencyDemanded(request=c.request, model=c.model, by=c.by))
    d.emit(
        ev.Starting(
            by=c.by,
            reset_budget=c.reset_budget,
            attempt=c.attempt,
            reserved_bytes=c.reserved_bytes,
            launch_token=token,
            at=d.now,
        )
    )
    d.do(CancelTimer(name=Timer.RESTART), launch)


#: Who decides a start of the node's own (no caller asked for it).
_NODE_ROLES = frozenset({Role.SUPERVISOR, Role.BOOT})


def node_decided(c: StartChecked) -> bool:
    """A start the node decided itself (a restart coming due, a boot resuming an
    instance wanted running), not yet planned for: one that does not fit makes
    room by the residency policy, as a verb's or request's does. It is no use of
    the instance (``instance.starting`` by the supervisor or boot: its last use
    stays as it was)."""
    return not (c.verb or c.demand or c.planned) and role_of(c.by) in _NODE_ROLES


def start_cause(inst: InstanceState, by: str, attempt: int) -> str:
    """Why a start the node decided is made, as an eviction for it records it."""
    if attempt > 0:
        return f"its restart after an exit (attempt {attempt})"
    if role_of(by) == Role.BOOT:
        return "its start at boot (it was wanted running)"
    return f"its start by the {role_of(by)} ({inst.lifecycle}, wanted running)"


def _refusal(c: StartChecked) -> str | None:
    if c.taken is not None:
        return f"{c.taken} is already taken by something else; not starting over it"
    if c.model_refusal is not None:
        return f"weights refused before launch: {c.model_refusal}"
    return c.memory_refusal


def record_stop(
    d: Draft,
    by: str,
    grace_s: float,
    reason: str,
    *,
    then: Then,
    holds_something: bool,
    escalate: bool = False,
) -> float | None:
    """Record a stop (``instance.stop_requested``); the grace recorded, or None
    when there was nothing to stop (a shutdown leaves the state as the chain
    says; a stopped instance, or a placed one never started (``loaded``), with
    no restart pending and not wanted running stays as it is: docs/cli.md's
    "a stopped instance records nothing"; stop 33's trial recorded
    ``loaded -> stopped`` for one).

    ``holds_something``: a server process, or a model Ollama holds for us.
    ``escalate``: a second stop while stopping, recorded with grace 0 so a boot
    kills at once too. A kill already armed (a health kill) holds: a stop
    never pushes the SIGKILL later, so the grace is at most what is left."""
    inst = d.inst
    # Stopped by a shutdown, it is still wanted running: a stop records that it is not.
    wanted = inst.desired is Desired.RUNNING
    at_rest = inst.lifecycle in {S.STOPPED, S.LOADED}
    # a refused start's cause still shows (stop 34: "start refused: no room ..." after
    # the stop): the operator's stop is recorded, and it clears the cause
    settled = at_rest and inst.then != Then.RESTART and not wanted and not inst.refusal
    if not holds_something and (by == Role.SHUTDOWN or settled):
        d.do(CancelTimer(name=Timer.RESTART))
        return None
    kill_due = armed_kill(inst)
    if escalate:
        grace_s = 0.0
    elif kill_due is not None:
        grace_s = min(grace_s, max(0.0, remaining_s(kill_due, d.now)))
    d.emit(ev.StopRequested(by=by, grace_s=grace_s, reason=reason, then=then, at=d.now))
    d.do(CancelTimer(name=Timer.RESTART))
    return grace_s


def timer_due(d: Draft, t: TimerDue) -> None:
    """``kill``: SIGKILL once the grace is over; ``restart``: start once due."""
    if t.name == Timer.KILL:
        if d.inst.process is not None and d.inst.terminating is not None:
            d.do(Kill())  # the grace is over (kill timers run in real time)
    elif t.name == Timer.RESTART:
        restart_due(d)


def restart_due(d: Draft) -> None:
    """Start a scheduled restart once its backoff is over (honoured across boots)."""
    inst = d.inst
    if inst.lifecycle is not S.RESTARTING or inst.desired is not Desired.RUNNING:
        return
    if inst.process is not None:
        return
    due = inst.restart_due
    if due is not None and remaining_s(due, d.now) > 1e-3:
        d.do(ArmTimer(name=Timer.RESTART, due=due))
        return
    policy = d.rules.supervision.restart
    try_start(d, Role.SUPERVISOR, attempt=scheduled_attempt(inst, policy))
