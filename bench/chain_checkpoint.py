"""Checkpoint cost: append rate with a signed checkpoint every 1,000 events vs without.

On new chain files (WAL, ``synchronous=FULL``) it appends ``--events``
events one per transaction, and 10 x ``--events`` in batches of each other
size in ``--batches`` (``append_many``: one transaction and fsync per
batch), either bare or followed, after each commit, by what the chain writer
does with checkpoints on: add the batch's hashes to the Merkle tree
(``Checkpointer.observe``) and, every ``--every`` events, sign an Ed25519
checkpoint and store it in its own transaction. The two modes alternate for
``--rounds`` rounds (A B A B ...), so disk noise hits both alike; the ratio
is of the medians, in one run.

Printed: events/s per mode (median and range), checkpoints written, and the
ratio with/without (target: >= 0.95, i.e. at most 5 % slower).

Run: ``python bench/chain_checkpoint.py [--events 3000] [--batches 1,100] [--rounds 4]`` (~2 min).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from _harness import machine, median, table, workdir
from chain_append import drafts  # the same realistic instance.exited rows

from infervisor.chain import SqliteChain
from infervisor.chain.checkpoint import load_or_create_signer
from infervisor.chain.checkpoint_store import Checkpointer, read_stored


def one(
    root: Path, name: str, args: argparse.Namespace, batch_size: int, *, checkpoints: bool
) -> dict[str, Any]:
    events = args.events * min(batch_size, 10)  # batch 1: --events; larger: 10x as many
    folder = root / name
    folder.mkdir()
    path = folder / "chain.db"
    with SqliteChain.open(path, "bench") as chain:
        cp = None
        if checkpoints:
            signer = load_or_create_signer(folder, "bench")
            cp = Checkpointer(path, "bench", signer, every_events=args.every, every_s=1e9)
        batches = [drafts(batch_size) for _ in range(events // batch_size)]
        spent = 0.0
        start = time.perf_counter()
        for batch in batches:
            stored = chain.append_many(batch)
            if cp is not None:
                t = time.perf_counter()
                cp.observe(stored)
                spent += time.perf_counter() - t
        wall = time.perf_counter() - start
        if cp is not None:
            cp.close()
    written = len(read_stored(path))
    return {
        "events_s": len(batches) * batch_size / wall,
        "checkpoints": written,
        "share": spent / wall,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=3000, help="events per run (x10 for batches)")
    p.add_argument("--batches", default="1,100", help="events per transaction, comma-separated")
    p.add_argument("--every", type=int, default=1000, help="events per checkpoint")
    p.add_argument("--rounds", type=int, default=4, help="runs per mode, alternating")
    args = p.parse_args()
    print(f"chain_checkpoint: {machine()}, {time.strftime('%Y-%m-%d %H:%M')}")
    sizes = [int(b) for b in args.batches.split(",")]
    runs: dict[tuple[int, bool], list[dict[str, Any]]] = {
        (b, m): [] for b in sizes for m in (False, True)
    }
    with workdir("checkpoint") as root:
        for n in range(args.rounds):
            for b in sizes:
                for mode in (n % 2 == 1, n % 2 == 0):  # alternate which goes first
                    name = f"r{n}-b{b}-{int(mode)}"
                    runs[b, mode].append(one(root, name, args, b, checkpoints=mode))
    rows = []
    notes = []
    for b in sizes:
        base = median([r["events_s"] for r in runs[b, False]])
        for mode in (False, True):
            rates = [r["events_s"] for r in runs[b, mode]]
            share = median([r["share"] for r in runs[b, mode]])
            rows.append(
                [
                    f"checkpoint every {args.every}" if mode else "no checkpoints",
                    b,
                    median(rates),
                    f"{min(rates):,.0f}-{max(rates):,.0f}",
                    runs[b, mode][0]["checkpoints"],
                    f"{share * 100:.2f} %" if mode else "-",
                    f"{median(rates) / base:.3f}",
                ]
            )
        ratio = median([r["events_s"] for r in runs[b, True]]) / base
        verdict = "met" if ratio >= 0.95 else "NOT met"
        notes.append(f"batch {b}: ratio {ratio:.3f}, target >= 0.95 {verdict}")
    print()
    heads = ["mode", "batch", "events/s", "range", "checkpoints", "ckpt work", "vs none"]
    print(table(heads, rows))
    print(
        "\nratio with/without checkpoints (medians, this run): " + "; ".join(notes) + ".\n"
        "ckpt work: share of the append wall time spent in Checkpointer.observe (Merkle "
        "tree, signing, storing), the part that does not depend on the disk's noise."
    )


if __name__ == "__main__":
    main()
