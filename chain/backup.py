"""A consistent copy of a live chain with SQLite's online backup API.

Committed events may still be in the ``-wal`` file beside the database, so a
plain ``cp chain.db`` can lose them (docs/chain-format.md, "Backups").
`backup_chain` copies one snapshot of the database *as SQLite sees it*
(``sqlite3.Connection.backup``), WAL content included, while the node keeps
appending.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

from infervisor.chain.connect import connect_reader, translated
from infervisor.chain.errors import ChainIOError
from infervisor.chain.leftovers import partial_name
from infervisor.chain.private import create_private


def backup_chain(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> int:
    """Copy the chain at `source` to the new file `target` consistently; return its event count.

    The copy is a single snapshot (every event committed when the copy
    began), written as a self-contained file (no ``-wal`` needed).

    Raises:
        ChainIOError: `target` exists, or either file cannot be opened or written.
    """
    src_name, dst_name = os.fspath(source), os.fspath(target)
    if Path(dst_name).exists():
        raise ChainIOError(f"{dst_name} exists: a backup goes to a new file")
    src = connect_reader(src_name)
    try:
        with translated(src_name, "back up"):
            src.execute("SELECT count(*) FROM events").fetchone()  # a chain, readable
        # Written aside and renamed into place: a backup cut short (killed, disk
        # full) never leaves a file at the target's name.
        # Named for the next run to sweep if this one is killed (chain/leftovers.py).
        partial = os.fspath(partial_name(Path(dst_name), "backup"))
        try:
            with translated(dst_name, "write the backup"):
                os.close(create_private(partial))  # 0600 before a byte is in it
                dst = sqlite3.connect(partial)
                try:
                    src.backup(dst)
                    dst.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    (count,) = dst.execute("SELECT count(*) FROM events").fetchone()
                finally:
                    dst.close()
            os.replace(partial, dst_name)
        except OSError as e:
            raise ChainIOError(f"cannot write the backup {dst_name}: {e.strerror or e}") from e
        finally:
            for leftover in (partial, partial + "-journal"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(leftover)
    finally:
        src.close()
    return int(count)
