"""The supervisor's reconcile tick through the node's gates (actors/supervisor.py,
actors/probe_loop.py ``Gates``), on a manual clock, with the machine's real
socket table: an adopted server is told a tick only when the listeners beyond
loopback on its port change; an instance with a process is told every tick.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pykka
import pytest

from infervisor.actors import messages as m
from infervisor.actors.clock import ManualClock
from infervisor.actors.core.wake import Reconcile, Watch
from infervisor.actors.probe_loop import Gates, ProbeLoop
from infervisor.actors.supervisor import SupervisorActor
from infervisor.adapters.ports import free_port

RECONCILE_S = 5.0


class Recorder(pykka.ThreadingActor):
    """Stands in for an instance actor: counts the reconcile ticks told to it."""

    def __init__(self) -> None:
        super().__init__()
        self.ticks: list[m.ReconcileTick] = []

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, m.ReconcileTick):
            self.ticks.append(message)
        if isinstance(message, m.IsSettled):
            return len(self.ticks)
        return None


def _loop(watch: Watch) -> ProbeLoop:
    loop = ProbeLoop(ManualClock(), lambda token, back: None, lambda probed: None)
    loop.publish(watch)
    return loop


@pytest.fixture
def rig() -> Iterator[tuple[ManualClock, pykka.ActorRef[Any], Gates]]:
    clock, gates = ManualClock(), Gates()
    supervisor = SupervisorActor.start(clock, 3600.0, RECONCILE_S, gates=gates)
    try:
        yield clock, supervisor, gates
    finally:
        supervisor.stop()


def test_an_adopted_server_is_told_a_tick_only_when_its_listeners_change(
    rig: tuple[ManualClock, pykka.ActorRef[Any], Gates],
) -> None:
    clock, supervisor, gates = rig
    port = free_port("0.0.0.0")
    adopted, managed = _loop(Watch(ticks=False, port=port)), _loop(Watch(ticks=True, port=port))
    refs = {"adopted": Recorder.start(), "managed": Recorder.start()}
    gates.put("adopted", adopted)
    gates.put("managed", managed)
    for iid, ref in refs.items():
        supervisor.tell(m.Register(instance_id=iid, ref=ref))

    def told() -> dict[str, int]:
        clock.advance(RECONCILE_S)
        supervisor.ask(m.IsSettled(), timeout=20.0)  # the tick handled: told before this
        return {iid: ref.ask(m.IsSettled(), timeout=20.0) for iid, ref in refs.items()}

    try:
        assert told() == {"adopted": 1, "managed": 1}  # the first table: told
        assert told() == {"adopted": 1, "managed": 2}  # nothing new for the adopted one
        with socket.socket() as wide:
            wide.bind(("0.0.0.0", port))
            wide.listen(1)
            assert told() == {"adopted": 2, "managed": 3}  # it listens beyond loopback
            tick = refs["adopted"].proxy().ticks.get(timeout=20.0)[-1]
            assert tick.listeners is not None and port in tick.listeners.ports()
            assert told() == {"adopted": 2, "managed": 4}
        assert told() == {"adopted": 3, "managed": 5}  # and no longer
        assert adopted.reconciled == {Reconcile.LISTENERS: 3}
        assert adopted.reconcile_quiet == 2
        assert managed.reconciled == {Reconcile.TICKS: 5}
    finally:
        for ref in refs.values():
            ref.stop()
