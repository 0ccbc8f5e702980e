"""Unit tests of the pure decision core (``actors/core``): no threads, no processes.

Each test drives one instance through ``decide`` with a hand-advanced clock
and applies the decisions' events with the replay reducer, as the executor
does (see ``tests/core_support.py``). The last test checks that every
lifecycle state and every instance event kind was reached somewhere here.
"""

from __future__ import annotations

from typing import Any

import pytest
from core_support import (
    NS,
    SEEN_KINDS,
    SEEN_STATES,
    Clock,
    Health,
    HealthKind,
    ServerReport,
    Sim,
    effect_types,
    make_rules,
    placed,
    policy,
    replace,
    sick,
    step,
    stored_for,
    up,
)
from hypothesis import given
from hypothesis import strategies as st

from infervisor.actors.core import effects as fx
from infervisor.actors.core import observations as o
from infervisor.actors.core.decision import Decision, RefusalKind
from infervisor.actors.core.rules import Mode, Tracking
from infervisor.adapters.ollama_wire import RunningModel
from infervisor.adapters.spec import Flavor
from infervisor.replay import Desired, LifecycleState, RestartPolicy, apply_instance
from infervisor.replay import events as ev
from infervisor.replay import residency_events as rev
from infervisor.replay.policy import jitter_unit, restarts_in_window
from infervisor.replay.reasons import reason_of
from infervisor.replay.state import later

S = LifecycleState
TAKEN = "127.0.0.1:8080"


def process_sim(**kw: object) -> Sim:
    return Sim(rules=make_rules(Mode.PROCESS, **kw))  # type: ignore[arg-type]


def http_sim(**kw: object) -> Sim:
    return Sim(rules=make_rules(Mode.PROCESS, kind="web", **kw))  # type: ignore[arg-type]


def running(sim: Sim) -> Sim:
    sim.start()
    if sim.rules.supervision.probe == "http":
        sim.probe(up())
    assert sim.inst.lifecycle is S.RUNNING
    return sim


# ====================================================================== 1. lifecycle
def test_harness_starts_loaded() -> None:
    sim = process_sim()
    assert sim.inst.lifecycle is S.LOADED
    assert sim.inst.desired is Desired.STOPPED


def test_process_start_checks_before_starting() -> None:
    sim = process_sim()
    d = sim.feed(o.StartVerb(by="operator"))
    assert d.events == ()
    assert sim.effect(fx.CheckStart) == fx.CheckStart(
        by="operator", reset_budget=True, attempt=0, verb=True
    )
    d = sim.checked(reserved_bytes=123)
    assert sim.kinds_of_last() == ["instance.starting"]
    assert sim.inst.lifecycle is S.STARTING
    assert sim.inst.desired is Desired.RUNNING
    assert sim.inst.reserved_bytes == 123
    token = sim.effect(fx.Spawn).token
    assert token and sim.inst.launch_token == token
    # the process kind is healthy once alive
    sim.spawn_ok()
    assert sim.kinds_of_last() == ["instance.spawned", "instance.ready"]
    assert sim.inst.lifecycle is S.RUNNING
    assert sim.inst.process is not None and sim.inst.up_since == sim.clock.now


def test_spawn_with_a_stale_token_is_ignored() -> None:
    sim = process_sim()
    sim.feed(o.StartVerb(by="operator"))
    sim.checked()
    d = sim.feed(
        o.SpawnSucceeded(token="other", pid=1, pgid=1, start_time=1.0, boot_id="b", argv=[])
    )
    assert d.events == () and sim.inst.process is None


def test_http_kind_ready_on_first_answer() -> None:
    sim = http_sim()
    sim.start()
    assert sim.kinds_of_last() == ["instance.spawned"]
    assert sim.inst.lifecycle is S.STARTING
    sim.probe(up())
    assert sim.kinds_of_last() == ["instance.ready"]
    assert sim.inst.lifecycle is S.RUNNING


def test_probe_for_another_process_is_ignored() -> None:
    sim = running(http_sim())
    d = sim.feed(o.ProbeResult(token=1, report=sick()))
    assert d.events == () and d.tracking == Tracking()


def test_misses_unhealthy_terminate_kill_exit_restart_cycle() -> None:
    sim = running(http_sim())
    limit = sim.rules.supervision.miss_limit
    for i in range(1, limit):
        d = sim.probe(sick())
        assert d.events == () and sim.tracking.misses == i
    t_kill = sim.clock.now
    sim.probe(sick())
    assert sim.kinds_of_last() == ["instance.unhealthy", "instance.terminating"]
    assert sim.inst.lifecycle is S.UNHEALTHY
    assert sim.inst.terminating is not None
    assert sim.effect(fx.Terminate) == fx.Terminate()
    assert sim.effect(fx.ArmTimer) == fx.ArmTimer(
        name="kill", due=later(t_kill, sim.rules.health_kill_grace_s)
    )
    # no probe while terminating
    assert sim.probe(up()).events == ()
    # the grace runs out: SIGKILL
    sim.clock.advance(sim.rules.health_kill_grace_s)
    sim.feed(o.TimerDue(name="kill"))
    assert effect_types(sim.last) == ["Kill"]  # type: ignore[arg-type]
    # the leader exits: reap the group first
    d = sim.feed(o.ProcessExited(pid=sim.inst.process.pid))  # type: ignore[union-attr]
    assert d.events == () and effect_types(d) == ["Reap"]
    t_exit = sim.clock.now
    sim.gone(signal=9)
    assert sim.kinds_of_last() == ["instance.exited", "instance.restart_scheduled"]
    assert sim.inst.lifecycle is S.RESTARTING
    assert sim.inst.last_exit is not None and sim.inst.last_exit.signal == 9
    assert sim.inst.restarts == 1
    due = later(t_exit, 2.0)
    assert sim.inst.restart_due == due
    assert fx.ArmTimer(name="restart", due=due) in sim.last.effects  # type: ignore[union-attr]
    assert fx.CancelTimer(name="kill") in sim.last.effects  # type: ignore[union-attr]
    # a timer that fires early is armed again at the recorded due
    sim.clock.advance(1.0)
    d = sim.feed(o.TimerDue(name="restart"))
    assert d.effects == (fx.ArmTimer(name="restart", due=due),)
    sim.clock.advance(1.0)
    sim.feed(o.TimerDue(name="restart"))
    check = sim.effect(fx.CheckStart)
    assert check == fx.CheckStart(by="supervisor", reset_budget=False, attempt=1, verb=False)
    sim.checked()
    assert sim.kinds_of_last() == ["instance.starting"]
    assert sim.inst.lifecycle is S.STARTING
    assert sim.inst.restarts == 1  # a supervisor start keeps the budget
    assert sim.tracking.misses == limit  # reset by the next answer
    sim.spawn_ok()
    sim.probe(up())
    assert sim.inst.lifecycle is S.RUNNING and sim.tracking.misses == 0


def test_budget_spent_fails_and_holds() -> None:
    sim = running(process_sim())
    for attempt in (1, 2):
        sim.gone(exit_code=1)
        assert sim.kinds_of_last() == ["instance.exited", "instance.restart_scheduled"]
        assert sim.last.events[1].attempt == attempt  # type: ignore[union-attr]
        assert sim.last.events[1].delay_s == 2.0 * 2 ** (attempt - 1)  # type: ignore[union-attr]
        sim.clock.advance(100)
        sim.feed(o.TimerDue(name="restart"))
        sim.checked()
        sim.spawn_ok()
    sim.gone(exit_code=1)
    assert sim.kinds_of_last() == ["instance.exited", "instance.failed"]
    assert sim.inst.lifecycle is S.FAILED and sim.inst.desired is Desired.STOPPED
    # held: ticks do not start it
    sim.clock.advance(1000)
    assert sim.feed(o.Tick()).effects == ()
    # an operator start resets the budget
    sim.start(by="operator")
    assert sim.inst.restarts == 0 and sim.inst.lifecycle is S.RUNNING


def test_one_shot_exit_zero_finishes() -> None:
    sim = running(process_sim(continuous=False))
    sim.gone(exit_code=0)
    assert sim.kinds_of_last() == ["instance.exited", "instance.finished"]
    assert sim.inst.lifecycle is S.FINISHED and sim.inst.desired is Desired.STOPPED
    assert not [e for e in sim.last.effects if isinstance(e, fx.ArmTimer)]  # type: ignore[union-attr]


def test_one_shot_nonzero_exit_restarts() -> None:
    sim = running(process_sim(continuous=False))
    sim.gone(exit_code=3)
    assert sim.kinds_of_last() == ["instance.exited", "instance.restart_scheduled"]


def test_continuous_exit_zero_restarts() -> None:
    sim = running(process_sim())
    sim.gone(exit_code=0)
    assert sim.inst.lifecycle is S.RESTARTING


def test_spawn_failed_is_an_exit_and_refuses_the_verb() -> None:
    sim = process_sim()
    sim.feed(o.StartVerb(by="operator"))
    sim.checked()
    token = sim.effect(fx.Spawn).token
    d = sim.feed(o.SpawnFailed(token=token, reason="no such program"))
    assert sim.kinds_of_last() == ["instance.exited", "instance.restart_scheduled"]
    assert d.refusal is not None and d.refusal.kind is RefusalKind.SPAWN


# ---------------------------------------------------------------- stop in every state
def _in_state(state: S) -> Sim:
    """A process-mode instance brought to ``state`` by the core itself."""
    sim = process_sim(continuous=state is not S.FINISHED)
    if state is S.LOADED:
        return sim
    running(sim)
    if state is S.RUNNING:
        return sim
    if state is S.STOPPING:
        sim.feed(o.StopVerb(by="operator", grace_s=10))
        return sim
    if state is S.STOPPED:
        sim.feed(o.StopVerb(by="operator", grace_s=10))
        sim.gone(signal=15)
        return sim
    if state is S.FINISHED:
        sim.gone(exit_code=0)
        return sim
    if state is S.RESTARTING:
        sim.gone(exit_code=1)
        return sim
    if state is S.FAILED:
        sim.state = replace(sim.inst, restarts=2, restart_stamps=(sim.clock.now,) * 2)
        sim.gone(exit_code=1)
        return sim
    if state is S.EXITED:
        # the exit recorded, its follow-up lost (a crash between the two)
        event = ev.Exited(pid=sim.inst.process.pid, exit_code=1, signal=None, reason="x")  # type: ignore[union-attr]

        sim.state = apply_instance(sim.inst, stored_for(sim.inst, event, sim.clock.now, "t"), event)
        SEEN_STATES.add(S.EXITED)
        return sim
    raise AssertionError(state)


def _starting(*, spawned: bool) -> Sim:
    sim = http_sim()
    sim.feed(o.StartVerb(by="operator"))
    sim.checked()
    if spawned:
        sim.spawn_ok()
    assert sim.inst.lifecycle is S.STARTING
    return sim


def _unhealthy() -> Sim:
    sim = running(http_sim())
    for _ in range(sim.rules.supervision.miss_limit):
        sim.probe(sick())
    assert sim.inst.lifecycle is S.UNHEALTHY
    return sim


STATES_WITHOUT_PROCESS = [S.LOADED, S.RESTARTING, S.EXITED, S.FAILED, S.FINISHED]


@pytest.mark.parametrize("state", [s for s in STATES_WITHOUT_PROCESS if s is not S.LOADED])
def test_stop_without_a_process_is_stopped_at_once(state: S) -> None:
    sim = _in_state(state)
    assert sim.inst.lifecycle is state
    d = sim.feed(o.StopVerb(by="operator", grace_s=10))
    assert sim.kinds_of_last() == ["instance.stop_requested"]
    assert sim.inst.lifecycle is S.STOPPED and sim.inst.desired is Desired.STOPPED
    assert fx.CancelTimer(name="restart") in d.effects
    assert not [e for e in d.effects if isinstance(e, fx.Terminate | fx.Kill)]
    # nothing undoes it: ticks and a late restart timer do nothing
    sim.clock.advance(1000)
    assert sim.feed(o.Tick()).effects == ()
    assert sim.feed(o.TimerDue(name="restart")).effects == ()


def test_stop_while_starting_before_spawn() -> None:
    sim = _starting(spawned=False)
    sim.feed(o.StopVerb(by="operator", grace_s=10))
    assert sim.inst.lifecycle is S.STOPPED
    assert not [e for e in sim.last.effects if isinstance(e, fx.Terminate)]  # type: ignore[union-attr]


@pytest.mark.parametrize("state", [S.STOPPED, S.LOADED])
def test_stop_when_stopped_records_nothing(state: S) -> None:
    """A placed instance never started (``loaded``, wanted stopped) is at rest as a
    stopped one is: its stop records nothing (stop 33's trial recorded
    ``loaded -> stopped`` with a grace for it)."""
    sim = _in_state(state)
    assert sim.inst.desired is Desired.STOPPED
    d = sim.feed(o.StopVerb(by="operator", grace_s=10))
    assert d.events == () and d.refusal is None
    assert sim.inst.lifecycle is state


@pytest.mark.parametrize("which", ["starting", "running", "unhealthy"])
def test_stop_with_a_process_terminates_then_escalates(which: str) -> None:
    sim = {
        "starting": lambda: _starting(spawned=True),
        "running": lambda: running(process_sim()),
        "unhealthy": _unhealthy,
    }[which]()
    t0 = sim.clock.now
    # An unhealthy one has its health kill armed (4 s): the stop does not push it later.
    grace = sim.rules.health_kill_grace_s if which == "unhealthy" else 7
    sim.feed(o.StopVerb(by="operator", grace_s=7))
    assert sim.kinds_of_last() == ["instance.stop_requested"]
    assert sim.inst.lifecycle is S.STOPPING and sim.inst.desired is Desired.STOPPED
    assert sim.inst.terminating is not None and sim.inst.terminating.by == "operator"
    assert fx.Terminate() in sim.last.effects  # type: ignore[union-attr]
    due = later(t0, grace)
    assert fx.ArmTimer(name="kill", due=due) in sim.last.effects  # type: ignore[union-attr]
    # a second stop escalates at once
    d = sim.feed(o.StopVerb(by="operator", grace_s=7))
    assert fx.Kill() in d.effects and sim.inst.lifecycle is S.STOPPING
    # the group is gone: stopped, not restarted
    sim.gone(signal=9)
    assert sim.kinds_of_last() == ["instance.exited"]
    assert sim.inst.lifecycle is S.STOPPED
    assert sim.feed(o.Tick()).effects == ()


def test_shutdown_stop_keeps_it_wanted_running() -> None:
    sim = running(process_sim())
    sim.feed(o.StopVerb(by="shutdown", grace_s=5))
    assert sim.inst.lifecycle is S.STOPPING and sim.inst.desired is Desired.RUNNING


# ---------------------------------------------------------------- restart verb
def test_restart_is_one_decision_and_coalesces() -> None:
    sim = running(process_sim())
    sim.state = replace(sim.inst, restarts=1, restart_stamps=(sim.clock.now,))
    sim.feed(o.RestartVerb(by="operator", grace_s=5))
    # The weights are checked first, so a refused launch never takes the server down.
    assert sim.last.events == () and sim.effect(fx.CheckStart).weights_only  # type: ignore[union-attr]
    sim.checked()
    assert sim.kinds_of_last() == ["instance.stop_requested"]
    assert sim.last.events[0].then == "restart"  # type: ignore[union-attr]
    assert sim.inst.lifecycle is S.STOPPING and sim.inst.desired is Desired.RUNNING
    assert fx.Terminate() in sim.last.effects  # type: ignore[union-attr]
    d = sim.feed(o.RestartVerb(by="operator", grace_s=5))
    assert d.events == () and d.effects == () and d.refusal is None
    d = sim.feed(
        o.StartChecked(by="operator", reset_budget=True, attempt=0, verb=True, precheck=True)
    )
    assert d.events == ()  # a late pre-check of a restart already under way: nothing more
    sim.gone(signal=15)
    assert sim.kinds_of_last() == ["instance.exited"]
    assert sim.inst.lifecycle is S.STOPPED
    check = sim.effect(fx.CheckStart)
    assert check == fx.CheckStart(by="operator", reset_budget=True, attempt=0, verb=False)
    sim.checked()
    assert sim.inst.lifecycle is S.STARTING and sim.inst.restarts == 0
    assert sim.inst.then == ""


def test_restart_of_an_adopted_server_is_refused() -> None:
    sim = Sim(rules=make_rules(Mode.ADOPTED))
    sim.start()
    d = sim.feed(o.RestartVerb(by="operator", grace_s=5))
    assert d.refusal is not None and d.refusal.kind is RefusalKind.REFUSED and d.events == ()


# ---------------------------------------------------------------- unload
def test_unload_without_a_process_forgets() -> None:
    sim = process_sim()
    d = sim.feed(o.UnloadVerb(by="operator", grace_s=5))
    assert [type(e) for e in d.events] == [ev.Unloaded]
    assert sim.state is None
    assert fx.RemoveWorkdir() in d.effects


def test_unload_with_a_process_stops_then_forgets() -> None:
    sim = running(process_sim())
    t0 = sim.clock.now
    sim.feed(o.UnloadVerb(by="operator", grace_s=5))
    assert sim.kinds_of_last() == ["instance.stop_requested"]
    assert sim.inst.then == "unload"
    assert fx.ArmTimer(name="kill", due=later(t0, 5)) in sim.last.effects  # type: ignore[union-attr]
    sim.gone(signal=15)
    assert sim.kinds_of_last() == ["instance.exited", "instance.unloaded"]
    assert sim.state is None
    assert fx.RemoveWorkdir() in sim.last.effects  # type: ignore[union-attr]


def test_placement_generations() -> None:
    sim = process_sim()
    sim.feed(o.PlacementVerb(placed_by="ctl", generation=5))
    assert sim.kinds_of_last() == ["instance.replaced"] and sim.inst.generation == 5
    sim.feed(o.PlacementVerb(placed_by="ctl", generation=3))
    assert sim.kinds_of_last() == ["instance.placement_ignored"] and sim.inst.generation == 5


def test_listening_beyond_loopback_is_stopped_and_held() -> None:
    sim = running(process_sim())
    sim.feed(o.ListenersSeen(owned_beyond=("0.0.0.0:8080",)))
    assert sim.kinds_of_last() == ["instance.exposed", "instance.terminating"]
    assert sim.inst.desired is Desired.STOPPED
    sim.gone(signal=15)
    assert sim.inst.lifecycle is S.STOPPED
    d = sim.feed(o.StartVerb(by="operator"))
    assert d.refusal is not None and d.refusal.kind is RefusalKind.INVALID_STATE


# ---------------------------------------------------------------- adopted
def test_adopted_start_only_after_answers() -> None:
    sim = Sim(rules=make_rules(Mode.ADOPTED))
    d = sim.feed(o.StartVerb(by="operator"))
    assert d.events == () and d.effects == (fx.CheckAnswers(by="operator"),)
    d = sim.feed(o.AnswersChecked(by="operator", why_not="connection refused"))
    assert d.events == () and d.refusal is not None
    assert d.refusal.kind is RefusalKind.ADMISSION and sim.inst.lifecycle is S.LOADED
    sim.feed(o.AnswersChecked(by="operator", why_not=None))
    assert sim.kinds_of_last() == ["instance.starting", "instance.ready"]
    assert sim.inst.lifecycle is S.RUNNING
    d = sim.feed(o.StartVerb(by="operator"))  # already adopted: answered as it is
    assert (d.events, d.effects, d.refusal) == ((), (), None)


def test_a_start_of_a_live_instance_is_answered_as_it_is_and_refused_while_stopping() -> None:
    sim = process_sim()
    sim.feed(o.StartVerb(by="operator"))
    sim.checked()
    assert sim.inst.lifecycle is S.STARTING
    d = sim.feed(o.StartVerb(by="operator"))
    assert (d.events, d.effects, d.refusal) == ((), (), None)
    sim = running(process_sim())
    d = sim.feed(o.StartVerb(by="operator"))
    assert (d.events, d.effects, d.refusal) == ((), (), None)
    sim.feed(o.StopVerb(by="operator", grace_s=5.0))
    assert sim.inst.lifecycle is S.STOPPING
    d = sim.feed(o.StartVerb(by="operator"))
    assert d.refusal is not None and d.refusal.kind is RefusalKind.INVALID_STATE
    assert "start it once it has stopped" in d.refusal.message


def test_adopted_stop_refused_misses_recover_never_signalled() -> None:
    sim = Sim(rules=make_rules(Mode.ADOPTED))
    sim.start()
    d = sim.feed(o.StopVerb(by="operator", grace_s=5))
    assert d.refusal is not None and d.refusal.kind is RefusalKind.REFUSED and d.events == ()
    assert sim.feed(o.StopVerb(by="shutdown", grace_s=5)).refusal is None
    effects: list[object] = []
    down = o.ProbeResult(token=0, report=sick())
    for _ in range(sim.rules.supervision.miss_limit):
        effects += sim.feed(down).effects
    assert sim.kinds_of_last() == ["instance.unhealthy"]
    assert sim.inst.lifecycle is S.UNHEALTHY
    sim.feed(down)
    effects += sim.last.effects  # type: ignore[union-attr]
    assert sim.last.events == ()  # type: ignore[union-attr]
    sim.probe(up())
    assert sim.kinds_of_last() == ["instance.recovered"] and sim.inst.lifecycle is S.RUNNING
    effects += sim.feed(o.Tick()).effects
    effects += sim.feed(o.LeaseLapsed(silent_s=999, controller="controller")).effects
    assert not [e for e in effects if isinstance(e, fx.Terminate | fx.Kill)]
    d = sim.feed(o.UnloadVerb(by="operator", grace_s=5))
    assert [type(e) for e in d.events] == [ev.Unloaded] and sim.state is None
    assert fx.RemoveWorkdir() not in d.effects


# ---------------------------------------------------------------- ollama
def _ollama_started(*, resident: bool) -> Sim:
    sim = Sim(rules=make_rules(Mode.OLLAMA))
    sim.feed(o.StartVerb(by="operator"))
    sim.checked(reserved_bytes=1000)
    assert sim.kinds_of_last() == ["instance.starting"]
    assert sim.effect(fx.CheckResident) == fx.CheckResident()
    assert not [e for e in sim.last.effects if isinstance(e, fx.Spawn)]  # type: ignore[union-attr]
    sim.feed(o.OllamaResidency(resident=resident))
    return sim


def test_ollama_claims_before_loading() -> None:
    sim = _ollama_started(resident=False)
    assert [type(e) for e in sim.last.events] == [ev.ModelClaimed]  # type: ignore[union-attr]
    assert sim.last.events[0].ours is True  # type: ignore[union-attr]
    assert sim.last.effects == (fx.LoadModel(),)  # type: ignore[union-attr]
    assert sim.inst.ollama_owned is True
    sim.feed(o.OllamaLoadEnded(ok=True))
    assert sim.kinds_of_last() == ["instance.ready"] and sim.inst.lifecycle is S.RUNNING


def test_ollama_resident_already_is_not_ours() -> None:
    sim = _ollama_started(resident=True)
    assert sim.kinds_of_last() == ["instance.model_claimed", "instance.ready"]
    assert sim.inst.ollama_owned is False and sim.inst.lifecycle is S.RUNNING
    # stop does not unload what is not ours; the reservation is released
    d = sim.feed(o.StopVerb(by="operator", grace_s=5))
    assert sim.kinds_of_last() == ["instance.stop_requested", "instance.memory_released"]
    assert fx.UnloadModel() not in d.effects
    assert sim.inst.lifecycle is S.STOPPED and sim.inst.reserved_bytes == 0


def test_ollama_stop_unloads_ours_and_releases_once_gone() -> None:
    sim = _ollama_started(resident=False)
    sim.feed(o.OllamaLoadEnded(ok=True))
    d = sim.feed(o.StopVerb(by="operator", grace_s=5))
    assert sim.kinds_of_last() == ["instance.stop_requested"]
    assert fx.UnloadModel() in d.effects
    assert sim.inst.reserved_bytes == 1000  # held until Ollama no longer lists it
    assert not [e for e in d.effects if isinstance(e, fx.Terminate | fx.Kill)]
    d = sim.feed(o.OllamaUnloadEnded(ok=False, error="timeout"))
    assert d.refusal is not None and d.refusal.kind is RefusalKind.FAILED
    assert sim.kinds_of_last() == ["instance.unload_failed"]  # recorded, not left in flight
    sim.feed(o.OllamaUnloadEnded(ok=True))
    assert sim.kinds_of_last() == ["instance.memory_released", "instance.model_claimed"]
    assert sim.inst.reserved_bytes == 0 and sim.inst.ollama_owned is False


def test_ollama_misses_unhealthy_recovered_no_kill() -> None:
    sim = _ollama_started(resident=True)
    for _ in range(sim.rules.supervision.miss_limit):
        sim.probe(sick())
    assert sim.inst.lifecycle is S.UNHEALTHY
    assert not [e for e in sim.last.effects if isinstance(e, fx.Terminate)]  # type: ignore[union-attr]
    sim.probe(up())
    assert sim.kinds_of_last() == ["instance.recovered"]


def test_ollama_load_refused_is_an_exit() -> None:
    sim = _ollama_started(resident=False)
    sim.feed(o.OllamaLoadEnded(ok=False, error="model not found", refused=True))
    assert sim.kinds_of_last() == [
        "instance.model_claimed",
        "instance.exited",
        "instance.restart_scheduled",
    ]
    assert sim.inst.ollama_owned is False


def test_ollama_unload_while_running_ours() -> None:
    sim = _ollama_started(resident=False)
    sim.feed(o.OllamaLoadEnded(ok=True))
    d = sim.feed(o.UnloadVerb(by="operator", grace_s=5))
    assert fx.UnloadModel() in d.effects and sim.inst.then == "unload"
    sim.feed(o.OllamaUnloadEnded(ok=True))
    assert sim.kinds_of_last()[-1] == "instance.unloaded" and sim.state is None


# ====================================================================== 2. policy edges
@given(
    attempt=st.integers(min_value=0, max_value=200),
    jitter=st.floats(min_value=0, max_value=1),
    unit=st.floats(min_value=0, max_value=1, exclude_max=True),
    base=st.floats(min_value=0.001, max_value=100),
    extra=st.floats(min_value=0, max_value=1000),
)
def test_jitter_never_exceeds_the_cap(
    attempt: int, jitter: float, unit: float, base: float, extra: float
) -> None:
    p = RestartPolicy(base_s=base, cap_s=base + extra, jitter=jitter)
    p.validate()
    d = p.delay(attempt, unit)
    assert d <= p.cap_s
    assert d >= min(base * 2 ** min(attempt, 16), p.cap_s) - 1e-9


@given(
    iid=st.text(min_size=1, max_size=40),
    attempt=st.integers(min_value=0, max_value=100),
    seq=st.integers(min_value=0, max_value=10**9),
)
def test_jitter_unit_is_a_fixed_fraction(iid: str, attempt: int, seq: int) -> None:
    u = jitter_unit(iid, attempt, seq)
    assert 0 <= u < 1 and u == jitter_unit(iid, attempt, seq)


def test_same_decision_gives_same_delay() -> None:
    rules = make_rules(Mode.PROCESS, restart=policy(jitter=1.0, max_restarts=5))
    sim = running(Sim(rules=rules))
    twin = sim.copy()
    sim.gone(exit_code=1)
    twin.gone(exit_code=1)
    a, b = sim.last.events[1], twin.last.events[1]  # type: ignore[union-attr]
    assert isinstance(a, ev.RestartScheduled) and a == b
    assert sim.inst.restart_due == twin.inst.restart_due
    assert 2.0 <= a.delay_s <= 4.0
    unit = jitter_unit(sim.inst.instance_id, 0, sim.inst.last_seq - 1)
    assert a.delay_s == pytest.approx(rules.supervision.restart.delay(0, unit))


def _two_restarts(window: float = 100.0) -> Sim:
    rules = make_rules(Mode.PROCESS, restart=policy(max_restarts=2, window_s=window))
    sim = running(Sim(rules=rules))
    for _ in range(2):
        sim.gone(exit_code=1)
        sim.clock.advance(10)
        sim.feed(o.TimerDue(name="restart"))
        sim.checked()
        sim.spawn_ok()
    assert sim.inst.restarts == 2 and len(sim.inst.restart_stamps) == 2
    return sim


@pytest.mark.parametrize("step_s", [3600.0, -3600.0])
def test_wall_step_within_one_boot_does_not_refund_budget(step_s: float) -> None:
    sim = _two_restarts()
    sim.clock.step_wall(step_s)
    sim.clock.advance(5)
    p = sim.rules.supervision.restart
    assert restarts_in_window(sim.inst, p, sim.clock.now) == 2
    sim.gone(exit_code=1)
    assert sim.kinds_of_last() == ["instance.exited", "instance.failed"]


@pytest.mark.parametrize("step_s", [3600.0, -3600.0])
def test_wall_step_within_one_boot_does_not_spend_budget(step_s: float) -> None:
    sim = _two_restarts()
    sim.clock.step_wall(step_s)
    sim.clock.advance(200)  # past the window on the monotonic clock
    p = sim.rules.supervision.restart
    assert restarts_in_window(sim.inst, p, sim.clock.now) == 0
    sim.gone(exit_code=1)
    assert sim.kinds_of_last() == ["instance.exited", "instance.restart_scheduled"]
    assert sim.last.events[1].attempt == 1  # type: ignore[union-attr]


def test_across_boots_the_wall_clock_counts() -> None:
    sim = _two_restarts()
    p = sim.rules.supervision.restart
    soon = Clock(sim.clock.wall_ns / NS, sim.clock.mono_s, sim.clock.boot)
    soon.reboot("boot-b", down_s=20)
    assert restarts_in_window(sim.inst, p, soon.now) == 2
    late = Clock(sim.clock.wall_ns / NS, sim.clock.mono_s, sim.clock.boot)
    late.reboot("boot-b", down_s=500)
    assert restarts_in_window(sim.inst, p, late.now) == 0


def test_stable_after_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="stable_after_s"):
        RestartPolicy(stable_after_s=0).validate()


def test_stability_reset_process_kind_on_tick() -> None:
    sim = running(process_sim())
    sim.crash_and_restart()
    assert sim.inst.restarts == 1 and sim.inst.lifecycle is S.RUNNING
    stable = sim.rules.supervision.restart.stable_after_s
    sim.clock.advance(stable - 1)
    assert sim.feed(o.Tick()).events == ()
    sim.clock.advance(1)
    sim.feed(o.Tick())
    assert sim.kinds_of_last() == ["instance.stable"] and sim.inst.restarts == 0
    assert sim.feed(o.Tick()).events == ()  # once


def test_stability_reset_http_kind_on_healthy_probe() -> None:
    sim = running(http_sim())
    sim.crash_and_restart()
    sim.probe(up())
    assert sim.inst.restarts == 1 and sim.inst.lifecycle is S.RUNNING
    sim.clock.advance(sim.rules.supervision.restart.stable_after_s - 1)
    assert sim.probe(up()).events == ()
    sim.clock.advance(1)
    sim.probe(up())
    assert sim.kinds_of_last() == ["instance.stable"] and sim.inst.restarts == 0


def test_wall_step_does_not_shorten_a_backoff() -> None:
    sim = running(process_sim())
    sim.gone(exit_code=1)
    due = sim.inst.restart_due
    sim.clock.step_wall(3600)
    d = sim.feed(o.TimerDue(name="restart"))
    assert d.effects == (fx.ArmTimer(name="restart", due=due),)  # type: ignore[arg-type]
    sim.clock.advance(2)
    assert sim.feed(o.TimerDue(name="restart")).effects[0] == fx.CheckStart(
        by="supervisor", reset_budget=False, attempt=1, verb=False
    )


def test_failure_line_while_starting_is_unhealthy_at_once() -> None:
    sim = _starting(spawned=True)
    pid = sim.inst.process.pid  # type: ignore[union-attr]
    sim.feed(o.ProbeResult(token=pid, report=up(), failure="error loading model"))
    assert sim.kinds_of_last() == ["instance.unhealthy", "instance.terminating"]
    assert fx.Terminate() in sim.last.effects  # type: ignore[union-attr]


def test_inference_kind_loading_allowance() -> None:
    sim = Sim(rules=make_rules(Mode.PROCESS, kind="inference"))
    sim.start()
    loading = ServerReport(health=Health(HealthKind.LOADING))
    sim.clock.advance(100)
    d = sim.probe(loading)
    assert d.events == () and sim.tracking.misses == 0
    sim.clock.advance(sim.rules.supervision.startup_cap_s)
    for _ in range(sim.rules.supervision.miss_limit):
        sim.probe(loading)
    assert sim.kinds_of_last() == ["instance.unhealthy", "instance.terminating"]


def test_lease_lapse_stops_what_a_controller_placed() -> None:
    sim = running(process_sim())
    sim.feed(o.LeaseLapsed(silent_s=120, controller="controller"))
    assert sim.kinds_of_last() == ["instance.stop_requested"]
    assert sim.inst.desired is Desired.STOPPED and sim.last.source == "lease:controller"  # type: ignore[union-attr]
    own = running(process_sim())
    own.state = replace(own.inst, placed_by=own.rules.node_id)
    assert own.feed(o.LeaseLapsed(silent_s=120, controller="controller")).events == ()
    other = running(process_sim())  # another controller's lapse is not its lease's
    assert other.feed(o.LeaseLapsed(silent_s=120, controller="ctl2")).events == ()


# ====================================================================== 3. refused starts
def test_refused_verb_start_recorded_once_per_cause() -> None:
    sim = process_sim()
    sim.feed(o.StartVerb(by="operator"))
    d = sim.checked(taken=TAKEN)
    assert sim.kinds_of_last() == ["instance.start_refused"]
    assert d.refusal is not None and d.refusal.kind is RefusalKind.ADMISSION
    assert TAKEN in d.refusal.message
    assert sim.inst.lifecycle is S.LOADED and sim.inst.restarts == 0
    assert not [e for e in d.effects if isinstance(e, fx.Spawn)]
    sim.feed(o.StartVerb(by="operator"))
    d = sim.checked(taken=TAKEN)
    assert d.events == () and d.refusal is not None
    # another cause is recorded
    sim.feed(o.StartVerb(by="operator"))
    d = sim.checked(memory_refusal="needs 9 GB, 2 GB free")
    assert sim.kinds_of_last() == ["instance.start_refused"]
    # a successful start clears the cause
    sim.start()
    assert sim.inst.refusal == ""


def test_refused_restart_keeps_attempt_and_tick_retries() -> None:
    sim = running(process_sim())
    sim.gone(exit_code=1)
    assert sim.inst.restarts == 1
    sim.clock.advance(10)
    sim.feed(o.TimerDue(name="restart"))
    check = sim.effect(fx.CheckStart)
    d = sim.checked(check, taken=TAKEN)
    assert sim.kinds_of_last() == ["instance.start_refused"] and d.refusal is None
    assert sim.inst.lifecycle is S.RESTARTING and sim.inst.restarts == 1
    sim.clock.advance(5)
    d = sim.feed(o.Tick())
    assert d.events == ()
    assert sim.effect(fx.CheckStart) == fx.CheckStart(
        by="supervisor", reset_budget=False, attempt=1, verb=False
    )
    sim.checked(taken=TAKEN)
    assert sim.last.events == ()  # type: ignore[union-attr]
    sim.feed(o.Tick())
    sim.checked()
    assert sim.kinds_of_last() == ["instance.starting"] and sim.inst.restarts == 1


def test_start_checked_after_a_stop_is_dropped() -> None:
    sim = running(process_sim())
    sim.gone(exit_code=1)
    sim.clock.advance(10)
    sim.feed(o.TimerDue(name="restart"))
    check = sim.effect(fx.CheckStart)
    sim.feed(o.StopVerb(by="operator", grace_s=1))
    d = sim.checked(check)
    assert d.events == () and sim.inst.lifecycle is S.STOPPED


# ====================================================================== 4. boot
def _boot(sim: Sim, process: o.ProcessAlive | o.ProcessGone | o.ProcessNone) -> None:
    sim.clock.advance(1)
    sim.feed(o.BootSeen(process=process))


def _alive(sim: Sim, *, recovered: bool = False) -> o.ProcessAlive:
    p = sim.inst.process
    if p is None:
        return o.ProcessAlive(
            pid=9999,
            pgid=9999,
            start_time=sim.clock.wall_ns / NS,
            boot_id="boot-a",
            recovered=recovered,
        )
    return o.ProcessAlive(pid=p.pid, pgid=p.pgid, start_time=p.start_time, boot_id=p.boot_id)


def _gone(sim: Sim, code: int | None = 1) -> o.ProcessGone:
    pid = sim.inst.process.pid if sim.inst.process is not None else None
    return o.ProcessGone(
        pid=pid, exit_code=code, signal=None, reason="ended while the node was down"
    )


def _boot_states() -> dict[str, Sim]:
    stopped = _in_state(S.STOPPED)
    return {
        "loaded": _in_state(S.LOADED),
        "starting-unspawned": _starting(spawned=False),
        "starting-spawned": _starting(spawned=True),
        "running": running(process_sim()),
        "unhealthy-terminating": _unhealthy(),
        "restarting": _in_state(S.RESTARTING),
        "stopping": _in_state(S.STOPPING),
        "stopped": stopped,
        "exited": _in_state(S.EXITED),
        "failed": _in_state(S.FAILED),
        "finished": _in_state(S.FINISHED),
    }


BOOT_STATES = list(_boot_states())


#: What the executor can report (``actors/boot_facts.gather``): a live process only
#: where one is recorded, or a launch of ``starting`` recovered by its token.
_ALIVE_POSSIBLE = {
    "starting-unspawned",
    "starting-spawned",
    "running",
    "unhealthy-terminating",
    "stopping",
}
BOOT_MATRIX = [
    (name, fact)
    for name in BOOT_STATES
    for fact in ("alive", "gone", "none")
    if fact != "alive" or name in _ALIVE_POSSIBLE
]


@pytest.mark.parametrize(("name", "fact"), BOOT_MATRIX)
def test_boot_matrix(name: str, fact: str) -> None:
    """Every recorded state and process fact decides events the reducer accepts, and
    accounts for the process: re-attached when alive, an exit when gone."""
    sim = _boot_states()[name]
    had = sim.inst.process is not None
    process = {
        "alive": lambda: _alive(sim, recovered=not had),
        "gone": lambda: _gone(sim),
        "none": o.ProcessNone,
    }[fact]()
    before = sim.inst.lifecycle
    _boot(sim, process)
    kinds = sim.kinds_of_last()
    starts = [e for e in sim.last.effects if isinstance(e, fx.CheckStart | fx.Spawn)]  # type: ignore[union-attr]
    if fact == "alive":  # a kill in flight goes on with its grace, recorded (stop 33)
        resumed = ["instance.terminating"] if sim.inst.terminating is not None else []
        assert kinds[-1 - len(resumed) :] == ["instance.reattached", *resumed]
        assert sim.inst.process is not None
        assert sim.inst.lifecycle is before and not starts
    elif had or name == "starting-unspawned":
        assert kinds[0] == "instance.exited" and sim.inst.process is None
        if before is S.STOPPING:
            assert sim.inst.lifecycle is S.STOPPED and not starts
        elif name == "starting-unspawned" and fact == "none":
            # The launch never ran: started again, no restart counted.
            assert kinds[1:] == [] and starts and sim.inst.restarts == 0
        else:
            assert kinds[1:] == ["instance.restart_scheduled"]
    elif before in (S.FAILED, S.FINISHED, S.STOPPED, S.LOADED):
        assert kinds == [] and not starts  # held, or never wanted running
    elif before is S.EXITED:
        assert kinds == ["instance.restart_scheduled"]  # the lost follow-up is decided
    elif before is S.RESTARTING:
        assert kinds == [] and sim.last.effects == (  # type: ignore[union-attr]
            fx.ArmTimer(name="restart", due=sim.inst.restart_due),  # type: ignore[arg-type]
        )
    else:
        raise AssertionError(f"unexpected combination {name}/{fact}: {kinds}")


def test_boot_restarting_due_in_future_arms_timer() -> None:
    sim = _in_state(S.RESTARTING)
    due = sim.inst.restart_due
    assert due is not None
    sim.clock.advance(0.5)
    sim.feed(o.BootSeen(process=o.ProcessNone()))
    assert sim.last.events == ()  # type: ignore[union-attr]
    assert sim.last.effects == (fx.ArmTimer(name="restart", due=due),)  # type: ignore[union-attr]


def test_boot_restarting_due_in_future_across_reboot_arms_timer() -> None:
    sim = _in_state(S.RESTARTING)
    due = sim.inst.restart_due
    sim.clock.reboot("boot-b", down_s=0.5)
    sim.feed(o.BootSeen(process=o.ProcessNone()))
    assert sim.last.effects == (fx.ArmTimer(name="restart", due=due),)  # type: ignore[union-attr,arg-type]


def test_boot_restarting_due_passed_checks_start() -> None:
    sim = _in_state(S.RESTARTING)
    sim.clock.reboot("boot-b", down_s=60)
    sim.feed(o.BootSeen(process=o.ProcessNone()))
    assert sim.last.events == ()  # type: ignore[union-attr]
    assert sim.effect(fx.CheckStart) == fx.CheckStart(
        by="supervisor", reset_budget=False, attempt=1, verb=False
    )


def test_boot_exited_one_shot_zero_finishes() -> None:
    sim = running(process_sim(continuous=False))
    event = ev.Exited(pid=sim.inst.process.pid, exit_code=0, signal=None, reason="done")  # type: ignore[union-attr]

    sim.state = apply_instance(sim.inst, stored_for(sim.inst, event, sim.clock.now, "t"), event)
    assert sim.inst.lifecycle is S.EXITED
    _boot(sim, o.ProcessNone())
    assert sim.kinds_of_last() == ["instance.finished"]
    assert not [e for e in sim.last.effects if isinstance(e, fx.CheckStart | fx.ArmTimer)]  # type: ignore[union-attr]


def test_boot_unhealthy_terminating_alive_resumes_kill() -> None:
    sim = _unhealthy()
    term = sim.inst.terminating
    assert term is not None
    sim.clock.advance(1)
    sim.feed(o.BootSeen(process=_alive(sim)))
    assert sim.kinds_of_last() == ["instance.reattached", "instance.terminating"]
    assert fx.Terminate() in sim.last.effects  # type: ignore[union-attr]
    now = sim.clock.now
    assert fx.ArmTimer(name="kill", due=later(now, term.grace_s)) in sim.last.effects  # type: ignore[union-attr]
    assert sim.inst.lifecycle is S.UNHEALTHY


def test_boot_stopping_alive_resumes_stop_kill() -> None:
    """A stop in flight whose server still lives at boot: SIGTERM again and the
    stop's full grace from the boot, recorded (the dead node may never have sent
    its SIGTERM: stop 33), so a second boot reads the same kill time."""
    sim = _in_state(S.STOPPING)
    term = sim.inst.terminating
    assert term is not None
    sim.clock.advance(term.grace_s + 60)  # the node was down longer than the grace
    sim.feed(o.BootSeen(process=_alive(sim)))
    now = sim.clock.now
    assert sim.kinds_of_last() == ["instance.reattached", "instance.terminating"]
    assert fx.Terminate() in sim.last.effects  # type: ignore[union-attr]
    assert fx.ArmTimer(name="kill", due=later(now, term.grace_s)) in sim.last.effects  # type: ignore[union-attr]
    resumed = sim.inst.terminating
    assert resumed is not None and (resumed.cause, resumed.grace_s) == (term.cause, term.grace_s)
    assert sim.inst.then == "" and sim.inst.lifecycle is S.STOPPING


@pytest.mark.parametrize("fact", ["gone", "none"])
def test_boot_starts_what_a_killed_shutdown_was_stopping(fact: str) -> None:
    """The node died in its shutdown, the server's exit unrecorded: the boot records
    the exit and starts it in the same decision (wanted running: the shutdown
    leaves it so), not the reconcile tick after it (the newcomer's trial, stop 31)."""
    sim = running(process_sim())
    sim.feed(o.StopVerb(by="shutdown", grace_s=10))
    assert sim.inst.lifecycle is S.STOPPING and sim.inst.desired is Desired.RUNNING
    if fact == "none":  # no process recorded (its record lost with the node)
        sim.state = replace(sim.inst, process=None)
    _boot(sim, _gone(sim, code=None) if fact == "gone" else o.ProcessNone())
    assert sim.kinds_of_last() == ["instance.exited"]
    assert sim.effect(fx.CheckStart).by == "boot"


def test_boot_restarts_a_live_server_a_killed_shutdown_was_stopping() -> None:
    """Still alive at boot: the shutdown's stop goes on with its full grace from the boot,
    and the boot records that it starts again once gone (then restart, by the boot)."""
    sim = running(process_sim())
    sim.feed(o.StopVerb(by="shutdown", grace_s=10))
    term = sim.inst.terminating
    assert term is not None
    _boot(sim, _alive(sim))
    assert sim.kinds_of_last() == ["instance.reattached", "instance.stop_requested"]
    now = sim.clock.now  # the full grace from the boot (stop 33)
    assert fx.ArmTimer(name="kill", due=later(now, term.grace_s)) in sim.last.effects  # type: ignore[union-attr]
    assert (sim.inst.then, sim.inst.then_by, sim.inst.desired) == (
        "restart",
        "boot",
        Desired.RUNNING,
    )
    sim.gone(signal=15)
    assert sim.effect(fx.CheckStart).by == "boot"


def test_boot_of_a_drained_node_does_not_restart_what_its_shutdown_was_stopping() -> None:
    sim = running(process_sim())
    sim.feed(o.StopVerb(by="shutdown", grace_s=10))
    sim.clock.advance(1)
    sim.feed(o.BootSeen(process=_alive(sim), held=True))
    assert sim.kinds_of_last() == ["instance.reattached", "instance.terminating"]
    assert sim.inst.then == ""


def test_boot_leaves_an_operator_stop_the_node_died_in_stopped() -> None:
    sim = _in_state(S.STOPPING)
    _boot(sim, _gone(sim, code=None))
    assert sim.kinds_of_last() == ["instance.exited"] and sim.inst.lifecycle is S.STOPPED
    assert not [e for e in sim.last.effects if isinstance(e, fx.CheckStart)]  # type: ignore[union-attr]


def test_boot_after_an_escalated_stop_kills_at_once() -> None:
    sim = running(process_sim())
    sim.feed(o.StopVerb(by="operator", grace_s=10))
    sim.clock.advance(3)
    assert fx.Kill() in sim.feed(o.StopVerb(by="operator", grace_s=10)).effects
    sim.clock.advance(1)
    sim.feed(o.BootSeen(process=_alive(sim)))
    now = sim.clock.now
    kills = [e for e in sim.last.effects if isinstance(e, fx.ArmTimer) and e.name == "kill"]  # type: ignore[union-attr]
    assert fx.Kill() in sim.last.effects or any(e.due.mono_s <= now.mono_s for e in kills)  # type: ignore[union-attr]


def test_boot_starting_recovered_launch_spawned_and_reattached() -> None:
    sim = _starting(spawned=False)
    sim.feed(o.BootSeen(process=_alive(sim, recovered=True)))
    assert sim.kinds_of_last() == ["instance.spawned", "instance.reattached"]
    assert sim.inst.process is not None and sim.inst.process.pid == 9999
    assert sim.inst.lifecycle is S.STARTING


def test_boot_gone_with_exit_code_then_policy() -> None:
    sim = running(process_sim())
    sim.feed(o.BootSeen(process=_gone(sim, code=7)))
    assert sim.kinds_of_last() == ["instance.exited", "instance.restart_scheduled"]
    assert sim.inst.last_exit is not None and sim.inst.last_exit.exit_code == 7
    assert fx.ArmTimer(name="restart", due=sim.inst.restart_due) in sim.last.effects  # type: ignore[union-attr,arg-type]


def test_boot_gone_one_shot_exit_zero_finishes() -> None:
    sim = running(process_sim(continuous=False))
    sim.feed(o.BootSeen(process=_gone(sim, code=0)))
    assert sim.kinds_of_last() == ["instance.exited", "instance.finished"]


def test_boot_stopped_for_restart_starts_again() -> None:
    sim = running(process_sim())
    sim.feed(o.RestartVerb(by="operator", grace_s=5))
    sim.checked()  # the weights pre-check: fine, so it stops to restart
    sim.feed(o.BootSeen(process=_gone(sim, code=None)))
    assert sim.kinds_of_last() == ["instance.exited"] and sim.inst.lifecycle is S.STOPPED
    assert sim.effect(fx.CheckStart).reset_budget is True


def test_boot_strays_are_recorded_and_ended_before_the_exit_and_its_restart() -> None:
    sim = running(process_sim())
    sim.feed(o.BootSeen(process=_gone(sim, code=7), strays=[41, 42], cgroup="/cg/x/server"))
    assert sim.kinds_of_last() == [
        "instance.strays_ended",
        "instance.exited",
        "instance.restart_scheduled",
    ]
    effects = sim.last.effects  # type: ignore[union-attr]
    assert effects[0] == fx.EndStrays()  # before anything else: the port is free again


def test_boot_strays_of_a_stopped_instance_are_ended_and_nothing_starts() -> None:
    sim = running(process_sim())
    sim.feed(o.StopVerb(by="operator", grace_s=1))
    sim.feed(o.BootSeen(process=_gone(sim, code=None)))
    sim.feed(o.BootSeen(process=o.ProcessNone(), strays=[43], cgroup="/cg/x/server"))
    assert sim.kinds_of_last() == ["instance.strays_ended"]
    assert sim.last.effects == (fx.EndStrays(),)  # type: ignore[union-attr]


def test_boot_ollama_starting_asks_residency_and_unload_in_flight_resumes() -> None:
    sim = Sim(rules=make_rules(Mode.OLLAMA))
    sim.feed(o.StartVerb(by="operator"))
    sim.checked(reserved_bytes=10)
    sim.feed(o.BootSeen(process=o.ProcessNone()))
    assert sim.last.effects == (fx.CheckResident(),)  # type: ignore[union-attr]
    sim.feed(o.OllamaResidency(resident=False))
    sim.feed(o.OllamaLoadEnded(ok=True))
    sim.feed(o.StopVerb(by="operator", grace_s=1))
    sim.feed(o.BootSeen(process=o.ProcessNone()))
    assert sim.last.effects == (fx.UnloadModel(),)  # type: ignore[union-attr]


def test_boot_placed_checks_start_only_when_wanted() -> None:
    sim = process_sim()
    sim.feed(o.BootSeen(process=o.ProcessNone()))
    assert sim.last.effects == ()  # type: ignore[union-attr]


def test_step_function_signature() -> None:
    """``step`` is usable without the Sim wrapper."""
    clock = Clock()
    rules = make_rules(Mode.PROCESS)
    state = placed(clock.now)
    state2, tracking, d = step(state, Tracking(), o.StartVerb(by="operator"), clock.now, rules)
    assert state2 == state and tracking == Tracking() and d.events == ()


# ====================================================================== operator-facing reasons
def test_a_running_server_that_stops_answering_is_not_described_as_starting() -> None:
    """Issue 11: a server that served and went silent read "starting: not listening yet"."""
    sim = running(http_sim())
    silent = ServerReport(health=Health(HealthKind.UNREACHABLE, "no answer within 2.0 s"))
    for _ in range(sim.rules.supervision.miss_limit):
        sim.probe(silent)
    assert sim.inst.lifecycle is S.UNHEALTHY
    assert sim.inst.reason.endswith("not answering: no answer within 2.0 s")
    assert "starting" not in sim.inst.reason


def test_a_restart_refused_for_its_weights_leaves_the_server_running() -> None:
    """A newcomer found a restart stopping a healthy server for a launch that was
    then refused: the weights are checked before anything is stopped."""
    sim = running(process_sim())
    sim.feed(o.RestartVerb(by="operator", grace_s=5))
    d = sim.checked(model_refusal="model tiny: digest mismatch (expected a, found b)")
    assert sim.kinds_of_last() == ["instance.start_refused"]
    assert d.refusal is not None and "the running server was left as it is" in d.refusal.message
    assert sim.inst.lifecycle is S.RUNNING and sim.inst.process is not None
    assert not any(isinstance(e, fx.Terminate) for e in d.effects)


# ====================================================================== adopted startup allowance
def _loading() -> ServerReport:
    return ServerReport(health=Health(HealthKind.LOADING))


def _adopted_loading_sim() -> Sim:
    """Issue 12: an adopted llama.cpp server that answered 503 "Loading model" when started."""
    sim = Sim(rules=make_rules(Mode.ADOPTED, kind="inference"))
    sim.feed(o.StartVerb(by="operator"))
    sim.feed(o.AnswersChecked(by="operator", why_not=None, loading=True))
    return sim


def test_an_adopted_server_loading_at_start_is_starting_not_ready() -> None:
    sim = _adopted_loading_sim()
    assert sim.kinds_of_last() == ["instance.starting"]
    assert sim.inst.lifecycle is S.STARTING and sim.inst.desired is Desired.RUNNING
    d = sim.feed(o.StartVerb(by="operator"))  # a second start is answered as it is
    assert d.events == () and d.refusal is None
    sim.feed(o.AnswersChecked(by="operator", why_not=None, loading=True))
    assert sim.last.events == () and sim.inst.lifecycle is S.STARTING  # type: ignore[union-attr]


def test_an_adopted_server_loading_within_its_allowance_stays_starting_then_is_ready() -> None:
    sim = _adopted_loading_sim()
    sup = sim.rules.supervision
    assert 0 < sup.startup_deadline_s < sup.startup_cap_s
    effects: list[object] = []
    # Well past the miss limit, past the deadline (extended while it loads), up to the cap.
    for elapsed in (0.0, 1.0, 2.0, 3.0, sup.startup_deadline_s + 1, sup.startup_cap_s):
        sim.clock.advance(elapsed - (sim.clock.wall_ns - sim.inst.since_ns) / NS)
        d = sim.probe(_loading())
        effects += d.effects
        assert d.events == () and sim.inst.lifecycle is S.STARTING
        assert sim.tracking.misses == 0
    sim.probe(up())
    assert sim.kinds_of_last() == ["instance.ready"] and sim.inst.lifecycle is S.RUNNING
    assert sim.inst.up_since == sim.clock.now
    effects += sim.feed(o.Tick()).effects
    assert effects == []  # never signalled, never restarted


def test_an_adopted_server_loading_past_its_cap_is_unhealthy_saying_what_it_said() -> None:
    sim = _adopted_loading_sim()
    sup = sim.rules.supervision
    sim.clock.advance(sup.startup_cap_s + 1)
    for _ in range(sup.miss_limit - 1):
        assert sim.probe(_loading()).events == ()
    d = sim.probe(_loading())
    assert sim.kinds_of_last() == ["instance.unhealthy"] and d.effects == ()
    reason = sim.inst.reason
    assert sim.inst.lifecycle is S.UNHEALTHY
    said = 'loading: HTTP 503 "Loading model", still loading model after 901 s'
    assert f"missed health checks: {said} (startup allowance 900 s)" in reason, reason
    assert reason.endswith("; adopted servers are not restarted")
    # It never served: its first up answer records it ready (not "recovered").
    sim.probe(up())
    assert sim.kinds_of_last() == ["instance.ready"]
    assert sim.inst == replace(sim.inst, lifecycle=S.RUNNING)


def test_an_adopted_server_loading_across_a_node_restart_keeps_its_allowance() -> None:
    """The allowance is timed from the recorded start, so a node restart neither
    renews nor loses it (the misses, unsourced, count from zero again)."""
    sim = _adopted_loading_sim()
    sup = sim.rules.supervision
    sim.clock.reboot("boot-b", down_s=sup.startup_deadline_s)
    sim.tracking = Tracking()
    d = sim.feed(o.BootSeen(process=o.ProcessNone()))
    assert d.events == () and d.effects == ()
    assert sim.probe(_loading()).events == ()  # past the deadline, within the cap
    assert sim.inst.since_ns < sim.clock.wall_ns and str(sim.inst.lifecycle) == "starting"
    sim.clock.advance(sup.startup_cap_s)  # now past the cap, counted from the start
    for _ in range(sup.miss_limit):
        sim.probe(_loading())
    assert sim.inst.lifecycle is S.UNHEALTHY and "startup allowance" in sim.inst.reason


@pytest.mark.parametrize(
    ("health", "said"),
    [
        (Health(HealthKind.UNHEALTHY, "HTTP 500: boom"), "unhealthy: HTTP 500: boom"),
        (Health(HealthKind.UNHEALTHY), "unhealthy: answered unhealthy, without a reason"),
        (Health(HealthKind.LOADING), 'loading: HTTP 503 "Loading model"'),
        (Health(HealthKind.UNREACHABLE, "cannot connect"), "unreachable: cannot connect"),
        (Health(HealthKind.UNREACHABLE), "unreachable: no answer"),
    ],
)
def test_every_unhealthy_reason_of_an_adopted_server_names_what_it_said(
    health: Health, said: str
) -> None:
    sim = Sim(rules=make_rules(Mode.ADOPTED, kind="inference"))
    sim.start()
    assert sim.kinds_of_last() == ["instance.starting", "instance.ready"]
    for _ in range(sim.rules.supervision.miss_limit):
        sim.probe(ServerReport(health=health))
    assert sim.inst.lifecycle is S.UNHEALTHY
    assert f"missed health checks: {said}" in sim.inst.reason, sim.inst.reason
    sim.probe(up())
    assert sim.kinds_of_last() == ["instance.recovered"]


# ====================================================================== 4b. issue 12
def _deep_running(mode: Mode) -> Sim:
    sim = Sim(rules=make_rules(mode, kind="deep"))
    if mode is Mode.OLLAMA:
        sim.feed(o.StartVerb(by="operator"))
        sim.checked(reserved_bytes=1000)
        sim.feed(o.OllamaResidency(resident=False))
        sim.feed(o.OllamaLoadEnded(ok=True))
    else:
        running(sim)
    assert sim.inst.lifecycle is S.RUNNING
    return sim


def _deep(sim: Sim, error: str | None) -> Decision:
    token = sim.inst.process.pid if sim.inst.process is not None else 0
    return sim.feed(o.DeepChecked(token=token, error=error))


def test_deep_failures_are_recorded_and_a_probe_answer_does_not_clear_them() -> None:
    sim = _deep_running(Mode.PROCESS)
    _deep(sim, "HTTP 500")
    assert sim.kinds_of_last() == ["instance.deep_health_failed"]
    sim.probe(up())  # /health still answers: the deep misses stand
    _deep(sim, "HTTP 500")
    assert sim.kinds_of_last() == ["instance.deep_health_failed"]
    _deep(sim, "HTTP 500")
    assert sim.kinds_of_last() == [
        "instance.deep_health_failed",
        "instance.unhealthy",
        "instance.terminating",
    ]
    assert "deep health: no token of completion: HTTP 500" in sim.inst.reason


def test_a_deep_token_clears_the_deep_misses() -> None:
    sim = _deep_running(Mode.PROCESS)
    _deep(sim, "HTTP 500")
    _deep(sim, "HTTP 500")
    _deep(sim, None)
    assert sim.last is not None and sim.last.events == ()
    assert sim.tracking.deep_misses == 0
    _deep(sim, "HTTP 500")
    assert sim.inst.lifecycle is S.RUNNING


def test_deep_checks_are_ignored_when_the_kind_has_none() -> None:
    sim = running(http_sim())
    sim.feed(o.DeepChecked(token=sim.inst.process.pid, error="HTTP 500"))  # type: ignore[union-attr]
    assert sim.last is not None and sim.last.events == ()


def test_ollama_deep_failures_make_it_unhealthy_and_a_token_recovers_it() -> None:
    sim = _deep_running(Mode.OLLAMA)
    for _ in range(3):
        _deep(sim, "HTTP 500")
    assert sim.inst.lifecycle is S.UNHEALTHY
    assert "infervisor does not start ollama" in sim.inst.reason
    sim.probe(ServerReport(health=Health(HealthKind.UP)))
    assert sim.inst.lifecycle is S.UNHEALTHY  # it answers, but gives no token
    _deep(sim, None)
    assert sim.kinds_of_last() == ["instance.recovered"]


def _ollama_running(**rules: Any) -> Sim:
    sim = Sim(rules=replace(make_rules(Mode.OLLAMA), **rules))
    sim.feed(o.StartVerb(by="operator"))
    sim.checked(reserved_bytes=1000)
    sim.feed(o.OllamaResidency(resident=False))
    sim.feed(o.OllamaLoadEnded(ok=True))
    assert sim.inst.lifecycle is S.RUNNING
    return sim


def test_ollama_dropped_model_is_recorded_released_and_restarted() -> None:
    sim = _ollama_running()
    at = sim.clock.wall_ns + 5 * NS
    sim.feed(o.OllamaListed(listed=True, size_bytes=500, expires_at_ns=at))
    assert sim.last is not None and sim.last.events == ()
    sim.clock.advance(6)
    sim.feed(o.OllamaListed(listed=False))
    assert sim.kinds_of_last() == [
        "instance.model_dropped",
        "instance.memory_released",
        "instance.exited",
        "instance.restart_scheduled",
    ]
    dropped = sim.last.events[0]  # type: ignore[union-attr]
    assert isinstance(dropped, ev.ModelDropped) and dropped.expired
    assert dropped.expires_at_ns == at
    assert sim.inst.reserved_bytes == 0 and sim.inst.ollama_owned is False
    assert "keep_alive ran out" in sim.inst.reason or sim.inst.lifecycle is S.RESTARTING


def test_ollama_dropped_before_its_expiry_says_so() -> None:
    sim = _ollama_running()
    sim.feed(o.OllamaListed(listed=True, expires_at_ns=sim.clock.wall_ns + 600 * NS))
    sim.feed(o.OllamaListed(listed=False))
    dropped = sim.last.events[0]  # type: ignore[union-attr]
    assert isinstance(dropped, ev.ModelDropped) and not dropped.expired


def test_ollama_memory_is_corrected_up_never_down() -> None:
    sim = _ollama_running(reserve_overhead_bytes=100)
    sim.feed(o.OllamaListed(listed=True, size_bytes=800, size_vram_bytes=600))
    assert sim.last is not None and sim.last.events == ()  # 900 fits in the 1000 reserved
    sim.feed(o.OllamaListed(listed=True, size_bytes=5000, size_vram_bytes=4000))
    assert sim.kinds_of_last() == ["instance.memory_corrected"]
    assert sim.inst.reserved_bytes == 5100
    sim.feed(o.OllamaListed(listed=True, size_bytes=5000))
    assert sim.last is not None and sim.last.events == ()


def _ollama_loading() -> Sim:
    sim = Sim(rules=make_rules(Mode.OLLAMA, kind="loads"))  # deadline 10 s, cap 60 s
    sim.feed(o.StartVerb(by="operator"))
    sim.checked(reserved_bytes=1000)
    sim.feed(o.OllamaResidency(resident=False))
    assert sim.inst.lifecycle is S.STARTING and sim.inst.ollama_owned is True
    return sim


def _ps(*names: str) -> ServerReport:
    running = [RunningModel(name=n) for n in names]
    return ServerReport(health=Health(HealthKind.UP), running=running, flavor=Flavor.OLLAMA)


def test_ollama_load_deadline_extends_while_listed_up_to_the_cap() -> None:
    sim = _ollama_loading()
    sim.clock.advance(30)
    sim.probe(_ps("tiny:latest"))  # past the deadline, still listed: extended
    assert sim.inst.lifecycle is S.STARTING
    sim.clock.advance(31)
    sim.probe(_ps("tiny:latest"))  # past the cap
    assert sim.kinds_of_last()[0] == "instance.exited"
    assert "not loaded within 60 s" in sim.inst.reason or sim.inst.lifecycle is S.RESTARTING
    assert any(isinstance(e, fx.AbortLoad) for e in sim.last.effects)  # type: ignore[union-attr]


def test_ollama_load_not_listed_is_given_up_at_the_deadline() -> None:
    sim = _ollama_loading()
    sim.clock.advance(5)
    sim.probe(_ps())  # within the deadline: may take its time
    assert sim.inst.lifecycle is S.STARTING
    sim.clock.advance(6)
    sim.probe(ServerReport(health=Health(HealthKind.UP), flavor=Flavor.OLLAMA))  # no ps list
    assert sim.inst.lifecycle is S.STARTING  # nothing is guessed from no answer
    sim.probe(_ps())
    assert sim.kinds_of_last()[:2] == ["instance.exited", "instance.restart_scheduled"]


# ====================================================================== 4b. residency (issue 21)
def _resting() -> Sim:
    """A process instance placed on demand: it begins resting."""
    sim = process_sim()
    spec = {"role": "chat", "on_demand": True}
    sim.state = placed(sim.clock.now, spec)
    assert sim.inst.lifecycle is S.RESTING
    return sim


def _demand(sim: Sim, request: str = "r1") -> Decision:
    return sim.feed(o.DemandVerb(request=request, model="tiny", by="front"))


def test_a_demand_of_a_resting_instance_is_recorded_with_its_start() -> None:
    """residency.demanded (the request, a use) in the transaction of its start,
    never before it: a demand whose start is not made records nothing."""
    sim = _resting()
    d = _demand(sim)
    assert sim.kinds_of_last() == [] and d.refusal is None
    check = sim.effect(fx.CheckStart)
    assert (check.demand, check.request, check.model) == (True, "r1", "tiny")
    assert sim.inst.last_use_ns is None
    sim.checked(check, demand=True)
    assert sim.kinds_of_last() == ["residency.demanded", "instance.starting"]
    assert sim.inst.last_use_ns == sim.clock.wall_ns and not sim.inst.demanded
    sim.spawn_ok()
    assert sim.inst.lifecycle is S.RUNNING  # process kind: alive is ready


_NO_ROOM = o.RoomRefused(
    by="node", needed_bytes=5, budget_bytes=10, in_use_bytes=8, held={"x": 8}, candidates=()
)


def test_a_demand_that_does_not_fit_is_answered_and_its_refusal_recorded_once() -> None:
    """No room: answered, nothing recorded; the node's refusal is one
    residency.refused, the same one again soon after is counted, not recorded
    (the next recorded one says how many were folded); none is a use."""
    sim = _resting()
    _demand(sim)
    d = sim.checked(memory_refusal="memory budget 10 bytes, 8 in use, 5 needed", demand=True)
    assert d.events == () and d.refusal is not None and d.refusal.kind is RefusalKind.MEMORY
    assert sim.inst.lifecycle is S.RESTING and sim.inst.desired is Desired.STOPPED
    assert not sim.inst.demanded
    for n in range(3):
        sim.clock.advance(10.0)
        sim.feed(_NO_ROOM)
        assert sim.kinds_of_last() == (["residency.refused"] if n == 0 else [])
        assert sim.last is not None and sim.last.refusal is not None
        assert sim.last.refusal.kind is RefusalKind.NOT_NO_ROOM
    assert sim.tracking.refusals_folded == 2 and sim.inst.last_use_ns is None
    sim.clock.advance(60.0)  # past the window: recorded again, saying how many it folded
    sim.feed(_NO_ROOM)
    (refused,) = sim.last.events if sim.last is not None else ()
    assert isinstance(refused, rev.ResidencyRefused) and refused.folded == 2
    assert sim.tracking.refusals_folded == 0 and sim.tracking.refusals_folded_total == 2


def test_room_planned_records_the_demand_before_the_evictions_and_its_start_is_the_use() -> None:
    sim = _resting()
    sim.feed(o.RoomPlanned(request="r1", model="tiny", by="front", verb=False))
    assert sim.kinds_of_last() == ["residency.demanded"]
    assert sim.inst.demanded and sim.inst.desired is Desired.RUNNING
    assert sim.inst.last_use_ns is None  # not yet: the victims may turn busy
    sim.feed(o.RoomPlanned(request="r1", model="tiny", by="front", verb=False))
    assert sim.kinds_of_last() == []  # pending already
    _demand(sim, "r2")
    sim.checked(demand=True)
    assert sim.kinds_of_last() == ["instance.starting"]
    assert sim.inst.last_use_ns == sim.clock.wall_ns and not sim.inst.demanded


def test_an_operator_stopped_instance_demanded_by_a_verb_waits_for_the_node() -> None:
    """The node makes room for an operator's start of an instance the operator
    stopped: demanded, it is wanted running, yet no reconcile tick starts it
    meanwhile (its start would be refused for memory and end the demand); a
    request joins it; an operator's stop ends it."""
    sim = running(process_sim())
    sim.feed(o.StopVerb(by="operator:uid=1(bob)", grace_s=5.0))
    sim.gone(exit_code=0)
    sim.feed(o.RoomPlanned(request="verb", model="tiny", by="operator:uid=1(bob)", verb=True))
    assert sim.kinds_of_last() == ["residency.demanded"]
    assert sim.inst.lifecycle is S.STOPPED and sim.inst.desired is Desired.RUNNING
    d = sim.feed(o.Tick())
    assert d.events == () and not [e for e in d.effects if isinstance(e, fx.CheckStart)]
    d = _demand(sim)
    assert d.refusal is None and sim.effect(fx.CheckStart).demand is True
    sim.feed(o.StopVerb(by="operator:uid=1(bob)", grace_s=5.0))
    assert not sim.inst.demanded and sim.inst.desired is Desired.STOPPED


def test_a_demand_joins_a_verbs_start_of_a_failed_instance_as_a_boot_resumes_it() -> None:
    """An operator's start of a failed instance that needs room is demanded before
    the evictions; the demand a boot resumes for it (by the request path) starts
    it rather than being refused ``failed``. Without that start a request is refused."""
    failed = _in_state(S.FAILED)
    d = _demand(failed)
    assert d.refusal is not None and d.refusal.kind is RefusalKind.NOT_FAILED
    failed.feed(o.RoomPlanned(request="verb", model="tiny", by="operator", verb=True))
    assert failed.kinds_of_last() == ["residency.demanded"]
    d = failed.feed(o.DemandVerb(request="boot", model="", by="boot"))
    assert d.refusal is None and failed.effect(fx.CheckStart).demand is True


def test_a_verbs_start_is_a_use_and_the_supervisors_is_not() -> None:
    sim = process_sim()
    sim.start(by="operator:uid=1(ann)")
    assert sim.inst.last_use_ns == sim.clock.wall_ns
    sim.clock.advance(5.0)
    sim.gone(exit_code=1)  # the supervisor restarts it: no use
    sim.clock.advance(60.0)
    sim.feed(o.TimerDue(name=fx.Timer.RESTART))
    sim.checked()
    assert sim.kinds_of_last() == ["instance.starting"]
    assert sim.inst.last_use_ns == sim.clock.wall_ns - int(65 * 1e9)


def test_a_demand_whose_start_is_refused_for_its_weights_ends_and_is_not_resumed() -> None:
    """A start refused for a reason of the instance's own (weights that no longer
    match) rests, not wanted running, so no boot resumes it; the same refusal
    again records nothing more (once per cause)."""
    sim = _resting()
    _demand(sim)
    sim.checked(model_refusal="model tiny: digest mismatch", demand=True)
    assert sim.kinds_of_last() == ["instance.start_refused"]
    assert sim.inst.lifecycle is S.RESTING and sim.inst.desired is Desired.STOPPED
    _demand(sim, "r2")
    d = sim.checked(model_refusal="model tiny: digest mismatch", demand=True)
    assert sim.kinds_of_last() == [] and d.refusal is not None
    assert sim.inst.lifecycle is S.RESTING and sim.inst.desired is Desired.STOPPED


def test_a_stopped_instance_is_not_started_by_a_demand_and_failed_is_refused() -> None:
    sim = running(process_sim())
    sim.feed(o.StopVerb(by="operator:uid=1(bob)", grace_s=5.0))
    sim.gone(exit_code=0)
    assert sim.inst.lifecycle is S.STOPPED and sim.inst.stopped_by == "operator:uid=1(bob)"
    d = _demand(sim)
    assert d.events == () and d.refusal is not None
    assert d.refusal.kind is RefusalKind.NOT_STOPPED and "bob" in d.refusal.message
    failed = _in_state(S.FAILED)
    d = _demand(failed)
    assert d.refusal is not None and d.refusal.kind is RefusalKind.NOT_FAILED


def _evict_verb(grace: float = 5.0) -> o.EvictVerb:
    return o.EvictVerb(
        by="node", for_instance="other", needed_bytes=5, freed_bytes=5, budget_bytes=10,
        in_use_bytes=10, candidates=(), grace_s=grace,
    )  # fmt: skip


def test_an_eviction_records_its_reason_with_a_stop_to_rest_and_ends_resting() -> None:
    sim = running(process_sim())
    sim.feed(_evict_verb())
    assert sim.kinds_of_last() == ["residency.evicted", "instance.stop_requested"]
    assert sim.inst.lifecycle is S.STOPPING and sim.inst.then == "rest"
    assert "Terminate" in effect_types(sim.last)  # type: ignore[arg-type]
    sim.gone(signal=15)
    assert sim.inst.lifecycle is S.RESTING and sim.inst.desired is Desired.STOPPED
    assert sim.inst.stopped_by == ""  # a rest is nobody's stop: a demand starts it
    assert sim.inst.rested_for == "evicted for other"
    _demand(sim)
    assert sim.effect(fx.CheckStart).demand is True
    sim.feed(o.StopVerb(by="operator", grace_s=5.0))  # an operator's stop of a resting one
    assert sim.inst.rested_for == ""
    sim2 = _resting()
    sim2.feed(o.StopVerb(by="operator", grace_s=5.0))
    assert sim2.inst.lifecycle is S.STOPPED


def test_a_busy_loading_or_pinned_instance_is_not_evicted() -> None:
    sim = running(process_sim())
    sim.feed(o.RequestBegan())
    assert sim.kinds_of_last() == ["residency.busy"] and sim.inst.busy
    d = sim.feed(_evict_verb())
    assert d.events == () and d.refusal is not None and "serves 1" in d.refusal.message
    starting = _starting(spawned=True)
    d = starting.feed(_evict_verb())
    assert d.events == () and d.refusal is not None
    pinned = running(Sim(rules=replace_rules(make_rules(Mode.PROCESS), pinned=True)))
    d = pinned.feed(_evict_verb())
    assert d.events == () and d.refusal is not None and "pinned" in d.refusal.message


def replace_rules(rules: Any, **kw: Any) -> Any:
    import msgspec

    return msgspec.structs.replace(rules, **kw)


def test_busy_and_idle_are_debounced_to_one_row_each_per_spell() -> None:
    sim = running(process_sim())
    for _ in range(3):
        sim.feed(o.RequestBegan())
        sim.feed(o.RequestEnded())
    sim.feed(o.RequestBegan())
    ended_at = sim.clock.wall_ns
    sim.feed(o.RequestEnded())
    sim.clock.advance(2)
    sim.feed(o.Tick())
    assert "residency.idle" in sim.kinds_of_last()
    assert not sim.inst.busy and sim.inst.last_use_ns == ended_at
    sim.feed(o.Tick())
    assert "residency.idle" not in sim.kinds_of_last()


def test_requests_told_as_counts_are_counted_each() -> None:
    """The front tells one event-loop turn's requests as one count (tools/front/told.py)."""
    sim = running(process_sim())
    sim.feed(o.RequestBegan(count=3))
    assert sim.kinds_of_last() == ["residency.busy"] and sim.tracking.inflight == 3
    d = sim.feed(_evict_verb())
    assert d.refusal is not None and "serves 3" in d.refusal.message
    sim.feed(o.RequestEnded(count=2))
    assert sim.tracking.serving == 1
    sim.clock.advance(3)
    sim.feed(o.Tick())
    assert "residency.idle" not in sim.kinds_of_last()  # one is still in flight
    ended_at = sim.clock.wall_ns
    sim.feed(o.RequestEnded(count=5))  # never below none
    sim.clock.advance(3)
    sim.feed(o.Tick())
    assert "residency.idle" in sim.kinds_of_last() and sim.inst.last_use_ns == ended_at
    assert sim.tracking.inflight == 0


def test_the_servers_own_counters_make_it_busy_and_idle_like_routed_requests() -> None:
    sim = running(process_sim())
    sim.feed(o.ServerActivity(active=2))
    assert sim.kinds_of_last() == ["residency.busy"]
    sim.feed(o.RequestBegan())  # routed, and counted by the server too
    assert sim.kinds_of_last() == []
    d = sim.feed(_evict_verb())
    assert d.refusal is not None and "serves 2" in d.refusal.message
    sim.feed(o.ServerActivity(active=0))
    assert sim.tracking.serving == 1  # the routed one is still in flight
    ended_at = sim.clock.wall_ns
    sim.feed(o.RequestEnded())
    sim.clock.advance(3)
    sim.feed(o.Tick())
    assert "residency.idle" in sim.kinds_of_last() and sim.inst.last_use_ns == ended_at


def test_idle_expiry_after_its_ttl_with_nothing_in_flight_rests() -> None:
    sim = running(Sim(rules=replace_rules(make_rules(Mode.PROCESS), idle_ttl_s=60.0)))
    sim.clock.advance(30)
    sim.feed(o.Tick())
    assert "residency.expired" not in sim.kinds_of_last()
    sim.feed(o.RequestBegan())
    sim.clock.advance(120)
    sim.feed(o.Tick())  # busy: never expired while a request is in flight
    assert "residency.expired" not in sim.kinds_of_last()
    sim.feed(o.RequestEnded())
    sim.feed(o.Tick())  # idle recorded from now: the ttl counts from here
    assert sim.kinds_of_last()[:1] == ["residency.idle"]
    sim.clock.advance(61)
    sim.feed(o.Tick())
    assert sim.kinds_of_last()[:2] == ["residency.expired", "instance.stop_requested"]
    sim.gone(signal=15)
    assert sim.inst.lifecycle is S.RESTING


def test_boot_leaves_a_resting_instance_resting_and_a_pending_demand_to_the_node() -> None:
    sim = _resting()
    sim.feed(o.BootSeen(process=o.ProcessNone()))
    assert sim.last is not None and sim.last.events == () and sim.last.effects == ()
    _demand(sim)
    sim.feed(o.BootSeen(process=o.ProcessNone()))
    assert sim.last is not None and sim.last.effects == ()  # Node.open resumes the demand
    evicted = running(process_sim())
    evicted.feed(_evict_verb())
    _boot(evicted, _gone(evicted, None))
    assert evicted.inst.lifecycle is S.RESTING  # the eviction's stop is finished by boot


# ====================================================================== 5. coverage
#: Kinds the decision core never emits: the node's own, and the key rotation
#: (`infervisor chain rotate-key`, tests/test_chain_checkpoint.py).
NODE_KINDS = {
    "node.started",
    "node.stopped",
    "node.admission_refused",
    "node.lease_renewed",
    "chain.key_rotated",
    "node.strays_ended",
    "node.witness_override",  # the boot against witnesses: tests/test_witnessing*.py
    "node.cordoned",  # cordon and drain: tests/test_core_cordon.py, tests/test_drain_node.py
    "node.drained",
    "node.uncordoned",
    "node.placement_set",
}


def test_a_resumed_stops_grace_reads_rounded_in_its_reason() -> None:
    """What is left of a grace is a float: its reason read ``grace 0.774663 s`` (a
    newcomer's trial, stop 33); durations in reasons are rounded one way
    (replay/durations.py), the event keeping the exact value for its timer."""
    stop = ev.StopRequested(by="boot", grace_s=0.774663, reason="r")
    assert reason_of(stop).startswith("stop by boot (grace 0.775 s): ")
    assert reason_of(ev.Terminating(cause="killed: x", grace_s=2.0000001, at=0)).endswith(
        "(SIGKILL after 2 s)"
    )
    assert reason_of(ev.RestartScheduled(attempt=1, delay_s=1.2345678, reason="r")).startswith(
        "restart 1 in 1.23 s"
    )


def test_zz_every_state_and_event_kind_reached(request: pytest.FixtureRequest) -> None:
    """Runs last; meaningful only when every other test of this module ran before it."""
    items = request.session.items
    mine = [i for i in items if i.module is request.module]
    names = {getattr(i, "originalname", i.name) for i in mine}
    every = {n for n in vars(request.module) if n.startswith("test_")}
    if names != every:
        pytest.skip("only a part of this module ran: coverage not judged")
    after = [i.name for i in mine[mine.index(request.node) + 1 :]]
    assert not after, f"this test must be the module's last; move above it: {after}"
    missing_states = set(LifecycleState) - SEEN_STATES
    missing_kinds = set(ev.EVENT_TYPES) - NODE_KINDS - SEEN_KINDS
    assert not missing_states, f"lifecycle states never reached: {sorted(missing_states)}"
    assert not missing_kinds, f"event kinds never emitted: {sorted(missing_kinds)}"
