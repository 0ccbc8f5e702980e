"""The node checks its chain before resuming, from its last checkpoint, and refuses a bad one."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest
from chain_tamper import NODE, alter_payload, draft, make_chain, rewrite_from, truncate
from conftest import NodeFactory

from infervisor.actors.chain_writer import ChainWriter
from infervisor.actors.messages import Append
from infervisor.chain import ChainError, SqliteChain, verify_chain
from infervisor.chain.boot import check_node_chain
from infervisor.chain.checkpoint_store import read_stored
from infervisor.chain.errors import ChainTampered, CheckpointError
from infervisor.replay.snapshot import SNAPSHOT_FILE
from infervisor.tools.node.boot import open_node
from infervisor.tools.node.config import NodeConfig
from infervisor.tools.node.lock import RunError


def test_a_good_chain_passes_verifying_only_past_the_checkpoint(tmp_path: Path) -> None:
    path = make_chain(tmp_path, 12, every=4)
    with SqliteChain.open(path, NODE) as chain:  # three events after the last checkpoint
        chain.append_many([draft(n) for n in range(12, 15)])
    report = check_node_chain(path, NODE)
    assert (report.events, report.checkpoint_size, report.fully_verified) == (15, 12, 3)


def test_no_checkpoint_means_a_full_check(tmp_path: Path) -> None:
    with SqliteChain.open(tmp_path / "chain.db", NODE) as chain:
        chain.append_many([draft(n) for n in range(1, 5)])
    report = check_node_chain(tmp_path / "chain.db", NODE)
    assert (report.checkpoint_size, report.fully_verified) == (0, 5)


def refused(path: Path) -> ChainTampered:
    with pytest.raises(ChainTampered) as caught:
        check_node_chain(path, NODE)
    message = str(caught.value)
    assert "refuses to resume" in message and f"mv {path}" in message
    return caught.value


def test_truncated_tail_refused(tmp_path: Path) -> None:
    path = make_chain(tmp_path, 10, every=4)
    truncate(path, 7)
    e = refused(path)
    assert (e.seq, e.reason) == (7, "truncated")


def test_the_check_reads_only_what_follows_the_last_checkpoint(tmp_path: Path) -> None:
    path = make_chain(tmp_path, 10, every=4)
    with SqliteChain.open(path, NODE) as chain:  # three more, after the last checkpoint
        chain.append_many([draft(n) for n in range(10, 13)])
    report = check_node_chain(path, NODE)
    signed = report.checkpoint_size  # the frontier stored with it stands for the rest
    assert signed < report.events
    assert report.fully_verified == report.events - signed == 3
    # An edit below it that keeps the stored hashes is the replay's to find (the
    # node verifies every event as it replays it: test_node_refuses_an_altered_payload)
    # and chain verify's.
    alter_payload(path, 3)
    assert check_node_chain(path, NODE).checkpoint_size == signed
    problem = verify_chain(path).problem
    assert problem is not None and (problem.seq, problem.reason) == (3, "payload altered")


def test_without_a_frontier_the_events_below_are_read(tmp_path: Path) -> None:
    path = make_chain(tmp_path, 10, every=4)
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("DELETE FROM checkpoint_frontiers")
    alter_payload(path, 3)
    e = refused(path)
    assert (e.seq, e.reason) == (3, "payload altered")


def test_altered_payload_past_the_checkpoint_refused(tmp_path: Path) -> None:
    path = make_chain(tmp_path, 8, every=4)
    with SqliteChain.open(path, NODE) as chain:
        chain.append_many([draft(n) for n in range(8, 11)])
    alter_payload(path, 9)
    e = refused(path)
    assert (e.seq, e.reason) == (9, "payload altered")


def test_rewrite_refused(tmp_path: Path) -> None:
    path = make_chain(tmp_path, 10, every=4)
    rewrite_from(path, 5)
    e = refused(path)
    assert (e.seq, e.reason) == (4, "rewritten")  # the checkpoint of size 4 still holds


def test_checkpoints_without_the_key_refused(tmp_path: Path) -> None:
    path = make_chain(tmp_path, 5)
    (tmp_path / "node.key").unlink()
    with pytest.raises(CheckpointError, match="node key"):
        check_node_chain(path, NODE)


# ---------------------------------------------------------------- a real node
def test_node_signs_at_shutdown_and_refuses_a_tampered_chain(
    nodes: NodeFactory, fake_llama: str, tmp_path: Path
) -> None:
    settings = nodes.settings(fake_llama, tmp_path / "models", checkpoint_every_events=1000)
    nodes.open(settings).shutdown()
    stored = read_stored(settings.chain_path)
    assert stored, "a clean shutdown signs a checkpoint"
    assert (Path(settings.data_dir) / "node.key").stat().st_mode & 0o777 == 0o600
    nodes.open(settings).shutdown()  # an intact chain resumes
    size = read_stored(settings.chain_path)[-1].tree_size
    truncate(settings.chain_path, size - 1)
    with pytest.raises(ChainTampered) as caught:
        nodes.open(settings)
    assert (caught.value.seq, caught.value.reason) == (size - 1, "truncated")


def test_node_refuses_an_altered_payload(
    nodes: NodeFactory, fake_llama: str, tmp_path: Path
) -> None:
    """A payload altered in place below the snapshot is not read at boot (the boot
    neither replays nor verifies what the snapshot covers, as the boot check does not
    read below its checkpoint): the node resumes on the snapshot's state, taken before
    the edit, and ``chain verify`` names the edit. Without the snapshot the boot
    replays every event, verified, and refuses."""
    settings = nodes.settings(fake_llama, tmp_path / "models")
    nodes.open(settings).shutdown()
    alter_payload(settings.chain_path, 1)
    nodes.open(settings).shutdown()  # from the snapshot: the edit is below it
    problem = verify_chain(settings.chain_path).problem
    assert problem is not None
    assert (problem.seq, problem.reason) == (1, "payload altered")
    (Path(settings.data_dir) / SNAPSHOT_FILE).unlink()
    with pytest.raises(ChainTampered) as caught:
        nodes.open(settings)
    assert (caught.value.seq, caught.value.reason) == (1, "payload altered")


def test_run_reports_the_refusal_in_one_line(
    nodes: NodeFactory, fake_llama: str, tmp_path: Path
) -> None:
    settings = nodes.settings(fake_llama, tmp_path / "models")
    nodes.open(settings).shutdown()
    size = read_stored(settings.chain_path)[-1].tree_size
    truncate(settings.chain_path, size - 1)
    with pytest.raises(RunError) as caught:
        open_node(NodeConfig(node=settings))
    message = str(caught.value)
    assert f"truncated at seq {size - 1}" in message
    assert "Keep it as evidence and start anew" in message and "mv " in message


def test_checkpoint_triggers_checked_by_their_sql(tmp_path: Path) -> None:
    path = make_chain(tmp_path, 6, every=4)
    with sqlite3.connect(path) as conn:  # a do-nothing trigger under the right name
        conn.execute("DROP TRIGGER checkpoints_append_only_delete")
        conn.execute(
            "CREATE TRIGGER checkpoints_append_only_delete BEFORE DELETE ON checkpoints "
            "BEGIN SELECT 1; END"
        )
        conn.execute("DELETE FROM checkpoints WHERE tree_size = 6")
    e = refused(path)
    assert e.reason == "checkpoint triggers changed" and "altered" in e.detail


def test_a_dropped_checkpoints_table_refused(tmp_path: Path) -> None:
    path = make_chain(tmp_path, 6, every=4)
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE checkpoints")
    assert refused(path).reason == "checkpoints dropped"


def test_node_refuses_a_replaced_events_trigger(
    nodes: NodeFactory, fake_llama: str, tmp_path: Path
) -> None:
    settings = nodes.settings(fake_llama, tmp_path / "models")
    nodes.open(settings).shutdown()
    with sqlite3.connect(settings.chain_path) as conn:
        conn.execute("DROP TRIGGER events_append_only_update")
        conn.execute(
            "CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events BEGIN SELECT 1; END"
        )
    with pytest.raises(ChainError, match="events_append_only_update"):
        nodes.open(settings)


def test_the_chain_writer_signs_every_n_events_and_when_it_stops(tmp_path: Path) -> None:
    writer = ChainWriter.start(tmp_path / "chain.db", NODE, checkpoint_every_events=3)
    try:
        for n in range(1, 8):
            writer.ask(Append(drafts=(draft(n),)), timeout=10)
    finally:
        writer.stop()
    sizes = [c.tree_size for c in read_stored(tmp_path / "chain.db")]
    assert sizes == [3, 6, 8]  # genesis + 7 events; the last one at stop
    assert check_node_chain(tmp_path / "chain.db", NODE).checkpoint_size == 8
