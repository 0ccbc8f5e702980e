"""Replay folds a chain into changeable records (replay/folder.py) yet refuses what it
always refused, and the live node's reducer stays a pure function (issue 22, item 3).

- A payload that does not fit its kind is refused even when it verifies (its
  hashes are right) and even for a kind whose fields the node state does not
  read: replay would otherwise accept a chain that ``apply`` refuses.
- An event refused mid-chain leaves the folder's state as it was before it.
- ``apply_instance`` leaves the state it is given as it was, so a live actor's
  old state is never changed under it.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import msgspec
import pytest

from infervisor.chain import GENESIS_KIND, EventDraft, SqliteChain, StoredEvent
from infervisor.replay import (
    EventDecodeError,
    Folder,
    ReplayError,
    apply_instance,
    encode_event,
    kind_of,
    read_chain,
)
from infervisor.replay import events as ev

NODE = "node-a"
CHAT = "chat-1"
_T0 = 1_790_000_000_000_000_000


def _draft(event: ev.Event, subject: str = CHAT, payload: bytes | None = None) -> EventDraft:
    return EventDraft(
        ts_ns=time.time_ns(),
        source="test",
        kind=kind_of(event),
        subject=subject,
        payload=encode_event(event) if payload is None else payload,
    )


def _placed() -> ev.Placed:
    return ev.Placed(spec={"role": "chat"}, placed_by="operator")


#: Payloads whose hashes verify but which do not fit their kind, each of a kind the
#: node state does not read (the reducer folds nothing of it but its seq).
_MALFORMED = [
    pytest.param(
        ev.DeepHealthFailed(misses=1, reason="x"),
        b'{"event":"instance.deep_health_failed","misses":"one","reason":"x","v":1}',
        id="mistyped-field",
    ),
    pytest.param(
        ev.DeepHealthFailed(misses=1, reason="x"),
        b'{"event":"instance.deep_health_failed","reason":"x","v":1}',
        id="missing-field",
    ),
    pytest.param(
        ev.StraysEnded(pids=[1], cgroup="c"),
        b'{"cgroup":"c","event":"instance.strays_ended","pids":[1],"v":1}{}',
        id="trailing-bytes",
    ),
    pytest.param(
        ev.StraysEnded(pids=[1], cgroup="c"),
        b'{"event":"instance.deep_health_failed","misses":1,"reason":"x","v":1}',
        id="tag-disagrees-with-kind",
    ),
]


@pytest.mark.parametrize(("shape", "payload"), _MALFORMED)
def test_a_malformed_payload_that_verifies_is_refused(
    tmp_path: Path, shape: ev.Event, payload: bytes
) -> None:
    db = tmp_path / "chain.db"
    with SqliteChain.open(db, NODE) as chain:
        chain.append_many([_draft(_placed()), _draft(shape, payload=payload)])
    with pytest.raises(EventDecodeError, match="seq 2"):
        read_chain(db)


def _stored(seq: int, event: ev.Event) -> StoredEvent:
    payload = encode_event(event)
    return StoredEvent(
        seq=seq,
        ts_ns=_T0 + seq,
        node=NODE,
        source="test",
        kind=kind_of(event),
        subject=CHAT,
        payload=payload,
        payload_hash=bytes(32),
        prev_hash=bytes(32),
        hash=seq.to_bytes(32, "big"),
    )


def _genesis() -> StoredEvent:
    return msgspec.structs.replace(_stored(0, _placed()), kind=GENESIS_KIND, subject="")


def test_an_event_refused_mid_chain_leaves_the_folders_state_as_it_was() -> None:
    folder = Folder(NODE)
    folder.feed(_genesis())
    folder.feed(_stored(1, _placed()))
    folder.feed(_stored(2, ev.Starting(by="operator", reserved_bytes=5)))
    before = folder.state()
    # starting -> failed is not in the table, and a failure's update would stop wanting
    # the instance running: the refusal must come before any change to the record.
    with pytest.raises(ReplayError, match="seq 3"):
        folder.feed(_stored(3, ev.Failed(attempts=1, reason="spent")))
    after = folder.instance(CHAT)
    assert after == before.instances[CHAT]
    assert after is not None and after.desired == "running"


def test_apply_instance_leaves_the_state_it_is_given_as_it_was() -> None:
    placed = apply_instance(None, _stored(1, _placed()), _placed())
    assert placed is not None
    copy = msgspec.structs.replace(placed)
    started = apply_instance(
        placed, _stored(2, ev.Starting(by="operator")), ev.Starting(by="operator")
    )
    assert started is not None and started is not placed
    assert placed == copy  # unchanged: a live actor may still hold it
    assert (placed.desired, started.desired) == ("stopped", "running")
    with pytest.raises(AttributeError):  # what readers get is frozen
        placed.desired = started.desired  # type: ignore[misc]


def _long_chain(db: Path, bad: int, events: int = 300) -> None:
    """A started instance, then health flaps up to seq `events`; the payload at seq
    `bad` fits no event though its hashes are right (the chain's own append wrote it)."""
    flap = [ev.Unhealthy(misses=3, reason="timed out"), ev.Recovered(detail="ok")]
    drafts = [_draft(_placed()), _draft(ev.Starting(by="operator")), _draft(ev.Ready(detail="ok"))]
    drafts += [_draft(flap[n % 2]) for n in range(events - len(drafts))]
    drafts[bad - 1] = _draft(flap[0], payload=b'{"event":"instance.unhealthy","v":1}')
    with SqliteChain.open(db, NODE) as chain:
        chain.append_many(drafts)


def test_an_unreplayable_event_is_named_before_a_later_broken_row(tmp_path: Path) -> None:
    """Replay hands the verified rows to the fold in batches; the fold's refusal of an
    event still comes before a problem the verifier finds further on (as when each
    row was folded before the next was read)."""
    db = tmp_path / "chain.db"
    _long_chain(db, bad=100)
    with pytest.raises(EventDecodeError, match="seq 100"):
        read_chain(db)
    conn = sqlite3.connect(db, isolation_level=None)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'"):
        conn.execute(f'DROP TRIGGER "{name}"')
    conn.execute("UPDATE events SET hash = zeroblob(32) WHERE seq = 200")
    conn.close()
    with pytest.raises(EventDecodeError, match="seq 100"):
        read_chain(db)
    with pytest.raises(EventDecodeError, match="seq 100"):
        read_chain(db, unverified=True)
