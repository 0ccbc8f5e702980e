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

from collections.abc import Callable
from typing import Any

from . import boot, health, ollama, process, verbs
from . import observations as o
from .decision import Decision, Draft, Situation

__all__ = ["RULES", "decide", "source_of"]

#: Every observation and the rule that decides it (docs/lifecycle.md is generated from it).
RULES: dict[type[Any], Callable[[Draft, Any], None]] = {
    o.StartVerb: verbs.start_verb,
    o.StopVerb: verbs.stop_verb,
    o.RestartVerb: verbs.restart_verb,
    o.UnloadVerb: verbs.unload_verb,
    o.PlacementVerb: verbs.placement,
    o.AnswersChecked: verbs.answers_checked,
    o.LeaseLapsed: verbs.lease_lapsed,
    o.StartChecked: verbs.start_checked,
    o.SpawnSucceeded: process.spawned,
    o.SpawnFailed: process.spawn_failed,
    o.ProcessExited: process.process_exited,
    o.GroupGone: process.group_gone,
    o.TimerDue: process.timer_due,
    o.ListenersSeen: process.listeners_seen,
    o.ProbeResult: health.probe_result,
    o.DeepChecked: health.deep_checked,
    o.Tick: health.tick,
    o.OllamaResidency: ollama.residency,
    o.OllamaLoadEnded: ollama.load_ended,
    o.OllamaUnloadEnded: ollama.unload_ended,
    o.OllamaListed: ollama.listed,
    o.BootSeen: boot.boot,
}


def source_of(observation: o.Observation) -> str:
    """Who an observation's events are recorded as coming from."""
    match observation:
        case o.StartVerb(by=by) | o.StopVerb(by=by) | o.RestartVerb(by=by) | o.UnloadVerb(by=by):
            return by
        case o.StartChecked(by=by) | o.AnswersChecked(by=by):
            return by
        case o.PlacementVerb(by=by):
            return by
        case o.LeaseLapsed():
            return "lease"
        case o.BootSeen():
            return "node"
    return "supervisor"


def decide(situation: Situation, observation: o.Observation) -> Decision:
    """The events and effects one observation calls for (pure).

    Raises:
        ReplayError: a rule produced an event the lifecycle table forbids (a
            bug in a rule: nothing is appended).
    """
    draft = Draft(situation, source_of(observation))
    RULES[type(observation)](draft, observation)
    return draft.build()
