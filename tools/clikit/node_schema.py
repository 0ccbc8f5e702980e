"""The node's record as ``infervisor status --node --json`` prints it, and its JSON
Schema (docs/cli.md, schema ``node``; listed in :data:`.schemas.SCHEMAS`)."""

from __future__ import annotations

from typing import Any

import msgspec

from ..api.wire import WitnessInfo

__all__ = ["NODE_SCHEMA", "NodeRecord"]


class NodeRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The node: whether it takes placements, its phase, its chain's head.

    ``source`` is ``node`` (the running node answered) or ``chain`` (no node
    runs: replayed from its chain; ``version``, ``phase``, ``chain_writable``
    and ``chain_error`` are then null). ``cordon`` is ``none``, ``cordoned``
    or ``drained`` (``infervisor cordon``, ``drain``, ``uncordon``; recorded in
    the chain, so a stopped node's is known too); ``cordon_reason`` the reason
    recorded with it (null: none given, or ``none``), ``cordon_since_ns`` when
    it was recorded (ns since the epoch, UTC; null: ``none``); ``takes_placements`` is
    whether it is ``none``. ``phase`` is the running node's (``open``,
    ``stopping``). ``instances`` counts the placed instances.

    ``witnesses`` are the node's witnesses (``[[witnesses]]``) as ``GET
    /v1/node`` answers them: each one's ``witness``, ``url``, ``cosigned_size``,
    ``checkpoint_size``, ``behind_events``, ``last_error`` and ``last_success_ns``
    (empty without witnesses; null from the chain: only the running node knows
    them); ``witness_quorum`` how many must cosign a checkpoint (null: no
    witnesses, or from the chain).
    """

    source: str
    node_id: str
    version: str | None
    phase: str | None
    cordon: str
    cordon_reason: str | None
    cordon_since_ns: int | None
    takes_placements: bool
    head_seq: int
    head_hash: str
    instances: int
    chain_writable: bool | None
    chain_error: str | None
    witnesses: list[WitnessInfo] | None
    witness_quorum: int | None


_OPT_INT = {"type": ["integer", "null"]}


#: The JSON type of each field of a witness (:class:`~..api.wire.WitnessInfo`).
_WITNESS_TYPES: dict[str, str | list[str]] = {
    "witness": "string",
    "url": "string",
    "cosigned_size": "integer",
    "checkpoint_size": "integer",
    "behind_events": "integer",
    "last_error": ["string", "null"],
    "last_success_ns": ["integer", "null"],
}
_WITNESS = {
    "type": "object",
    "additionalProperties": False,
    "required": list(WitnessInfo.__struct_fields__),
    "properties": {name: {"type": kind} for name, kind in _WITNESS_TYPES.items()},
}
_OPT_STR = {"type": ["string", "null"]}

NODE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "node",
    "type": "object",
    "additionalProperties": False,
    "required": list(NodeRecord.__struct_fields__),
    "properties": {
        "source": {"enum": ["node", "chain"]},
        "node_id": {"type": "string"},
        "version": _OPT_STR,
        "phase": _OPT_STR,
        "cordon": {"enum": ["none", "cordoned", "drained"]},
        "cordon_reason": _OPT_STR,
        "cordon_since_ns": {"type": ["integer", "null"]},
        "takes_placements": {"type": "boolean"},
        "head_seq": {"type": "integer"},
        "head_hash": {"type": "string"},
        "instances": {"type": "integer"},
        "chain_writable": {"type": ["boolean", "null"]},
        "chain_error": _OPT_STR,
        "witnesses": {"type": ["array", "null"], "items": _WITNESS},
        "witness_quorum": _OPT_INT,
    },
}
