"""The reconcile tick's socket-table read: psutil's path against /proc/net, side by side.

What one reconcile tick gathers about sockets for a node of ``--instances``
instances (each on a loopback port, as managed servers are): one
:class:`~infervisor.adapters.ports.ListenerSnapshot`, then every instance's
question ``snapshot.beyond_loopback(its port)``.

- **psutil** (the path before issue 20's suite work, kept as the fallback where
  ``/proc/net`` cannot be read): ``psutil.net_connections("tcp")``, which maps
  every socket to its owner by reading every process's file descriptors.
- **/proc/net**: ``/proc/net/tcp`` and ``tcp6`` read directly for LISTEN
  sockets beyond loopback; owners looked up only for a port asked about that
  has one.

The two run in turns (A B A B ...) in one process, so the machine's load
drifting during the run weighs on both alike. Measured is the CPU of this
process (``time.process_time``: user + system) per tick, the median over
``--rounds`` rounds of ``--ticks`` ticks; printed with the ratio psutil / /proc/net.
With ``--wide`` one instance's port also has a listener beyond loopback (so
the /proc/net path looks up that one owner every tick: the rare case).

Run: ``python bench/socket_table.py [--instances 50] [--rounds 7] [--ticks 20] [--wide]``
(a few seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import time
from collections.abc import Callable, Iterator

from _harness import machine, median, table

from infervisor.adapters import ports
from infervisor.adapters.ports import ListenerSnapshot


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
    args = parser.parse_args()

    def old() -> ListenerSnapshot:
        return ports._psutil_snapshot("")

    new = ports.listener_snapshot
    with listeners(args.instances, args.wide) as asked:
        assert not new().by_port, "/proc/net cannot be read here: nothing to compare"
        wide_new = {p: new().beyond_loopback(p) for p in asked}
        wide_old = {p: old().beyond_loopback(p) for p in asked}
        assert wide_new == wide_old, (wide_new, wide_old)  # the same answers, both ways
        samples: dict[str, list[float]] = {"psutil": [], "/proc/net": []}
        for i in range(args.rounds):
            pair = [("psutil", old), ("/proc/net", new)]
            for name, fn in pair if i % 2 == 0 else reversed(pair):
                samples[name].append(tick_cpu(fn, asked, args.ticks))
    psutil_s, procnet_s = median(samples["psutil"]), median(samples["/proc/net"])
    ratios = [a / b for a, b in zip(samples["psutil"], samples["/proc/net"], strict=True)]
    print(machine())
    print(
        f"socket table of one reconcile tick, {args.instances} instances"
        f"{', one with a wide listener' if args.wide else ''};"
        f" median of {args.rounds} rounds x {args.ticks} ticks, CPU of this process:"
    )
    print(
        table(
            ["path", "ms CPU per tick"],
            [
                ["psutil.net_connections", f"{psutil_s * 1e3:.2f}"],
                ["/proc/net", f"{procnet_s * 1e3:.3f}"],
            ],
        )
    )
    print(
        f"\nratio (this run, median of per-round ratios): psutil / /proc/net = "
        f"{median(ratios):.1f}x"
    )


if __name__ == "__main__":
    main()
