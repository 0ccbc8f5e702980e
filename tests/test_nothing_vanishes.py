"""Nothing placed ever vanishes (issue 11, item 2) and placements say what they did
(item 5), on a real node with the fake llama-protocol server.

An instance the chain has whose adapter cannot be built after a node restart
(its model removed or changed, its launcher program missing) is listed, answers
every verb with its problem, records the problem once per cause, and starts
again once the problem is fixed, without another node restart.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import pytest
from conftest import NodeFactory
from support import FAKE_GGUF, PROGRAMS, gguf_registry, make_launcher
from test_managed_lifecycle import spec

from infervisor.actors.errors import InvalidState, UnknownInstance
from infervisor.actors.node import Node, PlacementOutcome
from infervisor.actors.settings import NodeSettings
from infervisor.adapters.errors import AdmissionRefused
from infervisor.adapters.ports import free_port
from infervisor.chain import SqliteChain


def running(node: Node, iid: str) -> None:
    node.wait_for(iid, lambda v: v.lifecycle == "running", 60)


def kinds_of(node: Node, iid: str) -> list[str]:
    with SqliteChain.open_readonly(node.settings.chain_path) as chain:
        return [e.kind for e in chain.events(subject=iid)]


def refusals(node: Node, iid: str) -> list[str]:
    with SqliteChain.open_readonly(node.settings.chain_path) as chain:
        found = chain.events(subject=iid, kinds=["instance.start_refused"])
        return [msgspec.json.decode(e.payload)["reason"] for e in found]


def placed_and_stopped(nodes: NodeFactory, settings: NodeSettings, model: Path) -> str:
    """A node that places, starts and shuts down one instance (wanted running)."""
    node = nodes.open(settings)
    node.registry.adopt("tiny", model / "tiny.gguf")
    iid = node.place(spec(free_port()))
    node.start(iid)
    running(node, iid)
    node.shutdown()
    return iid


def assert_visible(node: Node, iid: str, problem: str) -> None:
    assert [v.instance_id for v in node.list()] == [iid]
    view = node.status(iid)
    assert problem in view.reason
    assert view.desired == "running"
    assert node.settled(iid)
    assert any(problem in r for r in refusals(node, iid))


#: A valid GGUF (version 3, no tensors, no metadata) followed by bytes to flip.
WEIGHTS = FAKE_GGUF + bytes(range(256))


@pytest.fixture
def fake_model(tmp_path: Path) -> Path:
    """Overrides conftest's: the registry refuses a GGUF header that does not parse."""
    return gguf_registry(tmp_path, WEIGHTS)


@pytest.fixture
def settings(nodes: NodeFactory, fake_llama: str, fake_model: Path) -> NodeSettings:
    return nodes.settings(fake_llama, fake_model)


def test_removed_model_is_listed_refuses_start_then_starts_once_restored(
    nodes: NodeFactory, settings: NodeSettings, fake_model: Path
) -> None:
    iid = placed_and_stopped(nodes, settings, fake_model)
    weights = fake_model / "tiny.gguf"
    kept = weights.read_bytes()
    weights.unlink()

    node = nodes.open(settings)
    assert_visible(node, iid, "tiny")
    recorded = refusals(node, iid)
    assert len(recorded) == 1
    with pytest.raises(InvalidState, match=r"cannot be started.*start it again"):
        node.start(iid)
    with pytest.raises(InvalidState, match="cannot be started"):
        node.restart(iid)
    assert refusals(node, iid) == recorded  # once per cause

    weights.write_bytes(kept)
    node.start(iid)  # no node restart needed
    running(node, iid)
    assert "cannot be started" not in node.status(iid).reason
    assert node.stop(iid).lifecycle == "stopped"


def test_changed_model_is_listed_and_stop_and_unload_work(
    nodes: NodeFactory, settings: NodeSettings, fake_model: Path
) -> None:
    iid = placed_and_stopped(nodes, settings, fake_model)
    weights = fake_model / "tiny.gguf"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, other digest
    weights.write_bytes(bytes(data))

    node = nodes.open(settings)
    assert_visible(node, iid, "digest mismatch")
    # Unbuilt (the digest checked when the adapter is built) or refused at launch:
    # either way a refused start naming the mismatch.
    with pytest.raises((InvalidState, AdmissionRefused), match="digest mismatch"):
        node.start(iid)
    assert node.stop(iid).lifecycle == "stopped"
    node.unload(iid)
    with pytest.raises(UnknownInstance):
        node.status(iid)
    assert kinds_of(node, iid)[-1] == "instance.unloaded"
    assert node.list() == []


def test_missing_launcher_is_listed_and_starts_once_installed(
    nodes: NodeFactory, tmp_path: Path, fake_model: Path
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    launcher = make_launcher(bin_dir, PROGRAMS / "fake_llama.py")
    settings = nodes.settings(launcher, fake_model)
    iid = placed_and_stopped(nodes, settings, fake_model)
    kept = tmp_path / "kept"
    shutil.move(launcher, kept)

    node = nodes.open(settings)
    assert_visible(node, iid, launcher)
    with pytest.raises(InvalidState, match="launcher program"):
        node.start(iid)
    assert len(refusals(node, iid)) == 1

    # Another node restart with the same problem records nothing new.
    node.shutdown()
    node = nodes.open(settings)
    assert_visible(node, iid, launcher)
    assert len(refusals(node, iid)) == 1

    shutil.move(kept, launcher)
    node.start(iid)
    running(node, iid)
    assert node.stop(iid).lifecycle == "stopped"


def test_placement_outcomes_applied_unchanged_ignored(
    nodes: NodeFactory, settings: NodeSettings, fake_model: Path
) -> None:
    node = nodes.open(settings)
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    s = spec(free_port())
    first = node.place_outcome(s, placed_by="ctl", generation=2)
    iid = first.instance_id
    assert first.outcome is PlacementOutcome.APPLIED
    assert node.place_outcome(s, placed_by="ctl", generation=2).outcome is (
        PlacementOutcome.UNCHANGED
    )
    with pytest.raises(InvalidState, match="already loaded"):
        node.place(s, placed_by="ctl", generation=2)
    newer = node.place_outcome(s, placed_by="ctl", generation=3)
    assert (newer.outcome, newer.generation) == (PlacementOutcome.APPLIED, 3)
    stale = node.place_outcome(s, placed_by="ctl", generation=1)
    assert (stale.outcome, stale.generation) == (PlacementOutcome.IGNORED, 3)
    assert kinds_of(node, iid) == [
        "instance.placed",
        "instance.replaced",
        "instance.placement_ignored",
    ]
    assert node.status(iid).generation == 3


def test_changed_spec_with_newer_generation_is_refused_naming_the_keys(
    nodes: NodeFactory, settings: NodeSettings, fake_model: Path
) -> None:
    node = nodes.open(settings)
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    port = free_port()
    iid = node.place(spec(port), placed_by="ctl", generation=1)
    before = kinds_of(node, iid)
    bigger = spec(port, ctx_size=1024)
    with pytest.raises(InvalidState, match=r"ctx_size differ.*unload it first"):
        node.place_outcome(bigger, placed_by="ctl", generation=2)
    with pytest.raises(InvalidState, match="ctx_size"):
        node.place_outcome(bigger, placed_by="ctl", generation=1)
    assert kinds_of(node, iid) == before  # nothing recorded
    stale = node.place_outcome(bigger, placed_by="ctl", generation=0)
    assert stale.outcome is PlacementOutcome.IGNORED

    node.unload(iid)
    replaced = node.place_outcome(bigger, placed_by="ctl", generation=2)
    assert (replaced.instance_id, replaced.outcome) == (iid, PlacementOutcome.APPLIED)
    assert node.rebuild().instances[iid].spec["ctx_size"] == 1024
