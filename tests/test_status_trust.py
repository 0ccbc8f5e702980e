"""Offline ``status`` (and ``status --node``) applies the trust policy that
``replay``, ``events`` and ``timeline`` apply (tools/audit/offline.py's
``read_offline`` with the reader's trust arguments): a chain that fails against
its stored checkpoints is refused, exit 1, ``chain_invalid``, unless
``--unverified``.

A newcomer's trial (stop 33): a chain whose tail past a stored checkpoint was
deleted showed its full table with exit 0 and no warning under ``status``, while
replay refused it and the node would not boot on it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chain_tamper import truncate
from test_cli_paths import run
from varied_chain import varied_events

from infervisor.chain import SqliteChain
from infervisor.chain.checkpoint import load_or_create_signer
from infervisor.chain.checkpoint_store import Checkpointer

NOW = 1_793_491_200_000_000_000


def make_chain(folder: Path, events: int, *, every: int) -> Path:
    """A replayable chain of `events` varied events in folder/chain.db, checkpointed
    every `every` events (and at the end)."""
    folder.mkdir(parents=True)
    db = folder / "chain.db"
    signer = load_or_create_signer(folder, "varied")
    with SqliteChain.open(db, "varied", now_ns=lambda: NOW) as chain:
        cp = Checkpointer(db, "varied", signer, every_events=every, every_s=1e9, now_ns=lambda: NOW)
        drafts = [d for d in varied_events(events * 2) if d.kind != "node.stopped"]
        for d in drafts[: events - 1]:
            cp.observe(chain.append_many([d]))
        cp.close()
    return db


@pytest.mark.parametrize("node", [(), ("--node",)], ids=["instances", "node"])
def test_status_refuses_a_chain_truncated_below_its_checkpoints(
    tmp_path: Path, node: tuple[str, ...]
) -> None:
    db = make_chain(tmp_path / "node", 20, every=4)
    truncate(db, 13)
    replay = run("replay", db)
    assert replay.code == 1, replay
    ran = run("status", db, *node)
    assert ran.code == 1, ran
    assert "does not verify against its checkpoints at seq 13: truncated" in ran.stderr
    assert ran.stdout == ""


@pytest.mark.parametrize("node", [(), ("--node",)], ids=["instances", "node"])
def test_status_unverified_reads_it_marked(tmp_path: Path, node: tuple[str, ...]) -> None:
    db = make_chain(tmp_path / "node", 20, every=4)
    truncate(db, 13)
    ran = run("status", db, *node, "--unverified", "--json")
    assert ran.code == 0, ran
    doc = json.loads(ran.stdout)
    assert doc["verified"] is False
    assert "truncated" in json.dumps(doc["problem"])


@pytest.mark.parametrize("node", [(), ("--node",)], ids=["instances", "node"])
def test_status_of_an_intact_chain_still_reads(tmp_path: Path, node: tuple[str, ...]) -> None:
    db = make_chain(tmp_path / "node", 20, every=4)
    ran = run("status", db, *node)
    assert ran.code == 0, ran
