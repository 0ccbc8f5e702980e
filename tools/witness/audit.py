"""``infervisor witness run --audit``: a semantic witness that reads the events it cosigns.

The :class:`ChainAuditor` is the witness's :class:`~.service.Auditor`. Before
the witness cosigns a checkpoint of size N of a log it holds at size M (0
when it holds none), the auditor:

1. brings a local mirror of the log's chain up to date: ``fetch(log,
   folder)`` with ``folder`` = ``DATA_DIR/mirrors/<SHA-256 hex of the
   origin>/``, which must leave the chain in ``folder/chain.db``. The default
   fetch (:func:`fetch_log`) copies a local chain for a ``file:`` url and
   otherwise runs ``infervisor chain pull`` (the node API's C2SP tlog-tiles);
2. checks the mirror as `infervisor audit` does: every event of 0..N-1
   re-hashes and links (docs/chain-format.md "Verification",
   :func:`infervisor.chain.scan_chain`), the RFC 6962 root of their hashes
   is the checkpoint's root (chain/merkle.py), and replays them through the
   lifecycle rules (:class:`infervisor.replay.audit.TransitionAudit`). The
   replay of the events last audited is kept in memory per origin
   (:class:`Replayed`): when the witness holds that checkpoint, only events
   M..N-1 are verified and replayed (the verified prefix is not read again);
3. refuses with 422 (kept by the witness as evidence, with the reason) a
   checkpoint whose events 0..N-1 do not verify, are fewer than N, make
   another root, or whose NEW events (seq M..N-1) break a lifecycle rule.
   A rule broken below M was in a checkpoint already cosigned: it is not
   refused again (the witness vouched for those events then; ``infervisor
   audit`` of the mirror still names it);
4. answers 503 (transient, not kept: the log submits again later) when the
   log cannot be fetched or its mirror is not a readable chain.

Errors: :class:`FetchError` (a fetch that failed; the auditor turns it into
a 503). Checks of one origin are serialized (one lock per origin); different
origins are audited concurrently.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

from infervisor.chain import StoredEvent, scan_chain, schema
from infervisor.chain.checks import Problem, check_row, parse_row
from infervisor.chain.connect import connect_reader, translated
from infervisor.chain.errors import ChainError, ChainFormatError
from infervisor.chain.merkle import CompactTree
from infervisor.chain.verify import SqlLookups, stored_event
from infervisor.chain.witness_protocol import AddCheckpoint, Refusal, WitnessState
from infervisor.replay.audit import Finding, TransitionAudit

from .config import ConfigError, WitnessedLog, token_of

__all__ = [
    "CHAIN_FILE",
    "MIRRORS",
    "ChainAuditor",
    "Fetch",
    "FetchError",
    "check_mirror",
    "fetch_log",
    "mirror_folder",
]

log = logging.getLogger(__name__)

MIRRORS = "mirrors"
CHAIN_FILE = "chain.db"

Fetch = Callable[[WitnessedLog, Path], None]
"""Brings ``folder/chain.db`` up to date with the log; raises `FetchError` (or OSError)."""


class FetchError(Exception):
    """The log's events cannot be fetched now (unreachable, refused, garbage): a 503."""


def mirror_folder(data_dir: Path, origin: str) -> Path:
    """``DATA_DIR/mirrors/<SHA-256 hex of the origin's UTF-8>``: where a log is mirrored."""
    return data_dir / MIRRORS / hashlib.sha256(origin.encode("utf-8")).hexdigest()


def fetch_log(log: WitnessedLog, folder: Path) -> None:
    """The default fetch: mirror ``log.url`` into ``folder/chain.db``.

    A ``file:`` url (``file:///srv/replica/chain.db``, or a data dir holding
    chain.db) is copied with SQLite's backup API (one consistent snapshot,
    even of a live chain), then moved into place. Any other url is a node's
    API, mirrored from its tlog-tiles by ``infervisor chain pull``
    (``tools.audit.chain_pull.pull``) with the read token of
    ``log.token_file`` and the log's first configured verifier key.

    Raises:
        FetchError: no url, an unreadable token or source, or the pull failed.
    """
    if log.url is None:
        raise FetchError(f"no url is configured for {log.origin}: --audit reads the log there")
    parsed = urlparse(log.url)
    if parsed.scheme == "file":
        _copy_local(Path(unquote(parsed.path)), folder)
        return
    _pull(log, log.url, folder)


def _copy_local(source: Path, folder: Path) -> None:
    if source.is_dir():
        source = source / CHAIN_FILE
    if not source.is_file():
        raise FetchError(f"{source} is not a chain file")
    tmp = folder / f"{CHAIN_FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        src = sqlite3.connect(f"{source.as_uri()}?mode=ro", uri=True)
        try:
            dst = sqlite3.connect(tmp)
            try:
                src.backup(dst)
                dst.execute("PRAGMA journal_mode=DELETE")  # one file: no WAL to go stale
            finally:
                dst.close()
        finally:
            src.close()
        for stale in ("-wal", "-shm"):  # of an earlier mirror (a pull's), not of this copy
            (folder / (CHAIN_FILE + stale)).unlink(missing_ok=True)
        os.replace(tmp, folder / CHAIN_FILE)
    except sqlite3.Error as e:
        raise FetchError(f"cannot copy {source}: {e}") from e
    finally:
        tmp.unlink(missing_ok=True)


def _pull(log: WitnessedLog, url: str, folder: Path) -> None:
    token = None
    if log.token_file is not None:  # read again: it may have changed since the start
        try:
            token = token_of(log.token_file, f"the token file {log.token_file}")
        except ConfigError as e:
            raise FetchError(str(e)) from e
    try:
        from infervisor.tools.audit.chain_pull import pull  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
    except ImportError:
        raise FetchError(f"chain pull is not available in this build: cannot fetch {url}") from None
    key = log.verifiers[0].key_string()  # the configured key, not one trusted on first use
    try:
        pull(url, folder, token=token, key=key)
    except Exception as e:  # whatever the pull meets is the log's, and transient
        raise FetchError(f"cannot pull {url}: {e}") from e


def _b64(root: bytes) -> str:
    return base64.b64encode(root).decode("ascii")


class Replayed:
    """The verified, replayed first ``size`` events of a mirror (kept between audits).

    Attributes:
        size: how many events (seq 0 .. size-1) were verified and replayed.
        head: the stored hash of event size-1 (the hash chain binds the prefix).
        audit: the lifecycle audit fed those events.
        tree: the RFC 6962 compact tree whose leaves are their hashes.
    """

    def __init__(self) -> None:
        """An empty replay: nothing verified yet."""
        self.size = 0
        self.head = b""
        self.audit = TransitionAudit(None)
        self.tree = CompactTree()

    def feed(self, seq: int, digest: bytes, event: StoredEvent) -> None:
        """Add the verified event ``seq`` (its stored hash ``digest``)."""
        self.audit.feed(event)
        self.tree.append(digest)  # the event hash is the leaf's data (docs/chain-format.md 8)
        self.size, self.head = seq + 1, digest


class _Enough(Exception):
    """Stops the scan once the checkpoint's events were all read."""


def check_mirror(
    chain: Path, old: int, size: int, root: bytes, prefix: Replayed | None = None
) -> tuple[Refusal | None, Replayed | None]:
    """Check the mirrored ``chain`` for a checkpoint of ``size`` and ``root`` extending ``old``.

    Args:
        chain: the mirror's chain.db.
        old: the size the witness holds; rules broken below it are not refused.
        size, root: the checkpoint's.
        prefix: a replay of the mirror's first ``prefix.size`` events from an
            earlier audit (consumed): only the rows after it are verified and
            replayed, if the mirror's event ``prefix.size - 1`` still has the
            hash it had; otherwise everything is, from genesis.

    Returns:
        (None, the replay of events 0..size-1) if those events verify, make
        ``root`` (RFC 6962 over the event hashes) and events old..size-1
        break no lifecycle rule; otherwise (a 422 `Refusal` naming the first
        problem in one line, None).

    Raises:
        ChainError: the mirror is not a readable chain (ChainIOError,
            ChainFormatError).
    """
    name = str(chain)
    conn = connect_reader(name, text_as_bytes=True)
    try:
        with translated(name, "audit"):
            _check_columns(conn, name)
            conn.execute("BEGIN")  # one snapshot
            schema.check_version(conn, name)
            if prefix is None or prefix.size > size or _head(conn, prefix.size) != prefix.head:
                prefix = None
            replayed, refusal = _verify(conn, name, size, prefix)
    finally:
        conn.close()
    if refusal is not None:
        return refusal, None
    got = replayed.tree.root()
    if got != root:
        return Refusal(
            422,
            f"the node's events 0..{size - 1} make root {_b64(got)}, "
            f"not the checkpoint's {_b64(root)}",
        ), None
    return _broken(replayed.audit.findings, old, size), replayed


def _check_columns(conn: sqlite3.Connection, name: str) -> None:
    found = {bytes(row[1]) for row in conn.execute("PRAGMA table_info(events)")}  # TEXT as bytes
    if not all(column.encode() in found for column in schema.COLUMNS):
        raise ChainFormatError(f"{name} is not an infervisor chain: no events table")


def _head(conn: sqlite3.Connection, size: int) -> object:
    row = conn.execute("SELECT hash FROM events WHERE seq = ?", (size - 1,)).fetchone()
    return None if row is None else row[0]


def _verify(
    conn: sqlite3.Connection, name: str, size: int, prefix: Replayed | None
) -> tuple[Replayed, Refusal | None]:
    if prefix is None:
        return _from_genesis(name, size)
    return prefix, _extend(conn, prefix, size)


def _from_genesis(name: str, size: int) -> tuple[Replayed, Refusal | None]:
    """Verify and replay events 0..size-1 with the chain's verifier (its fast path)."""
    replayed = Replayed()

    def feed(event: StoredEvent) -> None:
        if event.seq >= size:
            raise _Enough
        replayed.feed(event.seq, event.hash, event)

    try:
        report = scan_chain(name, feed)
    except _Enough:
        return replayed, None
    bad = report.problem
    if bad is not None and bad.seq < size:
        return replayed, _unverified(bad)
    if replayed.size < size:
        return replayed, Refusal(422, f"the node served {replayed.size} of {size} events")
    return replayed, None


def _extend(conn: sqlite3.Connection, prefix: Replayed, size: int) -> Refusal | None:
    """Verify and replay rows prefix.size .. size-1 (the documented row checks)."""
    lookups = SqlLookups(conn)
    genesis = parse_row(conn.execute(schema.SELECT_EVENTS + " WHERE seq = 0").fetchone(), 0)
    before = parse_row(
        conn.execute(schema.SELECT_EVENTS + " WHERE seq = ?", (prefix.size - 1,)).fetchone(),
        prefix.size - 1,
    )
    if isinstance(genesis, Problem):  # verified before, so the mirror changed under it
        return _unverified(genesis)
    if isinstance(before, Problem):
        return _unverified(before)
    rows = conn.execute(
        schema.SELECT_EVENTS + " WHERE seq >= ? AND seq < ? ORDER BY seq", (prefix.size, size)
    )
    for raw in rows:
        row = parse_row(raw, prefix.size)
        problem = row if isinstance(row, Problem) else check_row(row, before, genesis, lookups)
        if problem is not None:
            return _unverified(problem)
        assert not isinstance(row, Problem)
        prefix.feed(row.seq, row.hash, stored_event(row))
        before = row
    if prefix.size < size:
        return Refusal(422, f"the node served {prefix.size} of {size} events")
    return None


def _unverified(bad: Problem) -> Refusal:
    return Refusal(422, f"seq {bad.seq}: the node's event does not verify: {bad.detail}")


def _broken(findings: list[Finding], old: int, size: int) -> Refusal | None:
    new = [f for f in findings if old <= f.seq < size]
    if not new:
        return None
    first = new[0]
    more = f" (and {len(new) - 1} more)" if len(new) > 1 else ""
    return Refusal(422, f"seq {first.seq}: {first.rule}: {first.detail}{more}")


class ChainAuditor:
    """The ``--audit`` auditor: mirror, verify and replay a log before cosigning it.

    Args:
        data_dir: the witness's data directory (mirrors go under ``mirrors/``).
        fetch: brings a mirror folder up to date (default `fetch_log`).
    """

    def __init__(self, data_dir: Path, fetch: Fetch = fetch_log) -> None:
        """Audit into ``data_dir/mirrors``, fetching with ``fetch``."""
        self.data_dir = data_dir
        self.fetch = fetch
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._replayed: dict[str, tuple[bytes, Replayed]] = {}  # origin: (root, replay)

    def _lock(self, origin: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(origin, threading.Lock())

    def __call__(
        self, log: WitnessedLog, held: WitnessState | None, request: AddCheckpoint
    ) -> Refusal | None:
        """None to cosign ``request``; a 422 (kept) or 503 (transient) `Refusal` otherwise."""
        origin = log.origin
        folder = mirror_folder(self.data_dir, origin)
        cp = request.checkpoint
        with self._lock(origin):
            try:
                folder.mkdir(parents=True, exist_ok=True)
                self.fetch(log, folder)
            except (FetchError, OSError) as e:
                return _transient(f"cannot fetch the events of {origin} to audit them: {e}")
            prefix = self._prefix(origin, held)
            try:
                refusal, replayed = check_mirror(
                    folder / CHAIN_FILE, held.size if held else 0, cp.size, cp.root, prefix
                )
            except ChainError as e:
                return _transient(f"the events fetched from {origin} are not a chain: {e}")
            if replayed is not None:
                self._replayed[origin] = (cp.root, replayed)
            return refusal

    def _prefix(self, origin: str, held: WitnessState | None) -> Replayed | None:
        """The replay kept for ``origin`` if it is of the checkpoint held (taken out)."""
        kept = self._replayed.pop(origin, None)
        if kept is None or held is None or (held.size, held.root) != (kept[1].size, kept[0]):
            return None
        return kept[1]


def _transient(reason: str) -> Refusal:
    log.warning("audit: %s", reason)
    return Refusal(503, f"{reason}; try again later")
