"""An export bundle's manifest: its shape, and its claims against what the bundle holds.

The manifest is not signed, so nothing in it is believed: `read_manifest`
checks every field's type and range (docs/chain-format.md, "Export
bundles"), `check_layout` that the bundle holds exactly the files the
manifest lists, each a regular file of the format's names, and
`check_claims` each claim (node, events, head_seq, head_hash, checkpoints,
key, and every file's bytes and SHA-256) against the contents once they
have verified. An edited manifest verified before (a newcomer's trial, stop
35): its head, node and key were never compared, and ``"events": "26"``
was reported as 'the manifest counts 26 events, events.jsonl holds 26'.

Every finding is a `BundleError` (reason ``"manifest"``, or ``"truncated"``
when the events file holds fewer lines than counted), naming the field,
what the manifest says and what the contents show.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from infervisor.chain.errors import BundleError

BUNDLE_FORMAT = "infervisor-bundle/1"
MANIFEST_FILE = "manifest.json"
EVENTS_FILE = "events.jsonl"
CHECKPOINT_DIR = "checkpoints"
KEY_NAME = "node.pub"

_HEX64 = re.compile(r"[0-9a-f]{64}")
_FILE_NAME = re.compile(
    rf"{re.escape(EVENTS_FILE)}|{re.escape(KEY_NAME)}|"
    rf"{CHECKPOINT_DIR}/(?:[1-9][0-9]*)\.txt"
)
_FILE_ENTRY = '{"bytes": a whole number >= 0, "sha256": 64 lowercase hex digits}'


class Contents(NamedTuple):
    """What the bundle was found to hold, once its events and checkpoints verified.

    Attributes:
        node: the genesis's node id.
        events: lines of events.jsonl.
        head_seq, head_hash: the last event's seq and hash (hex).
        checkpoints: tree sizes of the checkpoint files, increasing.
        key: whether the bundle holds node.pub.
    """

    node: str
    events: int
    head_seq: int
    head_hash: str
    checkpoints: list[int]
    key: bool


def _found(value: object) -> str:
    """A value as JSON with its JSON type: ``"26" (a string)``, ``true (a boolean)``."""
    text = json.dumps(value)
    if len(text) > 80:
        text = text[:79] + "…"
    kinds = {
        bool: "a boolean",
        str: "a string",
        float: "a number",
        list: "a list",
        dict: "an object",
    }
    kind = kinds.get(type(value))
    return f"{text} ({kind})" if kind else text


def _whole(low: int) -> Callable[[object], bool]:
    return lambda v: type(v) is int and v >= low


def _hex64(value: object) -> bool:
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None


def _increasing(value: object) -> bool:
    return (
        isinstance(value, list)
        and all(type(v) is int and v >= 1 for v in value)
        and all(a < b for a, b in itertools.pairwise(value))
    )


# field: (what is allowed, the check)
_FIELDS: dict[str, tuple[str, Callable[[object], bool]]] = {
    "checkpoints": ("a list of whole numbers >= 1, increasing (tree sizes)", _increasing),
    "events": ("a whole number >= 1", _whole(1)),
    "files": (f"an object of file name: {_FILE_ENTRY}", lambda v: isinstance(v, dict)),
    "format": (json.dumps(BUNDLE_FORMAT), lambda v: v == BUNDLE_FORMAT),
    "head_hash": ("64 lowercase hex digits", _hex64),
    "head_seq": ("a whole number >= 0", _whole(0)),
    "key": (f'"{KEY_NAME}" or null', lambda v: v is None or v == KEY_NAME),
    "node": ("a non-empty string (the node id)", lambda v: isinstance(v, str) and v != ""),
}


class KeyTwice(ValueError):
    """A key given twice in one JSON object (RFC 8259: then 'unpredictable')."""


def no_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` refusing a key given twice: json.loads keeps the last one,
    other readers the first, so the bundle would say two things.

    Raises:
        ValueError: naming the key.
    """
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise KeyTwice(f"the key {key!r} is given twice")
            seen.add(key)
    return doc


def _bad(message: str) -> BundleError:
    return BundleError(f"{MANIFEST_FILE}: {message}", reason="manifest")


def read_manifest(data: bytes) -> dict[str, Any]:
    """Parse manifest.json and check every field's type and range.

    Raises:
        BundleError: reason "manifest" (not JSON, a key given twice, a field
            missing, unknown or of the wrong type or range), naming the field
            and what is allowed.
    """
    try:
        doc = json.loads(data, object_pairs_hook=no_twice)
    except KeyTwice as e:
        raise _bad(str(e)) from e
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise _bad(f"not JSON ({e})") from e
    if not isinstance(doc, dict):
        raise _bad(f"must be a JSON object, found {_found(doc)}")
    if doc.get("format", BUNDLE_FORMAT) != BUNDLE_FORMAT:
        raise _bad(f"format must be {json.dumps(BUNDLE_FORMAT)}, found {_found(doc['format'])}")
    for name in doc:
        if name not in _FIELDS:
            raise _bad(f"unknown field {name!r} (fields: {', '.join(_FIELDS)})")
    for name, (allowed, ok) in _FIELDS.items():
        if name not in doc:
            raise _bad(f"no {name!r} field ({allowed})")
        if not ok(doc[name]):
            raise _bad(f"{name} must be {allowed}, found {_found(doc[name])}")
    for rel, entry in doc["files"].items():
        _check_entry(rel, entry)
    return doc


def _check_entry(rel: str, entry: object) -> None:
    if not _FILE_NAME.fullmatch(rel):
        raise _bad(
            f"files: {rel!r} is not a bundle file ({EVENTS_FILE}, {KEY_NAME}, "
            f"{CHECKPOINT_DIR}/<tree size>.txt)"
        )
    field = f"files.{rel}"
    if not isinstance(entry, dict) or set(entry) != {"bytes", "sha256"}:
        raise _bad(f"{field} must be an object of {_FILE_ENTRY}, found {_found(entry)}")
    if not _whole(0)(entry["bytes"]):
        raise _bad(f"{field}.bytes must be a whole number >= 0, found {_found(entry['bytes'])}")
    if not _hex64(entry["sha256"]):
        raise _bad(
            f"{field}.sha256 must be 64 lowercase hex digits, found {_found(entry['sha256'])}"
        )


def check_layout(folder: Path, manifest: dict[str, Any]) -> None:
    """The bundle holds exactly manifest.json and the files the manifest lists, each a
    regular file (never a link, a directory or a FIFO, which a read could block on).

    Raises:
        BundleError: reason "manifest", naming the file.
    """
    listed = set(manifest["files"])
    found: set[str] = set()
    for entry in sorted(folder.iterdir()):
        if entry.name == CHECKPOINT_DIR and _kind(entry) == "directory":
            found.update(_present(entry, f"{CHECKPOINT_DIR}/", listed))
        elif entry.name != MANIFEST_FILE:
            found.update(_present(entry, "", listed))
    if EVENTS_FILE not in listed:
        raise _bad(f"files does not list {EVENTS_FILE}")
    missing = sorted(listed - found)
    if missing:
        raise BundleError(f"{missing[0]}: listed in the manifest but missing", reason="manifest")


def _present(entry: Path, prefix: str, listed: set[str]) -> list[str]:
    """The names of the files at ``entry`` (a file, or the checkpoints directory's
    files), each listed and regular."""
    entries = sorted(entry.iterdir()) if prefix else [entry]
    names = []
    for path in entries:
        rel, kind = prefix + path.name, _kind(path)
        if rel not in listed:  # listed names are the format's (read_manifest)
            raise BundleError(
                f"{rel}: in the bundle but not in the manifest's files (a bundle holds "
                f"{MANIFEST_FILE}, {EVENTS_FILE}, {KEY_NAME} and {CHECKPOINT_DIR}/<tree size>.txt "
                "alone)",
                reason="manifest",
            )
        if kind != "file":
            raise BundleError(f"{rel}: a {kind}, not a regular file", reason="manifest")
        names.append(rel)
    return names


def _kind(path: Path) -> str:
    mode = path.lstat().st_mode
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    return "symbolic link" if stat.S_ISLNK(mode) else "special file"


def check_claims(folder: Path, manifest: dict[str, Any], found: Contents) -> None:
    """Each of the manifest's claims against what the bundle was found to hold, then
    each file's size and SHA-256.

    Raises:
        BundleError: reason "truncated" (fewer event lines than the manifest
            counts; seq: the first missing), else "manifest", naming the field,
            what the manifest says and what the contents show.
    """
    said = manifest["events"]
    if said > found.events:
        raise BundleError(
            f"{MANIFEST_FILE} events: the manifest says {said}, {EVENTS_FILE} holds "
            f"{found.events}: {_seqs(found.events, said - 1)} missing",
            seq=found.events,
            reason="truncated",
        )
    shown = {
        "events": (found.events, f"{EVENTS_FILE} holds"),
        "node": (found.node, "the events show (the genesis's node)"),
        "head_seq": (found.head_seq, "the events show (the last line's seq)"),
        "head_hash": (found.head_hash, "the events show (the last line's hash)"),
        "checkpoints": (found.checkpoints, f"the checkpoint files show ({CHECKPOINT_DIR}/)"),
        "key": (KEY_NAME if found.key else None, "the bundle holds"),
    }
    for field, (value, where) in shown.items():
        if manifest[field] != value:
            raise _claim(field, manifest[field], value, where)
    for rel, want in sorted(manifest["files"].items()):
        try:
            size, digest = sha256_file(folder / rel)
        except OSError as e:
            raise BundleError(
                f"{rel}: cannot be read: {e.strerror or e}", reason="unreadable"
            ) from e
        if (want["bytes"], want["sha256"]) != (size, digest):
            raise BundleError(
                f"{rel}: the manifest says {want['bytes']} bytes, sha256 {want['sha256']}; "
                f"the file has {size} bytes, sha256 {digest}",
                reason="manifest",
            )


def _seqs(first: int, last: int) -> str:
    return f"seq {first} is" if first == last else f"seq {first}..{last} are"


def _claim(field: str, said: object, value: object, where: str) -> BundleError:
    def shown(v: object) -> str:
        return "null" if v is None else repr(v)

    verb, _, aside = where.partition(" (")
    aside = f" ({aside}" if aside else ""
    return BundleError(
        f"{MANIFEST_FILE} {field}: the manifest says {shown(said)}, {verb} {shown(value)}{aside}",
        reason="manifest",
    )


def sha256_file(path: Path) -> tuple[int, str]:
    """(bytes, SHA-256 hex) of the file at ``path``, read in 1 MiB blocks."""
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
            size += len(block)
    return size, h.hexdigest()
