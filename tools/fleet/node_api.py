"""A client of one node of the fleet: the API client plus the reads the fleet
makes that the command line's client does not: ``GET /v1/node`` read leniently
(:class:`NodeView`: a field a node of an older version lacks is read as absent,
never guessed), ``GET /v1/log/checkpoint`` (a signed note) and
``GET /v1/log/proof/consistency`` (docs/api.md).
"""

from __future__ import annotations

import msgspec

from ..api.client import ApiClient
from .config import NodeEntry

__all__ = ["FleetClient", "Inventory", "NodeView", "client_of"]


class Inventory(msgspec.Struct, frozen=True, kw_only=True):
    """The part of ``GET /v1/node``'s ``inventory`` a placement weighs (bytes;
    ``allowed_ports``: the inclusive ``[low, high]`` port ranges an instance may
    use, empty: any; tools/api/inventory.py)."""

    cpu_count: int | None = None
    memory_total_bytes: int | None = None
    memory_available_bytes: int | None = None
    memory_budget_bytes: int | None = None
    memory_reserved_bytes: int = 0
    adapters: list[str] = msgspec.field(default_factory=list)
    allowed_ports: list[tuple[int, int]] = msgspec.field(default_factory=list)

    def allows_port(self, port: int) -> bool:
        """Whether an instance may use `port` here (no ranges: any port)."""
        return not self.allowed_ports or any(lo <= port <= hi for lo, hi in self.allowed_ports)


class NodeView(msgspec.Struct, frozen=True, kw_only=True):
    """What the fleet reads of ``GET /v1/node``: its id, head, cordon and inventory."""

    node_id: str
    head_seq: int
    phase: str = "open"
    cordon: str = "none"
    inventory: Inventory | None = None


class _Proof(msgspec.Struct, frozen=True):
    proof: list[str]


class FleetClient(ApiClient):
    """:class:`ApiClient` of one node over TCP, with the fleet's extra reads."""

    def __enter__(self) -> FleetClient:
        return self

    def node_view(self) -> NodeView:
        """``GET /v1/node`` as the fleet reads it."""
        return self._call("GET", "/node", NodeView)

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
