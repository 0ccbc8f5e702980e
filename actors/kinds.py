"""Workload kinds as configured: each kind's health spec and restart policy,
the built-in kinds, and the effective supervision of one instance (its kind's
spec over the node's defaults). Unknown kinds fall back to the process kind.

What the spec means when a probe is judged is the core's
(``actors/core/supervision.py``).
"""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec

from infervisor.replay import RestartPolicy
from infervisor.replay.policy import check_duration

from .core.supervision import ProbeMethod, Supervision

__all__ = ["DEFAULT_KINDS", "KindSettings", "RestartOverrideError", "supervision_for"]


class RestartOverrideError(ValueError):
    """A spec's ``restart`` override the node refuses; ``key`` is the key at fault
    (``base_s``), None when none is (the override as a whole)."""

    def __init__(self, message: str, key: str | None) -> None:
        super().__init__(message)
        self.key = key


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
        RestartOverrideError: (a ValueError) the restart override names an unknown
            key or a value out of range; ``key`` names the key at fault.
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
        probe=ProbeMethod(spec.probe),
        deep_interval_s=spec.deep_interval_s,
    )


def _overridden(policy: RestartPolicy, override: dict[str, Any]) -> RestartPolicy:
    allowed = ", ".join(f.name for f in msgspec.structs.fields(RestartPolicy))
    try:
        merged = msgspec.convert({**msgspec.to_builtins(policy), **override}, RestartPolicy)
    except msgspec.ValidationError as e:
        found = _AT.match(str(e))
        what, key = (found["what"], found["key"]) if found else (str(e), None)
        unknown = _UNKNOWN.match(what)
        if unknown:
            what, key = "unknown key", unknown["key"]
        name = f"restart.{key}" if key else "restart"
        raise RestartOverrideError(f"{name}: {what} (allowed keys: {allowed})", key) from e
    try:
        merged.validate()
    except ValueError as e:
        # RestartPolicy.validate names the field first (``restart.base_s 0: ...``,
        # ``max_restarts -1: ...``, ``base_s 4 / cap_s 1: ...``)
        key = str(e).split(" ", 1)[0].removeprefix("restart.")
        why = str(e) if str(e).startswith("restart.") else f"restart.{e}"
        if key == "base_s" and "cap_s" in override and "base_s" not in override:
            key = "cap_s"  # base_s <= cap_s broken by the override's cap_s
            why = f"restart.cap_s {merged.cap_s}: need base_s ({merged.base_s}) <= cap_s"
        raise RestartOverrideError(why, key if key in override else None) from e
    return merged


#: msgspec's ``<what> - at `$.<key>```, the key of the override at fault.
_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$\.(?P<key>[^`.\[]*)[^`]*`)?$", re.DOTALL)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<key>[^`]*)`$")
