"""Requests and tokens per instance, counted by the front (not chain rows: issue 21).

The front counts on its event loop; the control API's ``/metrics``
(tools/api/metrics.py) collects a snapshot through :class:`FrontCollector`.
Not sourced: a node restart starts the counters again from 0 (a counter reset,
which Prometheus' ``rate()`` handles).

Metrics (labels ``instance`` and, where said, ``route`` and ``code``):

- ``infervisor_front_requests_total{instance, route, code}`` (a counter):
  requests routed to the instance, by route (``/v1/chat/completions``...) and
  HTTP status the server answered (``499``: the client went away before it did).
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

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["FrontCollector", "FrontTally"]


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
        requests = CounterMetricFamily(
            "infervisor_front_requests",
            "Requests the front routed to the instance, by route and status answered.",
            labels=["instance", "route", "code"],
        )
        for (iid, route, code), n in sorted(t.requests.items()):
            requests.add_metric([iid, route, code], n)
        tokens = CounterMetricFamily(
            "infervisor_front_tokens",
            "Tokens the instance's server reported for the front's requests.",
            labels=["instance", "kind"],
        )
        for (iid, kind), n in sorted(t.tokens.items()):
            tokens.add_metric([iid, kind], n)
        in_flight = GaugeMetricFamily(
            "infervisor_front_in_flight", "Requests being served now.", labels=["instance"]
        )
        for iid, n in sorted(t.in_flight.items()):
            in_flight.add_metric([iid], n)
        waiting = GaugeMetricFamily(
            "infervisor_front_waiting",
            "Requests waiting for the instance to be ready.",
            labels=["instance"],
        )
        for iid, n in sorted(t.waiting.items()):
            waiting.add_metric([iid], n)
        refused = CounterMetricFamily(
            "infervisor_front_refused",
            "Requests the front answered itself with an error, by code.",
            labels=["code"],
        )
        for code, n in sorted(t.refused.items()):
            refused.add_metric([code], n)
        return [requests, tokens, in_flight, waiting, refused]
