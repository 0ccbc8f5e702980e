"""Who supervises the supervisors: clock callbacks that raise, the watchdog,
node-wide actors that die, and ``infervisor run`` exiting on a failed node.

Synchronisation is by events and conditions with deadlines; time that a test
controls is a ManualClock (the watchdog's real time is injected where a test
needs it to pass).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from pathlib import Path
from typing import Any

import pykka
import pytest
from support import wait_until

from infervisor.actors import messages as m
from infervisor.actors.clock import ManualClock, RealClock, Timer
from infervisor.actors.node import Node
from infervisor.actors.settings import NodeSettings
from infervisor.actors.supervisor import SupervisorActor
from infervisor.actors.watchdog import CHECK_EVERY_S, NodeFailure, Watchdog
from infervisor.tools.node import boot, run
from infervisor.tools.node.config import NodeConfig

DEADLINE_S = 60.0  # a bound on a hang, never a measurement: generous at load 10


def boom() -> None:
    raise RuntimeError("boom")


# ---------------------------------------------------------------- clocks
def test_real_clock_goes_on_after_a_raising_callback() -> None:
    told: list[tuple[Timer, Exception]] = []
    later = threading.Event()
    clock = RealClock(on_error=lambda timer, e: told.append((timer, e)))
    failing = clock.call_later(0.0, boom)
    clock.call_later(0.01, later.set)
    assert later.wait(DEADLINE_S), "a timer after the raising one did not fire"
    wait_until(lambda: told, DEADLINE_S, "the on_error hook")
    timer, error = told[0]
    assert timer is failing
    assert str(error) == "boom"
    again = threading.Event()
    clock.call_later(0.0, again.set)  # the scheduler thread is still there
    assert again.wait(DEADLINE_S)


def test_manual_clock_fires_the_other_timers_and_records_the_error() -> None:
    told: list[Timer] = []
    fired: list[str] = []
    clock = ManualClock(on_error=lambda timer, _e: told.append(timer))
    clock.call_later(1.0, lambda: fired.append("before"))
    failing = clock.call_later(2.0, boom)
    clock.call_later(2.0, lambda: fired.append("same time"))
    clock.call_later(3.0, lambda: fired.append("after"))
    clock.advance(5.0)
    assert fired == ["before", "same time", "after"]
    assert [t for t, _ in clock.errors] == [failing]
    assert isinstance(clock.errors[0][1], RuntimeError)
    assert told == [failing]
    assert clock.monotonic() == 5.0


def test_a_raising_on_error_hook_stops_nothing() -> None:
    fired: list[int] = []

    def bad_hook(_timer: Timer, _e: Exception) -> None:
        raise ValueError("the hook is broken too")

    clock = ManualClock(on_error=bad_hook)
    clock.call_later(1.0, boom)
    clock.call_later(2.0, lambda: fired.append(1))
    clock.advance(2.0)
    assert fired == [1]
    assert len(clock.errors) == 1


# ---------------------------------------------------------------- the watchdog alone
class FakeRef:
    """An actor ref whose liveness the test sets."""

    def __init__(self) -> None:
        self.alive = True

    def is_alive(self) -> bool:
        return self.alive


class RealTime:
    """The watchdog's real clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watch_by_hand(dog: Watchdog, refs: dict[str, FakeRef]) -> None:
    """Give the watchdog its actors, then stop its thread: the test calls ``check``."""
    dog.start(refs)  # type: ignore[arg-type]
    dog.stop()


def test_watchdog_names_a_dead_actor() -> None:
    clock = ManualClock()
    dog = Watchdog(clock, stall_s=5.0)
    refs = {"supervisor": FakeRef(), "host": FakeRef(), "chain writer": FakeRef()}
    watch_by_hand(dog, refs)
    assert dog.check() is None
    refs["host"].alive = False
    assert dog.check() == NodeFailure("host actor", "stopped: it is not running")
    assert dog.wait_failed(0) == dog.failure


def test_watchdog_names_the_error_an_actor_died_of() -> None:
    dog = Watchdog(ManualClock(), stall_s=5.0)
    ref = FakeRef()
    watch_by_hand(dog, {"supervisor": ref})
    dog.actor_failed("supervisor", RuntimeError("boom"))
    ref.alive = False
    failure = dog.check()
    assert failure is not None
    assert str(failure) == "supervisor actor: died of RuntimeError: boom"


def test_watchdog_a_tick_that_never_fires_is_a_stall_naming_the_clock_error() -> None:
    clock = ManualClock()
    dog = Watchdog(clock, stall_s=5.0)
    stuck = Timer(due=1.0, fn=lambda: None)  # never scheduled: as if the clock thread hung
    dog.watch_tick(stuck)
    dog.clock_error(Timer(0.5, boom), RuntimeError("boom"))
    clock.advance(6.0)
    assert dog.check() is None  # late, but not yet by more than stall_s
    clock.advance(0.5)
    failure = dog.check()
    assert failure is not None
    assert failure.what == "supervision ticks"
    assert "has not fired" in failure.cause
    assert "raised RuntimeError: boom" in failure.cause


def test_watchdog_a_tick_fired_and_never_handled_is_a_stall() -> None:
    clock = ManualClock()
    real = RealTime()
    dog = Watchdog(clock, stall_s=5.0, real_time=real)
    tick = clock.call_later(1.0, lambda: None)
    dog.watch_tick(tick)
    clock.advance(1.0)  # fired; the "supervisor" never arms the next one
    assert dog.check() is None
    for _ in range(10):  # checks on time (a late one would be a pause): 5 s
        real.now += CHECK_EVERY_S
        assert dog.check() is None
    real.now += CHECK_EVERY_S
    failure = dog.check()
    assert failure is not None
    assert "has not handled its health tick" in failure.cause


def test_watchdog_a_clock_that_is_not_advanced_is_never_a_stall() -> None:
    clock = ManualClock()
    real = RealTime()
    dog = Watchdog(clock, stall_s=5.0, real_time=real)
    dog.watch_tick(clock.call_later(1.0, lambda: None))
    real.now += 3600.0
    assert dog.check() is None


# ---------------------------------------------------------------- a node's actors
@pytest.fixture
def node(nodes, fake_llama: str, fake_model: Path, manual_clock: ManualClock) -> Node:
    settings = nodes.settings(fake_llama, fake_model, health_interval_s=1.0)
    opened: Node = nodes.open(settings, manual_clock)
    return opened


@pytest.mark.parametrize(
    ("actor", "what"),
    [("supervisor", "supervisor actor"), ("host", "host actor"), ("writer", "chain writer actor")],
)
def test_a_stopped_node_wide_actor_fails_the_node(node: Node, actor: str, what: str) -> None:
    assert node.failure is None
    ref: pykka.ActorRef[Any] = getattr(node._actors, actor)
    ref.stop()
    failure = node.wait_failed(DEADLINE_S)
    assert failure is not None, f"a stopped {actor} was not noticed"
    assert failure.what == what
    assert node.failure == failure
    with contextlib.suppress(Exception):  # a dead writer cannot record the shutdown
        node.shutdown()
    for other in (node._actors.supervisor, node._actors.host, node._actors.writer):
        assert not other.is_alive(), "the shutdown of a failed node left an actor running"


def test_a_supervisor_that_dies_of_an_error_fails_the_node_naming_it(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(self: SupervisorActor, controller: str) -> None:
        raise RuntimeError(f"cannot take a heartbeat from {controller}")

    monkeypatch.setattr(SupervisorActor, "_heard", crash)
    node.heartbeat("ctl")
    failure = node.wait_failed(DEADLINE_S)
    assert failure is not None
    assert str(failure) == (
        "supervisor actor: died of RuntimeError: cannot take a heartbeat from ctl"
    )


def test_a_tick_that_raises_is_logged_and_the_ticks_go_on(
    node: Node, manual_clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    ticks: list[float] = []

    def revive_dead(self: SupervisorActor) -> None:
        ticks.append(manual_clock.monotonic())
        if len(ticks) == 1:
            raise RuntimeError("the first tick breaks")

    monkeypatch.setattr(SupervisorActor, "_revive_dead", revive_dead)
    supervisor = node._actors.supervisor

    def ticked(n: int) -> bool:
        if len(ticks) < n:
            manual_clock.advance(node.settings.health_interval_s)
            supervisor.ask(m.Deregister(instance_id="-"), timeout=DEADLINE_S)  # handled all
        return len(ticks) >= n

    wait_until(lambda: ticked(3), DEADLINE_S, "three health ticks")
    assert supervisor.is_alive()
    assert node.failure is None


def test_the_nodes_clock_errors_reach_its_watchdog(node: Node, manual_clock: ManualClock) -> None:
    watchdog = node._actors.watchdog
    assert watchdog is not None
    assert manual_clock.on_error == watchdog.clock_error
    manual_clock.call_later(0.5, boom)
    manual_clock.advance(0.5)
    assert watchdog._clock_error is not None
    assert "boom" in watchdog._clock_error
    assert node.failure is None  # an error alone is no failure: the clock goes on


# ---------------------------------------------------------------- infervisor run
class FailingNode:
    """What ``run.serve`` needs of a node: one that fails after its first look."""

    def __init__(self, failure: NodeFailure) -> None:
        self._failure = failure
        self.settings = NodeSettings(node_id="n1", data_dir="unused")
        self.looks = 0
        self.shutdowns: list[str] = []

    @property
    def failure(self) -> NodeFailure | None:
        self.looks += 1
        return self._failure if self.looks > 1 else None

    def shutdown(self, *, stop_servers: bool = True, reason: str = "shutdown") -> None:
        self.shutdowns.append(reason)


class QuietControl:
    def stopping(self, timeout_s: float | None = None) -> bool:
        return True

    def close(self) -> None:
        pass


def test_serve_exits_non_zero_naming_the_cause() -> None:
    said: list[str] = []
    failure = NodeFailure("chain writer actor", "stopped: it is not running")
    fake = FailingNode(failure)
    inbox: queue.SimpleQueue[str] = queue.SimpleQueue()
    status = run.serve(fake, QuietControl(), inbox, said.append)  # type: ignore[arg-type]
    assert status == run.EXIT_FAILED != 0
    assert "error: the node failed: chain writer actor: stopped: it is not running" in said
    assert fake.shutdowns == [f"node failed: {failure}"]


def test_serve_still_stops_on_a_signal() -> None:
    said: list[str] = []
    fake = FailingNode(NodeFailure("x", "y"))
    fake.looks = -(10**9)  # it would fail only much later
    inbox: queue.SimpleQueue[str] = queue.SimpleQueue()
    inbox.put("SIGTERM")
    assert run.serve(fake, QuietControl(), inbox, said.append) == 0  # type: ignore[arg-type]
    assert said[-1] == "stopped"


def test_run_exits_non_zero_when_its_writer_dies(
    tmp_path: Path, fake_llama: str, fake_model: Path, nodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = nodes.settings(fake_llama, fake_model, data_dir=str(tmp_path / "run-data"))
    opened: list[Node] = []
    open_node = boot.open_node

    def keep(*args: Any, **kwargs: Any) -> Node:
        node = open_node(*args, **kwargs)
        opened.append(node)
        return node

    monkeypatch.setattr(boot, "open_node", keep)
    said: list[str] = []
    running = threading.Event()

    def say(line: str) -> None:
        said.append(line)
        if line.startswith("Ctrl-C"):
            running.set()

    def kill_the_writer() -> None:
        if running.wait(DEADLINE_S):
            opened[0]._actors.writer.stop()

    killer = threading.Thread(target=kill_the_writer)
    killer.start()
    try:
        status = run.run_node(NodeConfig(node=settings), say)
    finally:
        killer.join()
    assert running.is_set(), f"the node did not start: {said}"
    assert status == run.EXIT_FAILED
    assert "error: the node failed: chain writer actor: stopped: it is not running" in said
    assert not opened[0]._actors.host.is_alive()
