"""Hold the machine's load average near a target for a bounded time.

Run the test suite beside it to show the suite holds under load (README.md,
"Testing"; issue 20 asks that it pass at load average 10 on 2 cores):

    python bench/burn_cpu.py --seconds 900 &
    .venv/bin/pytest

The Linux load average is the exponentially smoothed count of runnable (and
uninterruptible) tasks, sampled every 5 s (proc(5), /proc/loadavg). So the
burner keeps the *instantaneous* count of runnable tasks near the target: once
a second it reads that count (the fourth field of /proc/loadavg), subtracts its
own busy workers, and starts or stops busy-loop workers so that the others plus
its workers make the target. What the rest of the machine runs (the test suite,
other users) is counted, so the burner adds only what is missing and adds
nothing when the machine is already above the target.

Bounded: it exits after ``--seconds`` (default 600), on SIGINT or SIGTERM, and
when the process that started it dies (its parent changes); every worker exits
when the burner does (each checks that its parent is alive). It never starts
more than ``--max-workers`` workers.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.context import ForkProcess
from pathlib import Path

LOADAVG = Path("/proc/loadavg")
FORK = mp.get_context("fork")
SMOOTHING = 5  # seconds of samples averaged before a worker is added or removed


def burn(parent: int, deadline: float) -> None:
    """Spin on one core until the burner (``parent``) is gone or ``deadline``
    (time.monotonic seconds) has passed."""
    # The burner stops its workers itself (SIGTERM); a Ctrl-C meant for it alone.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while os.getppid() == parent and time.monotonic() < deadline:
        for _ in range(200_000):  # about 5 to 20 ms of pure CPU between checks
            pass


def runnable_now() -> int:
    """Runnable tasks on the machine this instant (/proc/loadavg "R/T" field)."""
    return int(LOADAVG.read_text().split()[3].split("/")[0])


class Burner:
    """Busy workers, added and removed one decision at a time."""

    def __init__(self, deadline: float, max_workers: int) -> None:
        self.deadline = deadline
        self.max_workers = max_workers
        self.workers: list[ForkProcess] = []

    def resize(self, wanted: int) -> None:
        """Start or stop workers until ``wanted`` (bounded by max_workers) run."""
        self.workers = [w for w in self.workers if w.is_alive()]
        wanted = max(0, min(wanted, self.max_workers))
        while len(self.workers) < wanted:
            # fork: a worker's parent is the burner itself, whose death it watches.
            worker = FORK.Process(target=burn, args=(os.getpid(), self.deadline), daemon=True)
            worker.start()
            self.workers.append(worker)
        while len(self.workers) > wanted:
            self.workers.pop().terminate()

    def stop(self) -> None:
        """Stop every worker and reap it."""
        for worker in self.workers:
            worker.terminate()
        for worker in self.workers:
            worker.join(timeout=5)
        self.workers = []


def hold(target: float, seconds: float, max_workers: int, report: Callable[[str], None]) -> None:
    """Keep the runnable count near ``target`` for ``seconds`` (see module doc)."""
    parent = os.getppid()
    deadline = time.monotonic() + seconds
    burner = Burner(deadline, max_workers)
    others: deque[float] = deque(maxlen=SMOOTHING)
    last_report = 0.0
    try:
        while time.monotonic() < deadline and os.getppid() == parent:
            # Our workers are runnable all the time; this process is, reading the file.
            others.append(max(0, runnable_now() - len(burner.workers) - 1))
            burner.resize(round(target - sum(others) / len(others)))
            if time.monotonic() - last_report >= 30:
                last_report = time.monotonic()
                load1 = os.getloadavg()[0]
                report(f"burn_cpu: load1 {load1:.1f}, workers {len(burner.workers)}")
            time.sleep(1)
    finally:
        burner.stop()


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/burn_cpu.py",
        description=(
            "Hold the load average near TARGET by running busy-loop workers beside "
            "whatever else runs; exits after --seconds, on SIGINT/SIGTERM, or when "
            "its parent process dies."
        ),
    )
    parser.add_argument(
        "--target", type=float, default=10.0, help="load average to hold (default 10)"
    )
    parser.add_argument(
        "--seconds", type=float, default=600.0, help="stop after this many seconds (default 600)"
    )
    parser.add_argument(
        "--max-workers",
        type=int,
        default=None,
        help="never more busy workers than this (default: TARGET rounded up)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress line every 30 s")
    args = parser.parse_args(argv)
    if args.target < 0 or args.seconds <= 0:
        parser.error("--target must be 0 or more and --seconds more than 0")
    if args.max_workers is None:
        args.max_workers = int(-(-args.target // 1))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # SIGTERM ends the loop the way Ctrl-C does, so the workers are stopped and reaped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    report: Callable[[str], None] = (lambda _: None) if args.quiet else _stderr
    try:
        hold(args.target, args.seconds, args.max_workers, report)
    except KeyboardInterrupt:
        return 130
    return 0


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
