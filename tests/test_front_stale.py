"""The front routes by the instances' states of the moment (tools/front/proxy.py):
its table is built again whenever the node's views version changed
(``Node.views_version``), so a stop or an eviction is seen by the very next
request, with no wait for a table to age; and a request by name that meets a
stopped instance routes once more before answering 503. And ``/v1/embeddings``
by name prefers an instance placed with ``embeddings = true`` among equals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import NodeFactory
from test_front import assert_openai_error, client, front, llama, node, running  # noqa: F401

from infervisor.actors.node import Node
from infervisor.adapters.spec import InstanceSpec
from infervisor.replay.views import InstanceView
from infervisor.tools.front import proxy
from infervisor.tools.front.routes import Route, RouteTable


def resting(role: str) -> InstanceSpec:
    """``llama(role)`` placed on demand: a request may start it (a plain placement,
    ``loaded``, is held for a verb)."""
    return msgspec.structs.replace(llama(role), on_demand=True)


def _tiny(c: Any) -> Any:
    return c.post("/v1/completions", json={"model": "tiny", "prompt": "hi"})


def test_a_stop_is_seen_by_the_next_request_which_goes_to_the_running_instance(
    node: Node,  # noqa: F811 - the fixture
    front: Any,  # noqa: F811 - the fixture
) -> None:
    b, c = node.place(resting("b")), node.place(resting("c"))
    for iid in (b, c):
        node.start(iid)
        running(node, iid)
    srv = front(node)
    with client(srv) as http:
        first = _tiny(http)
        assert first.status_code == 200, first.text
        went = first.headers["x-infervisor-instance"]
        other = c if went == b else b
        node.stop(went)
        after = _tiny(http)  # at once: no waiting for a table to age
    assert after.status_code == 200, after.text
    assert after.headers["x-infervisor-instance"] == other
    assert node.status(went).lifecycle == "stopped"


def test_a_name_meeting_a_stopped_instance_on_a_stale_table_routes_once_more(
    node: Node,  # noqa: F811 - the fixture
    front: Any,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The table kept stale on purpose (its version never seen to change): the
    stopped instance refuses the connection, its demand is refused ``stopped``,
    and the request by name is routed again on a fresh table, to the running one."""
    b, c = node.place(resting("b")), node.place(resting("c"))
    for iid in (b, c):
        node.start(iid)
        running(node, iid)
    monkeypatch.setattr(proxy.Proxy, "_current", lambda self: (0, 0))
    srv = front(node)
    with client(srv) as http:
        went = _tiny(http).headers["x-infervisor-instance"]
        node.stop(went)
        after = _tiny(http)
        by_id = http.post("/v1/completions", json={"model": went, "prompt": "hi"})
    assert after.status_code == 200, after.text
    assert after.headers["x-infervisor-instance"] == ({b, c} - {went}).pop()
    # By its id the stopped instance is what was asked: 503 stopped, no Retry-After
    # (a retry cannot help until an operator starts it).
    error = assert_openai_error(by_id, 503, "stopped")
    assert went in error["message"]
    assert "retry-after" not in by_id.headers
    assert by_id.headers["x-should-retry"] == "false"


def test_after_an_eviction_a_name_routes_to_the_running_instance_and_evicts_nothing(
    nodes: NodeFactory,
    fake_llama: str,
    fake_model: Path,
    front: Any,  # noqa: F811 - the fixtures
) -> None:
    size = (fake_model / "tiny.gguf").stat().st_size
    overhead = 8_000
    node = nodes.open(  # noqa: F811 - not the fixture: a node with a budget
        nodes.settings(
            fake_llama,
            fake_model,
            memory_budget_bytes=2 * (overhead + size) + overhead // 2,
            reserve_overhead_bytes=overhead,
        )
    )
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    b, c = node.place(resting("b")), node.place(resting("c"))
    emb = node.place(resting("emb"))
    srv = front(node)
    with client(srv) as http:
        for model in (b, c, c):  # the table then says both run; b the least recently used
            answer = http.post("/v1/completions", json={"model": model, "prompt": "hi"})
            assert answer.status_code == 200, answer.text
        node.start(emb)  # evicts the least recently used of b and c
        running(node, emb)
        (evicted,) = [i for i in (b, c) if node.status(i).lifecycle != "running"]
        after = _tiny(http)
    assert after.status_code == 200, after.text
    kept = {b, c, emb} - {evicted}
    assert after.headers["x-infervisor-instance"] in kept
    assert {node.status(i).lifecycle for i in kept} == {"running"}  # nothing evicted for it
    assert node.status(evicted).lifecycle != "running"


def _view(iid: str, lifecycle: str, *, embeddings: bool) -> InstanceView:
    fields: dict[str, object] = {name: None for name in InstanceView.__struct_fields__}
    fields.update(
        instance_id=iid, adapter="infer.llamacpp", placed_by="n1", generation=0,
        role="emb", flavor="llamacpp", mode="managed", endpoint="http://127.0.0.1:1",
        model="tiny", lifecycle=lifecycle, desired="running", reason="", since_ns=0,
        restarts=0, health="", health_reason="", status="", reserved_bytes=0,
        exposure="loopback", last_seq=0, oom_kills=0, on_demand=False, priority=0,
        pinned=False, resting=False, busy=False, rest_reason="", refusals_folded=0,
        embeddings=embeddings,
    )  # fmt: skip
    converted: InstanceView = msgspec.convert(fields, InstanceView)
    return converted


def test_embeddings_by_name_prefer_an_embeddings_instance_among_equal_ranks() -> None:
    """``/v1/embeddings`` by a served name or role goes to an instance placed with
    ``embeddings = true`` among the best ranked (not the first by id, a chat
    server that answers 501); other routes, and a better ranked instance, win."""
    table = RouteTable.build(
        [
            _view("a-chat", "running", embeddings=False),
            _view("b-emb", "running", embeddings=True),
            _view("c-emb", "stopped", embeddings=True),
        ],
        lambda name: name,
    )
    for name in ("tiny", "emb"):
        assert _id(table.find(name, embeddings=True)) == "b-emb"
        assert _id(table.find(name)) == "a-chat"  # completions: the first by id
    assert _id(table.find("a-chat", embeddings=True)) == "a-chat"  # an id picks one
    lower = RouteTable.build(
        [_view("a-chat", "running", embeddings=False), _view("b-emb", "stopped", embeddings=True)],
        lambda name: name,
    )
    assert _id(lower.find("tiny", embeddings=True)) == "a-chat"  # running before stopped


def _id(route: Route | None) -> str | None:
    return None if route is None else route.instance_id
