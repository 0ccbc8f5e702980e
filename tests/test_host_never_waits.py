"""The host never waits: an unload, a slow admission or a placement in flight
holds up no verb of another instance, and the routes say what is being unloaded.

Real fake servers (tests/programs/fake_llama.py; fault_ignore_term.py for a
server that ignores SIGTERM, so its unload lasts the 5 s unload grace until
SIGKILL). A slow admission is ``adapters.planning.plan`` patched in-process
to wait on an Event the test holds. The assertions are on the ORDER in which
things complete, never on how long they took.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from conftest import NodeFactory
from support import PROGRAMS, wait_until

from infervisor.actors import host as host_module
from infervisor.actors import messages as m
from infervisor.actors.errors import InvalidState, UnknownInstance
from infervisor.actors.instance import InstanceActor
from infervisor.actors.node import Node
from infervisor.adapters import planning
from infervisor.adapters.errors import AdmissionRefused
from infervisor.adapters.ports import free_port
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.replay import timeline
from infervisor.replay.views import InstanceView

DEADLINE_S = 60.0  # generous: only ever a bound on a hang, never a measurement


def spec(role: str, port: int | None = None) -> InstanceSpec:
    return InstanceSpec(role=role, flavor=Flavor.LLAMACPP, model="tiny", port=port or free_port())


def switching_launcher(directory: Path) -> str:
    """A launcher running fault_ignore_term.py in a working directory holding the
    file ``ignore_term``, else fake_llama.py (both take llama-server's flags)."""
    path = directory / "launch-switching"
    ignorer, fake = PROGRAMS / "fault_ignore_term.py", PROGRAMS / "fake_llama.py"
    python = sys.executable
    path.write_text(
        "#!/bin/sh\n"
        f"if [ -e ignore_term ]; then exec '{python}' '{ignorer}' \"$@\"; fi\n"
        f"exec '{python}' '{fake}' \"$@\"\n"
    )
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def node(nodes: NodeFactory, tmp_path: Path, fake_model: Path) -> Node:
    n = nodes.open(nodes.settings(switching_launcher(tmp_path), fake_model))
    n.registry.adopt("tiny", fake_model / "tiny.gguf")
    return n


def workdir(node: Node, iid: str) -> Path:
    path = Path(node.settings.data_dir) / "instances" / iid
    path.mkdir(parents=True, exist_ok=True)
    return path


def running(node: Node, iid: str) -> InstanceView:
    return node.wait_for(iid, lambda v: v.lifecycle == "running", 60)


def kinds(node: Node, iid: str) -> list[str]:
    return [e.kind for e in timeline(node.settings.chain_path, iid)]


class Order:
    """Names appended as things complete, from any thread."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._lock = threading.Lock()

    def done(self, name: str) -> None:
        with self._lock:
            self.names.append(name)


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, Future[Any]]:
    """Run ``fn`` on a thread; its result or error lands in the Future."""
    out: Future[Any] = Future()

    def run() -> None:
        try:
            out.set_result(fn())
        except BaseException as e:  # the test inspects it
            out.set_exception(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


class SlowAdmission:
    """``planning.plan`` that waits on :attr:`release` for specs of one role."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0
        self._plan = planning.plan

    def __call__(self, spec: InstanceSpec, *args: Any, **kw: Any) -> Any:
        if spec.role == self.role:
            self.calls += 1
            self.entered.set()
            assert self.release.wait(DEADLINE_S), "the test never released the admission"
        return self._plan(spec, *args, **kw)


@pytest.fixture
def slow(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlowAdmission]:
    patched = SlowAdmission("slow")
    monkeypatch.setattr(planning, "plan", patched)
    yield patched
    patched.release.set()  # never leave a pool worker waiting


# ---------------------------------------------------------------- unloads


def test_verbs_of_a_healthy_instance_answer_while_another_ignores_sigterm_in_its_unload(
    node: Node,
) -> None:
    a = node.place(spec("a"))
    (workdir(node, a) / "ignore_term").write_text("")
    b = node.place(spec("b"))
    node.start(a)
    node.start(b)
    running(node, a)
    running(node, b)
    order = Order()

    def unload_a() -> None:
        node.unload(a)
        order.done("A unloaded")

    thread, unloaded = in_thread(unload_a)
    # The SIGTERM is sent (and ignored): A's unload now lasts until its SIGKILL.
    wait_until(lambda: "instance.stop_requested" in kinds(node, a), 20, "A's unload under way")
    with pytest.raises(InvalidState, match="being unloaded"):
        node.status(a)
    assert [v.instance_id for v in node.list()] == [b]
    assert node.status(b).lifecycle == "running"
    order.done("B status")
    assert node.stop(b).lifecycle == "stopped"
    order.done("B stop")
    node.start(b)
    order.done("B start")
    thread.join(DEADLINE_S)
    unloaded.result(0)

    assert order.names == ["B status", "B stop", "B start", "A unloaded"]
    with pytest.raises(UnknownInstance):
        node.status(a)
    recorded = kinds(node, a)
    assert recorded[-1] == "instance.unloaded"
    assert "instance.exited" in recorded
    running(node, b)
    node.stop(b)


class GatedUnload(InstanceActor):
    """An instance actor whose Unload answers a Future the test resolves: the
    unload contract after the instance rewrite (the real unload runs first)."""

    gate: Future[None]
    asked: threading.Event
    real: bool = True

    def on_receive(self, message: Any) -> Any:
        if not isinstance(message, m.Unload):
            return super().on_receive(message)
        real = super().on_receive(message) if self.real else None
        outer: Future[None] = Future()

        def when_gate_opens(_: Any) -> None:
            error = self.gate.exception()
            if error is not None:
                outer.set_exception(error)
            elif isinstance(real, Future):
                real.add_done_callback(lambda f: _copy(f, outer))
            else:
                outer.set_result(None)

        self.gate.add_done_callback(when_gate_opens)
        self.asked.set()
        return outer


def _copy(src: Future[Any], dst: Future[Any]) -> None:
    error = src.exception()
    if error is None:
        dst.set_result(None)
    else:
        dst.set_exception(error)


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch) -> type[GatedUnload]:
    monkeypatch.setattr(GatedUnload, "gate", Future(), raising=False)
    monkeypatch.setattr(GatedUnload, "asked", threading.Event(), raising=False)
    monkeypatch.setattr(host_module, "InstanceActor", GatedUnload)
    return GatedUnload


def test_an_instance_being_unloaded_is_not_routed_to_and_the_host_chains_on_its_future(
    node: Node, gated: type[GatedUnload]
) -> None:
    a_spec = spec("a")
    a = node.place(a_spec)
    b = node.place(spec("b"))
    ref = node._ref(a)
    thread, unloaded = in_thread(lambda: node.unload(a))
    assert gated.asked.wait(DEADLINE_S)
    # The routes said "being unloaded" before the actor was asked.
    with pytest.raises(InvalidState, match=f"{a} is being unloaded"):
        node.status(a)
    with pytest.raises(InvalidState, match="being unloaded"):
        node.start(a)
    with pytest.raises(InvalidState, match=f"{a} is being unloaded"):
        node.place(a_spec)
    assert [v.instance_id for v in node.list()] == [b]
    assert set(node.live_states()) == {b}
    # The host is free: another placement and a status go through meanwhile.
    c = node.place(spec("c"))
    assert node.status(c).lifecycle == "loaded"
    _, again = in_thread(lambda: node.unload(a))  # joins the first
    assert not unloaded.done() and not again.done()

    gated.gate.set_result(None)
    thread.join(DEADLINE_S)
    unloaded.result(0)
    again.result(DEADLINE_S)
    assert ref.actor_stopped.wait(DEADLINE_S)  # the host ended the actor
    with pytest.raises(UnknownInstance):
        node.status(a)
    assert kinds(node, a).count("instance.unloaded") == 1
    assert node.place(a_spec) == a  # its id is free again
    assert node.status(a).lifecycle == "loaded"


def test_an_unload_that_fails_routes_the_instance_again(
    node: Node, gated: type[GatedUnload], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(GatedUnload, "real", False)
    a = node.place(spec("a"))
    _, unloaded = in_thread(lambda: node.unload(a))
    assert gated.asked.wait(DEADLINE_S)
    with pytest.raises(InvalidState, match="being unloaded"):
        node.status(a)
    gated.gate.set_exception(RuntimeError("injected unload failure"))
    with pytest.raises(RuntimeError, match="injected unload failure"):
        unloaded.result(DEADLINE_S)
    assert node.status(a).lifecycle == "loaded"
    assert "instance.unloaded" not in kinds(node, a)


# ---------------------------------------------------------------- admissions


def test_a_slow_admission_holds_up_neither_status_nor_another_placement(
    node: Node, slow: SlowAdmission
) -> None:
    b = node.place(spec("b"))
    order = Order()

    def place_slow() -> str:
        iid = node.place(spec("slow"))
        order.done("slow placed")
        return iid

    thread, placed = in_thread(place_slow)
    assert slow.entered.wait(DEADLINE_S)
    assert node.status(b).lifecycle == "loaded"
    order.done("B status")
    c = node.place(spec("c"))
    order.done("C placed")
    assert node.status(c).lifecycle == "loaded"
    assert node.admit(spec("d")).adapter_id == "infer.llamacpp"
    order.done("D admitted")
    assert not placed.done()
    slow.release.set()
    thread.join(DEADLINE_S)

    assert order.names == ["B status", "C placed", "D admitted", "slow placed"]
    assert node.status(placed.result(0)).lifecycle == "loaded"


def test_two_placements_of_one_spec_record_one_placement(node: Node, slow: SlowAdmission) -> None:
    twice = spec("slow")
    thread, first = in_thread(lambda: node.place(twice))
    assert slow.entered.wait(DEADLINE_S)
    with pytest.raises(InvalidState, match="already in progress"):
        node.place(twice)
    slow.release.set()
    thread.join(DEADLINE_S)
    iid = first.result(0)
    with pytest.raises(InvalidState, match="already loaded"):
        node.place(twice)
    assert kinds(node, iid).count("instance.placed") == 1
    assert slow.calls == 1


def test_racing_placements_of_one_spec_record_one_placement(node: Node) -> None:
    racing = spec("race")
    barrier = threading.Barrier(4)

    def place() -> str:
        barrier.wait(DEADLINE_S)
        return node.place(racing)

    runs = [in_thread(place) for _ in range(4)]
    for thread, _ in runs:
        thread.join(DEADLINE_S)
    outcomes = [out.exception(0) for _, out in runs]
    assert sum(e is None for e in outcomes) == 1
    assert all(isinstance(e, InvalidState) for e in outcomes if e is not None)
    iid = next(out.result(0) for _, out in runs if out.exception(0) is None)
    assert kinds(node, iid).count("instance.placed") == 1


def test_a_placement_in_flight_holds_its_address(node: Node, slow: SlowAdmission) -> None:
    port = free_port()
    thread, first = in_thread(lambda: node.place(spec("slow", port)))
    assert slow.entered.wait(DEADLINE_S)
    with pytest.raises(AdmissionRefused, match=f"127.0.0.1:{port} is already used by"):
        node.place(spec("other", port))
    slow.release.set()
    thread.join(DEADLINE_S)
    assert node.status(first.result(0)).lifecycle == "loaded"
