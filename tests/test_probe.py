"""adapters.probe against a real fault-injecting HTTP server (tests/programs/http_fault.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infervisor.adapters.errors import ProbeError
from infervisor.adapters.ports import free_port
from infervisor.adapters.probe import Health, HealthKind, ServerClient, ServerReport
from infervisor.adapters.spec import Flavor

SERVER = Path(__file__).parent / "programs" / "http_fault.py"
DEADLINE = 60.0  # a bound on a hang, never a measurement: generous at load 10


@pytest.fixture
def server() -> Iterator[Callable[[str], str]]:
    """Start http_fault.py in a mode; returns its base URL."""
    procs: list[subprocess.Popen[str]] = []

    def start(mode: str) -> str:
        p = subprocess.Popen(
            [sys.executable, str(SERVER), "--mode", mode], stdout=subprocess.PIPE, text=True
        )
        procs.append(p)
        assert p.stdout is not None
        line = p.stdout.readline()  # "PORT <n>", or "" if it died
        assert line.startswith("PORT "), f"fault server did not start: {line!r}"
        return f"http://127.0.0.1:{int(line.split()[1])}"

    yield start
    for p in procs:
        p.kill()
        p.wait()
        assert p.stdout is not None
        p.stdout.close()


@pytest.fixture
def client() -> Iterator[Callable[..., ServerClient]]:
    made: list[ServerClient] = []

    def make(url: str, **kw: float) -> ServerClient:
        c = ServerClient(url, **kw)  # type: ignore[arg-type]
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def probe(
    server: Callable[[str], str], client: Callable[..., ServerClient], mode: str
) -> ServerReport:
    return client(server(mode), timeout=2.0).probe(Flavor.LLAMACPP)


def test_ok_is_up_with_models(server, client) -> None:
    report = probe(server, client, "ok")
    assert report.health == Health(HealthKind.UP)
    assert report.models == ["tiny", "other"]
    assert report.lists("tiny")
    assert not report.lists("huge")


def test_legacy_models_form_is_read(server, client) -> None:
    report = probe(server, client, "ok-legacy-models")
    assert report.models == ["tiny.gguf"]
    assert report.lists("tiny")


def test_models_failure_does_not_change_health(server, client) -> None:
    report = probe(server, client, "models-garbage")
    assert report.health.kind is HealthKind.UP
    assert report.models == []


@pytest.mark.parametrize("mode", ["loading-nested", "loading-flat"])
def test_loading_forms(server, client, mode: str) -> None:
    assert probe(server, client, mode).health == Health(HealthKind.LOADING)


def test_500_is_unhealthy_with_status_and_excerpt(server, client) -> None:
    health = probe(server, client, "500").health
    assert health.kind is HealthKind.UNHEALTHY
    assert "500" in health.reason
    assert "not JSON" in health.reason
    assert "GPU caught fire" in health.reason


def test_garbage_is_unhealthy_not_json(server, client) -> None:
    health = probe(server, client, "garbage").health
    assert health.kind is HealthKind.UNHEALTHY
    assert "not JSON" in health.reason


def test_huge_body_is_capped(server, client) -> None:
    url = server("huge")
    health = client(url, timeout=2.0, max_body=4096).probe(Flavor.LLAMACPP).health
    assert health.kind is HealthKind.UNHEALTHY
    assert "larger than 4096 bytes" in health.reason
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    end = time.monotonic() + DEADLINE
    while True:
        with direct.open(f"{url}/stats") as r:
            stats = json.load(r)
        if stats["done"]:
            break
        assert time.monotonic() < end, "the server never stopped sending"
        time.sleep(0.01)
    assert stats["sent"] < 32 * 1024 * 1024  # the client hung up instead of reading it all


def test_hang_is_unreachable_timeout(server, client) -> None:
    health = client(server("hang"), timeout=0.3).probe(Flavor.LLAMACPP).health
    assert health.kind is HealthKind.UNREACHABLE
    assert "no answer within 0.3 s" in health.reason


def test_refused_is_unreachable() -> None:
    with ServerClient(f"http://127.0.0.1:{free_port()}") as c:
        health = c.probe(Flavor.MLX_LM).health
    assert health.kind is HealthKind.UNREACHABLE
    assert "cannot connect" in health.reason


def test_ollama_probe(server, client) -> None:
    report = client(server("ollama")).probe(Flavor.OLLAMA)
    assert report.health.kind is HealthKind.UP
    assert report.version == "0.5.7"
    assert report.models == ["llama3:latest"]
    assert report.lists("llama3")
    assert report.is_resident("llama3")
    assert not report.lists("llama3:8b")


def test_ollama_unreachable() -> None:
    with ServerClient(f"http://127.0.0.1:{free_port()}") as c:
        assert c.probe(Flavor.OLLAMA).health.kind is HealthKind.UNREACHABLE


def test_completions(server, client) -> None:
    c = client(server("ok"))
    assert c.complete("tiny", "Hello", 3) == "!!!"
    assert c.tiny_completion(None) == "!"


def test_completion_failures_raise_probe_error(server, client) -> None:
    with pytest.raises(ProbeError, match="choices"):
        client(server("garbage")).tiny_completion("tiny")
    with pytest.raises(ProbeError, match="no answer"):
        client(server("hang"), timeout=0.3).tiny_completion("tiny")
    with ServerClient(f"http://127.0.0.1:{free_port()}") as c, pytest.raises(ProbeError):
        c.tiny_completion("tiny")


def test_bad_base_url() -> None:
    with pytest.raises(ProbeError, match="invalid server URL"):
        ServerClient("not a url")


def test_lists_name_matching() -> None:
    up = Health(HealthKind.UP)
    llama = ServerReport(up, models=["/models/tiny.gguf", "org/repo-q4", "llama3:latest"])
    assert llama.lists("tiny")
    assert llama.lists("tiny.gguf")
    assert llama.lists("repo-q4")
    assert llama.lists("llama3")
    assert llama.lists("llama3:latest")
    assert not llama.lists("iny")
    assert not llama.lists("repo")
    ollama = ServerReport(up, models=["llama3:latest", "library/qwen"], flavor=Flavor.OLLAMA)
    assert ollama.lists("llama3")
    assert not ollama.lists("qwen")
    assert ServerReport(up, models=["llama3"]).lists("llama3:latest")
