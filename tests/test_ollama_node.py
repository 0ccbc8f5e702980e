"""Issue 3 through the Node API: managed and adopted Ollama, against the
protocol-faithful Ollama test server (tests/servers/ollama_server.py).

Managed Ollama is driven through its HTTP API: a load this node asked for is
its own to unload, a model already resident is not, and the memory reserved
for a load is released once Ollama no longer lists the model (or once the
instance is forgotten). Adopted Ollama is only observed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import NodeFactory
from support import OllamaTestServer, ollama_server, wait_until

from infervisor.actors.errors import UnknownInstance, VerbRefused
from infervisor.actors.node import Node
from infervisor.adapters import ollama
from infervisor.adapters.errors import AdmissionRefused
from infervisor.adapters.manifest import ModelFormat
from infervisor.adapters.spec import Flavor, InstanceSpec, Mode
from infervisor.replay import timeline

TAG = "tinyllama"
RESERVED = 4096  # bytes each Ollama start reserves (no size reported: the overhead alone)


@pytest.fixture
def node(nodes: NodeFactory, fake_llama: str, fake_model: Path) -> Node:
    settings = nodes.settings(
        fake_llama,
        fake_model,
        memory_budget_bytes=10 * RESERVED,
        reserve_overhead_bytes=RESERVED,
        ollama_keep_alive="5m",
    )
    n = nodes.open(settings)
    n.registry.adopt(TAG, format=ModelFormat.OLLAMA, ollama_tag=TAG)
    return n


@pytest.fixture
def server() -> Iterator[Callable[..., OllamaTestServer]]:
    """``server(*models, **flags)`` starts an Ollama test server (killed in teardown).

    Its models report no size (``model_size`` 0) unless a test gives one, so a
    reservation is the node's overhead alone (``RESERVED``)."""
    with contextlib.ExitStack() as stack:

        def start(*models: str, **flags: Any) -> OllamaTestServer:
            flags.setdefault("model_size", 0)
            return stack.enter_context(ollama_server(*models, **flags))

        yield start


def managed(srv: OllamaTestServer) -> InstanceSpec:
    return InstanceSpec(role="llm", flavor=Flavor.OLLAMA, model=TAG, port=srv.port)


def adopted(srv: OllamaTestServer) -> InstanceSpec:
    return InstanceSpec(
        role="llm", flavor=Flavor.OLLAMA, mode=Mode.ADOPTED, model=TAG, port=srv.port
    )


def resident(srv: OllamaTestServer) -> bool:
    return ollama.resident(srv.url, TAG, timeout=5.0)


def reservations(node: Node) -> dict[str, int]:
    ledger = node.ledger()
    assert ledger is not None
    return ledger.reservations


def released(node: Node, iid: str) -> None:
    wait_until(lambda: iid not in reservations(node), 20, f"{iid}'s memory released")
    if iid in {v.instance_id for v in node.list()}:
        assert node.status(iid).reserved_bytes == 0


def kinds(node: Node, iid: str) -> list[str]:
    return [e.kind for e in timeline(node.settings.chain_path, iid)]


# --- managed --------------------------------------------------------------------------


def test_model_not_pulled_is_refused_at_admission(node: Node, server: Any) -> None:
    srv = server("someothermodel")
    with pytest.raises(AdmissionRefused, match="pull it first; infervisor never downloads"):
        node.place(managed(srv))
    assert node.list() == []
    assert not resident(srv)  # and nothing was asked of it


def test_start_loads_runs_and_stop_unloads_and_releases(node: Node, server: Any) -> None:
    srv = server(TAG, load_seconds=1.0)
    spec = managed(srv)
    notes = node.admit(spec).notes
    assert notes == [f"endpoint {srv.url}", f"model {TAG} (ollama) verified"]
    iid = node.place(spec)
    started = node.start(iid)
    assert started.lifecycle == "starting"  # the load runs in the background
    assert started.reserved_bytes == RESERVED
    assert reservations(node) == {iid: RESERVED}
    view = node.wait_for(iid, lambda v: v.lifecycle == "running", 60)
    assert view.reason.endswith(f"(model {TAG} loaded by this node)")
    assert resident(srv)
    node.wait_for(iid, lambda v: v.status_detail == "model resident", 60)

    stopped = node.stop(iid)
    assert stopped.lifecycle == "stopped"
    assert not resident(srv)
    released(node, iid)
    moves = [(e.frm, e.to) for e in timeline(node.settings.chain_path, iid) if e.frm != e.to]
    assert moves == [
        ("-", "loaded"),
        ("loaded", "starting"),
        ("starting", "running"),
        ("running", "stopped"),
    ]


def test_model_already_resident_is_not_ours_to_unload(node: Node, server: Any) -> None:
    srv = server(TAG, resident=TAG)
    iid = node.place(managed(srv))
    node.start(iid)
    view = node.wait_for(iid, lambda v: v.lifecycle == "running", 60)
    assert "already resident: not ours to unload" in view.reason
    assert node.stop(iid).lifecycle == "stopped"
    assert resident(srv)  # somebody else's model stays loaded
    released(node, iid)


def test_stop_during_the_load_aborts_it_and_still_unloads(node: Node, server: Any) -> None:
    srv = server(TAG, load_seconds=2.0)
    iid = node.place(managed(srv))
    node.start(iid)
    wait_until(lambda: resident(srv), 20, "Ollama listing the model it is loading")
    assert node.status(iid).lifecycle == "starting"
    assert node.stop(iid).lifecycle == "stopped"
    wait_until(lambda: not resident(srv), 20, "the model no longer listed")
    released(node, iid)
    assert "instance.ready" not in kinds(node, iid)


def test_failed_load_is_an_exit_under_the_restart_policy(node: Node, server: Any) -> None:
    srv = server(fail_load=TAG, load_seconds=0.2)
    iid = node.place(managed(srv))
    node.start(iid)
    view = node.wait_for(iid, lambda v: v.lifecycle in ("restarting", "failed"), 60)
    assert "load failed: " in view.reason
    assert "HTTP 500" in view.reason
    assert "instance.restart_scheduled" in kinds(node, iid)
    assert view.reserved_bytes == 0  # a failed load holds no memory
    node.stop(iid)
    released(node, iid)
    assert not resident(srv)
    assert "instance.ready" not in kinds(node, iid)


def test_unload_forgets_and_releases_even_when_ollama_is_gone(node: Node, server: Any) -> None:
    srv = server(TAG, load_seconds=0.2)
    iid = node.place(managed(srv))
    node.start(iid)
    node.wait_for(iid, lambda v: v.lifecycle == "running", 60)
    assert reservations(node) == {iid: RESERVED}
    srv.kill()
    node.unload(iid)
    with pytest.raises(UnknownInstance):
        node.status(iid)
    assert reservations(node) == {}
    assert iid not in node.rebuild().instances


# --- adopted --------------------------------------------------------------------------


def test_adopted_ollama_is_observed_and_stop_is_refused(node: Node, server: Any) -> None:
    srv = server(TAG, version="0.6.8")
    spec = adopted(srv)
    notes = node.admit(spec).notes
    assert notes[:2] == [f"endpoint {srv.url}", "adopting running server (up)"]
    assert "1 model(s) listed" in notes
    assert "version 0.6.8" in notes
    iid = node.place(spec)
    assert node.start(iid).lifecycle == "running"
    view = node.wait_for(iid, lambda v: v.status_detail is not None, 60)
    assert (view.status, view.status_detail) == ("running", "server up; model not resident")
    with pytest.raises(VerbRefused, match="observes it and never stops it"):
        node.stop(iid)
    assert node.status(iid).lifecycle == "running"
    assert srv.proc.poll() is None
    assert node.status(iid).reserved_bytes == 0
    node.unload(iid)
    assert srv.proc.poll() is None
    assert reservations(node) == {}
