"""A managed server process: spawn results, exits, termination timers,
exposure. Source: ``reference/infer_lifecycle.rs.txt`` (stop by SIGTERM then
SIGKILL of the group; a managed server listening beyond loopback is stopped
and held until reloaded)."""

from __future__ import annotations

from infervisor.replay import Desired, LifecycleState
from infervisor.replay import events as ev
from infervisor.replay.state import later

from .common import (
    after_exit,
    begin_termination,
    describe_exit,
    remaining_s,
    scheduled_attempt,
    try_start,
)
from .decision import Draft, RefusalKind
from .effects import ArmTimer, CancelTimer, Kill, Reap
from .observations import (
    GroupGone,
    ListenersSeen,
    ProcessExited,
    SpawnFailed,
    SpawnSucceeded,
    TimerDue,
)
from .rules import Mode

__all__ = [
    "group_gone",
    "listeners_seen",
    "process_exited",
    "spawn_failed",
    "spawned",
    "timer_due",
]

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
    if d.rules.supervision.probe == "process":
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
    d.do(CancelTimer(name="kill"))
    after_exit(d)


def _unasked(g: GroupGone) -> str:
    """The cause of an exit nobody here asked for."""
    return "exited on its own" if g.signal is None else "killed by a signal infervisor did not send"


def timer_due(d: Draft, t: TimerDue) -> None:
    """``kill``: SIGKILL once the grace is over; ``restart``: start once due."""
    if t.name == "kill":
        _kill_due(d)
    elif t.name == "restart":
        restart_due(d)


def _kill_due(d: Draft) -> None:
    """The grace is over (kill timers run in real time): SIGKILL."""
    inst = d.inst
    if inst.process is not None and inst.terminating is not None:
        d.do(Kill())


def restart_due(d: Draft) -> None:
    """Start a scheduled restart once its backoff is over (honoured across boots)."""
    inst = d.inst
    if inst.lifecycle is not S.RESTARTING or inst.desired is not Desired.RUNNING:
        return
    if inst.process is not None:
        return
    due = inst.restart_due
    if due is not None and remaining_s(due, d.now) > 1e-3:
        d.do(ArmTimer(name="restart", due=due))
        return
    try_start(d, "supervisor", attempt=scheduled_attempt(inst, d.rules.supervision.restart))


def listeners_seen(d: Draft, seen: ListenersSeen) -> None:
    """Our own server answering beyond loopback is stopped and held until reloaded."""
    inst = d.inst
    if d.rules.mode is not Mode.PROCESS or inst.process is None or not seen.owned_beyond:
        return
    if inst.terminating is not None or inst.lifecycle is S.STOPPING:
        return
    d.emit(ev.Exposed(addresses=list(seen.owned_beyond)))
    grace = d.rules.exposure_grace_s
    d.emit(ev.Terminating(cause="stopped: listening beyond loopback", grace_s=grace, at=d.now))
    d.do(CancelTimer(name="restart"))
    begin_termination(d, grace)


__all__ += ["restart_due"]
