"""When a probe's report wakes the instance's actor (pure): the probe engine's rule.

The probe engine (actors/probe_loop.py) probes each instance on its own
schedule, off the actor's thread. Most reports of an idle node say what the
last one said ("up", the same models): deciding them again changes nothing,
and waking a pykka actor's thread costs more than the decision (bench/README.md:
``Condition.notify``/``wait`` were a third of the node's GIL time, the decision
4 us). So the engine hands a report to the actor only when :func:`wake_for`
gives a reason, from the actor's :class:`Watch` (published after each of its
decisions) and what the engine reported last.

:data:`WAKE_RULES` is the table, first match wins; :data:`WAKE_MEANINGS` says
when each reason holds (docs/lifecycle.md, "When a probe wakes the actor", is
generated from both).

Why skipping is safe: on a steady instance (``running``, no miss, no failed
deep check) a report equal to the last one decided gives the same decision,
and that decision was a no-op: the misses stay 0, the Ollama expiry and the
server's count stay what they are, and the only rule whose outcome changes
with time alone (the stability reset) is a reason of its own. The actor's own
timers (restart backoff, kill grace, idle expiry) never went through the
probes: they fire on the clock as before.

Source: issue 22 item 1 (wake the actor only when there is something to decide).
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import msgspec

from infervisor.adapters.probe import HealthKind, ServerReport
from infervisor.replay import InstanceState, LifecycleState
from infervisor.replay.state import Stamp, elapsed_s

from .health import probe_token, wants_deep, wants_probe
from .pacing import Pacing, probe_interval_s
from .rules import Mode, Rules, Tracking

__all__ = [
    "RECONCILE_MEANINGS",
    "RECONCILE_RULES",
    "WAKE_MEANINGS",
    "WAKE_RULES",
    "PortListeners",
    "Reconcile",
    "Seen",
    "Wake",
    "Watch",
    "reconcile_for",
    "wake_for",
    "watch_of",
]

S = LifecycleState


class Wake(enum.StrEnum):
    """Why a report wakes the actor (see the module's table)."""

    MISS = "miss"
    UNSTEADY = "unsteady"
    CHANGED = "changed"
    DEEP_DUE = "deep_due"
    STABLE_DUE = "stable_due"


class Watch(msgspec.Struct, frozen=True, kw_only=True):
    """What the actor tells its probe engine after each decision (monotonic seconds).

    Attributes:
        token: what a probe is for now (:func:`~.health.probe_token`).
        probe: probes are wanted (the state probes, and the chain records).
        interval_s: seconds between probes (the readiness cadence while starting).
        steady: a report equal to the last one decided changes nothing.
        deep_due_s: when a deep check falls due (None: none wanted, or one runs).
        stable_due_s: when the stability reset falls due (None: nothing to reset).
        ticks: the reconcile tick has something to decide or track (:data:`RECONCILE_RULES`).
        port: the server's port (whose listeners beyond loopback status shows).
    """

    token: int = 0
    probe: bool = False
    interval_s: float = 1.0
    steady: bool = False
    deep_due_s: float | None = None
    stable_due_s: float | None = None
    ticks: bool = True
    port: int = 0


class Seen(msgspec.Struct, frozen=True):
    """A probe as the engine compares it with the last one reported: its token,
    its report, and the server's count of requests in progress (None: unknown)."""

    token: int
    report: ServerReport
    active: int | None = None


def watch_of(
    inst: InstanceState,
    rules: Rules,
    tracking: Tracking,
    pacing: Pacing,
    now: Stamp,
    *,
    recording: bool,
    port: int = 0,
) -> Watch:
    """The :class:`Watch` of an instance at ``now``.

    Args:
        inst, rules, tracking: the instance's sourced state, rules and tracking.
        pacing: the actor's record of its deep checks (``deep_running``, ``last_deep_s``).
        now: now (``now.mono_s`` is the clock the engine schedules on).
        recording: the chain records (no observation waits in the backlog):
            no verdict is made on a state the chain has not recorded.
        port: the server's port (the reconcile tick's listeners).
    """
    sup = rules.supervision
    deep_due: float | None = None
    if wants_deep(inst, rules) and not pacing.deep_running:
        last = pacing.last_deep_s
        deep_due = now.mono_s if last is None else last + sup.deep_interval_s
    return Watch(
        token=probe_token(inst),
        probe=recording and wants_probe(inst, rules),
        interval_s=probe_interval_s(inst, rules),
        steady=inst.lifecycle is S.RUNNING and not tracking.misses and not tracking.deep_misses,
        deep_due_s=deep_due,
        stable_due_s=_stable_due_s(inst, rules, now),
        ticks=_ticks(inst, rules),
        port=port,
    )


def _ticks(inst: InstanceState, rules: Rules) -> bool:
    """The reconcile tick decides or tracks something: a mode whose tick rule acts
    (a managed process, Ollama, residency's idle expiry), or a process of its own
    (descendants, tree RSS, listeners it owns). An adopted server's tick rule is
    ``untouched`` (actors/core/adopted.py) and it has no process."""
    return rules.mode is not Mode.ADOPTED or inst.process is not None


def _stable_due_s(inst: InstanceState, rules: Rules, now: Stamp) -> float | None:
    """When :func:`~.health.stable_check` would clear the restart count (None: never)."""
    if inst.lifecycle is not S.RUNNING or not inst.restarts or inst.up_since is None:
        return None
    left = rules.supervision.restart.stable_after_s - elapsed_s(inst.up_since, now)
    return now.mono_s + max(0.0, left)


#: A wake rule: whether it holds for (watch, the report seen, the last reported, now).
WakeRule = Callable[[Watch, Seen, "Seen | None", float], bool]


def _due(at_s: float | None, now_s: float) -> bool:
    return at_s is not None and now_s >= at_s


#: The wake table, in order: the first reason that holds wakes the actor.
WAKE_RULES: tuple[tuple[Wake, WakeRule], ...] = (
    (Wake.MISS, lambda w, seen, last, now: seen.report.health.kind is not HealthKind.UP),
    (Wake.UNSTEADY, lambda w, seen, last, now: not w.steady),
    (Wake.CHANGED, lambda w, seen, last, now: seen != last),
    (Wake.DEEP_DUE, lambda w, seen, last, now: _due(w.deep_due_s, now)),
    (Wake.STABLE_DUE, lambda w, seen, last, now: _due(w.stable_due_s, now)),
)

#: When each reason of :data:`WAKE_RULES` holds, in words (docs/lifecycle.md).
WAKE_MEANINGS: dict[Wake, str] = {
    Wake.MISS: "the probe did not answer up (misses are counted in a row: every miss is decided)",
    Wake.UNSTEADY: (
        "the instance is not steady (starting, with its loading allowance; unhealthy; misses"
        " or failed deep checks counted): every report is decided, as before the engine"
    ),
    Wake.CHANGED: (
        "the report (with its token and the server's count of requests in progress) differs"
        " from the last one the actor decided while steady, or there is none (the first"
        " report once steady is always decided)"
    ),
    Wake.DEEP_DUE: "a deep check (one real token) is due on `deep_interval_s`",
    Wake.STABLE_DUE: (
        "the stability reset (restart count cleared) is due: it is decided only on a probe"
        " answering up, as always"
    ),
}


def wake_for(watch: Watch, seen: Seen, last: Seen | None, now_s: float) -> Wake | None:
    """Why the report ``seen`` wakes the actor (None: it changes nothing).

    Args:
        watch: the actor's last :class:`Watch`.
        seen: the probe just made.
        last: the last probe reported to the actor while it was steady (None:
            none yet, or the engine was told to start afresh).
        now_s: the engine's monotonic clock, seconds.
    """
    for reason, holds in WAKE_RULES:
        if holds(watch, seen, last, now_s):
            return reason
    return None


class Reconcile(enum.StrEnum):
    """Why a reconcile tick wakes the actor (see :data:`RECONCILE_RULES`)."""

    TICKS = "ticks"
    LISTENERS = "listeners"


#: Listeners beyond loopback on a port, as a tick's socket snapshot shows them
#: (None: the table could not be read this tick).
PortListeners = tuple[str, ...] | None
#: A reconcile rule: whether it holds for (watch, this tick's listeners, the last told).
ReconcileRule = Callable[[Watch, PortListeners, PortListeners], bool]

#: The reconcile table, in order: the first reason that holds tells the actor the tick.
RECONCILE_RULES: tuple[tuple[Reconcile, ReconcileRule], ...] = (
    (Reconcile.TICKS, lambda w, seen, told: w.ticks),
    (Reconcile.LISTENERS, lambda w, seen, told: seen is not None and seen != told),
)

#: When each reason of :data:`RECONCILE_RULES` holds, in words.
RECONCILE_MEANINGS: dict[Reconcile, str] = {
    Reconcile.TICKS: (
        "the tick has something to decide or track: a mode whose tick rule acts (managed"
        " process, Ollama, idle expiry) or a process of the instance's own"
    ),
    Reconcile.LISTENERS: (
        "the listeners beyond loopback on the instance's port differ from the last ones"
        " told, or none were told yet (status shows them)"
    ),
}


def reconcile_for(watch: Watch, seen: PortListeners, told: PortListeners) -> Reconcile | None:
    """Why this reconcile tick wakes the actor (None: deciding it changes nothing).

    An adopted server's tick decides nothing (its rule is ``untouched``) and it
    has no process to track: the one thing the tick brings it is the socket
    table, of which its status shows its own port's listeners. So it is told a
    tick only when those changed.

    Args:
        watch: the actor's last :class:`Watch`.
        seen: this tick's listeners beyond loopback on ``watch.port`` (None: unread).
        told: those of the last tick told (None: none told yet, or unread then).
    """
    for reason, holds in RECONCILE_RULES:
        if holds(watch, seen, told):
            return reason
    return None
