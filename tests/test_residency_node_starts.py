"""Issue 21, the starts not yet under the policy (stop 32), with real processes
of the fake llama-protocol server and real model sizes (test_residency_node):

- a start the node decides itself (a crashed server's restart coming due) that
  does not fit evicts an idle instance of lower priority, by the same rules as
  a verb's, the eviction recording why; the restart is the supervisor's, no use;
- a verb's start whose only candidates serve a request waits for one to turn
  idle (then evicts it), within its kind's start-up deadline, and is refused
  ``no_room`` after it, naming what was busy, with the command line's code.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import NodeFactory
from support import chain_rows, cli_here, free_ports, wait_until
from test_residency_node import OVERHEAD, SIZES, models, needs

from infervisor.actors.errors import NotResident
from infervisor.actors.kinds import KindSettings
from infervisor.actors.node import Node
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.tools.api.exit_codes import Exit
from infervisor.tools.api.serving.server import ApiServer

__all__ = ["models"]  # the fixture, imported to be found


def open_node(nodes: NodeFactory, fake_llama: str, models: Path, **extra: Any) -> Node:
    """Room for two of the 4,000-byte models."""
    settings = nodes.settings(
        fake_llama, models, memory_budget_bytes=needs(models, "m1") * 2 + 10,
        reserve_overhead_bytes=OVERHEAD, **extra,
    )  # fmt: skip
    node = nodes.open(settings)
    for name in SIZES:
        node.registry.adopt(name, models / f"{name}.gguf")
    return node


def placed(node: Node, **fields: dict[str, Any]) -> list[str]:
    """m1, m2, m3 placed (not on demand) with their ``fields``, resting as loaded."""
    ports = free_ports(3)
    return [
        node.place(
            InstanceSpec(
                role=f"r{n}", flavor=Flavor.LLAMACPP, model=f"m{n + 1}", port=ports[n],
                **fields.get(f"m{n + 1}", {}),
            )
        )
        for n in range(3)
    ]  # fmt: skip


def running(node: Node, *iids: str) -> None:
    for iid in iids:
        node.start(iid)
        wait_until(lambda i=iid: node.status(i).lifecycle == "running", 30, f"{iid} running")


def rows(node: Node) -> list[tuple[str, str, dict[str, Any]]]:
    return [(k, s, p) for _, _, k, s, p in chain_rows(node.settings.chain_path)]


def test_a_crashed_servers_restart_that_needs_room_evicts_an_idle_lower_priority_one(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    """a (priority -1) and c run; c's server is killed; while its restart backs off
    b takes c's room. c's restart, due, does not fit: it evicts a (idle, lower
    priority, the least recently used) rather than being refused for memory."""
    node = open_node(nodes, fake_llama, models)
    a, b, c = placed(node, m1={"priority": -1}, m3={"restart": {"base_s": 4.0, "cap_s": 8.0}})
    running(node, a, c)
    used = node.status(c).last_use_ns
    pid = node.status(c).pid
    assert pid is not None

    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: node.status(c).lifecycle == "restarting", 30, "c restarting")
    node.start(b)  # takes the room c's exit gave back, while c's restart backs off

    wait_until(lambda: node.status(c).lifecycle == "running", 60, "c restarted")
    assert [node.status(i).lifecycle for i in (a, b)] == ["resting", "running"]
    seen = rows(node)
    (evicted,) = [(s, p) for k, s, p in seen if k == "residency.evicted"]
    assert evicted[0] == a and evicted[1]["for_instance"] == c
    assert evicted[1]["cause"] == "its restart after an exit (attempt 1)"
    chosen = {x["instance_id"]: x["chosen"] for x in evicted[1]["candidates"]}
    assert chosen == {a: True, b: False}
    assert not [r for r in seen if r[0] in ("instance.start_refused", "residency.refused")]
    assert not [r for r in seen if r[:2] == ("residency.demanded", c)]  # wanted running already
    starts = [p for k, s, p in seen if (k, s) == ("instance.starting", c)]
    assert starts[-1]["by"] == "supervisor" and starts[-1]["attempt"] == 1
    assert node.status(c).last_use_ns == used  # a supervisor's restart is no use
    assert node.status(a).rest_reason == f"evicted for {c}"
    led = node.ledger()
    assert led is not None and led.in_use_bytes <= led.budget_bytes


def two_busy(nodes: NodeFactory, fake_llama: str, models: Path, **extra: Any) -> Any:
    """a and b run, each serving a request (the budget full); c (``extra`` its
    fields) placed and not started."""
    node = open_node(nodes, fake_llama, models, **extra.pop("settings", {}))
    a, b, c = placed(node, m3=extra)
    running(node, a, b)
    node.request_began(a)
    node.request_began(b)
    wait_until(lambda: node.status(a).busy and node.status(b).busy, 30, "both busy")
    return node, (a, b, c)


def test_a_verbs_start_waits_for_a_busy_instance_to_turn_idle_then_evicts_it(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    node, (a, b, c) = two_busy(nodes, fake_llama, models)
    answers: list[Any] = []

    def start() -> None:
        try:
            answers.append(node.start(c, by="operator:uid=1(alice)"))
        except Exception as e:  # collected for the assertion
            answers.append(e)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join(1.0)
    assert thread.is_alive() and not answers  # waiting, not refused at once
    assert [node.status(i).lifecycle for i in (a, b)] == ["running", "running"]

    node.request_ended(a)  # a turns idle: it may go
    thread.join(60)

    assert [getattr(x, "lifecycle", x) for x in answers] in (["starting"], ["running"])
    wait_until(lambda: node.status(c).lifecycle == "running", 30, "c running")
    assert [node.status(i).lifecycle for i in (a, b)] == ["resting", "running"]
    seen = rows(node)
    (evicted,) = [(s, p) for k, s, p in seen if k == "residency.evicted"]
    assert evicted[0] == a and evicted[1]["cause"] == "a start by operator:uid=1(alice)"
    assert not [r for r in seen if r[0] == "residency.refused"]


def test_a_verbs_start_is_refused_at_its_deadline_naming_what_was_busy(
    nodes: NodeFactory, fake_llama: str, models: Path
) -> None:
    """c's kind gives it 2 s to start: its start waits that long for a or b to turn
    idle, then is refused ``no_room`` naming both as serving a request; nothing
    is evicted; the command line (``infervisor start`` through the control API)
    exits with its refusal code and says the same."""
    brief = KindSettings(startup_deadline_s=2.0, startup_cap_s=2.0)
    node, (a, b, c) = two_busy(
        nodes, fake_llama, models, kind="brief", settings={"kinds": {"brief": brief}}
    )

    with pytest.raises(NotResident) as refused:
        node.start(c)

    e = refused.value
    assert e.code == "no_room" and e.retry_after_s > 0
    message = str(e)
    assert f"{a} (serving a request)" in message and f"{b} (serving a request)" in message
    assert re.search(r"; waited \d+(\.\d+)? s for one to turn idle", message), message
    assert [node.status(i).lifecycle for i in (a, b)] == ["running", "running"]
    (refusal,) = [(s, p) for k, s, p in rows(node) if k == "residency.refused"]
    assert refusal[0] == c
    assert {x["why_not"] for x in refusal[1]["candidates"]} == {"serving a request"}
    assert not [r for r in rows(node) if r[0] == "residency.evicted"]
    # the command line, through the control API: its refusal code, and the message
    data = Path(node.settings.data_dir)
    server = ApiServer.listen(data, node.settings.chain_path, node.settings.node_id)
    try:
        server.serve(node)
        done = cli_here("start", data, c)
        assert done.returncode == Exit.REFUSED, done.stdout + done.stderr
        assert "Traceback" not in done.stderr
        assert f"{a} (serving a request)" in done.stderr and "waited" in done.stderr
        as_json = cli_here("start", data, c, "--json")
        assert json.loads(as_json.stdout)["error"]["code"] == "no_room"
        assert as_json.returncode == Exit.REFUSED
    finally:
        server.stopping()
        server.close()
