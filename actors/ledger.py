"""The residency ledger: the node's memory budget, shared by every managed instance.

One actor serialises reservations, so two concurrent starts can never both
pass a check that only one of them fits. A start reserves the model's size
plus the configured overhead before anything is spawned or loaded; the
reservation is released once the server is confirmed gone. Source: the
residency ledger the reference's managed adapters share (``ManagedConfig.ledger``
in ``reference/infer_config.rs.txt``, ``reserve``/``release`` in
``reference/infer_lifecycle.rs.txt``).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pykka

from infervisor.adapters.errors import AdmissionRefused
from infervisor.replay.views import LedgerView

from .core.admission import fit_memory

__all__ = [
    "BudgetExceeded",
    "LedgerActor",
    "Reservation",
    "hold",
    "release",
    "reserve",
]

_ASK_TIMEOUT_S = 30.0


class BudgetExceeded(AdmissionRefused):
    """The reservation does not fit the node's memory budget."""


class _Reserve(msgspec.Struct, frozen=True):
    instance_id: str
    model_bytes: int


class _Release(msgspec.Struct, frozen=True):
    instance_id: str


class _Snapshot(msgspec.Struct, frozen=True):
    pass


class _Hold(msgspec.Struct, frozen=True):
    instance_id: str
    held_bytes: int


class LedgerActor(pykka.ThreadingActor):
    """Holds ``{instance_id: bytes}``; refuses a reservation that would exceed the budget."""

    def __init__(self, budget_bytes: int, overhead_bytes: int = 0) -> None:
        super().__init__()
        self.budget = budget_bytes
        self.overhead = overhead_bytes
        self.held: dict[str, int] = {}

    def on_receive(self, message: Any) -> Any:
        match message:
            case _Reserve(instance_id=iid, model_bytes=size):
                return self._reserve(iid, size)
            case _Release(instance_id=iid):
                return self.held.pop(iid, 0)
            case _Hold(instance_id=iid, held_bytes=held):
                if held:
                    self.held[iid] = held
                else:
                    self.held.pop(iid, None)
                return held
            case _Snapshot():
                return LedgerView(self.budget, sum(self.held.values()), dict(self.held))
        raise TypeError(f"LedgerActor does not take {type(message).__name__}")

    def _reserve(self, iid: str, size: int) -> int:
        fit = fit_memory(self.budget, self.overhead, self.held, iid, size)
        if fit.refusal is not None:
            raise BudgetExceeded(fit.refusal)
        self.held[iid] = fit.held_bytes
        return fit.held_bytes


def reserve(ledger: pykka.ActorRef[Any], instance_id: str, model_bytes: int) -> int:
    """Reserve for an instance; the bytes held. Raises BudgetExceeded with the numbers."""
    held: int = ledger.ask(_Reserve(instance_id, model_bytes), block=True, timeout=_ASK_TIMEOUT_S)
    return held


def release(ledger: pykka.ActorRef[Any], instance_id: str) -> None:
    """Give an instance's reservation back (no-op when it holds none)."""
    ledger.ask(_Release(instance_id), block=True, timeout=_ASK_TIMEOUT_S)


def snapshot(ledger: pykka.ActorRef[Any]) -> LedgerView:
    """The budget, the bytes in use and every reservation."""
    view: LedgerView = ledger.ask(_Snapshot(), block=True, timeout=_ASK_TIMEOUT_S)
    return view


def hold(ledger: pykka.ActorRef[Any], instance_id: str, held_bytes: int) -> None:
    """Set what an instance holds to what its chain says (0 releases it)."""
    ledger.ask(_Hold(instance_id, held_bytes), block=True, timeout=_ASK_TIMEOUT_S)


class Reservation:
    """One instance's hold on the ledger; a no-op when the node has no budget.

    The ledger is a fold of the chain: what an instance holds is the
    ``reserved_bytes`` its sourced state says (``instance.starting`` sets it,
    an exit, a confirmed unload or the unload of the instance clear it). A
    start reserves tentatively (:meth:`reserve`) before its event is appended,
    so two concurrent starts cannot both pass; after every decision the actor
    calls :meth:`sync` with the sourced figure, which also drops a tentative
    hold whose start was refused or never recorded. Owned by the instance
    actor (used from its thread only).

    What the ledger holds for the instance is unknown until the first
    :meth:`sync` (``held`` None): the node seeds the ledger with the chain's
    figures before any instance decides (actors/node_open.py), and an actor
    built then (or rebuilt with its adapter) did not reserve them. Taking it
    for 0 left the reservation of an instance whose exit the boot records in
    its first decision held for the rest of the run (an eviction's victim
    found gone at boot: its sourced figure 0 looked already synced).
    """

    def __init__(self, ledger: pykka.ActorRef[Any] | None, instance_id: str, model_bytes: int):
        self._ledger = ledger
        self._instance_id = instance_id
        self._model_bytes = model_bytes
        self.held: int | None = None

    def reserve(self, model_bytes: int | None = None) -> int:
        """Reserve the model's memory tentatively (``model_bytes``, default the
        size it was built with; the ledger adds its overhead); the bytes held
        (0 without a budget). Raises BudgetExceeded naming budget, in use and needed."""
        if self._ledger is None:
            return 0
        size = self._model_bytes if model_bytes is None else model_bytes
        self.held = reserve(self._ledger, self._instance_id, size)
        return self.held

    def sync(self, sourced_bytes: int) -> None:
        """Make the ledger hold what the chain says this instance holds (always
        on the first call: what the ledger holds is not known before)."""
        if self._ledger is not None and sourced_bytes != self.held:
            hold(self._ledger, self._instance_id, sourced_bytes)
        self.held = sourced_bytes if self._ledger is not None else 0

    def give_back(self) -> None:
        """Release whatever is held (the instance was unloaded)."""
        if self._ledger is not None:
            release(self._ledger, self._instance_id)
        self.held = 0
