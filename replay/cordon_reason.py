"""Why the node is cordoned or drained: the ``reason`` of the chain's last cordon
event (``node.cordoned``, ``node.drained``; none after ``node.uncordoned``).

The fold keeps the cordon itself (``NodeState.cordon``); its reason is read
from the chain when asked (``GET /v1/node``, ``status --node``), one indexed
row (``events_kind_seq``), so the state and its snapshots stay as they are.
"""

from __future__ import annotations

import json
import os

from infervisor.chain.connect import connect_reader, translated

from .fleet_events import NodeCordoned, NodeDrained, NodeUncordoned

__all__ = ["cordon_reason"]

_KINDS = tuple(t.__struct_config__.tag for t in (NodeCordoned, NodeDrained, NodeUncordoned))


def cordon_reason(path: str | os.PathLike[str], through_seq: int | None = None) -> str | None:
    """The reason recorded with the cordon in force at ``through_seq`` (None: the
    chain's head): the last cordon event's ``reason``, None when it gave none or
    the node is uncordoned (or never was cordoned).

    Raises:
        ChainIOError: the chain file cannot be read.
    """
    name = os.fspath(path)
    marks = ", ".join("?" * len(_KINDS))
    upto = "" if through_seq is None else " AND seq <= ?"
    args: tuple[object, ...] = _KINDS if through_seq is None else (*_KINDS, through_seq)
    conn = connect_reader(name)
    try:
        with translated(name, "read"):
            row = conn.execute(
                f"SELECT kind, payload FROM events WHERE kind IN ({marks}){upto} "  # noqa: S608 - placeholders only
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
        return None  # a payload the verifier names; no reason to show
    return reason if isinstance(reason, str) else None
