"""The fixtures of the tests of the chain writer's group commit
(tests/test_group_commit.py, tests/test_commit_fill.py): ``start_writer`` and
``patch_append_many``, taken with ``pytest_plugins = ("chain_writer_fixtures",)``
(a module the tests import cannot be a plugin too: pytest could not rewrite its asserts).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest
from chain_writers import Wrap

from infervisor.actors.chain_writer import ChainWriter
from infervisor.chain import SqliteChain

#: Starts a ChainWriter; its keyword arguments are ChainWriter's.
StartWriter = Callable[..., pykka.ActorRef[ChainWriter]]
#: Seconds a writer is given to stop after its test.
STOP_TIMEOUT_S = 30.0


@pytest.fixture
def start_writer(tmp_path: Path) -> Iterator[StartWriter]:
    """``start(**kwargs)`` starts a ChainWriter of node ``node-a`` on
    ``tmp_path/chain.db``; every one still alive is stopped after the test."""
    refs: list[pykka.ActorRef[ChainWriter]] = []

    def start(**kwargs: Any) -> pykka.ActorRef[ChainWriter]:
        ref = ChainWriter.start(tmp_path / "chain.db", "node-a", **kwargs)
        refs.append(ref)
        return ref

    yield start
    for ref in refs:
        if ref.is_alive():
            ref.stop(timeout=STOP_TIMEOUT_S)


@pytest.fixture
def patch_append_many(monkeypatch: pytest.MonkeyPatch) -> Callable[[Wrap], None]:
    """``patch(wrap)``: every ``SqliteChain.append_many`` of the test goes through
    ``wrap(the original)``."""

    def patch(wrap: Wrap) -> None:
        monkeypatch.setattr(SqliteChain, "append_many", wrap(SqliteChain.append_many))

    return patch
