"""``list`` reads the views the instance actors post (actors/view_board.py,
issue 22): it wakes no actor, answers what ``status`` answers, and is never
ahead of the chain nor behind a verb already answered."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

import msgspec
import pytest
from support import wait_until
from test_probe_engine import keepalive  # noqa: F401 - the fixture

from infervisor.actors import messages as m
from infervisor.actors.instance import InstanceActor
from infervisor.actors.view import Posted
from infervisor.actors.view_board import ViewBoard
from infervisor.adapters.ports import free_port
from infervisor.adapters.spec import Flavor, InstanceSpec, Mode
from infervisor.replay.views import InstanceView


def _steady(view: InstanceView) -> InstanceView:
    """The view without its sampled readings: a probe or a resource sample may land
    between two reads (the server's CPU seconds moved between list and status in CI)."""
    return msgspec.structs.replace(
        view, probe_latency_s=None, rss_bytes=None, cgroup_memory_bytes=None, cpu_seconds=None
    )


def test_list_asks_no_actor_and_answers_what_status_answers(
    nodes,
    fake_llama: str,
    fake_model: Path,
    keepalive: str,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = nodes.open(nodes.settings(fake_llama, fake_model))
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    port = int(keepalive.rsplit(":", 1)[1])
    adopted = [
        node.place(InstanceSpec(role=f"a{i}", flavor=Flavor.LLAMACPP, mode=Mode.ADOPTED, port=port))
        for i in range(3)
    ]
    for iid in adopted:
        node.start(iid)
    managed = node.place(
        InstanceSpec(role="chat", flavor=Flavor.LLAMACPP, model="tiny", port=free_port())
    )
    node.start(managed)
    for iid in [*adopted, managed]:
        node.wait_for(iid, lambda v: v.lifecycle == "running" and v.health == "up", 30)

    asked: list[str] = []
    original = InstanceActor.on_receive

    def counting(actor: InstanceActor, message: object) -> object:
        if isinstance(message, m.GetStatus):
            asked.append(actor.iid)
        return original(actor, message)

    monkeypatch.setattr(InstanceActor, "on_receive", counting)
    listed = node.list()
    assert asked == []  # no actor woken
    assert [v.instance_id for v in listed] == sorted([*adopted, managed])
    for view in listed:
        assert _steady(view) == _steady(node.status(view.instance_id))
    assert {v.status for v in listed} == {"running"}  # the probes are shown


def test_list_follows_each_verb_answered(
    nodes,
    fake_llama: str,
    fake_model: Path,
) -> None:
    node = nodes.open(nodes.settings(fake_llama, fake_model))
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    iid = node.place(
        InstanceSpec(role="chat", flavor=Flavor.LLAMACPP, model="tiny", port=free_port())
    )
    (placed,) = node.list()
    assert (placed.lifecycle, placed.last_seq) == ("loaded", node.rebuild().head_seq)
    node.start(iid)
    running = node.wait_for(iid, lambda v: v.lifecycle == "running", 30)
    (listed,) = node.list()
    assert listed.lifecycle == "running" and listed.last_seq >= running.last_seq
    stopped = node.stop(iid)
    (after,) = node.list()  # the stop's answer came once its view was posted
    assert (after.lifecycle, after.last_seq) == (stopped.lifecycle, stopped.last_seq)
    assert after.last_seq <= node.rebuild().head_seq  # never ahead of the chain
    node.unload(iid)
    wait_until(lambda: node.list() == [], 10, "the unloaded instance off the list")


def test_a_view_is_taken_off_only_by_the_actor_that_posted_it() -> None:
    board = ViewBoard()
    first, second = object(), object()
    posted = [cast(Posted, SimpleNamespace(owner=o)) for o in (first, second)]
    board.post("i1", posted[0])
    board.post("i1", posted[1])  # a revived actor's view replaces its predecessor's
    board.drop("i1", first)
    assert board.get("i1") is posted[1]
    board.drop("i1", second)
    assert board.get("i1") is None


def _posted(owner: object, view: InstanceView) -> Posted:
    return cast(Posted, SimpleNamespace(owner=owner, view=view))


def test_the_version_changes_with_what_routes_by_and_not_with_a_request() -> None:
    """The front rebuilds its routing table when the version changed
    (tools/front/proxy.py): a first post, a lifecycle change and a removal change
    it; a post that changes only ``busy`` or ``last_use_ns`` (each request's
    ``request_began``/``request_ended``) does not."""
    board, actor = ViewBoard(), object()
    view = msgspec.convert(
        {
            "instance_id": "i1", "adapter": "llamacpp", "placed_by": "operator",
            "generation": 1, "role": "chat", "flavor": "llamacpp", "mode": "managed",
            "model": "tiny", "endpoint": "http://127.0.0.1:1", "lifecycle": "running",
            "desired": "running", "reason": "", "since_ns": 1, "pid": 7, "restarts": 0,
            "health": "", "health_reason": "", "status": "", "status_detail": None,
            "reserved_bytes": 0, "rss_bytes": None, "exposure": "", "last_exit": None,
            "last_seq": 1,
        },
        InstanceView,
    )  # fmt: skip
    seen = [board.version]
    board.post("i1", _posted(actor, view))
    seen.append(board.version)
    board.post("i1", _posted(actor, msgspec.structs.replace(view, busy=True, last_use_ns=5)))
    assert board.version == seen[-1]  # a request's own post: no rebuild for it
    board.post("i1", _posted(actor, msgspec.structs.replace(view, lifecycle="stopped")))
    seen.append(board.version)
    board.drop("i1", actor)
    seen.append(board.version)
    assert len(set(seen)) == 4
