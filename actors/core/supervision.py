"""What "healthy" means for an instance: its effective supervision (health spec
and restart policy) and the judge that turns one status sample into a verdict:
healthy, unhealthy with a reason, or finished.

Source: ``reference/host_supervise.rs.txt`` (``judge``, ``HealthSpec``,
``sample``: a one-shot run that exits 0 is finished, never restarted). The
inference kind counts loading (and not listening yet) as healthy until its
startup deadline, like a startup probe; a server still reporting loading keeps
the deadline extended, up to a hard cap. The judge reads the sample's
:class:`~infervisor.adapters.status.Phase`, set where the probe report was
mapped, never the detail text meant for people.
"""

from __future__ import annotations

import enum

import msgspec

from infervisor.adapters.status import InstanceStatus, Phase, StatusState
from infervisor.replay import RestartPolicy
from infervisor.replay.durations import seconds

__all__ = [
    "Finished",
    "HealthSample",
    "Healthy",
    "ProbeMethod",
    "Supervision",
    "Unhealthy",
    "Verdict",
    "judge",
]


class ProbeMethod(enum.StrEnum):
    """How an instance's health is known (a kind's ``probe`` setting)."""

    HTTP = "http"  # ask the server's health endpoint
    PROCESS = "process"  # a live process is healthy (workloads that serve nothing)


class Supervision(msgspec.Struct, frozen=True, kw_only=True):
    """One instance's effective supervision: its kind's spec over the node's defaults,
    and the restart policy (instance override, else kind, else node)."""

    kind: str
    interval_s: float
    miss_limit: int
    startup_deadline_s: float
    startup_cap_s: float
    restart: RestartPolicy
    probe: ProbeMethod
    deep_interval_s: float = 0.0


class HealthSample(msgspec.Struct, frozen=True, kw_only=True):
    """What a probe found, as the judge sees it. ``phase``: where the server stands in
    coming up (from the probe's report); ``elapsed_s``: since the process started."""

    status: InstanceStatus
    phase: Phase
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


def judge(kind: Supervision, sample: HealthSample) -> Verdict:
    """The kind's verdict on one sample (the process judge when no startup allowance)."""
    st = sample.status
    if st.state is StatusState.EXITED:
        if st.exit_code == 0 and not sample.continuous:
            return Finished()
        return Unhealthy(st.detail or f"exited with code {st.exit_code}")
    if st.state in (StatusState.RUNNING, StatusState.LOADED):
        return Healthy()
    return _degraded(kind, sample)


def _degraded(kind: Supervision, sample: HealthSample) -> Verdict:
    detail = sample.status.detail or "degraded"
    loading = sample.phase is Phase.LOADING
    not_yet = sample.phase is Phase.STARTING
    if not sample.starting:
        return Unhealthy(detail)  # the startup allowance is for starting only
    if sample.elapsed_s <= kind.startup_deadline_s and (loading or not_yet):
        return Healthy(serving=False)
    if loading and sample.elapsed_s <= kind.startup_cap_s:
        return Healthy(serving=False)  # still loading: the deadline extends, up to the cap
    if loading or not_yet:
        limit = kind.startup_cap_s if loading else kind.startup_deadline_s
        return Unhealthy(
            f"{detail} after {seconds(sample.elapsed_s)} (startup allowance {seconds(limit)})"
        )
    return Unhealthy(detail)
