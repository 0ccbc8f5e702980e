"""One view across the fleet's nodes: each node's instances, read live from its API.

:func:`gather` asks every node at once (one thread each, bounded by the
client's timeout) for ``GET /v1/node`` and ``GET /v1/instances``; a node that
does not answer is shown as such, never left out. :func:`table_rows` makes
the rows of ``infervisor fleet status`` (node, instance, state, model,
memory).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import msgspec

from infervisor.replay.views import InstanceView

from ..api.errors import ApiError
from .config import FleetConfig, NodeEntry
from .node_api import client_of

__all__ = ["COLUMNS", "FleetStatus", "NodeStatus", "gather", "table_rows"]

COLUMNS = ("NODE", "INSTANCE", "STATE", "MODEL", "MEMORY MiB")
_MIB = 1024 * 1024


class NodeStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One node as `fleet status --json` shows it.

    Attributes:
        node: the fleet's name of the node; url: its API.
        up: whether it answered; error: why not (None when up).
        node_id, head_seq, cordon: its ``GET /v1/node`` (None when down).
        instances: its ``GET /v1/instances``, as the node sent it.
    """

    node: str
    url: str
    up: bool
    error: str | None = None
    node_id: str | None = None
    head_seq: int | None = None
    cordon: str | None = None
    instances: list[InstanceView] = msgspec.field(default_factory=list)


class FleetStatus(msgspec.Struct, frozen=True, kw_only=True):
    """`fleet status --json`: every node of the file, in its order."""

    nodes: list[NodeStatus]


def gather(config: FleetConfig, timeout_s: float) -> FleetStatus:
    """Every node's status, asked in parallel; never raises for a node that fails."""
    with ThreadPoolExecutor(max(1, min(16, len(config.nodes)))) as pool:
        found = list(pool.map(lambda e: _one(e, timeout_s), config.nodes))
    return FleetStatus(nodes=found)


def _one(entry: NodeEntry, timeout_s: float) -> NodeStatus:
    try:
        with client_of(entry, timeout_s=timeout_s) as client:
            info = client.node_view()
            views = client.list()
    except ApiError as e:
        return NodeStatus(node=entry.name, url=entry.url, up=False, error=str(e))
    return NodeStatus(
        node=entry.name,
        url=entry.url,
        up=True,
        node_id=info.node_id,
        head_seq=info.head_seq,
        cordon=info.cordon,
        instances=views,
    )


def table_rows(status: FleetStatus) -> list[tuple[str, ...]]:
    """The table's rows: one per instance; a node without any, or down, one row."""
    rows: list[tuple[str, ...]] = []
    for node in status.nodes:
        if not node.up:
            rows.append((node.node, "-", "unreachable", "-", "-"))
            continue
        if not node.instances:
            rows.append((node.node, "-", "(no instances)", "-", "-"))
        for v in node.instances:
            state = v.lifecycle if v.lifecycle == v.desired else f"{v.lifecycle}>{v.desired}"
            rows.append((node.node, v.instance_id, state, v.model or "-", _memory(v)))
    return rows


def _memory(v: InstanceView) -> str:
    """Resident memory observed, else what the ledger reserves for it (MiB)."""
    size = v.rss_bytes if v.rss_bytes is not None else v.reserved_bytes
    return f"{size / _MIB:.0f}" if size else "-"
