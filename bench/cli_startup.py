"""Start-up CPU of the command line: what each ``infervisor`` process costs
before it does its work, this checkout against another, side by side.

Three start-ups, each its own process, its CPU (user + system, from the
kernel's accounting of the process: ``wait4`` for a command, the node's own
counters for ``run``):

- ``infervisor --help``: the root help (every command's summary);
- ``infervisor status DIR`` against a node (this checkout's, no instance);
- ``infervisor status DIR`` against no node: a data directory that holds no
  chain (exit 3), the path a script polling for its node takes;
- ``infervisor run CONFIG`` to its first answer: a node with no instance,
  from its start until ``GET /v1/node`` on its socket answers (the node is
  then ended by SIGTERM, as an operator would).

With ``--before DIR`` (a checkout of another commit with its own
environment, ``DIR/.venv/bin/infervisor``) each sample runs both, in turns
(each pair takes the other first), so load drifting during the run weighs on
both alike; the ratio is this checkout's median over the other's. Only the
CPU of the process itself counts, not the waiting: a loaded machine
stretches the wall time, much less the CPU.

Run: ``python bench/cli_startup.py [--before DIR] [--samples 7] [--as-is]`` (about
80 s with ``--before``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
from _harness import machine, median, node_answers, reaped_children, table, workdir

HERE = Path(sys.executable).parent / "infervisor"
_ANSWER_DEADLINE_S = 60.0
_POLL_S = 0.02


def command_cpu(program: Path, args: list[str], cwd: Path) -> float:
    """CPU seconds (user + system) of one ``program args`` run to its exit."""
    child = subprocess.Popen(
        [str(program), *args], cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, _, usage = os.wait4(child.pid, 0)
    child.returncode = 0  # reaped by wait4: Popen must not wait again
    return usage.ru_utime + usage.ru_stime


def run_cpu(program: Path, root: Path) -> float:
    """CPU seconds of ``program run`` from its start to its first answer on its socket."""
    with running_node(program, root) as node:
        times = psutil.Process(node.pid).cpu_times()
        return times.user + times.system


@contextlib.contextmanager
def running_node(program: Path, root: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``program run`` on ``root/data`` (no instance), once it answers; SIGTERM at the end."""
    data = root / "data"
    config = root / "node.toml"
    config.write_text(f'[node]\nnode_id = "bench"\ndata_dir = "{data}"\n')
    node = subprocess.Popen(
        [str(program), "run", str(config)],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + _ANSWER_DEADLINE_S
        while not node_answers(data):
            if node.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{program} run: no answer (exit {node.returncode})")
            time.sleep(_POLL_S)
        yield node
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(timeout=_ANSWER_DEADLINE_S)


def sample(program: Path, which: str, root: Path) -> float:
    """One start-up's CPU seconds: ``which`` is help, status or run."""
    if which == "help":
        return command_cpu(program, ["--help"], root)
    if which == "status":
        (root / "empty").mkdir(exist_ok=True)
        return command_cpu(program, ["status", "empty"], root)
    if which == "status-node":
        return command_cpu(program, ["status", "node/data"], root)
    with workdir("startup-run") as fresh:
        return run_cpu(program, fresh)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="another checkout with its own .venv")
    parser.add_argument("--samples", type=int, default=7, help="runs of each, per checkout")
    parser.add_argument(
        "--as-is",
        action="store_true",
        help="do not compile the bytecode first (measure the environments as they are)",
    )
    args = parser.parse_args()
    programs: dict[str, Path] = {"this": HERE}
    if args.before is not None:
        programs["before"] = args.before / ".venv" / "bin" / "infervisor"
    for program in programs.values() if not args.as_is else ():
        _compile(program)
    print(f"# {machine()}")
    rows: list[list[object]] = []
    with reaped_children(), workdir("startup") as root:
        (root / "node").mkdir()
        with running_node(HERE, root / "node"):
            rows += _rows(
                programs, args.samples, root, [("status-node", "infervisor status (a node)")]
            )
        rows += _rows(programs, args.samples, root, _STARTS)
    headers = ["start-up", "CPU ms (median)"]
    if args.before is not None:
        headers += ["before ms", "ratio"]
    print(table(headers, rows))


_STARTS = [
    ("help", "infervisor --help"),
    ("status", "infervisor status (no node)"),
    ("run", "infervisor run, to its first answer"),
]


def _rows(
    programs: dict[str, Path], samples: int, root: Path, which: list[tuple[str, str]]
) -> list[list[object]]:
    """One table row per start-up: this checkout's median, the other's and the ratio."""
    rows: list[list[object]] = []
    for one, label in which:
        cpu = _alternating(programs, lambda p, w=one: sample(p, w, root), samples)
        row: list[object] = [label, median(cpu["this"]) * 1e3]
        if "before" in cpu:
            before = median(cpu["before"]) * 1e3
            row += [before, median(cpu["this"]) * 1e3 / before]
        rows.append(row)
    return rows


def _compile(program: Path) -> None:
    """Write the package's bytecode in ``program``'s environment first, as a wheel's
    install does (an editable install under PYTHONDONTWRITEBYTECODE has none, and
    each start would compile every module again: tests/conftest.py)."""
    code = (
        "import compileall, importlib\n"
        "for p in ('actors', 'adapters', 'chain', 'replay', 'tools'):\n"
        "    for d in importlib.import_module('infervisor.' + p).__path__:\n"
        "        compileall.compile_dir(d, quiet=1)\n"
    )
    subprocess.run([str(program.parent / "python"), "-c", code], check=True)


def _alternating(
    programs: dict[str, Path], one: Callable[[Path], float], samples: int
) -> dict[str, list[float]]:
    """``samples`` runs of each program, in turns (each pair starts with the other one)."""
    cpu: dict[str, list[float]] = {name: [] for name in programs}
    names = list(programs)
    for i in range(samples):
        for name in names[i % 2 :] + names[: i % 2]:
            cpu[name].append(one(programs[name]))
    return cpu


if __name__ == "__main__":
    main()
