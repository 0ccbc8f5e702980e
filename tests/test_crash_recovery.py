"""Regression tests for the crash-safety issue: one test per symptom.

Each test reproduces the setup of a symptom the node had before the decision
core was split from its executor, and checks what the node does now. A node
"crash" is in-process: the node's actors are stopped without stopping its
servers (no shutdown, nothing recorded), so the servers outlive it, as after
a SIGKILL of the node; a second node then opens the same data directory with
the same ManualClock. After every scenario the chain verifies and the state
replayed from the chain equals the live actors' state.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import NodeFactory
from support import (
    CRASH_LEAVES_SOCKETS,
    PROGRAMS,
    ChainRow,
    chain_rows,
    listening_owners,
    make_launcher,
    pids_of_group,
    wait_until,
)
from test_misbehaving_servers import (
    PLACED,
    TICK,
    Rig,
    count,
    history,
    listening,
    nothing_left,
    of_kind,
    open_node,
    path_of,
    place,
    restart_at_its_time,
    rig,
    tick_to,
    tick_until,
    wait_kind,
)

from infervisor.actors.boot_facts import owned_beyond
from infervisor.actors.clock import ManualClock
from infervisor.actors.errors import RecordFailed
from infervisor.actors.kinds import KindSettings
from infervisor.actors.node import Node
from infervisor.actors.node_boot import stop_actors
from infervisor.adapters.ports import free_port, listener_snapshot, port_in_use, wide_listeners
from infervisor.chain import SqliteChain, verify_chain
from infervisor.replay import RestartPolicy

FIELDS = ("lifecycle", "desired", "process", "restarts", "reserved_bytes")
POLICY = RestartPolicy(max_restarts=3, base_s=1.0, cap_s=3.0, stable_after_s=30.0)
pytestmark = CRASH_LEAVES_SOCKETS

# ---------------------------------------------------------------- helpers


def crash(node: Node) -> None:
    """End the node's actors as a SIGKILL would: servers keep running, nothing recorded."""
    stop_actors(node._actors)


def reopen(nodes: NodeFactory, node: Node, clock: ManualClock, iid: str, port: int) -> Rig:
    """A new node on the crashed node's data directory and clock, once its boot of
    ``iid`` is decided (a status ask queues behind the boot the host told it)."""
    b = Rig(nodes.open(node.settings, clock), clock, iid, port)
    b.status()
    return b


def projection(inst: Any) -> dict[str, Any]:
    return {f: getattr(inst, f) for f in FIELDS}


def consistent(node: Node) -> None:
    """The chain verifies, and replay equals the live state of every instance."""
    report = verify_chain(node.settings.chain_path)
    assert report.ok, report.problem

    def same() -> bool:
        live = {iid: projection(s) for iid, s in node.live_states().items()}
        replayed = node.rebuild().instances
        return all(iid in replayed and projection(replayed[iid]) == p for iid, p in live.items())

    wait_until(same, 20, "replay to equal the live state")


def server_pid(r: Rig) -> int:
    pid = r.status().pid
    assert pid is not None
    return pid


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def fail_appends_of(monkeypatch: pytest.MonkeyPatch, kind: str, *, keep_before: bool) -> list[int]:
    """Make the chain's next ``append_many`` holding a ``kind`` draft raise (once).

    With ``keep_before`` the drafts before it are stored first (durable), as when
    the node dies between two of its events. Returns a list that counts failures.
    """
    original = SqliteChain.append_many
    failed: list[int] = []

    def append_many(self: SqliteChain, drafts: Any) -> Any:
        drafts = list(drafts)
        kinds = [d.kind for d in drafts]
        if not failed and kind in kinds:
            failed.append(1)
            if keep_before and kinds.index(kind) > 0:
                original(self, drafts[: kinds.index(kind)])
            raise OSError(f"injected: cannot record {kind}")
        return original(self, drafts)

    monkeypatch.setattr(SqliteChain, "append_many", append_many)
    return failed


def ticks(r: Rig, seconds: float) -> None:
    """Advance the clock ``seconds`` one health interval at a time, each once settled."""
    end = r.clock.wall_ns() + int(seconds * 1e9)
    tick_until(r.node, r.clock, r.iid, lambda: r.clock.wall_ns() >= end, f"{seconds} s")


def tick_until_seen(r: Rig, kind: str) -> None:
    """Advance a health interval at a time (when settled) until an event of ``kind`` is
    recorded; it is seen at once, even while a termination is in flight."""

    def step() -> bool:
        if count(r.node, r.iid, kind):
            return True
        if r.node.settled(r.iid):
            r.clock.advance(r.node.settings.health_interval_s)
        return False

    wait_until(step, 60, f"instance.{kind}")  # a bound on a hang, at load 10


def fast_kinds(**fields: Any) -> dict[str, KindSettings]:
    return {"inference": KindSettings(**fields), "process": KindSettings(**fields)}


# ---------------------------------------------------------------- 1. kill in flight


# The node really dies here: `infervisor run` as a process, SIGKILLed (it alone,
# by pid) while a health kill is in flight, so no thread of the dead node can
# finish the kill for it. The server ignores SIGTERM and lives on under its shim.
HEALTH_KILL_GRACE_S = 4.0  # long enough to SIGKILL the node while the kill is in flight
KILL_MARGIN_S = 10.0
RUN_DEADLINE_S = 60.0  # a node boot at load 10 can take 20 s
INFERVISOR = Path(sys.executable).parent / "infervisor"
IN_FLIGHT = "instance.terminating"  # recorded when the health kill is decided


def write_hung_config(tmp_path: Path, port: int) -> Path:
    """Node n1 on tmp_path/data: one llamacpp instance of fault_ignore_term.py on ``port``."""
    program = make_launcher(tmp_path, PROGRAMS / "fault_ignore_term.py")
    models = tmp_path / "data" / "models"
    models.mkdir(parents=True)
    # A readable GGUF header (version 3, no tensors, no metadata); the fake never reads it.
    (models / "tiny.gguf").write_bytes(struct.pack("<4sIQQ", b"GGUF", 3, 0, 0))
    config = tmp_path / "node.toml"
    config.write_text(
        f"""
[node]
node_id = "n1"
data_dir = "data"
llamacpp_program = {json.dumps(program)}
health_interval_s = 0.1
miss_limit = 2
reconcile_interval_s = 0.5
stop_grace_s = 2.0
health_kill_grace_s = {HEALTH_KILL_GRACE_S}

[node.restart]
max_restarts = 3
base_s = 1.0
cap_s = 3.0
stable_after_s = 30.0

[[models]]
name = "tiny"
path = "tiny.gguf"

[[instances]]
role = "chat"
flavor = "llamacpp"
model = "tiny"
port = {port}
"""
    )
    return config


def start_run(config: Path, log: Path) -> subprocess.Popen[bytes]:
    """``infervisor run CONFIG`` in a session of its own (ended by group in teardown)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(INFERVISOR), "run", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def run_until(
    proc: subprocess.Popen[bytes], db: Path, log: Path, what: str, predicate: Any, timeout: float
) -> Any:
    """Poll ``predicate`` while the node lives; fail with its output and the chain otherwise."""

    def check() -> Any:
        if proc.poll() is not None:
            pytest.fail(f"infervisor run exited {proc.returncode} waiting for {what}")
        return predicate()

    try:
        return wait_until(check, timeout, what)
    except pytest.fail.Exception as e:
        kinds = [f"{r[0]}:{r[2]}" for r in chain_rows(db)]
        raise pytest.fail.Exception(f"{e}\nchain: {kinds}\noutput:\n{log.read_text()}") from None


def first_after(db: Path, iid: str, kind: str, after: int) -> ChainRow | None:
    return next((r for r in chain_rows(db) if r[2] == kind and r[3] == iid and r[0] > after), None)


def test_boot_resumes_a_health_kill_that_was_in_flight(tmp_path: Path) -> None:
    port = wait_until(lambda: (p := free_port()) and p, 5, "a free port")
    config = write_hung_config(tmp_path, port)
    db = tmp_path / "data" / "chain.db"
    runs: list[subprocess.Popen[bytes]] = []
    try:
        log1 = tmp_path / "run-1.log"
        first = start_run(config, log1)
        runs.append(first)
        ready = run_until(
            first,
            db,
            log1,
            "instance.ready",
            lambda: next((r for r in chain_rows(db) if r[2] == "instance.ready"), None),
            RUN_DEADLINE_S,
        )
        iid = ready[3]
        hung = [r[4]["pid"] for r in chain_rows(db) if r[2] == "instance.spawned"][-1]
        assert alive(hung)
        (tmp_path / "data" / "instances" / iid / "health").write_text("fail")
        in_flight = run_until(
            first,
            db,
            log1,
            f"{IN_FLIGHT} (the health kill decided)",
            lambda: first_after(db, iid, IN_FLIGHT, -1),
            RUN_DEADLINE_S,
        )
        os.kill(first.pid, signal.SIGKILL)  # the node only: the server lives on under its shim
        first.wait(timeout=RUN_DEADLINE_S)
        assert first_after(db, iid, "instance.unhealthy", -1) is not None
        assert first_after(db, iid, "instance.exited", -1) is None
        assert alive(hung), "the hung server died with the node"

        log2 = tmp_path / "run-2.log"
        second = start_run(config, log2)
        runs.append(second)
        due_s = in_flight[1] / 1e9 + HEALTH_KILL_GRACE_S
        run_until(
            second,
            db,
            log2,
            f"the hung server {hung} to be killed",
            lambda: not alive(hung),
            max(0.0, due_s - time.time()) + KILL_MARGIN_S,
        )
        exited = run_until(
            second,
            db,
            log2,
            "instance.exited of the hung server",
            lambda: first_after(db, iid, "instance.exited", in_flight[0]),
            KILL_MARGIN_S,
        )
        assert exited[4]["pid"] == hung
        assert exited[4]["signal"] == signal.SIGKILL
        assert exited[4]["reason"].startswith("killed:"), exited[4]
        (tmp_path / "data" / "instances" / iid / "health").write_text("ok")
        scheduled = run_until(
            second,
            db,
            log2,
            "instance.restart_scheduled",
            lambda: first_after(db, iid, "instance.restart_scheduled", exited[0]),
            RUN_DEADLINE_S,
        )
        starting = run_until(
            second,
            db,
            log2,
            "a new instance.starting",
            lambda: first_after(db, iid, "instance.starting", scheduled[0]),
            RUN_DEADLINE_S,
        )
        run_until(
            second,
            db,
            log2,
            "the restarted server ready",
            lambda: first_after(db, iid, "instance.ready", starting[0]),
            RUN_DEADLINE_S,
        )
        respawned = first_after(db, iid, "instance.spawned", starting[0])
        assert respawned is not None and respawned[4]["pid"] != hung

        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=RUN_DEADLINE_S) == 0, log2.read_text()
        assert "Traceback" not in log2.read_text()
        for r in chain_rows(db):
            if r[2] == "instance.spawned":
                wait_until(
                    lambda g=r[4]["pgid"]: pids_of_group(g) == [], 10, f"group {r[4]['pgid']} gone"
                )
        assert verify_chain(db).ok
    finally:
        for proc in runs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for r in chain_rows(db):
            if r[2] == "instance.spawned" and pids_of_group(r[4]["pgid"]):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(r[4]["pgid"], signal.SIGKILL)


# ---------------------------------------------------------------- 2. backoff across a restart


def test_boot_during_a_backoff_waits_for_the_recorded_due_time(
    nodes, tmp_path, fake_model, manual_clock
):
    r = rig(nodes, tmp_path, fake_model, manual_clock, "fake_llama.py", restart=POLICY)
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")
    os.kill(server_pid(r), signal.SIGKILL)
    wait_until(lambda: r.status().lifecycle == "restarting", 20, "restarting")
    scheduled = of_kind(history(r.node, r.iid), "restart_scheduled")[0]
    assert scheduled.event.delay_s == POLICY.base_s
    crash(r.node)

    b = reopen(nodes, r.node, manual_clock, r.iid, r.port)
    assert b.status().lifecycle == "restarting"
    assert count(b.node, b.iid, "starting") == 1  # not relaunched at boot
    restart_at_its_time(b, POLICY.base_s, starts_before=1)
    started = of_kind(history(b.node, b.iid), "starting")[-1]
    assert started.ts_ns - scheduled.ts_ns == int(POLICY.base_s * 1e9)
    listening(b.port)
    tick_to(b, "running")
    b.node.stop(b.iid)
    consistent(b.node)
    nothing_left(b.node)


# ---------------------------------------------------------------- 3, 4. one-shot runs


def one_shot(nodes, tmp_path, fake_model, clock, script: str, *extra: str) -> Rig:
    return rig(
        nodes,
        tmp_path,
        fake_model,
        clock,
        script,
        *extra,
        spec={"kind": "process", "continuous": False},
        restart=RestartPolicy(max_restarts=1, base_s=1.0, cap_s=3.0),
    )


def test_one_shot_exit_recorded_without_finished_is_finished_at_boot(
    nodes, tmp_path, fake_model, manual_clock, monkeypatch
):
    r = one_shot(nodes, tmp_path, fake_model, manual_clock, "fault_oneshot.py", "--code", "0")
    failed = fail_appends_of(monkeypatch, "instance.finished", keep_before=True)
    r.node.start(r.iid)
    wait_until(lambda: failed, 20, "the exit to be recorded")
    crash(r.node)  # instance.exited (code 0) is durable, instance.finished is not
    monkeypatch.undo()
    assert path_of(history(r.node, r.iid))[-1] == ("exited", "running", "exited")

    b = reopen(nodes, r.node, manual_clock, r.iid, r.port)
    wait_until(lambda: b.status().lifecycle == "finished", 20, "finished")
    manual_clock.advance(30.0)  # every backoff, health and reconcile tick that could restart it
    wait_until(lambda: b.node.settled(b.iid), 20, "settled")
    view = b.status()
    assert (view.lifecycle, view.desired) == ("finished", "stopped")
    steps = history(b.node, b.iid)
    assert count(b.node, b.iid, "starting") == 1
    assert path_of(steps)[-2:] == [
        ("exited", "running", "exited"),
        ("finished", "exited", "finished"),
    ]
    consistent(b.node)
    nothing_left(b.node)


def test_one_shot_that_exits_0_while_the_node_is_down_is_finished_not_rerun(
    nodes, tmp_path, fake_model, manual_clock
):
    r = one_shot(nodes, tmp_path, fake_model, manual_clock, "regress_exit_on_file.py")
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")
    pid = server_pid(r)
    crash(r.node)
    (r.workdir / "exit-now").touch()
    wait_until(lambda: not alive(pid), 20, "the one-shot to exit")
    launch = r.workdir / "launch"
    wait_until(lambda: list(launch.glob("*.exit.json")), 20, "the shim's exit file")

    b = reopen(nodes, r.node, manual_clock, r.iid, r.port)
    wait_until(lambda: b.status().lifecycle == "finished", 20, "finished")
    manual_clock.advance(30.0)
    wait_until(lambda: b.node.settled(b.iid), 20, "settled")
    assert b.status().lifecycle == "finished"
    steps = history(b.node, b.iid)
    assert count(b.node, b.iid, "starting") == 1  # it ran once, ever
    assert path_of(steps)[-2:] == [
        ("exited", "running", "exited"),
        ("finished", "exited", "finished"),
    ]
    assert of_kind(steps, "exited")[0].event.exit_code == 0
    consistent(b.node)
    nothing_left(b.node)


# ---------------------------------------------------------------- 5. killed before spawned


def test_launch_interrupted_before_spawned_is_recognised_by_its_token(
    nodes, tmp_path, fake_model, manual_clock, monkeypatch
):
    r = rig(nodes, tmp_path, fake_model, manual_clock, "fake_llama.py", restart=POLICY)
    failed = fail_appends_of(monkeypatch, "instance.spawned", keep_before=False)
    with contextlib.suppress(RecordFailed):  # the start may hear the spawn was not recorded
        r.node.start(r.iid)
    wait_until(lambda: failed, 20, "the spawn to be refused by the chain")
    listening(r.port)  # the server runs, untracked by the chain
    crash(r.node)
    monkeypatch.undo()
    assert path_of(history(r.node, r.iid)) == [PLACED, ("starting", "loaded", "starting")]
    token = r.node.rebuild().instances[r.iid].launch_token
    assert token
    record = r.workdir / "launch" / f"{token}.json"
    assert record.exists()

    b = reopen(nodes, r.node, manual_clock, r.iid, r.port)
    b.status()  # asked after the boot was told: answered once the boot is decided
    steps = history(b.node, b.iid)
    assert [s.kind.removeprefix("instance.") for s in steps][-2:] == ["spawned", "reattached"]
    recovered = of_kind(steps, "spawned")[0].event
    pid = server_pid(b)
    assert recovered.pid == pid
    assert json.loads(record.read_text())["pid"] == pid  # the shim's launch record
    tick_to(b, "running")
    assert count(b.node, b.iid, "starting") == 1  # nothing launched a second server
    assert listening_owners(b.port) == [pid]
    b.node.stop(b.iid)
    assert not alive(pid)
    assert not port_in_use("127.0.0.1", b.port)
    assert b.status().lifecycle == "stopped"
    consistent(b.node)
    nothing_left(b.node)


# ---------------------------------------------------------------- 6. port taken at restart


@pytest.fixture
def holder() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    yield held
    for s in held:
        s.close()


def test_restart_refused_for_a_taken_port_spends_no_attempt(
    nodes, tmp_path, fake_model, manual_clock, holder
):
    r = rig(nodes, tmp_path, fake_model, manual_clock, "fake_llama.py", restart=POLICY)
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")
    pid = server_pid(r)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: r.status().lifecycle == "restarting", 20, "restarting")
    wait_until(lambda: not port_in_use("127.0.0.1", r.port), 20, "the port to be free")
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", r.port))
    squatter.listen()
    holder.append(squatter)

    manual_clock.advance(POLICY.base_s)
    wait_kind(r.node, r.iid, "start_refused", 1)
    ticks(r, 4 * (POLICY.max_restarts + 1) * POLICY.cap_s)  # every attempt the budget has
    view = r.status()
    assert view.lifecycle == "restarting"
    assert view.restarts == 1
    assert count(r.node, r.iid, "start_refused") == 1  # recorded once
    assert count(r.node, r.iid, "failed") == 0
    assert count(r.node, r.iid, "starting") == 1

    squatter.close()
    tick_until(
        r.node, manual_clock, r.iid, lambda: count(r.node, r.iid, "starting") == 2, "a start"
    )
    listening(r.port)
    tick_to(r, "running")
    assert r.status().restarts == 1
    r.node.stop(r.iid)
    consistent(r.node)
    nothing_left(r.node)


# ---------------------------------------------------------------- 7. process kind stability


def test_process_kind_clears_its_restart_count_after_stable_after(
    nodes, tmp_path, fake_model, manual_clock
):
    policy = RestartPolicy(max_restarts=3, base_s=1.0, cap_s=3.0, stable_after_s=5.0)
    r = rig(
        nodes,
        tmp_path,
        fake_model,
        manual_clock,
        "fake_llama.py",
        spec={"kind": "process"},
        restart=policy,
    )
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")
    os.kill(server_pid(r), signal.SIGKILL)
    wait_until(lambda: r.status().lifecycle == "restarting", 20, "restarting")
    manual_clock.advance(policy.base_s)
    listening(r.port)
    tick_to(r, "running")
    assert r.status().restarts == 1
    tick_until(r.node, manual_clock, r.iid, lambda: count(r.node, r.iid, "stable"), "stable")
    assert r.status().restarts == 0
    stable = of_kind(history(r.node, r.iid), "stable")[0]
    assert stable.event.uptime_s >= policy.stable_after_s
    r.node.stop(r.iid)
    consistent(r.node)
    nothing_left(r.node)


# ---------------------------------------------------------------- 8. exposure by owner


@pytest.fixture
def foreign() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(20)
        if p.stdout is not None:
            p.stdout.close()


def listen_foreign(procs: list[subprocess.Popen[str]], host: str, port: int) -> int:
    p = subprocess.Popen(
        [sys.executable, str(PROGRAMS / "owner_listen.py"), host, str(port)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    procs.append(p)
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.startswith("listening "), line
    return int(line.split()[1])


def test_another_programs_wide_listener_on_our_port_does_not_stop_our_server(
    nodes, tmp_path, fake_model, manual_clock, foreign
):
    r = rig(nodes, tmp_path, fake_model, manual_clock, "regress_reuseport_llama.py")
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")
    ours = server_pid(r)
    other = listen_foreign(foreign, "0.0.0.0", r.port)
    assert r.port in wide_listeners()  # the node's scan sees a wide listener on our port
    assert other != ours
    ticks(r, 5 * r.node.settings.reconcile_interval_s + 1.0)  # several reconcile ticks
    view = r.status()
    assert (view.lifecycle, view.desired) == ("running", "running")
    assert server_pid(r) == ours
    assert alive(ours)
    assert alive(other)
    assert count(r.node, r.iid, "stop_requested") == 0
    assert r.node.rebuild().instances[r.iid].exposed == ()

    # What the reconcile asks of the socket table: none of the wide listeners is ours.
    actor = r.node._routes.current.lookup(r.iid).proxy()
    adapter, state, runner = actor.adapter.get(), actor.state.get(), actor.effects.get()
    snapshot = listener_snapshot()
    assert [li.pid for li in snapshot.beyond_loopback(r.port)] == [other]
    assert owned_beyond(adapter, state, runner, snapshot) == ()
    r.node.stop(r.iid)
    consistent(r.node)
    nothing_left(r.node)


# ---------------------------------------------------------------- 9. concurrent restarts


def test_concurrent_restarts_coalesce_into_one(nodes, tmp_path, fake_model, manual_clock):
    r = rig(
        nodes,
        tmp_path,
        fake_model,
        manual_clock,
        "fault_ignore_term.py",
        restart=POLICY,
        stop_grace_s=1.0,
    )
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")
    gate = threading.Barrier(10)

    def restart() -> Any:
        gate.wait()
        return r.node.restart(r.iid)

    with ThreadPoolExecutor(10) as pool:
        futures = [pool.submit(restart) for _ in range(10)]

        def done() -> bool:
            if all(f.done() for f in futures):
                return True
            if r.node.settled(r.iid):
                manual_clock.advance(TICK)
            return False

        wait_until(done, 40, "all ten restarts to answer")
        for f in futures:
            f.result()
    steps = history(r.node, r.iid)
    stops = of_kind(steps, "stop_requested")
    assert len(stops) == 1
    assert stops[0].event.then == "restart"
    assert len(of_kind(steps, "starting")) == 2  # the first start and one restart
    listening(r.port)
    tick_to(r, "running")
    r.node.stop(r.iid)
    consistent(r.node)
    nothing_left(r.node)


# ---------------------------------------------------------------- 10. stop during a health kill


def test_stop_during_a_health_kill_records_the_operator_as_cause(
    nodes, tmp_path, fake_model, manual_clock
):
    r = rig(
        nodes,
        tmp_path,
        fake_model,
        manual_clock,
        "fault_ignore_term.py",
        restart=POLICY,
        health_kill_grace_s=30.0,
        stop_grace_s=0.5,
        kinds=fast_kinds(miss_limit=2),
    )
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")
    (r.workdir / "health").write_text("fail")
    tick_until_seen(r, "terminating")
    view = r.node.stop(r.iid)
    assert (view.lifecycle, view.desired) == ("stopped", "stopped")
    manual_clock.advance(10.0)
    wait_until(lambda: r.node.settled(r.iid), 20, "settled")
    steps = history(r.node, r.iid)
    exited = of_kind(steps, "exited")
    assert len(exited) == 1
    assert exited[0].event.reason.startswith("stopped by operator")
    assert count(r.node, r.iid, "restart_scheduled") == 0
    assert count(r.node, r.iid, "starting") == 1
    assert r.status().lifecycle == "stopped"
    consistent(r.node)
    nothing_left(r.node)


# ---------------------------------------------------------------- 11. append failure


def test_an_append_failure_runs_no_effect(nodes, tmp_path, fake_model, manual_clock, monkeypatch):
    r = rig(nodes, tmp_path, fake_model, manual_clock, "fake_llama.py", restart=POLICY)
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")
    pid = server_pid(r)
    fail_appends_of(monkeypatch, "instance.stop_requested", keep_before=False)
    with pytest.raises(RecordFailed):
        r.node.stop(r.iid)
    view = r.status()
    assert (view.lifecycle, view.desired, view.pid) == ("running", "running", pid)
    assert "fault" in view.reason
    assert alive(pid)
    assert port_in_use("127.0.0.1", r.port)
    assert count(r.node, r.iid, "stop_requested") == 0
    consistent(r.node)

    monkeypatch.undo()
    view = r.node.stop(r.iid)
    assert view.lifecycle == "stopped"
    assert not alive(pid)
    assert "fault" not in r.status().reason
    consistent(r.node)
    nothing_left(r.node)


# ---------------------------------------------------------------- 12. memory reservations


def test_memory_reservation_is_replayed_and_survives_a_node_restart(
    nodes, tmp_path, fake_model, manual_clock
):
    program = make_launcher(tmp_path, PROGRAMS / "fake_llama.py")
    node = open_node(
        nodes,
        fake_model,
        manual_clock,
        program,
        restart=POLICY,
        memory_budget_bytes=10**9,
        reserve_overhead_bytes=1000,
    )
    iid, port = place(node)
    node.start(iid)
    listening(port)
    r = Rig(node, manual_clock, iid, port)
    tick_to(r, "running")
    reserved = r.status().reserved_bytes
    assert reserved > 0
    assert node.rebuild().instances[iid].reserved_bytes == reserved
    ledger = node.ledger()
    assert ledger is not None
    assert ledger.reservations == {iid: reserved}
    consistent(node)
    crash(node)

    b = reopen(nodes, node, manual_clock, iid, port)
    assert b.status().reserved_bytes == reserved
    assert b.node.rebuild().instances[iid].reserved_bytes == reserved
    ledger = b.node.ledger()
    assert ledger is not None
    assert ledger.reservations == {iid: reserved}
    assert ledger.in_use_bytes == reserved
    consistent(b.node)
    b.node.stop(iid)
    assert b.node.ledger().reservations == {}
    consistent(b.node)
    nothing_left(b.node)
