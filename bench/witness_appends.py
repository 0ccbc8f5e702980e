"""Appends per second with two witnesses against none (issue 18; target: within 5 %).

Two real ``infervisor witness run`` processes on loopback witness chain W;
chain N has none. Both chains are written the way ``infervisor run`` writes
its chain: a ``ChainWriter`` actor, one durable ``Append`` per event (an
``ask``, as a decision's events), a signed checkpoint every ``--every``
events. W's writer hands each checkpoint to ``Witnessing`` (one submitter
actor per witness, on its own thread: tell, then an HTTP add-checkpoint with
the consistency proof, the cosignature stored in chain.db), wired as the node
wires it. The node's default is a checkpoint every 1,000 events; the default
here runs both: 1,000, then 10 (100 times as many submissions).

Blocks of ``--events`` appends alternate W, N, W, N, ... (``--blocks`` of
each), so both modes share the machine's moment. After each block the script
waits, untimed, until both witnesses cosigned W's latest checkpoint (the
"drain" column: how far behind they were when the block ended), so no
submission spills into the next block.

Printed, per checkpoint interval: appends/s per mode (median and range over
the blocks), the ratio W / N of each adjacent pair of blocks (median and
range), the drain, and the CPU the bench's process and the two witness
processes used per W block and per N block: on one machine the witnesses take
their CPU and fsyncs from the node's, which a remote witness would not.

Run: ``python bench/witness_appends.py [--events 1000] [--blocks 6] [--every 1000,10]`` (~1 min).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
from _harness import free_port, machine, median, reaped_children, table, workdir

from infervisor.actors.chain_writer import ChainWriter
from infervisor.actors.clock import RealClock
from infervisor.actors.messages import Append
from infervisor.actors.witness_submit import WitnessTarget
from infervisor.actors.witnessing import Witnessing
from infervisor.chain import EventDraft, encode_payload
from infervisor.chain.checkpoint import load_or_create_signer
from infervisor.chain.cosignature import parse_witness_key

INFERVISOR = Path(sys.executable).parent / "infervisor"
DEADLINE_S = 60.0
PAYLOAD = encode_payload(
    {
        "pid": 123456,
        "exit_code": None,
        "signal": 9,
        "reason": "exited on its own: signal 9 (SIGKILL)",
        "output_tail": "main: server is listening on http://127.0.0.1:8080\n",
    }
)


def draft() -> EventDraft:
    return EventDraft(
        ts_ns=time.time_ns(),
        source="supervisor",
        kind="instance.exited",
        subject="chat-0123abcd-bench",
        payload=PAYLOAD,
    )


@contextmanager
def witness(
    folder: Path, name: str, origin: str, log_vkey: str
) -> Iterator[tuple[WitnessTarget, psutil.Process]]:
    """An ``infervisor witness run`` of one log on a free loopback port, until the block ends."""
    folder.mkdir()
    config = folder / "witness.toml"
    config.write_text(
        f'[witness]\nname = "{name}"\nlisten = "127.0.0.1:1"\ndata_dir = "wdata"\n\n'
        f'[[logs]]\norigin = "{origin}"\nvkey = "{log_vkey}"\n'
    )
    port = free_port()
    with (folder / "witness.err").open("w") as err:
        proc = subprocess.Popen(
            [str(INFERVISOR), "witness", "run", str(config), "--listen", f"127.0.0.1:{port}"],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening on" not in line:
            raise SystemExit(f"the witness did not start: {(folder / 'witness.err').read_text()}")
        key = parse_witness_key((folder / "wdata" / "witness.vkey").read_text().strip())
        yield WitnessTarget(f"http://127.0.0.1:{port}", key), psutil.Process(proc.pid)
    finally:
        proc.terminate()
        proc.wait(DEADLINE_S)
        if proc.stdout is not None:
            proc.stdout.close()


def append_block(writer: Any, events: int) -> float:
    """``events`` single durable appends through the writer actor: appends/s."""
    start = time.perf_counter()
    for _ in range(events):
        writer.ask(Append(drafts=[draft()]), timeout=DEADLINE_S)
    return events / (time.perf_counter() - start)


def drain(witnessing: Witnessing) -> float:
    """Seconds until every witness cosigned the latest checkpoint the writer handed over."""
    start = time.perf_counter()
    while any(row.behind_events for row in witnessing.board.rows()):
        if time.perf_counter() - start > DEADLINE_S:
            raise SystemExit(f"the witnesses did not catch up: {witnessing.board.rows()}")
        time.sleep(0.005)  # a bench polling a counter: not synchronisation of a test
    return time.perf_counter() - start


def cpu_s(procs: list[psutil.Process]) -> float:
    """User + system CPU seconds of ``procs`` so far."""
    return sum(sum(p.cpu_times()[:2]) for p in procs)


def timed_block(
    writer: Any, events: int, procs: list[psutil.Process]
) -> tuple[float, float, float]:
    """(appends/s, this process's CPU s, the witnesses' CPU s) of one block."""
    me = psutil.Process()
    mine, theirs = cpu_s([me]), cpu_s(procs)
    rate = append_block(writer, events)
    return rate, cpu_s([me]) - mine, cpu_s(procs) - theirs


def run(root: Path, args: argparse.Namespace, every: int) -> dict[str, Any]:
    origin = f"bench.example/witnessed-{every}"
    folder = root / f"every-{every}"
    for sub in ("w", "n"):
        (folder / sub).mkdir(parents=True)
    signer = load_or_create_signer(folder / "w", "bench", origin=origin)
    log_vkey = signer.verifier.key_string()
    with (
        witness(folder / "w1", "bench.example/w1", origin, log_vkey) as (w1, p1),
        witness(folder / "w2", "bench.example/w2", origin, log_vkey) as (w2, p2),
    ):
        procs = [p1, p2]
        witnessing = Witnessing([w1, w2], folder / "w" / "chain.db", RealClock())
        witnessed = ChainWriter.start(
            folder / "w" / "chain.db",
            "bench",
            checkpoint_every_events=every,
            on_checkpoint=witnessing.offer,
        )
        bare = ChainWriter.start(folder / "n" / "chain.db", "bench", checkpoint_every_events=every)
        try:
            append_block(witnessed, args.events // 5)  # warm-up: connections, caches
            append_block(bare, args.events // 5)
            drain(witnessing)
            w_runs, n_runs, drains = [], [], []
            for _ in range(args.blocks):
                w_runs.append(timed_block(witnessed, args.events, procs))
                drains.append(drain(witnessing))
                n_runs.append(timed_block(bare, args.events, procs))
            cosigned = [row.cosigned_size for row in witnessing.board.rows()]
        finally:
            witnessed.stop()
            bare.stop()
            witnessing.stop()
    return {"every": every, "w": w_runs, "n": n_runs, "drains": drains, "cosigned": cosigned}


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    rows, summary = [], []
    for result in results:
        w, n, drains = result["w"], result["n"], result["drains"]
        ratios = [a[0] / b[0] for a, b in zip(w, n, strict=True)]
        for name, runs in (("none", n), ("two witnesses", w)):
            rates = [r[0] for r in runs]
            witnessed = runs is w
            rows.append(
                [
                    f"{result['every']:,}",
                    name,
                    median(rates),
                    f"{min(rates):,.0f}-{max(rates):,.0f}",
                    f"{median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f})"
                    if witnessed
                    else "",
                    f"{median(drains) * 1e3:.0f} ms (max {max(drains) * 1e3:.0f})"
                    if witnessed
                    else "",
                    f"{median([r[1] for r in runs]):.2f}",
                    f"{median([r[2] for r in runs]):.2f}",
                ]
            )
        slower = (1 - median(ratios)) * 100
        summary.append(
            f"a checkpoint every {result['every']:,} events: two witnesses / none = "
            f"{median(ratios):.3f} ({slower:+.1f} % slower; target within 5 %); cosigned up to "
            f"size {max(result['cosigned']):,}"
        )
    heads = [
        "every",
        "mode",
        "appends/s",
        "range",
        "vs none (pairs)",
        "drain after a block",
        "bench CPU s",
        "witnesses CPU s",
    ]
    print(f"\n{args.blocks} blocks of {args.events:,} single appends per mode, alternating\n")
    print(table(heads, rows))
    print("\nratios (this run, median of the pairs):")
    for line in summary:
        print(f"  {line}")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=1000, help="appends per block")
    p.add_argument("--blocks", type=int, default=6, help="blocks per mode, alternating")
    p.add_argument(
        "--every",
        default="1000,10",
        help="checkpoint intervals to run, in events, comma-separated (the node's default: 1000)",
    )
    args = p.parse_args()
    print(f"witness_appends: {machine()}, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"load average at the start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    with reaped_children(), workdir("witness") as root:
        results = [run(root, args, int(every)) for every in args.every.split(",")]
    report(results, args)


if __name__ == "__main__":
    main()
