"""A node restart within the lease does not stop a live controller's instances.

``infervisor run`` as a real process with ``lease_s = 8``; a controller
(``ctl1``, a thread heartbeating every 1.5 s over the Unix socket, never
stopping) places and starts one instance (the fake llama-protocol server).
The node is killed (SIGKILL) a beat after a renewal is recorded and run
again once that renewal is older than the lease: the time it did not run is
no silence (docs/api.md "Leases"), so the instance is re-attached and not
stopped by ``lease:ctl1`` while the controller is heard for a whole lease
after the boot. The controller then goes silent: its instance is stopped by
``lease:ctl1``, more than the lease after its last renewal recorded.
Synchronisation is by condition and deadline on the chain; the downtime is
the scenario (the bug it guards against stopped the instance at the boot when
the chain's last renewal was older than the lease).

The restarted node's own start-up is excused too (actors/core/lease.py
``lease_at_boot``): at load 10 on 2 cores it took 6.6 s to record
``node.started``, which with ``lease_s = 8`` and only one lease of wall time
excused per renewal left it under a second to hear the controller.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import wait_until
from test_run_resume import NodeRun, end_runs, events_of, put_model, toml_str

from infervisor.adapters.ports import free_port
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.chain import StoredEvent
from infervisor.tools.api.client import ApiClient

LEASE_S = 8.0
BEAT_S = 1.5
DEADLINE_S = 60.0  # a bound on a hang, never a measurement


class Controller:
    """``ctl1`` heartbeating every :data:`BEAT_S` in a thread until :meth:`silence`;
    a refused or unanswered heartbeat (the node down) is tried again at the next beat."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._quiet = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="ctl1", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._quiet.is_set():
            with contextlib.suppress(Exception), ApiClient(data_dir=self.data_dir) as client:
                client.heartbeat("ctl1")
            self._quiet.wait(BEAT_S)

    def silence(self) -> None:
        self._quiet.set()
        self._thread.join(DEADLINE_S)


@pytest.fixture
def node_runs(tmp_path: Path, fake_llama: str) -> Iterator[Callable[[], NodeRun]]:
    """Starts ``infervisor run`` on a config with the lease; teardown ends what is left."""
    put_model(tmp_path / "data")
    config = tmp_path / "node.toml"
    config.write_text(
        f"""[node]
node_id = "n1"
data_dir = "data"
llamacpp_program = {toml_str(fake_llama)}
health_interval_s = 0.5
reconcile_interval_s = 0.5
stop_grace_s = 5.0
lease_s = {LEASE_S}

[[models]]
name = "tiny"
path = "tiny.gguf"
"""
    )
    started: list[NodeRun] = []

    def start() -> NodeRun:
        run = NodeRun(config, tmp_path / f"run-{len(started) + 1}.log")
        started.append(run)
        return run

    yield start
    end_runs(started, tmp_path / "data" / "chain.db")


def ours(db: Path, kind: str, after_seq: int = -1) -> list[StoredEvent]:
    return [e for e in events_of(db) if e.kind == kind and e.seq > after_seq]


@pytest.mark.slow  # a kill -9, a node down a lease, a lease heard, a lease silent: about 70 s
@pytest.mark.timeout(300)
def test_a_restart_within_the_lease_keeps_a_live_controllers_instance(
    node_runs: Callable[[], NodeRun], tmp_path: Path
) -> None:
    data, db = tmp_path / "data", tmp_path / "data" / "chain.db"
    first = node_runs()
    spec = InstanceSpec(role="a", flavor=Flavor.LLAMACPP, model="tiny", port=free_port())

    def placed() -> str | None:
        with contextlib.suppress(Exception), ApiClient(data_dir=data) as client:
            return client.place(spec, controller="ctl1", generation=1, start=True).instance_id
        return None

    d1 = first.until("ctl1's instance placed", placed)
    ctl = Controller(data)
    try:
        with ApiClient(data_dir=data) as client:
            running = lambda: client.status(d1).lifecycle == "running"  # noqa: E731
            first.until("d1 running", running)
        # Killed between two recorded renewals (a heartbeat heard, not recorded), run
        # again once the chain's last renewal is older than the lease.
        seen = len(ours(db, "node.lease_renewed"))
        first.until("a renewal recorded", lambda: len(ours(db, "node.lease_renewed")) > seen)
        renewed_ns = ours(db, "node.lease_renewed")[-1].ts_ns
        wait_until(lambda: time.time_ns() >= renewed_ns + BEAT_S * 1e9, DEADLINE_S, "a beat")
        first.proc.kill()
        first.wait()
        renewed_ns = ours(db, "node.lease_renewed")[-1].ts_ns
        killed_head = events_of(db)[-1].seq
        back_ns = renewed_ns + (LEASE_S + 0.5) * 1e9
        wait_until(lambda: time.time_ns() >= back_ns, DEADLINE_S, "the scenario's downtime")

        second = node_runs()
        reattached = lambda: ours(db, "instance.reattached", killed_head)  # noqa: E731
        second.until("d1 re-attached", reattached)
        booted_ns = ours(db, "node.started", killed_head)[0].ts_ns

        def a_lease_after_the_boot() -> bool:  # the controller heard for a whole lease
            renewals = ours(db, "node.lease_renewed", killed_head)
            return bool(renewals) and renewals[-1].ts_ns > booted_ns + LEASE_S * 1e9

        second.until("a renewal a lease after the boot", a_lease_after_the_boot)
        stops = ours(db, "instance.stop_requested")
        assert stops == [], [(e.source, e.payload) for e in stops]
    finally:
        ctl.silence()

    # Silent now: stopped by its lease, more than the lease after its last renewal.
    stopped = lambda: ours(db, "instance.stop_requested")  # noqa: E731
    stop = second.until("d1 stopped by ctl1's lease", stopped)[0]
    assert (stop.subject, stop.source) == (d1, "lease:ctl1")
    assert stop.ts_ns > ours(db, "node.lease_renewed")[-1].ts_ns + LEASE_S * 1e9
