"""Supervision on an injected clock: backoff times, stability reset, and an
operator stop that no tick undoes. Real processes (the fake llama-protocol
server); time moves only when the test advances it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from support import free_ports, wait_until

from infervisor.actors.clock import ManualClock
from infervisor.actors.node import Node
from infervisor.adapters.ports import free_port
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.replay import RestartPolicy, timeline

BASE = 2.0
POLICY = RestartPolicy(max_restarts=3, base_s=BASE, cap_s=60.0, stable_after_s=30.0)


@pytest.fixture
def clocked(nodes, fake_llama: str, fake_model: Path, manual_clock: ManualClock):
    settings = nodes.settings(fake_llama, fake_model, health_interval_s=1.0, restart=POLICY)
    node = nodes.open(settings, manual_clock)
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    iid = node.place(InstanceSpec(role="c", flavor=Flavor.LLAMACPP, model="tiny", port=free_port()))
    return node, manual_clock, iid


def tick_until(
    node: Node, clock: ManualClock, iid: str, lifecycle: str, beating: str | None = None
) -> None:
    """Advance health ticks until ``iid`` reaches ``lifecycle``; ``beating`` (a
    controller) is heard before each tick, so its lease never lapses however many
    ticks a slow start takes."""

    def reached() -> bool:
        if node.settled(iid):
            if node.status(iid).lifecycle == lifecycle:
                return True
            if beating is not None:
                node.renew(beating)
            clock.advance(node.settings.health_interval_s)
        return False

    wait_until(reached, 20, f"{iid} {lifecycle}")


def kill_and_wait_restarting(node: Node, iid: str) -> int:
    pid = node.status(iid).pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: node.status(iid).lifecycle == "restarting", 20, "restarting")
    return pid


def test_restarts_follow_the_backoff(clocked) -> None:
    node, clock, iid = clocked
    node.start(iid)
    tick_until(node, clock, iid, "running")
    for attempt in (1, 2):
        kill_and_wait_restarting(node, iid)
        delay = POLICY.delay(attempt - 1)
        assert delay == BASE * 2 ** (attempt - 1)
        clock.advance(delay - 0.01)
        assert node.status(iid).lifecycle == "restarting"  # not before its time
        clock.advance(0.01)
        wait_until(lambda: node.status(iid).pid is not None, 20, "respawned")
        tick_until(node, clock, iid, "running")
        assert node.status(iid).restarts == attempt
    delays = [
        e.reason for e in timeline(node.settings.chain_path, iid) if e.kind.endswith("scheduled")
    ]
    assert [d.split(":")[0] for d in delays] == ["restart 1 in 2 s", "restart 2 in 4 s"]
    node.stop(iid)


def test_operator_stop_during_backoff_is_not_undone(clocked) -> None:
    node, clock, iid = clocked
    node.start(iid)
    tick_until(node, clock, iid, "running")
    kill_and_wait_restarting(node, iid)
    assert node.stop(iid).lifecycle == "stopped"
    clock.advance(POLICY.cap_s * 4)  # every timer and tick that could restart it
    wait_until(lambda: node.settled(iid), 20, "settled")
    view = node.status(iid)
    assert view.lifecycle == "stopped"
    assert view.desired == "stopped"
    assert view.pid is None


def test_stable_run_clears_the_budget(clocked) -> None:
    node, clock, iid = clocked
    node.start(iid)
    tick_until(node, clock, iid, "running")
    kill_and_wait_restarting(node, iid)
    clock.advance(BASE)
    wait_until(lambda: node.status(iid).pid is not None, 20, "respawned")
    tick_until(node, clock, iid, "running")
    assert node.status(iid).restarts == 1

    def cleared() -> bool:
        if node.settled(iid) and node.status(iid).restarts:
            clock.advance(node.settings.health_interval_s * 5)
        return node.status(iid).restarts == 0

    wait_until(cleared, 20, "restart budget cleared after the stability period")
    # The next failure restarts at the base delay again.
    kill_and_wait_restarting(node, iid)
    scheduled = [e for e in timeline(node.settings.chain_path, iid) if e.kind.endswith("scheduled")]
    assert scheduled[-1].reason.startswith(f"restart 1 in {BASE:g} s")
    node.stop(iid)


def test_lease_expiry_stops_only_other_placements(nodes, fake_llama, fake_model, manual_clock):
    settings = nodes.settings(fake_llama, fake_model, health_interval_s=1.0, lease_s=10.0)
    node = nodes.open(settings, manual_clock)
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    port_a, port_b = free_ports(2)
    theirs_spec = InstanceSpec(role="a", flavor=Flavor.LLAMACPP, model="tiny", port=port_a)
    mine_spec = InstanceSpec(role="b", flavor=Flavor.LLAMACPP, model="tiny", port=port_b)
    theirs = node.place(theirs_spec, placed_by="ctl", generation=1)
    mine = node.place(mine_spec)
    for iid in (theirs, mine):
        node.start(iid, by="controller")
        tick_until(node, manual_clock, iid, "running", beating="ctl")

    manual_clock.advance(11.0)  # past the lease with no controller heard
    stopped = wait_until(
        lambda: node.status(theirs).lifecycle == "stopped" and node.status(theirs), 20, "lease stop"
    )
    assert stopped.desired == "stopped"
    assert "controller lease expired" in stopped.reason
    assert node.status(mine).lifecycle == "running"
    manual_clock.advance(30.0)  # nothing restarts it while the lease stays expired
    wait_until(lambda: node.settled(theirs) and node.settled(mine), 20, "settled")
    assert node.status(theirs).lifecycle == "stopped"
    assert node.status(mine).lifecycle == "running"
    lease_stop = [
        e for e in timeline(settings.chain_path, theirs) if e.kind.endswith("stop_requested")
    ]
    assert lease_stop[-1].source == "lease:ctl"

    # A stale placement is ignored and recorded; a new one runs normally.
    assert node.place(theirs_spec, placed_by="ctl", generation=0) == theirs
    assert node.status(theirs).generation == 1
    node.place(theirs_spec, placed_by="ctl", generation=2)
    assert node.status(theirs).generation == 2
    node.start(theirs, by="controller")
    tick_until(node, manual_clock, theirs, "running", beating="ctl")
    kinds = [e.kind for e in timeline(settings.chain_path, theirs)]
    assert "instance.placement_ignored" in kinds
    assert "instance.replaced" in kinds
    for iid in (theirs, mine):
        node.stop(iid)


def test_lease_shorter_than_three_ticks_is_refused(nodes, fake_llama, fake_model):
    settings = nodes.settings(fake_llama, fake_model, health_interval_s=1.0, lease_s=2.0)
    with pytest.raises(ValueError, match=r"lease_s 2\.0: shorter than three supervision periods"):
        nodes.open(settings)
