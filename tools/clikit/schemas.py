"""The JSON objects the command line prints, as typed records and as JSON Schema.

One shape per object, whether the answer comes from the running node
(``source: "node"``) or is replayed from the chain (``source: "chain"``): a
field the chain cannot know (health, resident memory, exposure, the adapter's
status) is ``null`` there. ``null`` always means unknown or none; no field is
ever ``""`` for that. The schemas are documented in docs/cli.md and checked
against real output by tests/test_cli_contract.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from infervisor.adapters.spec import InstanceSpec
from infervisor.replay.views import InstanceView, rest_reason

from ..api.wire import ErrorBody, ErrorEnvelope
from .node_schema import NODE_SCHEMA

if TYPE_CHECKING:  # only annotations: `status` of a node loads no reducer (issue 22)
    from infervisor.replay import InstanceState, TimelineEntry

__all__ = [
    "ERROR_SCHEMA",
    "EXIT_SCHEMA",
    "INSTANCE_SCHEMA",
    "PLACE_SCHEMA",
    "SCHEMAS",
    "TIMELINE_SCHEMA",
    "VERB_SCHEMA",
    "VERIFY_SCHEMA",
    "ErrorBody",
    "ErrorRecord",
    "ExitInfo",
    "InstanceRecord",
    "PlaceRecord",
    "TimelineRecord",
    "VerbRecord",
    "from_state",
    "from_timeline",
    "from_view",
    "place_record",
    "verb_record",
]

Source = Literal["node", "chain"]


class ExitInfo(msgspec.Struct, frozen=True, kw_only=True):
    """How the last server process ended."""

    pid: int | None
    exit_code: int | None
    signal: int | None
    reason: str | None
    ts_ns: int | None


class InstanceRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One instance, as ``status --json`` and the verbs' ``--json`` print it."""

    source: Source
    instance_id: str
    role: str | None
    adapter: str | None
    flavor: str | None
    mode: str | None
    model: str | None
    endpoint: str | None
    placed_by: str
    generation: int
    lifecycle: str
    desired: str
    reason: str | None
    since_ns: int
    pid: int | None
    restarts: int
    max_restarts: int | None
    health: str | None
    health_reason: str | None
    status: str | None
    status_detail: str | None
    reserved_bytes: int | None
    rss_bytes: int | None
    exposure: str | None
    last_exit: ExitInfo | None
    last_seq: int
    #: Residency (issue 21): the spec's fields (null from the chain when its
    #: recorded spec cannot be read, as ``role`` and ``model`` are), whether it
    #: rests, its last use (ns since the epoch, UTC; null: never used) and
    #: whether it serves a request now (null from the chain: only the node
    #: counts requests).
    on_demand: bool | None = None
    idle_ttl_s: float | None = None
    priority: int | None = None
    pinned: bool | None = None
    resting: bool = False
    last_use_ns: int | None = None
    busy: bool | None = None
    #: Why it rests (``evicted for B``, ``idle longer than 60 s``, ``placed on
    #: demand``); null when it does not rest.
    rest_reason: str | None = None


class VerbRecord(InstanceRecord, frozen=True, kw_only=True):
    """A verb's answer (``start``, ``stop``, ``restart --json``): the instance, the
    seq and hash (hex) of its last event in the chain once the verb's events are
    durable, and the instances evicted to make room for it (``evicted``: a start's
    or restart's, in the order recorded; empty otherwise)."""

    seq: int
    hash: str
    evicted: list[str] = msgspec.field(default_factory=list)


class PlaceRecord(msgspec.Struct, frozen=True, kw_only=True):
    """``place --json``: what the placement did (``applied``, ``unchanged``, ``ignored``),
    the instances evicted for its start (``--start``), and ``start_error``: the node's
    refusal of that start (an error's body; null: started, or none asked)."""

    instance_id: str
    outcome: str
    generation: int
    instance: InstanceRecord
    seq: int
    hash: str
    evicted: list[str] = msgspec.field(default_factory=list)
    start_error: ErrorBody | None = None


class TimelineRecord(msgspec.Struct, frozen=True, kw_only=True, rename={"frm": "from"}):
    """One event of an instance's history; ``from`` is null before its placement."""

    seq: int
    ts_ns: int
    kind: str
    source: str
    frm: str | None
    to: str
    reason: str | None


#: ``--json``'s error object is the control API's, so a code reads the same on both.
ErrorRecord = ErrorEnvelope


def _none(text: str | None) -> str | None:
    return text or None


def _exit(e: Any) -> ExitInfo | None:
    if e is None:
        return None
    return ExitInfo(
        pid=e.pid, exit_code=e.exit_code, signal=e.signal, reason=_none(e.reason), ts_ns=e.ts_ns
    )


def from_view(v: InstanceView) -> InstanceRecord:
    """The record of a running node's view."""
    return InstanceRecord(
        source="node",
        instance_id=v.instance_id,
        role=v.role,
        adapter=v.adapter,
        flavor=v.flavor,
        mode=v.mode,
        model=v.model,
        endpoint=v.endpoint,
        placed_by=v.placed_by,
        generation=v.generation,
        lifecycle=v.lifecycle,
        desired=v.desired,
        reason=_none(v.reason),
        since_ns=v.since_ns,
        pid=v.pid,
        restarts=v.restarts,
        max_restarts=v.max_restarts,
        health=_none(v.health),
        health_reason=_none(v.health_reason),
        status=_none(v.status),
        status_detail=_none(v.status_detail),
        reserved_bytes=v.reserved_bytes,
        rss_bytes=v.rss_bytes,
        exposure=_none(v.exposure),
        last_exit=_exit(v.last_exit),
        last_seq=v.last_seq,
        on_demand=v.on_demand,
        idle_ttl_s=v.idle_ttl_s,
        priority=v.priority,
        pinned=v.pinned,
        resting=v.resting,
        last_use_ns=v.last_use_ns,
        busy=v.busy,
        rest_reason=_none(v.rest_reason),
    )


def from_state(s: InstanceState) -> InstanceRecord:
    """The record of an instance replayed from the chain: what only the node knows is null."""
    try:
        spec: InstanceSpec | None = msgspec.convert(s.spec, InstanceSpec)
    except msgspec.ValidationError:
        spec = None
    return InstanceRecord(
        source="chain",
        instance_id=s.instance_id,
        role=spec.role if spec else _none(str(s.spec.get("role") or "")),
        adapter=spec.flavor.adapter_id(spec.mode) if spec else None,
        flavor=spec.flavor.value if spec else None,
        mode=spec.mode.value if spec else None,
        model=spec.model if spec else None,
        endpoint=spec.base_url if spec else None,
        placed_by=s.placed_by,
        generation=s.generation,
        lifecycle=s.lifecycle.value,
        desired=s.desired.value,
        reason=_none(s.reason),
        since_ns=s.since_ns,
        pid=s.process.pid if s.process else None,
        restarts=s.restarts,
        max_restarts=_budget(spec),
        health=None,
        health_reason=None,
        status=None,
        status_detail=None,
        reserved_bytes=s.reserved_bytes,
        rss_bytes=None,
        exposure=None,
        last_exit=_exit(s.last_exit),
        last_seq=s.last_seq,
        on_demand=spec.on_demand if spec else None,
        idle_ttl_s=spec.idle_ttl_s if spec else None,
        priority=spec.priority if spec else None,
        pinned=spec.pinned if spec else None,
        resting=s.lifecycle.value == "resting",
        last_use_ns=s.last_use_ns,
        busy=None,
        rest_reason=_none(rest_reason(s)),
    )


def _budget(spec: InstanceSpec | None) -> int | None:
    """The spec's own restart budget (its ``restart.max_restarts``); else unknown offline."""
    value = (spec.restart or {}).get("max_restarts") if spec else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def verb_record(v: InstanceView, seq: int, digest: str, evicted: Sequence[str] = ()) -> VerbRecord:
    """The record of a verb's answer: the instance, the chain's seq and hash of it,
    and the instances evicted for it."""
    return VerbRecord(
        **msgspec.structs.asdict(from_view(v)), seq=seq, hash=digest, evicted=list(evicted)
    )


def place_record(answer: Any) -> PlaceRecord:
    """The record of a placement's answer (an api.wire.PlaceAnswer)."""
    kept = ("instance_id", "outcome", "generation", "seq", "hash", "evicted", "start_error")
    return PlaceRecord(instance=from_view(answer.instance), **{k: getattr(answer, k) for k in kept})


def from_timeline(e: TimelineEntry) -> TimelineRecord:
    """The record of one timeline entry (``-``, before the placement, becomes null)."""
    return TimelineRecord(
        seq=e.seq,
        ts_ns=e.ts_ns,
        kind=e.kind,
        source=e.source,
        frm=None if e.frm in ("", "-") else e.frm,
        to=e.to,
        reason=_none(e.reason),
    )


# ---------------------------------------------------------------- JSON Schema (2020-12)
_STR = {"type": "string"}
_INT = {"type": "integer"}
_OPT_STR = {"type": ["string", "null"]}
_OPT_INT = {"type": ["integer", "null"]}
_OPT_BOOL = {"type": ["boolean", "null"]}

EXIT_SCHEMA: dict[str, Any] = {
    "type": ["object", "null"],
    "additionalProperties": False,
    "required": ["pid", "exit_code", "signal", "reason", "ts_ns"],
    "properties": {
        "pid": _OPT_INT,
        "exit_code": _OPT_INT,
        "signal": _OPT_INT,
        "reason": _OPT_STR,
        "ts_ns": _OPT_INT,
    },
}

INSTANCE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "instance",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "source": {"enum": ["node", "chain"]},
        "instance_id": _STR,
        "role": _OPT_STR,
        "adapter": _OPT_STR,
        "flavor": _OPT_STR,
        "mode": _OPT_STR,
        "model": _OPT_STR,
        "endpoint": _OPT_STR,
        "placed_by": _STR,
        "generation": _INT,
        "lifecycle": {
            "enum": [
                "loaded",
                "starting",
                "running",
                "unhealthy",
                "restarting",
                "stopping",
                "stopped",
                "exited",
                "failed",
                "finished",
                "resting",
            ]
        },
        "desired": {"enum": ["running", "stopped"]},
        "reason": _OPT_STR,
        "since_ns": _INT,
        "pid": _OPT_INT,
        "restarts": _INT,
        "max_restarts": _OPT_INT,
        "health": _OPT_STR,
        "health_reason": _OPT_STR,
        "status": _OPT_STR,
        "status_detail": _OPT_STR,
        "reserved_bytes": _OPT_INT,
        "rss_bytes": _OPT_INT,
        "exposure": _OPT_STR,
        "last_exit": EXIT_SCHEMA,
        "last_seq": _INT,
        "on_demand": _OPT_BOOL,
        "idle_ttl_s": {"type": ["number", "null"]},
        "priority": _OPT_INT,
        "pinned": _OPT_BOOL,
        "resting": {"type": "boolean"},
        "last_use_ns": _OPT_INT,
        "busy": _OPT_BOOL,
        "rest_reason": _OPT_STR,
    },
}

INSTANCE_SCHEMA["required"] = list(INSTANCE_SCHEMA["properties"])

_STRS = {"type": "array", "items": _STR}
VERB_SCHEMA: dict[str, Any] = {
    **INSTANCE_SCHEMA,
    "title": "verb answer",
    "properties": {**INSTANCE_SCHEMA["properties"], "seq": _INT, "hash": _STR, "evicted": _STRS},
}
VERB_SCHEMA["required"] = list(VERB_SCHEMA["properties"])

_INSTANCE_ITEM = {k: v for k, v in INSTANCE_SCHEMA.items() if k not in ("$schema", "title")}

_ERROR_BODY: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["code", "message", "field"],
    "properties": {"code": _STR, "message": _STR, "field": _OPT_STR},
}

PLACE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "placement",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "instance_id": _STR,
        "outcome": {"enum": ["applied", "unchanged", "ignored"]},
        "generation": _INT,
        "instance": _INSTANCE_ITEM,
        "seq": _INT,
        "hash": _STR,
        "evicted": _STRS,
        "start_error": {**_ERROR_BODY, "type": ["object", "null"]},
    },
}
PLACE_SCHEMA["required"] = list(PLACE_SCHEMA["properties"])

TIMELINE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "timeline entry",
    "type": "object",
    "additionalProperties": False,
    "required": ["seq", "ts_ns", "kind", "source", "from", "to", "reason"],
    "properties": {
        "seq": _INT,
        "ts_ns": _INT,
        "kind": _STR,
        "source": _STR,
        "from": _OPT_STR,
        "to": _STR,
        "reason": _OPT_STR,
    },
}

ERROR_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "error",
    "type": "object",
    "additionalProperties": False,
    "required": ["error"],
    "properties": {"error": _ERROR_BODY},
}

VERIFY_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "chain verdict",
    "type": "object",
    "additionalProperties": False,
    "required": [
        "ok",
        "events",
        "head_seq",
        "head_hash",
        "node",
        "problem",
        "checkpoint",
        "proof",
        "warning",
        "anchor",
        "stored",
    ],
    "properties": {
        "ok": {"type": "boolean"},
        "events": _INT,
        "head_seq": _OPT_INT,
        "head_hash": _OPT_STR,
        "node": _OPT_STR,
        "problem": {
            "type": ["object", "null"],
            "additionalProperties": False,
            "required": ["seq", "reason", "detail"],
            "properties": {"seq": _INT, "reason": _STR, "detail": _STR},
        },
        "checkpoint": {
            "type": ["object", "null"],
            "additionalProperties": False,
            "required": [
                "ok",
                "tree_size",
                "root",
                "origin",
                "seq",
                "last_seq",
                "reason",
                "detail",
            ],
            "properties": {
                "ok": {"type": "boolean"},
                "tree_size": _INT,
                "root": _OPT_STR,
                "origin": _OPT_STR,
                "seq": _OPT_INT,
                "last_seq": _OPT_INT,
                "reason": _OPT_STR,
                "detail": _STR,
            },
        },
        "proof": {
            "type": ["object", "null"],
            "additionalProperties": False,
            "required": ["ok", "type", "detail"],
            "properties": {"ok": {"type": "boolean"}, "type": _STR, "detail": _STR},
        },
        "warning": _OPT_STR,
        "anchor": _STR,
        "stored": {
            "type": "object",
            "additionalProperties": False,
            "required": ["events", "head_seq"],
            "properties": {"events": _INT, "head_seq": _OPT_INT},
        },
    },
}

#: Each schema by the object's name (docs/cli.md).
SCHEMAS: dict[str, dict[str, Any]] = {
    "instance": INSTANCE_SCHEMA,
    "verb answer": VERB_SCHEMA,
    "placement": PLACE_SCHEMA,
    "timeline entry": TIMELINE_SCHEMA,
    "error": ERROR_SCHEMA,
    "chain verdict": VERIFY_SCHEMA,
    "node": NODE_SCHEMA,
}
