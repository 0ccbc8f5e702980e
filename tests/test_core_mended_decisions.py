"""Decisions of the core that were wrong (issue 20), each driven through the
core's own harness (``tests/core_support.py``): every test here failed before
its rule was mended."""

from __future__ import annotations

from core_support import Sim, make_rules, policy, sick, up

from infervisor.actors.core import effects as fx
from infervisor.actors.core import observations as o
from infervisor.actors.core.decision import RefusalKind
from infervisor.actors.core.rules import Mode
from infervisor.replay import Desired, LifecycleState
from infervisor.replay import events as ev
from infervisor.replay.state import later

S = LifecycleState
TAKEN = "127.0.0.1:8080"


def _restarted_once(kind: str) -> Sim:
    """Running again after one crash and its restart (one restart counted)."""
    sim = Sim(rules=make_rules(Mode.PROCESS, kind=kind))
    sim.start()
    sim.probe(up())
    sim.crash_and_restart()
    sim.probe(up())
    assert sim.inst.lifecycle is S.RUNNING and sim.inst.restarts == 1
    return sim


# ---------------------------------------------------------------- the stability reset
def test_a_server_giving_no_token_keeps_its_restart_budget() -> None:
    """Its /health answers, its deep checks fail: neither a tick nor an up probe clears it."""
    sim = _restarted_once("deep")
    sim.feed(o.DeepChecked(token=sim.inst.process.pid, error="HTTP 500"))  # type: ignore[union-attr]
    assert sim.tracking.deep_misses == 1
    sim.clock.advance(sim.rules.supervision.restart.stable_after_s + 1)
    assert sim.feed(o.Tick()).events == ()
    assert sim.probe(up()).events == ()
    assert sim.inst.restarts == 1


def test_a_server_whose_probes_miss_keeps_its_restart_budget() -> None:
    sim = _restarted_once("web")
    sim.probe(sick())
    assert sim.tracking.misses == 1 and sim.inst.lifecycle is S.RUNNING
    sim.clock.advance(sim.rules.supervision.restart.stable_after_s + 1)
    assert sim.feed(o.Tick()).events == ()
    assert sim.inst.restarts == 1
    sim.probe(up())  # answering up at this moment, after the period: now it clears
    assert sim.kinds_of_last() == ["instance.stable"] and sim.inst.restarts == 0


# ---------------------------------------------------------------- a failed Ollama unload
def _ollama_loaded() -> Sim:
    """A model this node loaded, running, 1000 bytes reserved."""
    sim = Sim(rules=make_rules(Mode.OLLAMA))
    sim.feed(o.StartVerb(by="operator"))
    sim.checked(reserved_bytes=1000)
    sim.feed(o.OllamaResidency(resident=False))
    sim.feed(o.OllamaLoadEnded(ok=True))
    assert sim.inst.lifecycle is S.RUNNING and sim.inst.ollama_owned is True
    return sim


def _ollama_stopped_with_failed_unload() -> Sim:
    sim = _ollama_loaded()
    sim.feed(o.StopVerb(by="operator", grace_s=5))
    assert fx.UnloadModel() in sim.last.effects  # type: ignore[union-attr]
    sim.feed(o.OllamaUnloadEnded(ok=False, error="connection refused"))
    return sim


def test_a_failed_unload_is_recorded_and_a_start_proceeds() -> None:
    sim = _ollama_stopped_with_failed_unload()
    assert sim.kinds_of_last() == ["instance.unload_failed"]
    assert sim.inst.unload_error == "connection refused"
    assert sim.inst.ollama_owned is True and sim.inst.reserved_bytes == 1000  # may be resident
    d = sim.feed(o.StartVerb(by="operator"))
    assert d.refusal is None and sim.effect(fx.CheckStart).verb is True
    sim.checked(reserved_bytes=1000)
    assert sim.kinds_of_last() == ["instance.starting"]
    sim.feed(o.OllamaResidency(resident=True))
    assert sim.kinds_of_last() == ["instance.ready"] and sim.inst.ollama_owned is True


def test_a_stop_after_a_failed_unload_asks_ollama_again() -> None:
    sim = _ollama_stopped_with_failed_unload()
    d = sim.feed(o.StopVerb(by="operator", grace_s=5))
    assert sim.kinds_of_last() == ["instance.stop_requested"] and fx.UnloadModel() in d.effects
    assert sim.inst.unload_error == ""  # in flight again: a start waits for it
    d = sim.feed(o.StartVerb(by="operator"))
    assert d.refusal is not None and "unloading its model" in d.refusal.message
    sim.feed(o.OllamaUnloadEnded(ok=True))
    assert sim.kinds_of_last() == ["instance.memory_released", "instance.model_claimed"]


# ---------------------------------------------------------------- a lapsed lease
def test_a_lapsed_lease_holds_a_restart_whose_start_was_refused() -> None:
    sim = Sim(rules=make_rules(Mode.PROCESS))
    sim.start()
    sim.feed(o.RestartVerb(by="controller", grace_s=5))
    sim.checked()  # the weights pre-check passes: stop, then start
    sim.gone(signal=15)
    sim.checked(taken=TAKEN)  # the start after the stop is refused
    assert sim.inst.lifecycle is S.STOPPED and sim.inst.then == "restart"
    sim.feed(o.LeaseLapsed(silent_s=120, controller="controller"))
    assert sim.kinds_of_last() == ["instance.stop_requested"]
    assert sim.last.source == "lease:controller"  # type: ignore[union-attr]
    assert sim.inst.desired is Desired.STOPPED and sim.inst.then == ""
    sim.clock.advance(60)
    assert sim.feed(o.Tick()).effects == ()  # nothing starts without a controller


def test_a_lapsed_lease_holds_a_restart_refused_after_a_crash() -> None:
    sim = Sim(rules=make_rules(Mode.PROCESS))
    sim.start()
    sim.gone(exit_code=1)
    sim.clock.advance(10)
    sim.feed(o.TimerDue(name="restart"))
    sim.checked(taken=TAKEN)
    assert sim.inst.lifecycle is S.RESTARTING
    sim.feed(o.LeaseLapsed(silent_s=120, controller="controller"))
    assert sim.inst.lifecycle is S.STOPPED and sim.inst.desired is Desired.STOPPED
    assert sim.feed(o.Tick()).effects == ()


# ---------------------------------------------------------------- a stop during a health kill
def test_a_stop_during_a_health_kill_keeps_the_earlier_sigkill() -> None:
    sim = Sim(rules=make_rules(Mode.PROCESS, kind="web"))
    sim.start()
    sim.probe(up())
    t0 = sim.clock.now
    for _ in range(sim.rules.supervision.miss_limit):
        sim.probe(sick())
    assert sim.kinds_of_last() == ["instance.unhealthy", "instance.terminating"]
    kill_at = later(t0, sim.rules.health_kill_grace_s)
    sim.clock.advance(1)
    d = sim.feed(o.StopVerb(by="operator", grace_s=30))
    assert fx.ArmTimer(name="kill", due=kill_at) in d.effects
    term = sim.inst.terminating
    assert term is not None and later(term.at, term.grace_s) == kill_at  # a boot resumes it too
    # a longer stop is kept when it is sooner than nothing: no kill was armed
    calm = Sim(rules=make_rules(Mode.PROCESS))
    calm.start()
    d = calm.feed(o.StopVerb(by="operator", grace_s=30))
    assert fx.ArmTimer(name="kill", due=later(calm.clock.now, 30)) in d.effects


# ---------------------------------------------------------------- one attempt number
def test_window_mode_restart_and_start_say_the_same_attempt() -> None:
    rules = make_rules(Mode.PROCESS, restart=policy(max_restarts=2, window_s=20.0))
    sim = Sim(rules=rules)
    sim.start()
    for _ in range(4):
        sim.gone(exit_code=1)
        scheduled = sim.last.events[-1]  # type: ignore[union-attr]
        assert isinstance(scheduled, ev.RestartScheduled)
        sim.clock.advance(30)  # past the window: each crash is the first in it
        sim.feed(o.TimerDue(name="restart"))
        sim.checked()
        starting = sim.last.events[0]  # type: ignore[union-attr]
        assert isinstance(starting, ev.Starting)
        assert starting.attempt == scheduled.attempt == 1
        sim.spawn_ok()
    assert sim.inst.restarts == 4


def test_a_refused_verb_is_not_a_failure_of_the_unload() -> None:
    """An unloaded instance is forgotten whatever Ollama answered (unchanged)."""
    sim = _ollama_loaded()
    sim.feed(o.UnloadVerb(by="operator", grace_s=5))
    d = sim.feed(o.OllamaUnloadEnded(ok=False, error="timeout"))
    assert d.refusal is None or d.refusal.kind is not RefusalKind.FAILED
    assert sim.state is None
