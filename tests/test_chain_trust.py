"""One trust policy for every reader (issue 18, item 6): the attacks of the issue,
each run through every reader, with and without a witness policy; every reader
gives the same verdict, whether WHERE is a data dir, a config or the chain file."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import chain_tamper
import pytest
from chain_tamper import rewrite_from
from click.testing import CliRunner

from infervisor.chain import EventDraft, SqliteChain, encode_payload
from infervisor.chain.boot import check_node_chain
from infervisor.chain.checkpoint import default_origin, load_or_create_signer, sign_checkpoint
from infervisor.chain.checkpoint_store import Checkpointer, read_stored
from infervisor.chain.cosignature import Cosigner, WitnessPolicy
from infervisor.chain.cosignature_store import store
from infervisor.chain.errors import ChainTampered, CheckpointError
from infervisor.chain.merkle import CompactTree
from infervisor.chain.note import Signer, split_note
from infervisor.chain.trust import assess, node_key
from infervisor.replay import encode_event
from infervisor.replay import events as ev
from infervisor.tools.audit.trust_options import NOT_VOUCHED, config_witnesses
from infervisor.tools.cli import cli as main_cli

NODE = "node-t"
NOW = 1_793_491_200_000_000_000
WITNESS = Cosigner.generate("witness.example/w1")
INFERVISOR = Path(sys.executable).parent / "infervisor"


class Ran(NamedTuple):
    code: int
    out: str
    err: str


def cli(*args: str) -> Ran:
    result = CliRunner().invoke(main_cli, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Ran(result.exit_code, result.stdout, result.stderr)


def _draft(n: int, tag: str = "", stop: bool = False) -> EventDraft:
    event: ev.Event = (
        ev.NodeStopped(reason=f"stop {n}{tag}")
        if stop
        else ev.NodeStarted(pid=1000 + n, boot_id=f"boot-{n}{tag}", version="t")
    )
    kind = "node.stopped" if stop else "node.started"
    return EventDraft(
        ts_ns=NOW + n, source="node", kind=kind, subject="", payload=encode_event(event)
    )


def grow(
    folder: Path, upto: int, *, every: int = 5, tag: str = "", stop_at_end: bool = True
) -> Path:
    """Append node events to folder/chain.db until it holds `upto` events, checkpointed
    every `every` and at the end (the last event a clean stop, as a node's shutdown)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "chain.db"
    signer = load_or_create_signer(folder, NODE)
    with SqliteChain.open(path, NODE, now_ns=lambda: NOW) as chain:
        cp = Checkpointer(path, NODE, signer, every_events=every, every_s=1e9, now_ns=lambda: NOW)
        for n in range(chain.head().seq + 1, upto):
            last = stop_at_end and n == upto - 1
            cp.observe(chain.append_many([_draft(n, tag, stop=last)]))
        cp.close()
    return path


def cosign_all(path: Path, witness: Cosigner = WITNESS) -> None:
    """The witness cosigns every stored checkpoint; the node stores the cosignatures."""
    for row in read_stored(path):
        body = split_note(row.note)[0]
        store(path, row.tree_size, [witness.cosign(body, 1_800_000_000)])


def _raw(path: Path) -> sqlite3.Connection:
    """A connection with every trigger dropped (put back by _done): a root user's edit."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.row_factory = None
    saved = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger'").fetchall()
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'"):
        conn.execute(f"DROP TRIGGER {name}")
    conn.execute("CREATE TEMP TABLE saved_triggers (sql TEXT)")
    conn.executemany("INSERT INTO saved_triggers VALUES (?)", saved)
    return conn


def _done(conn: sqlite3.Connection) -> None:
    for (sql,) in conn.execute("SELECT sql FROM saved_triggers").fetchall():
        conn.execute(sql)
    conn.close()


def _resign_all(path: Path, signer: Signer) -> None:
    """Replace every stored checkpoint by one re-signed over the chain as it now is."""
    conn = _raw(path)
    hashes = [bytes(h) for (h,) in conn.execute("SELECT hash FROM events ORDER BY seq")]
    sizes = [s for (s,) in conn.execute("SELECT tree_size FROM checkpoints ORDER BY tree_size")]
    conn.execute("DELETE FROM checkpoints")
    conn.execute("DELETE FROM checkpoint_frontiers")
    for size in sizes:
        tree = CompactTree()
        for h in hashes[:size]:
            tree.append(h)
        cp = sign_checkpoint(signer, size, tree.root(), hashes[size - 1])
        conn.execute("INSERT INTO checkpoints VALUES (?, ?, ?)", (size, NOW, cp.note))
    _done(conn)


def _rehash_from(path: Path, seq: int) -> None:
    """Change the node.started event at `seq` (still a valid event) and re-hash it and
    every later row: the rows verify as a chain."""
    forged = encode_event(ev.NodeStarted(pid=1, boot_id="rewritten", version="t"))
    rewrite_from(path, seq, forged)


def attack_backup_restored(folder: Path) -> None:
    """An older backup restored: nothing in the file shows it (a witness asked live
    does, W2's boot check; or a checkpoint saved elsewhere)."""
    backup = folder.parent / "backup"
    shutil.copytree(folder, backup)
    grow(folder, 40)
    cosign_all(folder / "chain.db")
    shutil.rmtree(folder)
    shutil.copytree(backup, folder)


def attack_cut_and_newest_deleted(folder: Path) -> None:
    conn = _raw(folder / "chain.db")
    conn.execute("DELETE FROM events WHERE seq >= 17")
    conn.execute("DELETE FROM checkpoints WHERE tree_size > 15")
    conn.execute("DELETE FROM checkpoint_frontiers WHERE tree_size > 15")
    _done(conn)


def attack_all_checkpoints_deleted(folder: Path) -> None:
    conn = _raw(folder / "chain.db")
    conn.execute("DELETE FROM checkpoints")
    conn.execute("DELETE FROM checkpoint_frontiers")
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'cosignatures'").fetchone():
        conn.execute("DELETE FROM cosignatures")
    _done(conn)


def attack_rewrite_resigned(folder: Path) -> None:
    _rehash_from(folder / "chain.db", 7)
    _resign_all(folder / "chain.db", load_or_create_signer(folder, NODE))


def attack_fork_with_own_writer(folder: Path) -> None:
    conn = _raw(folder / "chain.db")
    conn.execute("DELETE FROM events WHERE seq >= 12")
    conn.execute("DELETE FROM checkpoints WHERE tree_size > 10")
    conn.execute("DELETE FROM checkpoint_frontiers WHERE tree_size > 10")
    _done(conn)
    grow(folder, 25, tag="-fork")


def attack_foreign_latest(folder: Path) -> None:
    conn = _raw(folder / "chain.db")
    size, note = conn.execute(
        "SELECT tree_size, note FROM checkpoints ORDER BY tree_size DESC LIMIT 1"
    ).fetchone()
    other = Signer.generate(split_note(note)[0].split("\n")[0])  # same name, another key
    hashes = [bytes(h) for (h,) in conn.execute("SELECT hash FROM events ORDER BY seq")]
    tree = CompactTree()
    for h in hashes[:size]:
        tree.append(h)
    forged = sign_checkpoint(other, size, tree.root(), hashes[size - 1]).note
    conn.execute("UPDATE checkpoints SET note = ? WHERE tree_size = ?", (forged, size))
    _done(conn)


def attack_bad_middle(folder: Path) -> None:
    conn = _raw(folder / "chain.db")
    (note,) = conn.execute("SELECT note FROM checkpoints WHERE tree_size = 10").fetchone()
    head, sig = note.rsplit(" ", 1)
    bad = head + " " + ("A" if sig[0] != "A" else "B") + sig[1:]
    conn.execute("UPDATE checkpoints SET note = ? WHERE tree_size = 10", (bad,))
    _done(conn)


# attack -> (reason without witnesses or None when it passes unanchored, reason with)
ATTACKS: dict[str, tuple[Callable[[Path], None], str | None, str | None]] = {
    "backup restored": (attack_backup_restored, None, None),
    "cut, newest checkpoints deleted": (attack_cut_and_newest_deleted, None, "checkpoints deleted"),
    "all checkpoints deleted": (
        attack_all_checkpoints_deleted,
        "checkpoints deleted",
        "checkpoints deleted",
    ),
    "rewrite re-signed with node.key": (attack_rewrite_resigned, None, "rewritten"),
    "fork with the project's writer": (attack_fork_with_own_writer, None, "forked"),
    "foreign-signed latest checkpoint": (
        attack_foreign_latest,
        "checkpoint signature",
        "checkpoint signature",
    ),
    "bad middle checkpoint": (attack_bad_middle, "checkpoint signature", "checkpoint signature"),
}


def _config(folder: Path) -> Path:
    """A config naming the data dir (its [[witnesses]] are W2's keys: see the test below)."""
    config = folder.parent / "node.toml"
    config.write_text(f'[node]\nnode_id = "{NODE}"\ndata_dir = "{folder}"\n')
    return config


def _readers(where: Path, witness: list[str]) -> dict[str, Ran]:
    return {
        "chain verify": cli("chain", "verify", str(where), "--json", *witness),
        "replay": cli("replay", str(where), *witness),
        "events": cli("events", str(where), *witness),
        "audit": cli("audit", str(where), "--json", *witness),
    }


@pytest.mark.parametrize("name", list(ATTACKS))
@pytest.mark.parametrize("witnessed", [False, True])
def test_every_reader_gives_the_same_verdict(tmp_path: Path, name: str, witnessed: bool) -> None:
    folder = tmp_path / "data"
    path = grow(folder, 20)
    if witnessed:
        cosign_all(path)
    attack, without, with_witness = ATTACKS[name]
    attack(folder)
    want = with_witness if witnessed else without
    witness = ["--witness", WITNESS.key.key_string()] if witnessed else []
    policy = WitnessPolicy.of([WITNESS.key]) if witnessed else None
    verdict = assess(path, node_key(path), policy)
    assert (verdict.problem.reason if verdict.problem else None) == want, verdict
    for where in (folder, path):
        ran = _readers(where, witness)
        for reader, result in ran.items():
            assert result.code == (0 if want is None else 1), (reader, where, result)
            if want is not None:
                assert want in result.out + result.err, (reader, result)
        if want is None:
            line = ran["chain verify"]
            assert json.loads(line.out)["anchor"] == verdict.anchor
            assert verdict.anchor in ran["replay"].err
            assert witnessed or verdict.anchor.startswith("unanchored")  # never "anchored"
    by_config = cli("chain", "verify", str(_config(folder)), "--json", *witness)
    assert by_config.code == (0 if want is None else 1), by_config
    # under a verdict that is not ok the anchor line vouches for nothing (stop 31)
    anchor = verdict.anchor if want is None else NOT_VOUCHED
    assert json.loads(by_config.out)["anchor"] == anchor
    if want is not None:
        assert cli("timeline", str(folder), "inst-x", *witness).code == 1
        with pytest.raises(ChainTampered) as caught:
            check_node_chain(path, NODE, policy)
        assert caught.value.reason == want


def test_a_configs_witnesses_are_the_policy(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text(
        '[node]\nnode_id = "n"\nwitness_quorum = 1\n\n[[witnesses]]\n'
        f'url = "http://127.0.0.1:1"\nvkey = "{WITNESS.key.key_string()}"\n'
    )
    assert config_witnesses(config) == ((WITNESS.key.key_string(),), 1)
    config.write_text('[node]\nnode_id = "n"\n')
    assert config_witnesses(config) == ((), None)


def test_anchored_by_a_quorum_of_witnesses(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    path = grow(folder, 20)
    second = Cosigner.generate("witness.example/w2")
    cosign_all(path)
    keys = ["--witness", WITNESS.key.key_string(), "--witness", second.key.key_string()]
    one = cli("chain", "verify", str(folder), "--json", *keys)
    assert one.code == 1, one  # witnesses given and their quorum unmet: a finding (stop 34)
    doc = json.loads(one.out)
    assert doc["anchor"] == NOT_VOUCHED
    assert doc["checkpoint"]["reason"] == "witness quorum not met"
    quorum = json.loads(cli("chain", "verify", str(folder), "--json", *keys, "--quorum", "1").out)
    assert quorum["anchor"] == "anchored: 1 of 2 witnesses at size 20"
    cosign_all(path, second)
    both = cli("chain", "verify", str(folder), *keys)
    assert both.code == 0 and "anchored: 2 of 2 witnesses at size 20" in both.out
    assert (
        cli("replay", str(folder), *keys)
        .err.strip()
        .endswith("anchored: 2 of 2 witnesses at size 20")
    )


def test_witnesses_given_and_no_quorum_is_a_finding_naming_them(tmp_path: Path) -> None:
    """Stop 34's trial: ``--witness`` given, no cosignature stored, exit 0 and a
    warning to "pass --witness"."""
    folder = tmp_path / "data"
    path = grow(folder, 20)
    keys = ["--witness", WITNESS.key.key_string()]
    for reader, ran in _readers(folder, keys).items():
        assert ran.code == 1, (reader, ran)
        said = ran.out + ran.err
        assert "0 of 1 needed cosignatures found" in said, (reader, said)
        assert "witness.example/w1" in said and "pass --witness" not in said, (reader, said)
        assert "Traceback" not in said
    assert cli("timeline", str(folder), "inst-x", *keys).code == 1
    second = Cosigner.generate("witness.example/w2")
    cosign_all(path)
    both = [*keys, "--witness", second.key.key_string()]
    ran = cli("chain", "verify", str(folder), *both)
    assert ran.code == 1, ran
    assert "1 of 2 needed cosignatures found (at tree size 20: witness.example/w1)" in ran.out
    assert "witnesses given: witness.example/w1, witness.example/w2" in ran.out
    assert cli("replay", str(folder), *both, "--unverified").code == 0
    # a config's [[witnesses]] (no --witness) stay a warning that names them
    config = folder.parent / "node.toml"
    config.write_text(
        f'[node]\nnode_id = "{NODE}"\ndata_dir = "{folder}"\n\n[[witnesses]]\n'
        f'url = "http://127.0.0.1:1"\nvkey = "{second.key.key_string()}"\n'
    )
    ran = cli("chain", "verify", str(config))
    assert ran.code == 0, ran
    assert "config's [[witnesses]] vouch for no checkpoint: 0 of 1" in ran.err
    assert "pass --witness" not in ran.err


def test_the_issue_55_against_40_case_fails_audit(tmp_path: Path) -> None:
    """A chain whose own signed checkpoint says 55 events while 40 remain."""
    folder = tmp_path / "data"
    path = grow(folder, 55, every=100)
    conn = _raw(path)
    conn.execute("DELETE FROM events WHERE seq >= 40")
    _done(conn)
    doc = json.loads(cli("audit", str(folder), "--json").out)
    assert doc["ok"] is False and doc["trust"]["reason"] == "truncated"
    assert doc["trust"]["seq"] == 40


def test_rewrite_names_where_the_evidence_locates_it(tmp_path: Path) -> None:
    """After the stored checkpoints are re-signed, a change at seq 17 is not reported
    at the largest re-signed checkpoint: with a witness's cosignatures of sizes 15 and
    20 it lies in seq 15..19."""
    folder = tmp_path / "data"
    path = grow(folder, 30)
    cosign_all(path)
    _rehash_from(path, 17)
    _resign_all(path, load_or_create_signer(folder, NODE))
    verdict = assess(path, node_key(path), WitnessPolicy.of([WITNESS.key]))
    assert verdict.problem is not None
    assert verdict.problem.seq == 15, verdict.problem
    assert "seq 15..19" in verdict.problem.detail


def test_verify_bundle_without_key_says_it_trusted_the_bundles_own(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    grow(folder, 12)
    out = tmp_path / "bundle"
    assert cli("chain", "export", str(folder), str(out)).code == 0
    ran = cli("chain", "verify-bundle", str(out))
    assert ran.code == 0
    assert "the bundle's own key" in ran.out + ran.err
    keyed = cli("chain", "verify-bundle", str(out), "--key", str(folder / "node.pub"))
    assert "the bundle's own key" not in keyed.out + keyed.err


def test_run_refuses_an_undecodable_event_in_one_line(tmp_path: Path) -> None:
    """A chain holding an event that verifies but cannot be decoded: `infervisor run`
    refuses it in one line naming the seq and kind (it was a traceback)."""
    folder = tmp_path / "data"
    path = grow(folder, 6)
    old = encode_payload({"event": "node.started", "v": 0, "pid": 1})  # no upcaster for v0
    with SqliteChain.open(path, NODE) as chain:
        chain.append_many(
            [EventDraft(ts_ns=NOW + 9, source="node", kind="node.started", subject="", payload=old)]
        )
    ran = _run_node(tmp_path, folder)
    assert ran.returncode == 1, ran.stderr  # a finding about the chain, not usage (stop 34)
    assert "Traceback" not in ran.stderr, ran.stderr
    lines = [line for line in ran.stderr.splitlines() if "undecodable event" in line]
    assert len(lines) == 1, ran.stderr
    assert "at seq 6" in lines[0] and "node.started" in lines[0]


def test_run_on_a_tampered_chain_exits_1_as_a_finding(tmp_path: Path) -> None:
    """Stop 34's trial: `infervisor run` on a chain whose row was altered exited 2,
    which docs/cli.md gives to usage; a chain that fails verification is 1."""
    folder = tmp_path / "data"
    path = grow(folder, 8)
    chain_tamper.alter_payload(path, 3)
    ran = _run_node(tmp_path, folder)
    assert ran.returncode == 1, ran.stderr
    assert "Traceback" not in ran.stderr, ran.stderr
    (line,) = [x for x in ran.stderr.splitlines() if x.startswith("error:")]
    assert "seq 3" in line, line


def test_origin_defaults_to_node_id_and_key_digest_and_an_existing_key_keeps_its_name(
    tmp_path: Path,
) -> None:
    (tmp_path / "a").mkdir()
    signer = load_or_create_signer(tmp_path / "a", NODE)
    digest = hashlib.sha256(signer.verifier.public).hexdigest()[:16]
    assert (
        signer.name == default_origin(NODE, signer.verifier.public) == f"infervisor/{NODE}/{digest}"
    )
    assert load_or_create_signer(tmp_path / "a", NODE).name == signer.name  # kept
    with pytest.raises(CheckpointError, match="an existing key keeps its name"):
        load_or_create_signer(tmp_path / "a", NODE, origin="example.com/gpu-01")
    (tmp_path / "b").mkdir()
    custom = load_or_create_signer(tmp_path / "b", NODE, origin="example.com/gpu-01")
    assert custom.name == "example.com/gpu-01"
    path = grow(tmp_path / "b", 8)  # checkpoints signed under the configured origin verify
    assert read_stored(path)[-1].note.startswith("example.com/gpu-01\n")
    assert cli("chain", "verify", str(tmp_path / "b")).code == 0
    (tmp_path / "c").mkdir()
    with pytest.raises(CheckpointError, match="origin"):
        load_or_create_signer(tmp_path / "c", NODE, origin="has space")


def test_proofs_print_the_base64_lines_witnesses_take(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    path = grow(folder, 12)
    old, new = tmp_path / "old.txt", tmp_path / "new.txt"
    rows = read_stored(path)
    old.write_text(rows[0].note)
    new.write_text(rows[-1].note)
    doc = json.loads(cli("chain", "consistency", str(folder), str(old), str(new), "--json").out)
    assert doc["proof_base64"] == [
        base64.b64encode(bytes.fromhex(h)).decode() for h in doc["proof"]
    ]
    text = cli("chain", "consistency", str(folder), str(old), str(new)).out.splitlines()
    at = text.index(f"old {rows[0].tree_size}")
    assert text[at + 1 : at + 1 + len(doc["proof"])] == doc["proof_base64"]
    inclusion = json.loads(
        cli("chain", "prove", str(folder), "3", "--checkpoint", str(new), "--json").out
    )
    assert inclusion["path_base64"] == [
        base64.b64encode(bytes.fromhex(h)).decode() for h in inclusion["path"]
    ]


def test_a_dropped_checkpoints_table_fails_every_reader_as_the_boot(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    path = grow(folder, 12)
    conn = _raw(path)
    conn.execute("DROP TABLE checkpoints")
    conn.execute("DELETE FROM saved_triggers WHERE sql LIKE '%ON checkpoints%'")
    _done(conn)
    with pytest.raises(ChainTampered) as caught:
        check_node_chain(path, NODE)
    assert caught.value.reason == "checkpoints dropped"
    for reader, ran in _readers(folder, []).items():
        assert ran.code == 1 and "checkpoints dropped" in ran.out + ran.err, (reader, ran)


def test_a_lost_node_key_is_not_replaced_silently(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    first = load_or_create_signer(data, NODE)
    (data / "node.key").unlink()  # lost, while node.pub (and the chain's checkpoints) remain
    with pytest.raises(CheckpointError, match=r"node\.key is missing") as refused:
        load_or_create_signer(data, NODE)
    assert "\n" not in str(refused.value)
    assert (data / "node.pub").read_text().strip() == first.verifier.key_string()


def test_unverified_readers_mark_a_chain_the_trust_policy_fails(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    path = grow(folder, 55, every=100)
    conn = _raw(path)
    conn.execute("DELETE FROM events WHERE seq >= 40")  # every hash and link still holds
    _done(conn)
    text = cli("replay", str(folder), "--unverified")
    assert text.code == 0 and text.out.startswith("UNVERIFIED: "), text.out
    assert "truncated" in text.out.splitlines()[0]
    doc = json.loads(cli("replay", str(folder), "--unverified", "--json").out)
    assert doc["verified"] is False and doc["problem"]["reason"] == "truncated"
    lines = cli("events", str(folder), "--unverified", "--jsonl").out.splitlines()
    assert lines and all(json.loads(line)["verified"] is False for line in lines)


def _run_node(tmp_path: Path, folder: Path) -> subprocess.CompletedProcess[str]:
    """`infervisor run` on a config whose data directory is ``folder``; it is
    expected to refuse the chain and exit."""
    config = tmp_path / "node.toml"
    config.write_text(f'[node]\nnode_id = "{NODE}"\ndata_dir = "{folder}"\n')
    return subprocess.run(
        [str(INFERVISOR), "run", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


TAMPERINGS = {
    "checkpoints dropped": "DROP TABLE checkpoints",
    "format version": "PRAGMA user_version = 7",
    "checkpoint trigger changed": (
        "DROP TRIGGER checkpoints_append_only_delete;"
        "CREATE TRIGGER checkpoints_append_only_delete BEFORE DELETE ON checkpoints "
        "BEGIN SELECT 1; END"
    ),
    "events trigger dropped": "DROP TRIGGER events_append_only_update",
}


@pytest.mark.parametrize("name", list(TAMPERINGS))
def test_export_refuses_what_every_reader_refuses(tmp_path: Path, name: str) -> None:
    """A newcomer's trial (stop 34): export wrote a bundle of a chain every other reader
    refused (exit 0, no warning), and verify-bundle called it ok. Now it refuses with
    the readers' exit status and message, and writes nothing."""
    path = grow(tmp_path / "data", 12)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(TAMPERINGS[name])
    conn.close()
    read = cli("events", str(path))
    assert read.code in (1, 2), read
    out = tmp_path / "bundle"
    exported = cli("chain", "export", str(path), str(out))
    assert exported.code == read.code, exported
    assert not out.exists() and exported.out == ""

    def headline(err: str) -> str:
        (line,) = [x for x in err.splitlines() if x.startswith("error:")]
        return line.split("; nothing ")[0]

    assert headline(exported.err) == headline(read.err)


@pytest.mark.parametrize("name", list(TAMPERINGS))
def test_run_refuses_a_tampered_table_or_trigger_as_a_finding(tmp_path: Path, name: str) -> None:
    """A newcomer's trial (stop 34): `infervisor run` on a chain with a dropped
    events trigger exited 2 (usage); a tampered chain at boot is 1 (docs/cli.md),
    as every reader says, and nothing is written to it. A format version this code
    does not read stays 2, as for every reader (a file that is not a chain it reads)."""
    folder = tmp_path / "data"
    path = grow(folder, 12)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(TAMPERINGS[name])
    conn.close()
    before = path.read_bytes()
    ran = _run_node(tmp_path, folder)
    assert ran.returncode == cli("events", str(path)).code, ran.stderr
    assert ran.returncode == (2 if name == "format version" else 1), ran.stderr
    assert "Traceback" not in ran.stderr, ran.stderr
    assert len([x for x in ran.stderr.splitlines() if x.startswith("error:")]) == 1, ran.stderr
    assert path.read_bytes() == before  # nothing written: no genesis, view or checkpoint


def test_witness_quorum_not_met_is_unanchored_and_the_json_warning_says_so(
    tmp_path: Path,
) -> None:
    """A newcomer's trial (stop 34): ``--witness W --json`` with no quorum gave
    ``"warning": null``, which docs/cli.md keeps for an anchored verdict."""
    folder = tmp_path / "data"
    grow(folder, 12)
    keys = ["--witness", WITNESS.key.key_string()]
    ran = cli("chain", "verify", str(folder), "--json", *keys)
    assert ran.code == 1, ran
    doc = json.loads(ran.out)
    assert doc["ok"] is False and doc["anchor"] == NOT_VOUCHED
    warning = doc["warning"]
    assert warning is not None and "cannot be ruled out" in warning, doc
    assert "0 of 1 needed cosignatures found" in warning and "pass --witness" not in warning
    text = cli("chain", "verify", str(folder), *keys)
    assert "cannot be ruled out" in text.err and "pass --witness" not in text.err
