"""``infervisor witness run --audit``: a semantic witness that reads the events it cosigns.

The :class:`ChainAuditor` is the witness's :class:`~.service.Auditor`. Before
the witness cosigns a checkpoint of size N of a log it holds at size M (0
when it holds none), the auditor:

1. brings a local mirror of the log's chain up to date: ``fetch(log,
   folder)`` with ``folder`` = ``DATA_DIR/mirrors/<SHA-256 hex of the
   origin>/``, which must leave the chain in ``folder/chain.db``. The default
   fetch (:func:`fetch_log`) copies a local chain for a ``file:`` url and
   otherwise runs ``infervisor chain pull`` (the node API's C2SP tlog-tiles);
2. checks the mirror as `infervisor audit` does, in one pass
   (:func:`infervisor.replay.audit.audit_chain`: every event re-hashes,
   docs/chain-format.md "Verification", and replays through the lifecycle
   rules), and that the RFC 6962 root of the first N event hashes is the
   checkpoint's root (chain/merkle.py);
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

from infervisor.chain.checkpoint_store import event_hashes
from infervisor.chain.errors import ChainError
from infervisor.chain.merkle import root_of_hashes
from infervisor.chain.witness_protocol import AddCheckpoint, Refusal, WitnessState
from infervisor.replay.audit import AuditReport, audit_chain

from .config import WitnessedLog

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
    API, mirrored from its tlog-tiles by ``infervisor chain pull`` with the
    read token of ``log.token_file``.

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
            finally:
                dst.close()
        finally:
            src.close()
        os.replace(tmp, folder / CHAIN_FILE)
    except sqlite3.Error as e:
        raise FetchError(f"cannot copy {source}: {e}") from e
    finally:
        tmp.unlink(missing_ok=True)


def _pull(log: WitnessedLog, url: str, folder: Path) -> None:
    token = None
    if log.token_file is not None:
        try:
            token = log.token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise FetchError(f"cannot read the token file {log.token_file}: {e}") from e
    try:
        from infervisor.tools.audit.chain_pull import pull  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
    except ImportError:
        raise FetchError(f"chain pull is not available in this build: cannot fetch {url}") from None
    try:
        pull(url, folder, token=token)
    except Exception as e:  # whatever the pull meets is the log's, and transient
        raise FetchError(f"cannot pull {url}: {e}") from e


def _b64(root: bytes) -> str:
    return base64.b64encode(root).decode("ascii")


def check_mirror(chain: Path, old: int, size: int, root: bytes) -> Refusal | None:
    """Check the mirrored ``chain`` for a checkpoint of ``size`` and ``root`` extending ``old``.

    Returns:
        None if events 0..size-1 verify, make ``root`` (RFC 6962 over the
        event hashes) and events old..size-1 break no lifecycle rule;
        otherwise a 422 `Refusal` with one line naming the first problem.

    Raises:
        ChainError: the mirror is not a readable chain (ChainIOError,
            ChainFormatError).
    """
    report = audit_chain(chain)
    bad = report.verify.problem
    if bad is not None and bad.seq < size:
        return Refusal(422, f"seq {bad.seq}: the node's event does not verify: {bad.detail}")
    if report.events < size:
        return Refusal(422, f"the node served {report.events} of {size} events")
    got = _root(chain, size)
    if got != root:
        return Refusal(
            422,
            f"the node's events 0..{size - 1} make root {_b64(got)}, "
            f"not the checkpoint's {_b64(root)}",
        )
    return _broken(report, old, size)


def _root(chain: Path, size: int) -> bytes:
    conn = sqlite3.connect(f"{chain.as_uri()}?mode=ro", uri=True)
    try:
        return root_of_hashes(event_hashes(conn, below=size))
    finally:
        conn.close()


def _broken(report: AuditReport, old: int, size: int) -> Refusal | None:
    new = [f for f in report.findings if old <= f.seq < size]
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
            try:
                return check_mirror(folder / CHAIN_FILE, held.size if held else 0, cp.size, cp.root)
            except ChainError as e:
                return _transient(f"the events fetched from {origin} are not a chain: {e}")


def _transient(reason: str) -> Refusal:
    log.warning("audit: %s", reason)
    return Refusal(503, f"{reason}; try again later")
