"""The chain as C2SP tlog-tiles: tile paths, hash tiles, entry bundles.

Source: c2sp.org/tlog-tiles ("Merkle Tree", "Partial Tiles", "Log entries");
hashing is RFC 6962 section 2.1 (chain/merkle.py). docs/chain-format.md,
"Tiles", says it for an outside implementer.

- The tree's leaves are those of the checkpoints: leaf *i* is
  ``SHA-256(0x00 || hash of the event at seq i)`` (the event hash is BLAKE3,
  32 bytes). A level-0 tile holds 256 such leaf hashes; a tile at level *l*
  holds the Merkle Tree Hashes of 256 full tiles of level *l - 1*, i.e. the
  roots of subtrees of ``256**l`` leaves.
- An entry bundle holds the entries of the events of one level-0 tile, each
  as a big-endian uint16 length then the bytes. An entry is the event's
  export line (chain/bundle.py `event_line`, the events.jsonl line of a
  bundle, no newline); the reader recomputes the event hash from it, and the
  leaf is the RFC 6962 leaf hash of that event hash, not of the entry bytes
  (where tlog-tiles has the entry itself as the leaf data).
- Paths: ``tile/<L>/<N>[.p/<W>]`` and ``tile/entries/<N>[.p/<W>]``, with N in
  zero-padded 3-digit elements, all but the last prefixed with ``x``
  (1234067 is ``x001/x234/067``).

Everything here is pure except `read_hash_tile` and `read_entry_bundle`,
which read one range of seqs from an open chain connection.
"""

from __future__ import annotations

import binascii
import json
import re
import sqlite3
import struct
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from infervisor.chain import schema
from infervisor.chain.bundle import _decode_line, event_line
from infervisor.chain.checks import Row
from infervisor.chain.merkle import leaf_hash, node_hash

__all__ = [
    "HEIGHT",
    "WIDTH",
    "Tile",
    "TileError",
    "encode_index",
    "entry_bundle",
    "entry_row",
    "hash_tile",
    "parse_entry_bundle",
    "parse_tile_path",
    "read_entry_bundle",
    "read_hash_tile",
    "tile_for",
    "tiles_of",
]

HEIGHT = 8
"""A tile is a subtree of height 8."""
WIDTH = 1 << HEIGHT
"""A full tile holds 256 hashes (8,192 bytes) or 256 entries."""
MAX_LEVEL = 63
MAX_ENTRY = 0xFFFF
"""An entry bundle's length prefix is a uint16: no entry is longer."""

_U16 = struct.Struct(">H")
_PATH = re.compile(r"tile/(entries|0|[1-9][0-9]?)/((?:x[0-9]{3}/)*[0-9]{3})(?:\.p/([1-9][0-9]*))?")


class TileError(ValueError):
    """A tile path, tile or bundle that is not as tlog-tiles specifies."""


class Tile(NamedTuple):
    """One tile of a tree.

    Attributes:
        level: 0..63 for a hash tile; -1 for an entry bundle.
        n: N, the tile's index within its level.
        width: 1..256 (256: a full tile).
    """

    level: int
    n: int
    width: int = WIDTH

    @property
    def full(self) -> bool:
        """True for a full (immutable) tile."""
        return self.width == WIDTH

    @property
    def entries(self) -> bool:
        """True for an entry bundle."""
        return self.level < 0

    @property
    def start(self) -> int:
        """The first leaf (seq) the tile covers: ``index * 256**(level+1)``."""
        return int(self.n * WIDTH ** (max(self.level, 0) + 1))

    def path(self) -> str:
        """``tile/<L>/<N>[.p/<W>]`` or ``tile/entries/<N>[.p/<W>]``."""
        level = "entries" if self.entries else str(self.level)
        partial = "" if self.full else f".p/{self.width}"
        return f"tile/{level}/{encode_index(self.n)}{partial}"


def encode_index(n: int) -> str:
    """N as tlog-tiles writes it: 3-digit groups, all but the last prefixed with ``x``.

    Raises:
        TileError: n < 0.
    """
    if n < 0:
        raise TileError(f"tile index must be >= 0, not {n}")
    digits = str(n)
    digits = "0" * (-len(digits) % 3) + digits
    groups = [digits[i : i + 3] for i in range(0, len(digits), 3)]
    return "/".join([f"x{g}" for g in groups[:-1]] + [groups[-1]])


def parse_tile_path(path: str) -> Tile:
    """The tile named by ``tile/...`` (leading ``/`` ignored).

    Raises:
        TileError: not a tlog-tiles path (level above 63, width not 1..255
            for a partial tile, an index not in 3-digit groups).
    """
    match = _PATH.fullmatch(path.lstrip("/"))
    if match is None:
        raise TileError(
            f"{path!r}: expected tile/<L>/<N>[.p/<W>] or tile/entries/<N>[.p/<W>], "
            "L 0-63, N in 3-digit groups (x001/x234/067), W 1-255"
        )
    level_text, index_text, width_text = match.groups()
    level = -1 if level_text == "entries" else int(level_text)
    if level > MAX_LEVEL:
        raise TileError(f"{path!r}: tile level {level} is above {MAX_LEVEL}")
    width = WIDTH if width_text is None else int(width_text)
    if width_text is not None and width >= WIDTH:
        raise TileError(f"{path!r}: a partial tile's width is 1-255, not {width}")
    return Tile(level, int(index_text.replace("x", "").replace("/", "")), width)


def tile_for(tile: Tile, size: int) -> Tile | None:
    """The tile at ``tile.level``/``tile.n`` in a tree of `size` leaves: full if
    the tree has it full, else the partial one, else None (beyond the tree)."""
    level = max(tile.level, 0)
    span = WIDTH**level
    whole = size // span  # complete hashes at this level
    if (tile.n + 1) * WIDTH <= whole:
        return tile._replace(width=WIDTH)
    width = whole - tile.n * WIDTH
    return tile._replace(width=width) if 0 < width < WIDTH else None


def tiles_of(size: int) -> Iterator[Tile]:
    """Every hash tile of a tree of `size` leaves, level by level (partial ones last)."""
    level = 0
    while size >= WIDTH**level and level <= MAX_LEVEL:
        whole = size // WIDTH**level
        for index in range(whole // WIDTH):
            yield Tile(level, index)
        if whole % WIDTH:
            yield Tile(level, whole // WIDTH, whole % WIDTH)
        level += 1


def hash_tile(leaves: Sequence[bytes], level: int, width: int) -> bytes:
    """The hashes of a level-`level` tile of `width`, from its leaf hashes.

    Args:
        leaves: the RFC 6962 leaf hashes of the tile's span, ``width * 256**level``
            of them, in order.
        level: the tile's level.
        width: its width, 1..256.

    Returns:
        ``width`` 32-byte Merkle Tree Hashes, concatenated.

    Raises:
        TileError: `leaves` is not ``width * 256**level`` long.
    """
    span = WIDTH**level
    if len(leaves) != width * span:
        raise TileError(f"a level {level} tile of width {width} needs {width * span} leaves")
    hashes = list(leaves)
    for _ in range(HEIGHT * level):  # perfect subtrees: pair up, level after level
        hashes = [node_hash(hashes[i], hashes[i + 1]) for i in range(0, len(hashes), 2)]
    return b"".join(hashes)


def entry_bundle(entries: Sequence[bytes]) -> bytes:
    """The entry bundle of `entries`: each a big-endian uint16 length, then the bytes.

    Raises:
        TileError: an entry is longer than 65,535 bytes.
    """
    parts: list[bytes] = []
    for entry in entries:
        if len(entry) > MAX_ENTRY:
            raise TileError(f"an entry of {len(entry)} bytes does not fit a uint16 length")
        parts += (_U16.pack(len(entry)), entry)
    return b"".join(parts)


def parse_entry_bundle(data: bytes) -> list[bytes]:
    """The entries of an entry bundle.

    Raises:
        TileError: a length runs past the end of `data`.
    """
    entries, at = [], 0
    while at < len(data):
        if at + 2 > len(data):
            raise TileError(f"entry bundle ends inside a length prefix at byte {at}")
        (length,) = _U16.unpack_from(data, at)
        if at + 2 + length > len(data):
            raise TileError(f"entry bundle: an entry at byte {at} runs past the end")
        entries.append(data[at + 2 : at + 2 + length])
        at += 2 + length
    return entries


def read_hash_tile(conn: sqlite3.Connection, tile: Tile) -> bytes:
    """The hash tile `tile` of the chain open on `conn` (one range read of event hashes).

    Raises:
        TileError: the chain holds fewer events than the tile covers.
    """
    span = tile.width * WIDTH**tile.level
    rows = conn.execute(
        "SELECT hash FROM events WHERE seq >= ? AND seq < ? ORDER BY seq",
        (tile.start, tile.start + span),
    ).fetchall()
    return hash_tile([leaf_hash(bytes(h)) for (h,) in rows], tile.level, tile.width)


def read_entry_bundle(conn: sqlite3.Connection, tile: Tile) -> bytes:
    """The entry bundle `tile` (level -1) of the chain open on `conn` (one range read).

    Raises:
        TileError: fewer events than the bundle covers, or an entry too long.
    """
    rows = conn.execute(
        schema.SELECT_EVENTS + " WHERE seq >= ? AND seq < ? ORDER BY seq",
        (tile.start, tile.start + tile.width),
    ).fetchall()
    if len(rows) != tile.width:
        raise TileError(f"{tile.path()}: the chain holds {len(rows)} of its {tile.width} events")
    return entry_bundle([event_line(row) for row in rows])


def entry_row(entry: bytes) -> Row:
    """The chain row an entry (an export line) holds, its hashes not yet checked
    (`chain.checks.check_row` recomputes them).

    Raises:
        TileError: the entry is not an event line.
    """
    try:
        return _decode_line(json.loads(entry))
    except (ValueError, TypeError, KeyError, binascii.Error) as e:
        raise TileError(f"an entry is not an event line: {e}") from e
