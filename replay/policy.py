"""The restart policy: exponential backoff, a budget in a window, a stability reset.

Pure arithmetic over sourced state, so a restart decision replays the same
way it was made. Source: ``reference/infer_config.rs.txt`` (``RestartPolicy``:
5 restarts, 2 s base doubling, 60 s cap, 60 s stability) and
``reference/host_supervise.rs.txt`` (budget inside a window, ``Failed`` when spent).
"""

from __future__ import annotations

import math

import blake3
import msgspec

from .state import InstanceState, Stamp, elapsed_s

__all__ = [
    "MAX_DURATION_S",
    "RESTART_RANGES",
    "Exhausted",
    "Restart",
    "RestartDecision",
    "RestartPolicy",
    "check_duration",
    "decide_restart",
    "jitter_unit",
    "restarts_in_window",
]

_NS = 1_000_000_000


#: The longest duration any setting or verb accepts (seconds): a week. Longer
#: values overflow timers, and non-finite ones cannot be recorded in the chain.
MAX_DURATION_S = 7 * 24 * 3600.0


def _seconds(*, allow_zero: bool = False) -> str:
    return f"{'0' if allow_zero else 'more than 0'} to {MAX_DURATION_S:g} seconds"


def check_duration(name: str, value: float, *, allow_zero: bool = False) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is a finite number of seconds
    in ``(0, MAX_DURATION_S]`` (``[0, ...]`` with ``allow_zero``)."""
    low_ok = value >= 0 if allow_zero else value > 0
    if not (math.isfinite(value) and low_ok and value <= MAX_DURATION_S):
        raise ValueError(f"{name} {value}: allowed {_seconds(allow_zero=allow_zero)}")


#: What each restart policy field allows, as :meth:`RestartPolicy.validate` checks
#: it and says it; the control API quotes these for a value beyond 64 bits
#: (tools/api/strict.py, ``spec.restart.base_s``) rather than the chain's range.
RESTART_RANGES = {
    "max_restarts": "a whole number, 0 or more",
    "base_s": f"{_seconds()}, at most cap_s",
    "cap_s": f"{_seconds()}, at least base_s",
    "stable_after_s": _seconds(),
    "window_s": f"{_seconds()}, or none",
    "jitter": "0 to 1",
}


class RestartPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Bounds on automatic restarts. All durations in seconds.

    Attributes:
        max_restarts: restarts allowed inside ``window_s`` before the instance is Failed.
        base_s: delay before the first restart; doubles each time.
        cap_s: longest delay.
        stable_after_s: uptime (answering health) after which the count clears.
        window_s: sliding window the budget counts in; ``None`` counts since the
            last clear, as the reference does.
        jitter: fraction (0..1) of the delay added, to spread restarts. The
            random part is a hash of the instance and the attempt (see
            :func:`jitter_unit`), so a rebooted node decides the same delay;
            with it the delay still never exceeds ``cap_s``.

    Which verbs reset the budget: only an explicit operator start (or an
    operator restart), as in the reference; boot, controller and supervisor
    starts keep counting.
    """

    max_restarts: int = 5
    base_s: float = 2.0
    cap_s: float = 60.0
    stable_after_s: float = 60.0
    window_s: float | None = None
    jitter: float = 0.0

    def validate(self) -> None:
        """Raise ValueError naming the field when a bound is out of range."""
        if self.max_restarts < 0:
            raise ValueError(
                f"max_restarts {self.max_restarts}: allowed {RESTART_RANGES['max_restarts']}"
            )
        for name in ("base_s", "cap_s", "stable_after_s"):
            check_duration(f"restart.{name}", getattr(self, name))
        if self.window_s is not None:
            check_duration("restart.window_s", self.window_s)
        if not 0 < self.base_s <= self.cap_s:
            raise ValueError(f"base_s {self.base_s} / cap_s {self.cap_s}: need 0 < base_s <= cap_s")
        if not (math.isfinite(self.jitter) and 0 <= self.jitter <= 1):
            raise ValueError(f"jitter {self.jitter}: allowed {RESTART_RANGES['jitter']}")
        if self.window_s is not None and self.window_s <= 0:
            raise ValueError(f"window_s {self.window_s}: allowed a positive number or none")

    def delay(self, attempt: int, unit: float = 0.0) -> float:
        """Seconds before restart number ``attempt`` (0-based).

        ``min(base * 2**attempt * (1 + jitter * unit), cap)``: ``unit`` in
        [0, 1) is the jitter's random part; jitter never takes it past the cap.
        """
        d = self.base_s * (1 << min(attempt, 16))
        return min(d * (1 + self.jitter * unit), self.cap_s)


class Restart(msgspec.Struct, frozen=True):
    """Restart after ``delay_s``; ``attempt`` counts this one (1-based)."""

    attempt: int
    delay_s: float


class Exhausted(msgspec.Struct, frozen=True):
    """The budget is spent: ``attempts`` restarts inside the window."""

    attempts: int


RestartDecision = Restart | Exhausted


def jitter_unit(instance_id: str, attempt: int, seq: int) -> float:
    """A number in [0, 1) fixed by the instance, the attempt and the chain position:
    the jitter's random part, the same wherever the decision is made again."""
    digest = blake3.blake3(f"{instance_id}:{attempt}:{seq}".encode()).digest(8)
    return int.from_bytes(digest, "big") / 2**64


def restarts_in_window(inst: InstanceState, policy: RestartPolicy, now: Stamp) -> int:
    """Restarts that count against the budget at ``now``.

    This is what status shows as "restarts". Within one boot the window is
    measured on the monotonic clock, so a wall-clock step neither spends nor
    refunds budget; restarts recorded before stamps existed count by wall time.
    """
    if policy.window_s is None or inst.restarts == 0:
        return inst.restarts
    window = policy.window_s
    if len(inst.restart_stamps) == inst.restarts:
        return sum(1 for t in inst.restart_stamps if elapsed_s(t, now) < window)
    horizon = now.wall_ns - int(window * _NS)
    return sum(1 for t in inst.restart_times_ns[-inst.restarts :] if t > horizon)


def decide_restart(
    inst: InstanceState, policy: RestartPolicy, now: Stamp, unit: float = 0.0
) -> RestartDecision:
    """Restart (with its backoff) or give up, from the instance's sourced restart history.

    ``unit`` is the jitter's random part (:func:`jitter_unit`).
    """
    used = restarts_in_window(inst, policy, now)
    if used >= policy.max_restarts:
        return Exhausted(attempts=used)
    return Restart(attempt=used + 1, delay_s=policy.delay(used, unit))
