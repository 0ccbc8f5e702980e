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
  request and not loading, all or none). A start that nothing can make room
  for is refused (the front answers 503 with ``Retry-After``) and the client
  asks again after ``--retry-after`` seconds.
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
#: A policy's choice: (for_instance, needed bytes, budget, priority, the resident
#: holders) -> (the instances it evicts, whether the start goes ahead).
Choice = Callable[[str, int, int, int, list[Holder]], tuple[tuple[str, ...], bool]]


def core_choice() -> tuple[Choice, str]:
    """The core's ``plan_room``, over the simulation's holders."""

    def choose(
        for_instance: str, needed: int, budget: int, priority: int, holders: list[Holder]
    ) -> tuple[tuple[str, ...], bool]:
        plan = residency.plan_room(for_instance, needed, budget, priority, holders)
        return tuple(plan.victims), plan.refusal is None

    return choose, "the core's actors/core/residency.py plan_room"


def lru2_choice(
    for_instance: str, needed: int, budget: int, priority: int, holders: list[Holder]
) -> tuple[tuple[str, ...], bool]:
    """The plain swap: evict the least recently used until it fits, whatever it does."""
    others = sorted(holders, key=lambda h: (h.last_use_ns or 0, h.instance_id))
    in_use, victims = sum(h.held_bytes for h in others), []
    for h in others:
        if in_use + needed <= budget:
            break
        victims.append(h.instance_id)
        in_use -= h.held_bytes
    return tuple(victims), True


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
    waited_ms: list[int] = field(default_factory=list)  # arrival to service start


def replay(
    trace: Sequence[Request],
    choose: Choice,
    *,
    pins: bool,
    load_s: float,
    retry_after_s: float,
) -> Outcome:
    """Replay ``trace`` under ``choose``; every request is served in the end."""
    inst = {m: Instance(m) for m in MODELS}
    out = Outcome()
    load_ns, retry_ns = int(load_s * 1e9), int(retry_after_s * 1e9)
    # (time ns, order, kind, request id, arrival ns): "end" sorts before "arrive" at a tie
    queue: list[tuple[int, int, str, int, int]] = []
    for i, r in enumerate(trace):
        at = r.t_ms * 1_000_000
        heapq.heappush(queue, (at, 1, "arrive", i, at))
    while queue:
        now, _, kind, rid, first = heapq.heappop(queue)
        req = trace[rid]
        me = inst[req.model]
        if kind == "end":
            if rid in me.inflight:  # else it was cut by an eviction
                me.inflight.discard(rid)
                me.last_use_ns = now
            continue
        start = now
        if not me.resident:
            holders = [
                Holder(
                    instance_id=o.name,
                    held_bytes=SIZE,
                    last_use_ns=o.last_use_ns,
                    priority=PRIORITY[o.name],
                    pinned=pins and o.name in PINNED,
                    busy=bool(o.inflight),
                    loading=o.loading_until_ns > now,
                    serving=o.loading_until_ns <= now,  # resident: loading, else serving
                )
                for o in inst.values()
                if o.resident and o is not me
            ]
            victims, fits = choose(req.model, SIZE, BUDGET, PRIORITY[req.model], holders)
            if not fits:
                out.refused += 1
                heapq.heappush(queue, (now + retry_ns, 1, "arrive", rid, first))
                continue
            for v in victims:
                gone = inst[v]
                out.evictions += 1
                out.cut += len(gone.inflight)
                gone.resident, gone.inflight = False, set()
            out.loads += 1
            me.resident, me.loading_until_ns = True, now + load_ns
        start = max(now, me.loading_until_ns)
        me.inflight.add(rid)
        me.last_use_ns = max(me.last_use_ns or 0, now)
        out.waited_ms.append((start - first) // 1_000_000)
        heapq.heappush(queue, (start + req.duration_ms * 1_000_000, 0, "end", rid, first))
    return out


# ---------------------------------------------------------------- the figures
@dataclass(frozen=True)
class Figures:
    requests: int
    node: Outcome
    unpinned: Outcome  # the node's rule with no pins: what the pin costs or saves
    lru2: Outcome
    source: str

    @property
    def ratio(self) -> float:
        return self.node.loads / self.lru2.loads if self.lru2.loads else float("nan")


def measure(path: Path = TRACE, load_s: float = 2.0, retry_after_s: float = 1.0) -> Figures:
    trace = read_trace(path)
    choose, source = core_choice()
    node = replay(trace, choose, pins=True, load_s=load_s, retry_after_s=retry_after_s)
    unpinned = replay(trace, choose, pins=False, load_s=load_s, retry_after_s=retry_after_s)
    lru2 = replay(trace, lru2_choice, pins=False, load_s=load_s, retry_after_s=retry_after_s)
    return Figures(len(trace), node, unpinned, lru2, source)


def _p(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--load-s", type=float, default=2.0, help="seconds a load takes (2.0)")
    ap.add_argument("--retry-after", type=float, default=1.0, help="Retry-After, s (1.0)")
    ap.add_argument("--write-trace", action="store_true", help=f"regenerate {TRACE.name}")
    args = ap.parse_args()
    if args.write_trace:
        write_trace(TRACE, make_trace())
        print(f"wrote {TRACE} (seed {SEED})")
        return
    f = measure(TRACE, args.load_s, args.retry_after)
    print(f"# {f.requests} requests over 4 models, room for 2; choice: {f.source}")
    print(f"{'policy':<28}{'loads':>7}{'evictions':>11}{'cut':>6}{'503s':>6}{'wait p99 ms':>13}")
    rows = (
        ("node, chat pinned", f.node),
        ("node, no pins", f.unpinned),
        ("LRU-of-2, no pins", f.lru2),
    )
    for name, o in rows:
        print(
            f"{name:<28}{o.loads:>7}{o.evictions:>11}{o.cut:>6}{o.refused:>6}"
            f"{_p(o.waited_ms, 0.99):>13}"
        )
    print(f"loads: node {f.node.loads} = {f.ratio:.2f}x LRU-of-2's {f.lru2.loads}")
    print("cut: requests in flight on an evicted server; 503s: refused starts, retried")


if __name__ == "__main__":
    main()
