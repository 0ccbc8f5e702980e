"""chain/tiles.py against c2sp.org/tlog-tiles and the RFC 6962 roots of chain/merkle.py."""

from __future__ import annotations

import hashlib

import pytest

from infervisor.chain.merkle import leaf_hash, node_hash, root_of_hashes
from infervisor.chain.tiles import (
    WIDTH,
    Tile,
    TileError,
    encode_index,
    entry_bundle,
    hash_tile,
    parse_entry_bundle,
    parse_tile_path,
    tile_for,
    tiles_of,
)


def _leaves(n: int) -> list[bytes]:
    return [leaf_hash(hashlib.sha256(i.to_bytes(8, "big")).digest()) for i in range(n)]


def _root_from_tiles(size: int, leaves: list[bytes]) -> bytes:
    """The root of the tree from its tiles only (as a tlog-tiles client computes it):
    each perfect subtree of the tree's compact range is the RFC 6962 hash of at
    most 128 aligned hashes of one tile."""
    served = {(t.level, t.n): t for t in tiles_of(size)}
    stack, at, rest = [], 0, size
    while rest:
        k = rest.bit_length() - 1  # a subtree of 2**k leaves at offset `at`
        level = k // 8
        first = at // WIDTH**level
        tile = served[(level, first // WIDTH)]
        assert tile_for(tile, size) == tile
        span = WIDTH**level
        data = hash_tile(leaves[tile.start : tile.start + tile.width * span], level, tile.width)
        hashes = [data[i : i + 32] for i in range(0, len(data), 32)]
        lo = first % WIDTH
        stack.append(root_of_hashes(hashes[lo : lo + (1 << (k - 8 * level))]))
        at, rest = at + (1 << k), rest - (1 << k)
    digest = stack[-1]
    for left in reversed(stack[:-1]):
        digest = node_hash(left, digest)
    return digest


def test_index_encoding_follows_the_spec_example() -> None:
    assert encode_index(1234067) == "x001/x234/067"
    assert encode_index(0) == "000"
    assert encode_index(5) == "005"
    assert encode_index(1000) == "x001/000"
    assert Tile(0, 1234067).path() == "tile/0/x001/x234/067"
    assert Tile(2, 3, 17).path() == "tile/2/003.p/17"
    assert Tile(-1, 1000, 5).path() == "tile/entries/x001/000.p/5"


@pytest.mark.parametrize(
    "path", ["tile/0/x001/x234/067", "tile/entries/003.p/17", "tile/63/000", "/tile/1/999.p/255"]
)
def test_paths_round_trip(path: str) -> None:
    assert parse_tile_path(path).path() == path.lstrip("/")


@pytest.mark.parametrize(
    "path",
    [
        "tile/64/000",
        "tile/01/000",
        "tile/0/1",
        "tile/0/001/002",
        "tile/0/x1/002",
        "tile/0/000.p/256",
        "tile/0/000.p/0",
        "tile/0/000.p/01",
        "tile/entries/000.p/",
        "tile/x/000",
        "tiles/0/000",
    ],
)
def test_bad_paths_are_refused(path: str) -> None:
    with pytest.raises(TileError):
        parse_tile_path(path)


def test_the_specs_70000_example() -> None:
    tiles = list(tiles_of(70_000))
    assert sum(1 for t in tiles if t.level == 0 and t.full) == 273
    assert [t for t in tiles if not t.full] == [Tile(0, 273, 112), Tile(1, 1, 17), Tile(2, 0, 1)]
    assert Tile(1, 0) in tiles
    assert list(tiles_of(256)) == [Tile(0, 0), Tile(1, 0, 1)]
    assert tile_for(Tile(0, 273), 70_000) == Tile(0, 273, 112)
    assert tile_for(Tile(0, 274), 70_000) is None
    assert tile_for(Tile(3, 0), 70_000) is None
    assert tile_for(Tile(-1, 5), 70_000) == Tile(-1, 5)


@pytest.mark.parametrize("size", [1, 2, 3, 255, 256, 257, 511, 512, 513, 1000, 65_536, 65_537])
def test_roots_from_tiles_match_merkle(size: int) -> None:
    leaves = _leaves(size)
    assert _root_from_tiles(size, leaves) == root_of_hashes(leaves)


def test_level_one_hash_is_the_root_of_a_full_level_zero_tile() -> None:
    leaves = _leaves(WIDTH * 3 + 5)
    level1 = hash_tile(leaves[: WIDTH * 3], 1, 3)
    for i in range(3):
        tile0 = hash_tile(leaves[i * WIDTH : (i + 1) * WIDTH], 0, WIDTH)
        assert tile0 == b"".join(leaves[i * WIDTH : (i + 1) * WIDTH])
        assert level1[i * 32 : (i + 1) * 32] == root_of_hashes(leaves[i * WIDTH : (i + 1) * WIDTH])
    with pytest.raises(TileError):
        hash_tile(leaves[:10], 1, 1)


def test_entry_bundles_round_trip_and_refuse_what_does_not_fit() -> None:
    entries = [b"", b"a", b"x" * 300, bytes(range(256))]
    data = entry_bundle(entries)
    assert data[:2] == b"\x00\x00" and data[2:4] == b"\x00\x01"
    assert parse_entry_bundle(data) == entries
    with pytest.raises(TileError):
        parse_entry_bundle(data[:-1])
    with pytest.raises(TileError):
        parse_entry_bundle(b"\x00")
    with pytest.raises(TileError):
        entry_bundle([b"x" * 65_536])
