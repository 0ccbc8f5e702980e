"""An adopted server: somebody else's, observed and never signalled. Its rules,
and the table that reads every observation of an adopted instance in one place
(:data:`RULES`).

Source: ``reference/infer_lifecycle.rs.txt`` (``start_instance``,
``stop_instance``, ``unload_instance``: adopted servers are adopted when they
answer, never started, stopped nor restarted by the node).
"""

from __future__ import annotations

from typing import Any

from infervisor.adapters.adopted import STOP_REFUSAL
from infervisor.adapters.probe import HealthKind
from infervisor.adapters.status import classify
from infervisor.replay import LifecycleState
from infervisor.replay import events as ev
from infervisor.replay.callers import Role, role_of

from . import observations as o
from . import verbs
from .common import resets_budget
from .decision import Draft, RefusalKind, Rule
from .effects import CancelTimer, CheckAnswers, Timer
from .health import deep_checked, judged, said, set_misses, starting_for
from .supervision import HealthSample, Healthy, Unhealthy, judge

__all__ = ["RULES"]

S = LifecycleState
#: What an unhealthy reason adds: the node never restarts an adopted server.
_NOT_OURS = "adopted servers are not restarted"


def start_verb(d: Draft, v: o.StartVerb) -> None:
    """Adopt the server once it answers (asked once); one already watched is left as it is."""
    if d.inst.lifecycle not in (S.RUNNING, S.UNHEALTHY):
        d.do(CheckAnswers(by=v.by))


def answers_checked(d: Draft, a: o.AnswersChecked) -> None:
    """An answering server is watched from now on; one that does not answer is refused.

    One that answers it is still loading its model is ``starting``: the health
    probes give it the kind's startup allowance and record it ready on its
    first up answer. One already watched (starting, running or unhealthy) is
    left to the probes."""
    if a.why_not is not None:
        d.refuse(
            RefusalKind.ADMISSION,
            f"adopted server is not answering ({a.why_not}); "
            "infervisor does not start adopted servers",
        )
        return
    if d.inst.lifecycle in verbs.UP:
        return
    d.emit(ev.Starting(by=a.by, reset_budget=resets_budget(a.by), at=d.now))
    if not a.loading:
        d.emit(ev.Ready(detail="adopted server answers", at=d.now))


def stop_verb(d: Draft, v: o.StopVerb) -> None:
    """Refused: an adopted server is never stopped (the node's shutdown leaves it as it is)."""
    if role_of(v.by) != Role.SHUTDOWN:
        d.refuse(RefusalKind.REFUSED, STOP_REFUSAL.format(iid=d.inst.instance_id))


def restart_verb(d: Draft, v: o.RestartVerb) -> None:
    """Refused: an adopted server is never restarted."""
    d.refuse(RefusalKind.REFUSED, STOP_REFUSAL.format(iid=d.inst.instance_id))


def unload_verb(d: Draft, v: o.UnloadVerb) -> None:
    """Forget the server at once; it runs on, untouched."""
    d.do(CancelTimer(name=Timer.RESTART), CancelTimer(name=Timer.KILL))
    d.emit(ev.Unloaded(by=v.by))


def probe_result(d: Draft, p: o.ProbeResult) -> None:
    """Judge the server by its health alone, with the kind's startup allowance.

    While ``starting`` (it answered loading when started) the kind's judge
    applies as to a managed server: loading is healthy within the startup
    deadline, extended while it still loads up to the cap, timed from the
    recorded ``instance.starting``. Its first up answer records it ready (an
    unhealthy one that never served is recorded ready too, else recovered).
    Misses beyond the allowance make it unhealthy, with a reason naming what
    the server said; it is never signalled nor restarted.
    """
    if not judged(d, p):
        return
    inst, rules, health = d.inst, d.rules, p.report.health
    starting = inst.lifecycle is S.STARTING
    # No model check and no process: up is serving, unreachable is a miss.
    status, phase = classify(rules.flavor, None, p.report, alive=False, adopted=True, load=None)
    sample = HealthSample(
        phase=phase, status=status, continuous=True, starting=starting, elapsed_s=starting_for(d)
    )
    verdict = judge(rules.supervision, sample)
    if isinstance(verdict, Healthy):
        set_misses(d, 0)
        if not verdict.serving or inst.lifecycle is S.RUNNING:
            return
        if inst.lifecycle is S.UNHEALTHY and d.tracking.deep_misses:
            return  # its health answers, but it still gives no token
        if starting or inst.up_since is None:
            d.emit(ev.Ready(detail="adopted server answers", at=d.now))
        else:
            d.emit(ev.Recovered(detail="adopted server answers again"))
        return
    misses = d.tracking.misses + 1
    set_misses(d, misses)
    if inst.lifecycle is S.UNHEALTHY or misses < rules.supervision.miss_limit:
        return
    why = said(health)
    if starting and health.kind is HealthKind.LOADING and isinstance(verdict, Unhealthy):
        why = f"{why}, still {verdict.reason}"  # past the startup allowance
    d.emit(ev.Unhealthy(misses=misses, reason=f"{why}; {_NOT_OURS}"))


def _unhealthy(d: Draft, misses: int, reason: str) -> None:
    d.emit(ev.Unhealthy(misses=misses, reason=f"{reason}; {_NOT_OURS}"))


def deep_result(d: Draft, c: o.DeepChecked) -> None:
    """A failed deep check counts like a miss: ``miss_limit`` in a row make the
    server unhealthy (never signalled); a token clears them and recovers it."""
    deep_checked(d, c, _unhealthy)


def untouched(d: Draft, _: o.Observation) -> None:
    """Nothing to do: the node neither reconciles, re-adopts at boot, nor holds
    an adopted server under a controller's lease (it was never started here)."""


#: Every observation of an adopted server and the rule that decides it.
RULES: dict[type[Any], Rule] = {
    o.StartVerb: start_verb,
    o.AnswersChecked: answers_checked,
    o.StopVerb: stop_verb,
    o.RestartVerb: restart_verb,
    o.UnloadVerb: unload_verb,
    o.PlacementVerb: verbs.placement,
    o.LeaseLapsed: untouched,
    o.ProbeResult: probe_result,
    o.DeepChecked: deep_result,
    o.Tick: untouched,
    o.BootSeen: untouched,
}
