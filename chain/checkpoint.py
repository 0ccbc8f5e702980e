"""Signed checkpoints of a chain: C2SP tlog-checkpoint bodies in C2SP signed notes.

A checkpoint commits to the first `tree_size` events of a node's chain
(docs/chain-format.md, "Checkpoints"). Its note text is exactly four lines::

    <origin>
    <tree size, ASCII decimal, no leading zeros>
    <base64 of the RFC 6962 root of the event hashes seq 0 .. tree size - 1>
    infervisor-chain-head <seq> <64 lowercase hex digits of that event's BLAKE3 hash>

The first three lines are c2sp.org/tlog-checkpoint's origin, tree size and
root hash; the fourth is one extension line carrying the BLAKE3 head (seq is
tree size - 1). The note is signed (c2sp.org/signed-note, Ed25519) by the
node's key, whose name is the origin. The origin is any valid C2SP origin
(a key name: no whitespace, no ``+``); a new node's default is
``infervisor/<node id>/<first 16 hex digits of SHA-256 of its public key>``
(:func:`default_origin`), chains of older versions use ``infervisor/<node id>``.
The node id is not read from the origin: it is the chain's genesis's.

The node key lives in the data directory: ``node.key`` (signer key string,
mode 0600, created on first run) and ``node.pub`` (verifier key string).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from infervisor.chain import ed25519
from infervisor.chain.errors import CheckpointError, CheckpointMismatch, NoteError
from infervisor.chain.merkle import CompactTree
from infervisor.chain.note import (
    Signer,
    Verifier,
    check_key_name,
    key_text,
    open_note,
    parse_signer_key,
    parse_verifier_key,
    sign_note,
)

ORIGIN_PREFIX = "infervisor/"
"""The default origin starts with this prefix and the node id."""

HEAD_EXTENSION = "infervisor-chain-head"
"""First word of the extension line that carries the BLAKE3 head."""

KEY_FILE = "node.key"
"""The node's signer key in its data directory (mode 0600)."""

PUBLIC_KEY_FILE = "node.pub"
"""The node's verifier key in its data directory."""

_SIZE = re.compile(r"0|[1-9][0-9]*")
_HEAD = re.compile(rf"{HEAD_EXTENSION} (0|[1-9][0-9]*) ([0-9a-f]{{64}})")


def origin_of(node_id: str) -> str:
    """Return ``infervisor/<node id>``: the origin of chains made before origins were
    configurable (they still verify)."""
    return ORIGIN_PREFIX + node_id


def default_origin(node_id: str, public: bytes) -> str:
    """Return a new node's default origin (and key name).

    ``infervisor/<node id>/<first 16 hex digits of SHA-256(public)>``: two
    fleets' ``gpu-01`` never collide on a shared witness (c2sp.org/tlog-checkpoint
    asks an origin to be globally unique).

    Args:
        node_id: the node id.
        public: the node's 32-byte Ed25519 public key.
    """
    import hashlib  # noqa: PLC0415 - OpenSSL, only when a key is named (start-up)

    return f"{ORIGIN_PREFIX}{node_id}/{hashlib.sha256(public).hexdigest()[:16]}"


def check_origin(origin: str) -> str:
    """Return `origin` if it can name a checkpoint and its key, else raise.

    C2SP tlog-checkpoint: a non-empty line; C2SP signed-note: the key name it
    also is holds no whitespace and no ``+``.

    Raises:
        CheckpointError: naming the origin and what is allowed.
    """
    try:
        return check_key_name(origin)
    except NoteError as e:
        raise CheckpointError(
            f"origin {origin!r}: {e} (a schema-less URL such as example.com/gpu-01 is recommended)"
        ) from e


class Checkpoint(NamedTuple):
    """A checkpoint whose signature verified (or was just made).

    Attributes:
        origin: the origin line (the signing key's name).
        tree_size: events covered (seq 0 .. tree_size - 1), >= 1.
        root: the 32-byte RFC 6962 root of their hashes.
        head_hash: the 32-byte BLAKE3 hash of the event at seq tree_size - 1.
        note: the whole signed note, as stored and exported.
    """

    origin: str
    tree_size: int
    root: bytes
    head_hash: bytes
    note: str

    @property
    def node(self) -> str:
        """For display only: the node id of a default (``infervisor/<id>/<hex>``) or
        older (``infervisor/<id>``) origin, else the origin itself. Checks use the
        chain's genesis, never this."""
        parts = self.origin.split("/")
        if parts[0] + "/" == ORIGIN_PREFIX and len(parts) == 2:
            return parts[1]
        if (
            parts[0] + "/" == ORIGIN_PREFIX
            and len(parts) == 3
            and re.fullmatch("[0-9a-f]{16}", parts[2])
        ):
            return parts[1]
        return self.origin

    @property
    def head_seq(self) -> int:
        """The seq of the head event it names."""
        return self.tree_size - 1


def checkpoint_text(origin: str, tree_size: int, root: bytes, head_hash: bytes) -> str:
    """Return the note text of a checkpoint (four lines, each ending in a newline)."""
    if tree_size < 1:
        raise CheckpointError(f"a checkpoint covers at least the genesis, not {tree_size} events")
    return (
        f"{check_origin(origin)}\n{tree_size}\n{base64.b64encode(root).decode('ascii')}\n"
        f"{HEAD_EXTENSION} {tree_size - 1} {head_hash.hex()}\n"
    )


def parse_checkpoint_text(text: str) -> tuple[str, int, bytes, bytes]:
    """Parse a checkpoint note text into (origin, tree_size, root, head_hash).

    Raises:
        CheckpointError: naming the line that is not as specified.
    """
    lines = text.split("\n")
    if len(lines) != 5 or lines[-1] != "":
        raise CheckpointError(
            f"checkpoint text must be 4 lines (origin, size, root, {HEAD_EXTENSION}), "
            f"found {len(lines) - 1}"
        )
    origin, size, root, head = lines[:4]
    check_origin(origin)
    if not _SIZE.fullmatch(size) or size == "0":
        raise CheckpointError(f"checkpoint tree size must be a decimal >= 1, found {size!r}")
    try:
        digest = base64.b64decode(root, validate=True)
    except (ValueError, binascii.Error) as e:
        raise CheckpointError(f"checkpoint root hash is not base64: {root!r}") from e
    if len(digest) != 32 or base64.b64encode(digest).decode() != root:
        raise CheckpointError(f"checkpoint root hash must be 32 bytes in base64, found {root!r}")
    match = _HEAD.fullmatch(head)
    if match is None:
        raise CheckpointError(
            f"checkpoint extension line must be '{HEAD_EXTENSION} <seq> <64 hex>', found {head!r}"
        )
    tree_size = int(size)
    if int(match[1]) != tree_size - 1:
        raise CheckpointError(
            f"checkpoint head seq {match[1]} must be tree size - 1 ({tree_size - 1})"
        )
    return origin, tree_size, digest, bytes.fromhex(match[2])


def sign_checkpoint(signer: Signer, tree_size: int, root: bytes, head_hash: bytes) -> Checkpoint:
    """Return the checkpoint of these values, signed by `signer`; its origin is the key's name."""
    note = sign_note(checkpoint_text(signer.name, tree_size, root, head_hash), signer)
    return Checkpoint(signer.name, tree_size, root, head_hash, note)


def read_checkpoint(note: str | bytes, verifier: Verifier) -> Checkpoint:
    """Verify a signed checkpoint with `verifier` and parse it.

    Raises:
        CheckpointError: the signature does not verify (or is missing), or the
            body is not a checkpoint of this format.
    """
    try:
        text = open_note(note, [verifier])
    except NoteError as e:
        raise CheckpointError(f"checkpoint signature: {e}") from e
    origin, size, root, head = parse_checkpoint_text(text)
    if verifier.name != origin:
        raise CheckpointError(
            f"checkpoint origin {origin!r} is not the key's name {verifier.name!r}"
        )
    whole = note if isinstance(note, str) else note.decode("utf-8")
    return Checkpoint(origin, size, root, head, whole)


# ---------------------------------------------------------------- keys


def read_checkpoint_by(note: str | bytes, keys: Sequence[Verifier]) -> Checkpoint:
    """`read_checkpoint` with whichever of `keys` signed it (say, the keys a chain's
    rotations link: chain/keys.py `trusted_keys`).

    Raises:
        CheckpointError: none of them did (the last key's reason), or no key given.
    """
    error = CheckpointError("checkpoint signature: no key to check it with")
    for verifier in keys:
        try:
            return read_checkpoint(note, verifier)
        except CheckpointError as e:
            error = e
    raise error


def load_or_create_signer(
    data_dir: str | os.PathLike[str], node_id: str, origin: str | None = None
) -> Signer:
    """Return the node's signing key from DATA_DIR/node.key, creating it on first use.

    A new key is named `origin` (None: :func:`default_origin` of the node id and
    the new public key) and written with mode 0600 (node.pub beside it, 0644).
    An existing key keeps its name (chains of older versions: ``infervisor/<node id>``).

    Raises:
        CheckpointError: node.pub is there but node.key is not (a lost key is
            never replaced silently); the key file is readable by others or malformed; a
            configured `origin` differs from the existing key's name; `origin`
            is not a valid origin; or the key cannot be written.
    """
    folder = Path(data_dir)
    path = folder / KEY_FILE
    if not path.exists() and (folder / PUBLIC_KEY_FILE).exists():
        # A lost key must not be replaced silently: the chain's checkpoints (and
        # its witnesses) know the old one, and node.pub would be overwritten.
        raise CheckpointError(
            f"{path} is missing but {folder / PUBLIC_KEY_FILE} is there: restore the node "
            f"key that signed this chain's checkpoints, or, to start a new key on purpose, "
            f"move {PUBLIC_KEY_FILE} aside"
        )
    if not path.exists():
        private = ed25519.generate()
        raw = ed25519.public_of(private)
        name = check_origin(origin) if origin is not None else default_origin(node_id, raw)
        signer = Signer(name, private)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(signer.key_string() + "\n")
                f.flush()
                os.fsync(f.fileno())
        except FileExistsError:
            return load_signer(path, origin=origin)
        except OSError as e:
            raise CheckpointError(f"{path}: cannot create the node key: {e.strerror or e}") from e
        write_public_key(folder / PUBLIC_KEY_FILE, signer.verifier)
        return signer
    signer = load_signer(path, origin=origin)
    public = folder / PUBLIC_KEY_FILE
    if not public.exists():
        write_public_key(public, signer.verifier)
    return signer


def load_signer(
    path: str | os.PathLike[str], node_id: str | None = None, *, origin: str | None = None
) -> Signer:
    """Read a signer key file (mode 0600 or stricter).

    Args:
        path: the key file.
        node_id: unused (the key's name is any origin); kept for callers.
        origin: the configured origin, if any: the key's name must be it.

    Raises:
        CheckpointError: unreadable, readable by group or others, malformed,
            or (with `origin`) a key of another name.
    """
    del node_id
    file = Path(path)
    try:
        mode = file.stat().st_mode
        text = file.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file}: cannot read the node key: {e}") from e
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CheckpointError(
            f"{file}: the node key is readable by others (mode {stat.S_IMODE(mode):o}): "
            f"chmod 600 {file}"
        )
    try:
        signer = parse_signer_key(text)
    except NoteError as e:
        raise CheckpointError(f"{file}: {e}") from e
    if origin is not None and signer.name != origin:
        raise CheckpointError(
            f"[node] origin is {origin!r} but the node key {file} is named {signer.name!r}: "
            f"an existing key keeps its name (its checkpoints and witnesses know it); set "
            f"origin = {signer.name!r} or remove the origin setting"
        )
    return signer


def write_public_key(path: Path, verifier: Verifier) -> None:
    """Write `verifier`'s key string and a newline to `path` (mode 0644)."""
    try:
        path.write_text(verifier.key_string() + "\n", encoding="ascii")
        path.chmod(0o644)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot write the public key: {e.strerror or e}") from e


def load_verifier(
    key: str | os.PathLike[str], field: str | None = "--key", *, private: bool = True
) -> Verifier:
    """Return the verifier named by `key`: a key string, or a file holding one.

    A signer key file (node.key) is accepted too, its public half used, unless
    `private` is False (a config naming a public key file: tools/fleet/config.py).

    Args:
        key: the key string or file.
        field: the option or setting that gave it (``--key``), named first in
            every error (a newcomer's trial, stop 34: "two holds 2 keys" named no
            option); None for a file the reader found itself (node.pub).
        private: whether a signer key (``PRIVATE+KEY+...``) is taken.

    Raises:
        CheckpointError: neither a readable file nor a key string, or a signer key
            where `private` is False; the message starts ``FIELD KEY: ``.
    """
    shown = os.fspath(key) if field is None else f"{field} {os.fspath(key)}"
    try:
        text = key_text(key)
    except NoteError as e:
        raise CheckpointError(f"{shown}: {e}") from e
    try:
        if text.startswith("PRIVATE+KEY+"):
            signer = parse_signer_key(text)
            if not private:
                public = Path(os.fspath(key)).parent / PUBLIC_KEY_FILE
                where = f"the file {public}, " if public.is_file() else ""
                raise CheckpointError(
                    f"{shown}: is a PRIVATE signing key (PRIVATE+KEY+..., a {KEY_FILE}), not "
                    f"a verifier key: keep it where it signs, and name its public half "
                    f"({where}the line {signer.verifier.key_string()})"
                )
            return signer.verifier
        return parse_verifier_key(text)
    except NoteError as e:
        raise CheckpointError(f"{shown}: {e}") from e


# ---------------------------------------------------------------- a chain against checkpoints
def roots_at(hashes: Sequence[bytes], sizes: Sequence[int]) -> dict[int, bytes]:
    """Return the RFC 6962 root of the first `size` event hashes for each size (one pass)."""
    wanted = sorted({s for s in sizes if 0 < s <= len(hashes)})
    roots: dict[int, bytes] = {}
    tree = CompactTree()
    at = 0
    for size in wanted:
        while tree.size < size:
            tree.append(hashes[at])
            at += 1
        roots[size] = tree.root()
    return roots


def compare(
    hashes: Sequence[bytes], checkpoint: Checkpoint, earlier: Sequence[Checkpoint] = ()
) -> CheckpointMismatch | None:
    """Compare a chain's event hashes (seq order) with a verified checkpoint.

    Args:
        hashes: the stored `hash` of every event, seq 0 first.
        checkpoint: a checkpoint whose signature verified.
        earlier: other verified checkpoints of the same key, used only to say
            from which seq on the chain differs.

    Returns:
        None when the chain's first tree_size events are those signed, else
        the mismatch: "truncated" (the chain is shorter; seq = its length, the
        first missing event), "rewritten" (same length, other root) or
        "forked" (longer, other root), at the first seq not covered by an
        earlier checkpoint that still matches; "head mismatch" when the root
        matches but the head hash does not.
    """
    size = checkpoint.tree_size
    if len(hashes) < size:
        return CheckpointMismatch(
            len(hashes),
            "truncated",
            f"the chain has {len(hashes)} events but the checkpoint signed {size} "
            f"(seq 0..{size - 1}): seq {len(hashes)}..{size - 1} were removed",
        )
    sizes = [size] + [c.tree_size for c in earlier if c.tree_size < size]
    roots = roots_at(hashes, sizes)
    if roots[size] != checkpoint.root:
        good = [c.tree_size for c in earlier if c.tree_size < size and roots[c.tree_size] == c.root]
        since = max(good, default=0)
        reason = "rewritten" if len(hashes) == size else "forked"
        where = (
            f"in seq {since}..{size - 1} (the signed checkpoint of size {since} still matches)"
            if since
            else f"somewhere in seq 0..{size - 1}"
        )
        what = (
            "the chain was rewritten (rehashed) since it was signed"
            if reason == "rewritten"
            else f"the chain ({len(hashes)} events) does not extend what was signed: a fork"
        )
        return CheckpointMismatch(
            since,
            reason,
            f"the root of its first {size} events is {roots[size].hex()}, the checkpoint signed "
            f"{checkpoint.root.hex()}: {what}; the change is {where}",
        )
    if hashes[size - 1] != checkpoint.head_hash:
        return CheckpointMismatch(
            size - 1,
            "head mismatch",
            f"the event at seq {size - 1} has hash {hashes[size - 1].hex()}, the checkpoint names "
            f"{checkpoint.head_hash.hex()}",
        )
    return None
