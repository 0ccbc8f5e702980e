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

from typing import Any, Literal

import msgspec

from infervisor.adapters.status import InstanceStatus, StatusState
from infervisor.replay import RestartPolicy
from infervisor.replay.policy import check_duration

__all__ = [
    "DEFAULT_KINDS",
    "Finished",
    "HealthSample",
    "Healthy",
    "KindSettings",
    "Supervision",
    "Unhealthy",
    "Verdict",
    "judge",
]


class KindSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One workload kind's health spec (seconds) and optional restart policy.

    Attributes:
        interval_s: time between health probes of one instance (None: the node's).
        miss_limit: consecutive misses that make an instance unhealthy (None: the node's).
        startup_deadline_s: while starting, loading or not listening yet is
            healthy for this long (0: no allowance, the process judge).
        startup_cap_s: a server still reporting loading is given until this
            long, however often the deadline was extended.
        restart: this kind's restart policy (None: the node's).
        probe: ``http`` asks the server's health endpoint; ``process`` counts a
            live process as healthy (for workloads that serve nothing).
        deep_interval_s: time between deep health checks of a serving
            instance: one real token of completion (``POST /v1/completions``,
            ``max_tokens`` 1; for Ollama its OpenAI-compatible route), which
            catches a server whose health endpoint answers while it cannot
            generate. A failed one is recorded (``instance.deep_health_failed``)
            and counts as a missed probe: ``miss_limit`` of them in a row make
            the instance unhealthy, and an unhealthy managed process is
            restarted under the policy. 0 (the default): off.
    """

    interval_s: float | None = None
    miss_limit: int | None = None
    startup_deadline_s: float = 0.0
    startup_cap_s: float = 0.0
    restart: RestartPolicy | None = None
    probe: Literal["http", "process"] = "http"
    deep_interval_s: float = 0.0

    def validate(self, name: str) -> None:
        """Raise ValueError naming the kind and field when a value is out of range."""
        if self.interval_s is not None:
            check_duration(f"kinds.{name}.interval_s", self.interval_s)
        for field in ("startup_deadline_s", "startup_cap_s", "deep_interval_s"):
            check_duration(f"kinds.{name}.{field}", getattr(self, field), allow_zero=True)
        if self.miss_limit is not None and self.miss_limit < 1:
            raise ValueError(f"kinds.{name}.miss_limit {self.miss_limit}: allowed 1 or more")
        if self.startup_cap_s < self.startup_deadline_s:
            raise ValueError(f"kinds.{name}: startup_cap_s must be >= startup_deadline_s")
        if self.restart is not None:
            self.restart.validate()


DEFAULT_KINDS: dict[str, KindSettings] = {
    "process": KindSettings(probe="process"),
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
    loading = detail == "loading model"
    not_yet = detail.startswith("starting:")
    if not sample.starting:
        return Unhealthy(detail)  # the startup allowance is for starting only
    if sample.elapsed_s <= kind.startup_deadline_s and (loading or not_yet):
        return Healthy(serving=False)
    if loading and sample.elapsed_s <= kind.startup_cap_s:
        return Healthy(serving=False)  # still loading: the deadline extends, up to the cap
    if loading or not_yet:
        limit = kind.startup_cap_s if loading else kind.startup_deadline_s
        return Unhealthy(f"{detail} after {sample.elapsed_s:.0f} s (startup allowance {limit:g} s)")
    return Unhealthy(detail)


class Supervision(msgspec.Struct, frozen=True, kw_only=True):
    """One instance's effective supervision: its kind's spec over the node's defaults,
    and the restart policy (instance override, else kind, else node)."""

    kind: str
    interval_s: float
    miss_limit: int
    startup_deadline_s: float
    startup_cap_s: float
    restart: RestartPolicy
    probe: str
    deep_interval_s: float = 0.0


def supervision_for(
    kind: str,
    kinds: dict[str, KindSettings],
    *,
    node_interval_s: float,
    node_miss_limit: int,
    node_restart: RestartPolicy,
    restart_override: dict[str, Any] | None = None,
) -> Supervision:
    """Resolve an instance's supervision. Unknown kinds get the process judge.

    Raises:
        ValueError: the restart override names an unknown field or a value out of
            range (the field is named).
    """
    spec = kinds.get(kind) or DEFAULT_KINDS.get(kind) or DEFAULT_KINDS["process"]
    restart = spec.restart or node_restart
    if restart_override:
        restart = _overridden(restart, restart_override)
    return Supervision(
        kind=kind,
        interval_s=spec.interval_s or node_interval_s,
        miss_limit=spec.miss_limit or node_miss_limit,
        startup_deadline_s=spec.startup_deadline_s,
        startup_cap_s=spec.startup_cap_s,
        restart=restart,
        probe=spec.probe,
        deep_interval_s=spec.deep_interval_s,
    )


def _overridden(policy: RestartPolicy, override: dict[str, Any]) -> RestartPolicy:
    try:
        merged = msgspec.convert({**msgspec.to_builtins(policy), **override}, RestartPolicy)
    except msgspec.ValidationError as e:
        raise ValueError(
            f"restart: {str(e).replace('Object contains unknown field', 'unknown key')}"
        ) from e
    merged.validate()
    return merged
