"""Witnessing on the node (issue 18 items 1 and 2), in-process: the wire format, the
boot decision's table, the config, the submitter fed by the chain writer, and the
boot check refusing a chain rewritten and re-signed with the node's own key.

The witness is tests/servers/witness_double.py, written from c2sp.org/tlog-witness.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers.witness_double import WitnessDouble
from support import cli_here, wait_until

from infervisor.actors.chain_writer import ChainWriter
from infervisor.actors.clock import RealClock
from infervisor.actors.core.witness_boot import (
    OVERRIDE_FLAG,
    WitnessAnswer,
    decide_witness_boot,
)
from infervisor.actors.errors import WitnessConflict
from infervisor.actors.messages import Append
from infervisor.actors.node import Node
from infervisor.actors.settings import NodeSettings
from infervisor.actors.witness_submit import Outcome, Submitted, WitnessTarget, witness_size
from infervisor.actors.witnessing import Witnessing
from infervisor.adapters.witness_http import WitnessReply
from infervisor.chain import EventDraft, SqliteChain
from infervisor.chain.checkpoint import load_or_create_signer
from infervisor.chain.checkpoint_store import Checkpointer, read_stored
from infervisor.chain.cosignature import Cosigner, cosignatures_of, parse_witness_key
from infervisor.chain.cosignature_store import read_lines_by_size, with_cosignatures
from infervisor.chain.errors import CheckpointError
from infervisor.chain.merkle import Memo, consistency_proof
from infervisor.chain.note import Signer
from infervisor.replay import events as ev
from infervisor.tools.node.config import ConfigError, load_config

DEADLINE_S = 60.0


# ---------------------------------------------------------------- the wire format
@pytest.mark.parametrize(
    ("status", "kind", "body", "size"),
    [
        (409, "text/x.tlog.size", "17\n", 17),
        (409, "", "0\n", 0),
        (409, "text/x.tlog.size", "17", None),  # no newline
        (409, "text/x.tlog.size", "017\n", None),  # a leading zero
        (409, "text/html", "17\n", None),
        (409, "text/x.tlog.size", "-1\n", None),
        (200, "text/x.tlog.size", "17\n", None),
    ],
)
def test_a_409_body_gives_the_witness_size(
    status: int, kind: str, body: str, size: int | None
) -> None:
    assert witness_size(WitnessReply(status, kind, body.encode())) == size


# ---------------------------------------------------------------- the boot decision
def _sub(outcome: Outcome, size: int | None) -> Submitted:
    return Submitted(outcome, size, outcome.value)


@pytest.mark.parametrize(
    ("answer", "refused", "note"),
    [
        (_sub(Outcome.COSIGNED, 40), False, None),
        (_sub(Outcome.AHEAD, 57), True, None),  # rollback: it cosigned more than the chain has
        (_sub(Outcome.INCONSISTENT, 30), True, None),  # 422 from its size: a fork
        (None, False, "did not answer in time: the chain is unanchored at w1"),
        (_sub(Outcome.UNREACHABLE, None), False, "unanchored at w1"),
        (_sub(Outcome.REFUSED, None), False, "unanchored at w1"),
        (_sub(Outcome.AHEAD, 40), False, "unanchored"),  # not above the chain: no proof of a cut
    ],
)
def test_boot_decision_table(answer: Submitted | None, refused: bool, note: str | None) -> None:
    decision = decide_witness_boot([WitnessAnswer("w1", answer)], 40, accept_conflict=False)
    assert (decision.refusal is not None) == refused
    assert decision.events == ()
    if refused:
        assert decision.refusal is not None
        assert "w1" in decision.refusal and "40" in decision.refusal
        assert str(answer.witness_size) in decision.refusal  # type: ignore[union-attr]
        assert OVERRIDE_FLAG in decision.refusal and "\n" not in decision.refusal
    if note is not None:
        assert any(note in line for line in decision.notes)


def test_the_override_resumes_and_records_each_refusing_witness() -> None:
    answers = [
        WitnessAnswer("w1", _sub(Outcome.AHEAD, 57)),
        WitnessAnswer("w2", _sub(Outcome.INCONSISTENT, 30)),
        WitnessAnswer("w3", _sub(Outcome.COSIGNED, 40)),
    ]
    decision = decide_witness_boot(answers, 40, accept_conflict=True)
    assert decision.refusal is None
    assert [(e.witness, e.witness_size, e.chain_size, e.flag) for e in decision.events] == [
        ("w1", 57, 40, OVERRIDE_FLAG),
        ("w2", 30, 40, OVERRIDE_FLAG),
    ]
    assert decision.events[0].reason.startswith("rollback")
    assert decision.events[1].reason.startswith("fork")


# ---------------------------------------------------------------- the config
def _config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(f'[node]\nnode_id = "n1"\ndata_dir = "data"\n{body}')
    return path


def test_config_takes_witnesses_and_refuses_bad_ones_in_one_line(tmp_path: Path) -> None:
    good = Cosigner.generate("w.example/one").key.key_string()
    entry = f'[[witnesses]]\nurl = "http://127.0.0.1:1/w"\nvkey = "{good}"\n'
    config = load_config(_config(tmp_path, "witness_quorum = 1\n" + entry))
    assert config.witness_targets() == [
        WitnessTarget("http://127.0.0.1:1/w", parse_witness_key(good))
    ]
    cases = {
        f'[[witnesses]]\nurl = "http://x"\nvkey = "{good[:-4]}AAAA"\n': "[[witnesses]] #1 vkey",
        '[[witnesses]]\nurl = "http://x"\nvkey = "nonsense"\n': "[[witnesses]] #1 vkey",
        f'[[witnesses]]\nurl = "ftp://x"\nvkey = "{good}"\n': "[[witnesses]] #1 url",
        f'[[witnesses]]\nurl = "http://x"\nvkey = "{good}"\nname = "x"\n': "unknown key `name`",
        f'witness_quorum = 2\n[[witnesses]]\nurl = "http://x"\nvkey = "{good}"\n': "1 .. 1",
        f'[[witnesses]]\nurl = "http://x"\nvkey = "{good}"\n'
        f'[[witnesses]]\nurl = "http://y"\nvkey = "{good}"\n': "configured twice",
        'origin = "has space"\n': "origin",
    }
    for body, named in cases.items():
        with pytest.raises(ConfigError) as refused:
            load_config(_config(tmp_path, body))
        message = str(refused.value)
        assert named in message and "\n" not in message, (body, message)


# ---------------------------------------------------------------- the submitter
@pytest.fixture
def witness(tmp_path: Path) -> Iterator[WitnessDouble]:
    double = WitnessDouble("witness.test/one", [new_chain(tmp_path / "data").verifier])
    yield double
    double.release()
    double.stop()


def new_chain(data: Path, node_id: str = "n1") -> Signer:
    """A new chain of ``node_id`` in ``data`` with its key and a first checkpoint (as a
    first run leaves it), so that a witness can be given the key before the node runs."""
    data.mkdir(parents=True, exist_ok=True)
    signer = load_or_create_signer(data, node_id, origin=f"example.com/fleet/{node_id}")
    SqliteChain.open(data / "chain.db", node_id).close()
    Checkpointer(data / "chain.db", node_id, signer).close()
    return signer


def _origin(tmp_path: Path) -> str:
    """The origin of the test chain's checkpoints: its key's name (node.pub)."""
    return (tmp_path / "data" / "node.pub").read_text().split("+", 1)[0]


def _node_draft(n: int) -> EventDraft:
    event = ev.NodeStopped(reason=f"test {n}")
    return EventDraft(
        ts_ns=1_800_000_000_000_000_000 + n,
        source="node",
        kind=ev.kind_of(event),
        subject="",
        payload=ev.encode_event(event),
    )


def _started_draft() -> EventDraft:
    event = ev.NodeStarted(pid=1, boot_id="b", version="0")
    return EventDraft(
        ts_ns=1_800_000_000_000_000_000, source="node", kind=ev.kind_of(event),
        subject="", payload=ev.encode_event(event),
    )  # fmt: skip


def _verified_sizes(db: Path, double: WitnessDouble) -> list[int]:
    """Tree sizes whose stored cosignature of ``double`` verifies against the stored checkpoint."""
    notes = {row.tree_size: row.note for row in read_stored(db)}
    sizes = []
    for size, lines in read_lines_by_size(db).items():
        note = with_cosignatures(notes[size], lines)
        if cosignatures_of(note, [double.cosigner.key]):
            sizes.append(size)
    return sorted(sizes)


def test_every_checkpoint_the_writer_signs_is_cosigned_and_stored(
    tmp_path: Path, witness: WitnessDouble
) -> None:
    db = tmp_path / "data" / "chain.db"
    target = WitnessTarget(witness.url, witness.cosigner.key)
    witnessing = Witnessing([target], db, RealClock())
    writer = ChainWriter.start(db, "n1", checkpoint_every_events=1, on_checkpoint=witnessing.offer)
    try:
        for n in range(1, 6):
            writer.ask(Append(drafts=[_node_draft(n)]), timeout=DEADLINE_S)
            size = n + 1  # the genesis and n events
            wait_until(lambda s=size: witness.size_of(_origin(tmp_path)) == s, DEADLINE_S, "cosign")
            wait_until(lambda s=size: s in _verified_sizes(db, witness), DEADLINE_S, "stored")
        assert _verified_sizes(db, witness) == [2, 3, 4, 5, 6]
        (row,) = witnessing.board.rows()
        assert (row.cosigned_size, row.behind_events, row.last_error) == (6, 0, None)
        assert row.last_success_ns is not None
    finally:
        writer.stop()
        witnessing.stop()


def test_the_checkpoint_a_clean_stop_signs_is_cosigned(
    tmp_path: Path, witness: WitnessDouble
) -> None:
    """A newcomer's trial (stop 34): the checkpoint the writer signs as it closes
    was stored but never handed to the witnesses, so a session shorter than the
    checkpoint period was witnessed only at the next boot, the very boot a backup
    of its start, restored over its end, would take. Stopped as stop_actors does
    (the writer, then the witnesses' flush), the witness has cosigned the head."""
    db = tmp_path / "data" / "chain.db"
    target = WitnessTarget(witness.url, witness.cosigner.key)
    witnessing = Witnessing([target], db, RealClock())
    writer = ChainWriter.start(
        db, "n1", checkpoint_every_events=1_000, on_checkpoint=witnessing.offer
    )
    try:
        for n in range(1, 4):
            writer.ask(Append(drafts=[_node_draft(n)]), timeout=DEADLINE_S)
    finally:
        writer.stop()
        witnessing.stop()
    assert witness.size_of(_origin(tmp_path)) == 4  # the genesis and 3 events
    assert _verified_sizes(db, witness) == [4]


# ---------------------------------------------------------------- the boot check (422)
def test_a_chain_rewritten_and_resigned_with_the_node_key_is_refused(
    tmp_path: Path, witness: WitnessDouble
) -> None:
    data = tmp_path / "data"
    settings = NodeSettings(
        node_id="n1", data_dir=str(data), llamacpp_program="/bin/false",
        checkpoint_every_events=1, witness_boot_timeout_s=30.0,
    )  # fmt: skip
    target = WitnessTarget(witness.url, witness.cosigner.key)
    node = Node.open(settings, witnesses=[target])
    assert node.witness_notes == []
    wait_until(lambda: witness.size_of(_origin(tmp_path)) >= 2, DEADLINE_S, "node.started cosigned")
    node.shutdown()

    # A new chain of the same node, longer than what the witness cosigned, signed
    # with the node's own key: it verifies on its own, and it is not an extension.
    for name in os.listdir(data):
        if name.startswith("chain.db"):
            shutil.move(data / name, tmp_path / name)
    signer = load_or_create_signer(data, "n1")
    with SqliteChain.open(settings.chain_path, "n1") as chain:
        chain.append_many([_node_draft(n) for n in range(1, 10)])  # longer than the first
    Checkpointer(settings.chain_path, "n1", signer).close()

    with pytest.raises(WitnessConflict) as refused:
        Node.open(settings, witnesses=[target])
    message = str(refused.value)
    assert "witness.test/one" in message and "\n" not in message
    cosigned = witness.size_of(_origin(tmp_path))
    assert f"cosigned size {cosigned}" in message and "chain of 10 events" in message
    assert (_origin(tmp_path), 422) in witness.requests
    with SqliteChain.open_readonly(settings.chain_path) as chain:
        kinds = [e.kind for e in chain.events()]
    assert "node.started" not in kinds  # nothing was appended


def _rows(db: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every row of the chain's events and checkpoints tables, in order."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {
            table: conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
            for table in ("events", "checkpoints", "checkpoint_frontiers")
        }
    finally:
        conn.close()


def test_a_rolled_back_chain_is_refused_before_the_node_key_signs_anything(
    tmp_path: Path, witness: WitnessDouble
) -> None:
    """A newcomer's trial (stop 34): the refused boot used to sign and store a
    checkpoint over the truncated chain (size 15 here) before the witness said 98."""
    data = tmp_path / "data"
    settings = NodeSettings(
        node_id="n1", data_dir=str(data), llamacpp_program="/bin/false",
        checkpoint_every_events=1, witness_boot_timeout_s=30.0,
    )  # fmt: skip
    signer = load_or_create_signer(data, "n1")
    with SqliteChain.open(settings.chain_path, "n1") as chain:
        chain.append_many([_node_draft(n) for n in range(1, 10)])
    Checkpointer(settings.chain_path, "n1", signer).close()  # size 10
    with SqliteChain.open(settings.chain_path, "n1") as chain:
        chain.append_many([_started_draft()] * 5)  # 15 events: runs cut off, no clean stop
    # The witness cosigned size 98 of this chain before events were cut.
    witness.state[_origin(tmp_path)] = (98, bytes(32))
    before = _rows(settings.chain_path)
    assert max(size for size, *_ in before["checkpoints"]) == 10

    with pytest.raises(WitnessConflict) as refused:
        Node.open(settings, witnesses=[target_of(witness)])
    message = str(refused.value)
    assert "cosigned size 98" in message and "the chain has 15 events" in message
    assert _rows(settings.chain_path) == before  # no checkpoint, no event, no frontier
    assert "ok against checkpoint: tree size 10" in cli_chain_verify(settings.chain_path)


def target_of(double: WitnessDouble) -> WitnessTarget:
    """The node's view of ``double``: its URL and key."""
    return WitnessTarget(double.url, double.cosigner.key)


def cli_chain_verify(db: Path) -> str:
    """``chain verify``'s report on ``db`` (asserting exit 0)."""
    done = cli_here("chain", "verify", db)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_memoized_consistency_proofs_are_the_same_proofs() -> None:
    """A submitter keeps perfect subtree roots between proofs of a growing chain."""
    leaves = [hashlib.sha256(str(i).encode()).digest() for i in range(1300)]
    memo: Memo = {}
    for old, new in [(1, 300), (300, 511), (511, 512), (512, 1024), (700, 1025), (3, 1300)]:
        assert consistency_proof(leaves[:new], old, new, memo) == consistency_proof(
            leaves[:new], old, new
        )
    assert memo  # something was kept


def test_a_configured_origin_names_the_key_and_another_one_later_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    def settings(origin: str) -> NodeSettings:
        return NodeSettings(
            node_id="n1", data_dir=str(tmp_path / "data"), llamacpp_program="/bin/false",
            origin=origin,
        )  # fmt: skip

    Node.open(settings("example.com/fleet-a/n1")).shutdown()
    key = (tmp_path / "data" / "node.pub").read_text()
    assert key.startswith("example.com/fleet-a/n1+")
    with pytest.raises(CheckpointError) as refused:
        Node.open(settings("example.com/fleet-b/n1"))
    assert "example.com/fleet-b/n1" in str(refused.value) and "\n" not in str(refused.value)
