"""Boot: one more observation. Account for what the chain says was running,
then resume what the live node would have done.

A recorded process still running is re-attached (and a termination in
flight resumed: SIGTERM again and the stop's full grace from the boot, recorded,
since the boot cannot know whether the dead node sent SIGTERM); one that ended while no node
ran is recorded with the status its shim kept, and the restart policy (or a
one-shot's clean finish) follows; a launch interrupted before its spawn was
recorded is recognised by its launch token.
"""

from __future__ import annotations

from infervisor.replay import Desired, InstanceState, LifecycleState
from infervisor.replay import events as ev
from infervisor.replay.callers import Role
from infervisor.replay.state import Stamp, Then, later

from .common import (
    STARTABLE,
    after_exit,
    demand_pending,
    describe_exit,
    restart_due,
    try_start,
    unloading,
)
from .decision import Draft
from .effects import ArmTimer, CheckResident, EndStrays, Terminate, Timer, UnloadModel
from .observations import BootSeen, ProcessAlive, ProcessGone

__all__ = ["boot_ollama", "boot_process"]

S = LifecycleState
_HAD_PROCESS = frozenset({S.STARTING, S.RUNNING, S.UNHEALTHY, S.STOPPING})


def boot_process(d: Draft, b: BootSeen) -> None:
    """Account for the recorded process: re-attach a live one (resuming a
    termination in flight), record one that ended, relaunch a launch the node
    died before, end stray processes in its cgroup; then resume what the live
    node would have done."""
    if b.strays:
        # Nothing claims them: end them, recorded, before anything starts.
        d.emit(ev.StraysEnded(pids=list(b.strays), cgroup=b.cgroup))
        d.do(EndStrays())
    before = len(d.events)
    match b.process:
        case ProcessAlive():
            _reattach(d, b.process, b.held)
            return
        case ProcessGone():
            _gone(d, b.process, b.held)
        case _:
            if d.inst.lifecycle is S.STARTING and d.inst.process is None:
                _relaunch(d, b.held)
            elif d.inst.lifecycle in _HAD_PROCESS:
                why = "no server process was recorded when the node stopped"
                d.emit(ev.Exited(pid=None, exit_code=None, signal=None, reason=why))
                _exited_at_boot(d, b.held)
    if len(d.events) == before:
        _resume(d, b.held)


def _relaunch(d: Draft, held: bool) -> None:
    """A start was recorded but its launch never ran (the node died between the
    two): start again, as the live node would have been running it. Not a
    restart, so it spends no budget. A held instance is not started."""
    if held:
        why = "the launch was interrupted before it ran (the node stopped); the node is drained"
        d.emit(ev.Exited(pid=None, exit_code=None, signal=None, reason=why))
        return
    why = "the launch was interrupted before it ran (the node stopped): starting it again"
    d.emit(ev.Exited(pid=None, exit_code=None, signal=None, reason=why))
    try_start(d, Role.BOOT)


def _reattach(d: Draft, p: ProcessAlive, held: bool = False) -> None:
    inst = d.inst
    # The uptime recorded at spawn is on the monotonic clock; the process's own
    # start time is wall time, which a clock step moves. Only a launch that was
    # never recorded as spawned has nothing better.
    started = inst.up_since if inst.up_since is not None else _stamp_of(p.start_time, d.now)
    if p.recovered:
        d.emit(
            ev.Spawned(
                pid=p.pid,
                pgid=p.pgid,
                start_time=p.start_time,
                boot_id=p.boot_id,
                argv=[],
                at=started,
            )
        )
    d.emit(ev.Reattached(pid=p.pid, up_since=started))
    term = inst.terminating
    if term is not None and not held and inst.lifecycle is S.STOPPING and _wanted_back(inst):
        _restart_after_shutdown(d, term.grace_s)
    elif term is not None and term.grace_s > 0:
        # The dead node may have recorded the stop and died before its SIGTERM: the
        # server is owed its whole grace, from now, recorded (a second boot reads it).
        d.emit(ev.Terminating(cause=term.cause, grace_s=term.grace_s, at=d.now))
        d.do(Terminate(), ArmTimer(name=Timer.KILL, due=later(d.now, term.grace_s)))
    elif term is not None:  # an escalated stop (grace 0): SIGKILL at once, as recorded
        d.do(Terminate(), ArmTimer(name=Timer.KILL, due=later(term.at, term.grace_s)))
    elif inst.lifecycle is S.STOPPING:
        d.do(Terminate(), ArmTimer(name=Timer.KILL, due=later(d.now, d.rules.stop_grace_s)))


def _gone(d: Draft, p: ProcessGone, held: bool = False) -> None:
    inst = d.inst
    if inst.process is None and inst.lifecycle not in _HAD_PROCESS:
        return
    cause = inst.terminating.cause if inst.terminating is not None else p.reason
    reason = f"{cause}: {describe_exit(p.exit_code, p.signal)}"
    d.emit(ev.Exited(pid=p.pid, exit_code=p.exit_code, signal=p.signal, reason=reason))
    _exited_at_boot(d, held)


def _exited_at_boot(d: Draft, held: bool) -> None:
    """An exit the boot has just recorded: what follows it, decided now.

    | after the exit                                    | the boot       |
    |---------------------------------------------------|----------------|
    | held (the node is drained)                        | nothing        |
    | stopped, nothing to follow, still wanted running  | starts it      |
    | anything else                                     | ``after_exit`` |

    The second row is a shutdown's stop the node was killed in the middle of:
    the live node that boots wants it running (the shutdown left it wanted so),
    as :func:`_resume` starts one whose exit the shutdown did record. Left to
    ``after_exit`` (a stop with nothing to follow), it would wait for the
    supervisor's reconcile tick."""
    if held:
        return
    if d.inst.lifecycle is S.STOPPED and _wanted_back(d.inst):
        try_start(d, Role.BOOT)
        return
    after_exit(d)


def _wanted_back(inst: InstanceState) -> bool:
    """Stopped (or stopping) by the node's shutdown: nothing to follow the stop, and
    still wanted running (a shutdown leaves it so; any other stop records it is not)."""
    return inst.then == Then.NOTHING and inst.desired is Desired.RUNNING and not inst.exposed


def _restart_after_shutdown(d: Draft, grace_s: float) -> None:
    """A live server the shutdown was stopping when the node died: the stop goes on
    (SIGTERM again, SIGKILL once the stop's full grace has passed from now), and the
    boot records that the server is started again once it is gone (``then``
    restart, by the boot), as it starts one whose exit it finds
    (:func:`_exited_at_boot`).

    Why the full grace and not what is left of it (stop 33): the dead node may have
    recorded the stop and died before it sent SIGTERM, and the boot cannot tell;
    what was left of the grace was then spent on a server never asked to stop,
    and it got SIGKILL at once. The full grace keeps the recorded promise; a
    server that did get SIGTERM waits one grace more at most. Recorded in the
    event, so a boot after another crash reads it and decides the same."""
    why = "the shutdown's stop, resumed at boot: started again once stopped"
    d.emit(ev.StopRequested(by=Role.BOOT, grace_s=grace_s, reason=why, then=Then.RESTART, at=d.now))
    d.do(Terminate(), ArmTimer(name=Timer.KILL, due=later(d.now, grace_s)))


def _resume(d: Draft, held: bool = False) -> None:
    """Nothing was running: go on toward the desired state (a held instance is
    not started again: the node is drained)."""
    inst = d.inst
    if inst.lifecycle is S.STOPPED and inst.then:
        after_exit(d)  # what the stop was for: unload, or start again
        return
    if held or inst.desired is not Desired.RUNNING or inst.exposed:
        return
    if demand_pending(inst):
        return  # the node resumes the demand after boot (making room first: Node.open)
    if inst.lifecycle is S.EXITED:
        after_exit(d)  # gone while the node was down, or its follow-up was lost
    elif inst.lifecycle is S.RESTARTING:
        restart_due(d)
    elif inst.lifecycle in STARTABLE:
        try_start(d, Role.BOOT)


def boot_ollama(d: Draft, b: BootSeen) -> None:
    """A loaded model comes back with the fold; a start or an unload in flight goes
    on; otherwise resume what the live node would have done."""
    inst = d.inst
    if inst.lifecycle in (S.RUNNING, S.UNHEALTHY):
        return  # still loaded: its reservation comes back with the fold
    if inst.lifecycle is S.STARTING:
        d.do(CheckResident())  # go on with the start
        return
    if unloading(inst):
        d.do(UnloadModel())  # an unload was in flight
        return
    _resume(d, b.held)


def _stamp_of(start_time_s: float, now: Stamp) -> Stamp:
    """A process's start time as a stamp (monotonic reckoned back from now)."""
    ago = max(0.0, now.wall_ns / 1e9 - start_time_s)
    return Stamp(wall_ns=int(start_time_s * 1e9), mono_s=now.mono_s - ago, boot_id=now.boot_id)
