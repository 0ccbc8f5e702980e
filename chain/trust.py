"""One trust policy for every reader of a chain (docs/chain-format.md,
"Cosignatures and the trust policy").

``chain verify``, ``chain verify-bundle``, ``replay``, ``timeline``,
``events``, ``audit`` and the node's boot check all ask :func:`judge` the
same questions of a chain whose rows already verified (chain/verify.py):

1. The ``events`` and ``checkpoints`` tables' append-only triggers are as
   made (the node refuses to open a chain otherwise), and the checkpoints
   table is there when a node key is known.
2. Every stored checkpoint's signature verifies with a trusted node key (the
   key given, else the data directory's node.pub, and every key a recorded
   rotation links to it: chain/keys.py ``trusted_keys``). A bad or foreign
   signature is a failure, never skipped for an older checkpoint.
3. The chain matches every checkpoint (the stored ones and an external one
   given by the caller): a chain shorter than any is "truncated", another
   root "rewritten" / "forked", another head hash "head mismatch".
4. Cosignatures (c2sp.org/tlog-cosignature) stored beside the checkpoints
   (chain/cosignature_store.py) verify against the checkpoint they are of;
   one of a policy witness that does not is a failure (the checkpoint was
   re-signed after it was cosigned). A cosignature whose checkpoint is gone
   shows checkpoints were deleted.
5. A clean stop always signs a checkpoint covering its ``node.stopped``
   event: a chain with a node key whose last ``node.stopped`` event no stored
   checkpoint covers lost its checkpoints.

The verdict carries one line saying how far it is anchored outside the node:
``anchored: 2 of 2 witnesses at size 18,204``, ``anchored: checkpoint FILE at
size 55``, ``unanchored: no checkpoint held outside this node`` or
``unanchored: 1 of 2 witnesses cosigned, quorum 2``. Without an anchor the
node's own key vouches for the checkpoints, and whoever holds node.key can
rewrite the chain and re-sign them all: "unanchored" says so.

Where a change is located: a checkpoint's root commits to every event below
its size, but only a copy of the events can say which one differs. From
checkpoints alone the first event that differs lies between the largest
honest checkpoint the chain still matches (events below it are unchanged) and
the smallest one it does not (the change is below it); :func:`_locate` names
that range, a single seq when the two are adjacent. Honest here means as
trusted as the checkpoint that failed: when an external or witnessed
checkpoint fails, the node-signed ones, which a rewriter may have re-signed,
do not narrow it.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from infervisor.chain.anchor import anchor as anchored_by
from infervisor.chain.anchor import shortfall
from infervisor.chain.checkpoint import (
    PUBLIC_KEY_FILE,
    Checkpoint,
    compare,
    load_verifier,
    read_checkpoint_by,
    roots_at,
)
from infervisor.chain.checkpoint_store import (
    StoredCheckpoint,
    event_hashes,
    frontier_of,
    stored_checkpoints,
    trigger_problems,
)
from infervisor.chain.checkpoint_store import has_table as has_checkpoints
from infervisor.chain.connect import connect_reader, translated
from infervisor.chain.cosignature import (
    Cosignature,
    WitnessPolicy,
    cosignatures_of,
    with_cosignatures,
)
from infervisor.chain.cosignature_store import has_table as has_cosignatures
from infervisor.chain.cosignature_store import lines_by_size
from infervisor.chain.errors import CheckpointError, CheckpointMismatch, NoteError
from infervisor.chain.keys import KEY_ROTATED_KIND, rotations_in, trusted_keys
from infervisor.chain.locate import beside, bounds, last_of
from infervisor.chain.note import Verifier
from infervisor.chain.schema import trigger_problems as event_trigger_problems
from infervisor.chain.unkeyed import claims_beyond, roots_disagree

__all__ = ["Evidence", "Problem", "Verdict", "assess", "judge", "node_key", "read_evidence"]

STOPPED_KIND = "node.stopped"
"""Kind of the event a clean stop appends before it signs its last checkpoint."""


class Problem(NamedTuple):
    """Why a chain fails the trust policy: the first seq affected, a reason, a detail.

    ``last_seq``: when the evidence bounds the first event that differs only to a
    range (:func:`_locate`), its last seq: the change is in ``seq..last_seq``
    (None: ``seq`` itself is named)."""

    seq: int
    reason: str
    detail: str
    last_seq: int | None = None


class Verdict(NamedTuple):
    """What :func:`judge` found.

    Attributes:
        problem: the failure, or None.
        anchor: the one-line anchor statement.
        anchored: True when a checkpoint held outside the node vouches for the chain.
        checkpoints: stored checkpoints whose signature verified.
        latest_size: tree size of the latest checkpoint checked (0: none).
        anchored_size: tree size the anchor covers (0: unanchored).
        keys_checked: False when checkpoints are stored but no key was known.
        latest: the latest stored checkpoint whose signature verified, or None.
        shortfall: how the witnesses given fall short of the quorum (chain/anchor.py
            ``shortfall``), or None: met, or no witnesses given.
    """

    problem: Problem | None
    anchor: str
    anchored: bool
    checkpoints: int
    latest_size: int
    anchored_size: int
    keys_checked: bool
    latest: Checkpoint | None = None
    shortfall: str | None = None

    @property
    def ok(self) -> bool:
        """True when the chain passes."""
        return self.problem is None


class Evidence(NamedTuple):
    """What a chain file holds besides its rows, read in the reader's snapshot."""

    stored: list[StoredCheckpoint]
    cosignatures: dict[int, list[str]]
    rotations: list[tuple[str, str, str]]
    last_stop: int | None
    triggers: list[str]
    table: bool
    events: int = 0
    heads: dict[int, bytes] = {}  # noqa: RUF012 - a NamedTuple default, never mutated
    frontier_roots: dict[int, bytes] = {}  # noqa: RUF012 - as above


def read_evidence(conn: sqlite3.Connection) -> Evidence:
    """Read checkpoints, cosignatures, rotations and the last clean stop from `conn`.

    Raises:
        sqlite3.Error: the caller translates it (chain.connect ``translated``).
    """
    table = has_checkpoints(conn)
    rows = conn.execute(
        "SELECT kind, payload FROM events WHERE kind = ? ORDER BY seq", (KEY_ROTATED_KIND,)
    ).fetchall()
    stop = conn.execute("SELECT max(seq) FROM events WHERE kind = ?", (STOPPED_KIND,)).fetchone()
    stored = stored_checkpoints(conn)
    (last,) = conn.execute("SELECT coalesce(max(seq), -1) FROM events").fetchone()
    heads: dict[int, bytes] = {}
    frontiers: dict[int, bytes] = {}
    for row in stored:
        head = conn.execute(
            "SELECT hash FROM events WHERE seq = ?", (row.tree_size - 1,)
        ).fetchone()
        tree = frontier_of(conn, row.tree_size)
        if head is not None and isinstance(head[0], bytes):
            heads[row.tree_size] = head[0]
        if tree is not None:
            frontiers[row.tree_size] = tree.root()
    return Evidence(
        stored=stored,
        cosignatures=lines_by_size(conn) if has_cosignatures(conn) else {},
        rotations=rotations_in((k, _bytes(p)) for k, p in rows),
        last_stop=stop[0] if stop is not None and isinstance(stop[0], int) else None,
        triggers=(trigger_problems(conn) if table else [])
        + [f"events {p}" for p in event_trigger_problems(conn)],
        table=table,
        events=int(last) + 1 if isinstance(last, int) else 0,
        heads=heads,
        frontier_roots=frontiers,
    )


def _bytes(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


class _Point(NamedTuple):
    """One piece of evidence about the chain's prefix of `size` events."""

    size: int
    mismatch: CheckpointMismatch | None
    trusted: bool  # held outside the node (external, or cosigned by a policy witness)


def judge(
    evidence: Evidence,
    load_hashes: Callable[[], Sequence[bytes]],
    key: Verifier | None,
    policy: WitnessPolicy | None = None,
    external: tuple[Checkpoint, str] | None = None,
) -> Verdict:
    """Judge a chain whose rows verified against its checkpoints and cosignatures.

    Args:
        evidence: :func:`read_evidence` of the chain.
        load_hashes: returns the stored hash of every event, seq order; called
            only when a checkpoint's stored frontier and head do not already
            show it matches (as a boot of a healthy chain finds), so the
            check reads no event below the checkpoints then.
        key: the node key trusted (the one given, else node.pub); None: none known.
        policy: the witnesses trusted and their quorum (None or empty: none).
        external: a checkpoint held outside the node whose signature the caller
            verified, and how to name it (say, its file name).

    Returns:
        The verdict; its ``problem`` is the first failure, in the order of the
        module docstring.
    """
    keys = [] if key is None else trusted_keys(key, evidence.rotations)
    problem, checked = _signatures(evidence, keys)
    count = evidence.events
    cosigned, cos_problem, resigned = _cosignatures(evidence, checked, policy, count)
    problem = problem or cos_problem or _stops(evidence, checked, keys)
    points = [_resigned(size, why, count) for size, why in resigned]
    if external is None and not resigned and all(_held(evidence, cp) for cp in checked):
        points += [_Point(cp.tree_size, None, cp.tree_size in cosigned) for cp in checked]
    else:
        hashes = load_hashes()
        extra = [] if external is None else [external[0]]
        roots = roots_at(hashes, [cp.tree_size for cp in [*checked, *extra]])  # one pass
        for cp in checked:
            mismatch = _mismatch(hashes, roots, cp)
            points.append(_Point(cp.tree_size, mismatch, cp.tree_size in cosigned))
        if external is not None:
            points.append(
                _Point(external[0].tree_size, _mismatch(hashes, roots, external[0]), True)
            )
    if problem is None:
        problem = _locate(points) or _unkeyed(evidence, keys, load_hashes)
    elif external is not None and (found := _locate(points[-1:])) is not None:
        finding = f"{found.reason} at seq {found.seq}: {found.detail}"
        problem = problem._replace(detail=beside(problem.detail, *external, finding))
    anchor, size = anchored_by(cosigned, policy, external)
    short = shortfall(cosigned, policy, len(checked))
    latest = max([c.tree_size for c in checked], default=0)
    keys_checked = bool(keys) or not evidence.stored
    if not keys_checked and problem is None:
        anchor += f"; {len(evidence.stored)} stored checkpoints not checked: no node key known"
    newest = max(checked, key=lambda c: c.tree_size, default=None)
    return Verdict(
        problem, anchor, size > 0, len(checked), latest, size, keys_checked, newest, short
    )


def _unkeyed(
    evidence: Evidence, keys: list[Verifier], load_hashes: Callable[[], Sequence[bytes]]
) -> Problem | None:
    """What the stored checkpoints tell with no node key (:mod:`.unkeyed`)."""
    if keys or not evidence.stored:
        return None  # the signed checkpoints were judged above
    found = claims_beyond(evidence.stored, evidence.events) or roots_disagree(
        evidence.stored, load_hashes
    )
    return None if found is None else Problem(*found)


def _signatures(
    evidence: Evidence, keys: list[Verifier]
) -> tuple[Problem | None, list[Checkpoint]]:
    """Every stored checkpoint's signature (a bad one is a failure, not skipped)."""
    if evidence.triggers:  # the events' own first: their rows may have been removed
        events = evidence.triggers[-1].startswith("events ")
        detail = (
            f"the {'events' if events else 'checkpoints'} table's append-only triggers were "
            f"changed outside infervisor ({'; '.join(evidence.triggers)}): "
            f"{'events' if events else 'checkpoints'} may have been removed"
        )
        return Problem(0, f"{'event' if events else 'checkpoint'} triggers changed", detail), []
    if not keys:
        return None, []
    if not evidence.table:
        detail = (
            "the node has a key, so it made a checkpoints table, but the chain has none: "
            "it was dropped, and with it what shows truncation and rewriting"
        )
        return Problem(0, "checkpoints dropped", detail), []
    checked: list[Checkpoint] = []
    for row in evidence.stored:
        try:
            cp = read_checkpoint_by(row.note, keys)
        except CheckpointError as e:
            detail = f"the stored checkpoint of tree size {row.tree_size} does not verify: {e}"
            return Problem(row.tree_size - 1, "checkpoint signature", detail), checked
        if cp.tree_size != row.tree_size:
            detail = f"the row says tree size {row.tree_size}, the signed note {cp.tree_size}"
            return Problem(row.tree_size - 1, "checkpoint altered", detail), checked
        checked.append(cp)
    return None, checked


def _cosignatures(
    evidence: Evidence, checked: list[Checkpoint], policy: WitnessPolicy | None, events: int
) -> tuple[dict[int, list[Cosignature]], Problem | None, list[tuple[int, str]]]:
    """Policy cosignatures per checked size; a deleted checkpoint; re-signed sizes."""
    by_size = {cp.tree_size: cp for cp in checked}
    stored = {row.tree_size for row in evidence.stored}
    for size in sorted(evidence.cosignatures):
        if size not in stored:
            witnesses = sorted({line.split(" ")[1] for line in evidence.cosignatures[size]})
            detail = (
                f"the cosignatures table holds {', '.join(witnesses)}'s cosignature of tree size "
                f"{size} but no checkpoint of that size is stored (the chain has {events} "
                "events): checkpoints were deleted"
            )
            return {}, Problem(min(size, events), "checkpoints deleted", detail), []
    cosigned: dict[int, list[Cosignature]] = {}
    resigned: list[tuple[int, str]] = []
    keys = () if policy is None else policy.keys
    for size, lines in sorted(evidence.cosignatures.items()):
        cp = by_size.get(size)
        if cp is None or not keys:
            continue
        try:
            found = cosignatures_of(with_cosignatures(cp.note, lines), keys)
        except NoteError as e:
            resigned.append(
                (
                    size,
                    f"a witness cosigned another checkpoint of tree size {size} than the one "
                    f"stored ({e}): the checkpoint was re-signed after it was cosigned",
                )
            )
            continue
        if found:
            cosigned[size] = found
    return cosigned, None, resigned


def _held(evidence: Evidence, cp: Checkpoint) -> bool:
    """The chain still holds `cp` by its stored frontier (unsigned: it counts only when
    it gives the signed root) and the stored hash at its head (which, the rows'
    links verified, fixes every event below it)."""
    size = cp.tree_size
    return (
        size <= evidence.events
        and evidence.heads.get(size) == cp.head_hash
        and evidence.frontier_roots.get(size) == cp.root
    )


def _mismatch(
    hashes: Sequence[bytes], roots: dict[int, bytes], cp: Checkpoint
) -> CheckpointMismatch | None:
    """`compare` with the roots computed once for every checkpoint (`roots_at`)."""
    size = cp.tree_size
    if len(hashes) < size or roots.get(size) == cp.root:
        return compare(hashes, cp) if len(hashes) < size else _head(hashes, cp)
    reason = "rewritten" if len(hashes) == size else "forked"
    what = (
        "the chain was rewritten (rehashed) since it was signed"
        if reason == "rewritten"
        else f"the chain ({len(hashes)} events) does not extend what was signed: a fork"
    )
    detail = (
        f"the root of its first {size} events is {roots[size].hex()}, the checkpoint signed "
        f"{cp.root.hex()}: {what}"
    )
    return CheckpointMismatch(0, reason, detail)


def _head(hashes: Sequence[bytes], cp: Checkpoint) -> CheckpointMismatch | None:
    at = cp.tree_size - 1
    if hashes[at] == cp.head_hash:
        return None
    detail = (
        f"the event at seq {at} has hash {hashes[at].hex()}, the checkpoint names "
        f"{cp.head_hash.hex()}"
    )
    return CheckpointMismatch(at, "head mismatch", detail)


def _resigned(size: int, why: str, events: int) -> _Point:
    """A witness cosigned another checkpoint of `size` than the stored one."""
    reason = "truncated" if events < size else "rewritten" if events == size else "forked"
    return _Point(size, CheckpointMismatch(min(events, size - 1), reason, why), True)


def _stops(evidence: Evidence, checked: list[Checkpoint], keys: list[Verifier]) -> Problem | None:
    """A clean stop signs a checkpoint covering its node.stopped event."""
    if not keys or evidence.last_stop is None or not evidence.table:
        return None
    latest = max((cp.tree_size for cp in checked), default=0)
    if latest > evidence.last_stop:
        return None
    detail = (
        f"seq {evidence.last_stop} is a clean stop ({STOPPED_KIND}), after which the node "
        f"always signs a checkpoint of at least {evidence.last_stop + 1} events, but the "
        f"latest stored checkpoint covers {latest}: checkpoints were deleted"
    )
    return Problem(latest, "checkpoints deleted", detail)


def _locate(points: Sequence[_Point]) -> Problem | None:
    """The failure of the most trusted evidence, located as far as the evidence allows.

    The reason is the largest failing checkpoint's (a truncation names the
    first missing event); the first event that differs is at or after the
    largest matching point of the same trust and below the smallest failing one.
    """
    # Node-signed checkpoints narrow a failure only when some of them fail too: a
    # rewriter who re-signed them would have made them all match.
    honest_store = any(p.mismatch is not None for p in points if not p.trusted)
    for tier in (True, False):
        same = [p for p in points if p.trusted or not tier or honest_store]
        failing = sorted((p for p in same if p.mismatch is not None), key=lambda p: p.size)
        if not failing:
            continue
        first, last = failing[0], failing[-1]
        assert first.mismatch is not None
        assert last.mismatch is not None
        if last.mismatch.reason == "truncated":
            return Problem(last.mismatch.seq, "truncated", last.mismatch.detail)
        good = [p.size for p in same if p.mismatch is None and p.size < first.size]
        low, high = max(good, default=0), first.size - 1
        detail = _detail(last.mismatch.detail)
        return Problem(
            low,
            last.mismatch.reason,
            f"{detail}; {bounds(low, high, bool(good))}",
            last_of(low, high),
        )
    return None


def _detail(text: str) -> str:
    """compare()'s detail without its own location clause (locate() gives one)."""
    return text.split("; the change is ", 1)[0]


def node_key(path: str | os.PathLike[str], key: str | None = None) -> Verifier | None:
    """The node key a reader trusts: `key` (a key string or file) if given, else
    node.pub beside the chain file at `path`, else None.

    Raises:
        CheckpointError: `key` (or node.pub) is not a verifier key.
    """
    if key is None:
        beside = Path(os.fspath(path)).parent / PUBLIC_KEY_FILE
        if not beside.is_file():
            return None
        return load_verifier(beside, None)
    return load_verifier(key)


def assess(
    path: str | os.PathLike[str],
    key: Verifier | None,
    policy: WitnessPolicy | None = None,
    external: tuple[Checkpoint, str] | None = None,
) -> Verdict:
    """:func:`judge` the chain file at `path` (its rows verified by the caller),
    reading its evidence and event hashes in one snapshot.

    Raises:
        ChainIOError: the file cannot be read.
    """
    name = os.fspath(path)
    conn = connect_reader(name, text_as_bytes=True)
    try:
        with translated(name, "read"):
            conn.execute("BEGIN")
            evidence = read_evidence(conn)
            return judge(evidence, lambda: event_hashes(conn), key, policy, external)
    finally:
        conn.close()
