"""The verbs of an instance whose adapter cannot be built (actors/core/unbuilt.py):
pure functions of the core, driven with its own harness (tests/core_support.py).
Through a real node: tests/test_nothing_vanishes.py."""

from __future__ import annotations

from core_support import Sim, make_rules, replace, up

from infervisor.actors.core.decision import RefusalKind
from infervisor.actors.core.rules import Mode
from infervisor.actors.core.unbuilt import FIX_HINT, refuse_start, stop_refusal
from infervisor.replay import LifecycleState

S = LifecycleState


def test_an_unbuilt_start_is_refused_naming_the_fix_and_recorded_once_per_cause() -> None:
    sim = Sim(rules=make_rules(Mode.PROCESS))
    decision = refuse_start(sim.inst, "model tiny is not in the registry", "operator")
    assert [type(e).__name__ for e in decision.events] == ["StartRefused"]
    assert decision.source == "operator"
    assert decision.refusal is not None and decision.refusal.kind is RefusalKind.INVALID_STATE
    assert "cannot be started: model tiny is not in the registry" in decision.refusal.message
    assert FIX_HINT in decision.refusal.message
    recorded = replace(sim.inst, refusal="model tiny is not in the registry")
    again = refuse_start(recorded, "model tiny is not in the registry", "boot")
    assert again.events == () and again.source == "node" and again.refusal is not None
    assert refuse_start(recorded, "launcher program gone", "operator").events != ()


def test_an_unbuilt_instance_stops_only_while_nothing_of_it_runs() -> None:
    sim = Sim(rules=make_rules(Mode.PROCESS))
    sim.start()
    sim.probe(up())
    refusal = stop_refusal(sim.inst, sim.rules, "model gone")
    assert refusal is not None and f"(pid {sim.pid})" in refusal.message
    stopped = replace(sim.inst, lifecycle=S.STOPPED, process=None)
    assert stop_refusal(stopped, sim.rules, "model gone") is None
    adopted = make_rules(Mode.ADOPTED)
    assert stop_refusal(replace(stopped, lifecycle=S.RUNNING), adopted, "gone") is None
