"""``place --start`` whose start the node refuses (no room: nothing can be evicted)
says so: the node's message on stderr, ``start_error`` in --json, and the exit
``infervisor start`` gives that code (no_room: 1); the placement stands.

A newcomer's trial (stop 33): it printed ``applied (generation 0); loaded (wanted
stopped)`` and exited 0, the refusal only inside the instance's reason, while the
API answered ``start_error: {code: no_room, ...}``. The node here is a stand-in
client answering as the API does (tools/api/serving/instances.py)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from test_cli_paths import run

from infervisor.replay.views import InstanceView
from infervisor.tools.api.exit_codes import Exit
from infervisor.tools.api.wire import ErrorBody, PlaceAnswer
from infervisor.tools.clikit.schemas import PLACE_SCHEMA
from infervisor.tools.operator import place as place_module

NO_ROOM = "no room for p4: 1.0 GiB needed, 0.2 GiB free, and nothing can be evicted"


def _answer(start_error: ErrorBody | None) -> PlaceAnswer:
    view = InstanceView(
        instance_id="n1-p4", adapter="infer.llamacpp", placed_by="operator", generation=0,
        role="p4", flavor="llamacpp", mode="managed", model="tiny2", endpoint="",
        lifecycle="loaded", desired="stopped", reason=NO_ROOM, since_ns=0, pid=None,
        restarts=0, health="", health_reason="", status="", status_detail=None,
        reserved_bytes=0, rss_bytes=None, exposure="loopback", last_exit=None, last_seq=254,
    )  # fmt: skip
    return PlaceAnswer(
        instance_id="n1-p4", outcome="applied", generation=0, instance=view, seq=254,
        hash="ab" * 32, started=start_error is None, start_error=start_error,
    )  # fmt: skip


@pytest.fixture
def node_answers(monkeypatch: pytest.MonkeyPatch) -> list[PlaceAnswer]:
    """The placements' answers the stand-in node gives, one per place."""
    answers: list[PlaceAnswer] = []

    class Client:
        def place(self, spec: Any, **_: Any) -> PlaceAnswer:
            return answers.pop(0)

    @contextlib.contextmanager
    def connected(*_: Any, **__: Any) -> Iterator[Client]:
        yield Client()

    monkeypatch.setattr(place_module, "connected", connected)
    return answers


FLAGS = ("place", "--url", "http://127.0.0.1:9", "--role", "p4", "--flavor", "llamacpp")
FLAGS += ("--model", "tiny2", "--port", "18810", "--priority", "-1", "--start")


def test_a_refused_start_is_said_with_the_nodes_message_and_exits_1(
    node_answers: list[PlaceAnswer],
) -> None:
    node_answers.append(_answer(ErrorBody(code="no_room", message=NO_ROOM)))
    ran = run(*FLAGS)
    assert ran.code == Exit.REFUSED, ran
    assert ran.stdout.startswith("n1-p4: applied (generation 0)"), ran  # placed
    assert f"error: placed, not started: {NO_ROOM}" in ran.stderr, ran


def test_a_refused_start_is_in_the_json(node_answers: list[PlaceAnswer]) -> None:
    node_answers.append(_answer(ErrorBody(code="no_room", message=NO_ROOM)))
    ran = run(*FLAGS, "--json")
    assert ran.code == Exit.REFUSED, ran
    doc = json.loads(ran.stdout)
    assert doc["start_error"] == {"code": "no_room", "message": NO_ROOM, "field": None}
    jsonschema.validate(doc, PLACE_SCHEMA)


def test_a_start_that_holds_exits_0_with_no_start_error(node_answers: list[PlaceAnswer]) -> None:
    node_answers.append(_answer(None))
    ran = run(*FLAGS, "--json")
    assert ran.code == Exit.OK, ran
    doc = json.loads(ran.stdout)
    assert doc["start_error"] is None
    jsonschema.validate(doc, PLACE_SCHEMA)
