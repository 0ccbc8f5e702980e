"""Fault injection: model servers that misbehave, supervised by a real node.

Every server here is a real process (tests/programs/fault_*.py, fake_llama.py,
exit_at_once.py, all taking llama-server's flags) and time is a ManualClock:
health ticks, backoff timers and the startup allowance move only when a test
advances the clock, so durations are checked on the events' timestamps (which
come from that clock), never on wall time. Each test asserts the exact
lifecycle path the chain records, as (event kind, from, to) triples.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import NodeFactory
from support import PROGRAMS, make_launcher, pids_of_group, wait_until

from infervisor.actors.clock import ManualClock
from infervisor.actors.kinds import KindSettings
from infervisor.actors.node import Node
from infervisor.adapters.errors import AdmissionRefused, ProbeError
from infervisor.adapters.ports import free_port, port_in_use
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.chain import SqliteChain
from infervisor.replay import RestartPolicy, timeline
from infervisor.replay import events as ev
from infervisor.replay.audit import audit_chain

TICK = 0.5  # health interval (s, manual clock)
EPS = 1 / 64  # exact in binary, so delay - EPS + EPS lands on the timer's due time
NS = 1_000_000_000
POLICY = RestartPolicy(max_restarts=3, base_s=1.0, cap_s=3.0, stable_after_s=30.0)


@pytest.fixture(autouse=True)
def _audited(tmp_path: Path) -> Any:
    """After each scenario (its nodes shut down), `infervisor audit` finds nothing in its chain.

    Autouse and independent of `nodes`, so it is torn down after the nodes are.
    """
    yield
    chain = tmp_path / "data" / "chain.db"
    if chain.exists():
        report = audit_chain(chain)  # tests set their own budgets: only the chain's rules
        assert report.verify.ok, report.verify
        assert report.findings == [], report.findings


# ---------------------------------------------------------------- the recorded path


@dataclass(frozen=True)
class Step:
    """One event of an instance: its kind, the lifecycle before and after, its time."""

    kind: str
    frm: str
    to: str
    ts_ns: int
    reason: str
    event: Any


def history(node: Node, iid: str) -> list[Step]:
    """The instance's timeline, each entry with its decoded event."""
    entries = timeline(node.settings.chain_path, iid)
    with SqliteChain.open_readonly(node.settings.chain_path) as chain:
        decoded = {s.seq: ev.decode_event(s) for s in chain.events(subject=iid)}
    return [Step(e.kind, e.frm, e.to, e.ts_ns, e.reason, decoded[e.seq]) for e in entries]


def path_of(steps: list[Step]) -> list[tuple[str, str, str]]:
    return [(s.kind.removeprefix("instance."), s.frm, s.to) for s in steps]


def count(node: Node, iid: str, kind: str) -> int:
    return sum(1 for s in history(node, iid) if s.kind == f"instance.{kind}")


def of_kind(steps: list[Step], kind: str) -> list[Step]:
    return [s for s in steps if s.kind == f"instance.{kind}"]


PLACED = ("placed", "-", "loaded")
START = [("starting", "loaded", "starting"), ("spawned", "starting", "starting")]
RESTART = [("starting", "restarting", "starting"), ("spawned", "starting", "starting")]
READY = ("ready", "starting", "running")
STOP = [("stop_requested", "running", "stopping"), ("exited", "stopping", "stopped")]
#: A health kill: recorded (SIGTERM sent, SIGKILL due after the grace) before the exit.
KILLED = [("terminating", "unhealthy", "unhealthy"), ("exited", "unhealthy", "exited")]


def scheduled_then_started(steps: list[Step]) -> list[tuple[float, float]]:
    """(delay_s recorded, seconds until the next instance.starting) for every restart."""
    out = []
    for i, s in enumerate(steps):
        if s.kind == "instance.restart_scheduled":
            nxt = next(t for t in steps[i + 1 :] if t.kind == "instance.starting")
            out.append((s.event.delay_s, (nxt.ts_ns - s.ts_ns) / NS))
    return out


# ---------------------------------------------------------------- rig


@dataclass
class Rig:
    node: Node
    clock: ManualClock
    iid: str
    port: int

    @property
    def workdir(self) -> Path:
        return workdir(self.node, self.iid)

    def status(self) -> Any:
        return self.node.status(self.iid)


def workdir(node: Node, iid: str) -> Path:
    path = Path(node.settings.data_dir) / "instances" / iid
    path.mkdir(parents=True, exist_ok=True)
    return path


def open_node(
    nodes: NodeFactory,
    fake_model: Path,
    clock: ManualClock,
    program: str,
    **settings: Any,
) -> Node:
    fields: dict[str, Any] = {"health_interval_s": TICK, "restart": POLICY}
    fields.update(settings)
    node = nodes.open(nodes.settings(program, fake_model, **fields), clock)
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    return node


def place(node: Node, role: str = "chat", **spec: Any) -> tuple[str, int]:
    port = free_port()
    fields: dict[str, Any] = {"role": role, "flavor": Flavor.LLAMACPP, "model": "tiny"}
    fields.update(spec)
    return node.place(InstanceSpec(port=port, **fields)), port


def rig(
    nodes: NodeFactory,
    tmp_path: Path,
    fake_model: Path,
    clock: ManualClock,
    script: str,
    *extra: str,
    spec: dict[str, Any] | None = None,
    **settings: Any,
) -> Rig:
    program = make_launcher(tmp_path, PROGRAMS / script, *extra)
    node = open_node(nodes, fake_model, clock, program, **settings)
    iid, port = place(node, **(spec or {}))
    return Rig(node, clock, iid, port)


# ---------------------------------------------------------------- driving the clock


def tick_until(node: Node, clock: ManualClock, iid: str, done: Callable[[], Any], what: str) -> Any:
    """Advance one health interval at a time, each once the instance is settled,
    until ``done()`` holds (checked only while settled)."""

    def step() -> Any:
        if node.settled(iid):
            value = done()
            if value:
                return value
            clock.advance(node.settings.health_interval_s)
        return None

    try:
        return wait_until(step, 60, what)  # a bound on a hang: many steps at load 10
    except pytest.fail.Exception as stuck:  # say where it stuck: the timeline
        steps = [(s.kind, s.frm, s.to, s.reason) for s in history(node, iid)]
        pytest.fail(f"{stuck}; the instance's timeline: {steps}")


def tick_to(r: Rig, lifecycle: str) -> None:
    tick_until(r.node, r.clock, r.iid, lambda: r.status().lifecycle == lifecycle, lifecycle)


def listening(port: int) -> None:
    """Wait (real time) until the server listens, so no probe finds it not yet listening."""
    wait_until(lambda: port_in_use("127.0.0.1", port), 20, f"a listener on {port}")


def wait_kind(node: Node, iid: str, kind: str, n: int) -> None:
    wait_until(lambda: count(node, iid, kind) >= n, 20, f"{n} x instance.{kind}")


def restart_at_its_time(r: Rig, delay: float, starts_before: int) -> None:
    """With a restart scheduled ``delay`` s ago (clock standing still since),
    check it does not happen before its time, then does at it."""
    wait_until(lambda: r.status().lifecycle == "restarting", 20, "restarting")
    r.clock.advance(delay - EPS)
    assert r.status().lifecycle == "restarting"  # the ask follows any restart told before it
    assert count(r.node, r.iid, "starting") == starts_before
    r.clock.advance(EPS)
    wait_kind(r.node, r.iid, "starting", starts_before + 1)


def probe_in_flight(node: Node, clock: ManualClock, iid: str) -> None:
    """Advance a health interval at a time until a probe (or a kill) is in flight."""

    def in_flight() -> bool:
        if not node.settled(iid):
            return True
        clock.advance(node.settings.health_interval_s)
        return False

    wait_until(in_flight, 20, f"a probe of {iid} in flight")


def elapsed_since(clock: ManualClock, step: Step) -> float:
    return (clock.wall_ns() - step.ts_ns) / NS


# ---------------------------------------------------------------- leftovers


def nothing_left(node: Node) -> None:
    """No member of any process group this node ever spawned is alive."""
    with SqliteChain.open_readonly(node.settings.chain_path) as chain:
        spawned = [ev.decode_event(s) for s in chain.events(kinds=["instance.spawned"])]
    assert spawned
    for event in spawned:
        assert isinstance(event, ev.Spawned)
        wait_until(lambda e=event: pids_of_group(e.pgid) == [], 10, f"group {event.pgid} gone")


def identity(pid: int) -> tuple[int, float]:
    return pid, psutil.Process(pid).create_time()


def gone(who: tuple[int, float]) -> bool:
    pid, started = who
    try:
        proc = psutil.Process(pid)
        return proc.create_time() != started or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def eventually(predicate: Callable[[], bool], timeout: float) -> bool:
    """Like wait_until, but answers False instead of failing the test."""
    try:
        wait_until(predicate, timeout)
    except pytest.fail.Exception:
        return False
    return True


def read_int(path: Path) -> int:
    wait_until(path.exists, 20, f"{path.name}")
    return int(path.read_text())


# ================================================================ crash at once


def test_crash_at_start_backs_off_then_fails(nodes, tmp_path, fake_model, manual_clock):
    policy = RestartPolicy(max_restarts=4, base_s=1.0, cap_s=3.0, stable_after_s=30.0)
    r = rig(nodes, tmp_path, fake_model, manual_clock, "exit_at_once.py", restart=policy)
    r.node.start(r.iid)
    delays = [1.0, 2.0, 3.0, 3.0]  # min(base * 2**n, cap)
    for n, delay in enumerate(delays):
        wait_kind(r.node, r.iid, "restart_scheduled", n + 1)
        restart_at_its_time(r, delay, starts_before=n + 1)
    wait_until(lambda: r.status().lifecycle == "failed", 20, "failed")

    steps = history(r.node, r.iid)
    crash = [("exited", "starting", "exited")]
    backoff = [("restart_scheduled", "exited", "restarting")]
    expected = [PLACED, *START, *crash, *backoff]
    for _ in range(3):
        expected += [*RESTART, *crash, *backoff]
    expected += [*RESTART, *crash, ("failed", "exited", "failed")]
    assert path_of(steps) == expected
    assert scheduled_then_started(steps) == [(d, d) for d in delays]
    assert [s.event.attempt for s in of_kind(steps, "restart_scheduled")] == [1, 2, 3, 4]
    for exited in of_kind(steps, "exited"):
        assert exited.event.exit_code == 3
        assert "injected start failure" in exited.event.output_tail
    failed = r.status()
    assert failed.restarts == policy.max_restarts
    assert of_kind(steps, "failed")[0].event.attempts == policy.max_restarts
    assert failed.reason.startswith("restart budget spent (4 restarts)")
    assert failed.desired == "stopped"
    assert failed.pid is None
    nothing_left(r.node)


def test_missing_launcher_is_refused_at_admission_and_recorded_for_the_audit(
    nodes, tmp_path, fake_model, manual_clock
):
    missing = str(tmp_path / "no-such-llama-server")
    node = open_node(nodes, fake_model, manual_clock, missing)
    head = node.rebuild().head_seq
    with pytest.raises(AdmissionRefused, match=r"serve program .*no-such-llama-server is not exec"):
        place(node)
    # The node's own condition (issue 11): one node.admission_refused, no instance placed.
    assert node.rebuild().head_seq == head + 1
    assert node.rebuild().instances == {}
    assert node.list() == []


# ================================================================ answers once, then dies


def test_answering_once_then_dying_is_a_restart_loop_that_fails(
    nodes, tmp_path, fake_model, manual_clock
):
    r = rig(nodes, tmp_path, fake_model, manual_clock, "fault_answer_once.py")
    r.node.start(r.iid)
    delays = [1.0, 2.0, 3.0]  # base, 2 x base, then the cap
    for n, delay in enumerate(delays):
        listening(r.port)
        tick_until(r.node, r.clock, r.iid, lambda n=n: count(r.node, r.iid, "ready") > n, "ready")
        wait_kind(r.node, r.iid, "restart_scheduled", n + 1)  # it dies a second later
        restart_at_its_time(r, delay, starts_before=n + 1)
    listening(r.port)
    tick_until(r.node, r.clock, r.iid, lambda: count(r.node, r.iid, "ready") == 4, "ready")
    wait_until(lambda: r.status().lifecycle == "failed", 20, "failed")

    steps = history(r.node, r.iid)
    run = [READY, ("exited", "running", "exited")]
    backoff = [("restart_scheduled", "exited", "restarting")]
    expected = [PLACED, *START, *run, *backoff]
    for _ in range(2):
        expected += [*RESTART, *run, *backoff]
    expected += [*RESTART, *run, ("failed", "exited", "failed")]
    assert path_of(steps) == expected
    assert scheduled_then_started(steps) == [(d, d) for d in delays]
    assert of_kind(steps, "stable") == []  # it answered, but never stayed up
    assert all(s.event.exit_code == 1 for s in of_kind(steps, "exited"))
    assert r.status().restarts == POLICY.max_restarts
    nothing_left(r.node)


def test_a_stable_run_clears_the_count_and_the_next_failure_starts_over(
    nodes, tmp_path, fake_model, manual_clock
):
    policy = RestartPolicy(max_restarts=3, base_s=1.0, cap_s=60.0, stable_after_s=5.0)
    r = rig(
        nodes, tmp_path, fake_model, manual_clock, "fault_flap.py", "--crashes", "2", restart=policy
    )
    r.node.start(r.iid)
    for n, delay in enumerate([1.0, 2.0]):  # two crashes at start
        wait_kind(r.node, r.iid, "restart_scheduled", n + 1)
        restart_at_its_time(r, delay, starts_before=n + 1)
    listening(r.port)
    tick_to(r, "running")
    assert r.status().restarts == 2
    tick_until(r.node, r.clock, r.iid, lambda: count(r.node, r.iid, "stable"), "stable")
    assert r.status().restarts == 0

    pid = r.status().pid
    os.kill(pid, signal.SIGKILL)  # the next failure
    wait_kind(r.node, r.iid, "restart_scheduled", 3)
    assert r.status().restarts == 1  # one of the budget used, not three
    restart_at_its_time(r, policy.base_s, starts_before=3)
    listening(r.port)
    tick_to(r, "running")
    r.node.stop(r.iid)

    steps = history(r.node, r.iid)
    crash = [("exited", "starting", "exited"), ("restart_scheduled", "exited", "restarting")]
    assert path_of(steps) == [
        PLACED,
        *START,
        *crash,
        *RESTART,
        *crash,
        *RESTART,
        READY,
        ("stable", "running", "running"),
        ("exited", "running", "exited"),
        ("restart_scheduled", "exited", "restarting"),
        *RESTART,
        READY,
        *STOP,
    ]
    stable = of_kind(steps, "stable")[0]
    assert stable.event.uptime_s >= policy.stable_after_s
    last = of_kind(steps, "restart_scheduled")[-1].event
    assert (last.attempt, last.delay_s) == (1, policy.base_s)
    assert scheduled_then_started(steps) == [(1.0, 1.0), (2.0, 2.0), (1.0, 1.0)]
    nothing_left(r.node)


# ================================================================ hangs


def test_hung_server_is_killed_and_restarted_while_others_answer(
    nodes, tmp_path, fake_model, manual_clock
):
    fast_start = {
        "inference": KindSettings(startup_deadline_s=2.0, startup_cap_s=2.0, miss_limit=2)
    }
    node = open_node(
        nodes,
        fake_model,
        manual_clock,
        make_launcher(tmp_path, PROGRAMS / "fake_llama.py"),
        probe_timeout_s=1.0,
        kinds=fast_start,
    )
    hung, hung_port = place(node, "hung")
    other, other_port = place(node, "other")
    for iid, port in ((hung, hung_port), (other, other_port)):
        node.start(iid)
        listening(port)
        tick_until(
            node, manual_clock, iid, lambda i=iid: node.status(i).lifecycle == "running", "up"
        )
    spawned = of_kind(history(node, hung), "spawned")[0]
    tick_until(node, manual_clock, hung, lambda: elapsed_since(manual_clock, spawned) > 2.0, "2 s")

    (workdir(node, hung) / "health").write_text("hang")
    rounds = 0
    while node.status(hung).lifecycle == "running":
        probe_in_flight(node, manual_clock, hung)
        for _ in range(10):  # answered while the hung probe is outstanding
            assert node.status(other).lifecycle == "running"
            assert node.status(hung).instance_id == hung
        rounds += 1
        wait_until(lambda: node.settled(hung), 20, "the probe to time out")
    assert rounds >= 2  # at least miss_limit probes hung (one may have started before)
    wait_until(lambda: node.status(hung).lifecycle == "restarting", 20, "restarting")
    (workdir(node, hung) / "health").write_text("ok")
    manual_clock.advance(POLICY.base_s)
    listening(hung_port)
    tick_until(node, manual_clock, hung, lambda: node.status(hung).lifecycle == "running", "up")
    for iid in (hung, other):
        node.stop(iid)

    steps = history(node, hung)
    assert path_of(steps) == [
        PLACED,
        *START,
        READY,
        ("unhealthy", "running", "unhealthy"),
        *KILLED,
        ("restart_scheduled", "exited", "restarting"),
        *RESTART,
        READY,
        *STOP,
    ]
    unhealthy = of_kind(steps, "unhealthy")[0]
    assert unhealthy.event.misses == 2
    assert "no answer within 1.0 s" in unhealthy.event.reason
    killed = of_kind(steps, "exited")[0].event
    assert killed.reason.startswith("killed: ")
    assert killed.signal == signal.SIGTERM
    assert path_of(history(node, other)) == [PLACED, *START, READY, *STOP]
    nothing_left(node)


def test_running_server_that_stops_answering_within_the_startup_deadline_misses(
    nodes, tmp_path, fake_model, manual_clock
):
    long_start = {
        "inference": KindSettings(startup_deadline_s=60.0, startup_cap_s=60.0, miss_limit=2)
    }
    r = rig(
        nodes,
        tmp_path,
        fake_model,
        manual_clock,
        "fake_llama.py",
        probe_timeout_s=0.5,
        kinds=long_start,
    )
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")
    (r.workdir / "health").write_text("hang")
    for _ in range(4):  # twice the miss limit
        if r.status().lifecycle != "running":
            break
        probe_in_flight(r.node, r.clock, r.iid)
        wait_until(lambda: r.node.settled(r.iid), 20, "the probe to time out")
    kinds = [k for k, _, _ in path_of(history(r.node, r.iid))]
    assert "unhealthy" in kinds, f"still {r.status().lifecycle}: {r.status().status_detail}"


# ================================================================ slow loading


def loading_rig(nodes, tmp_path, fake_model, clock) -> Rig:
    kinds = {"inference": KindSettings(startup_deadline_s=2.0, startup_cap_s=5.0, miss_limit=2)}
    r = rig(nodes, tmp_path, fake_model, clock, "fake_llama.py", kinds=kinds)
    (r.workdir / "health").write_text("loading")
    return r


def test_loading_forever_is_unhealthy_after_the_cap(nodes, tmp_path, fake_model, manual_clock):
    r = loading_rig(nodes, tmp_path, fake_model, manual_clock)
    r.node.start(r.iid)
    listening(r.port)
    tick_until(r.node, r.clock, r.iid, lambda: count(r.node, r.iid, "unhealthy"), "unhealthy")
    wait_until(lambda: r.status().lifecycle == "restarting", 20, "restarting")
    (r.workdir / "health").write_text("ok")
    r.clock.advance(POLICY.base_s)
    listening(r.port)
    tick_to(r, "running")
    r.node.stop(r.iid)

    steps = history(r.node, r.iid)
    assert path_of(steps) == [
        PLACED,
        *START,
        ("unhealthy", "starting", "unhealthy"),
        *KILLED,
        ("restart_scheduled", "exited", "restarting"),
        *RESTART,
        READY,
        *STOP,
    ]
    unhealthy = of_kind(steps, "unhealthy")[0]
    assert "loading model after" in unhealthy.reason
    assert "(startup allowance 5 s)" in unhealthy.reason
    spawned = of_kind(steps, "spawned")[0]
    assert (unhealthy.ts_ns - spawned.ts_ns) / NS > 5.0  # past the cap, on the clock
    assert of_kind(steps, "exited")[0].reason.startswith("killed: loading model after")
    nothing_left(r.node)


def test_loading_past_the_deadline_within_the_cap_is_never_unhealthy(
    nodes, tmp_path, fake_model, manual_clock
):
    r = loading_rig(nodes, tmp_path, fake_model, manual_clock)
    r.node.start(r.iid)
    listening(r.port)
    spawned = of_kind(history(r.node, r.iid), "spawned")[0]
    tick_until(r.node, r.clock, r.iid, lambda: elapsed_since(r.clock, spawned) >= 3.5, "3.5 s")
    view = r.status()
    assert (view.lifecycle, view.health) == ("starting", "loading")  # past the 2 s deadline
    (r.workdir / "health").write_text("ok")
    tick_to(r, "running")
    r.node.stop(r.iid)

    steps = history(r.node, r.iid)
    assert path_of(steps) == [PLACED, *START, READY, *STOP]
    ready = of_kind(steps, "ready")[0]
    assert 2.0 < (ready.ts_ns - spawned.ts_ns) / NS <= 5.0
    nothing_left(r.node)


# ================================================================ ignores SIGTERM


def test_operator_stop_of_a_sigterm_ignorer_escalates_after_its_grace(
    nodes, tmp_path, fake_model, manual_clock
):
    r = rig(nodes, tmp_path, fake_model, manual_clock, "fault_ignore_term.py")
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")
    pgid = r.status().pid
    assert r.node.stop(r.iid, grace_s=0.5).lifecycle == "stopped"
    assert pids_of_group(pgid) == []

    steps = history(r.node, r.iid)
    assert path_of(steps) == [PLACED, *START, READY, *STOP]
    assert of_kind(steps, "stop_requested")[0].event.grace_s == 0.5
    exited = of_kind(steps, "exited")[0]
    assert exited.event.signal == signal.SIGKILL
    assert exited.reason == "stopped by operator: signal 9 (SIGKILL)"
    nothing_left(r.node)


def test_health_kill_of_a_sigterm_ignorer_uses_the_health_grace(
    nodes, tmp_path, fake_model, manual_clock
):
    r = rig(
        nodes,
        tmp_path,
        fake_model,
        manual_clock,
        "fault_ignore_term.py",
        stop_grace_s=60.0,
        health_kill_grace_s=0.5,
    )
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")
    (r.workdir / "health").write_text("fail")
    tick_until(r.node, r.clock, r.iid, lambda: count(r.node, r.iid, "unhealthy"), "unhealthy")
    # SIGKILL follows 0.5 s after SIGTERM; with the 60 s stop grace this would time out.
    wait_until(lambda: r.status().lifecycle == "restarting", 20, "the kill to complete")
    r.node.stop(r.iid)  # during the backoff: nothing to signal

    steps = history(r.node, r.iid)
    assert path_of(steps) == [
        PLACED,
        *START,
        READY,
        ("unhealthy", "running", "unhealthy"),
        *KILLED,
        ("restart_scheduled", "exited", "restarting"),
        ("stop_requested", "restarting", "stopped"),
    ]
    exited = of_kind(steps, "exited")[0]
    assert exited.event.signal == signal.SIGKILL  # SIGTERM ignored, killed after the grace
    assert exited.reason.startswith("killed: HTTP 500")
    assert [s.event.by for s in of_kind(steps, "stop_requested")] == ["operator"]
    nothing_left(r.node)


def test_second_stop_while_stopping_escalates_at_once(nodes, tmp_path, fake_model, manual_clock):
    r = rig(nodes, tmp_path, fake_model, manual_clock, "fault_ignore_term.py", stop_grace_s=60.0)
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")
    assert r.node.stop(r.iid, wait=False).lifecycle == "stopping"
    r.node.stop(r.iid, wait=False)
    wait_until(lambda: r.status().lifecycle == "stopped", 20, "stopped well before 60 s")

    steps = history(r.node, r.iid)
    assert path_of(steps) == [
        PLACED,
        *START,
        READY,
        ("stop_requested", "running", "stopping"),
        ("stop_requested", "stopping", "stopping"),
        ("exited", "stopping", "stopped"),
    ]
    # The escalation is recorded as what it does (grace 0), so a boot meanwhile kills at once.
    assert [s.event.grace_s for s in of_kind(steps, "stop_requested")] == [60.0, 0.0]
    assert of_kind(steps, "exited")[0].event.signal == signal.SIGKILL
    nothing_left(r.node)


# ================================================================ children


def test_stop_ends_a_child_in_the_server_group(nodes, tmp_path, fake_model, manual_clock):
    r = rig(nodes, tmp_path, fake_model, manual_clock, "fault_child.py")
    r.node.start(r.iid)
    child = identity(read_int(r.workdir / "child.pid"))
    listening(r.port)
    tick_to(r, "running")
    pgid = r.status().pid
    assert os.getpgid(child[0]) == pgid
    r.node.stop(r.iid, grace_s=0.5)
    assert pids_of_group(pgid) == []
    wait_until(lambda: gone(child), 10, "the child gone")
    assert path_of(history(r.node, r.iid)) == [PLACED, *START, READY, *STOP]
    nothing_left(r.node)


@pytest.fixture
def strays():
    """Processes that escaped on purpose: SIGKILLed (identity-checked) in teardown."""
    escaped: list[tuple[int, float]] = []
    yield escaped
    for who in escaped:
        if not gone(who):
            os.kill(who[0], signal.SIGKILL)
    wait_until(lambda: all(gone(w) for w in escaped), 10, "the strays gone")


def test_stop_ends_a_grandchild_that_escaped_the_group(
    nodes, tmp_path, fake_model, manual_clock, strays
):
    r = rig(nodes, tmp_path, fake_model, manual_clock, "fault_escape.py", reconcile_interval_s=1.0)
    r.node.start(r.iid)
    grandchild = identity(read_int(r.workdir / "grandchild.pid"))
    strays.append(grandchild)
    intermediate = identity(read_int(r.workdir / "intermediate.pid"))
    listening(r.port)
    tick_to(r, "running")
    pgid = r.status().pid
    assert os.getsid(grandchild[0]) == grandchild[0]  # its own session and group
    # Supervise a while (health and reconcile ticks) while it is still linked to the server.
    start = r.clock.monotonic()
    tick_until(r.node, r.clock, r.iid, lambda: r.clock.monotonic() - start >= 3.0, "3 s")
    (r.workdir / "release").touch()
    wait_until(lambda: gone(intermediate), 10, "the intermediate gone")
    assert psutil.Process(grandchild[0]).ppid() != intermediate[0]
    r.node.stop(r.iid, grace_s=0.5)
    assert pids_of_group(pgid) == []
    assert path_of(history(r.node, r.iid)) == [PLACED, *START, READY, *STOP]
    assert eventually(lambda: gone(grandchild), 5), "the escaped grandchild is still running"


# ================================================================ answers, but wrongly


def test_health_ok_but_completions_failing_fails_deep_health(
    nodes, tmp_path, fake_model, manual_clock
):
    r = rig(nodes, tmp_path, fake_model, manual_clock, "fault_no_completions.py")
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")
    with pytest.raises(ProbeError, match=r"HTTP 500: .*KV cache allocation failed"):
        r.node.deep_health(r.iid)
    assert r.status().lifecycle == "running"
    r.node.stop(r.iid)
    assert path_of(history(r.node, r.iid)) == [PLACED, *START, READY, *STOP]
    nothing_left(r.node)


BAD_BODY_PATH = [
    PLACED,
    *START,
    ("unhealthy", "starting", "unhealthy"),
    *KILLED,
    ("failed", "exited", "failed"),
]


def test_garbage_health_answer_is_unhealthy(nodes, tmp_path, fake_model, manual_clock):
    r = rig(
        nodes,
        tmp_path,
        fake_model,
        manual_clock,
        "fault_garbage.py",
        "--body",
        "garbage",
        spec={"restart": {"max_restarts": 0}},
    )
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "failed")
    steps = history(r.node, r.iid)
    assert path_of(steps) == BAD_BODY_PATH
    assert "HTTP 200: not JSON: " in of_kind(steps, "unhealthy")[0].reason
    nothing_left(r.node)


def test_huge_health_answer_is_cut_at_the_cap(nodes, tmp_path, fake_model, manual_clock):
    r = rig(
        nodes,
        tmp_path,
        fake_model,
        manual_clock,
        "fault_garbage.py",
        "--body",
        "huge",
        spec={"restart": {"max_restarts": 0}},
    )
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "failed")
    steps = history(r.node, r.iid)
    assert path_of(steps) == BAD_BODY_PATH
    assert "HTTP 200: body larger than 65536 bytes" in of_kind(steps, "unhealthy")[0].reason
    sent = int(read_int(r.workdir / "sent"))  # written when the client hung up
    assert sent < (1 << 30) // 4  # of a 1 GiB body: the probe stopped reading
    nothing_left(r.node)


# ================================================================ one-shot runs


def oneshot(nodes, tmp_path, fake_model, clock, code: int) -> Rig:
    policy = RestartPolicy(max_restarts=1, base_s=1.0, cap_s=3.0)
    return rig(
        nodes,
        tmp_path,
        fake_model,
        clock,
        "fault_oneshot.py",
        "--code",
        str(code),
        spec={"kind": "process", "continuous": False},
        restart=policy,
    )


def test_one_shot_that_exits_0_is_finished_and_never_restarted(
    nodes, tmp_path, fake_model, manual_clock
):
    r = oneshot(nodes, tmp_path, fake_model, manual_clock, 0)
    r.node.start(r.iid)
    wait_until(lambda: r.status().lifecycle == "finished", 20, "finished")
    r.clock.advance(30.0)  # every backoff, health and reconcile tick that could restart it
    wait_until(lambda: r.node.settled(r.iid), 20, "settled")
    view = r.status()
    assert (view.lifecycle, view.desired, view.restarts) == ("finished", "stopped", 0)
    steps = history(r.node, r.iid)
    assert path_of(steps) == [
        PLACED,
        *START,
        READY,
        ("exited", "running", "exited"),
        ("finished", "exited", "finished"),
    ]
    assert of_kind(steps, "exited")[0].event.exit_code == 0
    nothing_left(r.node)


def test_one_shot_that_exits_1_is_restarted_as_usual(nodes, tmp_path, fake_model, manual_clock):
    r = oneshot(nodes, tmp_path, fake_model, manual_clock, 1)
    r.node.start(r.iid)
    wait_kind(r.node, r.iid, "restart_scheduled", 1)
    restart_at_its_time(r, 1.0, starts_before=1)
    wait_until(lambda: r.status().lifecycle == "failed", 20, "failed")
    steps = history(r.node, r.iid)
    run = [("ready", "starting", "running"), ("exited", "running", "exited")]
    assert path_of(steps) == [
        PLACED,
        *START,
        *run,
        ("restart_scheduled", "exited", "restarting"),
        *RESTART,
        *run,
        ("failed", "exited", "failed"),
    ]
    assert [s.event.exit_code for s in of_kind(steps, "exited")] == [1, 1]
    nothing_left(r.node)
