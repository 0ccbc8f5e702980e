"""The chain served to auditors as a C2SP tlog-tiles log, under ``/v1/log/``.

``checkpoint`` (the latest stored checkpoint with its cosignature lines),
``key`` (the node's verifier key), ``tile/<L>/<N>[.p/<W>]`` and
``tile/entries/<N>[.p/<W>]`` (c2sp.org/tlog-tiles; chain/tiles.py builds
them), and RFC 6962 inclusion and consistency proofs. Every read opens the
chain file read-only (a reader connection in WAL mode never blocks the
writer) and reads one range of events.
"""

from __future__ import annotations

import base64
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import msgspec
from litestar import Controller, Response, get
from litestar.di import NamedDependency
from litestar.params import PathParameter, QueryParameter

from infervisor.chain.checkpoint import PUBLIC_KEY_FILE
from infervisor.chain.checkpoint_store import event_hashes, latest_checkpoint
from infervisor.chain.connect import connect_reader
from infervisor.chain.cosignature_store import cosigned_note
from infervisor.chain.errors import ChainError
from infervisor.chain.merkle import consistency_proof, inclusion_proof, leaf_hash, root_of_hashes
from infervisor.chain.tiles import TileError, parse_tile_path, read_entry_bundle, read_hash_tile

from ..context import ApiContext
from ..errors import ApiError
from ..openapi import responses, text
from .events import MAX_SEQ
from .params import PREFIX

__all__ = ["ConsistencyProof", "InclusionProof", "LogController"]

IMMUTABLE = "public, max-age=31536000, immutable"
"""Cache-Control of a full tile or bundle: its bytes never change."""
SHORT = "public, max-age=5"
"""Cache-Control of a partial tile or bundle (tlog-tiles: may be deleted once full)."""
MUTABLE = "no-cache"
"""Cache-Control of the checkpoint (tlog-tiles: no caching beyond a few seconds)."""

_NOTE = text("text/plain", "A signed note (c2sp.org/signed-note), UTF-8.")
_OCTETS = text("application/octet-stream", "A tile or entry bundle (c2sp.org/tlog-tiles).")


class InclusionProof(msgspec.Struct, frozen=True, kw_only=True):
    """The RFC 6962 audit path of the event at ``seq`` in the tree of ``size`` events.

    ``leaf_hash`` = SHA-256(0x00 || ``event_hash``); hashes in hex, and the
    path also as base64 lines (as tlog-witness writes proofs)."""

    seq: int
    size: int
    event_hash: str
    leaf_hash: str
    root: str
    proof: list[str]
    proof_base64: list[str]


class ConsistencyProof(msgspec.Struct, frozen=True, kw_only=True):
    """The RFC 6962 consistency proof from the tree of ``old`` events to ``new``."""

    old: int
    new: int
    old_root: str
    new_root: str
    proof: list[str]
    proof_base64: list[str]


class LogController(Controller):
    """``GET /v1/log/...``: checkpoint, key, tiles, proofs."""

    path = f"{PREFIX}/log"

    @get("/checkpoint", operation_id="getCheckpoint", sync_to_thread=True,
         responses={200: _NOTE, **responses(404)})  # fmt: skip
    def get_checkpoint(self, api: NamedDependency[ApiContext]) -> Response[bytes]:
        """The latest stored checkpoint with its witnesses' cosignature lines."""
        with _reading(api) as conn:
            latest = latest_checkpoint(conn)
            note = None if latest is None else cosigned_note(conn, latest.tree_size)
        if note is None:
            raise ApiError("the chain has no checkpoint yet", "not_found", 404)
        return _text(note.encode(), MUTABLE)

    @get("/key", operation_id="getLogKey", sync_to_thread=True,
         responses={200: _NOTE, **responses(404)})  # fmt: skip
    def get_key(self, api: NamedDependency[ApiContext]) -> Response[bytes]:
        """The node's verifier key (note key form ``name+hexid+base64``), one line.
        Fetched over the network, it is only as good as the channel: pin it."""
        try:
            key = (api.data_dir / PUBLIC_KEY_FILE).read_bytes()
        except OSError as e:
            raise ApiError("the node has no public key file", "not_found", 404) from e
        return _text(key, MUTABLE)

    @get("/tile/{tile_path:path}", operation_id="getTile", sync_to_thread=True,
         responses={200: _OCTETS, **responses(404)})  # fmt: skip
    def get_tile(
        self,
        api: NamedDependency[ApiContext],
        tile_path: Annotated[
            str, PathParameter(description="<L>/<N>[.p/<W>] or entries/<N>[.p/<W>].")
        ],
    ) -> Response[bytes]:
        """A hash tile ``tile/<L>/<N>[.p/<W>]`` or an entry bundle
        ``tile/entries/<N>[.p/<W>]`` (c2sp.org/tlog-tiles); 404 beyond the chain."""
        try:
            tile = parse_tile_path("tile/" + tile_path.lstrip("/"))
        except TileError as e:
            raise ApiError(str(e), "bad_value", 400, "tile_path") from e
        span = tile.width * 256 ** max(tile.level, 0)
        with _reading(api) as conn:
            if tile.start + span > _size(conn):
                raise ApiError(f"{tile.path()} is beyond the chain", "not_found", 404)
            try:
                data = read_entry_bundle(conn, tile) if tile.entries else read_hash_tile(conn, tile)
            except TileError as e:
                raise ApiError(str(e), "node_error", 500) from e
        headers = {"cache-control": IMMUTABLE if tile.full else SHORT}
        return Response(data, media_type="application/octet-stream", headers=headers)

    @get("/proof/inclusion", operation_id="getInclusionProof", sync_to_thread=True,
         responses=responses())  # fmt: skip
    def get_inclusion(
        self,
        api: NamedDependency[ApiContext],
        seq: Annotated[
            int | None, QueryParameter(ge=0, le=MAX_SEQ, description="The event's seq. Required.")
        ] = None,
        size: Annotated[
            int | None, QueryParameter(ge=1, le=MAX_SEQ, description="The tree size. Required.")
        ] = None,
    ) -> InclusionProof:
        """The audit path of the event at ``seq`` in the tree of the first ``size`` events."""
        seq, size = _required(seq, "seq"), _required(size, "size")
        if seq >= size:
            raise ApiError(f"seq {seq} is not below size {size}", "bad_value", 400, "seq")
        hashes, leaves = _leaves(api, size, "size")
        path = inclusion_proof(leaves, seq)
        return InclusionProof(
            seq=seq,
            size=size,
            event_hash=hashes[seq].hex(),
            leaf_hash=leaves[seq].hex(),
            root=root_of_hashes(leaves).hex(),
            proof=[p.hex() for p in path],
            proof_base64=[base64.b64encode(p).decode() for p in path],
        )

    @get("/proof/consistency", operation_id="getConsistencyProof", sync_to_thread=True,
         responses=responses())  # fmt: skip
    def get_consistency(
        self,
        api: NamedDependency[ApiContext],
        old: Annotated[
            int | None,
            QueryParameter(ge=1, le=MAX_SEQ, description="The older tree size. Required."),
        ] = None,
        new: Annotated[
            int | None,
            QueryParameter(ge=1, le=MAX_SEQ, description="The newer tree size. Required."),
        ] = None,
    ) -> ConsistencyProof:
        """The RFC 6962 consistency proof from the tree of ``old`` events to ``new``."""
        old, new = _required(old, "old"), _required(new, "new")
        if old > new:
            raise ApiError(f"old {old} is above new {new}", "bad_value", 400, "old")
        _, leaves = _leaves(api, new, "new")
        path = consistency_proof(leaves, old)
        return ConsistencyProof(
            old=old,
            new=new,
            old_root=root_of_hashes(leaves[:old]).hex(),
            new_root=root_of_hashes(leaves).hex(),
            proof=[p.hex() for p in path],
            proof_base64=[base64.b64encode(p).decode() for p in path],
        )


def _text(data: bytes, cache: str) -> Response[bytes]:
    # As given: Litestar would append a second charset to a text/* media_type.
    headers = {"content-type": "text/plain; charset=utf-8", "cache-control": cache}
    return Response(data, headers=headers)


def _leaves(api: ApiContext, size: int, field: str) -> tuple[list[bytes], list[bytes]]:
    """The first `size` event hashes and their RFC 6962 leaf hashes (`field` names
    `size` in a 404 when the chain is shorter)."""
    with _reading(api) as conn:
        hashes = _hashes(conn, size, field)
    return hashes, [leaf_hash(h) for h in hashes]


@contextmanager
def _reading(api: ApiContext) -> Iterator[sqlite3.Connection]:
    """A read-only connection to the chain, in one read transaction (one snapshot)."""
    try:
        conn = connect_reader(str(api.chain_path))
    except ChainError as e:
        raise ApiError(str(e), "node_error", 500) from e
    try:
        conn.execute("BEGIN")
        yield conn
    except sqlite3.Error as e:
        raise ApiError(f"cannot read the chain: {e}", "node_error", 500) from e
    finally:
        conn.close()


def _size(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT max(seq) FROM events").fetchone()
    return 0 if row is None or row[0] is None else int(row[0]) + 1


def _hashes(conn: sqlite3.Connection, size: int, field: str) -> list[bytes]:
    """The event hashes of the first `size` events; 400 naming `field` beyond the chain."""
    held = _size(conn)
    if size > held:
        raise ApiError(
            f"{field} {size} is beyond the chain ({held} events)", "bad_value", 400, field
        )
    return event_hashes(conn, below=size)


def _required(value: int | None, field: str) -> int:
    """A required query parameter (declared optional so that its absence is named)."""
    if value is None:
        raise ApiError(f"query parameter {field} is required", "bad_value", 400, field)
    return value
