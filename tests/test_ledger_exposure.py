"""Issue 3 through the Node API: the residency ledger under concurrent starts,
and a managed server found listening beyond loopback.

Real processes of the fake llama-protocol server. Model sizes come from the
registry entries (the fake GGUF files' sizes).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import NodeFactory
from support import PROGRAMS, make_launcher, pids_of_group, wait_until

from infervisor.actors.clock import ManualClock
from infervisor.actors.errors import InvalidState, NotResident
from infervisor.actors.node import Node
from infervisor.adapters.ports import free_port, listeners_beyond_loopback
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.replay import timeline
from infervisor.replay.views import InstanceView

OVERHEAD = 1000  # bytes added to every reservation


def spec(role: str, port: int) -> InstanceSpec:
    return InstanceSpec(role=role, flavor=Flavor.LLAMACPP, model="tiny", port=port)


def running(node: Node, iid: str) -> InstanceView:
    return node.wait_for(iid, lambda v: v.lifecycle == "running", 60)


# --- the ledger -----------------------------------------------------------------------


def start_together(node: Node, iids: list[str]) -> dict[str, InstanceView | Exception]:
    """Call ``node.start`` on every instance at once, one thread each."""
    barrier = threading.Barrier(len(iids))
    results: dict[str, InstanceView | Exception] = {}

    def start(iid: str) -> None:
        barrier.wait()
        try:
            results[iid] = node.start(iid)
        except Exception as e:  # collected for the assertions
            results[iid] = e

    threads = [threading.Thread(target=start, args=(iid,)) for iid in iids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == len(iids), "a start never answered"
    return results


def test_two_concurrent_starts_only_one_fits_the_budget(
    nodes: NodeFactory, fake_llama: str, fake_model: Path
) -> None:
    model_bytes = (fake_model / "tiny.gguf").stat().st_size
    needed = model_bytes + OVERHEAD
    budget = needed * 2 - 1  # one fits, two do not
    settings = nodes.settings(
        fake_llama, fake_model, memory_budget_bytes=budget, reserve_overhead_bytes=OVERHEAD
    )
    node = nodes.open(settings)
    assert node.registry.adopt("tiny", fake_model / "tiny.gguf").size_bytes == model_bytes
    # pinned: neither start may evict the other (issue 21), so one is refused for room
    pinned = [spec(role, free_port()) for role in ("a", "b")]
    iids = [node.place(msgspec.structs.replace(s, pinned=True)) for s in pinned]

    results = start_together(node, iids)
    won = [iid for iid, r in results.items() if isinstance(r, InstanceView)]
    lost = [iid for iid, r in results.items() if isinstance(r, NotResident)]
    assert len(won) == 1 and len(lost) == 1, results
    winner, loser = won[0], lost[0]
    why = str(results[loser])
    assert f"needs {needed} bytes beside {needed} in use of the budget {budget}" in why
    refused = [e for e in timeline(settings.chain_path, loser) if e.kind == "residency.refused"]
    assert len(refused) == 1
    assert node.status(loser).lifecycle == "loaded"
    assert node.status(loser).reserved_bytes == 0

    view = running(node, winner)
    assert view.reserved_bytes == needed
    # Observed memory comes from the reconcile tick's one process-table read.
    seen = wait_until(lambda: node.status(winner).rss_bytes, 10, "RSS seen by a reconcile tick")
    assert seen > 0
    ledger = node.ledger()
    assert ledger is not None
    assert (ledger.budget_bytes, ledger.in_use_bytes) == (budget, needed)
    assert ledger.reservations == {winner: needed}

    node.stop(winner)
    ledger = node.ledger()
    assert ledger is not None and ledger.reservations == {}
    node.start(loser)
    assert running(node, loser).reserved_bytes == needed
    node.stop(loser)


# --- exposure -------------------------------------------------------------------------


def tick_until(node: Node, clock: ManualClock, iid: str, lifecycle: str) -> InstanceView:
    """Advance health ticks until the instance reaches ``lifecycle``."""

    def reached() -> InstanceView | None:
        if node.settled(iid):
            view = node.status(iid)
            if view.lifecycle == lifecycle:
                return view
            clock.advance(node.settings.health_interval_s)
        return None

    found: InstanceView = wait_until(reached, 20, f"{iid} {lifecycle}")
    return found


@pytest.fixture
def clocked(
    nodes: NodeFactory, tmp_path: Path, fake_model: Path, manual_clock: ManualClock
) -> tuple[Node, ManualClock, Any]:
    wide = make_launcher(tmp_path, PROGRAMS / "fake_llama.py", "--really-bind", "0.0.0.0")
    settings = nodes.settings(
        wide,
        fake_model,
        health_interval_s=1.0,
        reconcile_interval_s=600.0,  # far apart: reaching running fires no reconcile, at any load
        memory_budget_bytes=10 * OVERHEAD,
        reserve_overhead_bytes=OVERHEAD,
    )
    node = nodes.open(settings, manual_clock)
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    return node, manual_clock, settings


def test_managed_server_beyond_loopback_is_stopped_and_held_until_reloaded(
    clocked: tuple[Node, ManualClock, Any], tmp_path: Path
) -> None:
    node, clock, settings = clocked
    port = free_port()
    iid = node.place(spec("chat", port))
    node.start(iid)
    first = tick_until(node, clock, iid, "running")
    assert first.reserved_bytes > 0
    assert listeners_beyond_loopback(port) == ["0.0.0.0"]
    assert clock.monotonic() < settings.reconcile_interval_s  # no reconcile yet

    clock.advance(settings.reconcile_interval_s)  # one reconcile tick
    view = node.wait_for(iid, lambda v: v.lifecycle == "stopped", 60)
    assert view.desired == "stopped"
    assert view.exposure == "stopped: listened beyond loopback on 0.0.0.0"
    assert first.pid is not None and pids_of_group(first.pid) == []
    assert view.reserved_bytes == 0
    ledger = node.ledger()
    assert ledger is not None and ledger.reservations == {}
    entries = timeline(settings.chain_path, iid)
    exposed = [e for e in entries if e.kind == "instance.exposed"]
    assert len(exposed) == 1
    assert exposed[0].reason == "listening beyond loopback on 0.0.0.0: stopped"
    assert exposed[0].frm == "running"
    assert entries[-1].to == "stopped"
    assert not [e for e in entries if e.seq > exposed[0].seq and e.kind == "instance.starting"]

    with pytest.raises(InvalidState, match="reload the instance"):
        node.start(iid)

    node.unload(iid)
    make_launcher(tmp_path, PROGRAMS / "fake_llama.py")  # the same launcher, now well behaved
    assert node.place(spec("chat", port)) == iid
    node.start(iid)
    again = tick_until(node, clock, iid, "running")
    assert again.exposure == "loopback (managed)"
    assert listeners_beyond_loopback(port) == []
    node.stop(iid)
