"""SQLite connections for the chain, and the translation of sqlite3 errors.

This module and `schema.py` are the only places that touch `sqlite3`
exceptions; everything above sees `ChainError` subclasses.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from infervisor.chain.errors import ChainFormatError, ChainIntegrityError, ChainIOError

T = TypeVar("T")

BUSY_TIMEOUT_S = 10.0
"""How long a writer waits for another process's write transaction, in seconds."""


@contextlib.contextmanager
def translated(path: str, action: str) -> Iterator[None]:
    """Re-raise sqlite3 errors raised inside the block as chain errors.

    Raises:
        ChainIntegrityError: a constraint or trigger refused a change.
        ChainIOError: any other sqlite3 error (missing file, not SQLite, locked).
    """
    try:
        yield
    except sqlite3.IntegrityError as exc:
        raise ChainIntegrityError(f"{action} refused by chain {path}: {exc}") from exc
    except sqlite3.OperationalError as exc:
        hint = _hint(exc)
        raise ChainIOError(f"cannot {action} chain {path}: {exc}{hint}") from exc
    except sqlite3.Error as exc:
        raise ChainIOError(f"cannot {action} chain {path}: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ChainFormatError(
            f"cannot {action} chain {path}: a text column is not UTF-8 ({exc}); "
            "`infervisor chain verify` names the row"
        ) from exc


def connect_writer(path: str) -> sqlite3.Connection:
    """Open `path` for appending (created if missing): WAL, synchronous=FULL.

    A new file is created mode 0600 (its ``-wal`` and ``-shm`` files take the
    same mode): payloads hold the instances' specs, ``env`` included.

    Raises:
        ChainIOError: the file cannot be opened, is not SQLite, or refuses WAL.
    """
    _create_private(path)
    with translated(path, "open"):
        conn = sqlite3.connect(
            path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
    with _closing_on_error(conn), translated(path, "open"):
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise ChainIOError(
                f"chain {path} cannot use write-ahead logging (journal_mode is {mode!r}); "
                "put it on a local file system"
            )
        conn.execute("PRAGMA synchronous=FULL")
    return conn


def _create_private(path: str) -> None:
    """Create ``path`` empty, mode 0600, unless it exists (SQLite then initialises it)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    except FileExistsError:
        return
    except OSError as exc:
        raise ChainIOError(f"cannot open chain {path}: {exc.strerror or exc}") from exc


def connect_reader(path: str, *, text_as_bytes: bool = False) -> sqlite3.Connection:
    """Open `path` read-only (URI `mode=ro`); never creates or changes the database.

    Args:
        path: the chain file.
        text_as_bytes: return TEXT values as bytes (the verifier decodes them itself).

    Raises:
        ChainIOError: the file is missing or cannot be opened.
    """
    uri = Path(path).absolute().as_uri() + "?mode=ro"
    with translated(path, "open"):
        conn = sqlite3.connect(
            uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
    if text_as_bytes:
        conn.text_factory = bytes
    return conn


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """Run the block in a `BEGIN IMMEDIATE` transaction: commit, or roll back on error.

    A failed COMMIT is rolled back too, so nothing of the block is stored and the
    connection can begin the next transaction.

    IMMEDIATE takes the write lock before the block reads anything, so what the
    block reads (the head) cannot change before it commits.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        # Inside the try: a COMMIT that fails (SQLITE_FULL, SQLITE_BUSY, a deferred
        # constraint) may leave the transaction open, and an open transaction would
        # refuse every later BEGIN. SQLite rolls some failures back itself (see
        # https://www.sqlite.org/lang_transaction.html, "Response To Errors Within
        # A Transaction"); whatever is still open is rolled back here.
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


@contextlib.contextmanager
def _closing_on_error(conn: sqlite3.Connection) -> Iterator[None]:
    try:
        yield
    except BaseException:
        conn.close()
        raise


def _hint(exc: sqlite3.OperationalError) -> str:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return f" (another process held the write lock for more than {BUSY_TIMEOUT_S:g} s)"
    if "readonly" in text:
        return " (opened read-only: use SqliteChain.open to append)"
    return ""


def read_only(
    path: str | os.PathLike[str], action: str, read: Callable[[sqlite3.Connection], T]
) -> T:
    """Open the chain at `path` read-only, return `read(conn)`, close it.

    Raises:
        ChainIOError: the file cannot be opened or read ("cannot <action> <path>").
    """
    name = os.fspath(path)
    conn = connect_reader(name)
    try:
        with translated(name, action):
            return read(conn)
    finally:
        conn.close()
