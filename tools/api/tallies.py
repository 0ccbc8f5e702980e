"""Per-instance counts the chain holds, for the metrics' counters and histogram.

Counted from the chain's events, so they are exact and never go down: the
chain only grows, and every count is over the whole chain (a node restart
keeps them; Prometheus sees no reset). :class:`ChainTallies` folds the events
it has not seen yet at each :meth:`~ChainTallies.refresh` (the first one
reads the chain once from its start; each later one only what was appended
since), over a read-only connection: a reader never blocks the chain writer.

What counts (replay/events.py):

- a **restart**: ``instance.restart_scheduled`` (an automatic restart decided);
- a **load**: ``instance.ready`` closing a start (``instance.starting``): the
  server came up and answered; its **duration** is from the start's decision
  to the ready answer (the events' stamps: the monotonic clock within one
  boot, wall time across boots, ``replay.state.elapsed_s``). A start that ends
  before it is ready (an exit, a stop, a failure, an unload) is no load;
- an **eviction**: ``instance.model_dropped`` (Ollama no longer holds the
  model although the instance was running: its keep_alive ran out or Ollama
  evicted it).
"""

from __future__ import annotations

import copy
import sqlite3
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from infervisor.chain import ChainError
from infervisor.chain.connect import connect_reader
from infervisor.chain.schema import events_query, to_event
from infervisor.replay import EventDecodeError, decode_event
from infervisor.replay import events as ev
from infervisor.replay.state import Stamp, elapsed_s

__all__ = ["LOAD_BUCKETS_S", "ChainTallies", "LoadHistogram", "Tally"]

#: The load-duration histogram's upper bounds, seconds (a tiny model loads in
#: well under a second; a large one from a slow disk in minutes).
LOAD_BUCKETS_S: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

#: Every kind a tally reads.
_KINDS = frozenset(
    {
        "instance.starting",
        "instance.ready",
        "instance.restart_scheduled",
        "instance.model_dropped",
        "instance.exited",
        "instance.failed",
        "instance.stop_requested",
        "instance.unloaded",
    }
)

#: Events that end a start that was not ready yet: no load.
_ENDS_START = (ev.Exited, ev.Failed, ev.StopRequested, ev.Unloaded)


@dataclass
class LoadHistogram:
    """One instance's load durations: per bucket of :data:`LOAD_BUCKETS_S` how
    many fell at or under it (not cumulative), their sum in seconds, and how many."""

    counts: list[int] = field(default_factory=lambda: [0] * len(LOAD_BUCKETS_S))
    sum_s: float = 0.0
    observations: int = 0

    def observe(self, seconds: float) -> None:
        """Count one load of ``seconds``."""
        self.observations += 1
        self.sum_s += seconds
        for i, bound in enumerate(LOAD_BUCKETS_S):
            if seconds <= bound:
                self.counts[i] += 1
                return

    def cumulative(self) -> list[int]:
        """How many loads took at most each bound (Prometheus' ``le`` buckets)."""
        out, total = [], 0
        for n in self.counts:
            total += n
            out.append(total)
        return out


@dataclass(frozen=True)
class Tally:
    """The counts at one refresh, per instance id (a copy: later refreshes leave it be)."""

    restarts: dict[str, int]
    evictions: dict[str, int]
    loads: dict[str, LoadHistogram]


class ChainTallies:
    """Restarts, loads (with their durations) and evictions per instance id,
    folded from the chain file at ``chain_path``. Thread-safe."""

    def __init__(self, chain_path: Path) -> None:
        self._path = chain_path
        self._lock = threading.Lock()
        self._after = -1
        self.restarts: Counter[str] = Counter()
        self.evictions: Counter[str] = Counter()
        self.loads: dict[str, LoadHistogram] = {}
        #: A start not ready yet, per instance: (its stamp, its ts_ns).
        self._starting: dict[str, tuple[Stamp | None, int]] = {}

    def refresh(self) -> Tally | None:
        """Fold the events appended since the last refresh and answer a copy of
        the counts; None when the chain cannot be read now (what was folded is
        kept: the next refresh goes on from there)."""
        with self._lock:
            try:
                conn = connect_reader(str(self._path))
            except ChainError:
                return None
            try:
                self._fold_rows(conn)
            except sqlite3.Error:  # a read cut short: the rest waits for the next refresh
                return None
            finally:
                conn.close()
            return Tally(
                restarts=dict(self.restarts),
                evictions=dict(self.evictions),
                loads={iid: copy.deepcopy(h) for iid, h in self.loads.items()},
            )

    def _fold_rows(self, conn: sqlite3.Connection) -> None:
        sql, params = events_query(self._after, None, _KINDS)
        for row in conn.execute(sql, params):
            stored = to_event(row)
            self._after = stored.seq
            try:
                self._fold(stored.subject, stored.ts_ns, decode_event(stored))
            except EventDecodeError:  # not one of ours to count: skipped
                continue

    def _fold(self, iid: str, ts_ns: int, event: ev.Event) -> None:
        match event:
            case ev.RestartScheduled():
                self.restarts[iid] += 1
            case ev.ModelDropped():
                self.evictions[iid] += 1
            case ev.Starting(at=at):
                self._starting[iid] = (at, ts_ns)
            case ev.Ready(at=at) if iid in self._starting:
                began, began_ns = self._starting.pop(iid)
                if began is not None and at is not None:
                    seconds = elapsed_s(began, at)
                else:
                    seconds = max(0.0, (ts_ns - began_ns) / 1e9)
                self.loads.setdefault(iid, LoadHistogram()).observe(seconds)
            case _ if isinstance(event, _ENDS_START):
                self._starting.pop(iid, None)
            case _:
                pass
