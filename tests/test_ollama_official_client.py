"""The official ``ollama`` Python client against the Ollama test server, so the
test server's protocol cannot drift from what real clients parse; and the routes
a supervisor and its users touch besides load and unload (docs/api.md
"Show Model Information", "Generate Embeddings", "Pull a Model"; docs/openai.md
``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``).

The client's answers are pydantic models: a field of the wrong type raises a
``ValidationError`` in the client itself. Its models make most fields optional,
so each test also checks that the fields Ollama documents are there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import httpx
import ollama
import pytest

MODEL = "tinyllama"


@pytest.fixture
def client(ollama_url: Callable[..., str]) -> Iterator[ollama.Client]:
    c = ollama.Client(host=ollama_url(MODEL, load_seconds=0.1), trust_env=False)
    yield c
    c.close()


def test_list_ps_show_generate_chat_unload_all_validate(client: ollama.Client) -> None:
    listed = client.list()
    assert [m.model for m in listed.models] == [f"{MODEL}:latest"]
    entry = listed.models[0]
    assert isinstance(entry.size, int) and entry.size > 0
    assert isinstance(entry.modified_at, datetime) and entry.digest
    assert entry.details is not None and entry.details.format == "gguf"

    assert client.ps().models == []

    shown = client.show(MODEL)
    assert shown.modelinfo is not None and shown.modelinfo["general.architecture"] == "llama"
    assert shown.capabilities == ["completion"]
    assert shown.template and shown.modelfile and isinstance(shown.modified_at, datetime)

    answer = client.generate(model=MODEL, prompt="Hello", stream=False)
    assert answer.done and answer.done_reason == "stop" and answer.response
    pieces = list(client.generate(model=MODEL, prompt="Hello", stream=True))
    assert pieces[-1].done and "".join(p.response or "" for p in pieces)

    running = client.ps().models
    assert [m.model for m in running] == [f"{MODEL}:latest"]
    assert isinstance(running[0].expires_at, datetime)
    assert isinstance(running[0].size_vram, int) and running[0].size_vram > 0

    chat = client.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=False)
    assert chat.message.role == "assistant" and chat.message.content
    streamed = list(
        client.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True)
    )
    assert streamed[-1].done

    unloaded = client.generate(model=MODEL, keep_alive=0)
    assert unloaded.done and unloaded.done_reason == "unload"
    assert client.ps().models == []


def test_embed_and_pull_validate(client: ollama.Client) -> None:
    embedded = client.embed(model=MODEL, input=["a", "b"])
    assert len(embedded.embeddings) == 2 and all(len(v) == 8 for v in embedded.embeddings)
    with pytest.raises(ollama.ResponseError) as err:
        client.show("notpulled")
    assert err.value.status_code == 404
    assert client.pull("notpulled", stream=False).status == "success"
    assert "notpulled:latest" in [m.model for m in client.list().models]
    assert client.show("notpulled").details is not None


def test_openai_routes_answer_the_documented_shapes(ollama_url: Callable[..., str]) -> None:
    url = ollama_url(MODEL, load_seconds=0.1)
    with httpx.Client(base_url=url, timeout=20.0, trust_env=False) as http:
        models = http.get("/v1/models").json()
        assert models["object"] == "list"
        assert [m["id"] for m in models["data"]] == [f"{MODEL}:latest"]
        body: dict[str, Any] = {"model": MODEL, "prompt": "Hello", "max_tokens": 1}
        done = http.post("/v1/completions", json=body).json()
        assert done["object"] == "text_completion"
        assert done["choices"][0]["text"] == "Hello"
        assert done["choices"][0]["finish_reason"] == "length"
        assert done["usage"]["completion_tokens"] == 1
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        said = http.post("/v1/chat/completions", json=chat).json()
        assert said["object"] == "chat.completion"
        assert said["choices"][0]["message"]["role"] == "assistant"
        missing = http.post("/v1/completions", json={"model": "nope", "prompt": "x"})
        assert missing.status_code == 404
        assert set(missing.json()["error"]) == {"message", "type", "param", "code"}
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            lines = [line for line in r.iter_lines() if line]
        assert lines[-1] == "data: [DONE]"


def test_fail_completions_fails_generation_but_not_loads_or_listing(
    ollama_url: Callable[..., str],
) -> None:
    url = ollama_url(MODEL, load_seconds=0.1, fail_completions=True)
    with ollama.Client(host=url, trust_env=False) as client:
        assert client.generate(model=MODEL).done_reason == "load"  # a load still works
        assert [m.model for m in client.ps().models] == [f"{MODEL}:latest"]
        with pytest.raises(ollama.ResponseError) as err:
            client.generate(model=MODEL, prompt="Hello", stream=False)
        assert err.value.status_code == 500
    with httpx.Client(base_url=url, timeout=20.0, trust_env=False) as http:
        assert http.get("/").status_code == 200
        failed = http.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
        assert failed.status_code == 500 and failed.json()["error"]["message"]
