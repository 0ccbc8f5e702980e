"""``infervisor chain checkpoint``, ``chain backup`` and ``chain rotate-key``:
the chain's signed checkpoints kept off the node, a consistent copy of a live
chain, and a new checkpoint key recorded in the chain (docs/chain-format.md)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from infervisor.chain import ChainError
from infervisor.chain.backup import backup_chain
from infervisor.chain.checkpoint_store import read_stored
from infervisor.chain.errors import CheckpointError
from infervisor.chain.leftovers import sweep

from ..clikit.command import Command
from ..clikit.failure import Failure, echo_json
from ..clikit.paths import need_parent
from ..node.lock import LOCK_FILE, RunError, holds_no_run
from ..node.where import chain_of
from .chain_inputs import warn

__all__ = ["backup", "checkpoint", "rotate_key", "say_swept"]


@click.command("checkpoint", cls=Command)
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.option(
    "--out", type=click.Path(path_type=Path), metavar="FILE", help="Write it to this file."
)
@click.option("--json", "as_json", is_flag=True, help="Print it as JSON.")
def checkpoint(where: Path, out: Path | None, as_json: bool) -> None:
    """Print (or write to --out) the latest signed checkpoint stored in the chain.

    Keep it off the node (with DATA_DIR/node.pub): `chain verify --checkpoint`
    then detects truncation, rewriting and forks up to its tree size.
    """
    db = chain_of(where)
    try:
        stored = read_stored(db)
    except ChainError as e:
        raise Failure(str(e), "chain_unreadable") from e
    if not stored:
        raise Failure(
            f"{db} holds no checkpoint yet: a node signs one every checkpoint_every_events "
            "events and when it stops cleanly",
            "no_checkpoint",
        )
    latest = stored[-1]
    if out is not None:
        try:
            out.write_text(latest.note, encoding="utf-8")
        except OSError as e:
            raise Failure(
                f"--out {out}: cannot write: {e.strerror or e}", "bad_path", "--out"
            ) from e
    if as_json:
        echo_json(
            {
                "tree_size": latest.tree_size,
                "ts_ns": latest.ts_ns,
                "note": latest.note,
                "out": None if out is None else str(out),
            }
        )
    elif out is None:
        click.echo(latest.note, nl=False)
    else:
        click.echo(f"checkpoint of tree size {latest.tree_size} written to {out}")
    sys.exit(0)


def say_swept(out: Path) -> None:
    """Remove what killed backups and exports left beside OUT, and say so on stderr."""
    for left in sweep(out.parent if out.parent != Path() else Path.cwd()):
        warn(f"removed {left.path}, left by a killed backup or export (pid {left.pid})")


@click.command("backup", cls=Command)
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.argument("out", metavar="OUT", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def backup(where: Path, out: Path, as_json: bool) -> None:
    """Copy the chain in WHERE to the new file OUT, consistently, while the node runs.

    Uses SQLite's online backup API: events still in the -wal file are
    copied too (a plain cp of chain.db can lose them). The copy is written
    aside and renamed into place; what a killed backup or export left in
    OUT's folder is removed first, and stderr says so.
    """
    db = chain_of(where)
    need_parent(out, "OUT")
    say_swept(out)
    if out.exists():
        raise Failure(f"OUT {out} exists: a backup goes to a new file", "bad_path", "OUT")
    try:
        count = backup_chain(db, out)
    except ChainError as e:
        raise Failure(str(e), "chain_unreadable") from e
    if as_json:
        echo_json({"backup": str(out), "events": count})
    else:
        click.echo(f"backed up {count} events of {db} to {out} (SQLite online backup)")
    sys.exit(0)


@click.command("rotate-key", cls=Command)
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the keys and the event as JSON.")
def rotate_key(where: Path, as_json: bool) -> None:
    """Replace the node's checkpoint key (node.key beside the chain in WHERE).

    The rotation is an event signed by the old and the new key (a C2SP signed
    note); the old public key is kept as node.pub.<key id>, so checkpoints
    signed before stay checkable. Refused while a node runs on the chain.
    """
    db = chain_of(where)
    from infervisor.chain import SqliteChain  # noqa: PLC0415
    from infervisor.chain.keys import rotate_key as rotate  # noqa: PLC0415

    try:
        holds_no_run(db.parent / LOCK_FILE)
    except RunError as e:
        raise Failure(str(e), "invalid_state") from e
    try:
        with SqliteChain.open_readonly(db) as chain:
            node_id = chain.node_id
        rotation = rotate(db, node_id, time.time_ns())
    except (ChainError, CheckpointError) as e:
        raise Failure(str(e), "chain_unreadable") from e
    if as_json:
        echo_json(
            {
                "old_key": rotation.old.key_string(),
                "new_key": rotation.new.key_string(),
                "seq": rotation.event.seq,
                "checkpoint_size": rotation.checkpoint_size,
            }
        )
    else:
        click.echo(
            f"rotated the key of {node_id}: event seq {rotation.event.seq}, signed by both keys\n"
            f"  old {rotation.old.key_string()} (kept as node.pub.{rotation.old.key_id.hex()})\n"
            f"  new {rotation.new.key_string()} (node.pub)\n"
            f"checkpoints from tree size {rotation.checkpoint_size} on are signed by the new key"
        )
    sys.exit(0)
