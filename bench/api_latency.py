"""API latency: a verb over the control API's Unix socket vs the same verb as
an in-process ``Node`` call, in one process and one run.

One node (in this process) serves its control API on ``DATA_DIR/api.sock``
(``ApiServer.listen`` and ``ApiServer.serve``, as ``infervisor run`` does)
and manages one fake llama server (tests/programs/fake_llama.py). Each verb
is timed both ways, alternately (each sample pair takes one way first, the
next pair the other), so load drifting during the run weighs on both alike:

- ``status``: ``ApiClient.status(iid)`` vs ``Node.status(iid)``;
- ``heartbeat``: ``ApiClient.heartbeat(ctl)`` vs ``Node.heartbeat(ctl)`` (a
  ``tell`` to the supervisor: the API's cost stands alone here);
- ``start+stop``: one start of the stopped instance and its stop (answered
  once nothing of the server is left), through the API vs in process.

The client runs in the same process as the node (the same GIL), as a
controller would not: the API figures include the client's own CPU.
``ApiClient`` keeps one connection open (HTTP/1.1 keep-alive). Every POST
carries a fresh Idempotency-Key, as the client always sends one.

Printed: median, p99 and max (ms) of each, and the API / in-process ratios.

Run: ``python bench/api_latency.py [--samples 1000] [--pairs 20]`` (about 15 s).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from _harness import (
    FAKE_LLAMA,
    MS,
    bench_settings,
    fake_registry,
    free_port,
    machine,
    make_launcher,
    median,
    percentile,
    reaped_children,
    table,
    workdir,
)

from infervisor.actors.node import Node
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.replay import RestartPolicy
from infervisor.tools.api.client import ApiClient
from infervisor.tools.api.serving.server import ApiServer

CONTROLLER = "bench-ctl"


@contextmanager
def served_node(root: Path) -> Iterator[tuple[Node, ApiServer]]:
    """A node with its API served, shut down as ``infervisor run`` does."""
    registry = fake_registry(root)
    settings = bench_settings(
        root,
        registry,
        llamacpp_program=make_launcher(root, FAKE_LLAMA),
        health_interval_s=0.5,
        reconcile_interval_s=5.0,
        stop_grace_s=5.0,
        lease_s=60.0,
        restart=RestartPolicy(base_s=0.2, cap_s=1.0, stable_after_s=60.0),
    )
    Path(settings.data_dir).mkdir(parents=True)  # as `infervisor run` makes it first
    server = ApiServer.listen(Path(settings.data_dir), settings.chain_path, settings.node_id)
    try:
        node = Node.open(settings)
        try:
            server.serve(node)
            yield node, server
        finally:
            server.stopping()
            node.shutdown()
    finally:
        server.close()


def timed(call: Callable[[], object]) -> float:
    t = time.perf_counter_ns()
    call()
    return (time.perf_counter_ns() - t) / MS


def alternate(
    n: int, api: Callable[[], object], local: Callable[[], object]
) -> tuple[list[float], list[float]]:
    """``n`` samples of each, alternating which goes first."""
    over_api: list[float] = []
    in_process: list[float] = []
    for i in range(n):
        if i % 2:
            over_api.append(timed(api))
            in_process.append(timed(local))
        else:
            in_process.append(timed(local))
            over_api.append(timed(api))
    return over_api, in_process


def stats_row(name: str, values: list[float]) -> list[object]:
    return [name, len(values), median(values), percentile(values, 0.99), max(values)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--samples", type=int, default=1000, help="status and heartbeat samples, each way"
    )
    p.add_argument("--pairs", type=int, default=20, help="start+stop pairs, each way")
    p.add_argument("--warmup", type=int, default=50, help="untimed calls of each first")
    args = p.parse_args()
    print(f"api_latency: {machine()}, {time.strftime('%Y-%m-%d %H:%M')}")
    results: dict[str, tuple[list[float], list[float]]] = {}
    with workdir("api") as root, reaped_children(), served_node(root) as (node, _server):
        node.registry.adopt("tiny", Path(root) / "models" / "tiny.gguf")
        spec = InstanceSpec(role="b", flavor=Flavor.LLAMACPP, model="tiny", port=free_port())
        iid = node.place(spec)
        with ApiClient(data_dir=node.settings.data_dir, timeout_s=60.0) as client:
            for _ in range(args.warmup):
                client.status(iid)
                node.status(iid)
                client.heartbeat(CONTROLLER)
                node.heartbeat(CONTROLLER)
            results["status"] = alternate(
                args.samples, lambda: client.status(iid), lambda: node.status(iid)
            )
            results["heartbeat"] = alternate(
                args.samples,
                lambda: client.heartbeat(CONTROLLER),
                lambda: node.heartbeat(CONTROLLER),
            )

            def api_pair() -> None:
                client.start(iid)
                client.stop(iid)

            def node_pair() -> None:
                node.start(iid)
                node.stop(iid)

            results["start+stop"] = alternate(args.pairs, api_pair, node_pair)
    report(results)


def report(results: dict[str, tuple[list[float], list[float]]]) -> None:
    rows = []
    for verb, (api, local) in results.items():
        rows.append(stats_row(f"{verb}, API (socket)", api))
        rows.append(stats_row(f"{verb}, in process", local))
    print()
    print(table(["ms", "n", "median", "p99", "max"], rows))
    print("\nratios (this run), API / in process:")
    for verb, (api, local) in results.items():
        print(
            f"  {verb}: {median(api) / median(local):.1f}x median, "
            f"{percentile(api, 0.99) / percentile(local, 0.99):.1f}x p99 "
            f"({median(api) - median(local):+.2f} ms median)"
        )


if __name__ == "__main__":
    main()
