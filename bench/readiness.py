"""How soon the node records a starting server ready, once it answers (issue 21).

A request for a resting model waits for the node to record its server ready;
bench/front.py measures that through the whole front, where a real model's
load time varies by seconds under load. This isolates the node's part: an
adopted fake llama server (tests/programs/fake_llama.py) answers "loading",
the instance is started (``starting``), then the server's health file is
switched to ``ok`` and the time until ``status`` says ``running`` is taken,
``--rounds`` times (status polled every 2 ms). The node's health interval is
its default (1 s): before the probe engine's readiness cadence the wait was
up to a whole interval.

Run: ``python bench/readiness.py`` (about 20 s).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _harness import FAKE_LLAMA, bench_settings, fake_registry, servers, workdir

from infervisor.actors.node import Node
from infervisor.adapters.spec import Flavor, InstanceSpec, Mode


def one_round(node: Node, port: int, health: os.PathLike[str], i: int) -> float:
    """Seconds from the server answering ok to the node recording it running."""
    with open(health, "w") as f:
        f.write("loading")
    spec = InstanceSpec(role=f"r{i}", flavor=Flavor.LLAMACPP, mode=Mode.ADOPTED, port=port)
    iid = node.place(spec)
    assert node.start(iid).lifecycle == "starting"
    time.sleep(0.3)  # a few loading answers first
    with open(health, "w") as f:
        f.write("ok")
    t = time.perf_counter()
    while node.status(iid).lifecycle != "running":
        time.sleep(0.002)
    took = time.perf_counter() - t
    node.unload(iid)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    with workdir("readiness") as root, servers(FAKE_LLAMA, 1, root) as fleet:
        port = fleet[0][0]
        health = root / "server0" / "health"
        data = root / "node"
        data.mkdir()
        node = Node.open(bench_settings(data, fake_registry(data)))
        try:
            took = [one_round(node, port, health, i) * 1e3 for i in range(args.rounds)]
        finally:
            node.shutdown()
    load = os.getloadavg()[0]
    print(
        f"server answers ok -> recorded running ({args.rounds} rounds): median "
        f"{statistics.median(took):.0f} ms, min {min(took):.0f}, max {max(took):.0f} "
        f"(load {load:.1f})"
    )


if __name__ == "__main__":
    main()
