"""A lease per controller, through the control API on a real node (issue 19).

A node in process (real fake-llama server processes, a real chain, a manual
clock for the lease, the API on its Unix socket): two controllers place one
instance each; one goes silent while the other heartbeats; only the silent
one's instance stops (source ``lease:ctl1``), the other keeps running. The
silent controller's next heartbeat answers ``lapsed`` and names the stopped
instance; after a node restart the answer is the same (read from the chain).
The node's own id named as a controller is refused 400 ``invalid``, nothing
appended.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import NodeFactory
from support import wait_until

from infervisor.actors import messages as m
from infervisor.actors.clock import ManualClock
from infervisor.actors.node import Node
from infervisor.adapters.ports import free_port
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.chain import SqliteChain
from infervisor.replay.callers import parse_source
from infervisor.tools.api.client import ApiClient
from infervisor.tools.api.errors import ApiError
from infervisor.tools.api.serving.server import ApiServer

LEASE_S = 10.0
TICK_S = 1.0
DEADLINE_S = 60.0


class Served:
    """One node and its API server on the data directory's socket."""

    def __init__(self, nodes: NodeFactory, settings: Any, clock: ManualClock) -> None:
        data = Path(settings.data_dir)
        data.mkdir(parents=True, exist_ok=True)
        self.server = ApiServer.listen(data, settings.chain_path, settings.node_id)
        self.node: Node = nodes.open(settings, clock)
        self.server.serve(self.node)
        self.client = ApiClient(data_dir=data)

    def close(self) -> None:
        self.client.close()
        self.server.stopping()
        self.node.shutdown()
        self.server.close()


@pytest.fixture
def served(nodes: NodeFactory) -> Iterator[list[Served]]:
    opened: list[Served] = []
    yield opened
    for one in opened:
        with contextlib.suppress(Exception):  # a failed test may leave it half closed
            one.close()


def tick_while(
    one: Served,
    clock: ManualClock,
    beating: str | tuple[str, ...],
    done: Callable[[], bool],
    what: str,
) -> None:
    """Tick the clock (``beating``, one controller or several, heard at each tick)
    until ``done()``."""

    def reached() -> bool:
        if done():
            return True
        for controller in (beating,) if isinstance(beating, str) else beating:
            one.client.heartbeat(controller)
        clock.advance(TICK_S)
        one.node._actors.supervisor.ask(m.IsSettled(), timeout=DEADLINE_S)  # the tick handled
        return False

    wait_until(reached, DEADLINE_S, what)


def sources_of(node: Node, iid: str, kind: str) -> list[str]:
    with SqliteChain.open_readonly(node.settings.chain_path) as chain:
        return [s.source for s in chain.events(subject=iid) if s.kind == kind]


def head(node: Node) -> int:
    with SqliteChain.open_readonly(node.settings.chain_path) as chain:
        return chain.head().seq


def test_only_the_silent_controllers_instance_stops_and_its_heartbeat_says_so(
    nodes: NodeFactory,
    served: list[Served],
    fake_llama: str,
    fake_model: Path,
    manual_clock: ManualClock,
) -> None:
    settings = nodes.settings(fake_llama, fake_model, health_interval_s=TICK_S, lease_s=LEASE_S)
    first = Served(nodes, settings, manual_clock)
    served.append(first)
    first.node.registry.adopt("tiny", fake_model / "tiny.gguf")
    client, node = first.client, first.node

    # The node's own id is no controller: refused, nothing appended.
    before = head(node)
    spec_x = InstanceSpec(role="x", flavor=Flavor.LLAMACPP, model="tiny", port=free_port())
    for call in (
        lambda: client.heartbeat(settings.node_id),
        lambda: client.place(spec_x, controller=settings.node_id, generation=1),
    ):
        with pytest.raises(ApiError) as refused:
            call()
        assert (refused.value.status, refused.value.code) == (400, "invalid")
        assert refused.value.field == "controller"
    assert head(node) == before

    # Two controllers, one instance each, both running.
    placed: dict[str, str] = {}
    for ctl, role in (("ctl1", "a"), ("ctl2", "b")):
        spec = InstanceSpec(role=role, flavor=Flavor.LLAMACPP, model="tiny", port=free_port())
        answer = client.place(spec, controller=ctl, generation=1, start=True)
        assert answer.started, answer
        placed[ctl] = answer.instance_id
    a, b = placed["ctl1"], placed["ctl2"]
    running = lambda: all(node.status(i).lifecycle == "running" for i in (a, b))  # noqa: E731
    # both heard while they start: a slow start spans many ticks, and neither lease
    # may lapse before both run
    tick_while(first, manual_clock, ("ctl1", "ctl2"), running, "both instances running")
    with pytest.raises(ApiError) as refused:  # a verb naming the node as controller, too
        client.stop(a, controller=settings.node_id)
    assert (refused.value.code, refused.value.field) == ("invalid", "controller")
    credential = parse_source(sources_of(node, a, "instance.placed")[0])
    assert (credential.role, credential.controller) == ("controller", "ctl1")
    assert credential.credential is not None and credential.credential.startswith("uid=")

    # ctl1 silent, ctl2 heard: only ctl1's instance stops, by its lease.
    stopped_a = lambda: node.status(a).desired == "stopped"  # noqa: E731
    tick_while(first, manual_clock, "ctl2", stopped_a, "ctl1's instance stopped by its lease")
    assert sources_of(node, a, "instance.stop_requested") == ["lease:ctl1"]
    assert sources_of(node, b, "instance.stop_requested") == []
    assert (node.status(b).lifecycle, node.status(b).desired) == ("running", "running")

    answer = client.heartbeat("ctl1")
    assert (answer.lapsed, answer.stopped) == (True, [a])
    assert (client.heartbeat("ctl2").lapsed, client.heartbeat("ctl2").stopped) == (False, [])

    # Silent again (nothing left to stop); the node restarts; the answer is the same.
    heard_at = manual_clock.monotonic()
    told_again = lambda: manual_clock.monotonic() > heard_at + LEASE_S + TICK_S  # noqa: E731
    tick_while(first, manual_clock, "ctl2", told_again, "ctl1 silent past its lease again")
    assert sources_of(node, a, "instance.stop_requested") == ["lease:ctl1"]  # nothing new
    first.close()
    served.remove(first)

    second = Served(nodes, settings, manual_clock)
    served.append(second)
    answer = second.client.heartbeat("ctl1")
    assert (answer.lapsed, answer.stopped) == (True, [a])
    assert second.client.heartbeat("ctl2").stopped == []
    assert second.node.status(a).desired == "stopped"  # the node does not restart it
    assert second.node.status(b).desired == "running"

    # The controller decides: it starts its instance again, and it is no longer named.
    second.client.start(a, controller="ctl1")
    answer = second.client.heartbeat("ctl1")
    assert (answer.lapsed, answer.stopped) == (False, [])
