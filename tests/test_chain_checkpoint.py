"""Signed checkpoints: the C2SP formats, the store, and verification against a saved one."""

from __future__ import annotations

import base64
import hashlib
import json
import sqlite3
from pathlib import Path
from typing import NamedTuple

import independent_note
import independent_rfc6962 as ref
import pytest
from chain_tamper import NODE, alter_payload, make_chain, rewrite_from, truncate
from click.testing import CliRunner

from infervisor.chain import verify_chain
from infervisor.chain.boot import check_node_chain
from infervisor.chain.checkpoint import (
    Checkpoint,
    compare,
    load_or_create_signer,
    load_verifier,
    parse_checkpoint_text,
    read_checkpoint,
)
from infervisor.chain.checkpoint_store import read_stored
from infervisor.chain.errors import CheckpointError, NoteError
from infervisor.chain.keys import KEY_ROTATED_KIND, check_rotation, rotate_key
from infervisor.chain.note import (
    Signer,
    key_id,
    open_note,
    parse_signer_key,
    parse_verifier_key,
    sign_note,
)
from infervisor.replay import decode_event, reason_of
from infervisor.replay.events import KeyRotated
from infervisor.tools.cli import cli as main_cli


class Ran(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def cli(*args: str) -> Ran:
    """Run the CLI in process (click's CliRunner): exit status, stdout, stderr."""
    result = CliRunner().invoke(main_cli, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Ran(result.exit_code, result.stdout, result.stderr)


def hashes_of(path: Path) -> list[bytes]:
    with sqlite3.connect(path) as conn:
        return [bytes(h) for (h,) in conn.execute("SELECT hash FROM events ORDER BY seq")]


# ---------------------------------------------------------------- signed notes
def test_note_format_and_independent_verifier() -> None:
    signer = Signer.generate("example.com/log")
    note = sign_note("hello\nworld\n", signer)
    text, sig_block = note.split("\n\n")
    assert text == "hello\nworld"
    line = sig_block.rstrip("\n")
    assert line.startswith("\u2014 example.com/log ")
    raw = base64.b64decode(line.split(" ")[2])
    public = signer.verifier.public
    assert raw[:4] == hashlib.sha256(b"example.com/log\n\x01" + public).digest()[:4]
    assert raw[:4] == key_id("example.com/log", public)
    assert len(raw) == 4 + 64
    vkey = signer.verifier.key_string()
    assert vkey.split("+")[1] == raw[:4].hex()
    assert independent_note.verify_note(note.encode(), vkey) == "hello\nworld\n"
    assert open_note(note, [parse_verifier_key(vkey)]) == "hello\nworld\n"
    assert parse_signer_key(signer.key_string()).verifier == signer.verifier


def test_note_tampered_or_unknown_key_refused() -> None:
    signer, other = Signer.generate("a.example/k"), Signer.generate("a.example/k")
    note = sign_note("text\n", signer)
    forged = note.replace("text", "texT", 1)
    with pytest.raises(independent_note.NoteInvalid):
        independent_note.verify_note(forged.encode(), signer.verifier.key_string())
    with pytest.raises(NoteError):
        open_note(forged, [signer.verifier])
    with pytest.raises(NoteError, match="no signature of a known key"):
        open_note(note, [other.verifier])
    # an unknown key's extra signature is ignored by both
    both = sign_note("text\n", other, signer)
    assert open_note(both, [signer.verifier]) == "text\n"
    assert independent_note.verify_note(both.encode(), signer.verifier.key_string()) == "text\n"


# ---------------------------------------------------------------- checkpoints
def test_checkpoint_body_is_tlog_checkpoint(tmp_path: Path) -> None:
    path = make_chain(tmp_path / "a", 10, every=4)
    stored = read_stored(path)
    assert [c.tree_size for c in stored] == [4, 8, 10]  # every 4 events, then at close
    verifier = load_verifier(tmp_path / "a" / "node.pub")
    hashes = hashes_of(path)
    for row in stored:
        text = independent_note.verify_note(row.note.encode(), verifier.key_string())
        origin, size, root, ext, end = text.split("\n")
        assert (origin, int(size), end) == (verifier.name, row.tree_size, "")
        assert origin.startswith(f"infervisor/{NODE}/")  # the default origin: id and key digest
        assert base64.b64decode(root) == ref.mth(hashes[: row.tree_size])
        assert ext == f"infervisor-chain-head {row.tree_size - 1} {hashes[row.tree_size - 1].hex()}"
        cp = read_checkpoint(row.note, verifier)
        assert compare(hashes, cp) is None
    key_file = tmp_path / "a" / "node.key"
    assert key_file.stat().st_mode & 0o777 == 0o600


def test_checkpoint_text_rejects_malformed() -> None:
    root = base64.b64encode(bytes(32)).decode()
    good = f"infervisor/n\n3\n{root}\ninfervisor-chain-head 2 {'0' * 64}\n"
    assert parse_checkpoint_text(good)[1] == 3
    for bad in (
        good.replace("\n3\n", "\n03\n"),
        good.replace("head 2", "head 1"),
        good.replace("infervisor/n", "other n"),  # an origin is a key name: no space
        good[:-1],
    ):
        with pytest.raises(CheckpointError):
            parse_checkpoint_text(bad)


def test_checkpoints_table_is_append_only(tmp_path: Path) -> None:
    path = make_chain(tmp_path / "a", 6, every=2)
    with sqlite3.connect(path) as conn:
        for sql in ("UPDATE checkpoints SET note = 'x'", "DELETE FROM checkpoints"):
            with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                conn.execute(sql)
        with pytest.raises(sqlite3.IntegrityError, match="more events"):
            conn.execute("INSERT INTO checkpoints VALUES (1, 0, 'x')")


def test_key_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    load_or_create_signer(tmp_path, NODE)
    (tmp_path / "node.key").chmod(0o644)
    with pytest.raises(CheckpointError, match="chmod 600"):
        load_or_create_signer(tmp_path, NODE)


def test_a_rewrite_under_a_stored_checkpoint_is_invalid_without_the_node_key(
    tmp_path: Path,
) -> None:
    # a newcomer's trial: a `chain backup` file, one payload edited and every later row
    # rehashed, read "ok" (exit 0) without node.pub beside it, though its stored
    # checkpoint's root disagrees with the chain: comparing roots needs no key
    path = make_chain(tmp_path / "a", 12, every=4)
    rewrite_from(path, 2)
    (tmp_path / "a" / "node.pub").rename(tmp_path / "node.pub")  # no key beside it
    alone = cli("chain", "verify", str(path))
    assert alone.returncode == 1, alone.stdout
    assert alone.stdout.startswith("INVALID")
    assert "no node key known" in alone.stdout and "give the node's key" in alone.stdout
    assert not any(line.startswith(("ok", "anchored")) for line in alone.stdout.splitlines())
    doc = json.loads(cli("chain", "verify", str(path), "--json").stdout)
    assert doc["ok"] is False


# ---------------------------------------------------------------- against a saved checkpoint
def saved_checkpoint(tmp_path: Path, path: Path) -> Path:
    out = tmp_path / "saved.checkpoint"
    result = cli("chain", "checkpoint", str(path), "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out


def verify_against(path: Path, saved: Path, key: Path) -> tuple[int, dict[str, object]]:
    result = cli(
        "chain", "verify", str(path), "--checkpoint", str(saved), "--key", str(key), "--json"
    )
    return result.returncode, json.loads(result.stdout)


def test_truncation_detected_and_named(tmp_path: Path) -> None:
    path = make_chain(tmp_path / "a", 12, every=4)
    saved = saved_checkpoint(tmp_path, path)
    truncate(path, 9)
    plain = cli("chain", "verify", str(path))
    assert plain.returncode == 1  # its own stored checkpoint (signed, node.pub beside) ...
    assert "truncated" in plain.stdout and "own latest checkpoint" in plain.stdout
    assert "cannot be ruled out" in plain.stderr  # ... does not rule out a whole rewrite
    (tmp_path / "a" / "node.pub").rename(tmp_path / "node.pub")  # no key beside it
    alone = cli("chain", "verify", str(path))
    # Unsigned as far as the reader knows, a stored checkpoint still tells a size,
    # and one beyond the chain's end shows events gone (or a checkpoint not the
    # node's): comparing sizes needs no key.
    assert alone.returncode == 1
    assert "truncated" in alone.stdout and "no node key known" in alone.stdout
    (tmp_path / "node.pub").rename(tmp_path / "a" / "node.pub")
    status, doc = verify_against(path, saved, tmp_path / "a" / "node.pub")
    assert status == 1
    assert doc["checkpoint"]["reason"] == "truncated"  # type: ignore[index]
    assert doc["checkpoint"]["seq"] == 9  # type: ignore[index]
    assert doc["warning"] is None


def test_rewrite_detected_and_localised(tmp_path: Path) -> None:
    path = make_chain(tmp_path / "a", 12, every=4)
    saved = saved_checkpoint(tmp_path, path)
    rewrite_from(path, 6)
    assert cli("chain", "verify", str(path)).returncode == 1  # against its own checkpoint
    status, doc = verify_against(path, saved, tmp_path / "a" / "node.pub")
    assert status == 1
    cp = doc["checkpoint"]
    assert cp["reason"] == "rewritten"  # type: ignore[index]
    assert cp["seq"] == 4  # type: ignore[index]  # the stored checkpoint of size 4 still matches
    assert cp["last_seq"] == 7  # type: ignore[index]  # and the one of size 8 does not
    text = cli(
        "chain",
        "verify",
        str(path),
        "--checkpoint",
        str(saved),
        "--key",
        str(tmp_path / "a" / "node.pub"),
    )
    assert "INVALID against checkpoint in seq 4..7: rewritten" in text.stdout


def test_fork_detected(tmp_path: Path) -> None:
    original = make_chain(tmp_path / "a", 10, every=100)
    saved = saved_checkpoint(tmp_path, original)
    forked = make_chain(tmp_path / "b", 14, every=100, fork_at=7)
    key = tmp_path / "a" / "node.pub"
    status, doc = verify_against(forked, saved, key)
    assert status == 1
    # b's own checkpoints are signed by another key: a failure, never skipped (issue
    # 18); its origin is not the saved checkpoint's, which is said as such (stop 33)
    error = doc["error"]
    assert error["code"] == "checkpoint_invalid"  # type: ignore[index]
    assert "this chain was made again under another key" in error["message"]  # type: ignore[index]
    # and an honest extension of the original is fine
    assert (
        compare(hashes_of(original), read_checkpoint(saved.read_text(), load_verifier(key))) is None
    )


def test_valid_without_checkpoint_warns_in_json_and_stderr(tmp_path: Path) -> None:
    path = make_chain(tmp_path / "a", 5)
    own = json.loads(cli("chain", "verify", str(path), "--json").stdout)
    assert own["ok"] is True and own["checkpoint"]["ok"] is True  # its own, signed
    assert "own latest checkpoint" in own["checkpoint"]["detail"]
    assert "cannot be ruled out" in own["warning"]
    (tmp_path / "a" / "node.pub").unlink()  # no key: the stored checkpoints go unchecked
    result = cli("chain", "verify", str(path), "--json")
    assert result.returncode == 0
    doc = json.loads(result.stdout)
    assert doc["ok"] is True and doc["checkpoint"] is None
    assert "cannot be ruled out" in doc["warning"]
    assert "--checkpoint FILE --key PUBKEY" in doc["warning"]
    assert "--checkpoint FILE --key PUBKEY" in result.stderr


def test_valid_against_checkpoint(tmp_path: Path) -> None:
    path = make_chain(tmp_path / "a", 9, every=4)
    saved = saved_checkpoint(tmp_path, path)
    status, doc = verify_against(path, saved, tmp_path / "a" / "node.pub")
    assert status == 0, doc
    assert doc["checkpoint"]["ok"] is True  # type: ignore[index]
    assert doc["warning"] is None


def test_checkpoint_with_wrong_key_is_refused(tmp_path: Path) -> None:
    path = make_chain(tmp_path / "a", 5)
    make_chain(tmp_path / "b", 3)
    saved = saved_checkpoint(tmp_path, path)
    result = cli(
        "chain",
        "verify",
        str(path),
        "--checkpoint",
        str(saved),
        "--key",
        str(tmp_path / "b" / "node.pub"),
        "--json",
    )
    assert result.returncode == 1
    assert json.loads(result.stdout)["error"]["code"] == "checkpoint_invalid"


def test_checkpoint_needs_key(tmp_path: Path) -> None:
    path = make_chain(tmp_path / "a", 5)
    saved = saved_checkpoint(tmp_path, path)
    result = cli("chain", "verify", str(path), "--checkpoint", str(saved), "--json")
    assert result.returncode == 2
    assert json.loads(result.stdout)["error"]["field"] == "--key"


# ---------------------------------------------------------------- proofs through the CLI
def test_prove_and_consistency_checked_independently(tmp_path: Path) -> None:
    path = make_chain(tmp_path / "a", 11, every=4)
    key = tmp_path / "a" / "node.pub"
    stored = read_stored(path)
    old, new = tmp_path / "old.txt", tmp_path / "new.txt"
    old.write_text(stored[0].note)
    new.write_text(stored[-1].note)
    hashes = hashes_of(path)
    for seq in range(11):
        result = cli("chain", "prove", str(path), str(seq), "--checkpoint", str(new), "--json")
        assert result.returncode == 0, result.stderr
        proof = json.loads(result.stdout)
        assert proof["event_hash"] == hashes[seq].hex()
        path_b = [bytes.fromhex(h) for h in proof["path"]]
        assert ref.verify_inclusion(seq, 11, hashes[seq], path_b, ref.mth(hashes))
    proof_file = tmp_path / "proof.json"
    proof_file.write_text(result.stdout)
    checked = cli(
        "chain",
        "verify",
        str(path),
        "--checkpoint",
        str(new),
        "--key",
        str(key),
        "--proof",
        str(proof_file),
        "--json",
    )
    assert checked.returncode == 0, checked.stdout
    assert json.loads(checked.stdout)["proof"]["ok"] is True
    result = cli("chain", "consistency", str(path), str(old), str(new), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    items = [bytes.fromhex(h) for h in doc["proof"]]
    size = stored[0].tree_size
    assert ref.verify_consistency(size, 11, ref.mth(hashes[:size]), ref.mth(hashes), items)
    proof_file.write_text(result.stdout)
    checked = cli("chain", "verify", str(path), "--proof", str(proof_file), "--json")
    assert json.loads(checked.stdout)["proof"]["ok"] is True
    doc["proof"][0] = "00" * 32
    proof_file.write_text(json.dumps(doc))
    checked = cli("chain", "verify", str(path), "--proof", str(proof_file), "--json")
    assert checked.returncode == 1 and json.loads(checked.stdout)["proof"]["ok"] is False
    text = cli("chain", "prove", str(path), "3", "--checkpoint", str(new))
    assert "inclusion proof" in text.stdout and text.returncode == 0


def test_prove_refuses_a_seq_past_the_checkpoint(tmp_path: Path) -> None:
    path = make_chain(tmp_path / "a", 5, every=100)
    saved = saved_checkpoint(tmp_path, path)
    result = cli("chain", "prove", str(path), "5", "--checkpoint", str(saved), "--json")
    assert result.returncode == 2
    assert json.loads(result.stdout)["error"]["field"] == "SEQ"


def test_checkpoint_object_roundtrip(tmp_path: Path) -> None:
    path = make_chain(tmp_path / "a", 3)
    note = read_stored(path)[-1].note
    cp = read_checkpoint(note, load_verifier(tmp_path / "a" / "node.key"))
    assert isinstance(cp, Checkpoint) and cp.head_seq == 2
    assert cp.origin.startswith(f"infervisor/{NODE}/")


# ---------------------------------------------------------------- key rotation
def test_key_rotation_is_a_signed_event(tmp_path: Path) -> None:
    folder = tmp_path / "a"
    path = make_chain(folder, 6, every=100)
    old_key = (folder / "node.pub").read_text().strip()
    rotation = rotate_key(path, NODE, 1_793_491_300_000_000_000)
    assert rotation.event.kind == KEY_ROTATED_KIND and rotation.event.source == "node"
    doc = json.loads(rotation.event.payload)
    assert doc["old_key"] == old_key and doc["new_key"] == rotation.new.key_string()
    assert check_rotation(doc["note"], rotation.old) == rotation.new
    for vkey in (old_key, rotation.new.key_string()):  # signed by both keys
        independent_note.verify_note(doc["note"].encode(), vkey)
    assert verify_chain(path).ok
    stored = read_stored(path)
    assert stored[-1].tree_size == rotation.checkpoint_size == 7
    new = load_verifier(folder / "node.pub")
    assert new == rotation.new
    read_checkpoint(stored[-1].note, new)
    old = load_verifier(folder / f"node.pub.{rotation.old.key_id.hex()}")
    read_checkpoint(stored[0].note, old)
    with pytest.raises(CheckpointError):
        read_checkpoint(stored[0].note, new)
    assert (folder / "node.key").stat().st_mode & 0o777 == 0o600
    assert check_node_chain(path, NODE).checkpoint_size == 7
    # replay reads it as a node-level event (the test chain's other kinds are not)
    decoded = decode_event(rotation.event)
    assert isinstance(decoded, KeyRotated) and decoded.new_key == rotation.new.key_string()
    assert reason_of(decoded).startswith("checkpoint key rotated: ")


def test_rotate_key_through_the_cli_and_refused_while_a_node_runs(tmp_path: Path) -> None:
    import fcntl
    import os

    from click.testing import CliRunner

    from infervisor.tools.cli import cli

    folder = tmp_path / "a"
    path = make_chain(folder, 3, every=100)
    lock = os.open(folder / "run.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(lock, b"4242\n", 0)
        fcntl.flock(lock, fcntl.LOCK_EX)  # as infervisor run holds it
        refused = CliRunner().invoke(cli, ["chain", "rotate-key", str(path)])
        assert refused.exit_code == 1, refused.output
        assert "a node runs on" in refused.output and "pid 4242" in refused.output
    finally:
        os.close(lock)
    old_pub = (folder / "node.pub").read_text().strip()
    before = tmp_path / "before.txt"
    saved = CliRunner().invoke(cli, ["chain", "checkpoint", str(path), "--out", str(before)])
    assert saved.exit_code == 0, saved.output
    done = CliRunner().invoke(cli, ["chain", "rotate-key", str(path), "--json"])
    assert done.exit_code == 0, done.output
    doc = json.loads(done.output)
    assert doc["new_key"] == (folder / "node.pub").read_text().strip()
    # Checkpoints signed before and after the rotation check with either key: the
    # rotation event, signed by both, links them.
    for key in (str(folder / "node.pub"), old_pub):
        checked = CliRunner().invoke(
            cli, ["chain", "verify", str(path), "--checkpoint", str(before), "--key", key]
        )
        assert checked.exit_code == 0, checked.output
    bundle = tmp_path / "bundle"
    assert CliRunner().invoke(cli, ["chain", "export", str(path), str(bundle)]).exit_code == 0
    for extra in ([], ["--key", old_pub]):
        verified_bundle = CliRunner().invoke(cli, ["chain", "verify-bundle", str(bundle), *extra])
        assert verified_bundle.exit_code == 0, verified_bundle.output
    assert verify_chain(path).ok and read_stored(path)[-1].tree_size == doc["checkpoint_size"]


def test_the_documented_example_checkpoint() -> None:
    """docs/chain-format.md section 9's example, recomputed from its stated inputs."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from infervisor.chain.checkpoint import sign_checkpoint

    h0 = bytes.fromhex("43655f599aea9f05a3180c84747120b795ab2d06620d3e6793e4c150e30eee38")
    h1 = bytes.fromhex("56aa7abc0d27edd53f67ea943a22a2e388fb970f1ee8ff53f9a3d16c12f33f86")
    signer = Signer("infervisor/node-a", Ed25519PrivateKey.from_private_bytes(bytes(range(32))))
    cp = sign_checkpoint(signer, 2, ref.mth([h0, h1]), h1)
    doc = (Path(__file__).parents[1] / "docs" / "chain-format.md").read_text()
    assert f"```text\n{cp.note}```" in doc
    assert signer.verifier.key_string() in doc and signer.key_string() in doc
    assert independent_note.verify_note(cp.note.encode(), signer.verifier.key_string())


def test_checkpointer_signs_every_n_events_or_t_seconds(tmp_path: Path) -> None:
    from chain_tamper import draft

    from infervisor.chain import SqliteChain
    from infervisor.chain.checkpoint_store import Checkpointer

    now = [0.0]
    path = tmp_path / "chain.db"
    signer = load_or_create_signer(tmp_path, NODE)
    with SqliteChain.open(path, NODE) as chain:
        cp = Checkpointer(
            path, NODE, signer, every_events=5, every_s=10.0, monotonic=lambda: now[0]
        )
        written = [cp.observe(chain.append_many([draft(n)])) for n in range(1, 7)]
        assert [w.tree_size if w else None for w in written] == [None] * 3 + [5, None, None]
        now[0] = 10.5  # T seconds later: the next commit signs
        again = cp.observe(chain.append_many([draft(7)]))
        assert again is not None and again.tree_size == 8
        assert cp.observe([]) is None  # nothing new
        assert cp.close() is None  # the latest covers everything
    assert [c.tree_size for c in read_stored(path)] == [5, 8]


def test_no_proof_of_a_chain_that_does_not_verify_and_its_export_says_so(
    tmp_path: Path,
) -> None:
    path = make_chain(tmp_path / "a", 8, every=4)
    saved = saved_checkpoint(tmp_path, path)
    alter_payload(path, 3)
    key = str(tmp_path / "a" / "node.pub")
    proved = cli("chain", "prove", str(path), "3", "--checkpoint", str(saved), "--key", key)
    assert proved.returncode == 1
    assert "INVALID at seq 3: payload altered" in proved.stderr and proved.stdout == ""
    exported = cli("chain", "export", str(path), str(tmp_path / "bundle"))
    assert exported.returncode == 0  # kept as evidence, as stored ...
    assert "does not verify (INVALID at seq 3" in exported.stderr  # ... and said so
