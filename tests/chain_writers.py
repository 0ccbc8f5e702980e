"""What the tests of the chain writer's group commit import (tests/test_group_commit.py,
tests/test_commit_fill.py); their fixtures are in tests/chain_writer_fixtures.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from infervisor.chain import EventDraft, SqliteChain, StoredEvent, encode_payload

#: ``SqliteChain.append_many`` as a plain function of the chain and the drafts.
AppendMany = Callable[[SqliteChain, Sequence[EventDraft]], list[StoredEvent]]
#: What makes a test's ``append_many`` of the original.
Wrap = Callable[[AppendMany], AppendMany]


def draft(subject: str = "s", n: int = 0, kind: str = "test.event") -> EventDraft:
    """An event of ``subject`` with payload ``{"n": n}``, stamped ``n`` ns after a fixed time."""
    return EventDraft(
        ts_ns=1_700_000_000_000_000_000 + n,
        source="test",
        kind=kind,
        subject=subject,
        payload=encode_payload({"n": n}),
    )
