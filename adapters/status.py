"""What a probe report means for an instance: ``map_report``.

Source of the behaviour: ``reference/infer_lifecycle.rs.txt`` (``map_report``),
ported branch for branch with the same detail strings. Every outcome is one
row of :data:`MAP_REPORT_CASES`, and ``map_report`` builds its answer from
those rows, so a table generated from them cannot drift from the code.
"""

from __future__ import annotations

import enum
from typing import Any, Final, NamedTuple

import msgspec

from .probe import Health, HealthKind, ServerReport
from .spec import Flavor

__all__ = [
    "MAP_REPORT_CASES",
    "InstanceStatus",
    "LoadKind",
    "LoadState",
    "Phase",
    "StatusCase",
    "StatusState",
    "classify",
    "map_report",
]


class StatusState(enum.StrEnum):
    """What an instance's server is doing, as a status query reports it."""

    LOADED = "loaded"
    RUNNING = "running"
    DEGRADED = "degraded"
    EXITED = "exited"
    UNKNOWN = "unknown"


class Phase(enum.StrEnum):
    """Where a server stands in coming up, as its probe report says: the one
    health vocabulary from the probe to the verdict (the health judge reads it,
    never the detail text, which is for people)."""

    SERVING = "serving"  # answers, with what it should serve (or idle, by design)
    LOADING = "loading"  # answers that it is loading its model
    STARTING = "starting"  # not listening yet while its process lives
    FAULTY = "faulty"  # answers, but unhealthy or without the model it should have
    DOWN = "down"  # does not answer and no process of it lives


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
    """One outcome of ``map_report``: when it applies, the state, the detail
    template, and the server's :class:`Phase`.

    Template fields: ``{reason}`` (the health reason), ``{model}``, ``{error}``
    (the load error); a None template means no detail.
    """

    description: str
    state: StatusState
    detail: str | None
    phase: Phase = Phase.SERVING

    def status(self, **fields: str) -> InstanceStatus:
        detail = None if self.detail is None else self.detail.format(**fields)
        return InstanceStatus(self.state, detail=detail)


_S = StatusState
_P = Phase
LOADING = StatusCase("server is loading its model", _S.DEGRADED, "loading model", _P.LOADING)
UNHEALTHY = StatusCase("server answers unhealthy", _S.DEGRADED, "{reason}", _P.FAULTY)
STARTING = StatusCase(
    "unreachable while the process is alive",
    _S.DEGRADED,
    "starting: not listening yet ({reason})",
    _P.STARTING,
)
GONE_ADOPTED = StatusCase(
    "unreachable, adopted server",
    _S.EXITED,
    "unreachable ({reason}); adopted servers are not restarted",
    _P.DOWN,
)
GONE = StatusCase("unreachable, no live process", _S.EXITED, "unreachable ({reason})", _P.DOWN)
NOT_PULLED = StatusCase(
    "Ollama up, model not pulled", _S.DEGRADED, "model {model} is not pulled", _P.FAULTY
)
RESIDENT = StatusCase("Ollama up, model resident", _S.RUNNING, "model resident")
LOAD_FAILED = StatusCase(
    "Ollama up, the load failed", _S.DEGRADED, "load failed: {error}", _P.FAULTY
)
OLLAMA_LOADING = StatusCase(
    "Ollama up, this node's load is under way (resident or not yet)",
    _S.DEGRADED,
    "loading model",
    _P.LOADING,
)
UP_ADOPTED = StatusCase(
    "Ollama up, adopted, model not resident", _S.RUNNING, "server up; model not resident"
)
UP_IDLE = StatusCase("Ollama up, managed, model not resident", _S.LOADED, None)
NOT_LISTED = StatusCase(
    "up, the server lists models but not this one",
    _S.DEGRADED,
    "model {model} is not listed by the server",
    _P.FAULTY,
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
    flavor: Flavor, model: str | None, report: ServerReport, **where: Any
) -> InstanceStatus:
    """The instance status a probe report means; ``where``: ``alive``, ``adopted``
    and ``load``, as :func:`classify` takes them."""
    return classify(flavor, model, report, **where)[0]


def classify(
    flavor: Flavor,
    model: str | None,
    report: ServerReport,
    *,
    alive: bool,
    adopted: bool,
    load: LoadState | None,
) -> tuple[InstanceStatus, Phase]:
    """The instance status a probe report means, and the server's :class:`Phase`.

    Args:
        flavor: the server software probed.
        model: the model the instance should serve (Ollama: its tag), if any.
        report: the probe's result.
        alive: a managed process of this instance is running.
        adopted: the server is adopted (somebody else runs it).
        load: progress of an Ollama load this node asked for, if any.
    """
    if report.health.kind is not HealthKind.UP:
        case, fields = _not_up(report.health, alive=alive, adopted=adopted)
    elif flavor is Flavor.OLLAMA and model is not None:
        case, fields = _ollama_up(model, report, adopted=adopted, load=load)
    elif model is not None and report.models and not report.lists(model):
        case, fields = NOT_LISTED, {"model": model}
    else:
        case, fields = UP, {}
    return case.status(**fields), case.phase


def _not_up(health: Health, *, alive: bool, adopted: bool) -> tuple[StatusCase, dict[str, str]]:
    if health.kind is HealthKind.LOADING:
        return LOADING, {}
    reason = {"reason": health.reason}
    if health.kind is HealthKind.UNHEALTHY:
        return UNHEALTHY, reason
    if alive:
        return STARTING, reason
    return (GONE_ADOPTED if adopted else GONE), reason


def _ollama_up(
    model: str, report: ServerReport, *, adopted: bool, load: LoadState | None
) -> tuple[StatusCase, dict[str, str]]:
    if not report.lists(model):
        return NOT_PULLED, {"model": model}
    # Before residency: Ollama lists a model in /api/ps while it is still loading.
    if load is not None and load.kind is LoadKind.LOADING:
        return OLLAMA_LOADING, {}
    if report.is_resident(model):
        return RESIDENT, {}
    if load is not None and load.kind is LoadKind.FAILED:
        return LOAD_FAILED, {"error": load.error}
    return (UP_ADOPTED if adopted else UP_IDLE), {}
