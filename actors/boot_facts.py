"""What the executor gathers from the world for two observations: what became
of the recorded process at boot, and who owns the listeners beyond loopback.

Boot: a process recorded as running is looked up by pid, start time and boot
id and watched again if it is still that very process; a launch decided but
never recorded as spawned is recognised by its launch token (and by the
kernel's membership of the instance's cgroups); a process that ended while
no node ran is reported with the status its shim kept. Whatever is left in
the instance's server cgroup that no record claims is reported as strays,
for the core to record and end. Nothing that is not ours is ever signalled.
"""

from __future__ import annotations

import contextlib
from typing import Any

from infervisor.adapters.errors import ProbeError
from infervisor.adapters.launched import LaunchedServer
from infervisor.adapters.ports import ListenerSnapshot, owned_listeners
from infervisor.adapters.proc.cgroups import InstanceCgroup
from infervisor.adapters.proc.handles import AttachedProcess
from infervisor.adapters.proc.identity import ProcessIdentity
from infervisor.adapters.proc.records import read_exit_status
from infervisor.adapters.proc.recovery import LaunchEnded, LaunchRunning, recover_launch
from infervisor.adapters.server import ServerAdapter
from infervisor.replay import InstanceState

from .core.observations import BootSeen, ProcessAlive, ProcessGone, ProcessNone
from .effects_runner import EffectRunner

__all__ = ["boot_seen", "gather", "owned_beyond"]


def boot_seen(
    adapter: ServerAdapter, state: InstanceState, runner: EffectRunner, *, held: bool = False
) -> BootSeen:
    """The boot observation of one instance: what became of its process, and
    the strays in its server cgroup when no live server claims them (``held``:
    not to be started again, a drained node's controller instance)."""
    cgroup = _cgroup(runner) if isinstance(adapter, LaunchedServer) else None
    facts = gather(adapter, state, runner, cgroup)
    if cgroup is None or isinstance(facts, ProcessAlive):
        return BootSeen(process=facts, held=held)
    strays = sorted(cgroup.server_members())
    server = cgroup.tree + "/server"
    return BootSeen(process=facts, strays=strays, cgroup=server if strays else "", held=held)


def _cgroup(runner: EffectRunner) -> InstanceCgroup | None:
    ctx = runner.actor.ctx
    containment = getattr(ctx, "containment", None)
    return None if containment is None else containment.cgroup(runner.actor.iid)


def gather(
    adapter: ServerAdapter,
    state: InstanceState,
    runner: EffectRunner,
    cgroup: InstanceCgroup | None = None,
) -> ProcessAlive | ProcessGone | ProcessNone:
    """The boot facts of one instance; a live process is handed to ``runner``."""
    if not isinstance(adapter, LaunchedServer):
        return ProcessNone()
    cwd = adapter.plan.cwd
    rec = state.process
    token = state.launch_token or None
    if rec is None:
        if token and state.lifecycle.value == "starting":
            return _recover(runner, cwd, token, cgroup)
        return ProcessNone()
    identity = ProcessIdentity(
        pid=rec.pid, pgid=rec.pgid, start_time=rec.start_time, boot_id=rec.boot_id
    )
    proc = AttachedProcess.attach(identity, cwd, runner.on_exit, token=token, cgroup=cgroup)
    if proc is None:
        status = _exit_status(cwd, token)
        why = f"pid {rec.pid} was gone when the node started again"
        return ProcessGone(pid=rec.pid, exit_code=status[0], signal=status[1], reason=why)
    runner.proc = proc
    return ProcessAlive(pid=rec.pid, pgid=rec.pgid, start_time=rec.start_time, boot_id=rec.boot_id)


def _exit_status(cwd: str, token: str | None) -> tuple[int | None, int | None]:
    found = read_exit_status(cwd, token) if token else None
    return (None, None) if found is None else found


def _recover(
    runner: EffectRunner, cwd: str, token: str, cgroup: InstanceCgroup | None
) -> ProcessAlive | ProcessGone | ProcessNone:
    found = recover_launch(cwd, token, runner.on_exit, cgroup=cgroup)
    if isinstance(found, LaunchRunning):
        runner.proc = found.process
        i = found.identity
        return ProcessAlive(
            pid=i.pid, pgid=i.pgid, start_time=i.start_time, boot_id=i.boot_id, recovered=True
        )
    if isinstance(found, LaunchEnded):
        why = found.error or "the server it launched ended while no node ran"
        return ProcessGone(pid=None, exit_code=found.exit_code, signal=found.signal, reason=why)
    return ProcessNone()


def owned_beyond(
    adapter: ServerAdapter,
    state: InstanceState,
    runner: EffectRunner,
    listeners: ListenerSnapshot | dict[int, list[str]],
) -> tuple[str, ...]:
    """Addresses beyond loopback on the instance's port owned by its own process
    group or tracked descendants (another program's listener does not count)."""
    proc = runner.proc
    if proc is None or state.process is None:
        return ()
    port = adapter.spec.port
    if isinstance(listeners, ListenerSnapshot):
        with contextlib.suppress(ProbeError, OSError):
            found = owned_listeners(
                listeners.beyond_loopback(port), proc.identity.pgid, _descendants(proc)
            )
            return tuple(found)
        return ()
    return tuple(listeners.get(port, ()))  # an old snapshot without owners


def _descendants(proc: Any) -> dict[int, float]:
    known = getattr(proc, "descendants", None)
    return dict(known()) if callable(known) else {}
