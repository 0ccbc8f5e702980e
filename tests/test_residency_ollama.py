"""Issue 21 with managed Ollama instances, against the Ollama test server
(tests/servers/ollama_server.py): an idle TTL releases the instance to
``resting`` and Ollama's model is unloaded through its API; a demand loads it
again; an eviction unloads the victim's model through the API (``/api/ps`` no
longer lists it). Time in the expiry test is a manual clock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import NodeFactory
from support import OllamaTestServer, chain_rows, ollama_server, wait_until

from infervisor.actors.clock import ManualClock
from infervisor.actors.errors import NotResident
from infervisor.actors.node import Node
from infervisor.adapters.manifest import ModelFormat
from infervisor.adapters.spec import Flavor, InstanceSpec

TAG, OTHER = "tinyllama", "other"
RESERVED = 4096  # each Ollama start reserves the overhead alone (no size reported)


@pytest.fixture
def server() -> Iterator[Callable[..., OllamaTestServer]]:
    """``server(*models, **flags)``: an Ollama test server whose models report no
    size, so a reservation is ``RESERVED``; killed in teardown."""
    with contextlib.ExitStack() as stack:

        def start(*models: str, **flags: Any) -> OllamaTestServer:
            flags.setdefault("model_size", 0)
            flags.setdefault("load_seconds", 0.05)
            return stack.enter_context(ollama_server(*models, **flags))

        yield start


def open_node(
    nodes: NodeFactory,
    fake_llama: str,
    fake_model: Path,
    budget: int,
    clock: ManualClock | None = None,
    **overrides: Any,
) -> Node:
    settings = nodes.settings(
        fake_llama,
        fake_model,
        memory_budget_bytes=budget,
        reserve_overhead_bytes=RESERVED,
        ollama_keep_alive="5m",
        **overrides,
    )
    node = nodes.open(settings, clock)
    for tag in (TAG, OTHER):
        node.registry.adopt(tag, format=ModelFormat.OLLAMA, ollama_tag=tag)
    return node


def on_demand(srv: OllamaTestServer, tag: str, **fields: Any) -> InstanceSpec:
    return InstanceSpec(
        role=f"r-{tag}", flavor=Flavor.OLLAMA, model=tag, port=srv.port, on_demand=True, **fields
    )


def listed(srv: OllamaTestServer) -> list[str]:
    """The models Ollama's ``/api/ps`` lists (their names)."""
    answer = httpx.get(f"{srv.url}/api/ps", timeout=10, trust_env=False)
    return sorted(m["name"] for m in answer.json()["models"])


def kinds(node: Node, iid: str) -> list[str]:
    return [k for _, _, k, s, _ in chain_rows(node.settings.chain_path) if s == iid]


def test_an_idle_ttl_rests_the_instance_unloads_ollama_and_a_demand_loads_it_again(
    nodes: NodeFactory,
    fake_llama: str,
    fake_model: Path,
    server: Any,
    manual_clock: ManualClock,
) -> None:
    srv = server(TAG)
    node = open_node(
        nodes,
        fake_llama,
        fake_model,
        10 * RESERVED,
        manual_clock,
        health_interval_s=1.0,
        reconcile_interval_s=5.0,
    )
    iid = node.place(on_demand(srv, TAG, idle_ttl_s=60.0))
    assert node.status(iid).lifecycle == "resting" and listed(srv) == []

    def reached(lifecycle: str) -> bool:
        if node.settled(iid):
            if node.status(iid).lifecycle == lifecycle:
                return True
            manual_clock.advance(node.settings.health_interval_s)
        return False

    def demand(request: str) -> None:
        with contextlib.suppress(NotResident):  # started; ready once the clock moves
            node.demand(iid, request=request, model=TAG, by="test", timeout_s=0)
        wait_until(lambda: reached("running"), 30, "running")

    demand("r1")
    assert listed(srv) == [f"{TAG}:latest"]
    node.request_began(iid)  # a request, as the front routes one
    wait_until(lambda: node.status(iid).busy, 10, "busy")
    node.request_ended(iid)
    wait_until(lambda: not node.status(iid).busy, 10, "idle")
    manual_clock.advance(node.settings.reconcile_interval_s)  # its idle spell is recorded
    wait_until(lambda: "residency.idle" in kinds(node, iid), 10, "the idle row")
    manual_clock.advance(30.0)
    assert node.status(iid).lifecycle == "running"  # 35 s idle of 60
    for _ in range(8):
        manual_clock.advance(node.settings.reconcile_interval_s)
    wait_until(lambda: reached("resting"), 30, "resting after the ttl")

    assert kinds(node, iid).count("residency.expired") == 1
    assert listed(srv) == []  # unloaded through Ollama's API

    def released() -> bool:  # once Ollama no longer lists the model (the next probe)
        if node.status(iid).reserved_bytes == 0:
            return True
        manual_clock.advance(node.settings.health_interval_s)
        return False

    wait_until(released, 30, "the reservation released")
    ledger = node.ledger()
    assert ledger is not None and iid not in ledger.reservations

    demand("r2")  # a demand loads it again through the API
    assert listed(srv) == [f"{TAG}:latest"]
    assert kinds(node, iid).count("residency.demanded") == 2


def test_an_evicted_ollama_instance_has_its_model_unloaded_through_the_api(
    nodes: NodeFactory, fake_llama: str, fake_model: Path, server: Any
) -> None:
    srv = server(TAG, OTHER)
    node = open_node(nodes, fake_llama, fake_model, RESERVED + 10)  # room for one
    first = node.place(on_demand(srv, TAG))
    second = node.place(on_demand(srv, OTHER))

    assert node.demand(first, request="r1", model=TAG, by="test").lifecycle == "running"
    assert listed(srv) == [f"{TAG}:latest"]

    assert node.demand(second, request="r2", model=OTHER, by="test").lifecycle == "running"

    assert node.status(first).lifecycle == "resting"
    assert listed(srv) == [f"{OTHER}:latest"]  # the victim's model is gone from /api/ps
    evicted = [
        (s, p) for _, _, k, s, p in chain_rows(node.settings.chain_path) if k == "residency.evicted"
    ]
    assert [(s, p["for_instance"]) for s, p in evicted] == [(first, second)]
    ledger = node.ledger()  # the victim's memory is back: only the second holds any
    assert ledger is not None and ledger.reservations == {second: RESERVED}
    assert node.status(first).reserved_bytes == 0
    assert "instance.memory_released" in kinds(node, first)
