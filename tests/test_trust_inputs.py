"""What an auditor hands the readers: a checkpoint of another log, an edited
checkpoint, a witness key in a file (a newcomer's trial, stop 33)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import chain_tamper
import pytest
from chain_tamper import make_chain
from test_chain_trust import NODE, WITNESS, _draft, cli, cosign_all, grow

from infervisor.chain import SqliteChain


def _saved(db: Path, out: Path) -> Path:
    ran = cli("chain", "checkpoint", str(db), "--out", str(out))
    assert ran.code == 0, ran
    return out


def _error(ran_out: str) -> dict[str, str]:
    return json.loads(ran_out)["error"]


@pytest.mark.parametrize("other_node", ["node-c", chain_tamper.NODE])
def test_a_checkpoint_and_key_of_another_log_say_so_and_blame_no_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other_node: str
) -> None:
    ours = make_chain(tmp_path / "a", 70, every=64)
    monkeypatch.setattr(chain_tamper, "NODE", other_node)
    theirs = make_chain(tmp_path / "c", 70, every=64)  # its own node.key: another origin
    cp = _saved(theirs, tmp_path / "c.ckpt")
    key = str(theirs.parent / "node.pub")
    for where in (ours, ours.parent):
        ran = cli("chain", "verify", str(where), "--checkpoint", str(cp), "--key", key)
        assert ran.code == 1, ran  # the chain is not vouched for: a verdict, not usage
        assert "INVALID" not in ran.out and "does not verify" not in ran.err
        origin = cp.read_text().split("\n", 1)[0]
        assert f"the checkpoint's origin is {origin}" in ran.err
        assert "this chain is node node-a's" in ran.err
        assert "the checkpoint and key are another log's" in ran.err
    as_json = cli("chain", "verify", str(ours), "--checkpoint", str(cp), "--key", key, "--json")
    assert (as_json.code, _error(as_json.out)["code"]) == (1, "checkpoint_invalid")
    for reader in (["audit"],):  # every reader shares external_checkpoint
        ran = cli(*reader, str(ours), "--checkpoint", str(cp), "--key", key)
        assert ran.code == 1 and "another log's" in ran.err, (reader, ran)
    # its own checkpoint and key still verify, and the other chain against its own
    mine = _saved(ours, tmp_path / "a.ckpt")
    own_key = str(ours.parent / "node.pub")
    assert cli("chain", "verify", str(ours), "--checkpoint", str(mine), "--key", own_key).code == 0
    assert cli("chain", "verify", str(theirs), "--checkpoint", str(cp), "--key", key).code == 0


def _edit(cp: Path, out: Path, line: int, value: str) -> Path:
    lines = cp.read_text().split("\n")
    lines[line] = value
    out.write_text("\n".join(lines))
    return out


def test_an_edited_checkpoint_fails_verification_and_a_non_checkpoint_is_usage(
    tmp_path: Path,
) -> None:
    db = make_chain(tmp_path / "a", 70, every=64)
    key = str(db.parent / "node.pub")
    cp = _saved(db, tmp_path / "a.ckpt")
    bigger = _edit(cp, tmp_path / "size.ckpt", 1, "71")  # no longer tree size - 1 = head seq
    smaller = _edit(cp, tmp_path / "small.ckpt", 1, "10")
    root = _edit(cp, tmp_path / "root.ckpt", 2, "A" * 43 + "=")  # still a checkpoint's text
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("garbage\n")
    unsigned = tmp_path / "unsigned.txt"
    unsigned.write_text(cp.read_text().split("\n\n", 1)[0] + "\n")
    for edited in (bigger, smaller, root):
        ran = cli("chain", "verify", str(db), "--checkpoint", str(edited), "--key", key, "--json")
        assert ran.code == 1, (edited, ran)
        error = _error(ran.out)
        assert error["code"] == "checkpoint_invalid" and "does not verify" in error["message"]
    said = cli("chain", "verify", str(db), "--checkpoint", str(bigger), "--key", key).err
    assert "no longer reads as a checkpoint either" in said
    for wrong in (garbage, unsigned, db.parent / "node.pub"):
        ran = cli("chain", "verify", str(db), "--checkpoint", str(wrong), "--key", key, "--json")
        assert (ran.code, _error(ran.out)["code"]) == (2, "bad_value"), (wrong, ran)
    # without a key nothing says it was edited: its text is simply no checkpoint
    ran = cli("chain", "prove", str(db), "3", "--checkpoint", str(bigger), "--json")
    assert (ran.code, _error(ran.out)["code"]) == (2, "bad_value"), ran


def test_witness_takes_a_file_as_key_does(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    path = grow(folder, 20)
    cosign_all(path)
    vkey = tmp_path / "w1.vkey"
    vkey.write_text(WITNESS.key.key_string() + "\n")
    by_string = cli("chain", "verify", str(folder), "--witness", WITNESS.key.key_string())
    by_file = cli("chain", "verify", str(folder), "--witness", str(vkey))
    assert by_file.code == by_string.code == 0, by_file
    assert "anchored: 1 of 1 witnesses at size 20" in by_file.out
    assert by_file.out == by_string.out
    node_pub = folder / "node.pub"
    ran = cli("chain", "verify", str(folder), "--witness", str(node_pub))
    assert ran.code == 2 and f"--witness {node_pub}: witness key: " in ran.err, ran
    assert "not a witness's cosignature/v1 key" in ran.err
    missing = cli("chain", "verify", str(folder), "--witness", str(tmp_path / "nope.vkey"))
    assert missing.code == 2 and "no such file" in missing.err, missing


@pytest.mark.parametrize("command", ["verify", "audit", "replay", "events", "timeline"])
def test_a_quorum_beyond_the_witnesses_or_a_witness_twice_is_usage(
    tmp_path: Path, command: str
) -> None:
    """A second trial (stop 33): --quorum 2 with one --witness, or one key given
    twice, ended every reader in a traceback (exit 1, nothing on stdout with --json)."""
    folder = tmp_path / "data"
    grow(folder, 5)
    key = WITNESS.key.key_string()
    argv = ["chain", "verify"] if command == "verify" else [command]
    argv.append(str(folder))
    if command == "timeline":
        argv.append("x")
    quorum = cli(*argv, "--witness", key, "--quorum", "2")
    assert quorum.code == 2, quorum
    assert "--quorum: witness quorum must be 1 .. 1, found 2" in quorum.err, quorum
    if command != "events":  # events writes JSON lines (--jsonl), its errors as text
        as_json = cli(*argv, "--witness", key, "--quorum", "2", "--json")
        assert as_json.code == 2 and _error(as_json.out)["field"] == "--quorum", as_json
    twice = cli(*argv, "--witness", key, "--witness", key)
    assert twice.code == 2 and "--witness: witness " in twice.err, twice
    assert "named twice" in twice.err and "Traceback" not in twice.err


def test_a_tail_deleted_under_a_dropped_events_trigger_fails_every_reader(
    tmp_path: Path,
) -> None:
    """A second trial (stop 33): the events' delete trigger dropped and the tail no
    checkpoint covers yet deleted, chain verify, audit and status said "ok" (the
    node refuses to open that chain). The readers check the events table's
    triggers as the node does."""
    folder = tmp_path / "data"
    path = grow(folder, 20)
    with SqliteChain.open(path, NODE) as chain:
        chain.append_many([_draft(21), _draft(22)])
    conn = sqlite3.connect(path)
    conn.execute("DROP TRIGGER events_append_only_delete")
    conn.execute("DELETE FROM events WHERE seq = (SELECT max(seq) FROM events)")
    conn.commit()
    conn.close()
    for argv in (["chain", "verify"], ["audit"], ["status"], ["replay"]):
        ran = cli(*argv, str(folder))
        assert ran.code == 1, (argv, ran)
        said = ran.out + ran.err
        assert "event triggers changed" in said or "events table's append-only" in said, ran


def test_a_key_file_may_hold_comments_but_one_key(tmp_path: Path) -> None:
    """A second trial (stop 33): a --witness file holding the key twice, a comment
    line, or nothing, read as one key string ('Only base64 data is allowed',
    "key name '# comment\\n...'", 'found 1 parts')."""
    folder = tmp_path / "data"
    cosign_all(grow(folder, 10))  # an unmet --witness quorum is a finding (stop 34)
    key = WITNESS.key.key_string()
    commented = tmp_path / "commented.vkey"
    commented.write_text(f"# the witness of our auditors\n\n{key}\n")
    ran = cli("chain", "verify", str(folder), "--witness", str(commented))
    assert ran.code == 0, ran
    for name, text, found in (("empty", "", "no key"), ("twice", f"{key}\n{key}\n", "2 keys")):
        vkey = tmp_path / f"{name}.vkey"
        vkey.write_text(text)
        ran = cli("chain", "verify", str(folder), "--witness", str(vkey))
        assert ran.code == 2, ran
        assert f"holds {found}: a key file holds one key string on one line" in ran.err, ran


def test_a_private_key_where_a_public_one_goes_is_refused_naming_it(tmp_path: Path) -> None:
    """Stop 34's trial: a node config's [[witnesses]] vkey (and a witness config's
    log vkey) given a PRIVATE key read "bad key id ... fromhex()"; it says what it
    is and what to give instead."""
    from infervisor.chain.cosignature import Cosigner
    from infervisor.chain.note import Signer
    from infervisor.tools.node.witness_config import (
        ConfigError,
        WitnessEntry,
        check_witnesses,
    )

    secret = Cosigner.generate("witness.example/w9").key_string()
    with pytest.raises(ConfigError) as caught:
        check_witnesses(
            [WitnessEntry(url="http://127.0.0.1:1", vkey=secret)], None, tmp_path / "n.toml"
        )
    said = str(caught.value)
    assert "[[witnesses]] #1 vkey: witness key: this is a PRIVATE signing key" in said, said
    assert "infervisor witness vkey CONFIG" in said and secret not in said
    node_secret = Signer.generate("n").key_string()
    ran = cli("chain", "verify", str(tmp_path), "--witness", secret)
    assert ran.code == 2 and "PRIVATE signing key" in ran.err, ran
    assert node_secret not in ran.err
