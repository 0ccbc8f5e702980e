"""Who may make the front start or evict an instance (docs/front.md "Scopes and
residency"): a request starts only an instance that rests by residency
(evicted, expired, placed on demand), never one an operator placed without a
start; and inference needs a token of scope ``infer`` (an application's: no
verb of the control API), so a ``read`` token (a dashboard's) can neither start
nor evict through the front. Real front, the fake llama server (tests/test_front.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from conftest import NodeFactory
from test_front import SECRET, assert_openai_error, llama, node, running  # noqa: F401

from infervisor.actors.node import Node
from infervisor.adapters.ports import free_port
from infervisor.replay import timeline
from infervisor.tools.api.auth import TcpAddress, Tokens
from infervisor.tools.api.scopes import Scope
from infervisor.tools.front import FrontConfig, FrontServer

#: A dashboard's token: a bare name other than operator/controller is ``read``.
READ_SECRET = "grafana-secret-for-tests"


@pytest.fixture
def front() -> Iterator[Callable[[Node], FrontServer]]:
    """``front(node)``: a front taking ``ci`` (infer) and ``grafana`` (read)."""
    with contextlib.ExitStack() as stack:

        def start(served: Node) -> FrontServer:
            port = free_port()
            tokens = Tokens({"ci": SECRET, "grafana": READ_SECRET}, {"ci": Scope.INFER})
            cfg = FrontConfig(listen=f"127.0.0.1:{port}")
            server = FrontServer.listen(cfg, TcpAddress("127.0.0.1", port), tokens, "n1")
            stack.callback(server.close)
            server.serve(served)
            return server

        yield start


def http(srv: FrontServer, secret: str) -> httpx.Client:
    headers = {"Authorization": f"Bearer {secret}"}
    return httpx.Client(base_url=srv.url, headers=headers, timeout=60.0, trust_env=False)


def kinds(of: Node, iid: str) -> list[str]:
    return [e.kind for e in timeline(of.settings.chain_path, iid)]


def test_an_instance_placed_without_a_start_is_503_stopped_naming_who_nothing_recorded(
    node: Node,  # noqa: F811 - the fixture
    front: Any,
) -> None:
    """Placed without a start (``loaded``, not on demand): an operator's choice, held
    as a stop is. A request (by id or by name) is answered 503 ``stopped`` naming who
    placed it, not retried, and nothing is recorded; a start verb still starts it."""
    iid = node.place(llama("x"))
    before = kinds(node, iid)
    srv = front(node)
    with http(srv, SECRET) as c:
        for model in (iid, "x", "tiny"):
            answer = c.post("/v1/completions", json={"model": model, "prompt": "hi"})
            error = assert_openai_error(answer, 503, "stopped")
            assert f"placed by {node.status(iid).placed_by}" in error["message"]
            assert "without a start" in error["message"]
            assert answer.headers["x-should-retry"] == "false"
    assert node.status(iid).lifecycle == "loaded"
    assert kinds(node, iid) == before  # no demand, no start, no refusal recorded
    node.start(iid)  # an operator's verb does
    running(node, iid)
    with http(srv, SECRET) as c:
        answer = c.post("/v1/completions", json={"model": "x", "prompt": "hi"})
    assert answer.status_code == 200, answer.text


def test_a_read_token_neither_starts_nor_evicts_nor_generates_through_the_front(
    nodes: NodeFactory,
    fake_llama: str,
    fake_model: Path,
    front: Any,
) -> None:
    """The trial's case: an operator started ``chat``; ``lazy`` rests on demand and
    fits only by evicting ``chat``. A read token's request for ``lazy`` is 403
    ``forbidden`` naming ``infer`` (nothing demanded, nothing evicted), as is one
    for the running ``chat`` (inference is work a read token may not cause, as the
    deep health check); it may still list the models. An infer token (an
    application's) starts it."""
    size = (fake_model / "tiny.gguf").stat().st_size
    overhead = 8_000
    node = nodes.open(  # noqa: F811 - not the fixture: room for one instance
        nodes.settings(
            fake_llama,
            fake_model,
            memory_budget_bytes=(overhead + size) + overhead // 2,
            reserve_overhead_bytes=overhead,
        )
    )
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    chat = node.place(llama("chat"))
    node.start(chat)
    running(node, chat)
    lazy = node.place(msgspec.structs.replace(llama("lazy"), on_demand=True))
    chat_before, lazy_before = kinds(node, chat), kinds(node, lazy)
    srv = front(node)
    with http(srv, READ_SECRET) as c:
        for model, path in ((lazy, "/v1/completions"), ("chat", "/v1/chat/completions")):
            body = {"model": model, "prompt": "hi", "messages": []}
            error = assert_openai_error(c.post(path, json=body), 403, "forbidden")
            assert error["type"] == "permission_error"
            assert "needs scope infer" in error["message"]
            assert "token=grafana (scope read)" in error["message"]
        assert c.get("/v1/models").status_code == 200  # looking is read's
    assert node.status(lazy).lifecycle == "resting"
    assert node.status(chat).lifecycle == "running"
    assert kinds(node, lazy) == lazy_before
    assert "residency.evicted" not in kinds(node, chat)[len(chat_before) :]
    assert srv.tally.snapshot().refused["forbidden"] == 2
    with http(srv, SECRET) as c:  # infer: the request may evict for its start
        answer = c.post("/v1/completions", json={"model": "lazy", "prompt": "hi"})
    assert answer.status_code == 200, answer.text
    assert node.status(chat).lifecycle == "resting"
