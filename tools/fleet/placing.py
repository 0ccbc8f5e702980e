"""Choose the node for a placement: one that has the model and room for it.

A node qualifies when it answers, is not cordoned (``GET /v1/node``
``cordon``), its registry has the spec's model (``GET /v1/models``) and it
has room: its memory budget less what is reserved (``inventory``
``memory_budget_bytes - memory_reserved_bytes``), else its available memory,
is at least the model's size (when the node reports both), and its
``inventory`` ``allowed_ports`` (empty: any) take the spec's port. Among those the one
with the most room wins; ties go to the first in the fleet file. Every node
passed over is given with its reason.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from ..api.errors import ApiError
from .config import FleetConfig, NodeEntry
from .node_api import Inventory, client_of

__all__ = ["Candidate", "choose"]


class Candidate(NamedTuple):
    """A node weighed for a placement: its room in bytes (None: unknown) or why not."""

    entry: NodeEntry
    room_bytes: int | None
    refused: str | None


def choose(config: FleetConfig, model: str | None, port: int, timeout_s: float) -> list[Candidate]:
    """Weigh every node for `model` (None: an adopted server, no model needed) on
    `port`; the chosen node first, then the others by room, those refused last."""
    with ThreadPoolExecutor(max(1, min(16, len(config.nodes)))) as pool:
        weighed = list(pool.map(lambda e: _weigh(e, model, port, timeout_s), config.nodes))
    fit = [c for c in weighed if c.refused is None]
    fit.sort(key=lambda c: -(c.room_bytes if c.room_bytes is not None else -1))
    return fit + [c for c in weighed if c.refused is not None]


def _weigh(entry: NodeEntry, model: str | None, port: int, timeout_s: float) -> Candidate:
    try:
        with client_of(entry, timeout_s=timeout_s) as client:
            info = client.node_view()
            models = client.models().models if model is not None else []
    except ApiError as e:
        why = "it has no GET /v1/models" if getattr(e, "status", 0) == 404 else str(e)
        return Candidate(entry, None, why)
    if info.cordon != "none":
        return Candidate(entry, None, f"it is {info.cordon}")
    if info.inventory is not None and not info.inventory.allows_port(port):
        ranges = ", ".join(f"{lo}-{hi}" for lo, hi in info.inventory.allowed_ports)
        return Candidate(entry, None, f"port {port} is outside its allowed ports {ranges}")
    size: int | None = None
    if model is not None:
        found = next((m for m in models if m.name == model), None)
        if found is None:
            return Candidate(entry, None, f"its registry has no model {model!r}")
        size = found.size_bytes
    room = _room(info.inventory)
    if room is not None and size is not None and room < size:
        return Candidate(entry, room, f"{room:,} bytes free, the model takes {size:,}")
    return Candidate(entry, room, None)


def _room(inventory: Inventory | None) -> int | None:
    """Bytes a new server may take: the budget less reservations, else what is available."""
    if inventory is None:
        return None
    if inventory.memory_budget_bytes is not None:
        return inventory.memory_budget_bytes - inventory.memory_reserved_bytes
    return inventory.memory_available_bytes
