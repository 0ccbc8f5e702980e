"""When an instance's next health probe and deep health check are due (pure).

The supervisor ticks every instance at the shortest probe interval of any
kind; each instance's kind may ask for longer ones (``interval_s``,
``deep_interval_s``). On each tick :func:`pace` says which of the two checks
to send now, from the instance's sourced state, its rules and the
:class:`Pacing` its executor keeps (when each check was last sent, and
whether one is still out). The executor only sends what it is told and keeps
the :class:`Pacing` returned. No check is sent while one of its kind is out:
a hung server costs one probe worker, never a pile of them.

Half a tick of slack: ticks are handled with jitter, and a check due a hair
after this tick must not wait a whole extra tick.

Source: ``reference/host_supervise.rs.txt`` (the supervise loop polls an
instance only once its kind's ``interval_ms`` has passed since the last poll);
the deep check (one real token) is paced the same way on ``deep_interval_s``.
"""

from __future__ import annotations

import msgspec

from infervisor.replay import InstanceState

from .health import wants_deep, wants_probe
from .rules import Rules

__all__ = ["Paced", "Pacing", "pace"]


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
    supervision = rules.supervision
    deep = (
        not pacing.deep_running
        and wants_deep(state, rules)
        and _due(pacing.last_deep_s, supervision.deep_interval_s, now_s, slack_s)
    )
    probe = (
        not pacing.probing
        and wants_probe(state, rules)
        and _due(pacing.last_probe_s, supervision.interval_s, now_s, slack_s)
    )
    after = pacing
    if deep:
        after = msgspec.structs.replace(after, deep_running=True, last_deep_s=now_s)
    if probe:
        after = msgspec.structs.replace(after, probing=True, last_probe_s=now_s)
    return Paced(probe=probe, deep=deep, pacing=after)


def _due(last_s: float | None, interval_s: float, now_s: float, slack_s: float) -> bool:
    return last_s is None or now_s - last_s >= interval_s - slack_s
