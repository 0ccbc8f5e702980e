"""The writer's fill rule beside two pipelined rules, in interleaved rounds (stop 34).

Not a change to the writer: each variant is a :class:`FillPolicy` subclass put in
the writer's module for its rounds only, so that a quiet machine can tell whether
overlapping a commit with the other callers' turns beats the rule of
actors/commit_fill.py. Each round runs, in turn, 32 appenders (bench/summary.py's
row) through:

- **whole** (the writer as it is): after a commit the next batch waits for every
  caller it covered plus those queued, for at most that commit's duration;
- **halves**: the next batch waits for half of them, so that one half commits
  (its fsync lets go of the GIL) while the other half takes its turns;
- **complement**: the next batch waits for the callers not in flight (the
  largest ``covered + queued`` of the last 8 commits, less the callers just
  covered), and for at least half of them.

Pipelining can only win while a commit's fixed cost (the fsync) is below the
turns it overlaps (32 x about 29 us on a quiet machine): a slow disk or a loaded
machine fragments the batches instead (bench/README.md, stop 34).

Run: ``python bench/fill_variants.py --rounds 5`` (about 20 s a round). Prints
each round, then each variant's median and best, their ratio to ``whole``'s, the
mean batch and the load average.
"""

from __future__ import annotations

import os
import statistics
from typing import ClassVar

import group_commit
from _harness import machine, table, workdir
from group_commit import SIZES, arguments, writer_rate
from summary import commit

from infervisor.actors import chain_writer
from infervisor.actors.commit_fill import MAX_FILL_WAIT_S, FillPolicy, FillWait


class Halves(FillPolicy):
    """Wait for half of the callers covered and queued."""

    def committed(self, covered: int, queued: int, took_s: float) -> None:
        super().committed(covered, queued, took_s)
        self.next = FillWait(max(1, (covered + queued + 1) // 2), self.next.at_most_s)


class Complement(FillPolicy):
    """Wait for the callers not in flight, and for at least half of all."""

    window: ClassVar[int] = 8

    def __init__(self, fill_wait_s: float | None = None) -> None:
        super().__init__(fill_wait_s)
        self._seen: list[int] = []

    def committed(self, covered: int, queued: int, took_s: float) -> None:
        self._seen = [*self._seen, covered + queued][-self.window :]
        callers = max(self._seen)
        want = max(callers - covered, (callers + 1) // 2, 1)
        self.next = FillWait(want, min(took_s, MAX_FILL_WAIT_S))


VARIANTS: dict[str, type[FillPolicy]] = {
    "whole": FillPolicy,
    "halves": Halves,
    "complement": Complement,
}


def main() -> None:
    args = arguments(__doc__)
    print(f"# {machine()}, commit {commit()}", flush=True)
    rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
    sizes: dict[str, list[int]] = {name: [] for name in VARIANTS}
    with workdir("fill") as root:
        for r in range(args.rounds):
            line = []
            for name, policy in VARIANTS.items():
                setattr(chain_writer, "FillPolicy", policy)  # noqa: B010 (a module's global)
                try:
                    rate = writer_rate(root / f"{r}-{name}.db", args.callers, args.each, None)
                finally:
                    setattr(chain_writer, "FillPolicy", FillPolicy)  # noqa: B010
                rates[name].append(rate)
                sizes[name] += SIZES
                line.append(f"{name} {rate:,.0f} (batch {_mean(SIZES):.1f})")
            print(f"round {r + 1}: " + ", ".join(line), flush=True)
    base = statistics.median(rates["whole"])
    out = []
    for name, got in rates.items():
        median = statistics.median(got)
        out.append(
            [name, f"{median:,.0f}", f"{max(got):,.0f}", f"{median / base:.2f}x",
             f"{_mean(sizes[name]):.1f}"]
        )  # fmt: skip
    print(table(["fill rule", "median events/s", "best", "median vs whole", "mean batch"], out))
    load = os.getloadavg()
    print(f"\nload average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")


def _mean(values: list[int]) -> float:
    return sum(values) / len(values) if values else 0.0


assert group_commit.SIZES is SIZES  # the counting wrapper group_commit installs

if __name__ == "__main__":
    main()
