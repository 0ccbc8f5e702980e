"""When an instance's next health probe and deep health check are due (pure).

Each instance's kind sets its intervals (``interval_s``, ``deep_interval_s``).
The probes are scheduled by the instance's probe engine (actors/probe_loop.py)
every :func:`probe_interval_s`: the kind's interval, or :data:`READINESS_S`
while the instance starts. The deep checks are paced by :func:`deep_paced`
from the instance's sourced state, its rules and the :class:`Pacing` its
executor keeps (when a check was last sent, and whether one is still out);
:func:`pace` paces both at a health tick told to the actor. The executor only
sends what it is told and keeps the :class:`Pacing` returned. No check is sent
while one of its kind is out: a hung server costs one probe worker, never a
pile of them.

Half a tick of slack: ticks are handled with jitter, and a check due a hair
after this tick must not wait a whole extra tick.

Source: ``reference/host_supervise.rs.txt`` (the supervise loop polls an
instance only once its kind's ``interval_ms`` has passed since the last poll);
the deep check (one real token) is paced the same way on ``deep_interval_s``.
"""

from __future__ import annotations

import msgspec

from infervisor.replay import InstanceState, LifecycleState

from .health import wants_deep, wants_probe
from .rules import Rules

__all__ = ["READINESS_S", "Paced", "Pacing", "deep_paced", "pace", "probe_interval_s"]

S = LifecycleState

#: Seconds between readiness probes of an instance in start-up. A request for a
#: resting model waits until the node records its server ready (issue 21: load
#: time plus at most 50 ms); probed at the kind's interval (1 s by default) the
#: node noticed about half an interval late (bench/README.md: +491 ms). Probing
#: every 50 ms while it starts bounds that; only instances in start-up pay
#: (a load takes seconds: tens of probes, about 120 us of CPU each).
READINESS_S = 0.05


class Pacing(msgspec.Struct, frozen=True, kw_only=True):
    """The executor's unsourced record of its checks (monotonic seconds).

    Attributes:
        probing: a probe was sent and its report has not come back.
        last_probe_s: when the last probe was sent (None: none yet, or to be
            sent at the next tick whatever the interval).
        deep_running: a deep check runs and has not reported.
        last_deep_s: when the last deep check began (None as for probes).
    """

    probing: bool = False
    last_probe_s: float | None = None
    deep_running: bool = False
    last_deep_s: float | None = None

    def probed(self) -> Pacing:
        """A probe's report came back."""
        return msgspec.structs.replace(self, probing=False)

    def deep_checked(self) -> Pacing:
        """A deep check reported."""
        return msgspec.structs.replace(self, deep_running=False)

    def afresh(self) -> Pacing:
        """Both checks due at the next tick (what was observed meanwhile is no verdict)."""
        return msgspec.structs.replace(self, last_probe_s=None, last_deep_s=None)


class Paced(msgspec.Struct, frozen=True, kw_only=True):
    """What a tick sends: a probe, a deep check (either, both or neither), and
    the pacing to keep once they are sent."""

    probe: bool
    deep: bool
    pacing: Pacing


def pace(state: InstanceState, rules: Rules, pacing: Pacing, now_s: float, slack_s: float) -> Paced:
    """The checks due at a tick at monotonic time ``now_s`` (seconds).

    Args:
        state: the instance's sourced state.
        rules: its rules (its kind's ``interval_s`` and ``deep_interval_s``).
        pacing: the executor's record of its checks.
        now_s: the monotonic clock now, seconds.
        slack_s: how much earlier than its interval a check may go (half a tick).
    """
    after = deep_paced(state, rules, pacing, now_s, slack_s).pacing
    deep = after.deep_running and not pacing.deep_running
    probe = (
        not pacing.probing
        and wants_probe(state, rules)
        and _due(pacing.last_probe_s, rules.supervision.interval_s, now_s, slack_s)
    )
    if probe:
        after = msgspec.structs.replace(after, probing=True, last_probe_s=now_s)
    return Paced(probe=probe, deep=deep, pacing=after)


def deep_paced(
    state: InstanceState, rules: Rules, pacing: Pacing, now_s: float, slack_s: float = 0.0
) -> Paced:
    """The deep check alone, paced as :func:`pace` paces it (``probe`` is always
    False: the probe engine schedules the probes, actors/probe_loop.py)."""
    deep = (
        not pacing.deep_running
        and wants_deep(state, rules)
        and _due(pacing.last_deep_s, rules.supervision.deep_interval_s, now_s, slack_s)
    )
    after = pacing
    if deep:
        after = msgspec.structs.replace(after, deep_running=True, last_deep_s=now_s)
    return Paced(probe=False, deep=deep, pacing=after)


def probe_interval_s(state: InstanceState, rules: Rules) -> float:
    """Seconds between two probes: the kind's ``interval_s``, or
    :data:`READINESS_S` (when shorter) while the instance starts."""
    interval = rules.supervision.interval_s
    if state.lifecycle is S.STARTING:
        return min(interval, READINESS_S)
    return interval


def _due(last_s: float | None, interval_s: float, now_s: float, slack_s: float) -> bool:
    return last_s is None or now_s - last_s >= interval_s - slack_s
