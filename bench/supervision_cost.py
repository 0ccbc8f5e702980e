"""Supervision cost: the node's CPU per instance per health tick, with idle instances.

A node (in this process) adopts N llama.cpp servers that all point at a few
fake servers (bench/_fake_keepalive.py: HTTP/1.1 keep-alive on one asyncio
loop each, so the servers' own cost stays small and is measured apart). Adopted
instances are probed on every health tick and do nothing else. After a warm-up,
over ``--seconds`` of steady state it measures:

- the node process's CPU time (user + system, all its threads), and the same
  per thread family (actor threads, probe workers, clock, writer...);
- the fake servers' CPU time;
- the probes that really happened (counted in the node, by wrapping
  ``AdoptedServer.probe`` from the outside, and by the servers as /health hits);
- the node's thread count and RSS.

CPU per instance per tick = node CPU / instance-ticks handled (and per probe
made). Run once per N (default 0, 30 and 300); the ratio of the per-instance
costs shows whether the cost grows linearly with N.

Then two controls with the largest N and no node at all: the same probes
(``ServerClient.probe``, one client per instance) at the rate the node really
probed, fired by one timer thread (a) into one single-worker pool per
instance, as the node's instance actors do, and (b) into one shared pool of 4
workers. Node vs (a) is what the actors add; (a) vs (b) is what a thread per
instance costs.

``--fake tests`` uses the tests' HTTP/1.0 fake instead (a new TCP connection
per request). Placing and shutting down are timed too: they are slow with many
adopted instances (see bench/README.md).

Run: ``python bench/supervision_cost.py [--counts 0 30 300] [--seconds 20]``
(about 7 minutes with 300 instances on 2 cores, most of it placing and shutdown).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from _harness import (
    FAKE_KEEPALIVE,
    FAKE_LLAMA,
    bench_settings,
    fake_registry,
    machine,
    open_node,
    reaped_children,
    servers,
    table,
    workdir,
)

from infervisor.actors import instance
from infervisor.actors.node import Node
from infervisor.actors.settings import NodeSettings
from infervisor.adapters import adopted
from infervisor.adapters.probe import ServerClient
from infervisor.adapters.spec import Flavor, InstanceSpec, Mode


class Counts:
    """Counts, in this process, the health ticks instance actors handle and the
    probes made (adopted instances' probes by wrapping two methods from the
    outside; the controls count their own)."""

    def __init__(self) -> None:
        self.probes = 0
        self.ticks = 0
        self._lock = threading.Lock()
        probe = adopted.AdoptedServer.probe
        tick = instance.InstanceActor._health_tick

        def counted_probe(server: adopted.AdoptedServer) -> Any:
            self.probed()
            return probe(server)

        def counted_tick(actor: instance.InstanceActor) -> None:
            with self._lock:
                self.ticks += 1
            tick(actor)

        adopted.AdoptedServer.probe = counted_probe  # type: ignore[method-assign,assignment]
        instance.InstanceActor._health_tick = counted_tick  # type: ignore[method-assign,assignment]

    def probed(self) -> None:
        with self._lock:
            self.probes += 1

    def now(self) -> tuple[int, int]:
        """(probes, ticks) so far."""
        with self._lock:
            return self.probes, self.ticks


@dataclass
class Sample:
    """What is read at the start and the end of a measured window."""

    wall: float
    user: float
    system: float
    ctx: int
    families: dict[str, tuple[float, float]]
    servers: float
    busy: float
    probes: int
    ticks: int
    hits: int | None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def take(cls, counts: Counts, pids: list[int], ports: list[int]) -> Sample:
        # the counters that must agree first, together; the slow per-thread reads last
        wall, cpu, probes, ticks = time.monotonic(), psutil.Process().cpu_times(), *counts.now()
        servers, busy = sum(map(cpu_seconds, pids)), busy_cpu_seconds()
        return cls(
            wall=wall,
            user=cpu.user,
            system=cpu.system,
            ctx=context_switches(),
            families=cpu_by_family(),
            servers=servers,
            busy=busy,
            probes=probes,
            ticks=ticks,
            hits=server_health_hits(ports),
        )


def window(a: Sample, b: Sample) -> dict[str, Any]:
    """The differences between two samples, as a result row."""
    node = (b.user - a.user) + (b.system - a.system)
    fams = {
        k: (u - a.families.get(k, (0.0, 0.0))[0], s_ - a.families.get(k, (0.0, 0.0))[1])
        for k, (u, s_) in b.families.items()
    }
    return {
        "wall": b.wall - a.wall,
        "cpu": node,
        "sys": b.system - a.system,
        "ctx": b.ctx - a.ctx,
        "families": fams,
        "server_cpu": b.servers - a.servers,
        # read at slightly different moments: clamp the noise below zero
        "others": max(0.0, (b.busy - a.busy) - node - (b.servers - a.servers)),
        "probes": b.probes - a.probes,
        "ticks": b.ticks - a.ticks,
        "hits": None if a.hits is None or b.hits is None else b.hits - a.hits,
    }


def server_health_hits(ports: list[int]) -> int | None:
    total = 0
    for port in ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/bench/stats", timeout=5) as r:
                total += json.loads(r.read())["health"]
        except (OSError, ValueError, KeyError):
            return None  # the tests' fake has no stats
    return total


def thread_family(name: str) -> str:
    """``InstanceActor-12 (urn:...)`` -> ``InstanceActor``; ``probe_0`` -> ``probe``."""
    name = name.split(" ", maxsplit=1)[0]
    return re.sub(r"[-_]?\d+$", "", name) or name


def cpu_by_family() -> dict[str, tuple[float, float]]:
    """(user, system) CPU seconds of this process's threads, summed per family."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    user: dict[str, float] = defaultdict(float)
    system: dict[str, float] = defaultdict(float)
    for t in psutil.Process().threads():
        family = thread_family(names.get(t.id, "other (not a Python thread)"))
        user[family] += t.user_time
        system[family] += t.system_time
    return {k: (user[k], system[k]) for k in user}


def context_switches() -> int:
    """Context switches of every thread of this process so far (psutil's
    num_ctx_switches reads the main thread's only)."""
    total = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            text = (task / "status").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        total += sum(int(line.split()[1]) for line in text.splitlines() if "ctxt_switches" in line)
    return total


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine spent busy (all cores, all processes)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def settings(root: Path, registry: Path, interval: float) -> NodeSettings:
    return bench_settings(
        root,
        registry,
        health_interval_s=interval,
        reconcile_interval_s=5.0,
        probe_timeout_s=5.0,
    )


def place_idle(node: Node, count: int, ports: list[int]) -> tuple[float, list[str]]:
    """Adopt and start ``count`` instances spread over ``ports``: seconds it took, ids."""
    t, ids = time.monotonic(), []
    for i in range(count):
        spec = InstanceSpec(
            role=f"idle{i}", flavor=Flavor.LLAMACPP, mode=Mode.ADOPTED, port=ports[i % len(ports)]
        )
        ids.append(node.place(spec))
        node.start(ids[-1])
    return time.monotonic() - t, ids


def status_ms(node: Node, ids: list[str], times: int = 5) -> float | str:
    """Median wall time of ``node.status`` of one instance, in ms."""
    if not ids:
        return "-"
    spent = []
    for _ in range(times):
        t = time.perf_counter()
        node.status(ids[-1])
        spent.append((time.perf_counter() - t) * 1e3)
    return statistics.median(spent)


@contextmanager
def node_with(
    root: Path, count: int, ports: list[int], interval: float
) -> Iterator[tuple[Node, tuple[float, list[str]]]]:
    """A node with ``count`` idle adopted instances; the seconds placing them took, ids."""
    data = root / f"run{count}"
    data.mkdir()
    registry = fake_registry(data)
    with open_node(settings(data, registry, interval)) as node:
        yield node, place_idle(node, count, ports)


def measure_node(
    count: int, root: Path, fleet: list[tuple[int, int]], args: argparse.Namespace, counts: Counts
) -> dict[str, Any]:
    ports, pids = [p for p, _ in fleet], [pid for _, pid in fleet]
    me = psutil.Process()
    with node_with(root, count, ports, args.interval) as (node, (placing_s, ids)):
        time.sleep(max(3 * args.interval, 3.0))  # warm-up: every instance probed a few times
        start = Sample.take(counts, pids, ports)
        time.sleep(args.seconds)
        result = window(start, Sample.take(counts, pids, ports))
        # live_states, not list(): an adopted instance's status scans every socket (README)
        states = node.live_states().values()
        result.update(
            status_ms=status_ms(node, ids),
            name=f"node, {count} instances",
            count=count,
            placing_s=placing_s,
            threads=me.num_threads(),
            rss_mib=me.memory_info().rss / 2**20,
            running=sum(st.lifecycle.value == "running" for st in states),
        )
        t_stop = time.monotonic()
    result["shutdown_s"] = time.monotonic() - t_stop
    return result


def measure_control(
    count: int,
    fleet: list[tuple[int, int]],
    args: argparse.Namespace,
    counts: Counts,
    shared_workers: int | None,
    interval: float,
) -> dict[str, Any]:
    """The same probes without a node: one timer thread submits each client's probe
    every ``interval`` (unless its last one is still running, as the node does) into
    a single-worker pool per client (``shared_workers`` None) or one shared pool."""
    ports, pids = [p for p, _ in fleet], [pid for _, pid in fleet]
    clients = [ServerClient(f"http://127.0.0.1:{ports[i % len(ports)]}", 5.0) for i in range(count)]
    n_pools = count if shared_workers is None else 1
    pools = [ThreadPoolExecutor(shared_workers or 1) for _ in range(n_pools)]
    busy = [False] * count
    stop = threading.Event()

    def probe(i: int) -> None:
        try:
            clients[i].probe(Flavor.LLAMACPP)
            counts.probed()
        finally:
            busy[i] = False

    def timer() -> None:
        due = time.monotonic()
        while not stop.wait(max(0.0, due - time.monotonic())):
            due += interval
            for i in range(count):
                if not busy[i]:
                    busy[i] = True
                    pools[i % n_pools].submit(probe, i)

    ticker = threading.Thread(target=timer, name="control-timer", daemon=True)
    ticker.start()
    try:
        time.sleep(max(3 * interval, 3.0))
        start = Sample.take(counts, pids, ports)
        time.sleep(args.seconds)
        result = window(start, Sample.take(counts, pids, ports))
        result.update(threads=psutil.Process().num_threads(), rss_mib=0.0)
    finally:
        stop.set()
        ticker.join()
        for pool in pools:
            pool.shutdown(wait=True, cancel_futures=True)
        for client in clients:
            client.close()
    kind = "a pool per client" if shared_workers is None else f"shared pool of {shared_workers}"
    result.update(name=f"control: probes only, {kind}", count=count, ticks=0)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--counts", type=int, nargs="+", default=[0, 30, 300])
    p.add_argument("--seconds", type=float, default=20.0, help="steady state measured per run")
    p.add_argument("--interval", type=float, default=0.5, help="health interval, s")
    p.add_argument("--servers", type=int, default=3)
    p.add_argument("--fake", choices=["keepalive", "tests"], default="keepalive")
    p.add_argument("--no-control", action="store_true", help="skip the runs without a node")
    args = p.parse_args()
    print(
        f"supervision_cost: adopted idle instances, health every {args.interval:g} s, "
        f"{args.seconds:g} s measured, {args.servers} {args.fake} fake servers; "
        f"{machine()}, {time.strftime('%Y-%m-%d %H:%M')}"
    )
    counts = Counts()
    script = FAKE_KEEPALIVE if args.fake == "keepalive" else FAKE_LLAMA
    results, controls = [], []
    with (
        workdir("supervision") as root,
        reaped_children(),
        servers(script, args.servers, root) as fleet,
    ):
        for count in args.counts:
            results.append(measure_node(count, root, fleet, args, counts))
            print(f"  measured the node with {count} instances", flush=True)
        top = max(results, key=lambda r: r["count"])
        if top["probes"] and not args.no_control:
            # the node's probing rate per instance, so that both do the same work
            every = top["count"] * top["wall"] / top["probes"]
            for workers in (None, 4):
                controls.append(measure_control(top["count"], fleet, args, counts, workers, every))
            print(f"  measured the controls (each client probed every {every:.2f} s)", flush=True)
    report(results, controls, args.interval)


def per_tick_us(r: dict[str, Any]) -> float | None:
    """Node CPU per instance-tick handled, in microseconds."""
    return r["cpu"] / r["ticks"] * 1e6 if r["ticks"] else None


def per_probe_us(r: dict[str, Any], key: str = "cpu") -> float | str:
    return r[key] / r["probes"] * 1e6 if r["probes"] else "-"


def report(results: list[dict[str, Any]], controls: list[dict[str, Any]], interval: float) -> None:
    rows = []
    for r in results:
        due = r["count"] * r["wall"] / interval
        us = per_tick_us(r)
        probes = r["probes"]
        rows.append(
            [
                r["count"],
                f"{r['running']}/{r['count']}",
                round(r["placing_s"], 1),
                round(r["shutdown_s"], 1),
                r["status_ms"],
                f"{r['ticks'] / due:.0%}" if due else "-",
                f"{probes / r['ticks']:.0%}" if r["ticks"] else "-",
                "n/a" if r["hits"] is None else f"{r['hits'] / probes:.0%}" if probes else "-",
                100 * r["cpu"] / r["wall"],
                "-" if us is None else us,
                per_probe_us(r),
                per_probe_us(r, "server_cpu"),
                r["threads"],
                round(r["rss_mib"]),
                100 * r["others"] / r["wall"],
            ]
        )
    heads = [
        "instances",
        "running",
        "place s",
        "stop s",
        "status ms",
        "ticks/due",
        "probed/tick",
        "srv saw",
        "node cpu %",
        "us/inst/tick",
        "us/probe",
        "srv us/probe",
        "threads",
        "RSS MiB",
        "others cpu %",
    ]
    print()
    print(table(heads, rows))
    print(
        "\nticks/due: instance-ticks handled / (instances x seconds / interval); probed/tick:"
        "\nprobes made / ticks handled; srv saw: /health hits counted by the servers / probes;"
        "\nplace s: placing and starting them all; stop s: node.shutdown; status ms: one"
        "\nnode.status call; others cpu %: what the rest of the machine used meanwhile"
        "\n(of 100% per core)."
    )
    print_families(results)
    print_controls(results, controls)
    print_ratios(results, controls)


def print_families(results: list[dict[str, Any]]) -> None:
    top = max(results, key=lambda r: r["count"])
    if not top["probes"]:
        return
    fams = sorted(top["families"].items(), key=lambda kv: -sum(kv[1]))
    rows = [
        [name, 100 * (u + s) / top["wall"], (u + s) / top["probes"] * 1e6]
        for name, (u, s) in fams
        if u + s > 0
    ]
    print(f"\nnode CPU by thread family, {top['count']} instances (threads alive at the end)")
    print(table(["threads", "cpu %", "us per probe"], rows))


def print_controls(results: list[dict[str, Any]], controls: list[dict[str, Any]]) -> None:
    if not controls:
        return
    top = max(results, key=lambda r: r["count"])
    rows = [
        [
            r["name"],
            r["probes"],
            100 * r["cpu"] / r["wall"],
            per_probe_us(r),
            f"{r['sys'] / r['cpu']:.0%}" if r["cpu"] else "-",
            r["ctx"] / r["probes"] if r["probes"] else "-",
            r["threads"],
            100 * r["others"] / r["wall"],
        ]
        for r in (top, *controls)
    ]
    heads = ["same probes", "probes", "cpu %", "us/probe", "sys", "ctx sw/probe", "threads"]
    print("\nwhere a probe's cost goes (this process's CPU per probe made)")
    print(table([*heads, "others cpu %"], rows))


def print_ratios(results: list[dict[str, Any]], controls: list[dict[str, Any]]) -> None:
    costed = [r for r in results if r["ticks"]]
    base = next((r for r in results if r["count"] == 0), None)
    print("\nratios (this run):")
    for small, big in itertools.pairwise(sorted(costed, key=lambda r: r["count"])):
        a, b = per_tick_us(small), per_tick_us(big)
        assert a is not None
        assert b is not None
        print(
            f"  per-instance cost, {big['count']} vs {small['count']} instances: {b / a:.2f}x "
            "(1.00x = linear)"
        )
    if base is not None:
        for r in costed:
            idle = base["cpu"] / base["wall"] * r["wall"]
            marginal = (r["cpu"] - idle) / r["ticks"] * 1e6
            print(f"  {r['count']} instances, idle node subtracted: {marginal:.0f} us/inst/tick")
    for r in costed:
        ratio = r["cpu"] / r["server_cpu"]
        print(f"  {r['count']} instances: node cpu / server cpu = {ratio:.1f}x")
    top = max(results, key=lambda r: r["count"])
    for c in controls:
        node, control = per_probe_us(top), per_probe_us(c)
        if isinstance(node, float) and isinstance(control, float):
            print(f"  node / {c['name']}: {node / control:.2f}x CPU per probe")


if __name__ == "__main__":
    main()
