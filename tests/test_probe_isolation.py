"""A hung server delays no other instance's probe (issue 10).

Twelve managed fake llama servers run, then are frozen with SIGSTOP: their
sockets still accept connections (the kernel does that) and nothing answers,
so each probe of them waits out its own long timeout. That is more hung
servers than the node ever had probe threads. One adopted instance points at a
healthy keep-alive fake that counts the probes it answers: it must be probed
on every health tick while the twelve wait.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from support import managed_fakes_running, wait_until
from test_probe_engine import keepalive, stats  # noqa: F401 - the fixture

from infervisor.actors.clock import ManualClock
from infervisor.adapters.spec import Flavor, InstanceSpec, Mode

HUNG = 12
DEADLINE = 60.0  # a bound on a hang, never a measurement: generous at load 10


def test_hung_servers_do_not_hold_up_a_healthy_ones_probes(
    nodes,
    fake_llama: str,
    fake_model: Path,
    keepalive: str,  # noqa: F811 - the fixture
) -> None:
    clock = ManualClock()
    settings = nodes.settings(
        fake_llama,
        fake_model,
        health_interval_s=1.0,
        reconcile_interval_s=600.0,
        probe_timeout_s=300.0,
    )
    node = nodes.open(settings, clock)
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    frozen = managed_fakes_running(node, clock, HUNG, "hung", DEADLINE)
    port = int(keepalive.rsplit(":", 1)[1])
    healthy = node.place(
        InstanceSpec(role="ok", flavor=Flavor.LLAMACPP, mode=Mode.ADOPTED, port=port)
    )
    node.start(healthy)
    pids = [node.status(i).pid for i in frozen]
    try:
        for pid in pids:
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
        before = stats(keepalive)["health"]
        for tick in range(1, 6):
            clock.advance(1.0)  # a health tick: thirteen probes due, twelve of them hang
            wait_until(
                lambda t=tick: stats(keepalive)["health"] - before >= t and node.settled(healthy),
                DEADLINE,
                f"the healthy instance probed at tick {tick}",
            )  # settled: its report handled, so the next tick may probe again
        for iid in frozen:  # their probes are still waiting: nothing judged them yet
            assert node.status(iid).lifecycle == "running"
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(pid, signal.SIGCONT)  # type: ignore[arg-type]
