"""Issue 21 through the Node API, with real processes of the fake llama-protocol
server: a demand starts a resting instance; a start that does not fit the
memory budget evicts the least recently used instance that may go (recorded
first, with its reason); nothing evictable refuses with the numbers; an
operator's stop wins over demands; requests make an instance busy, and busy
ones are not evicted.

Model sizes are real: the registry holds several fake GGUF files of different
sizes, and the ledger counts them.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import NodeFactory
from support import FAKE_GGUF, chain_rows, free_ports

from infervisor.actors.errors import NotResident
from infervisor.actors.node import Node
from infervisor.adapters.spec import Flavor, InstanceSpec

OVERHEAD = 1000
SIZES = {"m1": 4000, "m2": 4000, "m3": 4000, "big": 20000}


@pytest.fixture
def models(tmp_path: Path) -> Path:
    """A registry of fake GGUF models of the sizes in SIZES (bytes of padding)."""
    root = tmp_path / "models"
    root.mkdir()
    for name, pad in SIZES.items():
        (root / f"{name}.gguf").write_bytes(FAKE_GGUF + bytes(pad))
    return root


def needs(models: Path, name: str) -> int:
    return (models / f"{name}.gguf").stat().st_size + OVERHEAD


def spec(role: str, model: str, port: int, **fields: Any) -> InstanceSpec:
    return InstanceSpec(
        role=role, flavor=Flavor.LLAMACPP, model=model, port=port, on_demand=True, **fields
    )


def open_node(nodes: NodeFactory, fake_llama: str, models: Path, budget: int) -> Node:
    settings = nodes.settings(
        fake_llama, models, memory_budget_bytes=budget, reserve_overhead_bytes=OVERHEAD
    )
    node = nodes.open(settings)
    for name in SIZES:
        node.registry.adopt(name, models / f"{name}.gguf")
    return node


def kinds_of(node: Node, prefix: str = "residency.") -> list[tuple[str, str, dict[str, Any]]]:
    rows = chain_rows(node.settings.chain_path)
    return [(k, subj, p) for _, _, k, subj, p in rows if k.startswith(prefix)]


def test_a_demand_starts_a_resting_instance_and_waits_until_it_serves(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    node = open_node(nodes, fake_llama, models, 10 * needs(models, "m1"))
    (port,) = free_ports(1)
    iid = node.place(spec("a", "m1", port))
    assert node.status(iid).lifecycle == "resting"
    assert node.status(iid).resting and node.status(iid).on_demand

    view = node.demand(iid, request="r1", model="m1", by="front", timeout_s=30)

    assert view.lifecycle == "running"
    rows = [(k, s) for _, _, k, s, _ in chain_rows(node.settings.chain_path)]
    demanded = rows.index(("residency.demanded", iid))
    assert ("instance.starting", iid) in rows[demanded:]
    assert node.status(iid).last_use_ns is not None
    # a second demand of a running instance records nothing
    before = len(chain_rows(node.settings.chain_path))
    assert node.demand(iid, request="r2", model="m1", by="front").lifecycle == "running"
    assert not [
        r for r in chain_rows(node.settings.chain_path)[before:] if r[2] == "residency.demanded"
    ]


def test_concurrent_demands_of_one_instance_coalesce_into_one_start(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    node = open_node(nodes, fake_llama, models, 10 * needs(models, "m1"))
    (port,) = free_ports(1)
    iid = node.place(spec("a", "m1", port))
    results: list[Any] = []

    def ask(n: int) -> None:
        try:
            results.append(node.demand(iid, request=f"r{n}", model="m1", by="front"))
        except Exception as e:  # collected for the assertion
            results.append(e)

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [getattr(r, "lifecycle", r) for r in results] == ["running"] * 4
    kinds = [k for _, _, k, s, _ in chain_rows(node.settings.chain_path) if s == iid]
    assert kinds.count("residency.demanded") == 1
    assert kinds.count("instance.starting") == 1


def test_a_demand_of_an_operator_stopped_instance_is_refused_naming_who(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    node = open_node(nodes, fake_llama, models, 10 * needs(models, "m1"))
    (port,) = free_ports(1)
    iid = node.place(spec("a", "m1", port))
    node.demand(iid, request="r1", model="m1", by="front")
    node.stop(iid, by="operator:uid=1000(alice)")
    before = len(chain_rows(node.settings.chain_path))

    with pytest.raises(NotResident) as refused:
        node.demand(iid, request="r2", model="m1", by="front")

    assert refused.value.code == "stopped"
    assert "alice" in str(refused.value)
    assert len(chain_rows(node.settings.chain_path)) == before  # nothing recorded
    assert node.status(iid).lifecycle == "stopped"
