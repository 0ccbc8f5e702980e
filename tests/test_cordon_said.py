"""What ``infervisor cordon``/``uncordon`` print for the node's answer: an uncordon
that recorded nothing (the node was not cordoned) says so, as a re-sent cordon
does. A newcomer's trial (stop 33): a second ``uncordon`` printed ``node
uncordoned: it takes placements``. The node here is a stand-in client answering
as the API does (actors/core/cordon.py: an uncordon of ``none`` records nothing)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from test_cli_paths import run

from infervisor.tools.api.fleet_wire import CordonAnswer
from infervisor.tools.operator import cordon as cordon_module

URL = ("--url", "http://127.0.0.1:9")


@pytest.fixture
def answers(monkeypatch: pytest.MonkeyPatch) -> list[CordonAnswer]:
    """The node's answers, one per verb sent."""
    queued: list[CordonAnswer] = []

    class Client:
        def cordon(self, verb: str, reason: str | None) -> CordonAnswer:
            return queued.pop(0)

    @contextlib.contextmanager
    def connected(*_: Any, **__: Any) -> Iterator[Client]:
        yield Client()

    monkeypatch.setattr(cordon_module, "connected", connected)
    return queued


def test_an_uncordon_that_recorded_nothing_says_so(answers: list[CordonAnswer]) -> None:
    answers.append(CordonAnswer(cordon="none", stopped=[], seq=7, hash="ab", recorded=False))
    ran = run("uncordon", *URL)
    assert ran.code == 0, ran
    assert ran.stdout == "not cordoned: the node takes placements; nothing recorded\n"


def test_an_uncordon_that_recorded_says_the_node_takes_placements(
    answers: list[CordonAnswer],
) -> None:
    answers.append(CordonAnswer(cordon="none", stopped=[], seq=8, hash="ab"))
    ran = run("uncordon", *URL)
    assert ran.code == 0, ran
    assert ran.stdout == "node uncordoned: it takes placements\n"


def test_a_resent_cordon_still_says_since_when(answers: list[CordonAnswer]) -> None:
    answers.append(
        CordonAnswer(cordon="cordoned", stopped=[], seq=8, hash="ab", recorded=False, reason="k")
    )
    ran = run("cordon", *URL, "--reason", "k")
    assert ran.code == 0, ran
    assert ran.stdout.startswith("node cordoned: it takes no new placements\nalready cordoned")
    assert ran.stdout.endswith("; nothing recorded\n"), ran.stdout
