"""Prometheus metrics of a running node, in the text exposition format.

The control API serves :meth:`NodeMetrics.render` at ``GET /metrics``. Every
scrape builds the metric families afresh from the node (a custom collector on
a private :class:`~prometheus_client.CollectorRegistry`; the process-global
default registry is never used); only the chain's tallies are kept between
scrapes, to read each event once.

What it reads, and from where:

- the instances' views (:meth:`Node.list`: never waits for a probe);
- the chain's head seq, from the chain file over a read-only connection (a
  reader never blocks the chain writer);
- the chain writer's commit latency histogram (:meth:`Node.append_latency`:
  shared by reference, the writer is not asked).

Metrics (per-instance ones are labelled ``instance``, ``flavor``, ``mode``;
each is a gauge unless it says otherwise):

- ``infervisor_up``: 1 when the node runs, 0 while it starts (then alone).
- ``infervisor_node_info{node_id, version}``: always 1.
- ``infervisor_instances``: how many instances the node lists.
- ``infervisor_instance_state{..., state}``: 1 for the instance's current
  lifecycle state, 0 for each other state (every state is always present).
- ``infervisor_instance_restarts_total`` (a counter): automatic restarts
  decided over the chain's life (``instance.restart_scheduled``).
- ``infervisor_instance_restarts_in_budget``: automatic restarts counted
  against the restart budget now (clears when the instance has been stable,
  or on an operator start).
- ``infervisor_instance_restart_budget``: the restart policy's ``max_restarts``.
- ``infervisor_instance_probe_latency_seconds``: how long the last health
  probe took, seconds (from sending it to its report).
- ``infervisor_instance_health_misses_total`` (a counter): missed health
  probes since the node started (not sourced: a node restart starts it again
  from 0, a counter reset).
- ``infervisor_instance_health_misses_consecutive``: consecutive missed probes now.
- ``infervisor_instance_room_refusals_folded_total`` (a counter): starts refused
  for room the same as the ``residency.refused`` recorded just before (within
  its window), so not recorded, since the node started (not sourced).
- ``infervisor_instance_loads_total`` (a counter): starts that became ready
  over the chain's life.
- ``infervisor_instance_evictions_total`` (a counter): models Ollama dropped
  while the instance ran (keep_alive ran out, or evicted), over the chain's life.
- ``infervisor_instance_load_duration_seconds`` (a histogram): from a start's
  decision to the server's ready answer, seconds; buckets 0.1 s to 300 s.
- ``infervisor_instance_reserved_bytes``: memory the residency ledger
  reserves for it, bytes.
- ``infervisor_instance_rss_bytes``: observed resident memory of the server's
  process tree, bytes.
- ``infervisor_node_containment{mode}``: always 1; ``mode`` is ``cgroup2``,
  ``cgroup1`` or ``pgroup`` (docs/process-supervision.md).
- ``infervisor_instance_oom_kills_total`` (a counter): exits recorded as OOM
  kills under the instance's memory limit.
- ``infervisor_instance_memory_max_bytes``: the instance's memory limit, bytes.
- ``infervisor_instance_cgroup_memory_bytes``: memory charged to the server's
  whole tree in its cgroup, bytes.
- ``infervisor_instance_cpu_seconds_total`` (a counter): CPU time of the
  server's whole tree in its cgroup since its launch, seconds.
- ``infervisor_chain_head_seq``: the chain's highest seq (-1: no event).
- ``infervisor_chain_append_failing``: 1 while the chain refuses writes (disk
  full, write lock held by another process: observations wait), else 0
  (:meth:`Node.append_status`, read without asking the writer).
- ``infervisor_chain_append_failures_total``: failed append transactions
  since the node started (a counter).
- ``infervisor_chain_append_seconds``: histogram of the chain writer's group
  commits, one observation per transaction (``BEGIN`` to ``COMMIT`` done),
  seconds; buckets 0.5 ms to 2.5 s.

- ``infervisor_witness_cosigned_size{witness}``: the largest tree size of
  the chain the witness has cosigned (verified and stored; 0: none).
- ``infervisor_witness_behind_events{witness}``: events of the node's latest
  checkpoint the witness has not cosigned.
- ``infervisor_witness_failing{witness}``: 1 while its last submission failed
  (unreachable, a refusal), else 0.
- ``infervisor_witness_last_success_timestamp_seconds{witness}``: when it
  last cosigned in this run, seconds since the epoch (left out before).

A sample whose value is unknown (no probe yet, RSS not observed, the chain
unreadable) is left out. Restarts, loads, their durations and evictions are
counted from the chain (tools/api/tallies.py: exact, never going down, also
across node restarts); the chain is read incrementally, each scrape reading
only the events appended since the last. ``promtool check metrics`` passes
on the exposition (tests/test_metrics_types.py).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from infervisor.actors.node import VERSION
from infervisor.chain import ChainError
from infervisor.chain.connect import connect_reader
from infervisor.replay import LifecycleState

from .tallies import LOAD_BUCKETS_S, ChainTallies, Tally

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from infervisor.actors.node import Node
    from infervisor.replay.views import InstanceView

__all__ = ["NodeMetrics"]

log = logging.getLogger(__name__)

_LABELS = ["instance", "flavor", "mode"]
#: Every lifecycle state, in declaration order (one ``state`` label value each).
_STATES: tuple[str, ...] = tuple(s.value for s in LifecycleState)
#: A bucket's ``le`` label as prometheus_client writes it (``0.005``, ``1.0``, ``+Inf``).
_le: Callable[[float], str] = floatToGoString


class NodeMetrics:
    """Renders the node's metrics for one scrape.

    ``node`` answers the running node, or None while it is still starting
    (then only ``infervisor_up 0`` is exposed); ``chain_path`` is the node's
    chain file (read-only); ``also``: more collectors (the front's
    ``infervisor_front_*`` families, tools/front/tally.py).
    """

    def __init__(
        self,
        node: Callable[[], Node | None],
        chain_path: Path,
        also: Iterable[Collector] = (),
    ) -> None:
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_NodeCollector(node, chain_path))
        for collector in also:  # the front's requests and tokens (tools/front/tally.py)
            self._registry.register(collector)

    def render(self) -> tuple[bytes, str]:
        """(the exposition text, its ``Content-Type``), in Prometheus' text format.

        The content type is prometheus_client's ``CONTENT_TYPE_LATEST`` (e.g.
        ``text/plain; version=1.0.0; charset=utf-8``): send it as the header.
        """
        return generate_latest(self._registry), CONTENT_TYPE_LATEST


class _NodeCollector(Collector):
    """Builds every family from the node at each :meth:`collect`."""

    def __init__(self, node: Callable[[], Node | None], chain_path: Path) -> None:
        self._node = node
        self._chain_path = chain_path
        self._tallies = ChainTallies(chain_path)

    def describe(self) -> Iterable[Metric]:
        """Nothing up front: the families depend on the node at scrape time."""
        return []

    def collect(self) -> Iterable[Metric]:
        node = self._node()
        up = GaugeMetricFamily("infervisor_up", "1 when the node is running, 0 while it starts.")
        up.add_metric([], 0 if node is None else 1)
        yield up
        if node is None:
            return
        yield from _node_families(node)
        views = node.list()
        yield from _instance_families(views)
        yield from _counter_families(views, self._tallies)
        yield from _cgroup_families(views)
        yield from _chain_families(node, self._chain_path)
        yield from _witness_families(node)


def _witness_families(node: Node) -> Iterator[Metric]:
    """Each configured witness's lag (actors/witnessing.py's board; none without witnesses)."""
    rows = node.witness_lag()
    if not rows:
        return
    cosigned = GaugeMetricFamily(
        "infervisor_witness_cosigned_size",
        "The largest tree size of this chain the witness cosigned (0: none).",
        labels=["witness"],
    )
    behind = GaugeMetricFamily(
        "infervisor_witness_behind_events",
        "Events of the latest checkpoint the witness has not cosigned.",
        labels=["witness"],
    )
    failing = GaugeMetricFamily(
        "infervisor_witness_failing",
        "1 while the witness's last submission failed, else 0.",
        labels=["witness"],
    )
    success = GaugeMetricFamily(
        "infervisor_witness_last_success_timestamp_seconds",
        "When the witness last cosigned a checkpoint of this run, seconds since the epoch.",
        labels=["witness"],
    )
    for row in rows:
        cosigned.add_metric([row.witness], row.cosigned_size)
        behind.add_metric([row.witness], row.behind_events)
        failing.add_metric([row.witness], 0 if row.last_error is None else 1)
        if row.last_success_ns is not None:
            success.add_metric([row.witness], row.last_success_ns / 1e9)
    yield from (cosigned, behind, failing, success)


def _node_families(node: Node) -> Iterator[Metric]:
    info = GaugeMetricFamily(
        "infervisor_node_info", "The node's identity: always 1.", labels=["node_id", "version"]
    )
    info.add_metric([node.settings.node_id, VERSION], 1)
    yield info
    containment = GaugeMetricFamily(
        "infervisor_node_containment",
        "How managed servers are contained (cgroup2, cgroup1, pgroup): always 1.",
        labels=["mode"],
    )
    containment.add_metric([node.containment.mode], 1)
    yield containment


def _cgroup_families(views: list[InstanceView]) -> Iterator[Metric]:
    """OOM kills, the memory limit, and the tree's memory and CPU from its cgroup."""
    ooms = CounterMetricFamily(
        "infervisor_instance_oom_kills",
        "Exits recorded as OOM kills under the instance's memory limit.",
        labels=_LABELS,
    )
    limit = GaugeMetricFamily(
        "infervisor_instance_memory_max_bytes",
        "The instance's memory limit, bytes.",
        labels=_LABELS,
    )
    memory = GaugeMetricFamily(
        "infervisor_instance_cgroup_memory_bytes",
        "Memory charged to the server's whole process tree in its cgroup, bytes.",
        labels=_LABELS,
    )
    cpu = CounterMetricFamily(
        "infervisor_instance_cpu_seconds",
        "CPU time of the server's whole process tree in its cgroup since its launch, seconds.",
        labels=_LABELS,
    )
    for view in views:
        labels = [view.instance_id, view.flavor, view.mode]
        ooms.add_metric(labels, view.oom_kills)
        for family, value in (
            (limit, view.memory_max_bytes),
            (memory, view.cgroup_memory_bytes),
            (cpu, view.cpu_seconds),
        ):
            if value is not None:
                family.add_metric(labels, value)
    yield from (ooms, limit, memory, cpu)


def _instance_families(views: list[InstanceView]) -> Iterator[Metric]:
    count = GaugeMetricFamily("infervisor_instances", "Instances the node lists.")
    count.add_metric([], len(views))
    yield count
    state = GaugeMetricFamily(
        "infervisor_instance_state",
        "1 for the instance's current lifecycle state, 0 for every other state.",
        labels=[*_LABELS, "state"],
    )
    restarts = GaugeMetricFamily(
        "infervisor_instance_restarts_in_budget",
        "Automatic restarts counted against the restart budget now (clears when the "
        "instance has been stable, or on an operator start).",
        labels=_LABELS,
    )
    budget = GaugeMetricFamily(
        "infervisor_instance_restart_budget",
        "The restart policy's max_restarts: restarts allowed before the instance is failed.",
        labels=_LABELS,
    )
    latency = GaugeMetricFamily(
        "infervisor_instance_probe_latency_seconds",
        "How long the last health probe took, seconds.",
        labels=_LABELS,
    )
    misses = GaugeMetricFamily(
        "infervisor_instance_health_misses_consecutive",
        "Consecutive missed health probes now (a probe that answers clears them).",
        labels=_LABELS,
    )
    reserved = GaugeMetricFamily(
        "infervisor_instance_reserved_bytes",
        "Memory the node's residency ledger reserves for the instance, bytes.",
        labels=_LABELS,
    )
    rss = GaugeMetricFamily(
        "infervisor_instance_rss_bytes",
        "Observed resident memory of the server's process tree, bytes.",
        labels=_LABELS,
    )
    for view in views:
        labels = [view.instance_id, view.flavor, view.mode]
        for name in _STATES:
            state.add_metric([*labels, name], 1 if view.lifecycle == name else 0)
        restarts.add_metric(labels, view.restarts)
        if view.max_restarts is not None:
            budget.add_metric(labels, view.max_restarts)
        if view.probe_latency_s is not None:
            latency.add_metric(labels, view.probe_latency_s)
        if view.misses is not None:
            misses.add_metric(labels, view.misses)
        reserved.add_metric(labels, view.reserved_bytes)
        if view.rss_bytes is not None:
            rss.add_metric(labels, view.rss_bytes)
    yield from (state, restarts, budget, latency, misses, reserved, rss)


def _counter_families(views: list[InstanceView], tallies: ChainTallies) -> Iterator[Metric]:
    """Restarts, health misses, loads and evictions (counters) and load durations
    (a histogram); without a readable chain only the health misses."""
    misses = CounterMetricFamily(
        "infervisor_instance_health_misses",
        "Missed health probes since the node started.",
        labels=_LABELS,
    )
    folded = CounterMetricFamily(
        "infervisor_instance_room_refusals_folded",
        "Starts refused for room like the residency.refused before them, so not "
        "recorded, since the node started.",
        labels=_LABELS,
    )
    for view in views:
        labels = [view.instance_id, view.flavor, view.mode]
        misses.add_metric(labels, view.missed_probes or 0)
        folded.add_metric(labels, view.refusals_folded)
    yield misses
    yield folded
    tally = tallies.refresh()
    if tally is None:
        log.warning("metrics: the chain cannot be read; its counters are left out")
        return
    loads = {iid: hist.observations for iid, hist in tally.loads.items()}
    counted = (
        ("restarts", "Automatic restarts decided (instance.restart_scheduled).", tally.restarts),
        ("loads", "Starts that became ready (the server answered).", loads),
        ("evictions", "Models Ollama dropped while the instance ran.", tally.evictions),
    )
    for name, doc, counts in counted:
        family = CounterMetricFamily(f"infervisor_instance_{name}", doc, labels=_LABELS)
        for view in views:
            family.add_metric(
                [view.instance_id, view.flavor, view.mode], counts.get(view.instance_id, 0)
            )
        yield family
    yield _load_histogram(views, tally)


def _load_histogram(views: list[InstanceView], tally: Tally) -> Metric:
    family = HistogramMetricFamily(
        "infervisor_instance_load_duration_seconds",
        "From a start's decision to the server's ready answer, seconds.",
        labels=_LABELS,
    )
    for view in views:
        hist = tally.loads.get(view.instance_id)
        if hist is None:
            continue
        cumulative = zip(LOAD_BUCKETS_S, hist.cumulative(), strict=True)
        buckets = [(_le(b), float(c)) for b, c in cumulative]
        buckets.append(("+Inf", float(hist.observations)))
        family.add_metric([view.instance_id, view.flavor, view.mode], buckets, hist.sum_s)
    return family


def _chain_families(node: Node, chain_path: Path) -> Iterator[Metric]:
    head = _head_seq(chain_path)
    if head is not None:
        family = GaugeMetricFamily(
            "infervisor_chain_head_seq", "The chain's highest sequence number (-1: empty)."
        )
        family.add_metric([], head)
        yield family
    yield from _append_health_families(node)
    snap = node.append_latency()
    buckets: list[tuple[str, float]] = [
        (_le(b), float(c)) for b, c in zip(snap.bounds, snap.cumulative, strict=True)
    ]
    buckets.append(("+Inf", float(snap.observations)))
    histogram = HistogramMetricFamily(
        "infervisor_chain_append_seconds",
        "Each group commit of the chain writer: one transaction, BEGIN to COMMIT done, seconds.",
        buckets=buckets,
        sum_value=snap.sum_s,
    )
    yield histogram


def _append_health_families(node: Node) -> Iterator[Metric]:
    health = node.append_status()
    failing = GaugeMetricFamily(
        "infervisor_chain_append_failing",
        "1 while the chain refuses writes (disk full, lock held elsewhere), else 0.",
    )
    failing.add_metric([], 0 if health.writable else 1)
    failures = CounterMetricFamily(
        "infervisor_chain_append_failures",
        "Failed append transactions of the chain writer since the node started.",
    )
    failures.add_metric([], health.failures)
    yield from (failing, failures)


def _head_seq(chain_path: Path) -> int | None:
    """``max(seq)`` of the chain (-1 when it has no event), or None if it cannot be read."""
    try:
        conn = connect_reader(str(chain_path))
    except ChainError:  # a scrape leaves the sample out rather than fail
        log.warning("metrics: the chain %s cannot be opened", chain_path, exc_info=True)
        return None
    try:
        row = conn.execute("SELECT max(seq) FROM events").fetchone()
    except sqlite3.Error:  # as above
        log.warning("metrics: the chain %s cannot be read", chain_path, exc_info=True)
        return None
    finally:
        conn.close()
    return -1 if row is None or row[0] is None else int(row[0])
