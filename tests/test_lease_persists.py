"""The controller lease survives a node restart.

A controller heard is recorded (``node.lease_renewed``) at most once per a
quarter of the lease; a node reopened on the same chain runs the lease from
the last renewal recorded with the time the node ran since already used (the
time it was down is no silence), so a controller that went silent before the
restart stays silent. Time is a ManualClock shared by both openings of the
node (one boot: the monotonic clock carries on); real processes are the fake
llama-protocol server.
"""

from __future__ import annotations

import functools
import itertools
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from infervisor.actors import messages as m
from infervisor.actors.clock import ManualClock
from infervisor.actors.core import lease as rule
from infervisor.actors.core.lease import RENEW_FRACTION
from infervisor.actors.errors import NotAController
from infervisor.actors.node import Node
from infervisor.adapters.ports import free_port
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.chain import SqliteChain
from infervisor.replay import decode_event, timeline
from infervisor.replay import events as ev
from infervisor.replay.reducer import apply
from infervisor.replay.state import LeaseRecord, NodeState, RunClock, Stamp

LEASE_S = 10.0
TICK_S = 1.0
DEADLINE_S = 20.0


def renewals(node: Node) -> list[tuple[Any, ev.LeaseRenewed]]:
    """The chain's ``node.lease_renewed`` rows, with their decoded events."""
    with SqliteChain.open_readonly(node.settings.chain_path) as chain:
        rows = [s for s in chain.events() if s.kind == "node.lease_renewed"]
    found = []
    for stored in rows:
        event = decode_event(stored)
        assert isinstance(event, ev.LeaseRenewed)
        found.append((stored, event))
    return found


def flush_supervisor(node: Node) -> None:
    """Every message told to the supervisor so far has been handled."""
    node._actors.supervisor.ask(m.Deregister(instance_id="-"), timeout=DEADLINE_S)


# ---------------------------------------------------------------- the arithmetic
def stamp(mono_s: float, boot: str = "b1", wall_s: float | None = None) -> Stamp:
    wall = 1_000.0 + mono_s if wall_s is None else wall_s
    return Stamp(wall_ns=int(wall * 1e9), mono_s=mono_s, boot_id=boot)


class Keeper:
    """The core's lease rules fed one observation at a time, as the supervisor does."""

    def __init__(self, now: Stamp, since: LeaseRecord | None) -> None:
        """Booted at ``now`` on a chain whose newest event is at ``now`` (no downtime)."""
        policy = rule.LeasePolicy(lease_s=LEASE_S, pause_after_s=3.0)
        held = {} if since is None else {"ctl": since}
        self.lease = rule.lease_at_boot(policy, now, held, RunClock(head_ns=now.wall_ns))

    def feed(self, seen: rule.LeaseObservation, now_s: float) -> rule.LeaseDecision:
        decision = rule.decide_lease(self.lease, seen, stamp(now_s))
        self.lease = decision.lease
        return decision

    def expired(self, now_s: float) -> float | None:
        lapsed = self.feed(rule.HealthTickFired(late_s=0.0), now_s).lapsed
        return lapsed[0].silent_s if lapsed else None

    def silence(self, now_s: float) -> float | None:
        return rule.silence_s(self.lease, "ctl", now_s)

    def heard(self, now_s: float) -> bool:
        return bool(self.feed(rule.ControllerHeard("ctl"), now_s).events)

    def not_recorded(self) -> None:
        self.feed(rule.RenewalFailed("ctl"), 0.0)


def test_keeper_runs_the_lease_from_the_recorded_renewal() -> None:
    keeper = Keeper(stamp(100.0), LeaseRecord(controller="ctl", at=stamp(95.0)))
    assert keeper.expired(104.9) is None
    assert keeper.expired(105.5) == pytest.approx(10.5)
    assert keeper.expired(106.0) is None  # told once
    assert keeper.silence(106.0) == pytest.approx(11.0)


def test_keeper_across_boots_uses_wall_time() -> None:
    since = LeaseRecord(controller="ctl", at=stamp(5_000.0, boot="old", wall_s=1_000.0))
    keeper = Keeper(stamp(3.0, boot="new", wall_s=1_030.0), since)
    assert keeper.silence(3.0) == pytest.approx(30.0)


def test_keeper_without_a_record_runs_from_boot_and_records_the_first() -> None:
    keeper = Keeper(stamp(50.0), None)
    assert keeper.silence(60.0) is None
    assert keeper.heard(60.0)
    assert not keeper.heard(60.0 + LEASE_S * RENEW_FRACTION - 0.1)
    assert keeper.heard(60.0 + LEASE_S * RENEW_FRACTION)
    keeper.not_recorded()
    assert keeper.heard(60.1 + LEASE_S * RENEW_FRACTION)


# ---------------------------------------------------------------- a node
def test_heartbeats_are_recorded_at_most_once_per_quarter_lease(
    nodes, fake_llama: str, fake_model: Path, manual_clock: ManualClock
) -> None:
    settings = nodes.settings(fake_llama, fake_model, health_interval_s=TICK_S, lease_s=LEASE_S)
    node = nodes.open(settings, manual_clock)
    step = 0.5
    for _ in range(40):  # 20 s of heartbeats, two a second
        node.heartbeat("ctl")
        with pytest.raises(NotAController):  # the node itself is no controller
            node.heartbeat(settings.node_id)
        flush_supervisor(node)
        manual_clock.advance(step)
    node.shutdown()  # the writer has answered every append asked before
    found = renewals(node)
    at = [e.at.mono_s for _, e in found]
    quarter = LEASE_S * RENEW_FRACTION
    assert len(found) == int(40 * step / quarter)
    assert all(b - a >= quarter for a, b in itertools.pairwise(at))
    for stored, event in found:
        assert stored.source == "controller"
        assert stored.subject == ""
        assert event.controller == "ctl"
    assert node.rebuild().lease == LeaseRecord(controller="ctl", at=found[-1][1].at)
    assert node.rebuild().leases == {"ctl": LeaseRecord(controller="ctl", at=found[-1][1].at)}


def test_without_a_lease_nothing_is_recorded(
    nodes, fake_llama: str, fake_model: Path, manual_clock: ManualClock
) -> None:
    node = nodes.open(
        nodes.settings(fake_llama, fake_model, health_interval_s=TICK_S), manual_clock
    )
    for _ in range(10):
        node.heartbeat("ctl")
        flush_supervisor(node)
        manual_clock.advance(LEASE_S)
    node.shutdown()
    assert renewals(node) == []


def tick_heard(node: Node, clock: ManualClock, iid: str, lifecycle: str) -> None:
    """Tick until ``iid`` is ``lifecycle``, the controller heard at every tick."""

    def reached() -> bool:
        if node.settled(iid):
            if node.status(iid).lifecycle == lifecycle:
                return True
            node.heartbeat("ctl")
            clock.advance(TICK_S)
        return False

    wait_until(reached, DEADLINE_S, f"{iid} {lifecycle}")


def test_a_lease_lapsed_before_a_restart_stays_lapsed_after_it(
    nodes, fake_llama: str, fake_model: Path, manual_clock: ManualClock
) -> None:
    settings = nodes.settings(fake_llama, fake_model, health_interval_s=TICK_S, lease_s=LEASE_S)
    first = nodes.open(settings, manual_clock)
    first.registry.adopt("tiny", fake_model / "tiny.gguf")
    theirs_spec = InstanceSpec(role="a", flavor=Flavor.LLAMACPP, model="tiny", port=free_port())
    mine_spec = InstanceSpec(role="b", flavor=Flavor.LLAMACPP, model="tiny", port=free_port())
    theirs = first.place(theirs_spec, placed_by="ctl", generation=1)
    mine = first.place(mine_spec)
    for iid in (theirs, mine):
        first.start(iid, by="controller")
        tick_heard(first, manual_clock, iid, "running")
    first.heartbeat("ctl")
    flush_supervisor(first)
    assert renewals(first), "the controller's heartbeats were not recorded"

    def stopped_by_the_lease() -> bool:  # the controller silent while the node runs
        view = first.status(theirs)
        if view.desired == "stopped" and view.lifecycle == "stopped":
            return True  # settled: the shutdown below has nothing of it to stop
        if first.settled(theirs):
            manual_clock.advance(TICK_S)
        return False

    wait_until(stopped_by_the_lease, DEADLINE_S, "the lease stop before the restart")
    first.shutdown()
    manual_clock.advance(3 * LEASE_S)  # down: no silence, but the lease ran out already
    second = nodes.open(settings, manual_clock)
    view = second.status(theirs)
    assert view.desired == "stopped"  # the restart starts nothing of the lapsed controller's
    stops = [e for e in timeline(settings.chain_path, theirs) if e.kind.endswith("stop_requested")]
    assert [e.source for e in stops] == ["lease:ctl"]  # the boot stopped nothing more
    assert second.status(mine).desired == "running"  # its own placement is spared
    assert second.renew("ctl"), "the restart renewed a lapsed controller's lease"


def stop_decided_at(node: Node, iid: str) -> float:
    """The monotonic time of the instance's last ``stop_requested`` (by the lease)."""
    with SqliteChain.open_readonly(node.settings.chain_path) as chain:
        stops = [s for s in chain.events(subject=iid) if s.kind == "instance.stop_requested"]
    event = decode_event(stops[-1])
    assert isinstance(event, ev.StopRequested)
    assert stops[-1].source == "lease:ctl"
    assert event.at is not None
    return event.at.mono_s


def test_after_a_restart_the_lease_runs_from_the_last_renewal(
    nodes, fake_llama: str, fake_model: Path, manual_clock: ManualClock
) -> None:
    settings = nodes.settings(fake_llama, fake_model, health_interval_s=TICK_S, lease_s=LEASE_S)
    first = nodes.open(settings, manual_clock)
    first.registry.adopt("tiny", fake_model / "tiny.gguf")
    spec = InstanceSpec(role="a", flavor=Flavor.LLAMACPP, model="tiny", port=free_port())
    theirs = first.place(spec, placed_by="ctl", generation=1)  # the controller is heard
    first.start(theirs, by="controller")
    flush_supervisor(first)
    for _ in range(3):  # the node runs on, the controller silent: that is silence
        manual_clock.advance(TICK_S)
        flush_supervisor(first)
    first.shutdown()  # its last event: node.stopped
    renewed = renewals(first)[-1][1].at.mono_s
    down_s = LEASE_S * 0.4

    manual_clock.advance(down_s)  # the restart comes inside the lease: that is no silence
    second = nodes.open(settings, manual_clock)
    booted = manual_clock.monotonic()

    def stopped() -> bool:
        if second.status(theirs).desired == "stopped":
            return True
        assert manual_clock.monotonic() < booted + 3 * LEASE_S, "the lease never expired"
        manual_clock.advance(TICK_S)
        flush_supervisor(second)  # the tick is fanned out: the instance has it queued
        return False

    wait_until(stopped, DEADLINE_S, "the lease stop")
    decided = stop_decided_at(second, theirs)
    ran_out = renewed + down_s + LEASE_S  # the lease counts the time the node ran
    assert ran_out < decided <= ran_out + TICK_S  # not before, at once after
    assert decided < booted + LEASE_S  # not a fresh lease from the boot
    # What the boot read is the chain's: the fold and event-by-event apply agree.
    with SqliteChain.open_readonly(settings.chain_path) as chain:
        stored = list(chain.events())
    applied = functools.reduce(apply, stored, NodeState(node_id="", head_seq=-1, head_hash=""))
    folded = second.rebuild()
    assert applied.run == folded.run
    assert folded.run.down_ns == int(down_s * 1e9)
    assert folded.run.head_ns == stored[-1].ts_ns
    assert folded.leases["ctl"].down_ns == 0  # renewed before the node was first down
    wait_until(lambda: second.status(theirs).lifecycle == "stopped", DEADLINE_S, "stopped")
