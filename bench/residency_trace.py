"""Loads made on a recorded request trace: the node's residency policy against a
plain LRU-of-2 swap (issue 21, item 4).

The trace (``bench/residency_trace.csv``, checked in; ``--write-trace``
regenerates it from its seed) is four models' requests over four hours: a
chat model used all the time (pinned in the node's policy), a code model in
sessions, an embedding model in batches, a summariser now and then. Each line
is ``t_ms,model,duration_ms`` (arrival, model, time the request holds the
server). It is synthetic (seeded), not captured from users.

The memory budget holds two of the four (equal sizes). Two policies replay it,
side by side, as a discrete-event simulation (no servers, no clock):

- **node**: the core's eviction choice (``plan_room`` of
  ``actors/core/residency.py``, part R: the least recently used of the
  instances that are not pinned, not of higher priority, not serving a
  request and not loading, all or none). A start that only instances serving
  a request or loading keep out waits (in the front's queue of
  ``--queue-limit`` per model, up to the start-up deadline ``--deadline-s``)
  until one ends, then plans again (the plan's ``wait_for``). A start that
  nothing can make room for, a full queue or a wait past the deadline is
  refused (the front answers 503 with ``Retry-After``) and the client asks
  again after ``--retry-after`` seconds.
- **lru2**: the simple swap of the peers (llama-swap's groups, LocalAI's
  ``--max-active-backends 2``): the least recently used of the two goes,
  whatever it is doing; its requests in flight are cut.

A load takes ``--load-s`` seconds, during which the instance is busy (the
request waits for it). Last use is the later of a request's arrival and the
end of the last one, as the node sources it (``residency.busy``/``.idle``).

Run: ``python bench/residency_trace.py`` (well under a second).
"""

from __future__ import annotations

import argparse
import csv
import heapq
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from infervisor.actors.core import residency
from infervisor.actors.core.residency import Holder

TRACE = Path(__file__).resolve().parent / "residency_trace.csv"
SEED = 21
GIB = 2**30
MODELS = ("chat", "code", "embed", "summarize")
PINNED = frozenset({"chat"})
PRIORITY = {"chat": 0, "code": 0, "embed": 0, "summarize": 0}
SIZE = GIB
BUDGET = 2 * GIB


# ---------------------------------------------------------------- the trace
@dataclass(frozen=True)
class Request:
    t_ms: int
    model: str
    duration_ms: int


def make_trace(seed: int = SEED, hours: float = 4.0) -> list[Request]:
    """Sessions arriving at random (mean every 40 s); each picks a model by weight
    and sends a few requests with think time between them."""
    rng = random.Random(seed)
    kinds = {  # weight, requests per session, think s, duration s (lognormal median)
        "chat": (0.45, (2, 8), 20.0, 4.0),
        "code": (0.25, (3, 12), 15.0, 6.0),
        "embed": (0.18, (5, 30), 0.5, 0.15),
        "summarize": (0.12, (1, 3), 30.0, 10.0),
    }
    names, weights = list(kinds), [k[0] for k in kinds.values()]
    out: list[Request] = []
    t = 0.0
    end = hours * 3600
    while True:
        t += rng.expovariate(1 / 40.0)
        if t >= end:
            break
        model = rng.choices(names, weights)[0]
        _, (lo, hi), think, median = kinds[model]
        at = t
        for _ in range(rng.randint(lo, hi)):
            took = median * rng.lognormvariate(0, 0.5)
            out.append(Request(round(at * 1000), model, max(1, round(took * 1000))))
            at += took + rng.expovariate(1 / think)
    out.sort(key=lambda r: (r.t_ms, r.model))
    return out


def write_trace(path: Path, requests: Sequence[Request]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_ms", "model", "duration_ms"])
        w.writerows((r.t_ms, r.model, r.duration_ms) for r in requests)


def read_trace(path: Path) -> list[Request]:
    with path.open(newline="") as f:
        return [
            Request(int(r["t_ms"]), r["model"], int(r["duration_ms"])) for r in csv.DictReader(f)
        ]


# ---------------------------------------------------------------- the choice
class Pick(NamedTuple):
    """A choice's answer: whom to evict, whether it then fits, and (when it does
    not) whether the start may wait for a busy or loading instance to end."""

    victims: tuple[str, ...]
    fits: bool
    wait: bool = False


Choice = Callable[[str, int, int, int, list[Holder]], Pick]


def core_choice(*, wait: bool = True) -> tuple[Choice, str]:
    """The core's ``plan_room``, over the simulation's holders (``wait`` False:
    a start is refused at once even when it could wait, as before stop 30)."""

    def choose(
        for_instance: str, needed: int, budget: int, priority: int, holders: list[Holder]
    ) -> Pick:
        plan = residency.plan_room(for_instance, needed, budget, priority, holders)
        return Pick(tuple(plan.victims), plan.refusal is None, wait and bool(plan.wait_for))

    return choose, "the core's actors/core/residency.py plan_room"


def lru2_choice(
    for_instance: str, needed: int, budget: int, priority: int, holders: list[Holder]
) -> Pick:
    """The plain swap: evict the least recently used until it fits, whatever it does."""
    others = sorted(holders, key=lambda h: (h.last_use_ns or 0, h.instance_id))
    in_use, victims = sum(h.held_bytes for h in others), []
    for h in others:
        if in_use + needed <= budget:
            break
        victims.append(h.instance_id)
        in_use -= h.held_bytes
    return Pick(tuple(victims), True)


# ---------------------------------------------------------------- the replay
@dataclass
class Instance:
    name: str
    resident: bool = False
    loading_until_ns: int = 0
    inflight: set[int] = field(default_factory=set)
    last_use_ns: int | None = None


@dataclass
class Outcome:
    loads: int = 0
    evictions: int = 0
    cut: int = 0  # requests in flight on an evicted instance
    refused: int = 0  # 503 answers (each retried)
    waited_for_room: int = 0  # starts that waited for a busy or loading instance
    waited_ms: list[int] = field(default_factory=list)  # arrival to service start


@dataclass(frozen=True)
class Front:
    """The front's bounds on a start that waits: its queue per model and the
    start-up deadline (seconds), and the ``Retry-After`` of a refusal."""

    queue_limit: int = 64
    deadline_s: float = 900.0
    retry_after_s: float = 1.0


#: An event of the replay: (time ns, order at a tie, kind, request id, arrival ns,
#: waiting since ns or -1). Ends sort first, then loads done, then arrivals.
Event = tuple[int, int, str, int, int, int]


def replay(
    trace: Sequence[Request],
    choose: Choice,
    *,
    pins: bool,
    load_s: float,
    front: Front,
) -> Outcome:
    """Replay ``trace`` under ``choose``; every request is served in the end."""
    return _Replay(trace, choose, pins=pins, load_ns=int(load_s * 1e9), front=front).run()


class _Replay:
    """One replay's state: the instances, the events to come, the starts waiting."""

    def __init__(
        self, trace: Sequence[Request], choose: Choice, *, pins: bool, load_ns: int, front: Front
    ) -> None:
        self.trace, self.choose, self.pins, self.load_ns, self.front = (
            trace, choose, pins, load_ns, front,
        )  # fmt: skip
        self.inst = {m: Instance(m) for m in MODELS}
        self.out = Outcome()
        self.parked: dict[str, list[tuple[int, int, int]]] = {m: [] for m in MODELS}
        self.queue: list[Event] = []

    def run(self) -> Outcome:
        for i, r in enumerate(self.trace):
            at = r.t_ms * 1_000_000
            heapq.heappush(self.queue, (at, 2, "arrive", i, at, -1))
        while self.queue:
            now, _, kind, rid, first, since = heapq.heappop(self.queue)
            if kind == "end":
                self._ended(rid, now)
            if kind in ("end", "loaded"):
                self._wake(now)  # a waiting start plans again
                continue
            self._arrive(now, rid, first, since)
        return self.out

    def _arrive(self, now: int, rid: int, first: int, since: int) -> None:
        req = self.trace[rid]
        me = self.inst[req.model]
        if not me.resident:
            pick = self._pick(me, now)
            if not pick.fits:
                self._wait_or_refuse(pick, now, rid, first, since)
                return
            self._load(me, pick, now)
        start = max(now, me.loading_until_ns)
        me.inflight.add(rid)
        me.last_use_ns = max(me.last_use_ns or 0, now)
        self.out.waited_ms.append((start - first) // 1_000_000)
        end = start + req.duration_ms * 1_000_000
        heapq.heappush(self.queue, (end, 0, "end", rid, first, -1))

    def _ended(self, rid: int, now: int) -> None:
        me = self.inst[self.trace[rid].model]
        if rid in me.inflight:  # else it was cut by an eviction
            me.inflight.discard(rid)
            me.last_use_ns = now

    def _pick(self, me: Instance, now: int) -> Pick:
        holders = [
            Holder(
                instance_id=o.name,
                held_bytes=SIZE,
                last_use_ns=o.last_use_ns,
                priority=PRIORITY[o.name],
                pinned=self.pins and o.name in PINNED,
                busy=bool(o.inflight),
                loading=o.loading_until_ns > now,
                serving=o.loading_until_ns <= now,  # resident: loading, else serving
            )
            for o in self.inst.values()
            if o.resident and o is not me
        ]
        return self.choose(me.name, SIZE, BUDGET, PRIORITY[me.name], holders)

    def _load(self, me: Instance, pick: Pick, now: int) -> None:
        for v in pick.victims:
            gone = self.inst[v]
            self.out.evictions += 1
            self.out.cut += len(gone.inflight)
            gone.resident, gone.inflight = False, set()
        self.out.loads += 1
        me.resident, me.loading_until_ns = True, now + self.load_ns
        heapq.heappush(self.queue, (me.loading_until_ns, 1, "loaded", -1, now, -1))

    def _wait_or_refuse(self, pick: Pick, now: int, rid: int, first: int, since: int) -> None:
        """A start that does not fit waits in the front's queue while a busy or
        loading instance may make room, within the deadline; else 503, asked
        again after ``Retry-After``."""
        since = now if since < 0 else since
        waits = self.parked[self.trace[rid].model]
        in_time = now - since < self.front.deadline_s * 1e9
        if pick.wait and in_time and len(waits) < self.front.queue_limit:
            self.out.waited_for_room += since == now
            waits.append((since, rid, first))
            return
        self.out.refused += 1
        again = now + int(self.front.retry_after_s * 1e9)
        heapq.heappush(self.queue, (again, 2, "arrive", rid, first, -1))

    def _wake(self, now: int) -> None:
        """Every waiting start asks again now, in the order they came."""
        waiting = sorted(w for waits in self.parked.values() for w in waits)
        for waits in self.parked.values():
            waits.clear()
        for since, rid, first in waiting:
            heapq.heappush(self.queue, (now, 2, "arrive", rid, first, since))


# ---------------------------------------------------------------- the figures
@dataclass(frozen=True)
class Figures:
    requests: int
    node: Outcome
    unpinned: Outcome  # the node's rule with no pins: what the pin costs or saves
    lru2: Outcome
    source: str
    #: The node's rule refusing a start at once when residents are busy (before stop 30).
    node_no_wait: Outcome | None = None
    unpinned_no_wait: Outcome | None = None

    @property
    def ratio(self) -> float:
        return self.node.loads / self.lru2.loads if self.lru2.loads else float("nan")


def measure(path: Path = TRACE, load_s: float = 2.0, front: Front | None = None) -> Figures:
    trace = read_trace(path)
    front = front or Front()
    choose, source = core_choice()
    at_once, _ = core_choice(wait=False)

    def run(pick: Choice, pins: bool) -> Outcome:
        return replay(trace, pick, pins=pins, load_s=load_s, front=front)

    return Figures(
        len(trace),
        node=run(choose, True),
        unpinned=run(choose, False),
        lru2=run(lru2_choice, False),
        source=source,
        node_no_wait=run(at_once, True),
        unpinned_no_wait=run(at_once, False),
    )


def _p(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--load-s", type=float, default=2.0, help="seconds a load takes (2.0)")
    ap.add_argument("--retry-after", type=float, default=1.0, help="Retry-After, s (1.0)")
    ap.add_argument("--queue-limit", type=int, default=64, help="the front's queue (64)")
    ap.add_argument("--deadline-s", type=float, default=900.0, help="start-up deadline (900)")
    ap.add_argument("--write-trace", action="store_true", help=f"regenerate {TRACE.name}")
    args = ap.parse_args()
    if args.write_trace:
        write_trace(TRACE, make_trace())
        print(f"wrote {TRACE} (seed {SEED})")
        return
    front = Front(args.queue_limit, args.deadline_s, args.retry_after)
    f = measure(TRACE, args.load_s, front)
    print(f"# {f.requests} requests over 4 models, room for 2; choice: {f.source}")
    print(
        f"{'policy':<34}{'loads':>7}{'evictions':>11}{'cut':>6}{'503s':>6}"
        f"{'waited':>8}{'wait p99 ms':>13}"
    )
    rows = (
        ("node, chat pinned", f.node),
        ("node, no pins", f.unpinned),
        ("LRU-of-2, no pins", f.lru2),
        ("node, chat pinned, refusing busy", f.node_no_wait),
        ("node, no pins, refusing busy", f.unpinned_no_wait),
    )
    for name, o in rows:
        if o is None:
            continue
        print(
            f"{name:<34}{o.loads:>7}{o.evictions:>11}{o.cut:>6}{o.refused:>6}"
            f"{o.waited_for_room:>8}{_p(o.waited_ms, 0.99):>13}"
        )
    print(f"loads: node {f.node.loads} = {f.ratio:.2f}x LRU-of-2's {f.lru2.loads}")
    print("cut: requests in flight on an evicted server; 503s: refused starts, retried;")
    print("waited: starts that waited in the queue for a busy or loading instance to end;")
    print("refusing busy: the node's rule as before stop 30 (503 while residents serve)")


if __name__ == "__main__":
    main()
