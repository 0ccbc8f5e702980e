"""The front (tools/front) before the real llama.cpp server on the project's tiny
model, through the official ``openai`` client: whole answers, streams, a
server's own error passed through, and the tokens counted.

Marked slow: run alone with ``pytest -m slow``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import openai
import pytest
from conftest import NodeFactory
from support import chain_rows, wait_until

from infervisor.actors.node import Node
from infervisor.adapters.ports import free_port
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.tools.front import FrontServer

pytestmark = pytest.mark.slow
pytest_plugins = ("real_front",)  # the fixtures front and sdk


@pytest.fixture
def node(nodes: NodeFactory, tmp_path: Path, tiny_gguf: Path) -> Node:
    registry = tmp_path / "models"
    registry.mkdir()
    n = nodes.open(nodes.settings("infervisor-llama-server", registry))
    shutil.copy(tiny_gguf, registry / "tiny.gguf")
    n.registry.adopt("tiny", registry / "tiny.gguf")
    return n


def test_the_openai_client_through_the_front_to_llama_server(
    node: Node, front: FrontServer, sdk: openai.OpenAI
) -> None:
    spec = InstanceSpec(
        role="chat", flavor=Flavor.LLAMACPP, model="tiny", port=free_port(), on_demand=True
    )
    iid = node.place(spec)  # resting (on demand), not started: the first request starts it
    hello = [{"role": "user", "content": "Hello"}]

    whole = sdk.chat.completions.create(model="tiny", messages=hello, max_tokens=8)  # type: ignore[arg-type]
    assert whole.model == "tiny" and whole.choices[0].message.role == "assistant"
    assert whole.usage is not None and whole.usage.completion_tokens == 8
    assert node.status(iid).lifecycle == "running"

    stream = sdk.chat.completions.create(
        model="chat",  # the role
        messages=hello,  # type: ignore[arg-type]
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces = list(stream)
    assert pieces[-1].usage is not None and pieces[-1].usage.completion_tokens == 6
    assert [p.choices[0].finish_reason for p in pieces if p.choices][-1] == "length"

    texts = list(sdk.completions.create(model="tiny", prompt="Once", max_tokens=5, stream=True))
    assert sum(1 for t in texts if t.choices and t.choices[0].text) == 5

    with pytest.raises(openai.APIStatusError) as refused:  # the server's own error, unchanged
        sdk.embeddings.create(model="tiny", input="hi")
    assert refused.value.status_code == 501 and "--embeddings" in refused.value.message

    # the front counts a request once its answer is sent: the client may read it first
    wait_until(lambda: front.tally.snapshot().in_flight[iid] == 0, 30, "the requests to end")
    tally = front.tally.snapshot()
    assert tally.requests[(iid, "/v1/chat/completions", "200")] == 2
    assert tally.requests[(iid, "/v1/embeddings", "501")] == 1
    assert tally.tokens[(iid, "completion")] == 8 + 6 + 5


def test_embeddings_through_the_front_from_a_llama_server_placed_for_them(
    node: Node, front: FrontServer, sdk: openai.OpenAI
) -> None:
    """``embeddings = true`` (with ``pooling``: the tiny model's GGUF names none)
    launches llama-server with ``--embeddings --pooling mean``; the first request
    through the front starts it and gets one vector per input."""
    spec = InstanceSpec(
        role="embed", flavor=Flavor.LLAMACPP, model="tiny", port=free_port(),
        embeddings=True, pooling="mean", on_demand=True,
    )  # fmt: skip
    iid = node.place(spec)

    answer = sdk.embeddings.create(model="embed", input=["hello", "world", "again"])

    assert [d.index for d in answer.data] == [0, 1, 2]
    sizes = {len(d.embedding) for d in answer.data}
    assert len(sizes) == 1 and sizes.pop() > 0
    assert answer.data[0].embedding != answer.data[1].embedding
    assert answer.usage is not None and answer.usage.prompt_tokens > 0
    view = node.status(iid)
    assert view.lifecycle == "running"
    argv = [p for _, _, k, s, p in chain_rows(node.settings.chain_path) if k == "instance.spawned"]
    assert argv and argv[-1]["argv"][-3:] == ["--embeddings", "--pooling", "mean"]
