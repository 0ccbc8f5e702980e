"""Verb latency: ``node.status`` of a healthy instance while another one's unload hangs.

One node (in this process) manages a healthy fake llama server B
(tests/programs/fake_llama.py). First B's ``status`` is timed with nothing
else going on (idle). Then, for each round, a second instance A is placed
on a server that ignores SIGTERM (tests/programs/fault_ignore_term.py, so
its unload lasts the 5 s unload grace until SIGKILL), started, and
unloaded on a thread; once A's SIGTERM is recorded, B's ``status`` is timed
again and again until A's unload returns. Before the host stopped waiting
(issue: 4.9 s for one status), every one of those waited for A's unload.

Both phases take one sample per millisecond or so (``--pause-ms``), so the
benchmark's own loop weighs the same in each. Printed: median, p99 and max
(ms) of each phase, their ratios, and whether the target holds (p99 under
50 ms while A's unload is under way).

Run: ``python bench/verb_latency.py [--idle 500] [--rounds 3]`` (about 25 s).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

from _harness import (
    FAKE_LLAMA,
    MS,
    REPO,
    bench_settings,
    fake_registry,
    free_port,
    machine,
    median,
    open_node,
    percentile,
    reaped_children,
    table,
    workdir,
)

from infervisor.actors.node import Node
from infervisor.actors.settings import NodeSettings
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.replay import RestartPolicy, timeline

IGNORER = REPO / "tests" / "programs" / "fault_ignore_term.py"
TARGET_MS = 50.0


def switching_launcher(directory: Path) -> str:
    """Runs the SIGTERM ignorer in a working directory holding ``ignore_term``,
    else the healthy fake (both take llama-server's flags)."""
    path = directory / "launch-switching"
    path.write_text(
        "#!/bin/sh\n"
        f"if [ -e ignore_term ]; then exec '{sys.executable}' '{IGNORER}' \"$@\"; fi\n"
        f"exec '{sys.executable}' '{FAKE_LLAMA}' \"$@\"\n"
    )
    path.chmod(0o755)
    return str(path)


def settings(root: Path, launcher: str, registry: Path) -> NodeSettings:
    return bench_settings(
        root,
        registry,
        llamacpp_program=launcher,
        health_interval_s=0.5,
        reconcile_interval_s=5.0,
        stop_grace_s=2.0,
        restart=RestartPolicy(base_s=0.2, cap_s=1.0, stable_after_s=60.0),
    )


def placed_running(node: Node, role: str, *, ignore_term: bool = False) -> str:
    spec = InstanceSpec(role=role, flavor=Flavor.LLAMACPP, model="tiny", port=free_port())
    iid = node.place(spec)
    if ignore_term:
        cwd = Path(node.settings.data_dir) / "instances" / iid
        cwd.mkdir(parents=True, exist_ok=True)
        (cwd / "ignore_term").write_text("")
    node.start(iid)
    node.wait_for(iid, lambda v: v.lifecycle == "running", 30, poll_s=0.01)
    return iid


def timed_status(node: Node, iid: str) -> float:
    t = time.perf_counter_ns()
    node.status(iid)
    return (time.perf_counter_ns() - t) / MS


def idle_samples(node: Node, b: str, count: int, pause_s: float) -> list[float]:
    samples = []
    for _ in range(count):
        samples.append(timed_status(node, b))
        time.sleep(pause_s)
    return samples


def unload_round(node: Node, b: str, role: str, pause_s: float) -> tuple[list[float], float]:
    """B's status samples while A's unload is under way, and that unload's seconds."""
    a = placed_running(node, role, ignore_term=True)
    done = threading.Event()
    began = time.monotonic()

    def unload() -> None:
        try:
            node.unload(a)
        finally:
            done.set()

    threading.Thread(target=unload, daemon=True).start()
    while not sigterm_recorded(node, a):
        time.sleep(0.005)
    samples = []
    while not done.is_set():
        samples.append(timed_status(node, b))
        time.sleep(pause_s)
    return samples, time.monotonic() - began


def sigterm_recorded(node: Node, iid: str) -> bool:
    """A's unload has sent its SIGTERM (recorded as a stop request), which it ignores."""
    return any(e.kind == "instance.stop_requested" for e in timeline(node.settings.chain_path, iid))


def stats_row(name: str, values: list[float]) -> list[object]:
    return [name, len(values), median(values), percentile(values, 0.99), max(values)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--idle", type=int, default=500, help="status samples with nothing going on")
    p.add_argument("--rounds", type=int, default=3, help="unloads of a SIGTERM ignorer (~5 s each)")
    p.add_argument("--pause-ms", type=float, default=1.0, help="pause between samples")
    args = p.parse_args()
    pause = args.pause_ms / 1000
    print(f"verb_latency: {args.rounds} unloads, {machine()}, {time.strftime('%Y-%m-%d %H:%M')}")
    with workdir("verbs") as root, reaped_children():
        registry = fake_registry(root)
        with open_node(settings(root, switching_launcher(root), registry)) as node:
            node.registry.adopt("tiny", registry / "tiny.gguf")
            b = placed_running(node, "b")
            idle = idle_samples(node, b, args.idle, pause)
            busy: list[float] = []
            unloads: list[float] = []
            for i in range(args.rounds):
                samples, seconds = unload_round(node, b, f"a{i}", pause)
                busy += samples
                unloads.append(seconds)
            node.stop(b)
    report(idle, busy, unloads)


def report(idle: list[float], busy: list[float], unloads: list[float]) -> None:
    print(f"\n(each unload of the SIGTERM ignorer took {median(unloads):.1f} s, median)\n")
    rows = [
        stats_row("status(B), idle", idle),
        stats_row("status(B), while A's unload hangs", busy),
    ]
    print(table(["ms", "n", "median", "p99", "max"], rows))
    p99 = percentile(busy, 0.99)
    print(
        f"\nratios (this run): during A's unload / idle = "
        f"{median(busy) / median(idle):.2f}x median, {p99 / percentile(idle, 0.99):.2f}x p99"
    )
    verdict = "met" if p99 < TARGET_MS else "NOT met"
    print(f"target: p99 under {TARGET_MS:g} ms during the unload: {verdict} ({p99:.2f} ms)")


if __name__ == "__main__":
    main()
