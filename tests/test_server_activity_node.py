"""Issue 21: a client that talks straight to a llama server keeps it busy. The
instance's probes read the server's own count (``/slots``) and hand it to the
core (``o.ServerActivity``), so an instance with ``idle_ttl_s`` is never
expired while the server reports a request in flight, and is once it has been
idle that long (actors/health_checks.py); a read that fails hands nothing, so
it never turns a busy instance idle. The fake server's ``/slots`` answers
what the file ``slots`` in its working directory says (tests/programs/fake_llama.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import NodeFactory
from support import FAKE_GGUF, chain_rows, free_ports, wait_until

from infervisor.actors.clock import ManualClock
from infervisor.adapters.spec import Flavor, InstanceSpec


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    (root / "m1.gguf").write_bytes(FAKE_GGUF + bytes(4000))
    return root


def test_a_request_the_server_reports_keeps_the_instance_from_expiring(
    nodes: NodeFactory, fake_llama: str, models: Path, manual_clock: ManualClock
) -> None:
    settings = nodes.settings(fake_llama, models, health_interval_s=1.0, reconcile_interval_s=5.0)
    node = nodes.open(settings, manual_clock)
    node.registry.adopt("m1", models / "m1.gguf")
    (port,) = free_ports(1)
    spec = InstanceSpec(role="a", flavor=Flavor.LLAMACPP, model="m1", port=port, idle_ttl_s=60.0)
    iid = node.place(spec)
    slots = Path(settings.data_dir) / "instances" / iid / "slots"
    slots.parent.mkdir(parents=True, exist_ok=True)
    slots.write_text("1")  # a client of its own is being served, unseen by the node

    def ticked_until(done: bool) -> bool:
        """Advance a probe interval at a time (each probe reads the counters)."""
        if done:
            return True
        if node.settled(iid):
            manual_clock.advance(settings.health_interval_s)
        return False

    node.start(iid)
    wait_until(lambda: ticked_until(node.status(iid).lifecycle == "running"), 30, "running")
    wait_until(lambda: ticked_until(node.status(iid).busy), 10, "busy from /slots")
    for _ in range(5):  # far past the ttl, probing all along: still serving
        manual_clock.advance(60.0)
        wait_until(lambda: node.settled(iid), 10, "settled")
    assert node.status(iid).lifecycle == "running"
    assert node.status(iid).busy
    rows = [(k, s) for _, _, k, s, _ in chain_rows(settings.chain_path)]
    assert ("residency.expired", iid) not in rows

    slots.write_text("garbage")  # a read that fails says nothing: still busy
    for _ in range(5):
        manual_clock.advance(settings.health_interval_s)
        wait_until(lambda: node.settled(iid), 10, "settled")
    manual_clock.advance(120.0)
    wait_until(lambda: node.settled(iid), 10, "settled")
    assert node.status(iid).busy
    assert node.status(iid).lifecycle == "running"

    slots.write_text("0")  # the server's client is done
    wait_until(lambda: ticked_until(not node.status(iid).busy), 10, "idle from /slots")
    manual_clock.advance(settings.reconcile_interval_s)  # the idle spell is recorded
    wait_until(lambda: node.settled(iid), 10, "settled")
    assert node.status(iid).lifecycle == "running"
    for _ in range(14):  # 70 s idle of 60
        manual_clock.advance(settings.reconcile_interval_s)
    wait_until(
        lambda: ticked_until(node.status(iid).lifecycle == "resting"), 30, "resting after the ttl"
    )
    rows = [(k, s) for _, _, k, s, _ in chain_rows(settings.chain_path)]
    assert ("residency.busy", iid) in rows
    assert ("residency.idle", iid) in rows
    assert ("residency.expired", iid) in rows
