"""Workload kinds: what "healthy" means for an instance, and how often to ask.

A kind gives its health spec (poll interval in seconds, miss limit, startup
allowance) and a judge that turns a status sample into a verdict: healthy,
unhealthy with a reason, or finished. Unknown kinds fall back to the process
judge. Source: ``reference/host_supervise.rs.txt`` (``judge``, ``HealthSpec``,
``sample``: a one-shot run that exits 0 is finished, never restarted).

The inference kind counts "loading" (and "not listening yet") as healthy
until its startup deadline, like a startup probe; a server still reporting
loading keeps the deadline extended, up to a hard cap.
"""

from __future__ import annotations

import msgspec

from infervisor.adapters.status import InstanceStatus, StatusState
from infervisor.replay import RestartPolicy

__all__ = [
    "DEFAULT_KINDS",
    "Finished",
    "Healthy",
    "HealthSample",
    "KindSettings",
    "Unhealthy",
    "Verdict",
    "judge",
]


class KindSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One workload kind's health spec (seconds) and optional restart policy.

    Attributes:
        interval_s: time between health probes of one instance.
        miss_limit: consecutive misses that make an instance unhealthy.
        startup_deadline_s: while starting, loading or not listening yet is
            healthy for this long (0: no allowance, the process judge).
        startup_cap_s: a server still reporting loading is given until this
            long, however often the deadline was extended.
        restart: this kind's restart policy (None: the node's).
    """

    interval_s: float = 1.0
    miss_limit: int = 3
    startup_deadline_s: float = 0.0
    startup_cap_s: float = 0.0
    restart: RestartPolicy | None = None

    def validate(self, name: str) -> None:
        """Raise ValueError naming the kind and field when a value is out of range."""
        if self.interval_s <= 0 or self.miss_limit < 1:
            raise ValueError(f"kinds.{name}: interval_s must be > 0 and miss_limit >= 1")
        if self.startup_cap_s < self.startup_deadline_s:
            raise ValueError(f"kinds.{name}: startup_cap_s must be >= startup_deadline_s")
        if self.restart is not None:
            self.restart.validate()


DEFAULT_KINDS: dict[str, KindSettings] = {
    "process": KindSettings(),
    "inference": KindSettings(startup_deadline_s=120.0, startup_cap_s=900.0),
}


class HealthSample(msgspec.Struct, frozen=True, kw_only=True):
    """What a probe found, as the judge sees it. ``elapsed_s``: since the process started."""

    status: InstanceStatus
    continuous: bool
    starting: bool
    elapsed_s: float


class Healthy(msgspec.Struct, frozen=True):
    """Counts as an answer; ``serving`` is False while loading within the allowance."""

    serving: bool = True


class Unhealthy(msgspec.Struct, frozen=True):
    """Counts as a miss."""

    reason: str


class Finished(msgspec.Struct, frozen=True):
    """A one-shot run ended cleanly: never restarted."""


Verdict = Healthy | Unhealthy | Finished


def judge(kind: KindSettings, sample: HealthSample) -> Verdict:
    """The kind's verdict on one sample (the process judge when no startup allowance)."""
    st = sample.status
    if st.state is StatusState.EXITED:
        if st.exit_code == 0 and not sample.continuous:
            return Finished()
        return Unhealthy(st.detail or f"exited with code {st.exit_code}")
    if st.state in (StatusState.RUNNING, StatusState.LOADED):
        return Healthy()
    return _degraded(kind, sample)


def _degraded(kind: KindSettings, sample: HealthSample) -> Verdict:
    detail = sample.status.detail or "degraded"
    loading = detail == "loading model"
    not_yet = detail.startswith("starting:")
    if sample.elapsed_s <= kind.startup_deadline_s and (loading or not_yet):
        return Healthy(serving=False)
    if loading and sample.elapsed_s <= kind.startup_cap_s:
        return Healthy(serving=False)  # still loading: the deadline extends, up to the cap
    if loading or not_yet:
        limit = kind.startup_cap_s if loading else kind.startup_deadline_s
        return Unhealthy(f"{detail} after {sample.elapsed_s:.0f} s (startup allowance {limit:g} s)")
    return Unhealthy(detail)
