"""``[front]`` in the node's config (tools/node/config.py, tools/front/settings.py):
refused with the key named; and ``infervisor run`` serving the front with the
control API's tokens, its requests counted in the API's ``/metrics``.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_run_resume import NodeRun, end_runs, put_model, write_config

from infervisor.adapters.ports import free_port
from infervisor.tools.node.config import ConfigError, load_config


def config_with(tmp_path: Path, front: str, api: str = "") -> Path:
    top = f"[front]\n{front}\n" + (f"[api]\n{api}\n" if api else "")
    return write_config(tmp_path, "/bin/true", top_extra=top, ports=(free_port(), 1234))


@pytest.mark.parametrize(
    ("front", "api", "said"),
    [
        ('listen = "0.0.0.0:8700"', "", ["front.listen", "front.allow_non_loopback"]),
        ('listen = "8700"', "", ["front.listen", "HOST:PORT"]),
        ('listen = "127.0.0.1:70000"', "", ["front.listen", "1-65535"]),
        ('listen = "example.org:8700"', "", ["front.listen", "IP address"]),
        ('listen = "127.0.0.1:1234"', "", ["[[instances]] #2", "port 1234", "[front] listen"]),
        ('listen = "127.0.0.1:8700"', 'tcp = "127.0.0.1:8700"', ["[front] listen", "[api] tcp"]),
        ('listen = "127.0.0.1:8700"', "tokens = []", ["[front] listen", "[api] tokens"]),
        ('listen = "127.0.0.1:8700"\nqueue_limit = 0', "", ["[front]", "queue_limit"]),
        ('listen = "127.0.0.1:8700"\nqueu_limit = 3', "", ["[front]", "queu_limit", "queue_limit"]),
        ("queue_limit = 3", "", ["[front]", "listen"]),
    ],
)
def test_a_bad_front_is_refused_naming_the_key(
    tmp_path: Path, front: str, api: str, said: list[str]
) -> None:
    path = config_with(tmp_path, front, api)
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    for words in said:
        assert words in str(refused.value), str(refused.value)


def test_beyond_loopback_is_allowed_only_when_asked(tmp_path: Path) -> None:
    path = config_with(tmp_path, 'listen = "0.0.0.0:8700"\nallow_non_loopback = true')
    config = load_config(path)
    assert config.front is not None and config.front.listen == "0.0.0.0:8700"
    assert config.front.queue_limit == 64  # the default
    assert load_config(write_config(tmp_path, "/bin/true", name="plain.toml")).front is None


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[list[NodeRun]]:
    started: list[NodeRun] = []
    yield started
    end_runs(started, tmp_path / "data" / "chain.db")


def test_run_serves_the_front_with_the_api_tokens(
    tmp_path: Path, fake_llama: str, runs: list[NodeRun]
) -> None:
    put_model(tmp_path / "data")
    port = free_port()
    config = write_config(
        tmp_path, fake_llama, top_extra=f'[front]\nlisten = "127.0.0.1:{port}"\nqueue_limit = 4\n'
    )
    run = NodeRun(config, tmp_path / "run.log")
    runs.append(run)
    data = tmp_path / "data"
    run.until("the tokens", (data / "api-tokens.json").exists)
    secret = json.loads((data / "api-tokens.json").read_text())["operator"]
    auth = {"Authorization": f"Bearer {secret}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=auth, trust_env=False) as c:

        def models() -> list[dict[str, object]]:
            try:  # the front listens a moment after the API's tokens are written
                answer = c.get("/v1/models")
            except httpx.ConnectError:
                return []
            return list(answer.json()["data"]) if answer.status_code == 200 else []

        listed = run.until(
            "the front to list both instances", lambda: len(models()) == 2 and models()
        )
        assert {m["role"] for m in listed} == {"chat", "embed"}
        embed = next(m for m in listed if m["role"] == "embed")
        chat = next(m for m in listed if m["role"] == "chat")
        assert embed["residency"] == "loaded"  # start = false: held for a verb, not a request
        answer = c.post("/v1/completions", json={"model": "embed", "prompt": "hi"}, timeout=60)
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "stopped"
        assert "without a start" in answer.json()["error"]["message"]

        def chat_answer() -> httpx.Response | None:  # start = true: once it runs
            got = c.post("/v1/completions", json={"model": "chat", "prompt": "hi"}, timeout=60)
            return got if got.status_code == 200 else None

        answered = run.until("chat to answer", chat_answer)
        assert answered.headers["x-infervisor-instance"] == chat["instance_id"]
    transport = httpx.HTTPTransport(uds=str(data / "api.sock"))
    with httpx.Client(transport=transport, base_url="http://localhost") as api:
        exposed = api.get("/metrics").text
    assert (
        f'infervisor_front_requests_total{{code="200",instance="{chat["instance_id"]}"' in exposed
    )
    assert "OpenAI-compatible endpoint: http://127.0.0.1:" in run.output()
    assert run.stop(signal.SIGTERM) == 0
