"""How the instance actor answers verbs: the verbs waiting for their work to
be done (:class:`Waiters`), when each is done, and the exception a refusal of
the decision core becomes."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from infervisor.adapters.errors import AdmissionRefused
from infervisor.adapters.proc.errors import SpawnError
from infervisor.replay import Desired, InstanceState, LifecycleState
from infervisor.replay.state import Then

from .core import observations as o
from .core.common import unloading
from .core.decision import Refusal, RefusalKind
from .core.rules import Mode, Rules
from .errors import InvalidState, NotResident, VerbFailed, VerbRefused
from .ledger import BudgetExceeded

__all__ = [
    "Waiter",
    "Waiters",
    "demand_settled",
    "is_verb",
    "refusal_error",
    "restarted",
    "stopped",
]

S = LifecycleState
#: Retry-After of a start with no room, seconds: an instance in use may turn idle.
NO_ROOM_RETRY_S = 5.0


@dataclass
class Waiter:
    """A verb answered once ``done(state)`` holds (state None: unloaded)."""

    done: Callable[[InstanceState | None], bool]
    future: Future[Any]
    answer: Callable[[], Any]


class Waiters:
    """The verbs of one instance waiting for their answer (used on its actor's thread)."""

    def __init__(self) -> None:
        self._waiting: list[Waiter] = []

    def add(self, waiter: Waiter, state: InstanceState | None) -> None:
        """Wait for ``waiter`` (answered at once when it is already done)."""
        self._waiting.append(waiter)
        self.resolve(state)

    def resolve(self, state: InstanceState | None) -> None:
        """Answer every waiter done in ``state`` (None: the instance is unloaded)."""
        for waiter in list(self._waiting):
            if waiter.future.done():
                self._waiting.remove(waiter)
            elif waiter.done(state):
                self._waiting.remove(waiter)
                waiter.future.set_result(waiter.answer())

    def fail_all(self, error: Callable[[], Exception]) -> None:
        """Answer every waiter with an error ``error()`` makes (one each)."""
        for waiter in self._waiting:
            if not waiter.future.done():
                waiter.future.set_exception(error())
        self._waiting.clear()

    def fail_on(self, refusal: Refusal | None, *, verb: bool, iid: str) -> None:
        """A decision not on a verb that failed a verb's work fails whoever waits."""
        if refusal is None or verb or refusal.kind is not RefusalKind.FAILED:
            return
        self.fail_all(lambda: VerbFailed(f"{iid}: {refusal.message}"))


def stopped(state: InstanceState | None, rules: Rules) -> bool:
    """A stop is answered once nothing of the server is left (or an unload ended)."""
    if state is None:
        return True
    if rules.mode is Mode.PROCESS:
        return state.process is None and state.lifecycle is not S.STOPPING
    return not unloading(state)


def restarted(state: InstanceState | None, rules: Rules) -> bool:
    """A restart is answered once its start is recorded (or it was dropped)."""
    return state is None or state.then != Then.RESTART


def demand_settled(state: InstanceState | None) -> bool:
    """A demand is answered once the instance serves, or once it will not by
    itself: failed, stopped or resting (not wanted running), or unloaded."""
    if state is None or state.lifecycle is S.RUNNING or state.lifecycle is S.FAILED:
        return True
    wanted = state.desired is Desired.RUNNING
    return state.lifecycle in (S.STOPPED, S.RESTING, S.FINISHED) and not wanted


def is_verb(obs: o.Observation) -> bool:
    """A verb: somebody waits for its answer (a refusal is raised to them)."""
    return isinstance(
        obs,
        (
            o.StartVerb, o.StopVerb, o.RestartVerb, o.UnloadVerb, o.PlacementVerb,
            o.DemandVerb, o.EvictVerb, o.RoomRefused, o.RoomPlanned, o.StartAgain,
        ),
    )  # fmt: skip


def refusal_error(refusal: Refusal) -> Exception:
    """The exception a refusal is raised to the verb's caller as (see actors/errors.py)."""
    match refusal.kind:
        case RefusalKind.INVALID_STATE:
            return InvalidState(refusal.message)
        case RefusalKind.REFUSED:
            return VerbRefused(refusal.message)
        case RefusalKind.ADMISSION:
            return AdmissionRefused(refusal.message)
        case RefusalKind.MEMORY:
            return BudgetExceeded(refusal.message)
        case RefusalKind.SPAWN:
            return SpawnError(refusal.message)
        case RefusalKind.NOT_STOPPED:
            return NotResident(refusal.message, code="stopped", retry_after_s=0.0)
        case RefusalKind.NOT_FAILED:
            return NotResident(refusal.message, code="failed", retry_after_s=0.0)
        case RefusalKind.NOT_NO_ROOM:
            return NotResident(refusal.message, code="no_room", retry_after_s=NO_ROOM_RETRY_S)
    return VerbFailed(refusal.message)
