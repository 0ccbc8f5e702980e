"""The auditor's commands as processes, beside the bare loop as a process (issue 22, item 3).

Each figure is the CPU (user + system, the kernel's accounting of the process:
``wait4``) of one whole process, start-up included, so outside load weighs on
each side alike; the rounds interleave the commands and each figure is the
best of its rounds:

- **bare loop**: ``python bench/_bare_verify.py CHAIN`` (sqlite3 and blake3 only:
  read the rows, two BLAKE3 calls, the link check), the reference;
- **chain verify**: ``infervisor chain verify CHAIN``; its speed is the bare
  loop's CPU over its own (target >= 0.9);
- **replay**: ``infervisor replay CHAIN`` (verify and replay in one pass); its
  rate is the chain's events over its CPU (target >= 200,000 events/s), and its
  time beside the bare loop's;
- **start-up**: ``infervisor chain verify`` of a chain of 50 events and
  ``infervisor status`` of a data directory with no node and no chain (exit 3),
  the median of ``--samples`` (target <= 0.15 s), beside the floor every
  ``infervisor`` process pays: ``python -c "import click, msgspec, sqlite3, blake3"``.

The chain is bench/chain_audit.py's (``--events`` events, 20 instances,
supervision cycles). ``bench/summary.py`` calls :func:`audit_rows`.

With ``--before DIR`` (another checkout with its own ``.venv``), its
``infervisor`` runs the same commands in the same rounds, in turns with this
one's, and a second table puts both side by side.

Run: ``python bench/cli_audit.py [--events 200000] [--rounds 3] [--before DIR]`` (~2 min;
twice that with ``--before``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _harness import machine, table, workdir
from chain_audit import build

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
INFERVISOR = BIN / "infervisor"
FLOOR = "import click, msgspec, sqlite3, blake3"


def cpu_s(argv: list[str], cwd: Path) -> float:
    """CPU seconds (user + system) of one process ``argv`` run to its exit."""
    child = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped: Popen must not wait again
    return usage.ru_utime + usage.ru_stime


def measure(
    root: Path, events: int, rounds: int, samples: int, before: Path | None = None
) -> dict[str, float]:
    """Best CPU seconds of each process over interleaved rounds (start-ups: medians);
    with `before` (another checkout's ``infervisor``), its runs too, named ``before-*``."""
    chain, small, empty = root / "chain.db", root / "small.db", root / "empty"
    total = build(chain, events, 20)
    build(small, 50, 2)
    empty.mkdir()
    tools = {"": INFERVISOR} if before is None else {"": INFERVISOR, "before-": before}
    runs = {"bare": [str(BIN / "python"), str(HERE / "_bare_verify.py"), str(chain)]}
    for tag, tool in tools.items():
        runs[f"{tag}verify"] = [str(tool), "chain", "verify", str(chain)]
        runs[f"{tag}replay"] = [str(tool), "replay", str(chain)]
    best = dict.fromkeys(runs, float("inf"))
    for i in range(rounds):
        order = list(runs)[i % len(runs) :] + list(runs)[: i % len(runs)]
        for name in order:
            best[name] = min(best[name], cpu_s(runs[name], root))
    starts = {"floor": [str(BIN / "python"), "-c", FLOOR]}
    for tag, tool in tools.items():
        starts[f"{tag}verify-start"] = [str(tool), "chain", "verify", str(small)]
        starts[f"{tag}status-start"] = [str(tool), "status", str(empty)]
    seen: dict[str, list[float]] = {name: [] for name in starts}
    for _ in range(samples):
        for name, argv in starts.items():
            seen[name].append(cpu_s(argv, root))
    return {
        **best,
        **{name: statistics.median(values) for name, values in seen.items()},
        "events": float(total),
    }


def audit_rows(
    root: Path, *, events: int = 200_000, rounds: int = 3, samples: int = 7
) -> list[tuple[str, str, str, bool]]:
    """The figures as (figure, measured with its reference, target, met) rows."""
    return rows_of(measure(root, events, rounds, samples))


def rows_of(m: dict[str, float]) -> list[tuple[str, str, str, bool]]:
    """`audit_rows` of figures `measure` took."""
    n = int(m["events"])
    speed = m["bare"] / m["verify"]
    rate = n / m["replay"]
    floor = m["floor"] * 1e3
    return [
        (
            f"chain verify, {n:,} events (CPU, start-up included)",
            f"{m['verify']:.2f} s = {speed:.2f}x the bare loop's speed ({m['bare']:.2f} s)",
            ">= 0.9x the bare loop",
            speed >= 0.9,
        ),
        (
            f"replay, {n:,} events (CPU, start-up included)",
            f"{rate:,.0f} events/s, {m['replay'] / m['bare']:.2f}x the bare loop's time",
            ">= 200,000 events/s",
            rate >= 200_000,
        ),
        (
            "start-up: chain verify (50 events)",
            f"{m['verify-start'] * 1e3:.0f} ms (floor: {floor:.0f} ms to import click, msgspec)",
            "<= 150 ms",
            m["verify-start"] <= 0.15,
        ),
        (
            "start-up: status, no node",
            f"{m['status-start'] * 1e3:.0f} ms (floor: {floor:.0f} ms)",
            "<= 150 ms",
            m["status-start"] <= 0.15,
        ),
    ]


def side_by_side(m: dict[str, float]) -> str:
    """The table of this checkout's processes beside `--before`'s, from one run."""
    n, bare = m["events"], m["bare"]
    lines = []
    for name, what in (
        ("verify", "chain verify (CPU s, speed vs bare)"),
        ("replay", "replay (CPU s, events/s)"),
    ):
        cells = [
            f"{m[k]:.2f} s = "
            + (f"{bare / m[k]:.2f}x" if name == "verify" else f"{n / m[k]:,.0f}/s")
            for k in (f"before-{name}", name)
        ]
        lines.append([what, *cells, f"bare loop {bare:.2f} s"])
    for name, what in (
        ("verify-start", "chain verify, 50 events"),
        ("status-start", "status, no node"),
    ):
        lines.append(
            [
                what,
                f"{m[f'before-{name}'] * 1e3:.0f} ms",
                f"{m[name] * 1e3:.0f} ms",
                f"floor {m['floor'] * 1e3:.0f} ms",
            ]
        )
    return table(["process", "before", "this checkout", "reference"], lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--samples", type=int, default=7, help="start-ups measured, each")
    p.add_argument("--before", type=Path, help="another checkout with its own .venv")
    args = p.parse_args()
    print(f"cli_audit: {machine()}, {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    before = None if args.before is None else args.before / ".venv" / "bin" / "infervisor"
    with workdir("cli-audit") as root:
        m = measure(root, args.events, args.rounds, args.samples, before)
    rows = rows_of(m)
    print(
        table(
            ["figure", "measured (reference in this run)", "target", "met"],
            [[f, v, t, "yes" if ok else "NO"] for f, v, t, ok in rows],
        )
    )
    if before is not None:
        print(f"\nbeside {args.before} (same rounds, in turns):\n{side_by_side(m)}")
    load = os.getloadavg()
    print(f"\nload average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")


if __name__ == "__main__":
    main()
