"""What the decision core asks the executor to do, as data.

The executor runs them only once the decision's events are durable; some
(:class:`CheckStart`, :class:`Spawn`, :class:`CheckAnswers`) produce an
observation at once, the others report back later as messages.
"""

from __future__ import annotations

import enum

import msgspec

from infervisor.replay.state import Stamp

__all__ = [
    "AbortLoad",
    "ArmTimer",
    "AskRoom",
    "CancelTimer",
    "CheckAnswers",
    "CheckResident",
    "CheckStart",
    "Effect",
    "EndStrays",
    "Kill",
    "LoadModel",
    "Reap",
    "RemoveWorkdir",
    "Spawn",
    "Terminate",
    "Timer",
    "UnloadModel",
]


class Timer(enum.StrEnum):
    """The timers the core arms: what falls due (:class:`TimerDue`)."""

    KILL = "kill"  # the grace of a termination is over: SIGKILL
    RESTART = "restart"  # a scheduled restart's backoff is over: start


class _Effect(msgspec.Struct, frozen=True, kw_only=True):
    pass


class CheckStart(_Effect, frozen=True):
    """Check the address and reserve the memory; feed back :class:`StartChecked`."""

    by: str
    reset_budget: bool
    attempt: int
    verb: bool
    weights_only: bool = False  # a restart's pre-check: its own server holds the port
    demand: bool = False  # a demand's start: a memory refusal is answered, not recorded
    request: str = ""  # a request's start: its id (residency.demanded with the start)
    model: str = ""  # the model the request asked for
    planned: bool = False  # the node planned room for it already: a memory refusal is recorded


class AskRoom(_Effect, frozen=True):
    """A start the node decided itself (by ``by``: a restart coming due, boot
    resuming) does not fit: ask the node to make room by the residency policy
    (actors/node_residency.py), then to decide the start again
    (:class:`~.observations.StartAgain`). ``cause``: why it starts, for the
    eviction's record. Never blocks the instance."""

    by: str
    cause: str


class CheckAnswers(_Effect, frozen=True):
    """Adopted start: ask the server once; feed back :class:`AnswersChecked`."""

    by: str


class Spawn(_Effect, frozen=True):
    """Launch the server through the shim with this launch token."""

    token: str


class Terminate(_Effect, frozen=True):
    """SIGTERM the server's process group now (SIGKILL follows by a ``kill`` timer)."""


class Kill(_Effect, frozen=True):
    """SIGKILL the process group and every tracked descendant now."""


class Reap(_Effect, frozen=True):
    """The leader exited: make sure nothing of the group is left, then report
    :class:`GroupGone`. ``grace_s``: what is left of a stop's grace, given to
    the rest of the tree before it is killed (0: a crash, killed at once)."""

    grace_s: float = 0.0


class EndStrays(_Effect, frozen=True):
    """Kill everything in the instance's server cgroup and wait until it is empty
    (the processes :class:`StraysEnded` names); before any start."""


class ArmTimer(_Effect, frozen=True):
    """Feed back :class:`TimerDue` named ``name`` at ``due`` (replaces one armed)."""

    name: Timer
    due: Stamp


class CancelTimer(_Effect, frozen=True):
    """Forget the timer ``name`` (a no-op when none is armed)."""

    name: Timer


class CheckResident(_Effect, frozen=True):
    """Ollama: ask whether the model is resident; feed back :class:`OllamaResidency`."""


class LoadModel(_Effect, frozen=True):
    """Ollama: load the model in the background; feed back :class:`OllamaLoadEnded`."""


class AbortLoad(_Effect, frozen=True):
    """Ollama: give up on a load in flight."""


class UnloadModel(_Effect, frozen=True):
    """Ollama: unload and wait until it is no longer listed; :class:`OllamaUnloadEnded`."""


class RemoveWorkdir(_Effect, frozen=True):
    """Delete the instance's working directory (after unload)."""


Effect = (
    CheckStart
    | AskRoom
    | CheckAnswers
    | Spawn
    | Terminate
    | Kill
    | Reap
    | EndStrays
    | ArmTimer
    | CancelTimer
    | CheckResident
    | LoadModel
    | AbortLoad
    | UnloadModel
    | RemoveWorkdir
)
