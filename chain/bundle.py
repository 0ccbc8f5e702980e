"""Export bundles: a chain as plain files, verifiable with no database.

Layout of a bundle directory (docs/chain-format.md, "Export bundles")::

    events.jsonl            one JSON object per event, seq order (see `event_line`)
    checkpoints/<N>.txt     each stored checkpoint (a signed note), N = tree size
    node.pub                the node's verifier key string, when known
    manifest.json           format, node, counts, head, and bytes + SHA-256 of each file

An events.jsonl line has the keys ``seq``, ``ts_ns``, ``node``, ``source``,
``kind``, ``subject`` (JSON numbers and strings), ``payload`` (base64 of the
stored bytes, RFC 4648 section 4), and ``payload_hash``, ``prev_hash``,
``hash`` (64 lowercase hex digits); keys sorted, no spaces.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from infervisor.chain import schema
from infervisor.chain.checkpoint import (
    PUBLIC_KEY_FILE,
    Checkpoint,
    compare,
    load_verifier,
    read_checkpoint_by,
)
from infervisor.chain.checkpoint_store import stored_checkpoints
from infervisor.chain.checks import Problem, Row, check_row
from infervisor.chain.connect import connect_reader, translated
from infervisor.chain.errors import BundleError, CheckpointError
from infervisor.chain.keys import rotations_in, trusted_keys
from infervisor.chain.leftovers import partial_name
from infervisor.chain.note import Verifier
from infervisor.chain.private import FOLDER_MODE, create_private, private_folder

BUNDLE_FORMAT = "infervisor-bundle/1"
EVENTS_FILE = "events.jsonl"
MANIFEST_FILE = "manifest.json"
CHECKPOINT_DIR = "checkpoints"


class BundleReport(msgspec.Struct, frozen=True, kw_only=True):
    """What `verify_bundle` found (it raises `BundleError` on the first problem).

    Attributes:
        node: the node id.
        events: events in the bundle.
        head_seq, head_hash: the last event (hash as hex).
        checkpoints: tree sizes of the checkpoints that verified.
        covered: tree size of the largest checkpoint (0: none).
        warning: what cannot be ruled out (events past the last checkpoint), or None.
    """

    node: str
    events: int
    head_seq: int
    head_hash: str
    checkpoints: list[int]
    covered: int
    warning: str | None


def event_line(row: Sequence[Any]) -> bytes:
    """Return the events.jsonl line (no newline) of a row read with `schema.SELECT_EVENTS`."""
    seq, ts_ns, node, source, kind, subject, payload, p_hash, prev, digest = row
    doc = {
        "seq": seq,
        "ts_ns": ts_ns,
        "node": _text(node),
        "source": _text(source),
        "kind": _text(kind),
        "subject": _text(subject),
        "payload": base64.b64encode(bytes(payload)).decode("ascii"),
        "payload_hash": bytes(p_hash).hex(),
        "prev_hash": bytes(prev).hex(),
        "hash": bytes(digest).hex(),
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


def _sha256_file(path: Path) -> tuple[int, str]:
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
            size += len(block)
    return size, h.hexdigest()


def export_bundle(
    db: str | os.PathLike[str], out: str | os.PathLike[str], key: str | None = None
) -> dict[str, Any]:
    """Write the bundle of the chain at `db` into the new (or empty) directory `out`.

    Args:
        key: the verifier key (string or file) to include; default: node.pub
            beside the chain file, if there is one.

    Returns:
        The manifest written.

    Raises:
        BundleError: `out` is not empty, or a text column is not UTF-8.
        CheckpointError: `key` cannot be read.
        ChainIOError: the chain cannot be read.
    """
    name, target = os.fspath(db), Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise BundleError(f"{target}: a bundle goes to a new or empty directory")
    if not target.parent.is_dir():
        raise BundleError(f"{target.parent}: no such directory (OUT's parent must exist)")
    verifier = None
    if key is not None:
        verifier = load_verifier(key)
    elif (Path(name).parent / PUBLIC_KEY_FILE).is_file():
        verifier = load_verifier(Path(name).parent / PUBLIC_KEY_FILE, None)
    # Written aside and renamed into place: a failed export leaves no half bundle.
    try:
        folder = partial_name(target, "export")  # swept by a later run if this one is killed
        folder.mkdir(mode=FOLDER_MODE)
        folder.chmod(FOLDER_MODE)  # private: it holds specs and env values; copy to hand out
    except OSError as e:
        raise BundleError(f"{target}: cannot write there: {e.strerror or e}") from e
    try:
        manifest = _write_bundle(name, folder, verifier)
        if target.exists():
            target.rmdir()
        folder.rename(target)
    except OSError as e:
        raise BundleError(f"{target}: cannot write the bundle: {e.strerror or e}") from e
    finally:
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
    return manifest


def _write_bundle(name: str, folder: Path, verifier: Verifier | None) -> dict[str, Any]:
    """Write the bundle's files into ``folder``; the manifest."""
    private_folder(folder / CHECKPOINT_DIR)
    conn = connect_reader(name, text_as_bytes=True)
    count, head_seq, head_hash, node = 0, -1, "", ""
    try:
        with translated(name, "export"):
            conn.execute("BEGIN")
            with os.fdopen(create_private(folder / EVENTS_FILE), "wb") as f:
                for row in conn.execute(schema.SELECT_EVENTS + " ORDER BY seq"):
                    try:
                        f.write(event_line(row) + b"\n")
                    except UnicodeDecodeError as e:
                        raise BundleError(
                            f"seq {row[0]}: a text column is not UTF-8 ({e}); "
                            f"run infervisor chain verify {name}",
                            seq=row[0],
                            reason="malformed row",
                        ) from e
                    count, head_seq, head_hash = count + 1, row[0], bytes(row[9]).hex()
                    if not node:
                        node = _text(row[2])
            sizes = []
            for cp in stored_checkpoints(conn):
                _write(folder / CHECKPOINT_DIR / f"{cp.tree_size}.txt", cp.note.encode())
                sizes.append(cp.tree_size)
    finally:
        conn.close()
    if verifier is not None:
        _write(folder / PUBLIC_KEY_FILE, (verifier.key_string() + "\n").encode("ascii"))
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        size, digest = _sha256_file(path)
        files[path.relative_to(folder).as_posix()] = {"bytes": size, "sha256": digest}
    manifest = {
        "format": BUNDLE_FORMAT,
        "node": node,
        "events": count,
        "head_seq": head_seq,
        "head_hash": head_hash,
        "checkpoints": sizes,
        "key": PUBLIC_KEY_FILE if verifier is not None else None,
        "files": files,
    }
    _write(folder / MANIFEST_FILE, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    return manifest


def _write(path: Path, data: bytes) -> None:
    """Write the new file ``path`` with mode 0600 (chain/private.py)."""
    with os.fdopen(create_private(path), "wb") as f:
        f.write(data)


class _Lookups:
    def __init__(self, rows: list[Row]) -> None:
        self._seqs = {r.seq for r in rows}
        self._by_hash: dict[bytes, list[int]] = {}
        for r in rows:
            self._by_hash.setdefault(r.hash, []).append(r.seq)

    def seq_exists(self, seq: int) -> bool:
        return seq in self._seqs

    def later_seq_with_hash(self, digest: bytes, seq: int) -> int | None:
        later = [s for s in self._by_hash.get(digest, []) if s > seq]
        return min(later, default=None)


def _parse_line(line: bytes, number: int, expected: int) -> Row:
    """One line of events.jsonl; a malformed one is named in this module's words,
    never Python's ("non-hexadecimal number found in fromhex()", "Expecting value"):
    a newcomer's trial, stop 33."""
    try:
        doc = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        why = "it is not JSON"
    else:
        try:
            return _decode_line(doc)
        except KeyError as e:
            why = f"no {e.args[0]!r} field"
        except (ValueError, TypeError) as e:
            why = str(e)
    raise BundleError(
        f"{EVENTS_FILE} line {number}: not an event line: {why}",
        seq=expected,
        reason="malformed row",
    )


def _hex_hash(value: Any, name: str) -> bytes:
    """A 32-byte hash written as 64 hex digits (ValueError naming ``name`` otherwise)."""
    if isinstance(value, str) and len(value) == 64:
        try:
            return bytes.fromhex(value)
        except ValueError:
            pass
    raise ValueError(f"{name} must be 32 bytes of hex (64 hex digits)")


def _decode_line(doc: Any) -> Row:
    if not isinstance(doc, dict):
        raise TypeError("not an object")
    seq, ts_ns = doc["seq"], doc["ts_ns"]
    if type(seq) is not int or type(ts_ns) is not int or seq < 0:
        raise TypeError("seq and ts_ns must be integers, seq >= 0")
    texts = [doc[k] for k in ("node", "source", "kind", "subject")]
    if not all(isinstance(t, str) for t in texts):
        raise TypeError("node, source, kind, subject must be strings")
    hashes = [_hex_hash(doc[k], k) for k in ("payload_hash", "prev_hash", "hash")]
    try:
        payload = base64.b64decode(doc["payload"], validate=True)
    except (ValueError, TypeError, binascii.Error):
        raise ValueError("payload is not base64") from None
    node, source, kind, subject = (t.encode("utf-8") for t in texts)
    return Row(seq, ts_ns, node, source, kind, subject, payload, *hashes)


def verify_bundle(out: str | os.PathLike[str], key: str | None = None) -> BundleReport:
    """Verify a bundle directory: every event, every checkpoint, then the manifest.

    Events are checked as `verify_chain` checks rows (docs/chain-format.md,
    "Verification"); each checkpoint's signature with `key` (default: the
    bundle's node.pub), then the events against it (truncated, rewritten,
    forked); then the manifest's counts and file hashes.

    Raises:
        BundleError: the first problem, with `seq` and `reason` where they apply.
    """
    folder = Path(out)
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
        lines = (folder / EVENTS_FILE).read_bytes().splitlines()
    except (OSError, ValueError) as e:
        raise BundleError(f"{folder}: not a readable bundle: {e}", reason="unreadable") from e
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{folder}: manifest format is not {BUNDLE_FORMAT!r}", reason="manifest")
    rows: list[Row] = []
    for number, line in enumerate(lines, 1):
        rows.append(_parse_line(line, number, rows[-1].seq + 1 if rows else 0))
    lookups = _Lookups(rows)
    before: Row | None = None
    genesis: Row | None = None
    for row in rows:
        problem = check_row(row, before, genesis, lookups)
        if problem is not None:
            raise _bad(problem)
        before, genesis = row, genesis or row
    if before is None or genesis is None:
        raise BundleError(f"{folder}: {EVENTS_FILE} is empty", seq=0, reason="bad genesis")
    node = genesis.node.decode()
    checkpoints = _verify_checkpoints(folder, rows, key, manifest)
    _verify_manifest(folder, manifest, len(rows))
    covered = max((c.tree_size for c in checkpoints), default=0)
    warning = None
    if covered < len(rows):
        warning = (
            f"events seq {covered}..{len(rows) - 1} are past the last signed checkpoint: "
            "their truncation or rewriting cannot be ruled out"
        )
    return BundleReport(
        node=node,
        events=len(rows),
        head_seq=before.seq,
        head_hash=before.hash.hex(),
        checkpoints=[c.tree_size for c in checkpoints],
        covered=covered,
        warning=warning,
    )


def _bad(problem: Problem) -> BundleError:
    # The seq and reason are the error's fields, which its reader puts first (once:
    # "INVALID at seq 48: payload altered:" came twice, a newcomer's trial, stop 34).
    return BundleError(problem.detail, seq=problem.seq, reason=problem.reason)


def _verify_checkpoints(
    folder: Path, rows: list[Row], key: str | None, manifest: dict[str, Any]
) -> list[Checkpoint]:
    files = sorted((folder / CHECKPOINT_DIR).glob("*.txt"), key=lambda p: (len(p.stem), p.stem))
    listed = manifest.get("checkpoints", [])
    if isinstance(listed, list) and len(listed) > len(files):
        raise BundleError(
            f"the manifest lists {len(listed)} checkpoints, {CHECKPOINT_DIR}/ holds {len(files)}",
            reason="manifest",
        )
    if not files:
        return []
    # The key given (or the bundle's), and every key a recorded rotation links to it.
    keys = trusted_keys(_bundle_key(folder, key), rotations_in((r.kind, r.payload) for r in rows))
    hashes = [r.hash for r in rows]
    signed: list[Checkpoint] = []
    for path in files:
        try:
            cp = read_checkpoint_by(path.read_bytes(), keys)
        except (CheckpointError, OSError) as e:
            raise BundleError(f"{path.name}: {e}", reason="checkpoint signature") from e
        signed.append(cp)
    signed.sort(key=lambda c: c.tree_size)
    # The latest checkpoint names the failure (truncated, rewritten, forked); the
    # earlier ones say from which seq on the events differ. Then each on its own.
    for cp in [signed[-1], *signed[:-1]]:
        mismatch = compare(hashes, cp, [c for c in signed if c.tree_size < cp.tree_size])
        if mismatch is not None:
            raise BundleError(
                f"against checkpoint of tree size {cp.tree_size}: {mismatch.detail}",
                seq=mismatch.seq,
                reason=mismatch.reason,
            )
    return signed


def _bundle_key(folder: Path, key: str | None) -> Verifier:
    try:
        if key is not None:
            return load_verifier(key)
        return load_verifier(folder / PUBLIC_KEY_FILE, None)
    except CheckpointError as e:
        raise BundleError(
            f"checkpoints cannot be checked without the node's key: {e} (pass --key PUBKEY)",
            reason="no key",
        ) from e


def _verify_manifest(folder: Path, manifest: dict[str, Any], events: int) -> None:
    if manifest.get("events") != events:
        raise BundleError(
            f"the manifest counts {manifest.get('events')} events, {EVENTS_FILE} holds {events}",
            seq=min(events, int(manifest.get("events") or 0)),
            reason="truncated",
        )
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise BundleError("the manifest has no files table", reason="manifest")
    for rel, want in sorted(files.items()):
        path = folder / rel
        if not path.is_file():
            raise BundleError(f"{rel}: listed in the manifest but missing", reason="manifest")
        size, digest = _sha256_file(path)
        if not isinstance(want, dict) or want.get("sha256") != digest or want.get("bytes") != size:
            raise BundleError(f"{rel}: sha256 or size differs from the manifest", reason="manifest")
