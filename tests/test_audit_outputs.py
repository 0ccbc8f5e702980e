"""The auditor's commands answer what the reference reducer and verifier answer, on a
chain of every event kind (issue 22, item 3: faster, "with their outputs unchanged").

``replay`` folds through the chain scan's fast path (``Folder``, one pass with
verification); the reference is ``replay.apply``, one new ``NodeState`` per event.
Both must print the same bytes, whole and cut short by ``--until``; ``chain
verify --json`` must carry ``verify_chain``'s report. The chain is drawn by
tests/varied_chain.py, and the test fails if an event kind is missing from it.
"""

from __future__ import annotations

import collections
from pathlib import Path

import msgspec
import pytest
from support import cli_here
from varied_chain import write_varied_chain

from infervisor.chain import SqliteChain, StoredEvent, verify_chain
from infervisor.replay import Folder, apply
from infervisor.replay import events as ev
from infervisor.replay.state import NodeState


@pytest.fixture(scope="module")
def varied(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[StoredEvent]]:
    db = tmp_path_factory.mktemp("varied") / "chain.db"
    write_varied_chain(db, 1200)
    with SqliteChain.open_readonly(db) as chain:
        return db, list(chain.events())


def reference(stored: list[StoredEvent], node: str) -> NodeState:
    """The node state by `apply`, one event at a time (the reference reducer)."""
    state = Folder(node).state()
    for one in stored:
        state = apply(state, one)
    return state


def as_cli_json(obj: object) -> str:
    return msgspec.json.format(msgspec.json.encode(obj), indent=2).decode() + "\n"


def test_the_chain_holds_every_event_kind(varied: tuple[Path, list[StoredEvent]]) -> None:
    _, stored = varied
    seen = collections.Counter(e.kind for e in stored[1:])
    missing = sorted(set(ev.EVENT_TYPES) - set(seen))
    assert missing == [], f"the varied chain never reached {missing}"


@pytest.mark.parametrize("until", [None, 1, 400, 999])
def test_replay_json_is_the_reference_fold(
    varied: tuple[Path, list[StoredEvent]], until: int | None
) -> None:
    db, stored = varied
    cut = stored if until is None else stored[: until + 1]
    args = ["replay", db, "--json"] + ([] if until is None else ["--until", str(until)])
    done = cli_here(*args)
    assert done.returncode == 0, done.stderr
    assert done.stdout == as_cli_json(reference(cut, "varied"))


def test_replay_until_beyond_the_head_is_refused_naming_it(
    varied: tuple[Path, list[StoredEvent]],
) -> None:
    """Stop 34's trial: ``--until`` beyond the head printed the head's state, exit 0."""
    db, stored = varied
    head = stored[-1].seq
    assert cli_here("replay", db, "--until", str(head)).returncode == 0
    done = cli_here("replay", db, "--until", str(head + 1), "--json")
    assert done.returncode == 1, done.stderr
    assert f"--until {head + 1} is beyond the chain's head (seq {head} in {db})" in done.stderr
    error = msgspec.json.decode(done.stdout)["error"]
    assert (error["code"], error["field"]) == ("beyond_head", "--until")


def test_replay_text_names_each_instance_as_the_reference(
    varied: tuple[Path, list[StoredEvent]],
) -> None:
    db, stored = varied
    state = reference(stored, "varied")
    done = cli_here("replay", db)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == (
        f"node varied: head seq {state.head_seq}, {state.boots} boots, "
        f"{len(state.instances)} instances"
    )
    assert [line.split()[:2] for line in lines[1:]] == [
        [iid, inst.lifecycle.value] for iid, inst in sorted(state.instances.items())
    ]


def test_chain_verify_json_carries_the_verifiers_report(
    varied: tuple[Path, list[StoredEvent]],
) -> None:
    db, stored = varied
    done = cli_here("chain", "verify", db, "--json")
    assert done.returncode == 0, done.stderr
    answer = msgspec.json.decode(done.stdout)
    report = msgspec.to_builtins(verify_chain(db))
    assert {k: answer[k] for k in report} == report
    assert answer["events"] == len(stored)
