"""The headline figures of issue 10 in one table, each beside its target.

Every ratio is measured in this one run, against its baseline on the same
machine and file system at the same time, so outside load skews both sides
alike. The figures:

- **durable single append**: ``SqliteChain.append`` (one event, one
  transaction, WAL, ``synchronous=FULL``) against SQLite's own single-row
  transactions on a table of the same shape with the same pragmas;
- **group commit**: 32 threads appending through the ``ChainWriter`` actor at
  once, each acknowledged when its event is durable, in three rounds taken in
  turns with SQLite's own 32-row and 1,000-row transactions (target: issue
  22's 20,000 events/s);
- **CPU per probe**: the node's probing engine probing adopted fakes over
  keep-alive connections, against the same GETs made with ``http.client``;
- **idle supervision**: node CPU and RSS with 300 and 1,000 idle adopted
  instances probed every second (every due probe counted);
- **place, start and shut down** 1,000 adopted instances; one ``status`` and
  one ``list`` among them;
- **exit latency**: SIGKILL of a managed fake server until its ``exited``
  row is readable by another connection (an upper bound of "durable"), idle
  and with 300 other instances being probed;
- **the auditor's commands** (bench/cli_audit.py): ``chain verify`` and
  ``replay`` of a 200,000-event chain as processes beside the bare loop as a
  process (CPU, start-up included), and the start-up of ``chain verify`` and
  ``status`` beside the imports every command pays for.

Issue 22's rows measured from outside the node (``--skip-slow`` leaves them
out, with the auditor's commands): **RSS per adopted instance through
``infervisor run`` and ``place``** (bench/rss_run.py: the node as its own
process, 300 adopted instances placed and started through its control API,
its RSS above the same node empty), and **the node's boot on a 200,000-event
chain** left as a node leaves it (with its snapshot) against a boot on an
empty data dir, in turns (bench/boot_time.py).

Issue 21's figures: **loads on the residency trace**, the node's policy
against an LRU-of-2 swap (bench/residency_trace.py, a simulation: well
under a second), always; with ``--front``, the OpenAI-compatible front
against straight to llama-server (bench/front.py: a real node and real
llama.cpp servers, about 2 more minutes).

Run: ``python bench/summary.py`` (about 2 to 4 minutes on 2 cores; ``--quick``
scales the counts down for a smoke run). Prints the machine, its load
average, the git commit, and the table. bench/README.md records its output.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from _harness import (
    FAKE_KEEPALIVE,
    FAKE_LLAMA,
    REPO,
    bench_settings,
    fake_registry,
    free_port,
    machine,
    make_launcher,
    percentile,
    reaped_children,
    servers,
    table,
    workdir,
)
from cli_audit import audit_rows

from infervisor.actors.chain_writer import ChainWriter
from infervisor.actors.messages import Append
from infervisor.actors.node import Node
from infervisor.adapters.probe import HealthKind, ProbeTarget, ServerReport
from infervisor.adapters.probe_engine import ProbeEngine
from infervisor.adapters.spec import Flavor, InstanceSpec, Mode
from infervisor.chain import EventDraft, MemoryChain, SqliteChain, encode_payload, schema
from infervisor.replay import RestartPolicy

PAYLOAD = encode_payload({"pid": 123456, "exit_code": None, "signal": 9, "reason": "x" * 80})
FAKES = 3  # adopted instances share a few keep-alive fakes: their cost is not the node's


@dataclass
class Row:
    figure: str
    value: str
    target: str
    met: bool | None

    def cells(self) -> list[object]:
        verdict = "-" if self.met is None else ("yes" if self.met else "NO")
        return [self.figure, self.value, self.target, verdict]


def draft(i: int) -> EventDraft:
    return EventDraft(
        ts_ns=time.time_ns(), source="bench", kind="bench.append", subject=f"i{i}", payload=PAYLOAD
    )


# ---------------------------------------------------------------- the chain
def chained_rows(count: int) -> list[tuple[Any, ...]]:
    """``count`` valid rows after a genesis (hashed in memory), as INSERT parameters."""
    chain = MemoryChain("bench")
    chain.append_many([draft(i) for i in range(count)])
    return [schema.to_row(e) for e in chain.events()]


def sqlite_rate(path: Path, rows: list[tuple[Any, ...]], per_txn: int) -> float:
    """Rows/s of plain sqlite3 inserting the chain's own rows into the chain's own
    schema (table, constraints, indexes, triggers), WAL, synchronous=FULL,
    ``per_txn`` rows a commit: what SQLite itself costs for these rows."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    schema.create(con)
    con.execute(schema.INSERT_EVENT, rows[0])  # genesis
    body = rows[1:]
    t = time.perf_counter()
    for first in range(0, len(body), per_txn):
        con.execute("BEGIN IMMEDIATE")
        con.executemany(schema.INSERT_EVENT, body[first : first + per_txn])
        con.execute("COMMIT")
    rate = len(body) / (time.perf_counter() - t)
    con.close()
    return rate


def single_appends(root: Path, count: int) -> list[Row]:
    """Interleaved in blocks of 25, so the shared disk's moods hit both sides alike;
    the rates are of the median time per commit."""
    rows = chained_rows(count)
    con = sqlite3.connect(root / "single-sqlite.db", isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    schema.create(con)
    con.execute(schema.INSERT_EVENT, rows[0])
    ours: list[float] = []
    theirs: list[float] = []
    with SqliteChain.open(root / "single.db", "bench") as chain:
        for first in range(1, count + 1, 25):
            for i in range(first, min(first + 25, count + 1)):
                t = time.perf_counter()
                chain.append(draft(i))
                ours.append(time.perf_counter() - t)
            for row in rows[first : first + 25]:
                t = time.perf_counter()
                con.execute("BEGIN IMMEDIATE")
                con.execute(schema.INSERT_EVENT, row)
                con.execute("COMMIT")
                theirs.append(time.perf_counter() - t)
    con.close()
    ours_rate, theirs_rate = 1 / statistics.median(ours), 1 / statistics.median(theirs)
    ratio = ours_rate / theirs_rate
    return [
        Row(
            "durable single append",
            f"{ours_rate:,.0f}/s = {ratio:.2f}x SQLite's {theirs_rate:,.0f}/s",
            ">= 0.9x SQLite's single-row transactions (same schema)",
            ratio >= 0.9,
        )
    ]


def group_commit(root: Path, threads: int, each: int, rounds: int = 3) -> list[Row]:
    """``threads`` appenders through the ``ChainWriter``, each acknowledged when
    durable, in ``rounds`` rounds taken in turns with SQLite's own 1,000-row and
    ``threads``-row transactions on the same schema; the median round of each."""
    rows = chained_rows(20_000)
    ours, thousand, same = [], [], []
    for r in range(rounds):
        ours.append(_writer_rate(root / f"group-{r}.db", threads, each))
        thousand.append(sqlite_rate(root / f"group-sqlite-{r}.db", rows, 1_000))
        same.append(sqlite_rate(root / f"group-sqlite-{threads}-{r}.db", rows, threads))
    rate = statistics.median(ours)
    big, small = statistics.median(thousand), statistics.median(same)
    return [
        Row(
            f"group commit, {threads} threads, each acked when durable (median of {rounds})",
            f"{rate:,.0f} events/s (best {max(ours):,.0f}) = {rate / small:.2f}x SQLite's "
            f"{threads}-row transactions' {small:,.0f}/s, "
            f"{rate / big:.2f}x its 1,000-row {big:,.0f}/s",
            ">= 20,000/s (issue 22)",
            rate >= 20_000,
        )
    ]


def _writer_rate(path: Path, threads: int, each: int) -> float:
    """Events/s of ``threads`` threads each appending ``each`` events one at a time."""
    writer = ChainWriter.start(str(path), "bench")
    try:
        writer.ask(Append(drafts=(draft(0),)))  # genesis and warm-up
        barrier = threading.Barrier(threads + 1)

        def appender(k: int) -> None:
            barrier.wait()
            for i in range(each):
                writer.ask(Append(drafts=(draft(k * each + i),)))

        pool = [threading.Thread(target=appender, args=(k,)) for k in range(threads)]
        for t in pool:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in pool:
            t.join()
        return threads * each / (time.perf_counter() - t0)
    finally:
        writer.stop()


# ---------------------------------------------------------------- probes
def cpu_s() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


def engine_cpu_per_probe(urls: list[str], rounds: int) -> tuple[float, int]:
    """CPU seconds per probe of the engine (one probe per server per round), probes made."""
    engine = ProbeEngine()
    done = threading.Semaphore(0)

    def deliver(report: ServerReport) -> None:
        assert report.health.kind is HealthKind.UP, report
        done.release()

    try:
        for _ in range(2):  # connect and learn the model lists first
            for i, url in enumerate(urls):
                engine.probe(i, ProbeTarget(url, Flavor.LLAMACPP, 5.0), deliver)
            for _ in urls:
                done.acquire()
        c = cpu_s()
        for _ in range(rounds):
            for i, url in enumerate(urls):
                engine.probe(i, ProbeTarget(url, Flavor.LLAMACPP, 5.0), deliver)
            for _ in urls:
                done.acquire()
        return (cpu_s() - c) / (rounds * len(urls)), rounds * len(urls)
    finally:
        engine.close()


def http_client_cpu_per_probe(urls: list[str], rounds: int) -> float:
    """The same requests with http.client: /health each round, /v1/models every 10th."""
    import http.client  # noqa: PLC0415 - the baseline only
    from urllib.parse import urlsplit  # noqa: PLC0415

    conns = []
    for url in urls:
        parts = urlsplit(url)
        conns.append(http.client.HTTPConnection(parts.hostname, parts.port, timeout=5))
    c = cpu_s()
    for r in range(rounds):
        for conn in conns:
            for path in ("/health", "/v1/models") if r % 10 == 9 else ("/health",):
                conn.request("GET", path, headers={"Accept": "application/json"})
                conn.getresponse().read()
    spent = (cpu_s() - c) / (rounds * len(conns))
    for conn in conns:
        conn.close()
    return spent


def probe_cost(ports: list[int], rounds: int) -> list[Row]:
    urls = [f"http://127.0.0.1:{ports[i % len(ports)]}" for i in range(100)]
    ours, _ = engine_cpu_per_probe(urls, rounds)
    theirs = http_client_cpu_per_probe(urls, rounds)
    ratio = ours / theirs
    return [
        Row(
            "CPU per probe (adopted fake, keep-alive)",
            f"{ours * 1e6:.0f} us = {ratio:.2f}x http.client's {theirs * 1e6:.0f} us",
            "<= 1.5x http.client",
            ratio <= 1.5,
        )
    ]


# ---------------------------------------------------------------- a node at scale
def counted_health(ports: list[int]) -> int:
    import json  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    total = 0
    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/bench/stats", timeout=5) as r:
            total += int(json.load(r)["health"])
    return total


@contextmanager
def idle_node(root: Path, name: str) -> Iterator[Node]:
    data = root / name
    data.mkdir()
    settings = bench_settings(
        data,
        fake_registry(data),
        health_interval_s=1.0,
        reconcile_interval_s=5.0,
        probe_timeout_s=5.0,
    )
    node = Node.open(settings)
    try:
        yield node
    finally:
        if not getattr(node, "_bench_shut", False):
            node.shutdown()


def adopted_specs(count: int, ports: list[int]) -> list[InstanceSpec]:
    return [
        InstanceSpec(
            role=f"idle{i}", flavor=Flavor.LLAMACPP, mode=Mode.ADOPTED, port=ports[i % len(ports)]
        )
        for i in range(count)
    ]


def place_and_start(node: Node, specs: list[InstanceSpec]) -> tuple[float, list[str]]:
    t = time.perf_counter()
    placed = node.place_many(specs)
    ids = []
    for p in placed:
        if isinstance(p, Exception):
            raise p
        ids.append(p.instance_id)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(node.start, ids))
    return time.perf_counter() - t, ids


def idle_window(node: Node, ports: list[int], count: int, seconds: float) -> dict[str, float]:
    """CPU (percent of one core), RSS, and probes made against probes due; the
    1-minute load average at the window's end beside them (the machine is shared)."""
    time.sleep(3.0)  # every instance probed a few times
    hits0, c0, w0 = counted_health(ports), cpu_s(), time.monotonic()
    time.sleep(seconds)
    hits1, c1, w1 = counted_health(ports), cpu_s(), time.monotonic()
    wall = w1 - w0
    return {
        "cpu_pct": 100 * (c1 - c0) / wall,
        "probes": hits1 - hits0,
        # node CPU per probe made: comparable across runs whose fakes were starved
        "us_per_probe": 1e6 * (c1 - c0) / max(1, hits1 - hits0),
        "due": count * wall / node.settings.health_interval_s,
        "load": os.getloadavg()[0],
    }


def timed_ms(fn: Callable[[], Any], times: int) -> float:
    spent = []
    for _ in range(times):
        t = time.perf_counter()
        fn()
        spent.append((time.perf_counter() - t) * 1e3)
    return statistics.median(spent)


def at_scale(root: Path, ports: list[int], big: int, small: int, seconds: float) -> list[Row]:
    me = psutil.Process()
    rows: list[Row] = []
    with idle_node(root, "empty") as node:
        time.sleep(1.0)
        empty_rss = me.memory_info().rss
    with idle_node(root, f"n{small}") as node:
        place_and_start(node, adopted_specs(small, ports))
        w = idle_window(node, ports, small, seconds)
        rows.append(
            Row(
                f"{small} idle adopted instances, 1 s interval: node CPU",
                f"{w['cpu_pct']:.1f} % of a core ({w['probes']:,} probes of {w['due']:,.0f} due, "
                f"{w['us_per_probe']:.0f} us each; load {w['load']:.1f})",
                "<= 5 % of a core",
                w["cpu_pct"] <= 5,
            )
        )
    with idle_node(root, f"n{big}") as node:
        took, ids = place_and_start(node, adopted_specs(big, ports))
        w = idle_window(node, ports, big, seconds)
        rss = (me.memory_info().rss - empty_rss) / big / 1024
        made = w["probes"] / w["due"]
        status_ms = timed_ms(lambda: node.status(ids[-1]), 50)
        list_ms = timed_ms(node.list, 5)
        t = time.perf_counter()
        node.shutdown()
        node._bench_shut = True  # type: ignore[attr-defined]
        down = time.perf_counter() - t
    rows += [
        Row(
            f"{big} idle adopted instances, 1 s interval: node CPU",
            f"{w['cpu_pct']:.1f} % of a core ({w['us_per_probe']:.0f} us a probe; "
            f"load {w['load']:.1f})",
            "<= 15 % of a core",
            w["cpu_pct"] <= 15,
        ),
        Row(
            f"{big} idle adopted: RSS above the empty node",
            f"{rss:.0f} KiB per instance",
            "<= 200 KiB",
            rss <= 200,
        ),
        Row(
            f"{big} idle adopted: due probes made",
            f"{w['probes']:,} of {w['due']:,.0f} ({100 * made:.0f} %)",
            "every due probe",
            made >= 0.97,
        ),
        Row(f"place and start {big} adopted", f"{took:.2f} s", "< 10 s", took < 10),
        Row(f"shutdown with {big}", f"{down:.2f} s", "< 5 s", down < 5),
        Row(f"one status among {big}", f"{status_ms:.2f} ms", "< 5 ms", status_ms < 5),
        Row(f"one list of {big}", f"{list_ms:.1f} ms", "< 100 ms", list_ms < 100),
    ]
    return rows


# ---------------------------------------------------------------- exit latency
def kill_to_seen(node: Node, iid: str, kills: int) -> list[float]:
    """ms from SIGKILL to the exited row readable by another connection, per kill."""
    uri = Path(node.settings.chain_path).absolute().as_uri() + "?mode=ro"
    reader = sqlite3.connect(uri, uri=True, isolation_level=None)
    sql = "SELECT max(seq) FROM events WHERE subject = ? AND kind = 'instance.exited'"
    spent: list[float] = []
    try:
        for _ in range(kills):
            view = node.wait_for(iid, lambda v: v.lifecycle == "running", 30, poll_s=0.01)
            assert view.pid is not None
            before = reader.execute(sql, (iid,)).fetchone()[0] or 0
            t0 = time.perf_counter()
            os.kill(view.pid, signal.SIGKILL)
            while (reader.execute(sql, (iid,)).fetchone()[0] or 0) <= before:
                time.sleep(0.0005)
            spent.append((time.perf_counter() - t0) * 1e3)
            node.wait_for(iid, lambda v, p=view.pid: v.pid not in (None, p), 30, poll_s=0.01)
    finally:
        reader.close()
    return spent


def exit_latency(root: Path, ports: list[int], others: int, kills: int) -> list[Row]:
    results = {}
    for label, count in (("idle", 0), ("busy", others)):
        data = root / f"exit-{label}"
        data.mkdir()
        settings = bench_settings(
            data,
            fake_registry(data),
            llamacpp_program=make_launcher(data, FAKE_LLAMA),
            health_interval_s=1.0,
            reconcile_interval_s=5.0,
            restart=RestartPolicy(max_restarts=10**6, base_s=0.01, cap_s=0.01, stable_after_s=3600),
        )
        with reaped_children():
            node = Node.open(settings)
            try:
                if count:
                    place_and_start(node, adopted_specs(count, ports))
                node.registry.adopt("tiny", Path(settings.registry_dir) / "tiny.gguf")
                spec = InstanceSpec(
                    role="victim", flavor=Flavor.LLAMACPP, model="tiny", port=free_port()
                )
                iid = node.place(spec)
                node.start(iid)
                results[label] = kill_to_seen(node, iid, kills)
            finally:
                node.shutdown()
    idle99, busy99 = percentile(results["idle"], 0.99), percentile(results["busy"], 0.99)
    return [
        Row(
            f"exit to durable exited, {others} others probed (p99)",
            f"{busy99:.1f} ms = {busy99 / idle99:.2f}x idle's {idle99:.1f} ms",
            "< 10 ms and <= 2x idle",
            busy99 < 10 and busy99 <= 2 * idle99,
        )
    ]


# ---------------------------------------------------------------- issue 22, outside
def rss_through_run(root: Path, count: int) -> list[Row]:
    """bench/rss_run.py: ``infervisor run`` as its own process, ``count`` adopted
    instances placed and started through its control API as ``place --start`` does."""
    import rss_run  # noqa: PLC0415 - bench/rss_run.py, beside this file

    r = rss_run.rss_per_instance(root, count)
    return [
        Row(
            f"{count} adopted through `infervisor run` and `place`: RSS above the empty node",
            f"{r['rss']:.0f} KiB per instance (PSS {r['pss']:.0f}, USS {r['uss']:.0f}; "
            f"empty node {r['empty_mib']:.0f} MiB; load {r['load']:.1f})",
            "<= 200 KiB",
            r["rss"] <= 200,
        )
    ]


def boot_rows(root: Path, events: int, rounds: int) -> list[Row]:
    """bench/boot_time.py: ``Node.open`` until it supervises, on a long chain left
    as a node leaves it (with its snapshot) and on an empty data dir, in turns."""
    import boot_time  # noqa: PLC0415 - bench/boot_time.py, beside this file

    times = boot_time.measure(root, [events], 20, rounds)
    empty = statistics.median(times.pop("empty"))
    snap = next(w for w in times if w.endswith(", snapshot"))
    full = next(w for w in times if w.endswith(", no snapshot"))
    ours, whole = statistics.median(times[snap]), statistics.median(times[full])
    ratio = ours / empty
    return [
        Row(
            f"node boot on a {snap.split(' events')[0]}-event chain, until it supervises",
            f"{ours * 1e3:.1f} ms = {ratio:.2f}x an empty data dir's {empty * 1e3:.1f} ms "
            f"(without its snapshot: {whole:.2f} s)",
            "<= 1.3x the empty boot",
            ratio <= 1.3,
        )
    ]


# ---------------------------------------------------------------- main
# ---------------------------------------------------------------- issue 21
def residency_loads() -> list[Row]:
    import residency_trace  # noqa: PLC0415 - bench/residency_trace.py, beside this file

    f = residency_trace.measure()
    return [
        Row(
            f"loads on the residency trace ({f.requests} requests, 4 models, room for 2)",
            f"{f.node.loads} = {f.ratio:.2f}x LRU-of-2's {f.lru2.loads} "
            f"(it cut {f.lru2.cut} streams; node: 0 cut, {f.node.refused} 503s)",
            "- (fewer loads is better; nothing cut)",
            None,
        )
    ]


def front_rows(quick: bool) -> list[Row]:
    import front  # noqa: PLC0415 - bench/front.py: needs tools/front

    count, rounds, cold = (40, 2, 1) if quick else (300, 5, 3)
    with workdir("front") as root, front.node(root, 1.0) as s:
        got = front.ttft(s, count) + front.throughput(s, 64, 64, rounds)
        got += front.resting(s, cold)
    return [Row(r.figure, r.value, r.target, r.met) for r in got]


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts: a smoke run (~30 s)")
    ap.add_argument("--front", action="store_true", help="also bench/front.py's figures")
    ap.add_argument(
        "--only-idle",
        action="store_true",
        help="only the idle supervision rows (a node at scale; about 1 minute), for runs "
        "repeated side by side",
    )
    ap.add_argument(
        "--skip-slow",
        action="store_true",
        help="leave out the rows that take longest: RSS through `infervisor run` and "
        "`place`, the boot on a 200,000-event chain, the auditor's commands (about a minute)",
    )
    args = ap.parse_args()
    big, small, seconds, kills = (100, 30, 3.0, 10) if args.quick else (1000, 300, 10.0, 40)
    started = time.monotonic()
    print(f"# {machine()}, commit {commit()}", flush=True)
    rows: list[Row] = []
    with reaped_children(), workdir("summary") as root:
        if args.only_idle:
            with servers(FAKE_KEEPALIVE, FAKES, root) as fleet:
                rows += at_scale(root, [p for p, _ in fleet], big, small, seconds)
            _print(rows, started)
            return
        rows += single_appends(root, 300 if args.quick else 1000)
        rows += group_commit(root, 32, 50 if args.quick else 300)
        with servers(FAKE_KEEPALIVE, FAKES, root) as fleet:
            ports = [p for p, _ in fleet]
            rows += probe_cost(ports, 10 if args.quick else 30)
            rows += at_scale(root, ports, big, small, seconds)
            rows += exit_latency(root, ports, small, kills)
        if not args.skip_slow:
            rows += _slow_rows(root, args.quick)
        rows += residency_loads()
        if args.front:
            rows += front_rows(args.quick)
    _print(rows, started)


def _slow_rows(root: Path, quick: bool) -> list[Row]:
    """The auditor's commands, RSS through ``run`` and ``place``, the boot on a long chain."""
    events = 20_000 if quick else 200_000
    (root / "cli-audit").mkdir()
    rows = [Row(*r) for r in audit_rows(root / "cli-audit", events=events)]
    (root / "rss-run").mkdir()
    rows += rss_through_run(root / "rss-run", 100 if quick else 300)
    (root / "boot").mkdir()
    rows += boot_rows(root / "boot", events, 3 if quick else 5)
    return rows


def _print(rows: list[Row], started: float) -> None:
    print(
        table(
            ["figure", "measured (ratios in this run)", "target", "met"], [r.cells() for r in rows]
        )
    )
    load = os.getloadavg()
    print(
        f"\nload average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; "
        f"took {time.monotonic() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
