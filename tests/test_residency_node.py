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

import contextlib
import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import NodeFactory
from support import FAKE_GGUF, chain_rows, cli_here, free_ports, wait_until

from infervisor.actors.clock import ManualClock
from infervisor.actors.errors import NotResident
from infervisor.actors.node import Node
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.replay import timeline

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


def three_resting(nodes: NodeFactory, fake_llama: str, models: Path, **fields: Any) -> Any:
    """A node with room for two of m1/m2/m3 and one instance of each, resting."""
    budget = needs(models, "m1") * 2 + 10
    node = open_node(nodes, fake_llama, models, budget)
    ports = free_ports(3)
    iids = [
        node.place(spec(f"r{n}", f"m{n + 1}", ports[n], **fields.get(f"m{n + 1}", {})))
        for n in range(3)
    ]
    return node, iids


def test_a_start_that_does_not_fit_evicts_the_least_recently_used_and_records_why(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    node, (a, b, c) = three_resting(nodes, fake_llama, models)
    node.demand(a, request="r1", model="m1", by="front")
    node.demand(b, request="r2", model="m2", by="front")
    node.demand(a, request="r3", model="m1", by="front")  # running: no new row, a stays older
    node.request_began(a)  # a is used again: b is now the least recently used
    node.request_ended(a)
    wait_until(lambda: (node.status(a).last_use_ns or 0) > (node.status(b).last_use_ns or 0), 30)

    view = node.demand(c, request="r4", model="m3", by="front")

    assert view.lifecycle == "running"
    assert node.status(b).lifecycle == "resting"
    assert node.status(a).lifecycle == "running"
    evicted = [(s, p) for k, s, p in kinds_of(node) if k == "residency.evicted"]
    assert [s for s, _ in evicted] == [b]
    payload = evicted[0][1]
    assert payload["for_instance"] == c
    assert payload["needed_bytes"] == needs(models, "m3")
    assert payload["freed_bytes"] == needs(models, "m2")
    assert payload["budget_bytes"] == node.settings.memory_budget_bytes
    chosen = {cand["instance_id"]: cand["chosen"] for cand in payload["candidates"]}
    assert chosen == {a: False, b: True}
    rows = [(k, s, p) for _, _, k, s, p in chain_rows(node.settings.chain_path)]
    at = rows.index(("residency.evicted", b, payload))
    stop = rows[at + 1]
    assert stop[:2] == ("instance.stop_requested", b) and stop[2]["then"] == "rest"
    starts_of_c = [n for n, r in enumerate(rows) if r[:2] == ("instance.starting", c)]
    exits_of_b = [n for n, r in enumerate(rows) if r[:2] == ("instance.exited", b)]
    assert exits_of_b[-1] < starts_of_c[-1]  # the victim was gone before the start
    # the evicted one is started again by the next demand (evicting the least recent)
    assert node.demand(b, request="r5", model="m2", by="front").lifecycle == "running"
    led = node.ledger()
    assert led is not None and led.in_use_bytes <= led.budget_bytes


def test_nothing_evictable_refuses_with_the_numbers_and_leaves_things_as_they_were(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    node, (a, b, c) = three_resting(
        nodes, fake_llama, models, m1={"pinned": True}, m2={"priority": 5}
    )
    node.demand(a, request="r1", model="m1", by="front")
    node.demand(b, request="r2", model="m2", by="front")

    with pytest.raises(NotResident) as refused:
        node.demand(c, request="r3", model="m3", by="front")

    assert refused.value.code == "no_room" and refused.value.retry_after_s > 0
    assert str(needs(models, "m3")) in str(refused.value)
    assert [node.status(i).lifecycle for i in (a, b, c)] == ["running", "running", "resting"]
    (row,) = [(s, p) for k, s, p in kinds_of(node) if k == "residency.refused"]
    assert row[0] == c
    why = {cand["instance_id"]: cand["why_not"] for cand in row[1]["candidates"]}
    assert why == {a: "pinned", b: "higher priority"}
    assert row[1]["held"] == {a: needs(models, "m1"), b: needs(models, "m2")}
    assert not [k for k, _, _ in kinds_of(node) if k == "residency.evicted"]


def two_busy(nodes: NodeFactory, fake_llama: str, models: Path) -> Any:
    """As :func:`three_resting`, with the first two running, each serving a request
    (the budget full), the third resting."""
    node, (a, b, c) = three_resting(nodes, fake_llama, models)
    node.demand(a, request="r1", model="m1", by="front")
    node.demand(b, request="r2", model="m2", by="front")
    node.request_began(a)
    node.request_began(b)
    wait_until(lambda: node.status(a).busy and node.status(b).busy, 30, "both busy")
    return node, (a, b, c)


def test_an_instance_serving_a_request_is_not_evicted(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    node, (a, b, c) = two_busy(nodes, fake_llama, models)

    # both still busy at the demand's deadline: it waited, then is refused, evicting neither
    with pytest.raises(NotResident) as refused:
        node.demand(c, request="r3", model="m3", by="front", timeout_s=2.0)
    assert refused.value.code == "no_room"
    # one row: the refusal (a refused start is no demand and no use)
    assert [k for k, s, _ in kinds_of(node) if s == c] == ["residency.refused"]
    assert node.status(c).last_use_ns is None
    assert node.status(a).lifecycle == node.status(b).lifecycle == "running"

    node.request_ended(a)  # a is idle again: it may go
    wait_until(lambda: not node.status(a).busy, 30, "a idle")
    assert node.demand(c, request="r4", model="m3", by="front").lifecycle == "running"
    assert node.status(a).lifecycle == "resting"
    assert node.status(b).lifecycle == "running"
    node.request_ended(b)


def test_a_demand_waits_for_a_busy_instance_to_end_its_request_then_evicts_it(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    node, (a, b, c) = two_busy(nodes, fake_llama, models)
    answers: list[Any] = []

    def demand_c() -> None:
        try:
            answers.append(node.demand(c, request="r3", model="m3", by="front", timeout_s=60))
        except Exception as e:  # collected for the assertion
            answers.append(e)

    waiting = threading.Thread(target=demand_c)
    waiting.start()
    # it waits (in the front's bounded queue) rather than being refused or evicting a busy one
    # nothing is recorded while it waits (a start not made is no demand): the node's
    # room lock, held while a start plans and waits, says it waits
    wait_until(lambda: node._room_lock.locked() or answers, 30, "c waiting for room")
    assert answers == [] and node.status(a).lifecycle == node.status(b).lifecycle == "running"
    node.request_ended(b)  # b ends its request: it may go now, a may not
    waiting.join(60)
    assert [getattr(x, "lifecycle", x) for x in answers] == ["running"]
    assert [node.status(i).lifecycle for i in (a, b)] == ["running", "resting"]
    evicted = [(s, p["for_instance"]) for k, s, p in kinds_of(node) if k == "residency.evicted"]
    assert evicted == [(b, c)]
    assert not [k for k, s, _ in kinds_of(node) if k == "residency.refused"]
    node.request_ended(a)


def test_status_and_events_show_residency_and_why_an_instance_was_unloaded(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    node, (a, b, c) = three_resting(nodes, fake_llama, models, m2={"pinned": True})
    node.demand(a, request="r1", model="m1", by="front")
    node.demand(b, request="r2", model="m2", by="front")
    node.demand(c, request="r3", model="m3", by="front")  # evicts a (b is pinned)
    node.shutdown()
    data = node.settings.data_dir

    status = cli_here("status", data)  # no node runs: replayed from the chain
    assert status.returncode == 0, status.stderr
    lines = {
        line.split()[1]: line
        for line in status.stdout.splitlines()
        if line.startswith("residency:")
    }
    assert lines[a].startswith(f"residency: {a} resting") and "last use" in lines[a]
    assert "pinned" in lines[b] and "priority 0" in lines[b]
    events = cli_here("events", data, "--kind", "residency.evicted")
    assert events.returncode == 0, events.stderr
    (row,) = [line for line in events.stdout.splitlines() if "residency.evicted" in line]
    assert a in row and f"evicted for {c}" in row
    assert row.split()[5:7] == ["-", "-"]  # no change of lifecycle (not running -> running)
    # the forensic view walks the states as the reducer does: resting after the rest
    db = node.settings.chain_path
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        for iid in (a, b, c):
            got = conn.execute(
                "SELECT seq, from_state, to_state FROM transitions WHERE instance = ? ORDER BY seq",
                (iid,),
            ).fetchall()
            want = [
                (e.seq, None if e.frm == "-" else e.frm, None if e.to == "-" else e.to)
                for e in timeline(db, iid)
            ]
            assert got == want
        states = conn.execute(
            "SELECT to_state FROM instance_states WHERE instance = ? ORDER BY seq", (a,)
        ).fetchall()
        assert states[0] == ("resting",) and states[-1] == ("resting",)
        evictions = conn.execute(
            "SELECT count(*) FROM event_log e, json_each(e.payload, '$.candidates') c "
            "WHERE e.kind = 'residency.evicted' AND json_extract(c.value, '$.chosen')"
        ).fetchone()
        assert evictions == (1,)


def test_idle_expiry_releases_to_resting_after_its_ttl_and_never_while_serving(
    nodes: NodeFactory, fake_llama: str, models: Path, manual_clock: ManualClock
) -> None:
    settings = nodes.settings(
        fake_llama,
        models,
        memory_budget_bytes=10 * needs(models, "m1"),
        reserve_overhead_bytes=OVERHEAD,
        health_interval_s=1.0,
        reconcile_interval_s=5.0,
    )
    node = nodes.open(settings, manual_clock)
    node.registry.adopt("m1", models / "m1.gguf")
    (port,) = free_ports(1)
    iid = node.place(spec("a", "m1", port, idle_ttl_s=60.0))
    with pytest.raises(NotResident) as waiting:  # recorded and started; not ready at once
        node.demand(iid, request="r1", model="m1", by="front", timeout_s=0)
    assert waiting.value.code == "start_timeout"

    def reached(lifecycle: str) -> bool:
        if node.settled(iid):
            if node.status(iid).lifecycle == lifecycle:
                return True
            manual_clock.advance(settings.health_interval_s)
        return False

    wait_until(lambda: reached("running"), 30, "running")
    node.request_began(iid)  # serving: never expired, however long
    wait_until(lambda: node.status(iid).busy, 30, "busy")
    for _ in range(3):
        manual_clock.advance(60.0)
    assert node.status(iid).lifecycle == "running"
    node.request_ended(iid)
    wait_until(lambda: not node.status(iid).busy, 30, "idle")
    manual_clock.advance(settings.reconcile_interval_s)  # the idle spell is recorded
    wait_until(lambda: any(k == "residency.idle" for k, _, _ in kinds_of(node)), 30, "idle row")
    manual_clock.advance(30.0)
    assert node.status(iid).lifecycle == "running"  # 35 s idle of 60
    for _ in range(8):
        manual_clock.advance(settings.reconcile_interval_s)
    wait_until(lambda: reached("resting"), 30, "resting after the ttl")
    (expired,) = [p for k, s, p in kinds_of(node) if k == "residency.expired" and s == iid]
    assert expired["idle_ttl_s"] == 60.0
    idle = [p for k, s, p in kinds_of(node) if k == "residency.idle" and s == iid][-1]
    assert expired["idle_since_ns"] == idle["idle_since_ns"]
    assert node.status(iid).reserved_bytes == 0


def test_an_operators_start_of_a_resting_instance_evicts_as_a_request_does(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    """`infervisor start` of a resting instance that does not fit evicts by the policy
    (recorded as a demand by the verb) and answers once the start is recorded."""
    node, (a, b, c) = three_resting(nodes, fake_llama, models)
    node.demand(a, request="r1", model="m1", by="front")
    node.demand(b, request="r2", model="m2", by="front")

    node.start(c, by="operator")

    wait_until(lambda: node.status(c).lifecycle == "running", 30)
    assert node.status(a).lifecycle == "resting"  # the least recently used went
    demanded = [(s, p) for k, s, p in kinds_of(node) if k == "residency.demanded"]
    assert demanded[-1][0] == c and demanded[-1][1]["request"] == "verb"
    assert [s for k, s, _ in kinds_of(node) if k == "residency.evicted"] == [a]


def test_a_restart_of_a_resting_instance_makes_room_as_a_start_does(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    node, (a, b, c) = three_resting(nodes, fake_llama, models)
    node.demand(a, request="r1", model="m1", by="front")
    node.demand(b, request="r2", model="m2", by="front")  # the budget is full; a is the LRU

    node.restart(c, by="operator")  # nothing to stop: started as a start verb starts it

    wait_until(lambda: node.status(c).lifecycle == "running", 30, "c running")
    assert [node.status(i).lifecycle for i in (a, b)] == ["resting", "running"]
    rows = kinds_of(node)
    assert [(s, p["for_instance"]) for k, s, p in rows if k == "residency.evicted"] == [(a, c)]
    assert [p["request"] for k, s, p in rows if k == "residency.demanded" and s == c] == ["verb"]


@contextlib.contextmanager
def served_one_of_two(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> Iterator[tuple[Node, Path]]:
    """A node whose budget holds one of m1 and m2, its models adopted and its control
    API served on its socket in this process: (the node, its data directory)."""
    from infervisor.tools.api.serving.server import ApiServer

    budget = needs(models, "m1") + needs(models, "m2") // 2
    settings = nodes.settings(
        fake_llama, models, memory_budget_bytes=budget, reserve_overhead_bytes=OVERHEAD
    )
    data = Path(settings.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    server = ApiServer.listen(data, settings.chain_path, settings.node_id)
    try:
        node = nodes.open(settings)
        for name in SIZES:
            node.registry.adopt(name, models / f"{name}.gguf")
        server.serve(node)
        yield node, data
        server.stopping()
        node.shutdown()
    finally:
        server.close()


def test_start_names_the_instances_it_evicted(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    """Stop 32's trial: `infervisor start` said nothing of the instance it evicted to
    make room, and its --json had no field for it: both name it now (``evicted``,
    also in the API's answer), and a start that evicts nothing has ``evicted: []``."""
    from infervisor.tools.api.client import ApiClient

    with served_one_of_two(nodes, fake_llama, models) as (node, data):
        ports = free_ports(2)
        a, b = node.place(spec("a", "m1", ports[0])), node.place(spec("b", "m2", ports[1]))
        first = cli_here("start", data, a, "--json", "--wait")  # running: idle, evictable
        assert first.returncode == 0, first
        assert json.loads(first.stdout)["evicted"] == []
        second = cli_here("start", data, b, "--json", "--wait")
        assert second.returncode == 0, second
        assert json.loads(second.stdout)["evicted"] == [a]
        assert node.status(a).lifecycle == "resting"
        third = cli_here("start", data, a, "--wait")  # evicts b in turn: one line names it
        assert third.returncode == 0, third
        assert f"evicted {b} to make room for it" in third.stdout.splitlines()[1], third.stdout
        with ApiClient(data_dir=data, timeout_s=60) as client:
            node.wait_for(a, lambda v: v.lifecycle == "running", 60)
            assert client.start(b).evicted == [a]


def test_place_start_names_the_instances_it_evicted(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    """`place --start` said nothing of what its start evicted (`start` did): its --json
    has ``evicted`` (also the API's placement answer) and its text one line each."""
    with served_one_of_two(nodes, fake_llama, models) as (node, data):
        ports = free_ports(4)

        def place(role: str, model: str, port: int, *extra: str) -> Any:
            flags = ["--flavor", "llamacpp", "--model", model, "--port", port, "--on-demand"]
            done = cli_here("place", data, "--role", role, *flags, "--start", *extra)
            assert done.returncode == 0, done
            return done.stdout

        first = json.loads(place("a", "m1", ports[0], "--json"))
        assert first["evicted"] == []
        a = first["instance_id"]
        node.wait_for(a, lambda v: v.lifecycle == "running", 60)
        second = json.loads(place("b", "m2", ports[1], "--json"))
        assert second["evicted"] == [a], second
        b = second["instance_id"]
        node.wait_for(b, lambda v: v.lifecycle == "running", 60)
        text = place("c", "m3", ports[2]).splitlines()
        assert f"evicted {b} to make room for it" in text[1], text
        # stop 34's trial: placed on demand (no start), it read "resting (wanted stopped)"
        flags = ["--flavor", "llamacpp", "--model", "m1", "--port", str(ports[3]), "--on-demand"]
        rests = cli_here("place", data, "--role", "d", *flags)
        assert rests.returncode == 0, rests
        assert ": applied (generation 0); resting, on demand; seq " in rests.stdout, rests.stdout
        assert "wanted stopped" not in rests.stdout
        d = rests.stdout.split(":", 1)[0]
        row = next(x for x in cli_here("status", data).stdout.splitlines() if x.startswith(d))
        assert row.split()[3:5] == ["resting", "on-demand"], row


def test_an_operators_stop_clears_the_no_room_refusal_from_the_status(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    """Stop 34's leftovers: a start refused for room, then stopped, still showed
    "start refused: no room ..." in status after the stop."""
    node = open_node(nodes, fake_llama, models, needs(models, "m1") - 1)
    (port,) = free_ports(1)
    iid = node.place(InstanceSpec(role="chat", flavor=Flavor.LLAMACPP, model="m1", port=port))
    with contextlib.suppress(Exception):
        node.start(iid)
    assert "no room" in node.status(iid).reason, node.status(iid)
    node.stop(iid)
    view = node.status(iid)
    assert view.lifecycle == "stopped" and "no room" not in view.reason, view
    assert view.reason.startswith("stop by operator"), view.reason
    node.stop(iid)  # a second stop records nothing (docs/cli.md)
    kinds = [k for _, _, k, _, _ in chain_rows(node.settings.chain_path)]
    assert kinds.count("instance.stop_requested") == 1, kinds
