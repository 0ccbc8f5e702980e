"""Issue 21, how a start that does not fit is decided, whoever asks: an
operator's start of an instance it stopped makes room as a request's does,
a request never starts an instance an operator stopped (and evicts nothing
for it), a refused start is no use and identical refusals do not grow the
chain, a verb's start is a use, and the status of an evicted instance says
why it rests. Real processes of the fake llama-protocol server; model sizes
are real (fake GGUF files of the sizes in test_residency_node.SIZES).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import NodeFactory
from support import chain_rows, cli_here, free_ports, wait_until
from test_residency_node import models, needs, open_node, spec

from infervisor.actors.errors import NotResident
from infervisor.actors.node import Node
from infervisor.adapters.spec import Flavor, InstanceSpec

__all__ = ["models"]  # the fixture, imported to be found


def two_running_of_three(
    nodes: NodeFactory, fake_llama: str, models: Path, **fields: Any
) -> tuple[Node, list[str]]:
    """Room for two of m1/m2/m3; the first two started by requests (a, then b:
    a is the least recently used), the third resting."""
    node = open_node(nodes, fake_llama, models, needs(models, "m1") * 2 + 10)
    ports = free_ports(3)
    iids = [
        node.place(spec(f"r{n}", f"m{n + 1}", ports[n], **fields.get(f"m{n + 1}", {})))
        for n in range(3)
    ]
    node.demand(iids[0], request="r1", model="m1", by="front")
    node.demand(iids[1], request="r2", model="m2", by="front")
    return node, iids


def test_an_operator_stopped_instances_start_evicts_an_idle_lower_priority_one(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    """c was stopped by an operator (not resting); the operator's start of it does
    not fit and evicts a (idle, priority -1: below c's 0) rather than being
    refused for memory; b (priority 1) stays."""
    node, (a, b, c) = two_running_of_three(
        nodes, fake_llama, models, m1={"priority": -1}, m2={"priority": 1}
    )
    node.stop(b)  # c gets room, runs, then an operator stops it; b comes back
    node.demand(c, request="r3", model="m3", by="front")
    node.stop(c, by="operator:uid=1000(alice)")
    node.start(b)  # evicts nothing: a and b fit
    wait_until(lambda: node.status(b).lifecycle == "running", 30, "b running")
    assert [node.status(i).lifecycle for i in (a, b, c)] == ["running", "running", "stopped"]

    node.start(c, by="operator:uid=1000(alice)")

    wait_until(lambda: node.status(c).lifecycle == "running", 30, "c running")
    assert [node.status(i).lifecycle for i in (a, b)] == ["resting", "running"]
    rows = [(k, s, p) for _, _, k, s, p in chain_rows(node.settings.chain_path)]
    evictions = [(s, p["for_instance"]) for k, s, p in rows if k == "residency.evicted"]
    assert evictions[-1] == (a, c)
    assert not [r for r in rows if r[0] == "instance.start_refused"]
    # the start was recorded demanded (by the verb) before the eviction, and made after it
    demanded = max(n for n, r in enumerate(rows) if r[:2] == ("residency.demanded", c))
    evicted = max(n for n, r in enumerate(rows) if r[:2] == ("residency.evicted", a))
    started = max(n for n, r in enumerate(rows) if r[:2] == ("instance.starting", c))
    assert demanded < evicted < started
    assert rows[demanded][2]["request"] == "verb" and "alice" in rows[demanded][2]["by"]


def test_a_request_for_an_operator_stopped_instance_is_503_stopped_and_evicts_nothing(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    node, (a, b, c) = two_running_of_three(nodes, fake_llama, models)
    node.stop(a)
    node.demand(c, request="r3", model="m3", by="front")  # fits beside b
    node.stop(c, by="operator:uid=1000(alice)")
    node.start(a)  # the budget is full again
    wait_until(lambda: node.status(a).lifecycle == "running", 30, "a running")
    before = len(chain_rows(node.settings.chain_path))

    with pytest.raises(NotResident) as refused:
        node.demand(c, request="r5", model="m3", by="front")

    assert refused.value.code == "stopped" and "alice" in str(refused.value)
    assert len(chain_rows(node.settings.chain_path)) == before  # nothing recorded
    assert [node.status(i).lifecycle for i in (a, b, c)] == ["running", "running", "stopped"]


def test_a_refused_request_is_no_use_and_identical_refusals_add_one_event(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    """Nothing can go (a pinned, b of higher priority): 40 requests for c are
    refused; one ``residency.refused`` row, no demand, no use; the others are
    counted (the view's ``refusals_folded``)."""
    node, (_, _, c) = two_running_of_three(
        nodes, fake_llama, models, m1={"pinned": True}, m2={"priority": 5}
    )
    before = len(chain_rows(node.settings.chain_path))

    for n in range(40):
        with pytest.raises(NotResident) as refused:
            node.demand(c, request=f"r{n}", model="m3", by="front:token=anyone", timeout_s=0)
        assert refused.value.code == "no_room"

    added = chain_rows(node.settings.chain_path)[before:]
    assert [(k, s) for _, _, k, s, _ in added] == [("residency.refused", c)]
    assert node.status(c).last_use_ns is None
    assert node.status(c).refusals_folded == 39
    assert node.status(c).lifecycle == "resting"


def test_a_verbs_start_is_a_use_and_changes_the_lru_order(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    """a is started before b (a is the least recently used); an operator's restart
    of a is a use, so c's start evicts b, not a."""
    node, (a, b, c) = two_running_of_three(nodes, fake_llama, models)
    used_before = node.status(a).last_use_ns or 0
    node.stop(a)

    node.start(a, by="operator")

    wait_until(lambda: node.status(a).lifecycle == "running", 30, "a running")
    assert (node.status(a).last_use_ns or 0) > max(used_before, node.status(b).last_use_ns or 0)
    node.demand(c, request="r3", model="m3", by="front")
    assert [node.status(i).lifecycle for i in (a, b)] == ["running", "resting"]


def test_the_status_of_an_evicted_start_true_instance_says_why_it_rests(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    """Instances placed to start (not on demand): b, evicted for c, rests; status
    (live and replayed, text and --json) says evicted for c, not on-demand."""
    node = open_node(nodes, fake_llama, models, needs(models, "m1") * 2 + 10)
    ports = free_ports(3)
    a, b, c = (
        node.place(
            InstanceSpec(role=f"r{n}", flavor=Flavor.LLAMACPP, model=f"m{n + 1}", port=ports[n])
        )
        for n in range(3)
    )
    for iid in (b, a):  # b first: the least recently used
        node.start(iid)
        wait_until(lambda i=iid: node.status(i).lifecycle == "running", 30, f"{iid} running")

    node.start(c)

    wait_until(lambda: node.status(c).lifecycle == "running", 30, "c running")
    view = node.status(b)
    assert (view.lifecycle, view.rest_reason, view.on_demand) == (
        "resting",
        f"evicted for {c}",
        False,
    )
    node.shutdown()
    data = node.settings.data_dir
    text = cli_here("status", data)  # no node runs: replayed from the chain
    assert text.returncode == 0, text.stderr
    (row,) = [line for line in text.stdout.splitlines() if line.startswith(b)]
    assert row.split()[3:5] == ["resting", "evicted"], row
    assert f"residency: {b} resting (evicted for {c})" in text.stdout
    as_json = cli_here("status", data, "--json")
    assert as_json.returncode == 0, as_json.stderr
    records = {r["instance_id"]: r for r in json.loads(as_json.stdout)}
    assert records[b]["rest_reason"] == f"evicted for {c}"
    assert records[a]["rest_reason"] is None and records[c]["rest_reason"] is None
