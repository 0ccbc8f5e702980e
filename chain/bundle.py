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
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from infervisor.chain import schema
from infervisor.chain.bundle_manifest import (
    BUNDLE_FORMAT,
    CHECKPOINT_DIR,
    EVENTS_FILE,
    MANIFEST_FILE,
    Contents,
    KeyTwice,
    check_claims,
    check_layout,
    no_twice,
    read_manifest,
    sha256_file,
)
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
from infervisor.chain.errors import BundleError, CheckpointError, NoteError
from infervisor.chain.keys import rotations_in, trusted_keys
from infervisor.chain.leftovers import partial_name
from infervisor.chain.note import Verifier, split_note
from infervisor.chain.private import FOLDER_MODE, create_private, private_folder

__all__ = [
    "BUNDLE_FORMAT",
    "CHECKPOINT_DIR",
    "EVENTS_FILE",
    "MANIFEST_FILE",
    "BundleReport",
    "event_line",
    "export_bundle",
    "verify_bundle",
]


_INT64_MAX = (1 << 63) - 1


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
        size, digest = sha256_file(path)
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
    a newcomer's trial, stop 33. A key given twice is refused: json.loads keeps the
    last, other readers the first (stop 35)."""
    try:
        doc = json.loads(line, object_pairs_hook=no_twice)
    except KeyTwice as e:
        why = str(e)
    except (ValueError, UnicodeDecodeError, RecursionError):
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
    # The header packs them as uint64 and int64 (docs/chain-format.md, sections 3-4);
    # SQLite's integers are signed 64 bits. Beyond, struct.error was a traceback.
    if type(seq) is not int or type(ts_ns) is not int or seq < 0:
        raise TypeError("seq and ts_ns must be integers, seq >= 0")
    if seq > _INT64_MAX or not -_INT64_MAX - 1 <= ts_ns <= _INT64_MAX:
        raise ValueError("seq must be at most 2^63-1, ts_ns from -2^63 to 2^63-1")
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
    """Verify a bundle directory: its manifest's shape and files, every event, every
    checkpoint, then each of the manifest's claims (docs/chain-format.md, section 13).

    The manifest's fields are checked for type and range and the bundle for
    exactly the files it lists (chain/bundle_manifest.py); events are checked
    as `verify_chain` checks rows (section 5); each checkpoint's signature
    with `key` (default: the bundle's node.pub), its file name against its
    tree size, then the events against it (truncated, rewritten, forked);
    then the manifest's node, counts, head, checkpoints, key and file hashes
    against what the bundle holds.

    Raises:
        BundleError: the first problem, with `seq` and `reason` where they apply.
    """
    folder = Path(out)
    try:
        manifest = read_manifest((folder / MANIFEST_FILE).read_bytes())
        check_layout(folder, manifest)
        data = (folder / EVENTS_FILE).read_bytes()
    except OSError as e:
        raise BundleError(f"{folder}: not a readable bundle: {e}", reason="unreadable") from e
    rows = _rows(data)
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
    checkpoints = _verify_checkpoints(folder, rows, key)
    sizes = [c.tree_size for c in checkpoints]
    node = genesis.node.decode()
    held_key = (folder / PUBLIC_KEY_FILE).is_file()
    found = Contents(node, len(rows), before.seq, before.hash.hex(), sizes, held_key)
    check_claims(folder, manifest, found)
    covered = max(sizes, default=0)
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
        checkpoints=sizes,
        covered=covered,
        warning=warning,
    )


def _rows(data: bytes) -> list[Row]:
    """The events of events.jsonl's bytes: one line each, every line ended by a newline.

    A last line with no newline after it is a file that was cut (section 13: one
    newline after each line), named as truncated at that line's seq, rather than
    as a line that is 'not JSON' or, cut at a line's end, not at all (stop 35).
    """
    lines = data.split(b"\n")
    cut = lines.pop()  # b"" when the file ends with a newline
    rows: list[Row] = []
    for number, line in enumerate(lines, 1):
        rows.append(_parse_line(line, number, rows[-1].seq + 1 if rows else 0))
    if cut:
        raise BundleError(
            f"{EVENTS_FILE} ends inside line {len(lines) + 1} (no newline after its "
            f"{len(cut)} bytes): the file was cut; seq {len(rows)} on are missing",
            seq=len(rows),
            reason="truncated",
        )
    return rows


def _bad(problem: Problem) -> BundleError:
    # The seq and reason are the error's fields, which its reader puts first (once:
    # "INVALID at seq 48: payload altered:" came twice, a newcomer's trial, stop 34).
    return BundleError(problem.detail, seq=problem.seq, reason=problem.reason)


def _verify_checkpoints(folder: Path, rows: list[Row], key: str | None) -> list[Checkpoint]:
    """Each checkpoint file's signature, name and signers, then the events against them;
    the checkpoints, smallest tree first."""
    files = sorted((folder / CHECKPOINT_DIR).glob("*.txt"), key=lambda p: (len(p.stem), p.stem))
    if not files and key is None:
        return []
    # The key given (or the bundle's), and every key a recorded rotation links to it.
    keys = trusted_keys(_bundle_key(folder, key), rotations_in((r.kind, r.payload) for r in rows))
    if key is not None and (folder / PUBLIC_KEY_FILE).is_file():
        _same_node_key(folder, keys)
    if not files:
        return []
    hashes = [r.hash for r in rows]
    signed = sorted((_read_checkpoint(path, keys) for path in files), key=lambda c: c.tree_size)
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


def _read_checkpoint(path: Path, keys: list[Verifier]) -> Checkpoint:
    """A checkpoint file whose signature verifies, whose name is its tree size, and
    which carries no signature but a trusted key's.

    A bundle carries the node's signatures alone (export writes the stored note, no
    cosignature), and nothing here checks another key's: a line that reads as a
    witness's cosignature, of this checkpoint or of another, is refused rather than
    left for a person to take as one (stop 35).
    """
    rel = f"{CHECKPOINT_DIR}/{path.name}"
    try:
        note = path.read_bytes()
        cp = read_checkpoint_by(note, keys)
        signers = split_note(note)[1]
    except (CheckpointError, NoteError, OSError) as e:
        raise BundleError(f"{rel}: {e}", reason="checkpoint signature") from e
    known = {(k.name, k.key_id) for k in keys}
    for sig in signers:
        if (sig.name, sig.key_id) not in known:
            raise BundleError(
                f"{rel}: carries a signature line of {sig.name} (key id {sig.key_id.hex()}), "
                "not a node key: a bundle carries no cosignatures, and verify-bundle "
                "checks none; remove the line, or check the witness's cosignature with "
                "infervisor chain verify on the chain",
                reason="checkpoint signature",
            )
    if str(cp.tree_size) != path.stem:
        raise BundleError(
            f"{rel} holds the checkpoint of tree size {cp.tree_size}: a checkpoint file "
            f"is named by its tree size ({CHECKPOINT_DIR}/{cp.tree_size}.txt)",
            reason="manifest",
        )
    return cp


def _same_node_key(folder: Path, keys: list[Verifier]) -> None:
    """The bundle's node.pub is the key given, or one a recorded rotation links to it:
    a bundle handing out another key as the node's is refused (stop 35)."""
    try:
        held = load_verifier(folder / PUBLIC_KEY_FILE, None)
    except CheckpointError as e:
        raise BundleError(f"{PUBLIC_KEY_FILE}: {e}", reason="node key") from e
    if held.key_string() not in {k.key_string() for k in keys}:
        raise BundleError(
            f"{PUBLIC_KEY_FILE}: the bundle's key {held.key_string()} is neither the key "
            "given (--key) nor one a recorded rotation links to it",
            reason="node key",
        )


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
