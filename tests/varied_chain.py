"""A varied chain of every event kind, for tests that compare the auditor's outputs.

:func:`varied_events` draws events of every kind in ``replay.events.EVENT_TYPES``
(optional fields set or left out, values of each field's type, from a seeded
random source) and keeps each one the reference reducer (``replay.apply``)
accepts after the ones kept before it: so the chain is legal by construction,
and an event kind added later is drawn without changing this file.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, get_args

import msgspec
import msgspec.inspect as mi

from infervisor.chain import EventDraft, SqliteChain, StoredEvent
from infervisor.replay import ReplayError, apply
from infervisor.replay import events as ev
from infervisor.replay.state import NodeState

__all__ = ["varied_events", "write_varied_chain"]

_WORDS = ("ok", "crash", "timed out", "é ü 漢", "a\nb", "", "operator", "supervisor")


def _value(t: mi.Type, rnd: random.Random, depth: int = 0) -> Any:
    if isinstance(t, mi.BoolType):
        return rnd.random() < 0.5
    if isinstance(t, mi.IntType):
        return rnd.choice((0, 1, 3, 4321, 2**40))
    if isinstance(t, mi.FloatType):
        return rnd.choice((0.0, 0.5, 2.0, 61.5, 1_700_000_000.25))
    if isinstance(t, mi.StrType):
        return rnd.choice(_WORDS)
    if isinstance(t, mi.NoneType):
        return None
    if isinstance(t, mi.UnionType):
        return _value(rnd.choice(t.types), rnd, depth)
    if isinstance(t, mi.ListType | mi.TupleType | mi.VarTupleType):
        item = t.item_type if hasattr(t, "item_type") else mi.StrType()
        return [_value(item, rnd, depth + 1) for _ in range(rnd.randint(0, 3))]
    if isinstance(t, mi.DictType) and not isinstance(t.value_type, mi.AnyType):
        return {
            _value(t.key_type, rnd, depth + 1): _value(t.value_type, rnd, depth + 1)
            for _ in range(rnd.randint(0, 3))
        }
    if isinstance(t, mi.DictType):  # a spec: what the reducer reads of one
        return {"role": rnd.choice(("chat", "embed")), "port": rnd.randint(1024, 65535)}
    if isinstance(t, mi.StructType):
        return _struct(t.cls, rnd, depth + 1)
    if isinstance(t, mi.EnumType):
        return rnd.choice(list(t.cls))
    if isinstance(t, mi.LiteralType):
        return rnd.choice(t.values)
    return None  # Any and the like


def _struct(cls: type[Any], rnd: random.Random, depth: int) -> Any:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    fields = {
        f.name: _value(f.type, rnd, depth)
        for f in info.fields
        if f.name != "v" and (f.required or rnd.random() < 0.6)
    }
    return msgspec.convert(fields, cls, from_attributes=False, strict=False)


def varied_events(count: int, seed: int = 24) -> list[EventDraft]:
    """About `count` drafts of events of every kind, legal in order (clocks step back
    now and then, as a node's wall clock may)."""
    rnd = random.Random(seed)
    # Instance kinds drawn three times as often as the node's: a lifecycle goes
    # through several of them in order before it can exit, restart or fail.
    types = [t for t in ev.EVENT_TYPES.values() for _ in range(_weight(t))]
    state = NodeState(node_id="varied", head_seq=0, head_hash="")
    subjects = [f"inst-{i}" for i in range(4)]
    kept: list[EventDraft] = []
    tries = 0
    while len(kept) < count and tries < count * 200:
        tries += 1
        try:
            event = _struct(rnd.choice(types), rnd, 0)
        except (msgspec.ValidationError, TypeError):
            continue
        draft = EventDraft(
            ts_ns=_T0 + tries * 1_000_000 - rnd.choice((0, 0, 0, 5_000_000_000)),
            source=rnd.choice(("node", "supervisor", "operator:uid=1000(alice)", "lease")),
            kind=ev.kind_of(event),
            subject=rnd.choice(subjects) if isinstance(event, ev.InstanceEvent) else "",
            payload=ev.encode_event(event),
        )
        try:
            state = apply(state, _stored(state.head_seq + 1, draft))
        except ReplayError:
            continue
        kept.append(draft)
    return kept


_T0 = 1_800_000_000_000_000_000


def _weight(cls: type[Any]) -> int:
    return 3 if any(cls is t for t in get_args(ev.InstanceEvent)) else 1


def _stored(seq: int, draft: EventDraft) -> StoredEvent:
    """`draft` as the reference reducer sees it (hashes do not matter to it)."""
    fake = seq.to_bytes(32, "big")
    return StoredEvent(
        seq=seq,
        ts_ns=draft.ts_ns,
        node="varied",
        source=draft.source,
        kind=draft.kind,
        subject=draft.subject,
        payload=draft.payload,
        payload_hash=fake,
        prev_hash=fake,
        hash=fake,
    )


def write_varied_chain(path: Path, count: int, seed: int = 24) -> int:
    """Write a varied chain of about `count` events at `path`; returns its length."""
    with SqliteChain.open(path, "varied", now_ns=lambda: _T0) as chain:
        chain.append_many(varied_events(count, seed))
        return chain.head().seq + 1
