"""What a chain's stored checkpoints tell with no node key known: their signatures
cannot be checked, but the sizes and roots they state can be compared with the
chain, and a disagreement shows that the events or the checkpoint were altered
since it was stored (docs/chain-format.md, "Verifying without the node key").
Which of the two only the key tells. Used by :mod:`.trust`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from infervisor.chain.checkpoint import parse_checkpoint_text, roots_at
from infervisor.chain.checkpoint_store import StoredCheckpoint
from infervisor.chain.errors import CheckpointError, NoteError
from infervisor.chain.locate import last_of
from infervisor.chain.note import split_note

__all__ = ["Found", "claims_beyond", "roots_disagree"]


class Found(NamedTuple):
    """A disagreement: the first seq affected, a reason (``truncated``, ``rewritten``,
    ``forked``), a detail for an operator, and the last seq of the range the first
    event that differs lies in (None: ``seq`` itself)."""

    seq: int
    reason: str
    detail: str
    last_seq: int | None = None


def claims_beyond(stored: Sequence[StoredCheckpoint], events: int) -> Found | None:
    """With no node key, a stored checkpoint still tells a size: one beyond the
    chain's end shows the chain is not what the node stored (its events were
    removed, or the checkpoint was written by someone else), and comparing two
    sizes needs no key. Which of the two only the key tells."""
    beyond = max((row.tree_size for row in stored), default=0)
    if beyond <= events:
        return None
    detail = (
        f"the chain has {events} events but a stored checkpoint covers {beyond} "
        f"(its signature not checked: no node key known): seq {events}..{beyond - 1} "
        "were removed, or the checkpoint is not the node's; give the node's key to tell which"
    )
    return Found(events, "truncated", detail)


def roots_disagree(
    stored: Sequence[StoredCheckpoint], load_hashes: Callable[[], Sequence[bytes]]
) -> Found | None:
    """With no node key, a stored checkpoint still tells a root: one that the chain's
    prefix of its size does not have shows that the events, or the checkpoint, were
    altered since it was stored (a file from ``chain backup`` rehashed after an edit
    read "ok" without node.pub beside it). Comparing roots needs no key; which of the
    two was altered only the key tells. A stored checkpoint that cannot be read is
    left to the key's check, as its signature is."""
    claims: list[tuple[int, bytes]] = []
    for row in stored:
        try:
            _, size, root, _ = parse_checkpoint_text(split_note(row.note)[0])
        except (CheckpointError, NoteError):
            continue
        claims.append((size, root))
    hashes = load_hashes()
    roots = roots_at(hashes, [size for size, _ in claims if 0 < size <= len(hashes)])
    matched = 0  # the largest size whose stored root the chain still has
    for size, root in sorted(claims):
        if size not in roots:
            continue
        if roots[size] == root:
            matched = size
            continue
        reason = "rewritten" if len(hashes) == size else "forked"
        detail = (
            f"a stored checkpoint (its signature not checked: no node key known) says the "
            f"root of the first {size} events is {root.hex()}; the chain's is "
            f"{roots[size].hex()}: an event in seq {matched}..{size - 1}, or the checkpoint, "
            "was altered since it was stored; give the node's key to tell which"
        )
        return Found(matched, reason, detail, last_of(matched, size - 1))
    return None
