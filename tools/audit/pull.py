"""Mirror a node's chain from its tlog-tiles log, verifying as it goes.

`pull(url, folder)` fetches ``<url>/v1/log/checkpoint``, checks its signature
(the key given, else the one pinned in the folder by the first pull, else
the node's own ``/v1/log/key``: trusted on first use), checks that it extends
the checkpoint the folder holds (an RFC 6962 consistency proof; a smaller
size is a rollback), then fetches the new events' entry bundles and level-0
hash tiles: each entry's event hash is recomputed (chain/checks.py), linked
to the one before, its leaf hash compared with the tile's, and the tree they
make must have the signed root. Only then are the events and the checkpoint
committed to ``folder/chain.db`` in one transaction (a chain file every reader
opens). A pull killed midway leaves ``chain.db`` as it was; what it had fetched
is kept in ``folder/pull.partial.db`` and checked again by the next run.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import msgspec

from infervisor.adapters.tls import client_tls
from infervisor.chain import cosignature_store, schema
from infervisor.chain.checkpoint import KEY_FILE, PUBLIC_KEY_FILE, Checkpoint, read_checkpoint
from infervisor.chain.checkpoint_store import (
    create_table,
    event_hashes,
    frontier_of,
    latest_checkpoint,
)
from infervisor.chain.checks import Row, check_row, parse_row
from infervisor.chain.connect import connect_writer
from infervisor.chain.errors import ChainError, NoteError, ProofError
from infervisor.chain.merkle import CompactTree, leaf_hash, verify_consistency
from infervisor.chain.note import Verifier, parse_signature_line, parse_verifier_key, split_note
from infervisor.chain.tiles import Tile, TileError, entry_row, parse_entry_bundle, tile_for

from .chain_inputs import verifier

__all__ = ["PullError", "PullReport", "pull"]

CHAIN_FILE = "chain.db"
PARTIAL_FILE = "pull.partial.db"
FETCHERS = 4
"""Tiles and bundles fetched at once, ahead of the verification."""
CHECKPOINT_DIR = "checkpoints"
TRUST_GIVEN = "the key given"
TRUST_PINNED = "the key pinned by the first pull"
TRUST_FIRST_USE = "trusted on first use: the node's own key, fetched from it and now pinned"
_REFUSED_TOKEN = "the node refused the token given: any of its [api] tokens reads the log"  # noqa: S105
_NO_TOKEN = "a token of scope read (or more) is needed (--token, --token-file)"  # noqa: S105

Progress = Callable[[int, int], None]


class PullError(Exception):
    """A pull that could not be done or was refused; ``code`` as docs/cli.md's table."""

    def __init__(self, message: str, code: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code, self.field = code, field


class PullReport(msgspec.Struct, frozen=True, kw_only=True):
    """What a pull did.

    Attributes:
        url: the log's prefix (``.../v1/log``).
        folder: the mirror's folder.
        node: the node id the checkpoint names.
        old_size, new_size: events held before and after.
        added: events added (new_size - old_size).
        resumed: events taken from an interrupted pull instead of fetched again.
        trust: where the key that verified the checkpoint came from.
    """

    url: str
    folder: str
    node: str
    old_size: int
    new_size: int
    added: int
    resumed: int
    trust: str


class _Proof(msgspec.Struct):
    proof: list[str]


class _NoLookups:
    """check_row asks only about rows already known bad; the message suffices."""

    def seq_exists(self, seq: int) -> bool:
        return False

    def later_seq_with_hash(self, digest: bytes, seq: int) -> int | None:
        return None


class _Log:
    """GETs of one tlog-tiles prefix with a bearer token."""

    def __init__(self, url: str, token: str | None, timeout_s: float) -> None:
        base = url.rstrip("/")
        self.prefix = base if base.endswith("/v1/log") else base + "/v1/log"
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(headers=headers, timeout=timeout_s, verify=client_tls())

    def get(self, path: str, params: dict[str, int] | None = None) -> bytes:
        url = f"{self.prefix}/{path}"
        try:
            answer = self._client.get(url, params=params)
        except httpx.HTTPError as e:
            raise PullError(f"{url}: no answer ({e})", "node_unreachable", "URL") from e
        if answer.status_code == 401:
            sent = "authorization" in self._client.headers  # the node never says why it refused
            why = _REFUSED_TOKEN if sent else _NO_TOKEN
            raise PullError(f"{url}: 401: {why}", "unauthorized", "--token")
        if answer.status_code == 403:
            raise PullError(f"{url}: 403: the token may not read the log", "forbidden")
        if answer.status_code != 200:
            raise PullError(f"{url}: HTTP {answer.status_code}: {answer.text[:200]}", "node_error")
        return answer.content

    def close(self) -> None:
        self._client.close()


def pull(
    url: str,
    folder: str | os.PathLike[str],
    *,
    token: str | None = None,
    key: str | None = None,
    progress: Progress | None = None,
    timeout_s: float = 30.0,
) -> PullReport:
    """Mirror the node at `url` (its API base, or ``.../v1/log``) into `folder`.

    Args:
        key: the node's verifier key (string or file); default: the one pinned
            in `folder`, else the node's own (trusted on first use, then pinned).
        progress: called with (events done, events to fetch) after each bundle.

    Raises:
        PullError: unreachable, refused (401/403), a bad signature, a fork or
            rollback (naming both sizes), an entry or tile that does not verify.
    """
    dest = Path(folder)
    if (dest / KEY_FILE).exists():
        raise PullError(f"{dest} is a node's data directory (it has {KEY_FILE})", "bad_path", "DIR")
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PullError(f"{dest}: cannot create it: {e.strerror or e}", "bad_path", "DIR") from e
    log = _Log(url, token, timeout_s)
    try:
        verifier, trust = _trusted_key(dest, key, log)
        note = log.get("checkpoint").decode("utf-8", "replace")
        try:
            cp = read_checkpoint(note, verifier)
        except (ChainError, NoteError) as e:
            raise PullError(f"the node's checkpoint: {e}", "checkpoint_invalid") from e
        mirror = _Mirror(dest / CHAIN_FILE, dest / PARTIAL_FILE)
        try:
            return mirror.extend(
                log, cp=cp, note=note, verifier=verifier, trust=trust, progress=progress
            )
        except sqlite3.Error as e:
            raise PullError(f"{dest / CHAIN_FILE}: {e}", "chain_invalid", "DIR") from e
        finally:
            mirror.close()
    finally:
        log.close()


def _trusted_key(dest: Path, key: str | None, log: _Log) -> tuple[Verifier, str]:
    pinned_file = dest / PUBLIC_KEY_FILE
    pinned = _read_key(pinned_file.read_text(), str(pinned_file)) if pinned_file.exists() else None
    if key is not None:
        given = verifier(key)  # a key string or a file holding one, as every --key
        if pinned is not None and pinned.key_string() != given.key_string():
            raise PullError(
                f"--key is not the key pinned in {pinned_file} ({pinned.key_string()})",
                "bad_key",
                "--key",
            )
        return given, TRUST_GIVEN
    if pinned is not None:
        return pinned, TRUST_PINNED
    return _read_key(log.get("key").decode("ascii", "replace"), "the node's key"), TRUST_FIRST_USE


def _read_key(text: str, what: str) -> Verifier:
    try:
        return parse_verifier_key(text.strip())
    except NoteError as e:
        raise PullError(f"{what}: {e}", "bad_key", "--key") from e


class _Mirror:
    """The folder's chain.db (one write transaction per pull) and its partial fetches."""

    def __init__(self, db: Path, partial: Path) -> None:
        self.db, self.partial_path = db, partial
        try:
            self.conn = connect_writer(str(db))
            self.conn.execute("BEGIN IMMEDIATE")
            if schema.is_empty(self.conn):
                schema.create(self.conn)
            create_table(self.conn)
        except (ChainError, sqlite3.Error) as e:
            raise PullError(f"{db}: cannot write the mirror: {e}", "bad_path", "DIR") from e
        self.staged = sqlite3.connect(partial)
        # WAL + NORMAL: a commit is not fsynced; a killed process loses nothing committed,
        # and what an OS crash loses is fetched again.
        self.staged.execute("PRAGMA journal_mode=WAL")
        self.staged.execute("PRAGMA synchronous=NORMAL")
        self.staged.execute("CREATE TABLE IF NOT EXISTS entries (seq INTEGER PRIMARY KEY, e BLOB)")

    def close(self) -> None:
        """Close both; the partial file goes once a pull is committed (nothing left in it)."""
        done = not self.conn.in_transaction
        if not done:
            self.conn.execute("ROLLBACK")
        self.conn.close()
        self.staged.close()
        if done:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.partial_path}{suffix}").unlink(missing_ok=True)

    def held(self, verifier: Verifier) -> tuple[int, bytes | None]:
        latest = latest_checkpoint(self.conn)
        if latest is None:
            return 0, None
        try:
            return latest.tree_size, read_checkpoint(latest.note, verifier).root
        except (ChainError, NoteError) as e:
            raise PullError(f"{self.db}: its latest checkpoint: {e}", "checkpoint_invalid") from e

    def extend(
        self,
        log: _Log,
        *,
        cp: Checkpoint,
        note: str,
        verifier: Verifier,
        trust: str,
        progress: Progress | None,
    ) -> PullReport:
        old, old_root = self.held(verifier)
        _check_extends(log, old, old_root, cp)
        tree = self._tree(old)
        before, genesis = self._row(old - 1), self._row(0)
        resumed = 0
        for tile, hashes, entries, reused in self._fetched(
            log, list(_bundles(old, cp.tree_size)), old
        ):
            rows = self._bundle(tile, hashes, entries, old, reused=reused)
            resumed += len(rows) if reused else 0
            for row in rows:
                before = _check(row, before, genesis)
                genesis = genesis or row
                tree.append_hash(leaf_hash(row.hash))
            self.conn.executemany(schema.INSERT_EVENT, [_insert_params(row) for row in rows])
            if progress is not None:
                progress(min(tile.start + tile.width, cp.tree_size) - old, cp.tree_size - old)
        if tree.root() != cp.root:
            raise PullError(
                f"the events fetched make root {tree.root().hex()}, not the signed "
                f"{cp.root.hex()} of size {cp.tree_size}",
                "chain_invalid",
            )
        self._commit(cp, note, tree, verifier)
        return PullReport(
            url=log.prefix,
            folder=str(self.db.parent),
            node=cp.node,
            old_size=old,
            new_size=cp.tree_size,
            added=cp.tree_size - old,
            resumed=resumed,
            trust=trust,
        )

    def _tree(self, size: int) -> CompactTree:
        tree = frontier_of(self.conn, size)
        if tree is None:
            tree = CompactTree()
            for h in event_hashes(self.conn, below=size):
                tree.append(h)
        return tree

    def _row(self, seq: int) -> Row | None:
        if seq < 0:
            return None
        raw = self.conn.execute(schema.SELECT_EVENTS + " WHERE seq = ?", (seq,)).fetchone()
        if raw is None:
            return None
        texts = tuple(v.encode() if isinstance(v, str) else v for v in raw)
        found = parse_row(texts, seq)
        return found if isinstance(found, Row) else None

    def _fetched(
        self, log: _Log, tiles: list[Tile], old: int
    ) -> Iterator[tuple[Tile, bytes, list[bytes], bool]]:
        """Each bundle's level-0 tile and entries from seq `old` on (staged ones reused),
        in order, fetched `FETCHERS` at a time ahead of the caller (tlog-tiles: clients
        fetch tiles in parallel)."""
        window: deque[tuple[Tile, list[bytes] | None, Future[tuple[bytes, bytes | None]]]]
        window = deque()
        pending = iter(tiles)
        with ThreadPoolExecutor(FETCHERS, thread_name_prefix="pull") as pool:

            def ahead() -> None:
                tile = next(pending, None)
                if tile is not None:
                    staged = self._staged(max(old, tile.start), tile.start + tile.width)
                    window.append((tile, staged, pool.submit(_fetch, log, tile, staged is None)))

            for _ in range(2 * FETCHERS):
                ahead()
            while window:
                tile, staged, future = window.popleft()
                ahead()
                hashes, bundle = future.result()
                if staged is not None:
                    yield tile, hashes, staged, True
                    continue
                try:
                    entries = parse_entry_bundle(bundle or b"")
                except TileError as e:
                    raise PullError(f"{tile.path()}: {e}", "chain_invalid") from e
                yield tile, hashes, entries[max(old, tile.start) - tile.start :], False

    def _staged(self, first: int, end: int) -> list[bytes] | None:
        """The entries of seqs first..end-1 kept by an interrupted pull, if all are."""
        rows = self.staged.execute(
            "SELECT e FROM entries WHERE seq >= ? AND seq < ? ORDER BY seq", (first, end)
        ).fetchall()
        return [bytes(e) for (e,) in rows] if len(rows) == end - first else None

    def _bundle(
        self, tile: Tile, hashes: bytes, entries: list[bytes], old: int, *, reused: bool
    ) -> list[Row]:
        """The rows of bundle `tile` from seq `old` on, each matched with the level-0 tile."""
        first, end = max(old, tile.start), tile.start + tile.width
        if len(hashes) != 32 * tile.width:
            raise PullError(
                f"{tile.path()}: the level-0 tile is not {tile.width} hashes", "chain_invalid"
            )
        rows = []
        for seq, entry in zip(range(first, end), entries, strict=False):
            row = _entry(entry, seq, tile)
            at = (seq - tile.start) * 32
            if leaf_hash(row.hash) != hashes[at : at + 32]:
                self._drop_partial()
                raise PullError(
                    f"the event at seq {seq} does not hash to its leaf in tile/0 "
                    f"{tile.n}: the node serves tiles and entries that disagree",
                    "chain_invalid",
                )
            rows.append(row)
        if len(rows) != end - first:
            raise PullError(
                f"{tile.path()}: {len(rows)} entries, not {end - first}", "chain_invalid"
            )
        if not reused:
            with self.staged:  # one transaction per bundle
                self.staged.executemany(
                    "INSERT OR REPLACE INTO entries VALUES (?, ?)",
                    zip(range(first, end), entries, strict=True),
                )
        return rows

    def _drop_partial(self) -> None:
        with self.staged:
            self.staged.execute("DELETE FROM entries")

    def _commit(self, cp: Checkpoint, note: str, tree: CompactTree, verifier: Verifier) -> None:
        """Store the checkpoint (the node's signature) and the witnesses' cosignature
        lines it carries (as the node stores them: not verified here, a reader checks
        them against its witness policy) with the events, in the one transaction; the
        note as served goes to checkpoints/<size>.txt."""
        own, cosigned = _split(note, verifier)
        if cp.tree_size > self.held(verifier)[0]:
            self.conn.execute(
                "INSERT INTO checkpoints (tree_size, ts_ns, note) VALUES (?, ?, ?)",
                (cp.tree_size, time.time_ns(), own),
            )
            self.conn.execute(
                "INSERT OR REPLACE INTO checkpoint_frontiers VALUES (?, ?)",
                (cp.tree_size, tree.frontier()),
            )
        cosignature_store.create_table(self.conn)
        self.conn.executemany(
            "INSERT OR IGNORE INTO cosignatures VALUES (?, ?, ?, ?, ?)",
            [(cp.tree_size, *row) for row in cosigned],
        )
        self.conn.execute("COMMIT")
        folder = self.db.parent
        (folder / CHECKPOINT_DIR).mkdir(exist_ok=True)
        (folder / CHECKPOINT_DIR / f"{cp.tree_size}.txt").write_text(note)
        if not (folder / PUBLIC_KEY_FILE).exists():
            (folder / PUBLIC_KEY_FILE).write_text(verifier.key_string() + "\n")
        self._drop_partial()


_COSIGNATURE_SIZE = 4 + 8 + 64
"""key ID, timestamp, Ed25519 signature: a cosignature/v1 line's bytes (tlog-cosignature)."""


def _split(note: str, verifier: Verifier) -> tuple[str, list[tuple[str, bytes, int, str]]]:
    """`note` with only `verifier`'s signature lines, and the cosignature/v1 lines
    it also carries as (witness, key ID, timestamp, line); split_note checked its shape."""
    text, _ = split_note(note)
    own, cosigned = [], []
    for line in note[len(text) + 1 :].splitlines():
        sig = parse_signature_line(line)
        if sig.name == verifier.name and sig.key_id == verifier.key_id:
            own.append(line + "\n")
        elif len(sig.signature) == _COSIGNATURE_SIZE - 4:
            stamp = int.from_bytes(sig.signature[:8], "big")
            cosigned.append((sig.name, sig.key_id, stamp, line))
    return text + "\n" + "".join(own), cosigned


def _check_extends(log: _Log, old: int, old_root: bytes | None, cp: Checkpoint) -> None:
    """Refuse a checkpoint that does not extend the one held (rollback or fork)."""
    if old_root is None:
        return
    if cp.tree_size < old:
        raise PullError(
            f"rollback refused: the node's checkpoint is of size {cp.tree_size}, "
            f"smaller than the size {old} this mirror holds signed",
            "chain_invalid",
        )
    proof: list[bytes] = []
    if cp.tree_size > old:
        raw = log.get("proof/consistency", {"old": old, "new": cp.tree_size})
        try:
            proof = [bytes.fromhex(h) for h in msgspec.json.decode(raw, type=_Proof).proof]
        except (msgspec.DecodeError, ValueError) as e:
            raise PullError(f"the node's consistency proof is malformed: {e}", "node_error") from e
    try:
        verify_consistency(old, cp.tree_size, old_root, cp.root, proof)
    except ProofError as e:
        raise PullError(
            f"fork refused: the node's checkpoint of size {cp.tree_size} is not consistent "
            f"with the one of size {old} this mirror holds ({e})",
            "chain_invalid",
        ) from e


def _bundles(old: int, new: int) -> Iterator[Tile]:
    """The entry bundles holding seqs old..new-1 in the tree of `new` events."""
    for index in range(old // 256, (new + 255) // 256):
        tile = tile_for(Tile(-1, index), new)
        if tile is not None:
            yield tile


def _entry(entry: bytes, seq: int, tile: Tile) -> Row:
    try:
        row = entry_row(entry)
    except TileError as e:
        raise PullError(f"{tile.path()}: seq {seq}: {e}", "chain_invalid") from e
    if row.seq != seq:
        raise PullError(f"{tile.path()}: entry {seq} holds seq {row.seq}", "chain_invalid")
    return row


def _check(row: Row, before: Row | None, genesis: Row | None) -> Row:
    """Recompute the row's hashes and check its link; return it as the next `before`."""
    problem = check_row(row, before, genesis, _NoLookups())
    if problem is not None:
        raise PullError(
            f"the event at seq {problem.seq} does not verify ({problem.reason}: {problem.detail})",
            "chain_invalid",
        )
    return row


def _insert_params(row: Row) -> tuple[object, ...]:
    texts = (row.node, row.source, row.kind, row.subject)
    return (row.seq, row.ts_ns, *(t.decode("utf-8") for t in texts), *row[6:])


def _fetch(log: _Log, tile: Tile, bundle: bool) -> tuple[bytes, bytes | None]:
    """The level-0 tile of bundle `tile`, and (`bundle`) the bundle itself."""
    hashes = log.get(Tile(0, tile.n, tile.width).path())
    return hashes, log.get(tile.path()) if bundle else None
