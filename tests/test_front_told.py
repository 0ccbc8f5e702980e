"""tools/front/told.py: the front's requests told to the node, one event-loop turn's at once."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from infervisor.tools.front.told import Told


class _Node:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []

    def request_began(self, iid: str, count: int = 1) -> None:
        self.calls.append(("began", iid, count))

    def request_ended(self, iid: str, count: int = 1) -> None:
        self.calls.append(("ended", iid, count))


def test_one_turns_requests_are_told_as_counts_beginnings_first() -> None:
    node = _Node()

    async def run() -> list[tuple[str, str, int]]:
        told = Told(cast(Any, node))
        told.ended("a")  # one that began in an earlier turn
        for _ in range(3):
            told.began("a")
        told.began("b")
        told.ended("b")
        assert node.calls == []  # nothing before the turn ends
        await asyncio.sleep(0)
        first = list(node.calls)
        told.ended("a")
        await asyncio.sleep(0)
        return first + node.calls[len(first) :]

    calls = asyncio.run(run())
    assert calls == [
        ("began", "a", 3),
        ("began", "b", 1),
        ("ended", "a", 1),
        ("ended", "b", 1),
        ("ended", "a", 1),
    ]


def test_flush_tells_at_once_and_leaves_nothing_behind() -> None:
    node = _Node()

    async def run() -> None:
        told = Told(cast(Any, node))
        told.began("a")
        told.flush()
        assert node.calls == [("began", "a", 1)]
        await asyncio.sleep(0)  # the armed turn's flush finds nothing to tell

    asyncio.run(run())
    assert node.calls == [("began", "a", 1)]
