"""The decision core: ``decide(situation, observation) -> Decision``.

One pure function for every kind of instance: it reads the instance's
sourced state, its unsourced tracking (health misses), its rules and the
time, and returns the events to append and the effects to run. It does no
I/O, takes no locks and starts no threads. The instance actor executes the
decision: events first (durable), effects only after. Boot is one more
observation, so a node that restarts decides what the live node would have.
See ``docs/lifecycle.md``.
"""

from __future__ import annotations

from typing import Any

from infervisor.replay.callers import Role, lease_source

from . import adopted, ollama, process
from . import observations as o
from .decision import Decision, Draft, Rule, Situation
from .effects import Effect
from .rules import Mode

__all__ = ["ON_UNLOAD", "RULES", "decide", "source_of"]

#: Every mode, every observation it meets, and the rule that decides it: what an
#: instance of one mode does reads in its own table (docs/lifecycle.md is
#: generated from it). An observation a mode's table lacks decides nothing.
RULES: dict[Mode, dict[type[Any], Rule]] = {
    Mode.PROCESS: process.RULES,
    Mode.OLLAMA: ollama.RULES,
    Mode.ADOPTED: adopted.RULES,
}
#: What forgetting an instance cleans up, per mode (a process's working directory).
ON_UNLOAD: dict[Mode, tuple[Effect, ...]] = {Mode.PROCESS: process.ON_UNLOAD}


def source_of(observation: o.Observation) -> str:
    """Who an observation's events are recorded as coming from."""
    match observation:
        case o.StartVerb(by=by) | o.StopVerb(by=by) | o.RestartVerb(by=by) | o.UnloadVerb(by=by):
            return by
        case o.StartChecked(by=by) | o.AnswersChecked(by=by):
            return by
        case o.PlacementVerb(by=by) | o.DemandVerb(by=by) | o.EvictVerb(by=by):
            return by
        case o.RoomRefused(by=by) | o.RoomPlanned(by=by) | o.StartAgain(by=by):
            return by
        case o.LeaseLapsed(controller=controller):
            return lease_source(controller)
        case o.BootSeen():
            return Role.NODE
    return Role.SUPERVISOR


def decide(situation: Situation, observation: o.Observation) -> Decision:
    """The events and effects one observation calls for (pure).

    Raises:
        ReplayError: a rule produced an event the lifecycle table forbids (a
            bug in a rule: nothing is appended).
    """
    mode = situation.rules.mode
    draft = Draft(situation, source_of(observation), ON_UNLOAD.get(mode, ()))
    rule = RULES[mode].get(type(observation))
    if rule is not None:
        rule(draft, observation)
    return draft.build()
