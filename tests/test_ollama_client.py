"""adapters.ollama (and the Ollama probe and status map) against the Ollama test server.

The server is tests/servers/ollama_server.py, a real subprocess built from
Ollama's API documentation; tests/test_ollama_server.py checks it on its own.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from infervisor.adapters import ollama
from infervisor.adapters.errors import ProbeError, SpecError
from infervisor.adapters.ollama import OllamaError
from infervisor.adapters.ollama_keep_alive import parse_keep_alive
from infervisor.adapters.ollama_load import OllamaLoad
from infervisor.adapters.ollama_wire import same_model
from infervisor.adapters.ports import free_port
from infervisor.adapters.probe import HealthKind, ServerClient
from infervisor.adapters.spec import Flavor
from infervisor.adapters.status import (
    InstanceStatus,
    LoadKind,
    LoadState,
    StatusState,
    map_report,
)

LONG_LOAD = 60.0  # a load no test waits for: it is aborted or unloaded first


@pytest.fixture
def loads() -> Iterator[Callable[..., OllamaLoad]]:
    """Start OllamaLoads; every one is aborted and its thread ended in teardown."""
    made: list[OllamaLoad] = []

    def start(*args: Any, **kw: Any) -> OllamaLoad:
        load = OllamaLoad(*args, **kw).start()
        made.append(load)
        return load

    yield start
    for load in made:
        load.abort()
        assert load.wait(20), "a load thread outlived its test"


def closed_url() -> str:
    """A loopback URL nothing listens on."""
    return f"http://127.0.0.1:{free_port()}"


def finished(load: OllamaLoad) -> LoadState:
    assert load.wait(20), "the load did not finish"
    return load.state


# --- keep_alive and names (no server) --------------------------------------------------


@pytest.mark.parametrize(
    ("value", "sent"),
    [
        ("30m", "30m"),
        ("1h30m", "1h30m"),
        ("10s", "10s"),
        ("1.5h", "1.5h"),
        ("-1m", "-1m"),
        ("500ms", "500ms"),
        ("-1", -1),  # Ollama refuses a string without a unit, so it is sent as a number
        ("3600", 3600),
        ("0", 0),
        (300, 300),
        (-1, -1),
        (0, 0),
        (60.0, 60),
    ],
)
def test_parse_keep_alive_valid(value, sent) -> None:
    assert parse_keep_alive(value) == sent
    assert type(parse_keep_alive(value)) is type(sent)


INVALID_STRINGS = ["", "abc", "5 m", "10x", "1.5", "m", ".s", "1h 30m", "99999999h", "1" * 14]


@pytest.mark.parametrize("value", [*INVALID_STRINGS, 0.5, float("nan"), True, 10**12, None, [30]])
def test_parse_keep_alive_invalid_names_value_and_forms(value) -> None:
    with pytest.raises(SpecError) as err:
        parse_keep_alive(value)
    message = str(err.value)
    assert repr(value) in message
    assert "number of seconds" in message
    assert "'30m'" in message


def test_same_model_ignores_latest() -> None:
    assert same_model("llama3", "llama3:latest")
    assert same_model("llama3:latest", "llama3")
    assert not same_model("llama3", "llama3:8b")
    assert not same_model("llama3", "llama")


@pytest.mark.parametrize("zero", [0, "0", "0s", "-0m"])
def test_load_refuses_keep_alive_zero_before_asking(zero) -> None:
    with pytest.raises(SpecError, match="would unload the model as soon as it is loaded"):
        ollama.load(closed_url(), "tinyllama", zero)
    with pytest.raises(SpecError, match="would unload"):
        OllamaLoad(closed_url(), "tinyllama", zero)


# --- pulled, resident, load, unload ------------------------------------------------------


def test_pulled_and_resident(ollama_url) -> None:
    url = ollama_url("tinyllama", "qwen:0.5b", resident="qwen:0.5b")
    assert ollama.pulled(url, "tinyllama")
    assert ollama.pulled(url, "tinyllama:latest")
    assert ollama.pulled(url, "qwen:0.5b")
    assert not ollama.pulled(url, "qwen")
    assert ollama.resident(url, "qwen:0.5b")
    assert not ollama.resident(url, "tinyllama")


def test_load_then_unload(ollama_url) -> None:
    url = ollama_url("tinyllama")
    ollama.load(url, "tinyllama", "10m")
    assert ollama.resident(url, "tinyllama:latest")
    ollama.unload(url, "tinyllama")
    assert ollama.wait_unloaded(url, "tinyllama", timeout=10)
    assert not ollama.resident(url, "tinyllama")


def test_load_not_pulled_says_pull_it_first(ollama_url) -> None:
    url = ollama_url("tinyllama")
    with pytest.raises(OllamaError, match=r"HTTP 404.*pull it first \(ollama pull ghost\)") as err:
        ollama.load(url, "ghost")
    assert err.value.status == 404
    assert err.value.error == "model 'ghost' not found, try pulling it first"


def test_load_failure_carries_ollamas_error(ollama_url) -> None:
    url = ollama_url("tinyllama", fail_load="broken")
    with pytest.raises(OllamaError, match="llama runner process has terminated") as err:
        ollama.load(url, "broken")
    assert err.value.status == 500
    assert not ollama.resident(url, "broken")


def test_unload_of_a_model_ollama_does_not_know_is_done(ollama_url) -> None:
    ollama.unload(ollama_url("tinyllama"), "ghost")


def test_unreachable_is_a_probe_error_never_httpx() -> None:
    url = closed_url()
    for call in (
        lambda: ollama.resident(url, "x"),
        lambda: ollama.pulled(url, "x"),
        lambda: ollama.load(url, "x", timeout=2),
        lambda: ollama.unload(url, "x", timeout=2),
    ):
        with pytest.raises(ProbeError, match="cannot connect"):
            call()
    with pytest.raises(ProbeError):
        ollama.resident("not a url", "x")


def test_a_server_that_is_not_ollama_is_a_probe_error() -> None:
    fault = Path(__file__).parent / "programs" / "http_fault.py"
    with subprocess.Popen([sys.executable, str(fault)], stdout=subprocess.PIPE, text=True) as p:
        try:
            assert p.stdout is not None
            url = f"http://127.0.0.1:{int(p.stdout.readline().split()[1])}"
            with pytest.raises(ProbeError, match=r"/api/ps: HTTP 404"):
                ollama.resident(url, "x")
            with pytest.raises(OllamaError, match="HTTP 404") as err:
                ollama.unload(url, "x")  # a 404 that is not Ollama's "model not found"
            assert err.value.status == 404
        finally:
            p.kill()


def test_wait_unloaded_is_false_while_resident_and_when_unreachable(ollama_url) -> None:
    url = ollama_url("tinyllama", resident="tinyllama")
    assert not ollama.wait_unloaded(url, "tinyllama", timeout=0.3, poll=0.05)
    assert not ollama.wait_unloaded(closed_url(), "tinyllama", timeout=0.3, poll=0.05)


# --- OllamaLoad --------------------------------------------------------------------------


def test_background_load_is_loading_then_done_and_ours(ollama_url, loads) -> None:
    url = ollama_url("tinyllama", load_seconds=0.5)
    load = loads(url, "tinyllama", "5m")
    assert finished(load) == LoadState(LoadKind.DONE)
    assert load.ours
    assert not load.aborted
    assert ollama.resident(url, "tinyllama")


def test_background_load_reports_loading_while_ollama_loads(ollama_url, loads) -> None:
    url = ollama_url("tinyllama", load_seconds=LONG_LOAD)
    load = loads(url, "tinyllama")
    wait_until(lambda: ollama.resident(url, "tinyllama"), what="Ollama to start loading")
    assert load.state == LoadState(LoadKind.LOADING)
    assert load.ours


def test_model_already_resident_is_not_ours(ollama_url, loads) -> None:
    url = ollama_url("tinyllama", resident="tinyllama")
    load = loads(url, "tinyllama")
    assert finished(load) == LoadState(LoadKind.DONE)
    assert not load.ours  # somebody else loaded it: stop must not unload it


def test_failed_background_load_is_failed_and_not_ours(ollama_url, loads) -> None:
    url = ollama_url("tinyllama", fail_load="broken")
    load = loads(url, "broken")
    state = finished(load)
    assert state.kind is LoadKind.FAILED
    assert "llama runner process has terminated" in state.error
    assert not load.ours


def test_background_load_of_unreachable_ollama_fails(loads) -> None:
    load = loads(closed_url(), "tinyllama")
    state = finished(load)
    assert state.kind is LoadKind.FAILED
    assert "cannot connect" in state.error
    assert not load.ours


def test_abort_before_asking_loads_nothing_and_is_not_ours(ollama_url) -> None:
    url = ollama_url("tinyllama")
    load = OllamaLoad(url, "tinyllama")
    load.abort()
    state = finished(load.start())
    assert state == LoadState(LoadKind.FAILED, "aborted before it was asked")
    assert not load.ours
    assert not ollama.resident(url, "tinyllama")


def test_abort_mid_load_stays_ours_and_unload_frees_the_memory(ollama_url, loads) -> None:
    url = ollama_url("tinyllama", load_seconds=LONG_LOAD)
    load = loads(url, "tinyllama", "-1")
    wait_until(lambda: ollama.resident(url, "tinyllama"), what="Ollama to start loading")
    load.abort()
    state = finished(load)  # the connection was shut down: the thread ends at once
    assert load.aborted
    assert state.kind is LoadKind.FAILED
    assert state.error.startswith("aborted")
    assert load.ours  # ours from the moment we asked: a stop unloads it
    ollama.unload(url, "tinyllama", timeout=10)
    assert ollama.wait_unloaded(url, "tinyllama", timeout=10)


# --- the Ollama probe and the status it means ---------------------------------------------


def probe(url: str):
    with ServerClient(url, timeout=2.0) as client:
        return client.probe(Flavor.OLLAMA)


def status(url: str, model: str, *, adopted: bool = False, load: LoadState | None = None):
    return map_report(Flavor.OLLAMA, model, probe(url), alive=False, adopted=adopted, load=load)


def test_probe_reads_version_tags_and_ps(ollama_url) -> None:
    url = ollama_url("tinyllama", "qwen:0.5b", resident="qwen:0.5b", version="0.6.8")
    report = probe(url)
    assert report.health.kind is HealthKind.UP
    assert report.version == "0.6.8"
    assert report.models == ["tinyllama:latest", "qwen:0.5b"]
    assert report.lists("tinyllama")
    assert report.resident == ["qwen:0.5b"]
    assert report.is_resident("qwen:0.5b")
    assert not report.is_resident("tinyllama")


def test_status_not_pulled(ollama_url) -> None:
    assert status(ollama_url("tinyllama"), "ghost") == InstanceStatus(
        StatusState.DEGRADED, detail="model ghost is not pulled"
    )


def test_status_resident(ollama_url) -> None:
    url = ollama_url("tinyllama", resident="tinyllama")
    for adopted in (False, True):
        assert status(url, "tinyllama", adopted=adopted) == InstanceStatus(
            StatusState.RUNNING, detail="model resident"
        )


def test_status_load_failed(ollama_url, loads) -> None:
    url = ollama_url("tinyllama", fail_load="broken")
    load = loads(url, "broken")
    finished(load)
    got = status(url, "broken", load=load.state)
    assert got.state is StatusState.DEGRADED
    assert got.detail is not None
    assert got.detail.startswith("load failed: ")
    assert "llama runner process has terminated" in got.detail


def test_status_loading(ollama_url, loads) -> None:
    """A load under way that Ollama does not list yet (the probe was taken before
    Ollama registered its runner). Once it does, /api/ps lists the model and the
    status says resident: see test_background_load_reports_loading_while_ollama_loads."""
    url = ollama_url("tinyllama", load_seconds=LONG_LOAD)
    before = probe(url)
    load = loads(url, "tinyllama")
    assert load.state.kind is LoadKind.LOADING
    got = map_report(
        Flavor.OLLAMA, "tinyllama", before, alive=False, adopted=False, load=load.state
    )
    assert got == InstanceStatus(StatusState.DEGRADED, detail="loading model")


def test_status_adopted_up_but_not_resident(ollama_url) -> None:
    assert status(ollama_url("tinyllama"), "tinyllama", adopted=True) == InstanceStatus(
        StatusState.RUNNING, detail="server up; model not resident"
    )


def test_status_managed_not_resident_is_loaded(ollama_url, loads) -> None:
    url = ollama_url("tinyllama")
    assert status(url, "tinyllama") == InstanceStatus(StatusState.LOADED)
    load = loads(url, "tinyllama")
    finished(load)
    ollama.unload(url, "tinyllama")
    assert ollama.wait_unloaded(url, "tinyllama", timeout=10)
    got = status(url, "tinyllama", load=load.state)  # done, then unloaded by someone
    assert got == InstanceStatus(StatusState.LOADED)
