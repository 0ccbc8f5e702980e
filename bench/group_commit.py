"""Group commit with N appenders, each acknowledged when durable, beside SQLite's own transactions.

In one run, in interleaved rounds on the same file system (so outside load
skews all sides alike), each round measures:

- **filling** (the writer's default, actors/commit_fill.py): N threads, each
  asking the ``ChainWriter`` for one event and waiting for its answer before
  the next, as bench/summary.py's row does;
- **not filling** (``fill_wait_s=0``: the writer commits whatever is queued the
  moment it is free, the behaviour before the fill);
- **SQLite's own 1,000-row transactions**: plain sqlite3 inserting the chain's
  rows into the chain's schema, WAL, ``synchronous=FULL``;
- **SQLite's own 32-row transactions**, the same: what SQLite alone does with
  batches no larger than 32 callers can fill (each commit writes its dirty
  index pages and fsyncs), the writer's ceiling in this benchmark.

For the two writers it also counts the transactions and their sizes (by
wrapping ``SqliteChain.append_many``): the mean batch, and the share of the
events that went in a batch covering more than half the callers.

Run: ``python bench/group_commit.py`` (about 1 minute; ``--rounds``,
``--callers``, ``--each`` scale it). The figure reported is each side's best
round (the least disturbed by the machine's other work) and the median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from _harness import machine, table, workdir
from summary import chained_rows, commit, draft, sqlite_rate

from infervisor.actors.chain_writer import ChainWriter
from infervisor.actors.messages import Append
from infervisor.chain import EventDraft, SqliteChain, StoredEvent

SIZES: list[int] = []
_append_many = SqliteChain.append_many


def _counted(chain: SqliteChain, drafts: Sequence[EventDraft]) -> list[StoredEvent]:
    SIZES.append(len(drafts))
    return _append_many(chain, drafts)


SqliteChain.append_many = _counted  # type: ignore[method-assign]


def writer_rate(path: Path, callers: int, each: int, fill_wait_s: float | None) -> float:
    """Events/s of ``callers`` threads appending ``each`` events one at a time."""
    writer = ChainWriter.start(str(path), "bench", fill_wait_s=fill_wait_s)
    try:
        writer.ask(Append(drafts=(draft(0),)))  # genesis and warm-up
        barrier = threading.Barrier(callers + 1)

        def appender(k: int) -> None:
            barrier.wait()
            for i in range(each):
                writer.ask(Append(drafts=(draft(k * each + i),)))

        pool = [threading.Thread(target=appender, args=(k,)) for k in range(callers)]
        for t in pool:
            t.start()
        SIZES.clear()
        barrier.wait()
        started = time.perf_counter()
        for t in pool:
            t.join()
        return callers * each / (time.perf_counter() - started)
    finally:
        writer.stop()


def arguments(doc: str) -> argparse.Namespace:
    """``--rounds``, ``--callers`` and ``--each``, with ``doc``'s first paragraph as help."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--callers", type=int, default=32)
    ap.add_argument("--each", type=int, default=300, help="events per caller per round")
    return ap.parse_args()


def main() -> None:
    args = arguments(__doc__)
    print(f"# {machine()}, commit {commit()}", flush=True)
    rates: dict[str, list[float]] = {
        "filling": [],
        "not filling": [],
        "sqlite": [],
        "sqlite 32": [],
    }
    batches: dict[str, list[int]] = {"filling": [], "not filling": []}
    rows = chained_rows(20_000)
    with workdir("group") as root:
        for r in range(args.rounds):
            for name, wait in (("filling", None), ("not filling", 0.0)):
                path = root / f"{r}-{name.replace(' ', '-')}.db"
                rates[name].append(writer_rate(path, args.callers, args.each, wait))
                batches[name] += SIZES
            rates["sqlite"].append(sqlite_rate(root / f"{r}-sqlite.db", rows, 1_000))
            rates["sqlite 32"].append(sqlite_rate(root / f"{r}-sqlite-32.db", rows, args.callers))
    best_sqlite = max(rates["sqlite"])
    out = []
    for name, got in rates.items():
        best, median = max(got), statistics.median(got)
        sizes = batches.get(name)
        if sizes:
            mean = sum(sizes) / len(sizes)
            over_half = sum(s for s in sizes if s > args.callers / 2) / sum(sizes)
            shape = f"mean {mean:.1f}, {over_half:.0%} of events in > half"
        else:
            shape = f"{1_000 if name == 'sqlite' else args.callers:,} a transaction"
        out.append([name, f"{best:,.0f}", f"{median:,.0f}", f"{best / best_sqlite:.2f}x", shape])
    print(
        table(
            ["side", "best events/s", "median", "best vs SQLite's best", "batches"],
            out,
        )
    )
    fill, old = max(rates["filling"]), max(rates["not filling"])
    load = os.getloadavg()
    print(
        f"\nfilling / not filling: {fill / old:.2f}x (best rounds); "
        f"load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )


if __name__ == "__main__":
    main()
