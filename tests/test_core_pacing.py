"""When health probes and deep checks are due (actors/core/pacing.py): a pure
function of the core, driven with its own harness (tests/core_support.py)."""

from __future__ import annotations

from core_support import Sim, make_rules, replace, up

from infervisor.actors.core.pacing import Pacing, pace
from infervisor.actors.core.rules import Mode
from infervisor.replay import LifecycleState

SLACK_S = 0.5  # half of a 1 s tick
S = LifecycleState


def serving() -> Sim:
    """A managed process of the ``deep`` kind (probes every 1 s, deep checks every 5 s), up."""
    sim = Sim(rules=make_rules(Mode.PROCESS, kind="deep"))
    sim.start()
    sim.probe(up())
    assert sim.inst.lifecycle is S.RUNNING
    return sim


def test_a_check_goes_when_its_interval_has_passed_and_never_while_one_is_out() -> None:
    sim = serving()
    first = pace(sim.inst, sim.rules, Pacing(), 100.0, SLACK_S)
    assert (first.probe, first.deep) == (True, True)  # none sent yet: both at once
    assert first.pacing == Pacing(
        probing=True, last_probe_s=100.0, deep_running=True, last_deep_s=100.0
    )
    out = pace(sim.inst, sim.rules, first.pacing, 110.0, SLACK_S)
    assert (out.probe, out.deep) == (False, False)  # both still out: a hung server costs one
    back = first.pacing.probed().deep_checked()
    early = pace(sim.inst, sim.rules, back, 100.4, SLACK_S)
    assert (early.probe, early.deep) == (False, False)
    assert early.pacing == back  # nothing sent, nothing changed
    due = pace(sim.inst, sim.rules, back, 100.5, SLACK_S)  # 1 s less half a tick
    assert (due.probe, due.deep) == (True, False)
    deep = pace(sim.inst, sim.rules, due.pacing.probed(), 104.5, SLACK_S)
    assert (deep.probe, deep.deep) == (True, True)
    afresh = pace(sim.inst, sim.rules, deep.pacing.probed().deep_checked().afresh(), 104.6, 0.0)
    assert (afresh.probe, afresh.deep) == (True, True)


def test_no_check_for_a_server_that_is_not_serving() -> None:
    sim = serving()
    stopping = replace(sim.inst, lifecycle=S.STOPPING)
    paced = pace(stopping, sim.rules, Pacing(), 100.0, SLACK_S)
    assert (paced.probe, paced.deep, paced.pacing) == (False, False, Pacing())
    fresh = Sim(rules=make_rules(Mode.PROCESS, kind="deep"))  # placed, never started
    assert not pace(fresh.inst, fresh.rules, Pacing(), 100.0, SLACK_S).probe
