"""adapters.status.map_report: every branch of the reference's map_report."""

from __future__ import annotations

import pytest

from infervisor.adapters.probe import Health, HealthKind, ServerReport
from infervisor.adapters.spec import Flavor
from infervisor.adapters.status import (
    MAP_REPORT_CASES,
    InstanceStatus,
    LoadKind,
    LoadState,
    StatusState,
    map_report,
)

S = StatusState
UP = Health(HealthKind.UP)
LLAMA = Flavor.LLAMACPP
OLLAMA = Flavor.OLLAMA


def report(
    health: Health = UP,
    models: list[str] | None = None,
    resident: list[str] | None = None,
    flavor: Flavor = LLAMA,
) -> ServerReport:
    return ServerReport(health, models=models or [], resident=resident or [], flavor=flavor)


def status(
    flavor: Flavor,
    model: str | None,
    r: ServerReport,
    *,
    alive: bool = True,
    adopted: bool = False,
    load: LoadState | None = None,
) -> InstanceStatus:
    return map_report(flavor, model, r, alive=alive, adopted=adopted, load=load)


def test_loading_is_degraded() -> None:
    assert status(LLAMA, "m", report(Health(HealthKind.LOADING))) == InstanceStatus(
        S.DEGRADED, detail="loading model"
    )


def test_unhealthy_carries_the_reason() -> None:
    r = report(Health(HealthKind.UNHEALTHY, "HTTP 500: boom"))
    assert status(LLAMA, "m", r) == InstanceStatus(S.DEGRADED, detail="HTTP 500: boom")


@pytest.mark.parametrize(
    ("alive", "adopted", "expected"),
    [
        (True, False, InstanceStatus(S.DEGRADED, detail="starting: not listening yet (refused)")),
        (True, True, InstanceStatus(S.DEGRADED, detail="starting: not listening yet (refused)")),
        (
            False,
            True,
            InstanceStatus(
                S.EXITED, detail="unreachable (refused); adopted servers are not restarted"
            ),
        ),
        (False, False, InstanceStatus(S.EXITED, detail="unreachable (refused)")),
    ],
)
def test_unreachable(alive: bool, adopted: bool, expected: InstanceStatus) -> None:
    r = report(Health(HealthKind.UNREACHABLE, "refused"))
    assert status(LLAMA, "m", r, alive=alive, adopted=adopted) == expected


def ollama(models: list[str], resident: list[str] | None = None) -> ServerReport:
    return report(models=models, resident=resident, flavor=OLLAMA)


FAILED = LoadState(LoadKind.FAILED, "out of memory")
LOADING = LoadState(LoadKind.LOADING)
DONE = LoadState(LoadKind.DONE)


@pytest.mark.parametrize(
    ("r", "adopted", "load", "expected"),
    [
        (ollama([]), False, None, InstanceStatus(S.DEGRADED, detail="model llama3 is not pulled")),
        (
            ollama(["llama3:latest"], ["llama3:latest"]),
            False,
            FAILED,
            InstanceStatus(S.RUNNING, detail="model resident"),
        ),
        (
            ollama(["llama3"]),
            False,
            FAILED,
            InstanceStatus(S.DEGRADED, detail="load failed: out of memory"),
        ),
        (
            ollama(["llama3"]),
            True,
            FAILED,
            InstanceStatus(S.DEGRADED, detail="load failed: out of memory"),
        ),
        (ollama(["llama3"]), False, LOADING, InstanceStatus(S.DEGRADED, detail="loading model")),
        (  # Ollama lists a model in /api/ps while it loads: still loading
            ollama(["llama3"], ["llama3:latest"]),
            False,
            LOADING,
            InstanceStatus(S.DEGRADED, detail="loading model"),
        ),
        (
            ollama(["llama3"]),
            True,
            None,
            InstanceStatus(S.RUNNING, detail="server up; model not resident"),
        ),
        (
            ollama(["llama3"]),
            True,
            DONE,
            InstanceStatus(S.RUNNING, detail="server up; model not resident"),
        ),
        (ollama(["llama3"]), False, None, InstanceStatus(S.LOADED)),
        (ollama(["llama3"]), False, DONE, InstanceStatus(S.LOADED)),
    ],
)
def test_ollama_up(
    r: ServerReport, adopted: bool, load: LoadState | None, expected: InstanceStatus
) -> None:
    assert status(OLLAMA, "llama3", r, adopted=adopted, load=load) == expected


def test_ollama_without_model_is_running() -> None:
    assert status(OLLAMA, None, ollama([])) == InstanceStatus(S.RUNNING)


@pytest.mark.parametrize("flavor", [LLAMA, Flavor.MLX_LM])
def test_up_model_not_listed(flavor: Flavor) -> None:
    r = report(models=["other"])
    assert status(flavor, "tiny", r) == InstanceStatus(
        S.DEGRADED, detail="model tiny is not listed by the server"
    )


@pytest.mark.parametrize(
    ("model", "models"),
    [("tiny", ["tiny"]), ("tiny", []), (None, ["other"]), ("tiny", ["/w/tiny.gguf"])],
)
def test_up_is_running(model: str | None, models: list[str]) -> None:
    assert status(LLAMA, model, report(models=models)) == InstanceStatus(S.RUNNING)


def test_cases_table_is_the_code() -> None:
    details = {c.detail for c in MAP_REPORT_CASES}
    assert "starting: not listening yet ({reason})" in details
    assert len(MAP_REPORT_CASES) == 13
    assert all(c.state in StatusState for c in MAP_REPORT_CASES)
    assert not any("WeftOS" in (c.detail or "") for c in MAP_REPORT_CASES)
