"""Rules every kind shares: the restart policy after an exit, what follows a
stop, starts and their refusals, terminations, and time arithmetic."""

from __future__ import annotations

import signal

from infervisor.replay import Desired, InstanceState, LifecycleState
from infervisor.replay import events as ev
from infervisor.replay.callers import role_of
from infervisor.replay.policy import (
    Exhausted,
    RestartPolicy,
    decide_restart,
    jitter_unit,
    restarts_in_window,
)
from infervisor.replay.state import Stamp, later

from .decision import Draft, RefusalKind
from .effects import ArmTimer, CancelTimer, CheckResident, CheckStart, RemoveWorkdir, Spawn
from .observations import StartChecked
from .rules import Mode

__all__ = [
    "STARTABLE",
    "after_exit",
    "armed_kill",
    "begin_termination",
    "describe_exit",
    "remaining_s",
    "scheduled_attempt",
    "start_checked",
    "try_start",
    "unloading",
]

S = LifecycleState
#: States a start may leave.
STARTABLE = frozenset({S.LOADED, S.STOPPED, S.EXITED, S.FAILED, S.FINISHED, S.RESTARTING})


def unloading(inst: InstanceState) -> bool:
    """An unload of this node's Ollama model is in flight: stopped, the model
    ours and still reserved, and no failure of the unload recorded."""
    return (
        inst.lifecycle is S.STOPPED
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
    from .effects import Terminate  # noqa: PLC0415 - keeps this module's imports short

    d.do(Terminate(), ArmTimer(name="kill", due=later(d.now, grace_s)))


def after_exit(d: Draft) -> None:
    """The server is gone: finish a stop, or apply the restart policy."""
    inst = d.inst
    if inst.lifecycle is S.STOPPED:
        _follow_stop(d)
        return
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
    d.do(ArmTimer(name="restart", due=due))


def _follow_stop(d: Draft) -> None:
    """What the stop was for: an unload forgets, a restart starts again."""
    inst = d.inst
    if inst.then == "unload":
        d.emit(ev.Unloaded(by=inst.then_by or "operator"))
        if d.rules.mode is Mode.PROCESS:
            d.do(RemoveWorkdir())
    elif inst.then == "restart":
        by = inst.then_by or "operator"
        d.do(CheckStart(by=by, reset_budget=role_of(by) == "operator", attempt=0, verb=False))


def try_start(d: Draft, by: str, *, attempt: int = 0, verb: bool = False) -> None:
    """Ask for the start checks (address, memory); :func:`start_checked` goes on."""
    d.do(CheckStart(by=by, reset_budget=role_of(by) == "operator", attempt=attempt, verb=verb))


def start_checked(d: Draft, c: StartChecked) -> None:
    """Start over a free address, on verified weights, with the memory reserved;
    or record the refusal once per cause (a refused restart keeps its attempt
    and is tried again)."""
    inst = d.inst
    if inst.lifecycle not in STARTABLE or inst.exposed:
        return
    if not c.verb and inst.desired is not Desired.RUNNING and inst.then != "restart":
        return  # stopped meanwhile
    refusal = _refusal(c)
    if refusal is not None:
        if inst.refusal != refusal:
            d.emit(ev.StartRefused(by=c.by, reason=refusal))
        if c.verb:
            admission = c.taken is not None or c.model_refusal is not None
            d.refuse(RefusalKind.ADMISSION if admission else RefusalKind.MEMORY, refusal)
        elif inst.then == "restart":
            d.refuse(RefusalKind.FAILED, refusal)  # answers a restart verb still waiting
        return
    process = d.rules.mode is Mode.PROCESS
    token = f"{inst.instance_id[:12]}-{inst.last_seq + 1}" if process else ""
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
    d.do(CancelTimer(name="restart"))
    d.do(Spawn(token=token) if process else CheckResident())


def _refusal(c: StartChecked) -> str | None:
    if c.taken is not None:
        return f"{c.taken} is already taken by something else; not starting over it"
    if c.model_refusal is not None:
        return f"weights refused before launch: {c.model_refusal}"
    return c.memory_refusal
