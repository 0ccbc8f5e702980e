"""Witness a node's checkpoints: the newest must extend the last one verified.

For each node the fleet keeps the last checkpoint it verified
(:meth:`FleetStore.verified`). :func:`check_node` fetches the node's newest
(``GET /v1/log/checkpoint``) and:

1. verifies its signature with the node's key from the fleet file (``pub``)
   or a key a rotation recorded in the node's chain links to it (the events
   the fleet stored; chain/keys.py ``trusted_keys``): a signature that fails is
   a key changed without a recorded rotation (``key_changed``);
2. decides, as a C2SP tlog-witness does (chain/witness_protocol.py ``judge``,
   with the RFC 6962 consistency proof from ``GET /v1/log/proof/consistency``),
   whether it extends the one verified: a smaller size is a truncation
   (``truncated``), another root at the same size or a proof that fails is a
   fork or rewrite (``forked``);
3. compares it with the events the fleet stored, where it holds its head: the
   head hash (and at the first verification the root of their hashes) must be
   the checkpoint's
   (``events_differ``: the node served events its checkpoints do not commit to).

Only then is it stored as the last verified. A failure is recorded
(:meth:`FleetStore.record_failure`) and returned; nothing is stored.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from infervisor.chain.checkpoint import Checkpoint, read_checkpoint_by
from infervisor.chain.errors import ChainError, NoteError
from infervisor.chain.keys import rotations_in, trusted_keys
from infervisor.chain.merkle import tree_root
from infervisor.chain.witness_protocol import (
    AddCheckpoint,
    TlogCheckpoint,
    WitnessState,
    judge,
)

from ..api.errors import ApiError, NodeUnavailable
from .config import NodeEntry
from .follow import Diverged
from .node_api import FleetClient
from .store import FleetStore, Verified

__all__ = ["CheckResult", "check_node", "diverged_failure"]

Outcome = Literal[
    "ok",
    "no_checkpoint",
    "truncated",
    "forked",
    "key_changed",
    "events_differ",
    "event_refused",
    "unreachable",
]


class CheckResult(msgspec.Struct, frozen=True, kw_only=True):
    """One node's check.

    Attributes:
        node: the fleet's name of the node.
        outcome: ``ok``; ``no_checkpoint`` (the node has signed none yet and
            none was verified: nothing to witness, not a failure); or what is
            wrong (``unreachable``: not checked; ``event_refused``: an event the
            node sent does not verify, not stored).
        verified_size: the size verified before this check (0: none).
        size: the size of the node's checkpoint (None: not read).
        detail: one line for an operator.
    """

    node: str
    outcome: Outcome
    verified_size: int
    size: int | None
    detail: str


def check_node(entry: NodeEntry, client: FleetClient, store: FleetStore) -> CheckResult:
    """Check `entry`'s newest checkpoint against the one verified (module doc).

    Raises:
        StoreError: the store cannot be read or written.
    """
    held = store.verified(entry.name)
    before = held.size if held is not None else 0
    try:
        note = client.checkpoint_note()
    except ApiError as e:
        if e.status == _NO_CHECKPOINT:
            return _none_signed(entry, store, before)
        return CheckResult(
            node=entry.name, outcome="unreachable", verified_size=before, size=None, detail=str(e)
        )
    keys = trusted_keys(entry.pub, rotations_in(store.rotations(entry.name)))
    try:
        cp = read_checkpoint_by(note, keys)
    except (ChainError, NoteError) as e:
        return _failed(
            entry,
            store,
            "key_changed",
            before,
            None,
            f"not signed by {entry.pub_path} or a key a recorded rotation links to it ({e})",
        )
    try:
        problem = _consistency(client, held, cp, note) or _against_events(
            entry, store, cp, held is None
        )
    except NodeUnavailable as e:  # gone between its checkpoint and its proof: not checked
        return CheckResult(
            node=entry.name, outcome="unreachable", verified_size=before, size=None, detail=str(e)
        )
    if problem is not None:
        return _failed(entry, store, problem[0], before, cp.tree_size, problem[1])
    if held is None or cp.tree_size > held.size:
        store.set_verified(entry.name, Verified(cp.tree_size, cp.root, note))
    detail = (
        f"size {cp.tree_size} is the verified size (unchanged)"
        if held is not None and cp.tree_size == held.size
        else f"size {cp.tree_size} extends the verified size {before}"
    )
    return CheckResult(
        node=entry.name, outcome="ok", verified_size=before, size=cp.tree_size, detail=detail
    )


#: ``GET /v1/log/checkpoint``'s status for a chain that has signed none yet.
_NO_CHECKPOINT = 404


def _none_signed(entry: NodeEntry, store: FleetStore, before: int) -> CheckResult:
    """A node with no checkpoint: nothing to witness yet, unless the fleet verified
    one before (then its checkpoints were deleted: ``truncated``, recorded)."""
    if before:
        detail = f"the node has no checkpoint now; the fleet verified size {before}"
        return _failed(entry, store, "truncated", before, 0, detail)
    detail = (
        "the node has signed no checkpoint yet (it signs one every [node] "
        "checkpoint_every_events or checkpoint_every_s, and at a clean stop)"
    )
    return CheckResult(
        node=entry.name, outcome="no_checkpoint", verified_size=0, size=None, detail=detail
    )


def diverged_failure(
    entry: NodeEntry, store: FleetStore, stored: int, found: Diverged | None
) -> CheckResult | None:
    """The failure (recorded) when the node's chain departs from the `stored` events
    the fleet holds of it (follow.py ``diverged``): ``truncated``, its head below
    them, or ``forked``, its event at the last stored seq another. None when
    `found` is None (it holds them).

    Raises:
        StoreError: the store cannot be read or written.
    """
    if found is None:
        return None
    held = store.verified(entry.name)
    before = held.size if held is not None else 0
    if found.outcome == "forked":
        detail = (
            f"the node's event {found.seq} is not the one the fleet stored: its chain was "
            f"rewritten or forked at or before seq {found.seq}"
        )
        return _failed(entry, store, "forked", before, None, detail)
    head = found.head if found.head is not None else -1
    detail = f"the node's head {head} is below the {stored} events the fleet stored"
    return _failed(entry, store, "truncated", before, head + 1, detail)


def _consistency(
    client: FleetClient, held: Verified | None, cp: Checkpoint, note: str
) -> tuple[Outcome, str] | None:
    """Does `cp` extend `held`? (judge: c2sp.org/tlog-witness steps 4 to 6)."""
    if held is None:
        return None
    proof: list[bytes] = []
    if cp.tree_size > held.size:
        try:
            proof = client.consistency(held.size, cp.tree_size)
        except NodeUnavailable:
            raise  # a node restarting is no fork (check_node: unreachable)
        except (ApiError, ValueError, msgspec.DecodeError) as e:
            return "forked", f"no consistency proof from {held.size} to {cp.tree_size}: {e}"
    request = AddCheckpoint(
        held.size, tuple(proof), note, TlogCheckpoint(cp.origin, cp.tree_size, cp.root, ())
    )
    refusal = judge(request, WitnessState(held.size, held.root))
    if refusal is None:
        return None
    if refusal.status == 400:
        return "truncated", (
            f"the node's checkpoint is of size {cp.tree_size}, smaller than the size "
            f"{held.size} the fleet verified"
        )
    return "forked", f"size {cp.tree_size} does not extend the verified size {held.size}: " + (
        refusal.reason
    )


def _against_events(
    entry: NodeEntry, store: FleetStore, cp: Checkpoint, first: bool
) -> tuple[Outcome, str] | None:
    """Do the events stored commit to `cp`? (only where the fleet holds its head event).

    The stored events are linked hash by hash, so the head hash commits to all of
    them; the root of their hashes is recomputed at the first verification only
    (after it, the consistency proof ties each root to that one)."""
    head = store.hash_at(entry.name, cp.tree_size - 1)
    if head is None:
        return None
    if head != cp.head_hash or (
        first and tree_root(store.hashes(entry.name, cp.tree_size)) != cp.root
    ):
        return "events_differ", (
            f"the events the fleet stored (seq 0 .. {cp.tree_size - 1}) do not make the "
            f"head or root of the node's checkpoint of size {cp.tree_size}"
        )
    return None


def _failed(  # noqa: PLR0917 - the result's fields, in its order
    entry: NodeEntry,
    store: FleetStore,
    outcome: Outcome,
    before: int,
    size: int | None,
    detail: str,
) -> CheckResult:
    store.record_failure(entry.name, outcome, detail)
    return CheckResult(
        node=entry.name, outcome=outcome, verified_size=before, size=size, detail=detail
    )
