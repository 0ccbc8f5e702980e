"""The metrics as Prometheus expects them: counters that only go up, counted
exactly from the chain; the load-duration histogram; ``promtool check metrics``
on a live node's ``/metrics``.

The chain's tallies are checked on a real SQLite chain written event by event
(stamps chosen, so durations are exact); the exposition on a node opened in
this process, its API on a Unix socket, its server the fake llama.cpp (a
real process, killed with SIGKILL to make a restart).
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import NodeFactory
from test_metrics import of, parse

from infervisor.actors.node import Node
from infervisor.adapters.ports import free_port
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.chain import EventDraft
from infervisor.chain.sqlite import SqliteChain
from infervisor.replay import events as ev
from infervisor.replay.state import Stamp
from infervisor.tools.api.metrics import NodeMetrics
from infervisor.tools.api.serving.server import ApiServer
from infervisor.tools.api.tallies import LOAD_BUCKETS_S, ChainTallies

BOOT = "boot-a"


def at(seconds: float, boot: str = BOOT) -> Stamp:
    return Stamp(wall_ns=int(1e18 + seconds * 1e9), mono_s=1000.0 + seconds, boot_id=boot)


def append(chain: SqliteChain, subject: str, event: ev.Event, seconds: float = 0.0) -> None:
    chain.append(
        EventDraft(
            ts_ns=int(1e18 + seconds * 1e9), source="supervisor", kind=ev.kind_of(event),
            subject=subject, payload=ev.encode_event(event),
        )
    )  # fmt: skip


def test_tallies_count_the_chain_exactly_and_only_go_up(tmp_path: Path) -> None:
    path = tmp_path / "chain.db"
    chain = SqliteChain.open(path, "n1")
    # a: loads in 1.5 s, crashes, restarts, loads again in 0.2 s across a node restart.
    append(chain, "a", ev.Starting(by="operator", at=at(0)))
    append(chain, "a", ev.Ready(at=at(1.5)), 1.5)
    append(chain, "a", ev.Exited(pid=1, exit_code=None, signal=9, reason="killed"))
    append(chain, "a", ev.RestartScheduled(attempt=1, delay_s=0.2, reason="exit"))
    append(chain, "a", ev.Starting(by="supervisor", at=at(10)))
    append(chain, "a", ev.Ready(at=at(10.2, "boot-b")), 10.2)
    # b: a start that exits before it is ready is no load; Ollama drops its model twice.
    append(chain, "b", ev.Starting(by="operator", at=at(0)))
    append(chain, "b", ev.Exited(pid=2, exit_code=1, signal=None, reason="exit 1"))
    append(chain, "b", ev.Ready(at=at(3)), 3)  # e.g. adopted: no start pending
    append(chain, "b", ev.ModelDropped(expired=True))
    append(chain, "b", ev.ModelDropped(expired=False))
    tallies = ChainTallies(path)
    tally = tallies.refresh()
    assert tally is not None
    assert tally.restarts == {"a": 1} and tally.evictions == {"b": 2}
    assert set(tally.loads) == {"a"}
    load = tally.loads["a"]
    assert load.observations == 2 and load.sum_s == pytest.approx(1.5 + 0.2)
    assert load.cumulative()[LOAD_BUCKETS_S.index(0.25)] == 1
    assert load.cumulative()[LOAD_BUCKETS_S.index(2.5)] == 2

    # Only what was appended since is read; nothing is counted twice.
    append(chain, "a", ev.RestartScheduled(attempt=2, delay_s=0.4, reason="exit"))
    for _ in range(2):
        again = tallies.refresh()
        assert again is not None and again.restarts == {"a": 2}
    assert tally.restarts == {"a": 1}  # an earlier tally is a copy
    chain.close()
    assert ChainTallies(tmp_path / "missing.db").refresh() is None


def chain_counts(node: Node, iid: str) -> tuple[int, int]:
    """(restarts scheduled, ready answers) of ``iid`` in the node's chain file: every
    ready of a managed server here closes a start (none is adopted or reattached)."""
    with sqlite3.connect(f"file:{node.settings.chain_path}?mode=ro", uri=True) as conn:
        counts = dict(
            conn.execute(
                "SELECT kind, count(*) FROM events WHERE subject = ? GROUP BY kind", (iid,)
            ).fetchall()
        )
    return counts.get("instance.restart_scheduled", 0), counts.get("instance.ready", 0)


@pytest.fixture
def live(
    nodes: NodeFactory, fake_llama: str, fake_model: Path
) -> Iterator[tuple[Node, httpx.Client]]:
    """A node in this process serving its API, with /metrics, on a Unix socket."""
    settings = nodes.settings(fake_llama, fake_model, memory_budget_bytes=10**9)
    node = nodes.open(settings)
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    data = Path(settings.data_dir)
    server = ApiServer.listen(data, settings.chain_path, settings.node_id)
    server.ctx.metrics = NodeMetrics(lambda: server.ctx.gate.node, settings.chain_path).render
    server.serve(node)
    transport = httpx.HTTPTransport(uds=str(data / "api.sock"))
    try:
        with httpx.Client(transport=transport, base_url="http://node", timeout=30) as client:
            yield node, client
    finally:
        server.close()


def test_a_live_nodes_metrics_are_typed_and_pass_promtool(live: tuple[Node, httpx.Client]) -> None:
    node, client = live
    iid = node.place(
        InstanceSpec(role="chat", flavor=Flavor.LLAMACPP, model="tiny", port=free_port())
    )
    node.start(iid)
    first = node.wait_for(iid, lambda v: v.lifecycle == "running" and v.pid is not None, 60)
    assert first.pid is not None
    os.kill(first.pid, signal.SIGKILL)  # a real crash: the supervisor restarts it
    node.wait_for(iid, lambda v: v.lifecycle == "running" and v.pid not in (None, first.pid), 60)
    # The server fails its probes for a while (tests/programs/fake_llama.py), then answers.
    health = Path(node.settings.data_dir) / "instances" / iid / "health"
    health.write_text("fail")
    node.wait_for(iid, lambda v: (v.missed_probes or 0) >= 1, 60)
    health.write_text("ok")
    node.wait_for(iid, lambda v: v.lifecycle == "running" and v.misses == 0, 60)

    answer = client.get("/metrics")
    assert answer.status_code == 200
    samples, types = parse(answer.content)
    labels = {"instance": iid, "flavor": "llamacpp", "mode": first.mode}
    for name in ("restarts", "health_misses", "loads", "evictions"):
        assert types[f"infervisor_instance_{name}"] == "counter", name
    assert types["infervisor_instance_load_duration_seconds"] == "histogram"
    assert types["infervisor_instance_restarts_in_budget"] == "gauge"
    assert types["infervisor_instance_health_misses_consecutive"] == "gauge"
    restarts, loads = chain_counts(node, iid)
    assert restarts >= 1 and loads >= 2
    assert of(samples, "infervisor_instance_restarts_total", **labels) == restarts
    assert of(samples, "infervisor_instance_loads_total", **labels) == loads
    assert of(samples, "infervisor_instance_evictions_total", **labels) == 0
    assert of(samples, "infervisor_instance_health_misses_total", **labels) >= 1
    assert of(samples, "infervisor_instance_health_misses_consecutive", **labels) == 0
    assert of(samples, "infervisor_instance_load_duration_seconds_count", **labels) == loads
    inf = of(samples, "infervisor_instance_load_duration_seconds_bucket", **labels, le="+Inf")
    assert inf == loads
    assert of(samples, "infervisor_instance_load_duration_seconds_sum", **labels) > 0

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip(
            "promtool is not on PATH (Debian's prometheus package has it; .ci/run installs it)"
        )
    done = subprocess.run(
        [promtool, "check", "metrics"], input=answer.content, capture_output=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr).decode()
