"""`witness --audit` with its default fetch, `infervisor chain pull`, from a node's API.

Runs once `tools/audit/chain_pull.py` (branch `tiles`) is merged; skipped before.
A node's chain (the chain's own writer and checkpointer) is served by the
node's API on loopback TCP with a read token; the witness mirrors it over
tlog-tiles and audits it.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

pytest.importorskip("infervisor.tools.audit.chain_pull")

from tiles_support import grow_chain

from infervisor.adapters.ports import free_port
from infervisor.chain.checkpoint import load_or_create_signer
from infervisor.chain.checkpoint_store import (
    Checkpointer,
    event_hashes,
    latest_checkpoint,
)
from infervisor.chain.cosignature import Cosigner
from infervisor.chain.merkle import consistency_proof, leaf_hash
from infervisor.chain.records import EventDraft
from infervisor.chain.sqlite import SqliteChain
from infervisor.chain.witness_protocol import encode_add_checkpoint
from infervisor.replay import events as ev
from infervisor.replay import kind_of
from infervisor.tools.api.auth import TcpAddress, load_or_create_tokens
from infervisor.tools.api.scopes import ApiToken, Scope
from infervisor.tools.api.serving.server import ApiServer
from infervisor.tools.witness.audit import ChainAuditor
from infervisor.tools.witness.config import WitnessedLog
from infervisor.tools.witness.service import Witness
from infervisor.tools.witness.store import WitnessStore


def _request(db: Path, old: int) -> bytes:
    conn = sqlite3.connect(db)
    try:
        cp = latest_checkpoint(conn)
        hashes = event_hashes(conn)
    finally:
        conn.close()
    assert cp is not None
    leaves = [leaf_hash(h) for h in hashes]  # an event hash is a leaf's data
    proof = consistency_proof(leaves, old, cp.tree_size) if 0 < old < cp.tree_size else []
    return encode_add_checkpoint(old, proof, cp.note)


def _append_unplaced_start(data: Path) -> None:
    """An `instance.starting` for an instance never placed, signed into a checkpoint."""
    event = ev.Starting(by="supervisor", attempt=1)
    draft = EventDraft(
        ts_ns=2**62,
        source="supervisor",
        kind=kind_of(event),
        subject="ghost-0123abcd-n1",
        payload=ev.encode_event(event),
    )
    signer = load_or_create_signer(data, "n1")
    checkpointer = Checkpointer(data / "chain.db", "n1", signer, every_events=10**9)
    with SqliteChain.open(data / "chain.db", "n1") as chain:
        checkpointer.observe(chain.append_many([draft]))
    checkpointer.close()


@pytest.mark.timeout(120)
def test_the_audit_witness_pulls_the_node_and_refuses_a_forbidden_event(tmp_path: Path) -> None:
    data = tmp_path / "node"
    size = grow_chain(data, "n1", 20)
    signer = load_or_create_signer(data, "n1")
    tokens = load_or_create_tokens(data, [ApiToken(name="witness", scope=Scope.READ)])
    (tmp_path / "token").write_text(json.loads((data / "api-tokens.json").read_text())["witness"])
    port = free_port()
    server = ApiServer.listen(
        data, data / "chain.db", "n1", tcp=TcpAddress("127.0.0.1", port), tokens=tokens
    )
    (tmp_path / "wdata").mkdir()
    log = WitnessedLog(
        signer.name, (signer.verifier,), f"http://127.0.0.1:{port}", tmp_path / "token"
    )
    witness = Witness(
        Cosigner.generate("w.test/audit"),
        {log.origin: log},
        WitnessStore(tmp_path / "wdata" / "witness.db"),
        auditor=ChainAuditor(tmp_path / "wdata"),
    )
    try:
        answer = witness.add_checkpoint(_request(data / "chain.db", 0))
        assert answer.status == 200, answer.body
        _append_unplaced_start(data)
        answer = witness.add_checkpoint(_request(data / "chain.db", size))
        assert answer.status == 422, answer.body
        assert answer.body.decode().startswith(f"seq {size}: instance never placed")
    finally:
        witness.store.close()
        server.close()
