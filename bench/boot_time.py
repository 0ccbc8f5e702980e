"""Node boot until it supervises: an empty data dir beside a long chain, in one run.

Builds, once per length in ``--events`` (default 20,000 and 200,000), a data
dir whose chain holds that many events (chain_audit.py's realistic supervision
cycles of ``--instances`` instances, each unloaded at the end, so the booted
node has the same nothing to supervise as an empty one), with its node key and
a signed checkpoint (with its frontier), as a node that ran that long leaves
it. Then, in ``--rounds`` interleaved rounds, times ``Node.open`` (until it
returns: the chain checked, the state rebuilt, ``node.started`` durable, the
actors supervising) on:

- **empty**: a new data dir (the chain created, its genesis, the node key);
- **long chain, no snapshot**: a copy of the long chain's data dir without
  ``state.snapshot`` (a first boot after an upgrade, or a snapshot ignored):
  the whole chain replayed;
- **long chain, snapshot**: a copy with the snapshot the last shutdown left:
  only what follows it replayed.

Each boot is followed by a shutdown (not timed). Printed: the median seconds
of each and the ratios to the empty boot of the same rounds (target: every
snapshot boot at most 1.3x the empty one, flat as the chain grows).

Run: ``python bench/boot_time.py [--events 20000,200000] [--rounds 5]`` (~3-5
min: building the chains and the boots without a snapshot take most of it).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from _harness import machine, table, workdir
from chain_audit import build

from infervisor.actors.clock import RealClock
from infervisor.actors.node import Node
from infervisor.actors.settings import NodeSettings
from infervisor.chain import EventDraft, SqliteChain
from infervisor.chain.checkpoint import load_or_create_signer
from infervisor.chain.checkpoint_store import Checkpointer
from infervisor.replay import events as ev
from infervisor.replay import kind_of
from infervisor.replay.snapshot import SNAPSHOT_FILE

NODE = "bench"


def long_data_dir(data: Path, events: int, instances: int) -> int:
    """A data dir of node "bench" whose chain holds `events` events, every instance
    unloaded at its end, signed up to its head; returns the chain's size."""
    data.mkdir(parents=True)
    chain_path = data / "chain.db"
    build(chain_path, events, instances)
    with SqliteChain.open(chain_path, NODE) as chain:
        unload = ev.Unloaded(by="bench")
        payload = ev.encode_event(unload)
        ids = [f"chat-{i:08x}-bench" for i in range(instances)]  # chain_audit.build's names
        chain.append_many(
            [
                EventDraft(
                    ts_ns=time.time_ns(),
                    source="operator",
                    kind=kind_of(unload),
                    subject=iid,
                    payload=payload,
                )
                for iid in ids
            ]
        )
        size = chain.head().seq + 1
    signer = load_or_create_signer(data, NODE)
    Checkpointer(chain_path, NODE, signer).close()
    return size


def settings_on(data: Path) -> NodeSettings:
    return NodeSettings(node_id=NODE, data_dir=str(data), registry_dir=str(data / "models"))


def boot(data: Path) -> float:
    """Seconds `Node.open` took on `data` (then shut down, not timed)."""
    settings = settings_on(data)
    start = time.perf_counter()
    node = Node.open(settings, RealClock())
    took = time.perf_counter() - start
    node.shutdown()
    return took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", default="20000,200000", help="chain lengths, comma-separated")
    p.add_argument("--instances", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    lengths = [int(n) for n in args.events.split(",")]
    print(f"boot_time: {machine()}, {time.strftime('%Y-%m-%d %H:%M')}")
    with workdir("boot") as root:
        times = measure(root, lengths, args.instances, args.rounds, say=print)
    empty = statistics.median(times["empty"])
    rows = [
        (what, statistics.median(t), f"{statistics.median(t) / empty:.2f}x")
        for what, t in times.items()
    ]
    print(table(["boot until supervising", "median s", "/ empty"], rows))
    worst = max(statistics.median(t) for what, t in times.items() if what.endswith(", snapshot"))
    met = "met" if worst <= 1.3 * empty else "NOT met"
    print(f"target: a snapshot boot at most 1.3x the empty one: {worst / empty:.2f}x, {met}")


def measure(
    root: Path,
    lengths: list[int],
    instances: int,
    rounds: int,
    say: Callable[[str], None] = lambda _: None,
) -> dict[str, list[float]]:
    """Seconds of each boot, ``rounds`` in turns, by what was booted: ``empty``,
    ``N events, no snapshot`` and ``N events, snapshot`` per chain length (N: the
    chain's size, formatted with thousands separators); data dirs under ``root``."""
    makers: dict[str, Callable[[], Path]] = {"empty": _fresh(root, "empty", None, keep=False)}
    for n in lengths:
        master = root / f"long-{n}"
        began = time.perf_counter()
        size = long_data_dir(master, n, instances)
        boot(master)  # as a node that ran leaves it: with the snapshot its shutdown wrote
        say(f"built a {size:,}-event chain in {time.perf_counter() - began:.1f} s")
        makers[f"{size:,} events, no snapshot"] = _fresh(root, f"no-{n}", master, keep=False)
        makers[f"{size:,} events, snapshot"] = _fresh(root, f"snap-{n}", master, keep=True)
    times: dict[str, list[float]] = {what: [] for what in makers}
    for _ in range(rounds):
        for what, make in makers.items():
            times[what].append(boot(make()))
    return times


def _fresh(root: Path, name: str, master: Path | None, *, keep: bool) -> Callable[[], Path]:
    """A maker of a new data dir `name`: empty, or a copy of `master` (with its
    snapshot when `keep`)."""

    def make() -> Path:
        target = root / name
        shutil.rmtree(target, ignore_errors=True)
        if master is None:
            return target
        shutil.copytree(master, target)
        if not keep:
            (target / SNAPSHOT_FILE).unlink()
        return target

    return make


if __name__ == "__main__":
    main()
