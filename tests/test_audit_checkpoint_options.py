"""``audit``, ``replay``, ``timeline`` and ``events`` take ``chain verify``'s trust
options (``--checkpoint FILE --key PUBKEY``, ``--witness``, ``--quorum``), declared
once (tools/audit/trust_options.py), so README's "the same checks and the same
options" holds.

A newcomer's trial (stop 32): ``audit DB --checkpoint cp.txt --key node.pub``
failed "No such option" while audit's own warning asked for them, and a chain
whose tail and stored checkpoints were deleted audited clean. Here a chain with no
stored checkpoint is truncated after a checkpoint saved off the node: each command
refuses it with the checkpoint (naming the truncation, as ``chain verify`` does)
and reads it as before without one; the intact chain passes with it.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import NamedTuple

import click
import pytest
from chain_tamper import make_chain, truncate
from test_cli_paths import Ran, run
from varied_chain import varied_events

from infervisor.chain import SqliteChain
from infervisor.chain.checkpoint import load_or_create_signer
from infervisor.chain.checkpoint_store import Checkpointer
from infervisor.tools.cli import cli as main_cli

EVENTS = 60
KEEP = 55
NOW = 1_793_491_200_000_000_000


class Held(NamedTuple):
    db: Path
    pub: Path
    checkpoint: Path
    instance: str


@pytest.fixture
def held(tmp_path: Path) -> Held:
    """A chain of varied events, its key, a checkpoint of all of it saved outside the
    node (then deleted from the chain, triggers put back), and an instance its first
    KEEP events name."""
    folder = tmp_path / "node"
    folder.mkdir()
    db = folder / "chain.db"
    signer = load_or_create_signer(folder, "varied")
    with SqliteChain.open(db, "varied", now_ns=lambda: NOW) as chain:
        cp = Checkpointer(db, "varied", signer, every_events=10**6, every_s=1e9, now_ns=lambda: NOW)
        # No clean stop: one with no checkpoint after it shows the deletion by itself.
        drafts = [d for d in varied_events(EVENTS * 2) if d.kind != "node.stopped"]
        cp.observe(chain.append_many(drafts[: EVENTS - 1]))
        cp.close()
    checkpoint = tmp_path / "held.checkpoint"
    made = run("chain", "checkpoint", db, "--out", checkpoint)
    assert made.code == 0, made
    _delete_checkpoints(db)
    with SqliteChain.open_readonly(db) as chain:
        subjects = [e.subject for e in chain.events() if e.subject and e.seq < KEEP]
    return Held(db, folder / "node.pub", checkpoint, subjects[-1])


def _delete_checkpoints(db: Path) -> None:
    """Delete the stored checkpoints, their append-only triggers dropped and then put
    back as they were (so that only a checkpoint held elsewhere shows a truncation)."""
    conn = sqlite3.connect(db, isolation_level=None)
    saved = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'checkpoints'"
    ).fetchall()
    for name, _ in saved:
        conn.execute(f"DROP TRIGGER {name}")
    conn.execute("DELETE FROM checkpoints")
    for _, sql in saved:
        conn.execute(sql)
    conn.close()


COMMANDS: dict[str, tuple[str, ...]] = {
    "audit": ("audit",),
    "replay": ("replay",),
    "timeline": ("timeline",),
    "events": ("events",),
}


def _run(h: Held, name: str, *extra: object) -> Ran:
    tail = (h.instance,) if name == "timeline" else ()
    return run(*COMMANDS[name], h.db, *tail, *extra)


def _with_checkpoint(h: Held, name: str, *extra: object) -> Ran:
    return _run(h, name, "--checkpoint", h.checkpoint, "--key", h.pub, *extra)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_chain_truncated_after_a_held_checkpoint_is_refused_with_it(
    held: Held, name: str
) -> None:
    without = _run(held, name)  # baseline before the tamper: how the command reads it
    truncate(held.db, KEEP)
    assert run("chain", "verify", held.db).code == 0  # the rows alone check out
    verify = run("chain", "verify", held.db, "--checkpoint", held.checkpoint, "--key", held.pub)
    assert verify.code == 1, verify  # the held checkpoint shows the truncation
    assert f"INVALID against checkpoint at seq {KEEP}: truncated" in verify.stdout
    after = _run(held, name)
    assert after.code == without.code, after  # accepted as before without the checkpoint
    assert "INVALID" not in after.stdout + after.stderr
    ran = _with_checkpoint(held, name)
    assert ran.code == 1, ran
    said = ran.stdout + ran.stderr
    assert f"at seq {KEEP}: truncated" in said, said
    assert not any(line.startswith("anchored:") for line in said.splitlines())


@pytest.mark.parametrize("name", list(COMMANDS))
def test_an_intact_chain_passes_with_the_held_checkpoint(held: Held, name: str) -> None:
    without = _run(held, name)
    ran = _with_checkpoint(held, name)
    assert ran.code == without.code, ran
    assert ran.stdout == without.stdout
    assert "INVALID" not in ran.stdout + ran.stderr
    assert f"anchored: checkpoint {held.checkpoint.name} at size {EVENTS}" in ran.stderr


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_checkpoint_without_a_key_is_a_usage_error(held: Held, name: str) -> None:
    ran = _run(held, name, "--checkpoint", held.checkpoint)
    assert ran.code == 2, ran
    assert "--checkpoint needs --key PUBKEY" in ran.stderr


def test_audit_json_names_the_truncation(held: Held) -> None:
    truncate(held.db, KEEP)
    ran = _with_checkpoint(held, "audit", "--json")
    assert ran.code == 1, ran
    doc = json.loads(ran.stdout)
    assert (doc["ok"], doc["trust"]["reason"], doc["trust"]["seq"]) == (False, "truncated", KEEP)


def test_every_reader_declares_the_same_trust_options() -> None:
    """One declaration: each command's --help lists the options chain verify has."""
    wanted = {"--checkpoint", "--key", "--witness", "--quorum"}
    groups = {"verify": ("chain", "verify"), **COMMANDS}
    for name, path in groups.items():
        command: click.Command | None = main_cli
        for part in path:
            assert isinstance(command, click.Group)
            command = command.get_command(click.Context(command), part)
        assert command is not None, name
        opts = {o for p in command.params for o in getattr(p, "opts", ())}
        assert wanted <= opts, (name, wanted - opts)


def test_audit_says_the_rows_check_out_when_only_the_checkpoints_fail(tmp_path: Path) -> None:
    """The tail and the checkpoints deleted, the checkpoints' delete trigger dropped:
    chain verify fails it at seq 0 (triggers changed) and says every row checks out;
    audit read "the chain does not verify from seq 0 on" (stop 32's trial)."""
    db = make_chain(tmp_path / "node", 20, every=4)
    truncate(db, 15)
    conn = sqlite3.connect(db, isolation_level=None)
    for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'checkpoints'"
    ).fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    conn.execute("DELETE FROM checkpoints")
    conn.close()
    verify = run("chain", "verify", db)
    assert verify.code == 1, verify
    assert "every row's hash and link check out" in verify.stdout
    ran = run("audit", db)
    assert ran.code == 1, ran
    assert "does not verify from seq 0" not in ran.stdout
    assert (
        "none made: the chain fails against its checkpoints from seq 0 on, though every "
        "row's hash and link check out (the file holds 15 events)"
    ) in ran.stdout


@pytest.mark.parametrize("delete_stored", [True, False], ids=["stored deleted", "stored kept"])
def test_a_truncation_below_the_held_checkpoint_is_named_beside_changed_triggers(
    tmp_path: Path, delete_stored: bool
) -> None:
    """The tail truncated below a checkpoint held off the node, and the checkpoints'
    delete trigger dropped: chain verify and audit named only "checkpoint triggers
    changed" (a newcomer's trial, stop 33); they name the truncation against the
    held checkpoint too (its size against the chain's), as with the triggers intact."""
    db = make_chain(tmp_path / "node", 20, every=4)
    held = tmp_path / "held.checkpoint"
    assert run("chain", "checkpoint", db, "--out", held).code == 0
    truncate(db, 15)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("DROP TRIGGER checkpoints_append_only_delete")
    if delete_stored:
        conn.execute("DELETE FROM checkpoints")
    conn.close()
    pub = db.parent / "node.pub"
    truncation = (
        f"against checkpoint {held.name} (tree size 20): truncated at seq 15: the chain "
        "has 15 events but the checkpoint signed 20"
    )
    verify = run("chain", "verify", db, "--checkpoint", held, "--key", pub)
    assert verify.code == 1, verify
    assert "checkpoint triggers changed" in verify.stdout
    assert truncation in verify.stdout, verify.stdout
    as_json = run("chain", "verify", db, "--checkpoint", held, "--key", pub, "--json")
    assert truncation in json.loads(as_json.stdout)["checkpoint"]["detail"]
    audit = run("audit", db, "--checkpoint", held, "--key", pub, "--json")
    assert audit.code == 1, audit
    assert truncation in json.loads(audit.stdout)["trust"]["detail"]
    without = run("chain", "verify", db)  # no held checkpoint: nothing to name beside
    assert "checkpoint triggers changed" in without.stdout
    assert "against checkpoint" not in without.stdout.split("INVALID against checkpoint")[1]
