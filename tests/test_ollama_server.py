"""The Ollama test server (tests/servers/ollama_server.py) against Ollama's documented API.

What is checked, and where it comes from: docs/api.md of ollama/ollama (load and
unload through /api/generate and /api/chat, /api/tags, /api/ps with expires_at
and size_vram, NDJSON streaming), api/types.go Duration.UnmarshalJSON (keep_alive
forms and Go's error texts), server/routes.go (404 for a model not pulled, even
for an unload) and server/sched.go (a loading model is listed by /api/ps; a client
that goes away cancels its load).
"""

from __future__ import annotations

import json
import select
import socket
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from support import ollama_server, wait_until

LONG_LOAD = 60.0  # a load no test waits for: it is cancelled or unloaded first


@pytest.fixture(scope="module")
def shared() -> Iterator[str]:
    """One server for the keep_alive tables; every case leaves ``fresh`` unloaded."""
    with ollama_server("tinyllama", "fresh", load_seconds=0.1) as server:
        yield server.url


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=20.0, trust_env=False) as client:
        yield client


def ps(http: httpx.Client, url: str) -> dict[str, dict[str, Any]]:
    r = http.get(f"{url}/api/ps")
    assert r.status_code == 200
    return {m["name"]: m for m in r.json()["models"]}


def generate(http: httpx.Client, url: str, **body: Any) -> httpx.Response:
    return http.post(f"{url}/api/generate", json=body)


def when(text: str) -> datetime:
    """An RFC 3339 time as Ollama writes it (Python 3.11 reads the Z and the offset)."""
    moment = datetime.fromisoformat(text)
    assert moment.tzinfo is not None, text
    return moment


def in_background(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        out["value"] = fn()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


# --- the read-only endpoints ---------------------------------------------------------


def test_root_and_version(ollama_url, http) -> None:
    url = ollama_url("tinyllama", version="0.6.8")
    r = http.get(f"{url}/")
    assert (r.status_code, r.text) == (200, "Ollama is running")
    assert http.get(f"{url}/api/version").json() == {"version": "0.6.8"}
    assert http.get(f"{url}/api/nope").status_code == 404


def test_tags_lists_pulled_models_with_latest_tag(ollama_url, http) -> None:
    url = ollama_url("tinyllama", "qwen:0.5b", model_size=1234)
    models = http.get(f"{url}/api/tags").json()["models"]
    assert [m["name"] for m in models] == ["tinyllama:latest", "qwen:0.5b"]
    for m in models:
        assert m["model"] == m["name"]
        assert m["size"] == 1234
        assert len(m["digest"]) == 64
        int(m["digest"], 16)
        when(m["modified_at"])
        assert {"format", "family", "families", "parameter_size", "quantization_level"} <= set(
            m["details"]
        )


def test_ps_is_empty_until_something_loads(ollama_url, http) -> None:
    assert ps(http, ollama_url("tinyllama")) == {}


def test_resident_model_is_listed_at_start_with_no_expiry(ollama_url, http) -> None:
    url = ollama_url("tinyllama", resident="other", model_size=4321)
    entry = ps(http, url)["other:latest"]
    assert entry["model"] == "other:latest"
    assert entry["size"] == entry["size_vram"] == 4321
    assert len(entry["digest"]) == 64
    assert when(entry["expires_at"]).year > 2200  # keep_alive -1: forever
    assert "other:latest" in {m["name"] for m in http.get(f"{url}/api/tags").json()["models"]}


# --- load ----------------------------------------------------------------------------


def test_load_answers_done_load_and_ps_lists_the_model(ollama_url, http) -> None:
    url = ollama_url("tinyllama")
    r = generate(http, url, model="tinyllama", keep_alive="1h")
    assert r.status_code == 200
    doc = r.json()
    assert doc["model"] == "tinyllama"  # as asked, not canonical
    assert (doc["response"], doc["done"], doc["done_reason"]) == ("", True, "load")
    when(doc["created_at"])
    entry = ps(http, url)["tinyllama:latest"]
    assert entry["size_vram"] == entry["size"]
    now = datetime.now(UTC)
    assert now + timedelta(minutes=55) < when(entry["expires_at"]) < now + timedelta(minutes=65)


def test_load_blocks_until_loaded_and_ps_lists_it_meanwhile(ollama_url) -> None:
    """The answer comes only once the load is over; Ollama lists a loading runner."""
    url = ollama_url("tinyllama", load_seconds=LONG_LOAD)
    port = int(url.rsplit(":", 1)[1])
    with httpx.Client(timeout=20.0, trust_env=False) as http:
        body = json.dumps({"model": "tinyllama", "keep_alive": "5m"}).encode()
        request = (
            b"POST /api/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        with socket.create_connection(("127.0.0.1", port)) as raw:
            raw.sendall(request)
            wait_until(lambda: "tinyllama:latest" in ps(http, url), what="a loading model in ps")
            assert select.select([raw], [], [], 0)[0] == []  # no answer while loading
        # the client went away: Ollama cancels the load and expires the runner
        wait_until(lambda: ps(http, url) == {}, what="the cancelled load to leave ps")


def test_two_loads_of_one_model_share_the_load(ollama_url, http) -> None:
    url = ollama_url("tinyllama", load_seconds=0.5)
    threads = [in_background(lambda: generate(http, url, model="tinyllama")) for _ in range(2)]
    for t, out in threads:
        t.join(20)
        assert out["value"].json()["done_reason"] == "load"
    assert list(ps(http, url)) == ["tinyllama:latest"]


def test_model_without_tag_is_latest(ollama_url, http) -> None:
    url = ollama_url("tinyllama:latest")
    assert generate(http, url, model="tinyllama").status_code == 200
    assert generate(http, url, model="tinyllama:latest", keep_alive=0).status_code == 200
    assert ps(http, url) == {}


def test_not_pulled_is_404_for_load_and_unload(ollama_url, http) -> None:
    url = ollama_url("tinyllama")
    for keep in ("5m", 0):
        r = generate(http, url, model="ghost", keep_alive=keep)
        assert r.status_code == 404
        assert r.json() == {"error": "model 'ghost' not found, try pulling it first"}


def test_failed_load_is_500_with_the_error_and_not_resident(ollama_url, http) -> None:
    url = ollama_url("tinyllama", fail_load="broken")
    r = generate(http, url, model="broken")
    assert r.status_code == 500
    assert "llama runner process has terminated" in r.json()["error"]
    assert ps(http, url) == {}
    assert generate(http, url, model="tinyllama").status_code == 200  # others still load


@pytest.mark.parametrize("body", [{}, {"model": ""}])
def test_model_is_required(ollama_url, http, body) -> None:
    r = generate(http, ollama_url("tinyllama"), **body)
    assert r.status_code == 400
    assert r.json() == {"error": "model is required"}


def test_bad_json_and_missing_body_are_400(ollama_url, http) -> None:
    url = ollama_url("tinyllama")
    r = http.post(f"{url}/api/generate", content=b"{not json")
    assert r.status_code == 400
    assert "error" in r.json()
    r = http.post(f"{url}/api/generate")
    assert (r.status_code, r.json()) == (400, {"error": "missing request body"})


# --- keep_alive ----------------------------------------------------------------------

H = 3600


@pytest.mark.parametrize(
    ("keep_alive", "seconds"),
    [
        (300, 300),
        (90.5, 90.5),
        ("30m", 30 * 60),
        ("1h30m", 1.5 * H),
        ("1.5h", 1.5 * H),
        ("+10m", 600),
        (None, 5 * 60),  # absent or null: the 5-minute default
    ],
)
def test_keep_alive_sets_expires_at(shared, http, keep_alive, seconds) -> None:
    url = shared  # every load resets the expiry, so earlier cases do not matter
    body = {"model": "tinyllama"} | ({} if keep_alive is None else {"keep_alive": keep_alive})
    assert generate(http, url, **body).json()["done_reason"] == "load"
    expires = when(ps(http, url)["tinyllama:latest"]["expires_at"])
    expected = datetime.now(UTC) + timedelta(seconds=seconds)
    assert abs(expires - expected) < timedelta(seconds=60)


@pytest.mark.parametrize("keep_alive", [-1, -0.5, "-1m", "-2h45m"])
def test_negative_keep_alive_is_forever(shared, http, keep_alive) -> None:
    url = shared
    assert generate(http, url, model="tinyllama", keep_alive=keep_alive).status_code == 200
    assert when(ps(http, url)["tinyllama:latest"]["expires_at"]).year > 2200


@pytest.mark.parametrize(
    ("keep_alive", "error"),
    [
        ("-1", 'time: missing unit in duration "-1"'),
        ("300", 'time: missing unit in duration "300"'),
        ("abc", 'time: invalid duration "abc"'),
        ("", 'time: invalid duration ""'),
        ("5 m", 'time: unknown unit " m" in duration "5 m"'),
        ("10x", 'time: unknown unit "x" in duration "10x"'),
        ("99999999h", 'time: invalid duration "99999999h"'),
        (True, "Unsupported type: 'bool'"),
        ([1], "Unsupported type: '[]interface {}'"),
    ],
)
def test_invalid_keep_alive_is_400_and_loads_nothing(shared, http, keep_alive, error) -> None:
    r = generate(http, shared, model="fresh", keep_alive=keep_alive)
    assert (r.status_code, r.json()) == (400, {"error": error})
    assert "fresh:latest" not in ps(http, shared)


def test_short_keep_alive_expires(ollama_url, http) -> None:
    url = ollama_url("tinyllama")
    assert generate(http, url, model="tinyllama", keep_alive="1s").status_code == 200
    wait_until(lambda: ps(http, url) == {}, what="the model to expire after keep_alive 1s")


# --- unload --------------------------------------------------------------------------


@pytest.mark.parametrize("zero", [0, 0.0, "0", "0s", "0m", "-0"])
def test_keep_alive_zero_unloads(shared, http, zero) -> None:
    assert generate(http, shared, model="fresh").json()["done_reason"] == "load"
    r = generate(http, shared, model="fresh", keep_alive=zero)
    assert r.status_code == 200
    doc = r.json()
    assert (doc["model"], doc["response"], doc["done"]) == ("fresh", "", True)
    assert doc["done_reason"] == "unload"
    assert "fresh:latest" not in ps(http, shared)


def test_unload_of_a_model_not_in_memory_still_answers_unload(ollama_url, http) -> None:
    r = generate(http, ollama_url("tinyllama"), model="tinyllama", keep_alive=0)
    assert (r.status_code, r.json()["done_reason"]) == (200, "unload")


def test_unload_during_a_load_waits_for_it_then_drops_the_model(ollama_url, http) -> None:
    url = ollama_url("tinyllama", load_seconds=1.0)
    loader, loaded = in_background(lambda: generate(http, url, model="tinyllama"))
    wait_until(lambda: "tinyllama:latest" in ps(http, url), what="the load to start")
    r = generate(http, url, model="tinyllama", keep_alive=0)
    assert r.json()["done_reason"] == "unload"
    loader.join(20)
    assert loaded["value"].json()["done_reason"] == "load"
    assert ps(http, url) == {}  # had the unload not waited, the finished load would be listed


# --- completions ---------------------------------------------------------------------


def test_prompt_loads_and_streams_ndjson(ollama_url, http) -> None:
    url = ollama_url("tinyllama")
    r = generate(http, url, model="tinyllama", prompt="Hi")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert [x["done"] for x in lines] == [False] * (len(lines) - 1) + [True]
    assert "".join(x["response"] for x in lines[:-1])
    assert lines[-1]["response"] == ""  # streamed: the final object carries no text
    assert lines[-1]["done_reason"] == "stop"
    assert lines[-1]["eval_count"] == len(lines) - 1
    assert "tinyllama:latest" in ps(http, url)


def test_prompt_without_streaming_and_keep_alive_zero_unloads_after(ollama_url, http) -> None:
    url = ollama_url("tinyllama")
    r = generate(http, url, model="tinyllama", prompt="Hi", stream=False, keep_alive=0)
    doc = r.json()
    assert doc["done"] is True
    assert doc["response"]
    assert ps(http, url) == {}


def test_chat_loads_unloads_and_answers(ollama_url, http) -> None:
    url = ollama_url("tinyllama")
    r = http.post(f"{url}/api/chat", json={"model": "tinyllama", "messages": []})
    doc = r.json()
    assert (doc["done_reason"], doc["message"]) == ("load", {"role": "assistant", "content": ""})
    assert "tinyllama:latest" in ps(http, url)
    body = {"model": "tinyllama", "messages": [{"role": "user", "content": "Hi"}], "stream": False}
    doc = http.post(f"{url}/api/chat", json=body).json()
    assert doc["message"]["role"] == "assistant"
    assert doc["message"]["content"]
    r = http.post(f"{url}/api/chat", json={"model": "tinyllama", "messages": [], "keep_alive": 0})
    assert r.json()["done_reason"] == "unload"
    assert ps(http, url) == {}
