"""The instance lifecycle state machine: one enum and one transition table.

Source: ``reference/host_supervise.rs.txt`` (states Running, Unhealthy,
Restarting, Stopped, Failed, Finished) and ``reference/infer_lifecycle.rs.txt``
(Loaded, Exited). The graph, drawn in ``docs/lifecycle.md``::

    loaded ──start──▶ starting ──ready──▶ running ──misses──▶ unhealthy
                         ▲  │                │                    │ killed
                         │  └─────exit───────┴────────────────────▼
                     restarting ◀──backoff── exited ──budget spent──▶ failed
                                               └──one-shot exit 0──▶ finished

    a state with a process ──stop──▶ stopping ──exit──▶ stopped ──start──▶ starting

    running ──rest (eviction, idle expiry)──▶ stopping ──exit──▶ resting ──demand──▶ starting

A stop is accepted in every state: one with a server process goes through
``stopping``, one without goes straight to ``stopped``. ``resting`` (issue 21) is
wanted on demand: not failed, not stopped by an operator. An on-demand placement
begins there; an eviction or an idle expiry (a stop whose ``then`` is ``rest``)
ends there instead of ``stopped``; a demand starts it, a stop makes it ``stopped``.
``restarting -> restarting`` is a restart decided again (the previous attempt was refused).
"""

from __future__ import annotations

import enum

__all__ = [
    "LIVE_STATES",
    "TRANSITIONS",
    "IllegalTransition",
    "LifecycleState",
    "check_transition",
]


class LifecycleState(enum.StrEnum):
    """Where an instance is in its life. ``live`` states may have a process."""

    LOADED = "loaded"
    STARTING = "starting"
    RUNNING = "running"
    UNHEALTHY = "unhealthy"
    RESTARTING = "restarting"
    STOPPING = "stopping"
    STOPPED = "stopped"
    EXITED = "exited"
    FAILED = "failed"
    FINISHED = "finished"
    RESTING = "resting"


S = LifecycleState

#: States in which a server process may exist and a stop must go through ``stopping``.
LIVE_STATES: frozenset[LifecycleState] = frozenset(
    {S.STARTING, S.RUNNING, S.UNHEALTHY, S.RESTARTING, S.STOPPING}
)

#: Every legal transition. Anything else is refused with both states named.
TRANSITIONS: dict[LifecycleState, frozenset[LifecycleState]] = {
    S.LOADED: frozenset({S.STARTING, S.STOPPED}),
    S.STARTING: frozenset({S.RUNNING, S.UNHEALTHY, S.EXITED, S.STOPPING, S.STOPPED}),
    # A server without a process of ours (an Ollama model) rests at once.
    S.RUNNING: frozenset({S.UNHEALTHY, S.EXITED, S.STOPPING, S.STOPPED, S.RESTING}),
    # An unhealthy server is killed first; the restart or the failure follows its exit.
    S.UNHEALTHY: frozenset({S.RUNNING, S.EXITED, S.STOPPING, S.STOPPED, S.RESTING}),
    S.RESTARTING: frozenset({S.STARTING, S.RESTARTING, S.FAILED, S.STOPPING, S.STOPPED}),
    S.STOPPING: frozenset({S.STOPPED, S.RESTING}),
    S.STOPPED: frozenset({S.STARTING}),
    S.EXITED: frozenset({S.RESTARTING, S.FAILED, S.STARTING, S.STOPPED, S.FINISHED}),
    S.FAILED: frozenset({S.STARTING, S.STOPPED}),
    S.FINISHED: frozenset({S.STARTING, S.STOPPED}),
    # Wanted on demand: a demand starts it, an operator's or controller's stop holds it.
    S.RESTING: frozenset({S.STARTING, S.STOPPED}),
}


class IllegalTransition(Exception):
    """A transition the table does not allow; names both states and the legal targets."""

    def __init__(self, frm: LifecycleState, to: LifecycleState, instance_id: str = "") -> None:
        allowed = ", ".join(sorted(TRANSITIONS[frm])) or "nothing"
        who = f"{instance_id}: " if instance_id else ""
        super().__init__(f"{who}cannot go from {frm} to {to}; from {frm} only: {allowed}")
        self.frm = frm
        self.to = to


def check_transition(frm: LifecycleState, to: LifecycleState, instance_id: str = "") -> None:
    """Raise :class:`IllegalTransition` unless ``frm -> to`` is in :data:`TRANSITIONS`."""
    if to not in TRANSITIONS[frm]:
        raise IllegalTransition(frm, to, instance_id)
