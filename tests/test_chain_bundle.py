"""Export bundles, verify-bundle, backups; the independent verifier agrees on bundles
and on chains checked against a checkpoint."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from chain_tamper import NODE, draft, make_chain, rewrite_from, truncate
from click.testing import CliRunner

from infervisor.chain import SqliteChain, encode_payload, verify_chain
from infervisor.chain.bundle import verify_bundle
from infervisor.chain.errors import BundleError
from infervisor.chain.hashing import event_hash, header_bytes, payload_hash
from infervisor.tools.cli import cli as main_cli

INDEPENDENT = Path(__file__).with_name("independent_bundle_verifier.py")


class Ran(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def cli(*args: str) -> Ran:
    result = CliRunner().invoke(main_cli, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Ran(result.exit_code, result.stdout, result.stderr)


def independent(*args: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, str(INDEPENDENT), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    return done.returncode, done.stdout.strip()


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    path = make_chain(tmp_path / "data", 12, every=4)
    out = tmp_path / "bundle"
    result = cli("chain", "export", str(path), str(out), "--json")
    assert result.returncode == 0, result.stderr
    manifest = json.loads(result.stdout)
    assert manifest["events"] == 12 and manifest["checkpoints"] == [4, 8, 12]
    assert set(manifest["files"]) == {
        "events.jsonl",
        "node.pub",
        "checkpoints/4.txt",
        "checkpoints/8.txt",
        "checkpoints/12.txt",
    }
    return out


def lines(out: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def write(out: Path, rows: list[dict[str, object]]) -> None:
    text = "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in rows)
    (out / "events.jsonl").write_text(text)


def verdicts(out: Path) -> tuple[tuple[int, str], str]:
    """(seq, reason) from verify-bundle, and the independent verifier's line."""
    result = cli("chain", "verify-bundle", str(out), "--json")
    assert result.returncode == 1, result.stdout
    doc = json.loads(result.stdout)
    status, line = independent(str(out))
    assert status == 1
    return (doc["seq"], doc["reason"]), line


def test_bundle_verifies_both_ways(bundle: Path) -> None:
    result = cli("chain", "verify-bundle", str(bundle))
    assert result.returncode == 0, result.stdout
    assert "3 checkpoints verified" in result.stdout
    status, line = independent(str(bundle))
    assert status == 0 and line.startswith("ok 12 "), line
    row = lines(bundle)[3]
    assert set(row) == {
        "seq",
        "ts_ns",
        "node",
        "source",
        "kind",
        "subject",
        "payload",
        "payload_hash",
        "prev_hash",
        "hash",
    }
    assert json.loads(base64.b64decode(str(row["payload"]))) == {"n": 3, "tag": ""}


def test_edited_payload_named(bundle: Path) -> None:
    rows = lines(bundle)
    rows[5]["payload"] = base64.b64encode(encode_payload({"n": 99})).decode()
    write(bundle, rows)
    ours, theirs = verdicts(bundle)
    assert ours == (5, "payload altered")
    assert theirs == "bad 5 payload altered"


def test_dropped_line_named(bundle: Path) -> None:
    rows = lines(bundle)
    write(bundle, rows[:6] + rows[7:])
    ours, theirs = verdicts(bundle)
    assert ours == (7, "gap")
    assert theirs == "bad 7 gap"


def test_dropped_last_line_is_truncation(bundle: Path) -> None:
    write(bundle, lines(bundle)[:-1])
    ours, theirs = verdicts(bundle)
    assert ours == (11, "truncated")
    assert theirs == "bad 11 truncated"


def test_rewritten_bundle_named(bundle: Path) -> None:
    rows = lines(bundle)
    prev = bytes.fromhex(str(rows[5]["prev_hash"]))
    for row in rows[5:]:
        if row["seq"] == 5:
            row["payload"] = base64.b64encode(encode_payload({"rewritten": 1})).decode()
        payload = base64.b64decode(str(row["payload"]))
        digest = payload_hash(payload)
        fields = tuple(str(row[k]).encode() for k in ("node", "source", "kind", "subject"))
        head = header_bytes(
            seq=int(str(row["seq"])),
            ts_ns=int(str(row["ts_ns"])),
            fields=fields,  # type: ignore[arg-type]
            payload_digest=digest,
            prev_hash=prev,
        )
        prev = event_hash(head)
        row.update(payload_hash=digest.hex(), prev_hash=row["prev_hash"], hash=prev.hex())
    for before, row in itertools.pairwise(rows[5:]):
        row["prev_hash"] = before["hash"]
    write(bundle, rows)
    ours, theirs = verdicts(bundle)
    assert ours == (4, "rewritten")  # checkpoint 4 still matches; 8 does not
    assert theirs == "bad 4 rewritten"


def test_manifest_checked_last(bundle: Path) -> None:
    (bundle / "node.pub").write_text((bundle / "node.pub").read_text() + "\n")
    with pytest.raises(BundleError, match="manifest"):
        verify_bundle(bundle)


def test_independent_verifier_checks_a_chain_against_a_checkpoint(tmp_path: Path) -> None:
    path = make_chain(tmp_path / "data", 10, every=100)
    saved = tmp_path / "cp.txt"
    assert cli("chain", "checkpoint", str(path), "--out", str(saved)).returncode == 0
    key = str(tmp_path / "data" / "node.pub")
    assert independent("--db", str(path), str(saved), key)[1].startswith("ok 10 ")
    copy = tmp_path / "copy.db"
    shutil.copy(path, copy)
    truncate(copy, 6)
    assert independent("--db", str(copy), str(saved), key) == (1, "bad 6 truncated")
    rewrite_from(path, 3)
    assert independent("--db", str(path), str(saved), key) == (1, "bad 0 rewritten")


def test_backup_of_a_live_chain_keeps_the_wal(tmp_path: Path) -> None:
    path = tmp_path / "chain.db"
    with SqliteChain.open(path, NODE) as chain:  # the writer stays open: events in the WAL
        chain.append_many([draft(n) for n in range(1, 30)])
        assert (tmp_path / "chain.db-wal").stat().st_size > 0
        plain = tmp_path / "cp.db"
        shutil.copy(path, plain)  # what `cp chain.db` does
        result = cli("chain", "backup", str(path), str(tmp_path / "backup.db"), "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["events"] == 30
        again = cli("chain", "backup", str(path), str(tmp_path / "backup.db"), "--json")
        assert again.returncode == 2
    report = verify_chain(tmp_path / "backup.db")
    assert report.ok and report.events == 30
    with sqlite3.connect(plain) as conn:  # the lone .db file lacks what the WAL held
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        count = conn.execute("SELECT count(*) FROM events").fetchone()[0] if tables else 0
    assert count < 30


@pytest.mark.parametrize("edit", ["payload", "truncate"])
def test_verify_bundle_names_the_seq_and_reason_once(bundle: Path, edit: str) -> None:
    """A newcomer's trial (stop 34): "INVALID at seq 5: payload altered:" was printed
    twice on one line (the CLI's prefix, then the error's own)."""
    rows = lines(bundle)
    if edit == "payload":
        rows[5]["payload"] = base64.b64encode(encode_payload({"n": 99})).decode()
        write(bundle, rows)
    else:
        write(bundle, rows[:-1])
    ran = cli("chain", "verify-bundle", str(bundle))
    assert ran.returncode == 1
    (line,) = ran.stdout.splitlines()
    head = "INVALID at seq 5: payload altered: " if edit == "payload" else "INVALID at seq 11: "
    assert line.startswith(head), line
    assert line.count("INVALID") == 1 and line.count(" at seq ") == 1, line
    assert line.count("payload altered" if edit == "payload" else "truncated") == 1, line
    doc = json.loads(cli("chain", "verify-bundle", str(bundle), "--json").stdout)
    assert "INVALID" not in doc["detail"] and doc["detail"] in line, doc
