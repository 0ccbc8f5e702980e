"""Boot: account for what the chain says was running, then resume desired state.

A managed process recorded as running is looked up by pid, process start
time and boot id. If it is still ours it is re-attached: supervised again,
its exit awaited, without a restart and without an unhealthy blip. If it is
gone it is handled as an exit (the restart policy decides). A pid reused by
another process is never signalled, and adopted or unknown processes never
are. Every outcome is an event.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from infervisor.adapters.errors import AdmissionRefused, SpawnError
from infervisor.adapters.process import AttachedProcess, ProcessIdentity
from infervisor.replay import Desired, LifecycleState
from infervisor.replay import events as ev

from .errors import InvalidState

if TYPE_CHECKING:
    from .process_driver import ProcessDriver

__all__ = ["recover_process"]

log = logging.getLogger(__name__)
S = LifecycleState
_RESUMABLE = (S.LOADED, S.STOPPED, S.RESTARTING)


def recover_process(driver: ProcessDriver) -> None:
    """Make the instance's sourced state true again after the node (re)started."""
    if _reattach_or_record_exit(driver):
        return
    state = driver.state
    if state.desired is not Desired.RUNNING:
        return
    if state.lifecycle is S.EXITED:
        driver.after_exit()  # gone while the node was down: an exit like any other
        return
    if state.lifecycle not in _RESUMABLE:
        return
    try:
        driver.launch("boot")
    except (AdmissionRefused, SpawnError, InvalidState) as e:
        log.warning("%s: could not resume at boot: %s", state.instance_id, e)


def _reattach_or_record_exit(driver: ProcessDriver) -> bool:
    """True when the recorded process was re-attached (nothing more to do)."""
    state = driver.state
    rec = state.process
    if rec is None:
        if state.lifecycle in (S.STARTING, S.RUNNING, S.UNHEALTHY, S.STOPPING):
            why = "no server process was recorded when the node stopped"
            driver.commit(ev.Exited(pid=None, exit_code=None, signal=None, reason=why), "node")
        return False
    identity = ProcessIdentity(
        pid=rec.pid, pgid=rec.pgid, start_time=rec.start_time, boot_id=rec.boot_id
    )
    proc = AttachedProcess.attach(identity, driver.adapter.plan.cwd, driver.exit_callback())
    if proc is None:
        why = f"pid {rec.pid} was gone when the node started again"
        driver.commit(ev.Exited(pid=rec.pid, exit_code=None, signal=None, reason=why), "node")
        return False
    driver.reattach(proc)
    driver.commit(ev.Reattached(pid=rec.pid), "node")
    if state.lifecycle is S.STOPPING:
        driver.terminate(driver.actor.ctx.settings.stop_grace_s, cause="stop resumed after boot")
    return True
