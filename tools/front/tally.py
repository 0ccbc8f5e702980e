"""Requests and tokens per instance, counted by the front (not chain rows: issue 21).

The front counts on its event loop; the control API's ``/metrics``
(tools/api/metrics.py) collects a snapshot through :class:`FrontCollector`.
Not sourced: a node restart starts the counters again from 0 (a counter reset,
which Prometheus' ``rate()`` handles).

Metrics (labels ``instance`` and, where said, ``route`` and ``code``):

- ``infervisor_front_requests_total{instance, route, code}`` (a counter):
  requests routed to the instance, by route (``/v1/chat/completions``...) and
  HTTP status the server answered (``499``, nginx's "client closed request":
  the client went away before it did, or while its request waited for the
  instance to be ready).
- ``infervisor_front_tokens_total{instance, kind}`` (a counter): tokens the
  servers reported (``usage``, Ollama's ``eval_count``), ``kind`` ``prompt`` or
  ``completion``; a stream that reports no usage counts one completion token per
  event that carries text.
- ``infervisor_front_in_flight{instance}``: requests being served now.
- ``infervisor_front_waiting{instance}``: requests waiting for it to be ready.
- ``infervisor_front_refused_total{code}`` (a counter): requests the front
  answered itself with an error, by the error's code (``model_not_found``...).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from typing import Any, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["FrontCollector", "FrontTally"]

F = TypeVar("F", CounterMetricFamily, GaugeMetricFamily)


class FrontTally:
    """The counters (written on the front's loop, read by a scrape on any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, str, str]] = Counter()
        self.tokens: Counter[tuple[str, str]] = Counter()
        self.in_flight: Counter[str] = Counter()
        self.waiting: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()

    def began(self, instance_id: str) -> None:
        with self._lock:
            self.in_flight[instance_id] += 1

    def ended(self, instance_id: str, route: str, status: int) -> None:
        with self._lock:
            self.in_flight[instance_id] -= 1
            self.requests[(instance_id, route, str(status))] += 1

    def left(self, instance_id: str, route: str) -> None:
        """A client went away while its request waited for ``instance_id`` to be
        ready: a 499, as one that leaves before the server answers."""
        with self._lock:
            self.requests[(instance_id, route, "499")] += 1

    def counted(self, instance_id: str, prompt: int, completion: int) -> None:
        with self._lock:
            if prompt:
                self.tokens[(instance_id, "prompt")] += prompt
            if completion:
                self.tokens[(instance_id, "completion")] += completion

    def wait(self, instance_id: str, delta: int) -> None:
        with self._lock:
            self.waiting[instance_id] += delta

    def refuse(self, code: str) -> None:
        with self._lock:
            self.refused[code] += 1

    def snapshot(self) -> FrontTally:
        """A copy to read without the lock."""
        copy = FrontTally()
        with self._lock:
            copy.requests = self.requests.copy()
            copy.tokens = self.tokens.copy()
            copy.in_flight = self.in_flight.copy()
            copy.waiting = self.waiting.copy()
            copy.refused = self.refused.copy()
        return copy


class FrontCollector(Collector):
    """The front's families for a Prometheus registry (tools/api/metrics.py's)."""

    def __init__(self, tally: FrontTally) -> None:
        self._tally = tally

    def describe(self) -> Iterable[CounterMetricFamily]:
        return []

    def collect(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        t = self._tally.snapshot()
        return [
            _family(
                CounterMetricFamily,
                "infervisor_front_requests",
                "Requests the front routed to the instance, by route and status answered.",
                ["instance", "route", "code"],
                t.requests,
            ),
            _family(
                CounterMetricFamily,
                "infervisor_front_tokens",
                "Tokens the instance's server reported for the front's requests.",
                ["instance", "kind"],
                t.tokens,
            ),
            _family(
                GaugeMetricFamily,
                "infervisor_front_in_flight",
                "Requests being served now.",
                ["instance"],
                t.in_flight,
            ),
            _family(
                GaugeMetricFamily,
                "infervisor_front_waiting",
                "Requests waiting for the instance to be ready.",
                ["instance"],
                t.waiting,
            ),
            _family(
                CounterMetricFamily,
                "infervisor_front_refused",
                "Requests the front answered itself with an error, by code.",
                ["code"],
                t.refused,
            ),
        ]


def _family(
    kind: type[F], name: str, documentation: str, labels: list[str], counts: Counter[Any]
) -> F:
    """One family of ``counts``, a sample per key (the key's parts are the label
    values, in the order of ``labels``), sorted by key."""
    family = kind(name, documentation, labels=labels)
    for key, n in sorted(counts.items()):
        family.add_metric(list(key) if isinstance(key, tuple) else [key], n)
    return family
