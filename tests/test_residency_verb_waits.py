"""A bounded number of verb starts wait for busy instances (actors/node_residency.py).

Each waiting verb start holds one of the control API's worker threads for up to
its kind's start-up deadline; past :data:`MAX_VERB_WAITS`, one more is refused
``queue_full`` at once, and nothing is recorded (nothing was decided).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from infervisor.actors.core import observations as o
from infervisor.actors.errors import NotResident
from infervisor.actors.node_residency import MAX_VERB_WAITS, NodeResidency, _Start


class _Waits(NodeResidency):
    """Only what the wait for room reads: the event a request's end sets, the bound."""

    def __init__(self) -> None:
        self._room_changed = threading.Event()
        self._verb_waits = threading.BoundedSemaphore(MAX_VERB_WAITS)


def _start(*, verb: bool, deadline_s: float) -> _Start:
    now = time.monotonic()
    request = "verb" if verb else "r1"
    planned = o.RoomPlanned(request=request, model="tiny", by="operator", verb=verb)
    ref: Any = None
    return _Start("i1", ref, None, planned, "a start by operator", now + deadline_s, now)


def test_one_verb_start_more_than_the_bound_is_refused_queue_full_at_once() -> None:
    node = _Waits()
    for _ in range(MAX_VERB_WAITS):  # as many verb starts as may wait, waiting
        assert node._verb_waits.acquire(blocking=False)
    with pytest.raises(NotResident) as refused:
        node._wait_for_room(_start(verb=True, deadline_s=3600.0))
    assert refused.value.code == "queue_full"
    assert f"{MAX_VERB_WAITS} starts already wait" in str(refused.value)
    # A request's demand waits in the front's own queue, not under this bound.
    node._room_changed.set()
    node._wait_for_room(_start(verb=False, deadline_s=3600.0))


def test_a_verb_start_that_waited_gives_its_place_back() -> None:
    node = _Waits()
    node._room_changed.set()  # a request ended: the wait returns at once
    for _ in range(MAX_VERB_WAITS + 2):
        node._wait_for_room(_start(verb=True, deadline_s=3600.0))
    held = [node._verb_waits.acquire(blocking=False) for _ in range(MAX_VERB_WAITS)]
    assert all(held)


def test_the_api_answers_queue_full_503_and_no_room_422() -> None:
    from infervisor.tools.api.answers import answer_for

    status, body = answer_for(NotResident("eight wait", code="queue_full"))
    assert (status, body.code) == (503, "queue_full")
    status, body = answer_for(NotResident("nothing can go", code="no_room"))
    assert (status, body.code) == (422, "no_room")
