"""``infervisor fleet check``: the fleet witnesses each node's chain.

Each test serves a small chain (tests/chain_tamper.py) with the node's own API
server over TCP with a token (tests/fleet_support.py), lets the fleet verify
it once (events stored, checkpoint verified against the node.pub copy), then
tampers with the chain file as a root user could and checks again: a
truncation, a rewrite re-signed with the node's own key, a new key without a
recorded rotation, and a broken link in newly served events are each refused
with exit 1 naming the node; a recorded rotation and honest growth pass.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from chain_tamper import NODE, rewrite_from, truncate
from fleet_support import ServedChain, write_fleet
from support import cli_here
from test_chain_trust import _done, _raw, _resign_all

from infervisor.chain.checkpoint import load_signer
from infervisor.chain.checks import Row
from infervisor.chain.keys import rotate_key
from infervisor.chain.note import Signer
from infervisor.tools.api.errors import NotRunning
from infervisor.tools.fleet.config import load_config
from infervisor.tools.fleet.node_api import client_of
from infervisor.tools.fleet.serve import Fleet
from infervisor.tools.fleet.store import FleetStore, StoreError
from infervisor.tools.fleet.witness import check_node


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServedChain]:
    chain = ServedChain(tmp_path / "n1", 12)
    yield chain
    chain.close()


def check(fleet: Path) -> tuple[int, dict[str, dict[str, object]], str]:
    ran = cli_here("fleet", "check", fleet, "--json")
    assert "Traceback" not in ran.stderr, ran.stderr
    nodes = {n["node"]: n for n in json.loads(ran.stdout)["nodes"]}
    return ran.returncode, nodes, ran.stderr


def verified_once(tmp_path: Path, served: ServedChain) -> Path:
    fleet = write_fleet(tmp_path, [served.entry("n1", tmp_path / "keys")])
    code, nodes, err = check(fleet)
    assert code == 0, err
    assert nodes["n1"]["outcome"] == "ok"
    assert nodes["n1"]["size"] == 12
    return fleet


def stored_seqs(fleet: Path) -> list[int]:
    with sqlite3.connect(fleet.parent / "fleet.db") as conn:
        return [s for (s,) in conn.execute("SELECT seq FROM events WHERE node = 'n1' ORDER BY seq")]


def test_growth_verifies_and_every_event_is_stored_once(
    tmp_path: Path, served: ServedChain
) -> None:
    fleet = verified_once(tmp_path, served)
    served.grow(5)
    code, nodes, err = check(fleet)
    assert code == 0, err
    assert (nodes["n1"]["verified_size"], nodes["n1"]["size"]) == (12, 17)
    assert stored_seqs(fleet) == list(range(17))
    code, nodes, _ = check(fleet)  # again: nothing new, nothing repeated
    assert code == 0
    assert nodes["n1"]["detail"] == "size 17 is the verified size (unchanged)"
    assert stored_seqs(fleet) == list(range(17))


def cut_short(served: ServedChain, size: int) -> None:
    """The chain and its checkpoints cut to `size` events, as a root user could."""
    truncate(served.path, size)
    conn = _raw(served.path)
    conn.execute("DELETE FROM checkpoints WHERE tree_size > ?", (size,))
    conn.execute("DELETE FROM checkpoint_frontiers WHERE tree_size > ?", (size,))
    _done(conn)


def test_a_truncated_chain_is_named(tmp_path: Path, served: ServedChain) -> None:
    fleet = verified_once(tmp_path, served)
    cut_short(served, 8)
    synced = cli_here("fleet", "sync", fleet)  # sync notices it too, without a checkpoint
    assert synced.returncode == 1, synced.stdout
    why = "the node's head 7 is below the 12 events the fleet stored"
    assert synced.stdout.strip() == f"n1: truncated: {why}"
    assert "n1 (truncated)" in synced.stderr
    code, nodes, err = check(fleet)
    assert code == 1
    assert nodes["n1"]["outcome"] == "truncated", nodes
    assert nodes["n1"]["detail"] == why
    assert "n1 (truncated)" in err
    with FleetStore(fleet.parent / "fleet.db") as store:
        assert [(f.what, f.detail) for f in store.failures("n1")] == [("truncated", why)]


def test_serve_does_not_show_a_truncated_chain_in_step(tmp_path: Path, served: ServedChain) -> None:
    """fleet serve's check of a node cut short: a failure recorded, its metrics say
    how many events it lacks (events_missing) and leave out events_behind."""
    fleet = verified_once(tmp_path, served)
    cut_short(served, 8)
    config = load_config(fleet)
    entry, running = config.nodes[0], Fleet(config)
    with FleetStore(config.store) as store, client_of(entry) as client:
        assert running._short(entry, client, store)
        assert [f.what for f in store.failures("n1")] == ["truncated"]
    samples = {(s.name, s.labels["node"]): s.value for m in running.families() for s in m.samples}
    assert samples[("infervisor_fleet_node_events_missing", "n1")] == 4
    assert samples[("infervisor_fleet_node_diverged", "n1")] == 1
    assert ("infervisor_fleet_node_events_behind", "n1") not in samples
    assert samples[("infervisor_fleet_node_verification_failures_total", "n1")] == 1


def test_a_chain_cut_short_and_grown_again_is_named_forked(
    tmp_path: Path, served: ServedChain
) -> None:
    """Cut below what the fleet stored and grown back to as many events, others:
    sync (which reads no checkpoint) names the fork at the last seq stored, and
    serve's metrics say the node has diverged instead of "0 behind"."""
    fleet = verified_once(tmp_path, served)
    cut_short(served, 8)
    served.size = 8
    served.grow(4)  # 12 events again; seq 8 on are not the ones stored
    synced = cli_here("fleet", "sync", fleet)
    assert synced.returncode == 1, synced.stdout
    assert synced.stdout.startswith("n1: forked: the node's event 11 is not the one the fleet")
    config = load_config(fleet)
    entry, running = config.nodes[0], Fleet(config)
    with FleetStore(config.store) as store, client_of(entry) as client:
        assert running._short(entry, client, store)
    samples = {(s.name, s.labels["node"]): s.value for m in running.families() for s in m.samples}
    assert samples[("infervisor_fleet_node_diverged", "n1")] == 1
    assert ("infervisor_fleet_node_events_behind", "n1") not in samples


def drop_checkpoints(served: ServedChain) -> None:
    conn = _raw(served.path)
    conn.execute("DELETE FROM checkpoints")
    conn.execute("DELETE FROM checkpoint_frontiers")
    _done(conn)


def test_no_checkpoint_is_nothing_to_witness_until_one_was_verified(
    tmp_path: Path, served: ServedChain
) -> None:
    """A node that has signed no checkpoint yet is not a failure (exit 0, nothing
    recorded); once the fleet verified one, a node without any is truncated."""
    drop_checkpoints(served)
    fleet = write_fleet(tmp_path, [served.entry("n1", tmp_path / "keys")])
    code, nodes, err = check(fleet)
    assert code == 0, err
    assert nodes["n1"]["outcome"] == "no_checkpoint"
    with FleetStore(fleet.parent / "fleet.db") as store:
        assert store.failures("n1") == []
    served.grow(4)  # a checkpoint over 16 events
    code, nodes, err = check(fleet)
    assert code == 0 and nodes["n1"]["outcome"] == "ok", err
    drop_checkpoints(served)
    code, nodes, err = check(fleet)
    assert code == 1 and nodes["n1"]["outcome"] == "truncated", nodes
    assert nodes["n1"]["detail"] == "the node has no checkpoint now; the fleet verified size 16"


def test_a_rewritten_chain_resigned_with_the_nodes_key_is_named(
    tmp_path: Path, served: ServedChain
) -> None:
    fleet = verified_once(tmp_path, served)
    rewrite_from(served.path, 5)
    _resign_all(served.path, load_signer(served.folder / "node.key"))
    code, nodes, err = check(fleet)
    assert code == 1
    assert nodes["n1"]["outcome"] == "forked", nodes
    assert "n1 (forked)" in err


def test_a_new_key_without_a_recorded_rotation_is_named(
    tmp_path: Path, served: ServedChain
) -> None:
    fleet = verified_once(tmp_path, served)
    old = load_signer(served.folder / "node.key")
    _resign_all(served.path, Signer.generate(old.name))
    code, nodes, err = check(fleet)
    assert code == 1
    assert nodes["n1"]["outcome"] == "key_changed", nodes
    assert "n1 (key_changed)" in err


def test_a_recorded_rotation_is_followed(tmp_path: Path, served: ServedChain) -> None:
    fleet = verified_once(tmp_path, served)
    rotate_key(served.path, NODE, 1_800_000_000_000_000_000)
    code, nodes, err = check(fleet)
    assert code == 0, (nodes, err)
    assert nodes["n1"]["size"] == 13


def test_a_broken_link_is_not_stored(tmp_path: Path, served: ServedChain) -> None:
    """Events rewritten below what the fleet stored, then new ones: the first new one
    does not link to the fleet's copy; nothing of it is stored, the failure recorded."""
    fleet = verified_once(tmp_path, served)
    rewrite_from(served.path, 10)
    served.grow(2)
    code, nodes, err = check(fleet)
    assert code == 1, err
    assert nodes["n1"]["outcome"] == "event_refused", nodes
    assert "link broken" in str(nodes["n1"]["detail"]), nodes
    assert stored_seqs(fleet) == list(range(12))
    with sqlite3.connect(fleet.parent / "fleet.db") as conn:
        (what,) = conn.execute("SELECT what FROM failures WHERE node = 'n1'").fetchone()
    assert what == "link broken"


def test_a_row_stored_twice_is_kept_once_and_another_refused(tmp_path: Path) -> None:
    """Two followers of one store (fleet check beside fleet serve) may store the same
    event: the second keeps the first; a different event of that seq is refused."""
    row = Row(0, 1, b"n", b"node", b"k", b"", b"{}", bytes(32), bytes(32), bytes(range(32)))
    with FleetStore(tmp_path / "fleet.db") as store:
        store.append("n1", row)
        store.append("n1", row)
        assert store.count("n1") == 1
        with pytest.raises(StoreError, match="another event of that seq"):
            store.append("n1", row._replace(hash=bytes(32)))
        assert store.last("n1") == row


def test_events_that_are_not_what_the_checkpoint_signed_are_named(
    tmp_path: Path, served: ServedChain
) -> None:
    """A node that serves a rewritten history (linking fine) under checkpoints signed
    over the original: the fleet's first verification compares them."""
    rewrite_from(served.path, 5)
    fleet = write_fleet(tmp_path, [served.entry("n1", tmp_path / "keys")])
    code, nodes, err = check(fleet)
    assert code == 1
    assert nodes["n1"]["outcome"] == "events_differ", nodes
    assert "n1 (events_differ)" in err


def test_a_node_gone_between_its_checkpoint_and_its_proof_is_unreachable_not_forked(
    tmp_path: Path, served: ServedChain, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clean-clone .ci/run (stop 34): a node restarting after it served its
    checkpoint refused the consistency proof's connection, and the fleet recorded
    a verification failure, 'forked'. A node that does not answer is not checked
    (unreachable), nothing is recorded, and the next check verifies it."""
    fleet = verified_once(tmp_path, served)
    served.grow(5)
    config = load_config(fleet)
    entry = config.nodes[0]

    def refused(self: object, old: int, new: int) -> list[bytes]:
        raise NotRunning("nothing answers at the node: [Errno 111] Connection refused", "no_node")

    with FleetStore(config.store) as store, client_of(entry) as client:
        monkeypatch.setattr(type(client), "consistency", refused)
        result = check_node(entry, client, store)
        monkeypatch.undo()
        assert (result.outcome, result.size) == ("unreachable", None), result
        assert store.failures("n1") == []
        assert check_node(entry, client, store).outcome == "ok"
