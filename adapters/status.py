"""What a probe report means for an instance: ``map_report``.

Source of the behaviour: ``reference/infer_lifecycle.rs.txt`` (``map_report``),
ported branch for branch with the same detail strings. Every outcome is one
row of :data:`MAP_REPORT_CASES`, and ``map_report`` builds its answer from
those rows, so a table generated from them cannot drift from the code.
"""

from __future__ import annotations

import enum
from typing import Final, NamedTuple

import msgspec

from .probe import Health, HealthKind, ServerReport
from .spec import Flavor

__all__ = [
    "MAP_REPORT_CASES",
    "InstanceStatus",
    "LoadKind",
    "LoadState",
    "StatusCase",
    "StatusState",
    "map_report",
]


class StatusState(enum.StrEnum):
    """What an instance's server is doing, as a status query reports it."""

    LOADED = "loaded"
    RUNNING = "running"
    DEGRADED = "degraded"
    EXITED = "exited"
    UNKNOWN = "unknown"


class InstanceStatus(msgspec.Struct, frozen=True):
    """A status answer: the state, the exit code once exited, and why."""

    state: StatusState
    exit_code: int | None = None
    detail: str | None = None


class LoadKind(enum.StrEnum):
    """Progress of an Ollama model load this node asked for."""

    LOADING = "loading"
    DONE = "done"
    FAILED = "failed"


class LoadState(msgspec.Struct, frozen=True):
    """An Ollama load's progress; ``error`` says why when it failed."""

    kind: LoadKind
    error: str = ""


class StatusCase(NamedTuple):
    """One outcome of ``map_report``: when it applies, the state, the detail template.

    Template fields: ``{reason}`` (the health reason), ``{model}``, ``{error}``
    (the load error); a None template means no detail.
    """

    description: str
    state: StatusState
    detail: str | None

    def status(self, **fields: str) -> InstanceStatus:
        detail = None if self.detail is None else self.detail.format(**fields)
        return InstanceStatus(self.state, detail=detail)


_S = StatusState
LOADING = StatusCase("server is loading its model", _S.DEGRADED, "loading model")
UNHEALTHY = StatusCase("server answers unhealthy", _S.DEGRADED, "{reason}")
STARTING = StatusCase(
    "unreachable while the process is alive", _S.DEGRADED, "starting: not listening yet ({reason})"
)
GONE_ADOPTED = StatusCase(
    "unreachable, adopted server",
    _S.EXITED,
    "unreachable ({reason}); adopted servers are not restarted",
)
GONE = StatusCase("unreachable, no live process", _S.EXITED, "unreachable ({reason})")
NOT_PULLED = StatusCase("Ollama up, model not pulled", _S.DEGRADED, "model {model} is not pulled")
RESIDENT = StatusCase("Ollama up, model resident", _S.RUNNING, "model resident")
LOAD_FAILED = StatusCase("Ollama up, the load failed", _S.DEGRADED, "load failed: {error}")
OLLAMA_LOADING = StatusCase(
    "Ollama up, this node's load is under way (resident or not yet)", _S.DEGRADED, "loading model"
)
UP_ADOPTED = StatusCase(
    "Ollama up, adopted, model not resident", _S.RUNNING, "server up; model not resident"
)
UP_IDLE = StatusCase("Ollama up, managed, model not resident", _S.LOADED, None)
NOT_LISTED = StatusCase(
    "up, the server lists models but not this one",
    _S.DEGRADED,
    "model {model} is not listed by the server",
)
UP = StatusCase("up (model listed, none listed, or no model to check)", _S.RUNNING, None)

MAP_REPORT_CASES: Final[list[StatusCase]] = [
    LOADING,
    UNHEALTHY,
    STARTING,
    GONE_ADOPTED,
    GONE,
    NOT_PULLED,
    OLLAMA_LOADING,
    RESIDENT,
    LOAD_FAILED,
    UP_ADOPTED,
    UP_IDLE,
    NOT_LISTED,
    UP,
]


def map_report(
    flavor: Flavor,
    model: str | None,
    report: ServerReport,
    *,
    alive: bool,
    adopted: bool,
    load: LoadState | None,
) -> InstanceStatus:
    """The instance status a probe report means.

    Args:
        flavor: the server software probed.
        model: the model the instance should serve (Ollama: its tag), if any.
        report: the probe's result.
        alive: a managed process of this instance is running.
        adopted: the server is adopted (somebody else runs it).
        load: progress of an Ollama load this node asked for, if any.
    """
    if report.health.kind is not HealthKind.UP:
        return _not_up(report.health, alive=alive, adopted=adopted)
    if flavor is Flavor.OLLAMA and model is not None:
        return _ollama_up(model, report, adopted=adopted, load=load)
    if model is not None and report.models and not report.lists(model):
        return NOT_LISTED.status(model=model)
    return UP.status()


def _not_up(health: Health, *, alive: bool, adopted: bool) -> InstanceStatus:
    if health.kind is HealthKind.LOADING:
        return LOADING.status()
    if health.kind is HealthKind.UNHEALTHY:
        return UNHEALTHY.status(reason=health.reason)
    if alive:
        return STARTING.status(reason=health.reason)
    return (GONE_ADOPTED if adopted else GONE).status(reason=health.reason)


def _ollama_up(
    model: str, report: ServerReport, *, adopted: bool, load: LoadState | None
) -> InstanceStatus:
    if not report.lists(model):
        return NOT_PULLED.status(model=model)
    # Before residency: Ollama lists a model in /api/ps while it is still loading.
    if load is not None and load.kind is LoadKind.LOADING:
        return OLLAMA_LOADING.status()
    if report.is_resident(model):
        return RESIDENT.status()
    if load is not None and load.kind is LoadKind.FAILED:
        return LOAD_FAILED.status(error=load.error)
    return (UP_ADOPTED if adopted else UP_IDLE).status()
