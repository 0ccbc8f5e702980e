"""The reconcile tick's reads of the machine: psutil's paths against the kernel's, side by side.

What one reconcile tick gathers about sockets for a node of ``--instances``
instances (each on a loopback port, as managed servers are): one
:class:`~infervisor.adapters.ports.ListenerSnapshot`, then every instance's
question ``snapshot.beyond_loopback(its port)``.

- **psutil** (the path before issue 20's suite work, kept as the fallback where
  ``/proc/net`` cannot be read): ``psutil.net_connections("tcp")``, which maps
  every socket to its owner by reading every process's file descriptors.
- **/proc/net** (the kernel path's own fallback): ``/proc/net/tcp`` and
  ``tcp6`` read directly for LISTEN sockets beyond loopback; owners looked up
  only for a port asked about that has one.
- **netlink** (what the node uses): the same, the LISTEN sockets asked of
  the kernel over ``sock_diag``.

The three run in turns (rotating which goes first) in one process, so the
machine's load drifting during the run weighs on all alike. Measured is the
CPU of this process (``time.process_time``: user + system) per tick, the
median over ``--rounds`` rounds of ``--ticks`` ticks; printed with the ratios
psutil / each. With ``--wide`` one instance's port also has a listener beyond
loopback (so the kernel paths look up that one owner every tick: the rare case).

Then the tick's other read of the machine, the process table, the same way:
psutil's ``process_iter`` (the fallback) against ``/proc/PID/stat`` and
``statm`` read directly (:func:`~infervisor.adapters.proc.table.read_proc_table`).

With ``--idle S``: then an idle in-process node (no instance; the test
suite's intervals, health 0.2 s and reconcile 0.5 s), its process's CPU over
``S`` seconds per round, with the supervisor's two reads switched between the
psutil paths and the kernel paths in turns, 3 rounds each.

Run: ``python bench/socket_table.py [--instances 50] [--rounds 7] [--ticks 20] [--wide]``
(a few seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

from _harness import bench_settings, fake_registry, machine, median, open_node, table, workdir

from infervisor.actors import supervisor
from infervisor.adapters import ports, procnet
from infervisor.adapters.ports import ListenerSnapshot
from infervisor.adapters.proc import system
from infervisor.adapters.proc.table import ProcessTable, read_proc_table


@contextlib.contextmanager
def listeners(count: int, wide: bool) -> Iterator[list[int]]:
    """``count`` loopback listeners (the instances' servers); with ``wide``, the
    first port also listened on 0.0.0.0 (SO_REUSEPORT). Yields their ports."""
    with contextlib.ExitStack() as stack:
        found: list[int] = []
        for i in range(count):
            s = stack.enter_context(socket.socket())
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(("127.0.0.1", 0))
            s.listen()
            found.append(s.getsockname()[1])
            if wide and i == 0:
                w = stack.enter_context(socket.socket())
                w.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                w.bind(("0.0.0.0", found[0]))
                w.listen()
        yield found


def tick_cpu(snapshot: Callable[[], ListenerSnapshot], ports_asked: list[int], ticks: int) -> float:
    """CPU seconds per tick: one snapshot, then every instance's question."""
    start = time.process_time()
    for _ in range(ticks):
        taken = snapshot()
        for port in ports_asked:
            taken.beyond_loopback(port)
    return (time.process_time() - start) / ticks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--instances", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--wide", action="store_true")
    parser.add_argument("--idle", type=float, default=0.0, help="seconds per idle-node round")
    args = parser.parse_args()

    paths: dict[str, Callable[[], ListenerSnapshot]] = {
        "psutil.net_connections": lambda: ports._psutil_snapshot(""),
        "/proc/net": lambda: ports._snapshot("", procnet.read_proc_net),
        "netlink sock_diag": lambda: ports._snapshot("", procnet.read_sock_diag),
    }
    names = list(paths)
    with listeners(args.instances, args.wide) as asked:
        answers = [{p: take().beyond_loopback(p) for p in asked} for take in paths.values()]
        assert all(a == answers[0] for a in answers), answers  # the same answers, every way
        assert not paths["netlink sock_diag"]().by_port, "the kernel's table is unreadable here"
        samples: dict[str, list[float]] = {name: [] for name in names}
        for i in range(args.rounds):
            for name in names[i % 3 :] + names[: i % 3]:
                samples[name].append(tick_cpu(paths[name], asked, args.ticks))
    print(machine())
    print(
        f"socket table of one reconcile tick, {args.instances} instances"
        f"{', one with a wide listener' if args.wide else ''};"
        f" median of {args.rounds} rounds x {args.ticks} ticks, CPU of this process:"
    )
    rows = []
    for name in names:
        ratio = median([a / b for a, b in zip(samples[names[0]], samples[name], strict=True)])
        rows.append([name, f"{median(samples[name]) * 1e3:.3f}", f"{ratio:.1f}x"])
    print(table(["path", "ms CPU per tick", "psutil / this (median of rounds)"], rows))

    reads = {"psutil.process_iter": system._psutil_table, "/proc/PID/stat+statm": read_proc_table}
    cpu: dict[str, list[float]] = {name: [] for name in reads}
    for i in range(args.rounds):
        for name, read in list(reads.items())[:: 1 if i % 2 == 0 else -1]:
            start = time.process_time()
            for _ in range(args.ticks):
                read()
            cpu[name].append((time.process_time() - start) / args.ticks)
    print(f"\nprocess table of one reconcile tick ({len(read_proc_table().entries)} processes):")
    first = next(iter(reads))
    rows = [
        [
            name,
            f"{median(cpu[name]) * 1e3:.3f}",
            f"{median([a / b for a, b in zip(cpu[first], cpu[name], strict=True)]):.1f}x",
        ]
        for name in reads
    ]
    print(table(["path", "ms CPU per tick", "psutil / this (median of rounds)"], rows))
    if args.idle > 0:
        idle_node(args.idle)


def idle_node(seconds: float) -> None:
    """An idle node's CPU (% of a core) with the psutil reads, then the kernel's, in turns."""
    kernel = (supervisor.listener_snapshot, system.RealSystem.table)

    def psutil_table(_: system.RealSystem) -> ProcessTable:
        return system._psutil_table()

    paths: dict[str, tuple[Callable[[], ListenerSnapshot], Any]] = {
        "psutil": (lambda: ports._psutil_snapshot(""), psutil_table),
        "kernel": kernel,
    }
    cpu: dict[str, list[float]] = {name: [] for name in paths}
    with workdir("idle-node") as root:
        settings = bench_settings(
            root, fake_registry(root), health_interval_s=0.2, reconcile_interval_s=0.5
        )
        with open_node(settings):
            try:
                for i in range(6):
                    name = list(paths)[i % 2]
                    supervisor.listener_snapshot, system.RealSystem.table = paths[name]
                    time.sleep(1.0)  # the tick under way finishes with the old reads
                    start, wall = time.process_time(), time.monotonic()
                    time.sleep(seconds)
                    cpu[name].append((time.process_time() - start) / (time.monotonic() - wall))
            finally:
                supervisor.listener_snapshot, system.RealSystem.table = kernel
    old, new = median(cpu["psutil"]), median(cpu["kernel"])
    print(f"\nidle node (no instance, reconcile every 0.5 s), {seconds:g} s x 3 rounds each:")
    print(f"{machine()}")
    print(
        f"CPU of its process: psutil reads {old * 100:.2f} %, kernel reads {new * 100:.2f} %"
        f" of a core; ratio {old / new:.1f}x"
    )


if __name__ == "__main__":
    main()
