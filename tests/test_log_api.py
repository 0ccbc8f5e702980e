"""The chain served as a C2SP tlog-tiles log (``/v1/log/...``) by a real node on
loopback TCP to a ``read`` token: checkpoint, key, hash tiles, entry bundles,
proofs, caching headers, refusals naming the field; and the independent
verifier (tests/independent_tiles.py) agreeing with all of it."""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from independent_tiles import verify_log
from tiles_support import grow_chain

from infervisor.actors.node import Node
from infervisor.actors.settings import NodeSettings
from infervisor.adapters.ports import free_port
from infervisor.chain import schema
from infervisor.chain.bundle import event_line
from infervisor.chain.checkpoint import load_verifier, read_checkpoint
from infervisor.chain.merkle import leaf_hash, verify_consistency, verify_inclusion
from infervisor.chain.tiles import parse_entry_bundle
from infervisor.tools.api.auth import TcpAddress, load_or_create_tokens
from infervisor.tools.api.scopes import ApiToken, Scope
from infervisor.tools.api.serving.server import ApiServer

EVENTS = 700


@dataclass
class Log:
    url: str
    data: Path
    secret: str

    def get(self, path: str, token: str | None = "read", **params: int) -> httpx.Response:
        headers = {"authorization": f"Bearer {self.secret}"} if token == "read" else {}
        if token not in (None, "read"):
            headers = {"authorization": f"Bearer {token}"}
        return httpx.get(f"{self.url}/v1/log/{path}", headers=headers, params=params, timeout=60)

    def rows(self) -> list[tuple[object, ...]]:
        conn = sqlite3.connect(f"file:{self.data / 'chain.db'}?mode=ro", uri=True)
        try:
            return conn.execute(schema.SELECT_EVENTS + " ORDER BY seq").fetchall()
        finally:
            conn.close()


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Log]:
    data = tmp_path_factory.mktemp("log") / "data"
    grow_chain(data, "n1", EVENTS)
    settings = NodeSettings(
        node_id="n1", data_dir=str(data), registry_dir=str(data / "models"),
        llamacpp_program="/bin/false",
    )  # fmt: skip
    (data / "models").mkdir()
    port = free_port()
    tokens = [ApiToken(name="auditor", scope=Scope.READ)]
    server = ApiServer.listen(
        data, settings.chain_path, settings.node_id,
        tcp=TcpAddress("127.0.0.1", port), tokens=load_or_create_tokens(data, tokens),
    )  # fmt: skip
    try:
        node = Node.open(settings)
        try:
            server.serve(node)
            secret = json.loads((data / "api-tokens.json").read_text())["auditor"]
            yield Log(f"http://127.0.0.1:{port}", data, secret)
            server.stopping()
        finally:
            node.shutdown()
    finally:
        server.close()


def _checkpoint(log: Log) -> tuple[int, bytes]:
    answer = log.get("checkpoint")
    assert answer.status_code == 200, answer.text
    cp = read_checkpoint(answer.text, load_verifier(log.data / "node.pub"))
    return cp.tree_size, cp.root


def test_checkpoint_is_the_latest_signed_note_and_not_cached(log: Log) -> None:
    answer = log.get("checkpoint")
    assert answer.headers["content-type"] == "text/plain; charset=utf-8"
    assert answer.headers["cache-control"] == "no-cache"
    size, _ = _checkpoint(log)
    assert size >= EVENTS
    key = log.get("key")
    assert key.status_code == 200
    assert key.text == (log.data / "node.pub").read_text()


def test_tiles_and_bundles_are_the_chain(log: Log) -> None:
    rows = log.rows()
    full = log.get("tile/0/000")
    assert full.status_code == 200
    assert full.headers["content-type"] == "application/octet-stream"
    assert full.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert full.content == b"".join(leaf_hash(bytes(r[-1])) for r in rows[:256])  # type: ignore[arg-type]
    partial = log.get("tile/0/001.p/10")
    assert partial.status_code == 200
    assert "immutable" not in partial.headers["cache-control"]
    assert partial.content == b"".join(leaf_hash(bytes(r[-1])) for r in rows[256:266])  # type: ignore[arg-type]
    bundle = log.get("tile/entries/001")
    assert bundle.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert parse_entry_bundle(bundle.content) == [event_line(r) for r in rows[256:512]]
    assert log.get("tile/entries/000.p/3").status_code == 200
    for beyond in ("tile/0/999", "tile/1/000", "tile/entries/x001/000", "tile/0/002.p/255"):
        assert log.get(beyond).status_code == 404, beyond


def test_proofs_verify_against_the_signed_root(log: Log) -> None:
    size, root = _checkpoint(log)
    rows = log.rows()
    for seq in (0, 1, 255, 256, size - 1):
        answer = log.get("proof/inclusion", seq=seq, size=size)
        assert answer.status_code == 200, answer.text
        doc = answer.json()
        path = [bytes.fromhex(h) for h in doc["proof"]]
        assert [base64.b64decode(b) for b in doc["proof_base64"]] == path
        assert doc["event_hash"] == bytes(rows[seq][-1]).hex()  # type: ignore[arg-type]
        verify_inclusion(seq, size, bytes.fromhex(doc["leaf_hash"]), path, root)
    for old in (1, 2, 256, 300, size):
        doc = log.get("proof/consistency", old=old, new=size).json()
        path = [bytes.fromhex(h) for h in doc["proof"]]
        assert bytes.fromhex(doc["new_root"]) == root
        verify_consistency(old, size, bytes.fromhex(doc["old_root"]), root, path)


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("proof/inclusion", {"seq": 5, "size": 5}, "seq"),
        ("proof/inclusion", {"seq": 0, "size": 10**9}, "size"),
        ("proof/inclusion", {"seq": -1, "size": 5}, "seq"),
        ("proof/inclusion", {"size": 5}, "seq"),
        ("proof/consistency", {"old": 9, "new": 3}, "old"),
        ("proof/consistency", {"old": 0, "new": 3}, "old"),
        ("proof/consistency", {"old": 1, "new": 10**9}, "new"),
        ("tile/0/1", {}, "tile_path"),
        ("tile/0/000.p/256", {}, "tile_path"),
        ("tile/64/000", {}, "tile_path"),
    ],
)
def test_bad_parameters_are_400_naming_the_field(
    log: Log, path: str, params: dict[str, int], field: str
) -> None:
    answer = log.get(path, **params)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["field"] == field


def test_no_token_or_an_unknown_one_is_refused(log: Log) -> None:
    assert log.get("checkpoint", token=None).status_code == 401
    assert log.get("tile/0/000", token="not-a-token").status_code == 401


def test_the_independent_verifier_agrees(log: Log) -> None:
    size, root = _checkpoint(log)
    key = (log.data / "node.pub").read_text().strip()
    report = verify_log(log.url + "/v1/log", log.secret, key, seqs=[0, 7, 256, size - 1])
    assert report["size"] == size
    assert report["root"] == root.hex()
    assert report["included"] == 4
    assert report["consistent_from"] == [1, 256, size - 1]
