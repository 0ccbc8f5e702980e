"""Chain append throughput: single appends vs ``append_many`` batches, then verification.

On a new chain file (WAL, ``synchronous=FULL``, as ``SqliteChain.open`` sets
them) it appends, in this order: ``--singles`` events one per transaction
(``append``), then ``--events`` events in batches of 10 and then in batches
of 100 (``append_many``: one transaction, one commit and fsync per batch).
Each payload is a realistic ``instance.exited`` body (160 bytes). Then
``verify_chain`` walks that chain (best of ``--verify-runs``). The whole
sequence is repeated ``--rounds`` times on new files, because the disk is
shared with whatever else the machine does.

Printed: events/s per mode (median and range over the rounds), ms per
transaction, and verification events/s; the ratios are to the single appends
of the same run.

Run: ``python bench/chain_append.py [--singles 500] [--events 5000] [--rounds 3]`` (~15 s).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from _harness import machine, median, percentile, table, workdir

from infervisor.chain import EventDraft, SqliteChain, encode_payload, verify_chain

BATCHES = (1, 10, 100)
PAYLOAD = encode_payload(
    {
        "pid": 123456,
        "exit_code": None,
        "signal": 9,
        "reason": "exited on its own: signal 9 (SIGKILL)",
        "output_tail": "main: server is listening on http://127.0.0.1:8080\n",
    }
)


def drafts(count: int) -> list[EventDraft]:
    return [
        EventDraft(
            ts_ns=time.time_ns(),
            source="supervisor",
            kind="instance.exited",
            subject="chat-0123abcd-bench",
            payload=PAYLOAD,
        )
        for _ in range(count)
    ]


def run_batches(chain: SqliteChain, events: int, batch: int) -> dict[str, Any]:
    """Append ``events`` events in transactions of ``batch``: events/s and ms per transaction."""
    per_txn = []
    start = time.perf_counter()
    for _ in range(max(events // batch, 1)):
        todo = drafts(batch)
        t = time.perf_counter()
        if batch == 1:
            chain.append(todo[0])
        else:
            chain.append_many(todo)
        per_txn.append((time.perf_counter() - t) * 1e3)
    wall = time.perf_counter() - start
    return {"events": len(per_txn) * batch, "events_s": len(per_txn) * batch / wall, "ms": per_txn}


def pragmas(chain: SqliteChain) -> str:
    """The writer connection's journal mode and synchronous level (private, for the record)."""
    conn = getattr(chain, "_conn", None)
    if conn is None:
        return "pragmas n/a"
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    level = conn.execute("PRAGMA synchronous").fetchone()[0]
    sync = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(level, str(level))
    return f"journal_mode={mode}, synchronous={sync}"


def one_round(root: Path, args: argparse.Namespace, number: int) -> dict[str, Any]:
    """A new chain: singles, batches of 10, batches of 100, then verification (best of N)."""
    path = root / f"chain{number}.db"
    with SqliteChain.open(path, "bench") as chain:
        if number == 0:
            print(f"file on {root} ({pragmas(chain)}), payload {len(PAYLOAD)} bytes")
        modes = {b: run_batches(chain, args.singles if b == 1 else args.events, b) for b in BATCHES}
    total = 1 + sum(int(m["events"]) for m in modes.values())
    best = float("inf")
    for _ in range(args.verify_runs):
        t = time.perf_counter()
        verdict = verify_chain(path)
        best = min(best, time.perf_counter() - t)
        if not verdict.ok:
            raise SystemExit(f"verify_chain found a problem: {verdict}")
    return {"modes": modes, "total": total, "verify_s": total / best}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--singles", type=int, default=500, help="events appended one by one")
    p.add_argument("--events", type=int, default=5000, help="events per batch size")
    p.add_argument("--rounds", type=int, default=3, help="repeats, each on a new chain file")
    p.add_argument("--verify-runs", type=int, default=3)
    args = p.parse_args()
    print(f"chain_append: {machine()}, {time.strftime('%Y-%m-%d %H:%M')}")
    with workdir("chain") as root:
        rounds = [one_round(root, args, i) for i in range(args.rounds)]
    report(rounds)


def report(rounds: list[dict[str, Any]]) -> None:
    rows = []
    for batch in BATCHES:
        runs = [r["modes"][batch] for r in rounds]
        rates = [m["events_s"] for m in runs]
        ms = [t for m in runs for t in m["ms"]]
        ratio = median([r["modes"][batch]["events_s"] / r["modes"][1]["events_s"] for r in rounds])
        rows.append(
            [
                "append" if batch == 1 else f"append_many({batch})",
                runs[0]["events"],
                median(rates),
                f"{min(rates):,.0f}-{max(rates):,.0f}",
                median(rates) / batch,
                median(ms),
                sum(ms) / len(ms),
                percentile(ms, 0.99),
                f"{ratio:.1f}x",
            ]
        )
    heads = ["mode", "events", "events/s", "range", "txn/s", "med ms", "mean ms", "p99 ms", "vs 1"]
    print(f"\nmedian of {len(rounds)} rounds (ms: per transaction, all rounds pooled)\n")
    print(table(heads, rows))
    verify = [r["verify_s"] for r in rounds]
    print(
        f"\nverify_chain: {rounds[0]['total']:,} events per chain; {median(verify):,.0f} events/s "
        f"(range {min(verify):,.0f}-{max(verify):,.0f})"
    )
    single = median([r["modes"][1]["events_s"] for r in rounds])
    hundred = median([r["modes"][100]["events_s"] for r in rounds])
    print(
        f"\nratios (this run, medians): append_many(100) / append = {hundred / single:.1f}x "
        f"events/s; verify / append = {median(verify) / single:.0f}x; "
        f"verify / append_many(100) = {median(verify) / hundred:.1f}x"
    )


if __name__ == "__main__":
    main()
