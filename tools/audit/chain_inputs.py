"""What the ``chain`` commands read besides the chain's rows: checkpoint files,
public keys (and the rotations the chain records), the stored event hashes.

Each reader raises :class:`~infervisor.tools.clikit.failure.Failure` naming
the option and the file at fault. Checkpoints, proofs, bundles:
docs/chain-format.md, sections 8 to 12.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import click

from infervisor.chain import ChainError, verify_chain
from infervisor.chain.checkpoint import (
    PUBLIC_KEY_FILE,
    Checkpoint,
    compare,
    load_verifier,
    parse_checkpoint_text,
    read_checkpoint_by,
)
from infervisor.chain.checkpoint_store import stored_checkpoints
from infervisor.chain.connect import connect_reader, translated
from infervisor.chain.errors import CheckpointError, NoteError
from infervisor.chain.keys import KEY_ROTATED_KIND, rotations_in, trusted_keys
from infervisor.chain.note import Verifier, open_note, split_note

from ..clikit.failure import Failure
from ..clikit.key_shapes import as_checkpoint_problem
from ..clikit.paths import need_file

__all__ = [
    "KEY_HELP",
    "foreign_origin",
    "matches",
    "read_checkpoint",
    "read_text",
    "refuse_invalid",
    "stored_extent",
    "stored_hashes",
    "trusted",
    "verifier",
    "warn",
]

KEY_HELP = "The node's public key: a key string, or a file (DATA_DIR/node.pub)."
"""The start of every --key option's help."""


def warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


def read_text(path: Path, field: str) -> bytes:
    """The bytes of the file ``field`` names.

    Raises:
        Failure: ``bad_path`` (exit 2) when it is missing, a directory or unreadable.
    """
    need_file(path, field)
    try:
        return path.read_bytes()
    except OSError as e:
        raise Failure(
            f"{field} {path}: cannot read it: {e.strerror or e}", "bad_path", field
        ) from e


def verifier(key: str) -> Verifier:
    try:
        return load_verifier(key)
    except CheckpointError as e:
        raise Failure(str(e), "bad_key", "--key") from e


def trusted(db: Path, key: str) -> list[Verifier]:
    """``key`` and every key the chain's recorded rotations link to it (a rotation
    note is signed by both of its keys: chain/keys.py ``trusted_keys``)."""
    anchor = verifier(key)
    try:
        conn = connect_reader(str(db), text_as_bytes=True)
        try:
            with translated(str(db), "read"):
                rows = conn.execute(
                    "SELECT kind, payload FROM events WHERE kind = ? ORDER BY seq",
                    (KEY_ROTATED_KIND,),
                ).fetchall()
        finally:
            conn.close()
    except ChainError:
        return [anchor]
    return trusted_keys(anchor, rotations_in((k, bytes(p)) for k, p in rows))


def read_checkpoint(
    path: Path, key: str | None, db: Path, field: str = "--checkpoint"
) -> Checkpoint:
    """The checkpoint in FILE (named ``field`` in errors): its signature verified with
    `key` (or a key the chain's rotations link to it), or only parsed without one.

    The rule (docs/cli.md, "chain verify --json"): a file that is no signed note
    is the caller's input gone wrong (2); a signed note is checked with the key
    before its text is read, so one edited after it was signed fails as a
    verification (1) whether or not the edited text still reads as a checkpoint
    (a newcomer's trial, stop 33: an edited size line said "not a checkpoint",
    exit 2, while an edited signature said exit 1).

    Raises:
        Failure: ``bad_value`` (exit 2) when the file is no signed note (a key:
            ``--checkpoint`` and ``--key`` swapped; not text; no signature line),
            or a note the key signed, or that is read without a key, whose text
            is no checkpoint; ``checkpoint_invalid`` (exit 1) when the key does
            not verify its signature.
    """
    note = read_text(path, field)
    why = as_checkpoint_problem(note, str(path), field)
    if why is not None:
        raise Failure(why, "bad_value", field)
    try:
        text, _ = split_note(note)
    except NoteError as e:
        raise _not_a_checkpoint(path, field, e) from e
    keys = None if key is None else trusted(db, key)
    if keys is not None:
        try:
            open_note(note, keys)
        except NoteError as e:
            raise Failure(
                f"{field} {path}: checkpoint signature: {e}{_also_malformed(text)}",
                "checkpoint_invalid",
                field,
            ) from e
    try:
        origin, size, root, head = parse_checkpoint_text(text)
    except CheckpointError as e:
        raise _not_a_checkpoint(path, field, e) from e
    if keys is None:
        return Checkpoint(origin, size, root, head, note.decode("utf-8"))
    try:
        return read_checkpoint_by(note, keys)
    except (CheckpointError, NoteError) as e:
        raise Failure(f"{field} {path}: {e}", "checkpoint_invalid", field) from e


def _not_a_checkpoint(path: Path, field: str, e: Exception) -> Failure:
    return Failure(
        f"{field} {path}: not a checkpoint ({e}); a checkpoint is a signed note written "
        "by `infervisor chain checkpoint WHERE --out FILE`",
        "bad_value",
        field,
    )


def _also_malformed(text: str) -> str:
    """What else is wrong with a note whose signature failed: its text, edited, may
    no longer read as a checkpoint ("" when it does)."""
    try:
        parse_checkpoint_text(text)
    except CheckpointError as e:
        return (
            f"; its text no longer reads as a checkpoint either ({e}): edited after it was signed"
        )
    return ""


def foreign_origin(db: Path, cp: Checkpoint) -> str | None:
    """Why ``cp`` is not of the log in ``db``, when its origin says so; else None.

    A log's origin is the name of the key that signs it, kept across rotations
    (chain/keys.py): the first line of the chain's stored checkpoints and the
    name in node.pub beside it. A chain with neither is judged by its genesis's
    node id against the one a default origin carries (``Checkpoint.node``).
    Neither side is trusted here: a chain rewritten under a new key has a new
    origin too, so the words blame neither (a newcomer's trial, stop 33: another
    node's checkpoint and key read "INVALID ... at seq 63").

    Raises:
        Failure: ``chain_unreadable`` when the chain cannot be read.
    """
    origins, node = _origins(db)
    if origins:
        if cp.origin in origins:
            return None
        ours = f"its checkpoints' origin is {', '.join(sorted(origins))}"
    elif cp.node not in (cp.origin, node):
        ours = "it has no checkpoint"
    else:
        return None
    return (
        f"the checkpoint's origin is {cp.origin} (node {cp.node}); this chain is node "
        f"{node}'s and {ours}: either the checkpoint and key are another log's (pass "
        "this node's: its node.pub and a checkpoint of it), or this chain was made again "
        "under another key since the checkpoint was signed (a rewrite); either way the "
        "checkpoint vouches for nothing here"
    )


def _origins(db: Path) -> tuple[set[str], str]:
    """The origins the chain's stored checkpoints and node.pub beside it name, and
    the node id its genesis names."""
    try:
        conn = connect_reader(str(db))
        try:
            with translated(str(db), "read"):
                row = conn.execute("SELECT node FROM events WHERE seq = 0").fetchone()
                notes = [c.note for c in stored_checkpoints(conn)]
        finally:
            conn.close()
    except ChainError as e:
        raise Failure(str(e), "chain_unreadable") from e
    origins = {n.split("\n", 1)[0] for n in notes}
    with contextlib.suppress(CheckpointError):  # none beside a copy of chain.db alone
        origins.add(load_verifier(db.parent / PUBLIC_KEY_FILE, None).name)
    return origins, "?" if row is None else str(row[0])


def stored_hashes(db: Path) -> list[bytes]:
    """The stored hash of every event, seq order, one snapshot."""
    try:
        conn = connect_reader(str(db))
        try:
            with translated(str(db), "read"):
                rows = conn.execute("SELECT hash FROM events ORDER BY seq")
                return [h if isinstance(h, bytes) else b"" for (h,) in rows]  # bad: verify names
        finally:
            conn.close()
    except ChainError as e:
        raise Failure(str(e), "chain_unreadable") from e


def stored_extent(db: Path) -> tuple[int, int | None]:
    """What the file holds, verified or not: its number of event rows and the
    largest seq among them (None: no row). A verdict that is not ok reports how
    far the rows verified; this is the rest of the picture (stop 32's trial read
    ``13 events`` of a file holding 57).

    Raises:
        Failure: ``chain_unreadable`` when the file cannot be read.
    """
    row = _one_row(db, "SELECT count(*), max(seq) FROM events")
    count, last = row if row is not None else (0, None)
    return int(count), (last if isinstance(last, int) else None)


def first_stamp(db: Path) -> int | None:
    """The time of the chain's first event (ns since the Unix epoch; None: no row).

    Raises:
        Failure: ``chain_unreadable`` when the file cannot be read.
    """
    row = _one_row(db, "SELECT ts_ns FROM events ORDER BY seq LIMIT 1")
    return row[0] if row is not None and isinstance(row[0], int) else None


def _one_row(db: Path, sql: str) -> Any:
    """The first row ``sql`` answers from the chain file (None: none).

    Raises:
        Failure: ``chain_unreadable`` when the file cannot be read.
    """
    try:
        conn = connect_reader(str(db))
        try:
            with translated(str(db), "read"):
                return conn.execute(sql).fetchone()
        finally:
            conn.close()
    except ChainError as e:
        raise Failure(str(e), "chain_unreadable") from e


def matches(db: Path, hashes: list[bytes], cp: Checkpoint, field: str) -> None:
    mismatch = compare(hashes, cp)
    if mismatch is not None:
        raise Failure(f"{db} does not match {field}: {mismatch}", "checkpoint_invalid", field)


def refuse_invalid(db: Path, what: str) -> None:
    """Refuse to make ``what`` of a chain whose rows do not verify: it would prove
    the hashes as stored, not the events as they happened.

    Raises:
        Failure: ``chain_invalid`` (exit 1) naming the first bad seq, or
            ``chain_unreadable`` when the file is not a chain.
    """
    try:
        report = verify_chain(db)
    except ChainError as e:
        raise Failure(str(e), "chain_unreadable") from e
    if report.problem is not None:
        p = report.problem
        raise Failure(
            f"{db} does not verify (INVALID at seq {p.seq}: {p.reason}): {what} of it would "
            "prove the hashes as stored, not the events; see infervisor chain verify",
            "chain_invalid",
        )
