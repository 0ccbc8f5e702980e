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
from .rules import Rules, Tracking

__all__ = ["WAKE_MEANINGS", "WAKE_RULES", "Seen", "Wake", "Watch", "wake_for", "watch_of"]

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
    """

    token: int = 0
    probe: bool = False
    interval_s: float = 1.0
    steady: bool = False
    deep_due_s: float | None = None
    stable_due_s: float | None = None


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
) -> Watch:
    """The :class:`Watch` of an instance at ``now``.

    Args:
        inst, rules, tracking: the instance's sourced state, rules and tracking.
        pacing: the actor's record of its deep checks (``deep_running``, ``last_deep_s``).
        now: now (``now.mono_s`` is the clock the engine schedules on).
        recording: the chain records (no observation waits in the backlog):
            no verdict is made on a state the chain has not recorded.
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
    )


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
