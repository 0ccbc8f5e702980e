"""Boot: account for what the chain says was running, then resume desired state.

A managed process recorded as running is looked up by pid, start time and
boot id. One that is gone is recorded as an exit. One that is still ours is
stopped and recorded (re-attaching without a restart is the supervision
issue's work). A pid reused by another process is never signalled. Every
outcome is an event.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from infervisor.adapters.errors import AdmissionRefused, SpawnError
from infervisor.adapters.process import ProcessIdentity, find_process, terminate_identity
from infervisor.replay import Desired, LifecycleState
from infervisor.replay import events as ev

from .errors import InvalidState

if TYPE_CHECKING:
    from .process_driver import ProcessDriver

__all__ = ["recover_process"]

log = logging.getLogger(__name__)
S = LifecycleState
_RESUMABLE = (S.LOADED, S.STOPPED, S.EXITED, S.RESTARTING)


def recover_process(driver: ProcessDriver) -> None:
    """Make the instance's sourced state true again after the node (re)started."""
    _account_for_process(driver)
    state = driver.state
    if state.desired is not Desired.RUNNING or state.lifecycle not in _RESUMABLE:
        return
    try:
        driver.launch("boot")
    except (AdmissionRefused, SpawnError, InvalidState) as e:
        log.warning("%s: could not resume at boot: %s", state.instance_id, e)


def _account_for_process(driver: ProcessDriver) -> None:
    state = driver.state
    rec = state.process
    if rec is None:
        if state.lifecycle in (S.STARTING, S.RUNNING, S.UNHEALTHY, S.STOPPING):
            why = "no server process was recorded when the node stopped"
            driver.commit(ev.Exited(pid=None, exit_code=None, signal=None, reason=why), "node")
        return
    identity = ProcessIdentity(
        pid=rec.pid, pgid=rec.pgid, start_time=rec.start_time, boot_id=rec.boot_id
    )
    if find_process(identity) is None:
        why = f"pid {rec.pid} was gone when the node started again"
        driver.commit(ev.Exited(pid=rec.pid, exit_code=None, signal=None, reason=why), "node")
        return
    grace = driver.actor.ctx.settings.health_kill_grace_s
    terminate_identity(identity, grace)
    why = f"pid {rec.pid} was left running by the previous node process; stopped it"
    driver.commit(ev.Exited(pid=rec.pid, exit_code=None, signal=None, reason=why), "node")
