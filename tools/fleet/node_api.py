"""A client of one node of the fleet: the API client plus the routes the fleet
reads that the command line's client does not call.

The wire shapes are those of docs/api.md and /work/notes' issue-19 contracts:
``GET /v1/models`` (``{"models": [{"name", "format", "size_bytes", "digest"}]}``),
``GET /v1/node``'s ``inventory``, ``POST /v1/node/drain`` (``CordonAnswer``),
``GET /v1/log/checkpoint`` (a signed note) and ``GET /v1/log/proof/consistency``.
Fields a node of an older version lacks are read as absent, never guessed.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..api.client import ApiClient
from .config import NodeEntry

__all__ = [
    "CordonAnswer",
    "FleetClient",
    "Inventory",
    "ModelEntry",
    "NodeView",
    "client_of",
]


class ModelEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One model of a node's registry (``GET /v1/models``)."""

    name: str
    format: str = ""
    size_bytes: int | None = None
    digest: str | None = None


class _Models(msgspec.Struct, frozen=True):
    models: list[ModelEntry]


class Inventory(msgspec.Struct, frozen=True, kw_only=True):
    """The part of ``GET /v1/node``'s ``inventory`` a placement weighs (bytes)."""

    cpu_count: int | None = None
    memory_total_bytes: int | None = None
    memory_available_bytes: int | None = None
    memory_budget_bytes: int | None = None
    memory_reserved_bytes: int = 0
    adapters: list[str] = msgspec.field(default_factory=list)


class NodeView(msgspec.Struct, frozen=True, kw_only=True):
    """What the fleet reads of ``GET /v1/node``: its id, head, cordon and inventory."""

    node_id: str
    head_seq: int
    phase: str = "open"
    cordon: str = "none"
    inventory: Inventory | None = None


class CordonAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /v1/node/drain``'s answer: the cordon now and what the drain stopped."""

    cordon: str
    stopped: list[str] = msgspec.field(default_factory=list)
    seq: int = -1
    hash: str = ""


class _Proof(msgspec.Struct, frozen=True):
    proof: list[str]


class FleetClient(ApiClient):
    """:class:`ApiClient` of one node over TCP, with the fleet's extra reads."""

    def __enter__(self) -> FleetClient:
        return self

    def node_view(self) -> NodeView:
        """``GET /v1/node`` as the fleet reads it."""
        return self._call("GET", "/node", NodeView)

    def models(self) -> list[ModelEntry]:
        """``GET /v1/models``: the node's registry."""
        return self._call("GET", "/models", _Models).models

    def drain(self, reason: str | None = None) -> CordonAnswer:
        """``POST /v1/node/drain``: cordon, and stop what controllers placed."""
        body: dict[str, Any] = {"reason": reason}
        return self._call("POST", "/node/drain", CordonAnswer, body, wait="stop")

    def checkpoint_note(self) -> str:
        """``GET /v1/log/checkpoint``: the newest signed checkpoint note (text)."""
        return self._send("GET", "/log/checkpoint").content.decode("utf-8", "replace")

    def consistency(self, old: int, new: int) -> list[bytes]:
        """``GET /v1/log/proof/consistency``: the RFC 6962 proof from `old` to `new`.

        Raises:
            ValueError: a proof hash is not hex.
        """
        answer = self._send("GET", "/log/proof/consistency", params={"old": old, "new": new})
        return [bytes.fromhex(h) for h in msgspec.json.decode(answer.content, type=_Proof).proof]


def client_of(entry: NodeEntry, *, control: bool = False, timeout_s: float = 30.0) -> FleetClient:
    """A client of the node `entry` names: its URL, and its read token (`control`:
    the token that places and drains)."""
    token = entry.control_token if control else entry.token
    return FleetClient(url=entry.url, token=token, timeout_s=timeout_s)
