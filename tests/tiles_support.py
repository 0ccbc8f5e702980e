"""Chains of many events, written quickly with the chain's own writer, for the
tiles, log API and pull tests and the pull bench."""

from __future__ import annotations

import time
from pathlib import Path

from infervisor.chain.checkpoint import load_or_create_signer
from infervisor.chain.checkpoint_store import Checkpointer
from infervisor.chain.records import EventDraft
from infervisor.chain.sqlite import SqliteChain
from infervisor.replay.events import LeaseRenewed, encode_event
from infervisor.replay.state import Stamp


def drafts(count: int, controller: str = "ctl-bench") -> list[EventDraft]:
    """`count` node.lease_renewed events (any replay reads them)."""
    now = time.time_ns()
    return [
        EventDraft(
            ts_ns=now + i,
            source="controller",
            kind="node.lease_renewed",
            subject="",
            payload=encode_event(
                LeaseRenewed(
                    controller=controller,
                    at=Stamp(wall_ns=now + i, mono_s=float(i), boot_id="bench"),
                )
            ),
        )
        for i in range(count)
    ]


def grow_chain(data: Path, node_id: str, count: int, *, batch: int = 5000) -> int:
    """Append `count` events to the chain in `data` (created if new) and sign a
    checkpoint at the end; return the chain's size."""
    data.mkdir(parents=True, exist_ok=True)
    signer = load_or_create_signer(data, node_id)
    chain = SqliteChain.open(data / "chain.db", node_id)
    checkpointer = Checkpointer(data / "chain.db", node_id, signer, every_events=10**9)
    try:
        left = count
        while left > 0:
            stored = chain.append_many(drafts(min(batch, left)))
            checkpointer.observe(stored)
            left -= len(stored)
        checkpointer.close()
        return chain.head().seq + 1
    finally:
        chain.close()
