"""The residency ledger the boot seeds, and the instance actors' mirror of it
(actors/ledger.py ``Reservation``; actors/node_open.py ``_seed_ledger``).

The node holds in the ledger what the chain says each instance holds before
any instance decides; an instance actor built then did not reserve that
itself. When its first decision (the boot's) records an exit, its sourced
figure is 0 from the start, and the ledger must still let the seeded bytes go:
a node killed mid-eviction, whose victim's server died meanwhile, kept the
victim's 519904 bytes reserved for the whole run and refused every start that
needed them (``residency.refused ... needs 519904 bytes beside 1039808 in use``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pykka
import pytest

from infervisor.actors.ledger import LedgerActor, Reservation, hold, snapshot

NEEDS = 519_904


@pytest.fixture
def ledger() -> Iterator[pykka.ActorRef[Any]]:
    ref = LedgerActor.start(1_200_000, 1000)
    try:
        yield ref
    finally:
        ref.stop()


def test_a_seeded_reservation_is_released_when_the_first_sync_says_it_holds_nothing(
    ledger: pykka.ActorRef[Any],
) -> None:
    hold(ledger, "c", NEEDS)  # the boot's seed: c's stop to rest was in flight
    hold(ledger, "p1", NEEDS)
    memory = Reservation(ledger, "c", NEEDS - 1000)  # c's actor, built at boot
    memory.sync(0)  # its boot decision recorded the exit: the chain says 0
    assert snapshot(ledger).reservations == {"p1": NEEDS}
    assert memory.held == 0


def test_a_seeded_reservation_the_chain_still_holds_is_kept_and_then_released(
    ledger: pykka.ActorRef[Any],
) -> None:
    hold(ledger, "c", NEEDS)  # seeded: its server lives on, re-attached at boot
    memory = Reservation(ledger, "c", NEEDS - 1000)
    memory.sync(NEEDS)
    assert snapshot(ledger).reservations == {"c": NEEDS}
    memory.sync(0)  # its exit, later in the run
    assert snapshot(ledger).reservations == {}


def test_without_a_budget_nothing_is_held(ledger: pykka.ActorRef[Any]) -> None:
    memory = Reservation(None, "c", NEEDS)
    memory.sync(NEEDS)
    assert memory.held == 0 and memory.reserve() == 0
    assert snapshot(ledger).reservations == {}
