"""Exit latency: from SIGKILL of a managed server to its ``instance.exited`` event.

One node (in this process) manages one fake llama server (tests/programs/
fake_llama.py through a launcher) with a restart policy of 10 ms backoff and
a budget that never runs out. Each round waits until the instance is running
again, takes ``time.time_ns()``, SIGKILLs the server's pid and records:

- dead: the kernel reports the process gone (a pidfd of our own turns readable;
  stamped by the benchmark's thread, which may wait for the GIL first, so it can
  come out later than "reaped");
- reaped: the node's waiter thread saw the exit (``_await_exit`` returned);
- decided: the ``ts_ns`` of the ``instance.exited`` event, stamped by the
  instance actor just before it appends the event;
- durable: when the instance actor's append of the decision holding
  ``instance.exited`` (and the ``instance.restart_scheduled`` decided with it,
  in the same transaction) returned;
- seen: a separate read-only SQLite connection, polling every 1 ms, finds the
  exited row: when an outside reader can see it;
- ready again: the ``ts_ns`` of the next ``instance.ready`` (the restart).

All stamps are ``time.time_ns()`` (the node's ``RealClock.wall_ns``) in one
process. Then the same machine's bare ``SqliteChain.append`` and a
``ChainWriter`` actor round trip are timed for comparison.

The stages inside the node come from wrappers put around a few functions of
the exit path (see :class:`Tracer`; nothing in the code is changed, and a
wrapper costs microseconds). They name private functions: when one is renamed
its row reads "n/a" and the rest still runs.

Run: ``python bench/exit_latency.py [--kills 100]`` (about 30 s).
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _harness import (
    FAKE_LLAMA,
    MS,
    bench_settings,
    fake_registry,
    free_port,
    machine,
    make_launcher,
    median,
    open_node,
    percentile,
    reaped_children,
    table,
    workdir,
)

from infervisor.actors import instance
from infervisor.actors import messages as m
from infervisor.actors.chain_writer import ChainWriter
from infervisor.actors.node import Node
from infervisor.actors.settings import NodeSettings
from infervisor.adapters.proc import descendants, handles, pgroup, tree, waiter
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.chain import EventDraft, SqliteChain, encode_payload
from infervisor.replay import RestartPolicy

EXITED = "instance.exited"


class Tracer:
    """Stamps (first time each round) and summed durations of wrapped functions.

    It wraps, from the outside and only in this process, what exists of:
    ``ManagedProcess._await_exit`` (stamp "reaped" when the waiter sees the
    exit), ``InstanceActor.run`` (stamp each observation type as the actor
    decides on it), ``InstanceActor._record`` (stamp "recorded" once the
    decision's append returned), ``WatchedProcess.kill_tree`` (start and end), and times
    ``Descendants.track``/``kill_all``, ``kill_group_until_gone`` and the process
    table scan ``group_members``. A name that is gone is skipped (shown "n/a").
    """

    def __init__(self) -> None:
        self.stamps: dict[str, int] = {}
        self.spent: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def reset(self) -> None:
        self.stamps, self.spent, self.calls = {}, {}, {}

    def stamp(self, name: str) -> None:
        self.stamps.setdefault(name, time.time_ns())

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[name] = self.spent.get(name, 0.0) + (time.perf_counter_ns() - t) / MS
                self.calls[name] = self.calls.get(name, 0) + 1

        return wrapper

    def stamped(self, before: str | None, after: str | None, fn: Callable[..., Any]) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if before:
                self.stamp(before)
            try:
                return fn(*args, **kwargs)
            finally:
                if after:
                    self.stamp(after)

        return wrapper

    def by_message(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(actor: Any, message: Any, **kwargs: Any) -> Any:
            self.stamp(type(message).__name__)
            return fn(actor, message, **kwargs)

        return wrapper

    def install(self) -> None:
        """Wrap the exit path's steps (see the class docstring)."""
        wraps: list[tuple[object, str, Callable[[Callable[..., Any]], Any]]] = [
            (handles.ManagedProcess, "_await_exit", lambda f: self.stamped(None, "reaped", f)),
            (instance.InstanceActor, "run", self.by_message),
            (instance.InstanceActor, "_record", lambda f: self.stamped(None, "recorded", f)),
            (
                waiter.WatchedProcess,
                "kill_tree",
                lambda f: self.stamped("kill_tree.start", "kill_tree.end", f),
            ),
            (descendants.Descendants, "track", lambda f: self.timed("descendants.track", f)),
            (descendants.Descendants, "kill_all", lambda f: self.timed("descendants.kill_all", f)),
            # modules that imported a function by name hold their own binding: wrap each
            (tree, "kill_group_until_gone", lambda f: self.timed("kill_group_until_gone", f)),
            (pgroup, "group_members", lambda f: self.timed("group_members (process table)", f)),
            (tree, "group_members", lambda f: self.timed("group_members (process table)", f)),
        ]
        for owner, name, wrap in wraps:
            if hasattr(owner, name):
                setattr(owner, name, wrap(getattr(owner, name)))


def settings(root: Path, launcher: str, registry: Path) -> NodeSettings:
    return bench_settings(
        root,
        registry,
        llamacpp_program=launcher,
        health_interval_s=0.05,
        reconcile_interval_s=1.0,
        stop_grace_s=2.0,
        health_kill_grace_s=1.0,
        restart=RestartPolicy(max_restarts=1_000_000, base_s=0.01, cap_s=0.01, stable_after_s=3600),
    )


def running_with_new_pid(node: Node, iid: str, old: int | None) -> int:
    view = node.wait_for(
        iid, lambda v: v.lifecycle == "running" and v.pid not in (None, old), 30, poll_s=0.01
    )
    assert view.pid is not None
    return view.pid


def wait_dead(fd: int) -> int:
    """Block until the pidfd ``fd`` reports its process gone; time.time_ns() then."""
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll(10_000)
        return time.time_ns()
    finally:
        os.close(fd)


def wait_seen(reader: sqlite3.Connection, iid: str, after: int) -> tuple[int, int, int]:
    """Poll every 1 ms for the exited row after seq ``after``: (seq, ts_ns, seen_ns)."""
    sql = "SELECT seq, ts_ns FROM events WHERE subject = ? AND kind = ? AND seq > ? LIMIT 1"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = reader.execute(sql, (iid, EXITED, after)).fetchone()
        if row is not None:
            return row[0], row[1], time.time_ns()
        time.sleep(0.001)
    raise TimeoutError(f"no {EXITED} for {iid} after seq {after} within 30 s")


def next_ts(reader: sqlite3.Connection, iid: str, seq: int, kind: str = "") -> int:
    """ts_ns of the instance's first event after ``seq`` (of ``kind``, if given);
    waits up to 30 s for it to be appended."""
    sql = "SELECT ts_ns FROM events WHERE subject = ? AND seq > ? AND kind LIKE ? ORDER BY seq"
    deadline = time.monotonic() + 30
    while (row := reader.execute(sql, (iid, seq, kind or "%")).fetchone()) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {kind or 'event'} for {iid} after seq {seq} within 30 s")
        time.sleep(0.001)
    return int(row[0])


def kill_once(
    node: Node, iid: str, pid: int, reader: sqlite3.Connection, after: int, tracer: Tracer
) -> tuple[dict[str, float], int, int]:
    """SIGKILL ``pid`` and time the way to its exited event: (stages in ms, seq, t0)."""
    time.sleep(0.02)  # let the ready probe's follow-up settle
    fd = os.pidfd_open(pid)  # before the kill: the waiter may reap at once
    tracer.reset()
    t0 = time.time_ns()
    os.kill(pid, signal.SIGKILL)
    dead = wait_dead(fd)
    seq, decided, seen = wait_seen(reader, iid, after)
    row = {
        "dead": (dead - t0) / MS,
        "reaped": float("nan"),
        "decided": (decided - t0) / MS,
        "appended": float("nan"),
        "seen": (seen - t0) / MS,
    }
    row.update({k: (v - t0) / MS for k, v in tracer.stamps.items()})
    row["appended"] = row.pop("recorded", float("nan"))
    row.update({f"{k} ms": v for k, v in tracer.spent.items()})
    row.update({f"{k} calls": float(v) for k, v in tracer.calls.items()})
    return row, seq, t0


def kill_rounds(node: Node, iid: str, kills: int, tracer: Tracer) -> list[dict[str, float]]:
    """``kills`` rounds of: kill, time the exit, wait until it runs again (and time that)."""
    uri = Path(node.settings.chain_path).absolute().as_uri() + "?mode=ro"
    reader = sqlite3.connect(uri, uri=True, isolation_level=None)
    rounds: list[dict[str, float]] = []
    after, pid = 0, running_with_new_pid(node, iid, None)
    try:
        for _ in range(kills):
            row, after, t0 = kill_once(node, iid, pid, reader, after, tracer)
            pid = running_with_new_pid(node, iid, pid)
            row["ready"] = (next_ts(reader, iid, after, "instance.ready") - t0) / MS
            rounds.append(row)
    finally:
        reader.close()
    return rounds


def bare_appends(root: Path, count: int) -> list[float]:
    """ms per SqliteChain.append (WAL, synchronous=FULL) on the same file system."""
    payload = encode_payload({"pid": 1234, "exit_code": None, "signal": 9, "reason": "x" * 80})
    times = []
    with SqliteChain.open(root / "bare.db", "bench") as chain:
        for _ in range(count):
            draft = EventDraft(
                ts_ns=time.time_ns(), source="bench", kind=EXITED, subject="i", payload=payload
            )
            t = time.perf_counter_ns()
            chain.append(draft)
            times.append((time.perf_counter_ns() - t) / MS)
    return times


def actor_appends(root: Path, count: int) -> list[float]:
    """ms per ChainWriter ask(Append) round trip (one event per message)."""
    payload = encode_payload({"pid": 1234, "exit_code": None, "signal": 9, "reason": "x" * 80})
    writer = ChainWriter.start(root / "actor.db", "bench")
    times = []
    try:
        for _ in range(count):
            draft = EventDraft(
                ts_ns=time.time_ns(), source="bench", kind=EXITED, subject="i", payload=payload
            )
            t = time.perf_counter_ns()
            writer.ask(m.Append(drafts=(draft,)), block=True, timeout=30)
            times.append((time.perf_counter_ns() - t) / MS)
    finally:
        writer.stop()
    return times


def stats_row(name: str, values: list[float]) -> list[object]:
    good = [v for v in values if v == v]  # drop NaN
    if not good:
        return [name, "n/a", "n/a", "n/a", "n/a"]
    return [name, median(good), percentile(good, 0.99), min(good), max(good)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=100)
    p.add_argument("--appends", type=int, default=200)
    args = p.parse_args()
    tracer = Tracer()
    tracer.install()
    print(f"exit_latency: {args.kills} SIGKILLs, {machine()}, {time.strftime('%Y-%m-%d %H:%M')}")
    with workdir("exit") as root, reaped_children():
        launcher = make_launcher(root, FAKE_LLAMA)
        registry = fake_registry(root)
        t_start = time.monotonic()
        with open_node(settings(root, launcher, registry)) as node:
            node.registry.adopt("tiny", registry / "tiny.gguf")
            spec = InstanceSpec(role="exit", flavor=Flavor.LLAMACPP, model="tiny", port=free_port())
            iid = node.place(spec)
            node.start(iid)
            rounds = kill_rounds(node, iid, args.kills, tracer)
        elapsed = time.monotonic() - t_start
        bare = bare_appends(root, args.appends)
        actor = actor_appends(root, args.appends)
    report(rounds, bare, actor, elapsed)
    report_trace(rounds)


def report(rounds: list[dict[str, float]], bare: list[float], actor: list[float], s: float) -> None:
    col = {k: [r.get(k, float("nan")) for r in rounds] for k in rounds[0]}

    def gap(a: str, b: str) -> list[float]:
        return [r[b] - r[a] for r in rounds]

    print(f"({len(rounds)} kills in {s:.1f} s)\n")
    heads = ["ms", "median", "p99", "min", "max"]
    rows: list[list[object]] = [
        stats_row("kill -> exited ts_ns (decided)", col["decided"]),
        stats_row("kill -> exited durable", col["appended"]),
        stats_row("kill -> seen by a reader", col["seen"]),
        ["split:", "", "", "", ""],
        stats_row("  kill -> gone, seen by the waiter", col["reaped"]),
        stats_row("  gone -> decided (ts_ns)", gap("reaped", "decided")),
        stats_row("  decided -> durable", gap("decided", "appended")),
        stats_row("  (kill -> dead, pidfd in bench)", col["dead"]),
        stats_row("bare SqliteChain.append", bare),
        stats_row("ChainWriter ask(Append)", actor),
        stats_row("kill -> ready again (restart)", col["ready"]),
    ]
    print(table(heads, rows))
    decided, append = median(col["decided"]), median(bare)
    durable = median(col["appended"])
    print(
        f"\nratios (medians, this run): kill->decided / bare append = {decided / append:.1f}x; "
        f"kill->durable / bare append = {durable / append:.1f}x; "
        f"ChainWriter ask / bare append = {median(actor) / append:.2f}x"
    )


def report_trace(rounds: list[dict[str, float]]) -> None:
    """The traced split of reaped -> decided (ms over the kills)."""
    steps = [
        ("reaped", "ProcessExited", "waiter: scan, drain readers; actor gets ProcessExited"),
        ("ProcessExited", "kill_tree.start", "actor decides Reap -> reap thread running"),
        ("kill_tree.start", "kill_tree.end", "kill_tree() pass"),
        ("kill_tree.end", "GroupGone", "GroupGone reaches the actor"),
        ("GroupGone", "decided", "actor: decides and stamps the exited event"),
    ]
    rows: list[list[object]] = []
    for a, b, what in steps:
        rows.append(stats_row(what, [r[b] - r[a] for r in rounds if a in r and b in r]))
    names = sorted({k[: -len(" ms")] for r in rounds for k in r if k.endswith(" ms")})
    for name in names:
        spent = [r.get(f"{name} ms", 0.0) for r in rounds]
        calls = median([r.get(f"{name} calls", 0.0) for r in rounds])
        rows.append(stats_row(f"  {name} (x{calls:g} per kill)", spent))
    print("\ntraced split of reaped -> decided (the x-rows are time spent inside, summed)\n")
    print(table(["ms", "median", "p99", "min", "max"], rows))


if __name__ == "__main__":
    main()
