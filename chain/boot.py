"""The check a node runs on its chain before it resumes (docs/chain-format.md, "Boot check").

Incremental from the last stored checkpoint (tree size N), in one read
snapshot:

0. The trust policy every reader applies (chain/trust.py): every stored
   checkpoint's signature, the chain against each, the stored cosignatures
   against the witness policy, a clean stop's checkpoint.
1. The checkpoint's signature is checked with the node's key (its origin is
   the key's name).
2. The checkpoint's stored frontier (`checkpoint_frontiers`) must give its
   signed root, and the hash at seq N-1 its signed head: events below N are
   not read, so the check does not grow with the chain. Without a usable
   frontier, or when the head is not the signed one, events 0 .. N-1 are
   read: their stored `hash` values are the Merkle leaves; the RFC 6962 root
   must equal the checkpoint's and the hash at seq N-1 its head (a chain
   shorter than N is "truncated"; another root "rewritten" or "forked"),
   and their payloads are re-hashed ("payload altered").
3. Events from seq N-1 on are verified in full (`checks.check_row`), as
   `verify_chain` does.

The node then rebuilds its state (`actors/node_boot.py`, `boot_state`): from
its snapshot (replay/snapshot.py, bound to the chain by the seq and hash of
the event it covers) and the events after it, each verified as it is folded;
without a usable snapshot, the whole chain, each event verified in the same
pass, which also finds what step 2 does not read. So with a snapshot neither
step reads below it, and an edit there that keeps the stored hashes (a payload
altered in place) is left to ``chain verify``, as step 2 leaves it.
Without a checkpoint every row is verified in full. Any failure raises
`ChainTampered` naming the seq and the reason.
"""

from __future__ import annotations

import os
import sqlite3
from typing import NamedTuple

from infervisor.chain import schema
from infervisor.chain.checkpoint import (
    KEY_FILE,
    Checkpoint,
    compare,
    load_signer,
    read_checkpoint,
)
from infervisor.chain.checkpoint_store import (
    event_hashes,
    frontier_of,
    has_table,
    latest_checkpoint,
    stored_checkpoints,
    trigger_problems,
    verified,
)
from infervisor.chain.checks import Problem, Row, check_row, parse_row
from infervisor.chain.connect import connect_reader, translated
from infervisor.chain.cosignature import WitnessPolicy
from infervisor.chain.errors import ChainTampered, CheckpointError
from infervisor.chain.hashing import HASH_SIZE, payload_hash
from infervisor.chain.merkle import CompactTree
from infervisor.chain.note import Verifier
from infervisor.chain.trust import judge, read_evidence
from infervisor.chain.verify import SqlLookups


class BootReport(NamedTuple):
    """What the boot check found (it raises when the chain fails).

    Attributes:
        events: events in the chain.
        checkpoint_size: tree size of the checkpoint it started from (0: none).
        fully_verified: rows verified in full (from the checkpoint's head on).
        anchor: the trust policy's one-line anchor statement (chain/trust.py).
    """

    events: int
    checkpoint_size: int
    fully_verified: int
    anchor: str = ""


def check_before_resume(
    path: str | os.PathLike[str], verifier: Verifier | None, policy: WitnessPolicy | None = None
) -> BootReport:
    """Check the chain at `path` before a node resumes on it (see the module docstring).

    Args:
        path: the chain file (must exist and be a chain).
        verifier: the node's public key; None when the node has no key yet
            (then a stored checkpoint is itself a failure: the key is missing).
        policy: the witnesses of the node's config and their quorum (None: none);
            their cosignatures stored in the chain are checked as every reader
            checks them (chain/trust.py).

    Raises:
        ChainTampered: the chain fails; names seq, reason and how to start anew.
        CheckpointError: checkpoints are stored but the node has no key to check them.
        ChainIOError: the file cannot be read.
    """
    name = os.fspath(path)
    conn = connect_reader(name, text_as_bytes=True)
    try:
        with translated(name, "check"):
            conn.execute("BEGIN")
            verdict = judge(read_evidence(conn), lambda: event_hashes(conn), verifier, policy)
            if verdict.problem is not None:
                p = verdict.problem
                raise ChainTampered(name, p.seq, p.reason, p.detail)
            return _check(conn, name, verifier)._replace(anchor=verdict.anchor)
    finally:
        conn.close()


def _check(conn: sqlite3.Connection, path: str, verifier: Verifier | None) -> BootReport:
    _check_table(conn, path, verifier)
    latest = latest_checkpoint(conn)
    if latest is None:
        return _full_from(conn, path, 0, before=None, genesis=None, checkpoint_size=0)
    if verifier is None:
        raise CheckpointError(
            f"chain {path} holds signed checkpoints but the node key (node.key beside it) "
            "is missing: restore it from a backup; without it the chain cannot be checked"
        )
    try:
        cp = read_checkpoint(latest.note, verifier)
    except CheckpointError as e:
        raise ChainTampered(path, latest.tree_size - 1, "checkpoint signature", str(e)) from e
    if cp.tree_size != latest.tree_size:
        raise ChainTampered(
            path,
            latest.tree_size - 1,
            "checkpoint altered",
            f"the row says tree size {latest.tree_size}, the signed note {cp.tree_size}",
        )
    size = cp.tree_size
    fast = _from_frontier(conn, path, cp)
    if fast is not None:
        return fast
    tree = CompactTree()
    hashes: list[bytes] = []
    rows = conn.execute(
        "SELECT seq, payload, payload_hash, hash FROM events WHERE seq < ? ORDER BY seq", (size,)
    )
    for seq, payload, digest, event in rows:
        if type(seq) is not int or not isinstance(event, bytes) or len(event) != HASH_SIZE:
            raise ChainTampered(
                path, tree.size, "malformed row", f"seq {seq!r}: seq or hash not as stored"
            )
        if seq != tree.size:
            raise ChainTampered(
                path, seq, "gap", f"expected seq {tree.size}, found {seq} below the checkpoint"
            )
        if not isinstance(payload, bytes) or payload_hash(payload) != digest:
            raise ChainTampered(
                path, seq, "payload altered", "the payload does not hash to its payload_hash"
            )
        tree.append(event)
        hashes.append(event)
    mismatch = compare(hashes, cp)
    if mismatch is not None:
        if mismatch.reason in ("rewritten", "forked"):
            earlier = verified(stored_checkpoints(conn), verifier)
            full = event_hashes(conn)
            mismatch = compare(full, cp, earlier) or mismatch
        raise ChainTampered(path, mismatch.seq, mismatch.reason, mismatch.detail)
    head, genesis = _row_at(conn, path, size - 1), _row_at(conn, path, 0)
    return _full_from(conn, path, size - 1, before=head, genesis=genesis, checkpoint_size=size)


def _from_frontier(conn: sqlite3.Connection, path: str, cp: Checkpoint) -> BootReport | None:
    """The incremental check: the stored frontier of the checkpoint's tree has the
    signed root, the event at its head has the signed hash, and every event from
    there on verifies in full. Reads no event below the checkpoint, so its cost
    does not grow with the chain. None when no usable frontier is stored, or
    the head is not the signed one (then every event below the checkpoint is
    read, to name what was cut or rewritten).

    What it leaves to ``chain verify``: an edit below the checkpoint that keeps
    the stored hashes (a payload altered in place there).
    """
    tree = frontier_of(conn, cp.tree_size)
    if tree is None or tree.root() != cp.root:
        return None
    size = cp.tree_size
    row = conn.execute("SELECT hash FROM events WHERE seq = ?", (size - 1,)).fetchone()
    if row is None or bytes(row[0]) != cp.head_hash:
        return None  # cut or rewritten: the full check below names where
    head, genesis = _row_at(conn, path, size - 1), _row_at(conn, path, 0)
    return _full_from(conn, path, size - 1, before=head, genesis=genesis, checkpoint_size=size)


def _check_table(conn: sqlite3.Connection, path: str, verifier: Verifier | None) -> None:
    """The checkpoints table is there (once the node has a key) with its triggers as made."""
    if has_table(conn) and (problems := trigger_problems(conn)):
        raise ChainTampered(
            path,
            0,
            "checkpoint triggers changed",
            f"the checkpoints table's append-only triggers were changed outside infervisor "
            f"({'; '.join(problems)}): checkpoints may have been removed",
        )
    if verifier is not None and not has_table(conn):
        raise ChainTampered(
            path,
            0,
            "checkpoints dropped",
            "the node has a key (node.key), so it made a checkpoints table, but the chain "
            "has none: it was dropped, and with it what shows truncation and rewriting",
        )


def _row_at(conn: sqlite3.Connection, path: str, seq: int) -> Row:
    raw = conn.execute(schema.SELECT_EVENTS + " WHERE seq = ?", (seq,)).fetchone()
    row = parse_row(raw, seq)
    if isinstance(row, Problem):
        raise ChainTampered(path, row.seq, row.reason, row.detail)
    return row


def _full_from(
    conn: sqlite3.Connection,
    path: str,
    start: int,
    *,
    before: Row | None,
    genesis: Row | None,
    checkpoint_size: int,
) -> BootReport:
    """Verify rows with seq > start (every row when before is None) in full."""
    after = start if before is not None else -1
    rows = conn.execute(schema.SELECT_EVENTS + " WHERE seq > ? ORDER BY seq", (after,))
    lookups = SqlLookups(conn)
    count = 0
    for raw in rows:
        row = parse_row(raw, 0 if before is None else before.seq + 1)
        if isinstance(row, Problem):
            raise ChainTampered(path, row.seq, row.reason, row.detail)
        problem = check_row(row, before, genesis, lookups)
        if problem is not None:
            raise ChainTampered(path, problem.seq, problem.reason, problem.detail)
        before, genesis, count = row, genesis or row, count + 1
    if before is None:
        raise ChainTampered(path, 0, "bad genesis", "the chain is empty: no row at seq 0")
    return BootReport(before.seq + 1, checkpoint_size, count)


def check_node_chain(
    path: str | os.PathLike[str], node_id: str, policy: WitnessPolicy | None = None
) -> BootReport:
    """`check_before_resume` with the node key from the chain's folder (node.key).

    Raises:
        ChainTampered, CheckpointError, ChainIOError: as `check_before_resume`;
            CheckpointError also when node.key exists but cannot be used.
    """
    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    key = os.path.join(folder, KEY_FILE)
    verifier = load_signer(key, node_id).verifier if os.path.exists(key) else None
    return check_before_resume(path, verifier, policy)
