"""Issue 21: the room planner sizes a managed Ollama model from what Ollama
reports (``/api/tags`` ``size``), as its start reserves it, so a start of an
Ollama instance that does not fit evicts by the policy (LRU, priority, pins)
like a llama.cpp one, and is refused with the numbers only when nothing can go.

The registry knows no size for an Ollama model (Ollama keeps its weights): a
plan that weighed the registry's 0 saw room the start then did not find, and
the start was refused for memory with nothing evicted. Here the Ollama test
server (tests/servers/ollama_server.py) reports ``OLLAMA_SIZE`` bytes for each
of its models; the llama.cpp instances are real processes of the fake
llama-protocol server on fake GGUF files (test_residency_node.SIZES), and in the
last test (marked slow) a real llama.cpp server on the project's tiny model.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import NodeFactory
from support import OllamaTestServer, chain_rows, free_ports, ollama_server, wait_until
from test_residency_node import OVERHEAD, SIZES, models, needs

from infervisor.actors.errors import NotResident
from infervisor.actors.node import Node
from infervisor.adapters.manifest import ModelFormat
from infervisor.adapters.ollama_wire import MAX_BYTES
from infervisor.adapters.spec import Flavor, InstanceSpec

__all__ = ["models"]  # the fixture, imported to be found

#: What the Ollama test server reports of each model (``/api/tags`` ``size``), bytes.
OLLAMA_SIZE = 50_000
#: What a start of an Ollama instance reserves: its reported size plus the overhead.
OLLAMA_NEEDS = OLLAMA_SIZE + OVERHEAD
TAGS = ("oa", "ob")


@pytest.fixture
def ollama() -> Iterator[OllamaTestServer]:
    with ollama_server(*TAGS, model_size=OLLAMA_SIZE, load_seconds=0.05) as srv:
        yield srv


def open_node(nodes: NodeFactory, fake_llama: str, models: Path, budget: int) -> Node:
    settings = nodes.settings(
        fake_llama, models, memory_budget_bytes=budget, reserve_overhead_bytes=OVERHEAD,
        ollama_keep_alive="5m",
    )  # fmt: skip
    node = nodes.open(settings)
    for name in SIZES:
        node.registry.adopt(name, models / f"{name}.gguf")
    for tag in TAGS:
        node.registry.adopt(tag, format=ModelFormat.OLLAMA, ollama_tag=tag)
    return node


def on_ollama(srv: OllamaTestServer, tag: str, **fields: Any) -> InstanceSpec:
    return InstanceSpec(role=f"r-{tag}", flavor=Flavor.OLLAMA, model=tag, port=srv.port, **fields)


def llama(model: str, **fields: Any) -> InstanceSpec:
    (port,) = free_ports(1)
    return InstanceSpec(role=f"r-{model}", flavor=Flavor.LLAMACPP, model=model, port=port, **fields)


def running(node: Node, *iids: str) -> None:
    for iid in iids:
        node.start(iid)
        wait_until(lambda i=iid: node.status(i).lifecycle == "running", 30, f"{iid} running")


def rows(node: Node) -> list[tuple[str, str, dict[str, Any]]]:
    return [(k, s, p) for _, _, k, s, p in chain_rows(node.settings.chain_path)]


def listed(srv: OllamaTestServer) -> list[str]:
    """The models Ollama's ``/api/ps`` lists (their names)."""
    answer = httpx.get(f"{srv.url}/api/ps", timeout=10, trust_env=False)
    return sorted(m["name"] for m in answer.json()["models"])


def test_a_verbs_start_of_an_ollama_instance_evicts_an_idle_lower_priority_llamacpp_one(
    nodes: NodeFactory, fake_llama: str, models: Path, ollama: OllamaTestServer
) -> None:
    """a (llama.cpp, priority -1) runs; the budget has room for a beside the
    overhead, not beside the Ollama model's reported size: the start of o evicts
    a, and the eviction records o's need as Ollama reported it."""
    node = open_node(nodes, fake_llama, models, needs(models, "m1") + OLLAMA_NEEDS - 1)
    a = node.place(llama("m1", priority=-1))
    o = node.place(on_ollama(ollama, "oa"))
    running(node, a)

    node.start(o, by="operator:uid=1(alice)")

    wait_until(lambda: node.status(o).lifecycle == "running", 30, "o running")
    assert node.status(a).lifecycle == "resting"
    seen = rows(node)
    (evicted,) = [(s, p) for k, s, p in seen if k == "residency.evicted"]
    assert evicted[0] == a and evicted[1]["for_instance"] == o
    assert evicted[1]["needed_bytes"] == OLLAMA_NEEDS
    assert evicted[1]["cause"] == "a start by operator:uid=1(alice)"
    assert not [r for r in seen if r[0] in ("instance.start_refused", "residency.refused")]
    assert node.status(o).reserved_bytes == OLLAMA_NEEDS
    ledger = node.ledger()
    assert ledger is not None and ledger.reservations == {o: OLLAMA_NEEDS}


def test_a_request_for_an_ollama_instance_evicts_the_idle_lower_priority_ollama_one(
    nodes: NodeFactory, fake_llama: str, models: Path, ollama: OllamaTestServer
) -> None:
    """oa (priority -1) runs; the budget holds it and one more overhead: a request
    for ob (priority 0) evicts oa, whose model Ollama no longer lists."""
    node = open_node(nodes, fake_llama, models, OLLAMA_NEEDS + OVERHEAD + 10)
    first = node.place(on_ollama(ollama, "oa", priority=-1))
    second = node.place(on_ollama(ollama, "ob", on_demand=True))
    running(node, first)

    view = node.demand(second, request="q1", model="ob", by="front", timeout_s=30)

    assert view.lifecycle == "running"
    assert node.status(first).lifecycle == "resting"
    assert listed(ollama) == ["ob:latest"]
    (evicted,) = [(s, p) for k, s, p in rows(node) if k == "residency.evicted"]
    assert evicted == (first, evicted[1]) and evicted[1]["needed_bytes"] == OLLAMA_NEEDS
    assert evicted[1]["cause"] == "request q1 by front"


def test_a_start_of_an_ollama_instance_is_refused_with_its_reported_size_when_all_are_pinned(
    nodes: NodeFactory, fake_llama: str, models: Path, ollama: OllamaTestServer
) -> None:
    """a (llama.cpp) and oa are pinned and idle: the start of ob cannot evict
    either, and is refused ``no_room`` with ob's need as Ollama reported it;
    ``residency.refused`` records the ledger and why each could not go."""
    budget = needs(models, "m1") + OLLAMA_NEEDS + OVERHEAD + 10
    node = open_node(nodes, fake_llama, models, budget)
    a = node.place(llama("m1", pinned=True, priority=-1))
    oa = node.place(on_ollama(ollama, "oa", pinned=True, priority=-1))
    ob = node.place(on_ollama(ollama, "ob"))
    running(node, a, oa)
    before = (node.ledger(), node.status(ob).lifecycle)

    with pytest.raises(NotResident) as refused:
        node.start(ob)

    assert refused.value.code == "no_room"
    assert str(OLLAMA_NEEDS) in str(refused.value)
    assert [node.status(i).lifecycle for i in (a, oa)] == ["running", "running"]
    assert (node.ledger(), node.status(ob).lifecycle) == before
    seen = rows(node)
    (refusal,) = [(s, p) for k, s, p in seen if k == "residency.refused"]
    assert refusal[0] == ob and refusal[1]["needed_bytes"] == OLLAMA_NEEDS
    assert refusal[1]["budget_bytes"] == budget
    assert {x["instance_id"]: x["why_not"] for x in refusal[1]["candidates"]} == {
        a: "pinned",
        oa: "pinned",
    }
    assert not [r for r in seen if r[0] == "residency.evicted"]
    assert listed(ollama) == ["oa:latest"]


def test_a_crashed_servers_restart_that_needs_room_for_an_ollama_model_evicts(
    nodes: NodeFactory, fake_llama: str, models: Path, ollama: OllamaTestServer
) -> None:
    """a (llama.cpp, priority -1) and o (Ollama) run, b (llama.cpp) is placed.
    o's model is unloaded behind the node's back (an exit); b takes the room
    while o's restart backs off; o's restart, due, needs Ollama's reported size
    and evicts a (the least recently used) rather than being refused for memory."""
    budget = needs(models, "m1") + OLLAMA_NEEDS + OVERHEAD + 10
    node = open_node(nodes, fake_llama, models, budget)
    a = node.place(llama("m1", priority=-1))
    b = node.place(llama("m2"))
    o = node.place(on_ollama(ollama, "oa", restart={"base_s": 4.0, "cap_s": 8.0}))
    running(node, a, o)

    # Somebody unloads o's model behind the node's back: an exit, restarted by policy.
    httpx.post(
        f"{ollama.url}/api/generate", json={"model": "oa", "keep_alive": 0}, timeout=10,
        trust_env=False,
    )  # fmt: skip
    wait_until(lambda: node.status(o).lifecycle == "restarting", 30, "o restarting")
    node.start(b)  # takes the room o's exit gave back, while o's restart backs off
    wait_until(lambda: node.status(b).lifecycle == "running", 30, "b running")

    wait_until(lambda: node.status(o).lifecycle == "running", 60, "o restarted")
    assert [node.status(i).lifecycle for i in (a, b)] == ["resting", "running"]
    seen = rows(node)
    (evicted,) = [(s, p) for k, s, p in seen if k == "residency.evicted"]
    assert evicted[0] == a and evicted[1]["for_instance"] == o
    assert evicted[1]["needed_bytes"] == OLLAMA_NEEDS
    assert evicted[1]["cause"].startswith("its restart after an exit")
    assert not [r for r in seen if r[0] in ("instance.start_refused", "residency.refused")]
    assert listed(ollama) == ["oa:latest"]


def test_a_size_beyond_any_memory_is_refused_with_a_number_the_chain_holds(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    """Ollama reporting 2**70 bytes: taken as MAX_BYTES (more than any node has),
    so the start is refused ``no_room`` and ``residency.refused`` records it (a
    size beyond signed 64 bits could not be appended); nothing else changes."""
    with ollama_server("oa", model_size=2**70, load_seconds=0.05) as srv:
        node = open_node(nodes, fake_llama, models, 10 * OLLAMA_NEEDS)
        o = node.place(on_ollama(srv, "oa"))
        with pytest.raises(NotResident) as refused:
            node.start(o)
        assert refused.value.code == "no_room"
        (refusal,) = [p for k, s, p in rows(node) if (k, s) == ("residency.refused", o)]
        assert refusal["needed_bytes"] == MAX_BYTES + OVERHEAD
        assert node.status(o).reserved_bytes == 0 and listed(srv) == []


@pytest.mark.slow
def test_an_ollama_start_evicts_a_real_llama_server_of_lower_priority(
    nodes: NodeFactory, tmp_path: Path, tiny_gguf: Path, ollama: OllamaTestServer
) -> None:
    """With a real llama.cpp server (``infervisor-llama-server`` on the project's tiny
    model, its file size reserved): the budget has room for it beside the
    overhead, not beside the Ollama model's reported size; the start of o evicts
    it (priority -1), its server process gone, and o runs."""
    registry = tmp_path / "real-models"
    registry.mkdir()
    shutil.copy(tiny_gguf, registry / "tiny.gguf")
    llama_needs = tiny_gguf.stat().st_size + OVERHEAD
    settings = nodes.settings(
        "infervisor-llama-server", registry, memory_budget_bytes=llama_needs + OLLAMA_NEEDS - 1,
        reserve_overhead_bytes=OVERHEAD, ollama_keep_alive="5m",
    )  # fmt: skip
    node = nodes.open(settings)
    node.registry.adopt("tiny", registry / "tiny.gguf")
    node.registry.adopt("oa", format=ModelFormat.OLLAMA, ollama_tag="oa")
    a = node.place(llama("tiny", priority=-1))
    o = node.place(on_ollama(ollama, "oa"))
    running(node, a)
    pid = node.status(a).pid
    assert pid is not None

    node.start(o)

    wait_until(lambda: node.status(o).lifecycle == "running", 60, "o running")
    assert node.status(a).lifecycle == "resting" and node.status(a).pid is None
    wait_until(lambda: not Path(f"/proc/{pid}").exists(), 30, "the llama server gone")
    (evicted,) = [(s, p) for k, s, p in rows(node) if k == "residency.evicted"]
    assert evicted[0] == a and evicted[1]["needed_bytes"] == OLLAMA_NEEDS
    assert evicted[1]["freed_bytes"] == llama_needs
    assert listed(ollama) == ["oa:latest"]
