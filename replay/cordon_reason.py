"""Why and since when the node is cordoned or drained: the ``reason`` and the time
of the chain's last cordon event (``node.cordoned``, ``node.drained``; none after
``node.uncordoned``).

The fold keeps the cordon itself (``NodeState.cordon``); its reason is read
from the chain when asked (``GET /v1/node``, ``status --node``), one indexed
row (``events_kind_seq``), so the state and its snapshots stay as they are.
"""

from __future__ import annotations

import datetime as dt
import json
import os

import msgspec

from .fleet_events import NodeCordoned, NodeDrained, NodeUncordoned

__all__ = ["CordonInForce", "cordon_in_force", "cordon_reason", "in_force_said"]

_KINDS = tuple(t.__struct_config__.tag for t in (NodeCordoned, NodeDrained, NodeUncordoned))


class CordonInForce(msgspec.Struct, frozen=True, kw_only=True):
    """The cordon event in force: its ``reason`` (None: none given), when it was
    recorded (``since_ns``, its ``ts_ns``: ns since the epoch, UTC) and its ``seq``."""

    reason: str | None
    since_ns: int
    seq: int


def in_force_said(reason: str | None, since_ns: int | None) -> str:
    """`` since 2026-12-03T22:10:05Z, because: kernel update``: what follows
    ``cordoned`` or ``drained`` in a message (the reason left out when none was
    given; empty without a cordon event in force, ``since_ns`` None)."""
    if since_ns is None:
        return ""
    at = dt.datetime.fromtimestamp(since_ns / 1e9, dt.UTC).isoformat(timespec="seconds")
    since = f" since {at.replace('+00:00', 'Z')}"
    return since + (f", because: {reason}" if reason is not None else "")


def cordon_in_force(
    path: str | os.PathLike[str], through_seq: int | None = None
) -> CordonInForce | None:
    """The chain's last cordon event at ``through_seq`` (None: the chain's head),
    unless it is ``node.uncordoned`` (or there is none): None then.

    Raises:
        ChainIOError: the chain file cannot be read.
    """
    # Imported when read: a command that only words a cordon (the verbs' answers,
    # ``status``) loads no chain reader (tests/test_cli_imports.py).
    from infervisor.chain.connect import connect_reader, translated  # noqa: PLC0415

    name = os.fspath(path)
    marks = ", ".join("?" * len(_KINDS))
    upto = "" if through_seq is None else " AND seq <= ?"
    args: tuple[object, ...] = _KINDS if through_seq is None else (*_KINDS, through_seq)
    conn = connect_reader(name)
    try:
        with translated(name, "read"):
            row = conn.execute(
                f"SELECT kind, payload, ts_ns, seq FROM events WHERE kind IN ({marks}){upto} "  # noqa: S608 - placeholders only
                "ORDER BY seq DESC LIMIT 1",
                args,
            ).fetchone()
    finally:
        conn.close()
    if row is None or row[0] == _KINDS[2]:
        return None
    try:
        reason = json.loads(bytes(row[1])).get("reason")
    except (ValueError, AttributeError):
        reason = None  # a payload the verifier names; no reason to show
    return CordonInForce(
        reason=reason if isinstance(reason, str) else None, since_ns=row[2], seq=row[3]
    )


def cordon_reason(path: str | os.PathLike[str], through_seq: int | None = None) -> str | None:
    """The reason recorded with the cordon in force at ``through_seq`` (None: the
    chain's head): the last cordon event's ``reason``, None when it gave none or
    the node is uncordoned (or never was cordoned).

    Raises:
        ChainIOError: the chain file cannot be read.
    """
    found = cordon_in_force(path, through_seq)
    return None if found is None else found.reason
