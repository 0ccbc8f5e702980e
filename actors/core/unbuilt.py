"""Verbs of an instance whose adapter cannot be built (pure).

At boot (or when a dead instance actor is recreated) the node rebuilds each
instance's adapter from its recorded spec; that fails when the model is gone
from the registry or fails its digest check, or when the launcher program is
missing. Such an instance stays placed, under an ordinary instance actor whose
start check always refuses: :func:`refuse_start` records the problem as
``instance.start_refused`` (once per cause: not again while it is the refusal
the chain last recorded) and answers the start with the problem and the fix.
A stop or unload is decided by the ordinary rules, unless a server of it is
recorded running: without an adapter it cannot be signalled, so
:func:`stop_refusal` refuses them, naming the pid and the fix.
"""

from __future__ import annotations

from infervisor.replay import LIVE_STATES, InstanceState
from infervisor.replay import events as ev

from .decision import Decision, Refusal, RefusalKind
from .rules import Mode, Rules

__all__ = ["FIX_HINT", "refuse_start", "start_refusal", "stop_refusal"]

#: What the operator can do about an instance whose adapter cannot be built.
FIX_HINT = (
    "fix that (put the model back in the registry with its recorded digest, or install "
    "the launcher program) and start it again, or unload it"
)


def refuse_start(state: InstanceState, problem: str, by: str) -> Decision:
    """A start (or restart, or the boot that found the problem: ``by`` "boot")
    refused because the adapter cannot be built (``problem`` says why)."""
    events: tuple[ev.InstanceEvent, ...] = ()
    if state.refusal != problem:
        events = (ev.StartRefused(by=by, reason=problem),)
    refusal = start_refusal(state, problem)
    return Decision(events=events, refusal=refusal, source="node" if by == "boot" else by)


def start_refusal(state: InstanceState, problem: str) -> Refusal:
    """The answer to a verb that needs the adapter: the problem and the fix."""
    message = f"{state.instance_id} cannot be started: {problem}; {FIX_HINT}"
    return Refusal(RefusalKind.INVALID_STATE, message)


def stop_refusal(state: InstanceState, rules: Rules, problem: str) -> Refusal | None:
    """Why a stop or unload of an unbuilt instance is refused, or None when the
    ordinary rules may decide it (nothing of it runs)."""
    running = state.process is not None or (
        rules.mode is not Mode.ADOPTED and state.lifecycle in LIVE_STATES
    )
    if not running:
        return None
    pid = f" (pid {state.process.pid})" if state.process is not None else ""
    return Refusal(
        RefusalKind.INVALID_STATE,
        f"{state.instance_id} has a server recorded running{pid} but no adapter to end it: "
        f"{problem}; {FIX_HINT}",
    )
