"""The node's Prometheus metrics, rendered from a real node and parsed back with
prometheus_client's own parser."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from conftest import NodeFactory
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from support import wait_until

from infervisor.actors.node import VERSION, Node
from infervisor.adapters.ports import free_port
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.replay import LifecycleState
from infervisor.tools.api.metrics import NodeMetrics

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: bytes) -> tuple[Samples, dict[str, str]]:
    """(every sample by name and sorted labels, each family's type by name)."""
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text.decode()):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types


def of(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def head_seq(chain: Path) -> int:
    with sqlite3.connect(f"file:{chain}?mode=ro", uri=True) as conn:
        (seq,) = conn.execute("SELECT max(seq) FROM events").fetchone()
    return int(seq)


@pytest.fixture
def node(nodes: NodeFactory, fake_llama: str, fake_model: Path) -> Node:
    settings = nodes.settings(fake_llama, fake_model, memory_budget_bytes=10**9)
    n = nodes.open(settings)
    n.registry.adopt("tiny", fake_model / "tiny.gguf")
    return n


def test_a_node_starting_is_only_down() -> None:
    body, content_type = NodeMetrics(lambda: None, Path("/nonexistent/chain.db")).render()
    assert content_type == CONTENT_TYPE_LATEST and content_type.startswith("text/plain")
    samples, _ = parse(body)
    assert samples == {("infervisor_up", ()): 0.0}


def test_a_running_instance_is_measured(node: Node) -> None:
    spec = InstanceSpec(role="chat", flavor=Flavor.LLAMACPP, model="tiny", port=free_port())
    iid = node.place(spec)
    node.start(iid)
    # Running, probed at least once, and its RSS seen by a reconcile tick.
    view = node.wait_for(
        iid,
        lambda v: v.lifecycle == "running" and v.probe_latency_s is not None and v.rss_bytes,
        20,
    )
    assert view.reserved_bytes > 0
    assert view.max_restarts is not None

    metrics = NodeMetrics(lambda: node, node.settings.chain_path)
    body, _ = metrics.render()
    samples, types = parse(body)
    labels = {"instance": iid, "flavor": "llamacpp", "mode": view.mode}

    assert of(samples, "infervisor_up") == 1
    assert of(samples, "infervisor_instances") == 1
    assert of(samples, "infervisor_node_info", node_id="n1", version=VERSION) == 1
    for state in LifecycleState:
        expected = 1 if state.value == "running" else 0
        assert of(samples, "infervisor_instance_state", **labels, state=state.value) == expected
    assert of(samples, "infervisor_instance_restarts_in_budget", **labels) == view.restarts == 0
    assert of(samples, "infervisor_instance_restarts_total", **labels) == 0
    assert of(samples, "infervisor_instance_restart_budget", **labels) == view.max_restarts
    assert of(samples, "infervisor_instance_reserved_bytes", **labels) == view.reserved_bytes
    assert of(samples, "infervisor_instance_rss_bytes", **labels) > 0
    latency = of(samples, "infervisor_instance_probe_latency_seconds", **labels)
    assert 0 < latency < 20
    assert of(samples, "infervisor_instance_health_misses_consecutive", **labels) == 0
    assert of(samples, "infervisor_node_containment", mode=node.containment.mode) == 1
    assert of(samples, "infervisor_instance_oom_kills_total", **labels) == 0
    if node.containment.mode != "pgroup":  # the whole tree's memory and CPU, from its cgroup
        assert of(samples, "infervisor_instance_cpu_seconds_total", **labels) > 0
    if node.containment.memory is not None:
        assert of(samples, "infervisor_instance_cgroup_memory_bytes", **labels) > 0

    # The head seq is read from the chain file; read both after the instance settles.
    wait_until(lambda: node.settled(iid), 10, "no probe in flight")
    body, _ = metrics.render()
    samples, types = parse(body)
    assert of(samples, "infervisor_chain_head_seq") == head_seq(node.settings.chain_path)

    assert types["infervisor_chain_append_seconds"] == "histogram"
    count = of(samples, "infervisor_chain_append_seconds_count")
    assert count > 0
    assert of(samples, "infervisor_chain_append_seconds_bucket", le="+Inf") == count
    assert of(samples, "infervisor_chain_append_seconds_sum") > 0
    bounds, cumulative, snap_count, _ = node.append_latency()
    assert snap_count >= count
    assert list(cumulative) == sorted(cumulative) and cumulative[-1] <= snap_count
    buckets = [
        of(samples, "infervisor_chain_append_seconds_bucket", le=le)
        for le in [*(str(b) for b in bounds), "+Inf"]
    ]
    assert buckets == sorted(buckets)


def test_an_instance_that_stops_shows_its_new_state(node: Node) -> None:
    spec = InstanceSpec(role="chat", flavor=Flavor.LLAMACPP, model="tiny", port=free_port())
    iid = node.place(spec)
    metrics = NodeMetrics(lambda: node, node.settings.chain_path)
    samples, _ = parse(metrics.render()[0])
    labels = {"instance": iid, "flavor": "llamacpp", "mode": node.status(iid).mode}
    assert of(samples, "infervisor_instance_state", **labels, state="loaded") == 1
    assert ("infervisor_instance_rss_bytes", tuple(sorted(labels.items()))) not in samples
    assert ("infervisor_instance_probe_latency_seconds", tuple(sorted(labels.items()))) not in (
        samples
    )
    node.start(iid)
    node.wait_for(iid, lambda v: v.lifecycle == "running", 60)
    node.stop(iid)
    samples, _ = parse(metrics.render()[0])
    assert of(samples, "infervisor_instance_state", **labels, state="stopped") == 1
    assert of(samples, "infervisor_instance_state", **labels, state="running") == 0
    assert of(samples, "infervisor_instance_reserved_bytes", **labels) == 0
    assert of(samples, "infervisor_chain_head_seq") == head_seq(node.settings.chain_path)
