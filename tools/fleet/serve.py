"""``infervisor fleet serve``: follow every node continuously and serve metrics.

One thread per node follows its event stream into the store
(:func:`.follow.follow`), reconnecting from the last stored seq when the
node goes away (restarts, stops) with a bounded backoff; one thread checks
every node's checkpoint each ``check_interval_s`` (:func:`.witness.check_node`)
and reads its head. ``/metrics`` (Prometheus text format, prometheus-client
on a private registry) is built at each scrape from what the threads saw and
from the store (so the counts survive a restart of the fleet)::

    infervisor_fleet_node_up{node}                      1 when it answered last, else 0
    infervisor_fleet_node_events_behind{node}           its head seq + 1 - events stored
                                                        (left out while it has diverged)
    infervisor_fleet_node_events_missing{node}          events stored beyond its head + 1 (a
                                                        chain cut short: truncated), else 0
    infervisor_fleet_node_diverged{node}                1 while its chain departs from the
                                                        fleet's copy (truncated or forked)
    infervisor_fleet_node_events_stored{node}           events stored of it
    infervisor_fleet_node_verified_size{node}           the last checkpoint size verified
    infervisor_fleet_node_verification_failures_total{node}   failures recorded (a counter)
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from ..api.errors import ApiError
from .config import FleetConfig, NodeEntry
from .follow import Refused, diverged, follow
from .node_api import FleetClient, client_of
from .store import FleetStore, StoreError
from .witness import check_node, diverged_failure

__all__ = ["Fleet", "NodeSeen"]

log = logging.getLogger(__name__)

_BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0)


@dataclass
class NodeSeen:
    """What the threads last saw of one node (under :attr:`Fleet.lock`)."""

    up: bool = False
    head_seq: int | None = None
    last_error: str = ""
    missing: int = 0  # events stored beyond its head + 1 when last compared (cut short)
    diverged: bool = False  # its chain departs from the fleet's copy (cut short or forked)


def short_by(stored: int, head: int | None) -> int:
    """Events stored beyond the node's head `head` + 1 (0: none, or head unknown)."""
    return 0 if head is None else max(0, stored - head - 1)


class Fleet:
    """The serving fleet: its threads and its metrics (`start`, then `stop`)."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.lock = threading.Lock()
        self.seen = {e.name: NodeSeen() for e in config.nodes}
        self.stopping = threading.Event()
        self._store = FleetStore(config.store)  # the scrapes' connection (under lock)
        self._threads: list[threading.Thread] = []

    def start(self, listen: tuple[str, int] | None) -> tuple[str, int] | None:
        """Start the followers, the checker and (`listen`) the metrics server; the
        address it listens on (port 0: the one the system chose)."""
        for entry in self.config.nodes:
            self._spawn(f"follow-{entry.name}", self._follow_loop, entry)
        self._spawn("fleet-check", self._check_loop)
        if listen is None:
            return None
        registry = CollectorRegistry(auto_describe=True)
        registry.register(_Collector(self))
        server, _ = start_http_server(listen[1], addr=listen[0], registry=registry)
        return listen[0], int(server.server_address[1])

    def _spawn(self, name: str, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    def _mark(self, node: str, *, up: bool, error: str = "", head: int | None = None) -> None:
        with self.lock:
            seen = self.seen[node]
            seen.up, seen.last_error = up, error
            if head is not None:
                seen.head_seq = head

    def _follow_loop(self, entry: NodeEntry) -> None:
        """Follow `entry` until stopped: reconnect after it goes away, pause after a refusal."""
        tries = 0
        with FleetStore(self.config.store) as store:
            while not self.stopping.is_set():
                try:
                    with client_of(entry) as client:
                        self._mark(entry.name, up=True, head=client.node_view().head_seq)
                        tries = 0
                        if self._short(entry, client, store):
                            self.stopping.wait(self.config.check_interval_s)
                            continue
                        follow(
                            entry,
                            client,
                            store,
                            keep_following=True,
                            on_stored=functools.partial(self._stored, entry.name),
                        )
                except ApiError as e:
                    self._mark(entry.name, up=False, error=str(e))
                except (msgspec.DecodeError, msgspec.ValidationError) as e:
                    self._mark(entry.name, up=True, error=f"an event not understood: {e}")
                    self.stopping.wait(self.config.check_interval_s)
                except Refused as e:
                    log.warning("%s", e)
                    self.stopping.wait(self.config.check_interval_s)
                except StoreError as e:
                    log.error("%s", e)  # noqa: TRY400 - one line, no traceback
                    self.stopping.wait(self.config.check_interval_s)
                self.stopping.wait(_BACKOFF_S[min(tries, len(_BACKOFF_S) - 1)])
                tries += 1

    def _short(self, entry: NodeEntry, client: FleetClient, store: FleetStore) -> bool:
        """Whether `entry`'s chain departs from the events stored, cut short or
        forked (a failure recorded: follow.py ``diverged``).

        Raises:
            ApiError: the node's (client's) errors.
        """
        stored = store.count(entry.name)
        found = diverged(client, store.last(entry.name))
        failure = diverged_failure(entry, store, stored, found)
        with self.lock:
            seen = self.seen[entry.name]
            seen.missing = short_by(stored, found.head) if found is not None else 0
            seen.diverged = found is not None
        if failure is not None:
            log.warning("node %s: %s: %s", entry.name, failure.outcome, failure.detail)
        return failure is not None

    def _stored(self, node: str, seq: int) -> None:
        with self.lock:
            seen = self.seen[node]
            seen.head_seq = max(seq, seen.head_seq if seen.head_seq is not None else -1)

    def _check_loop(self) -> None:
        with FleetStore(self.config.store) as store:
            while not self.stopping.is_set():
                for entry in self.config.nodes:
                    self._check_one(entry, store)
                self.stopping.wait(self.config.check_interval_s)

    def _check_one(self, entry: NodeEntry, store: FleetStore) -> None:
        try:
            with client_of(entry) as client:
                self._mark(entry.name, up=True, head=client.node_view().head_seq)
                if self._short(entry, client, store):
                    return
                result = check_node(entry, client, store)
        except ApiError as e:
            self._mark(entry.name, up=False, error=str(e))
            return
        except StoreError as e:
            log.error("%s", e)  # noqa: TRY400 - one line, no traceback
            return
        if result.outcome not in ("ok", "unreachable"):
            log.warning("node %s: %s: %s", entry.name, result.outcome, result.detail)

    def stop(self) -> None:
        """Ask the threads to end (they are daemons: the process may exit at once)."""
        self.stopping.set()

    def families(self) -> Iterator[Metric]:
        """The metric families of one scrape (module doc)."""
        up = GaugeMetricFamily(
            "infervisor_fleet_node_up", "1 when the node answered last", labels=["node"]
        )
        behind = GaugeMetricFamily(
            "infervisor_fleet_node_events_behind",
            "The node's head seq + 1 less the events the fleet stored of it",
            labels=["node"],
        )
        missing = GaugeMetricFamily(
            "infervisor_fleet_node_events_missing",
            "Events the fleet stored beyond the node's head + 1 (its chain cut short), else 0",
            labels=["node"],
        )
        stored = GaugeMetricFamily(
            "infervisor_fleet_node_events_stored",
            "Events the fleet stored of the node",
            labels=["node"],
        )
        verified = GaugeMetricFamily(
            "infervisor_fleet_node_verified_size",
            "Tree size of the node's last checkpoint the fleet verified (0: none)",
            labels=["node"],
        )
        departed = GaugeMetricFamily(
            "infervisor_fleet_node_diverged",
            "1 when the node's chain departs from the fleet's copy (cut short or forked)",
            labels=["node"],
        )
        failures = CounterMetricFamily(
            "infervisor_fleet_node_verification_failures",
            "Verification failures the fleet recorded of the node (distinct ones)",
            labels=["node"],
        )
        with self.lock:
            for entry in self.config.nodes:
                name, seen = entry.name, self.seen[entry.name]
                count = self._store.count(name)
                held = self._store.verified(name)
                up.add_metric([name], 1.0 if seen.up else 0.0)
                departed.add_metric([name], 1.0 if seen.diverged else 0.0)
                if seen.diverged:  # cut short or forked: not "0 behind"
                    missing.add_metric([name], seen.missing)
                elif seen.head_seq is not None:
                    behind.add_metric([name], max(0, seen.head_seq + 1 - count))
                    missing.add_metric([name], 0)
                stored.add_metric([name], count)
                verified.add_metric([name], held.size if held is not None else 0)
                failures.add_metric([name], len(self._store.failures(name)))
        yield from (up, behind, missing, departed, stored, verified, failures)


class _Collector(Collector):
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        try:
            yield from self.fleet.families()
        except StoreError as e:
            log.error("%s", e)  # noqa: TRY400 - one line, no traceback
