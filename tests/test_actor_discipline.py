"""pykka discipline: a handler that raises is a miss with the error recorded; an
instance actor that dies anyway is recreated from the chain within one tick and
re-attaches its process (no restart)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil
import pytest
from support import pids_of_group, wait_until

from infervisor.actors.clock import ManualClock
from infervisor.actors.health_checks import HealthChecks
from infervisor.adapters.ports import free_port
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.replay import timeline


@pytest.fixture
def clocked(nodes, fake_llama: str, fake_model: Path, manual_clock: ManualClock):
    settings = nodes.settings(fake_llama, fake_model, health_interval_s=1.0, miss_limit=1)
    node = nodes.open(settings, manual_clock)
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    spec = InstanceSpec(role="c", flavor=Flavor.LLAMACPP, model="tiny", port=free_port())
    iid = node.place(spec)
    node.start(iid)
    return node, manual_clock, iid


def tick_until(node, clock: ManualClock, iid: str, lifecycle: str) -> Any:
    def reached() -> Any:
        if node.settled(iid):
            view = node.status(iid)
            if view.lifecycle == lifecycle:
                return view
            clock.advance(1.0)
        return None

    return wait_until(reached, 20, f"{iid} {lifecycle}")


def test_a_probe_handler_that_raises_counts_as_a_miss(clocked, monkeypatch) -> None:
    node, clock, iid = clocked
    tick_until(node, clock, iid, "running")
    original = HealthChecks._ollama_listed  # runs on every probe's report

    def broken(self: HealthChecks, report: Any) -> Any:
        if report.health.kind == "up":
            raise RuntimeError("injected handler failure")
        return original(self, report)

    monkeypatch.setattr(HealthChecks, "_ollama_listed", broken)
    clock.advance(1.0)
    wait_until(
        lambda: any(
            e.kind == "instance.unhealthy" for e in timeline(node.settings.chain_path, iid)
        ),
        20,
        "the failure recorded as a miss",
    )
    unhealthy = next(e for e in timeline(node.settings.chain_path, iid) if e.to == "unhealthy")
    assert "handler error: RuntimeError: injected handler failure" in unhealthy.reason
    monkeypatch.setattr(HealthChecks, "_ollama_listed", original)
    node.stop(iid)


def test_a_dead_instance_actor_is_recreated_and_reattaches(clocked) -> None:
    node, clock, iid = clocked
    before = tick_until(node, clock, iid, "running")
    ref = node._ref(iid)
    ref.stop()  # the actor dies; its server keeps running
    assert psutil.pid_exists(before.pid)
    clock.advance(1.0)  # one supervisor tick
    wait_until(lambda: node._ref(iid) is not ref and node._ref(iid).is_alive(), 20, "revived")
    after = tick_until(node, clock, iid, "running")
    assert after.pid == before.pid  # re-attached, not restarted
    kinds = [e.kind for e in timeline(node.settings.chain_path, iid)]
    assert kinds.count("instance.spawned") == 1
    assert "instance.reattached" in kinds
    assert node.live_states() == node.rebuild().instances
    node.stop(iid)
    assert pids_of_group(before.pid) == []
