"""tests/independent_verifier.py (written from docs/chain-format.md) agrees with verify_chain."""

from __future__ import annotations

import ast
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import VERIFIER, load_independent_verifier

from infervisor.chain import EventDraft, SqliteChain, encode_payload, verify_chain

NOW = 1_793_491_200_000_000_000
COLUMNS = (
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
)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(VERIFIER), *args], capture_output=True, text=True, check=False
    )


def make_chain(path: Path, length: int) -> None:
    with SqliteChain.open(path, "node-a", now_ns=lambda: NOW) as chain:
        chain.append_many(
            EventDraft(
                ts_ns=NOW + n,
                source="operator",
                kind=f"kind.{n % 3}",
                subject=f"inst-{n % 2}",
                payload=encode_payload({"n": n}),
            )
            for n in range(1, length)
        )


def verdict(path: Path) -> tuple[str, int, str] | tuple[str, int, int | str]:
    """verify_chain's report in the independent verifier's terms."""
    report = verify_chain(path)
    if report.problem is None:
        return ("ok", report.events, report.head_hash or "")
    return ("bad", report.problem.seq, report.problem.reason)


INDEPENDENT = load_independent_verifier()


def test_the_verifier_imports_only_what_an_auditor_has() -> None:
    tree = ast.parse(VERIFIER.read_text())
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    assert not any(isinstance(node, ast.ImportFrom) for node in ast.walk(tree))
    assert imported <= {"sqlite3", "blake3", "json", "struct", "sys"}


@pytest.mark.parametrize("length", [1, 2, 40])
def test_a_valid_chain_prints_ok_with_its_head(tmp_path: Path, length: int) -> None:
    path = tmp_path / "chain.db"
    make_chain(path, length)
    result = run(str(path))
    report = verify_chain(path)
    assert (result.returncode, result.stdout) == (0, f"ok {length} {report.head_hash}\n")
    assert report.events == length


def test_a_tampered_chain_prints_bad_and_exits_1(tmp_path: Path) -> None:
    path = tmp_path / "chain.db"
    make_chain(path, 5)
    conn = sqlite3.connect(path)
    conn.execute("DROP TRIGGER events_append_only_update")
    conn.execute("UPDATE events SET payload = CAST('{}' AS BLOB) WHERE seq = 3")
    conn.commit()
    conn.close()
    result = run(str(path))
    assert (result.returncode, result.stdout) == (1, "bad 3 payload altered\n")
    assert verdict(path) == ("bad", 3, "payload altered")


def not_sqlite(path: Path) -> None:
    path.write_bytes(b"junk" * 500)


def no_events(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.close()


@pytest.mark.parametrize(
    "prepare", [lambda path: None, not_sqlite, no_events], ids=["missing", "junk", "other"]
)
def test_an_unreadable_file_exits_2(tmp_path: Path, prepare: Callable[[Path], None]) -> None:
    path = tmp_path / "chain.db"
    prepare(path)
    result = run(str(path))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("error ")


def test_usage_exits_2() -> None:
    assert run().returncode == 2


def mutate(value: object, how: int) -> object:
    """One of several corruptions of a column value."""
    if how == 0:
        return None
    if isinstance(value, int):
        return value + (1 if how % 2 else -1)
    if isinstance(value, bytes) and value:
        if how == 1:
            return value[:-1]
        flipped = bytearray(value)
        flipped[how % len(value)] ^= 1 << (how % 8)
        return bytes(flipped)
    return b"\x00"


def tamper(path: Path, data: st.DataObject, length: int) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.text_factory = bytes
    try:
        for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger'"
        ).fetchall():
            conn.execute(f'DROP TRIGGER "{name.decode()}"')
        for (view,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'view'"
        ).fetchall():
            conn.execute(f'DROP VIEW "{view.decode()}"')  # the forensic views name the table
        conn.execute("CREATE TABLE plain AS SELECT * FROM events")
        conn.execute("DROP TABLE events")
        conn.execute("ALTER TABLE plain RENAME TO events")
        for _ in range(data.draw(st.integers(1, 2), label="tampers")):
            apply_one(conn, data, length)
    finally:
        conn.close()


def apply_one(conn: sqlite3.Connection, data: st.DataObject, length: int) -> None:
    seq = data.draw(st.integers(0, length - 1), label="seq")
    action = data.draw(st.sampled_from(["set", "delete", "duplicate", "swap"]), label="action")
    if action == "delete":
        conn.execute("DELETE FROM events WHERE seq = ?", (seq,))
    elif action == "duplicate":
        conn.execute("INSERT INTO events SELECT * FROM events WHERE seq = ? LIMIT 1", (seq,))
    elif action == "swap":
        other = data.draw(st.integers(0, length - 1), label="other")
        conn.execute("UPDATE events SET seq = -100 WHERE seq = ?", (seq,))
        conn.execute("UPDATE events SET seq = ? WHERE seq = ?", (seq, other))
        conn.execute("UPDATE events SET seq = ? WHERE seq = -100", (other,))
    else:
        column = data.draw(st.sampled_from(COLUMNS), label="column")
        how = data.draw(st.integers(0, 40), label="how")
        found = conn.execute(f"SELECT {column} FROM events WHERE seq = ?", (seq,)).fetchone()
        if found is not None:
            conn.execute(
                f"UPDATE events SET {column} = ? WHERE seq = ?", (mutate(found[0], how), seq)
            )


@settings(max_examples=100, deadline=None)
@given(length=st.integers(1, 6), data=st.data())
def test_both_verifiers_agree_on_randomly_tampered_chains(length: int, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "chain.db"
        make_chain(path, length)
        tamper(path, data, length)
        assert INDEPENDENT.verify(str(path)) == verdict(path)
