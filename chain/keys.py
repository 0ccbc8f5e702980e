"""Rotation of a node's checkpoint key, recorded as a signed event in its chain.

The event (docs/chain-format.md, "Key rotation") has kind
`KEY_ROTATED_KIND`, source ``node``, subject ``""`` and the canonical JSON
payload ``{"new_key": <verifier key>, "note": <signed note>, "old_key":
<verifier key>}``. The note's text is::

    infervisor key rotation
    <origin>
    old <old verifier key>
    new <new verifier key>

signed (C2SP signed-note) by the old key, which authorises the change, and
by the new key, which shows it is held. A checkpoint signed with the new key
follows at once; earlier checkpoints stay verifiable with the old public
key, kept as ``node.pub.<old key id hex>``.

Run it only while no node runs on the data directory (the node holds the
key); the command line checks the run lock.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from infervisor.chain.checkpoint import (
    KEY_FILE,
    PUBLIC_KEY_FILE,
    load_signer,
    write_public_key,
)
from infervisor.chain.checkpoint_store import Checkpointer
from infervisor.chain.errors import CheckpointError, NoteError
from infervisor.chain.note import Signer, Verifier, open_note, parse_verifier_key, sign_note
from infervisor.chain.records import EventDraft, StoredEvent, encode_payload
from infervisor.chain.sqlite import SqliteChain

KEY_ROTATED_KIND = "chain.key_rotated"
"""Kind of the event that records a key rotation."""

_TITLE = "infervisor key rotation"


class Rotation(NamedTuple):
    """A key rotation that was recorded.

    Attributes:
        old, new: the verifier keys.
        event: the stored rotation event.
        checkpoint_size: tree size of the first checkpoint signed by the new key.
    """

    old: Verifier
    new: Verifier
    event: StoredEvent
    checkpoint_size: int


def rotation_text(origin: str, old: Verifier, new: Verifier) -> str:
    """Return the note text of a rotation from `old` to `new` (`origin`: the key name both keep)."""
    return f"{_TITLE}\n{origin}\nold {old.key_string()}\nnew {new.key_string()}\n"


def check_rotation(note: str, old: Verifier) -> Verifier:
    """Verify a rotation note against the key it rotates from; return the new key.

    Both signatures must verify: the old key's and the new key's.

    Raises:
        NoteError: not a rotation note of `old`, or a signature fails.
    """
    text = open_note(note, [old])
    lines = text.split("\n")
    if len(lines) != 5 or lines[0] != _TITLE or not lines[3].startswith("new "):
        raise NoteError("not an infervisor key rotation note")
    if lines[2] != f"old {old.key_string()}":
        raise NoteError("the rotation note names another old key")
    new = parse_verifier_key(lines[3][4:])
    open_note(note, [new])
    return new


def rotate_key(chain_path: str | os.PathLike[str], node_id: str, ts_ns: int) -> Rotation:
    """Replace the node key beside the chain with a new one, recorded in the chain.

    Order: the new key is written to ``node.key.next``; the signed rotation
    event is appended; the new key replaces ``node.key`` (the old public key
    is kept as ``node.pub.<key id>``); a checkpoint signed by the new key is
    stored.

    Raises:
        CheckpointError: no usable node.key, or the files cannot be written.
        ChainError: the chain cannot be opened or appended to.
    """
    folder = Path(os.fspath(chain_path)).parent
    old = load_signer(folder / KEY_FILE)
    new = Signer.generate(old.name)  # rotation keeps the origin
    staged = folder / (KEY_FILE + ".next")
    _write_private(staged, new)
    note = sign_note(rotation_text(old.name, old.verifier, new.verifier), old, new)
    payload = encode_payload(
        {  # replay/events.py KeyRotated, as its encoder writes it
            "event": KEY_ROTATED_KIND,
            "new_key": new.verifier.key_string(),
            "note": note,
            "old_key": old.verifier.key_string(),
            "v": 1,
        }
    )
    draft = EventDraft(
        ts_ns=ts_ns, source="node", kind=KEY_ROTATED_KIND, subject="", payload=payload
    )
    with SqliteChain.open(chain_path, node_id) as chain:
        event = chain.append(draft)
    write_public_key(folder / f"{PUBLIC_KEY_FILE}.{old.verifier.key_id.hex()}", old.verifier)
    os.replace(staged, folder / KEY_FILE)
    write_public_key(folder / PUBLIC_KEY_FILE, new.verifier)
    checkpointer = Checkpointer(chain_path, node_id, new)
    written = checkpointer.close()
    size = written.tree_size if written is not None else checkpointer.last_size
    return Rotation(old.verifier, new.verifier, event, size)


def _write_private(path: Path, signer: Signer) -> None:
    try:
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(signer.key_string() + "\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise CheckpointError(f"{path}: cannot write the new key: {e.strerror or e}") from e


def rotations_in(rows: Iterable[tuple[bytes | str, bytes]]) -> list[tuple[str, str, str]]:
    """``(old_key, new_key, note)`` of every rotation among ``(kind, payload)`` rows,
    in the order given (payloads that do not parse are skipped: verification of the
    rows themselves reports them)."""
    found: list[tuple[str, str, str]] = []
    for kind, payload in rows:
        name = kind.decode("utf-8", "replace") if isinstance(kind, bytes) else kind
        if name != KEY_ROTATED_KIND:
            continue
        try:
            doc = json.loads(payload)
            found.append((str(doc["old_key"]), str(doc["new_key"]), str(doc["note"])))
        except (ValueError, KeyError, TypeError):
            continue
    return found


def trusted_keys(anchor: Verifier, rotations: Iterable[tuple[str, str, str]]) -> list[Verifier]:
    """``anchor`` and every key a recorded rotation links to it, either way.

    A rotation note is signed by both its keys (:func:`check_rotation`), so a
    key trusted at either end vouches for the other: an auditor holding the
    newest key checks checkpoints signed before a rotation, and one holding an
    old key checks those signed after. Rotations whose note does not verify
    link nothing.
    """
    trusted = {anchor.key_string(): anchor}
    pending = list(rotations)
    grew = True
    while grew:
        grew = False
        for old_key, new_key, note in list(pending):
            if old_key not in trusted and new_key not in trusted:
                continue
            pending.remove((old_key, new_key, note))
            try:
                old = parse_verifier_key(old_key)
                new = check_rotation(note, old)
            except (NoteError, ValueError):
                continue
            if new.key_string() != new_key:
                continue
            trusted.setdefault(old.key_string(), old)
            trusted.setdefault(new.key_string(), new)
            grew = True
    return list(trusted.values())
