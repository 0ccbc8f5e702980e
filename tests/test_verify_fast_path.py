"""The verifier's fast path (chain/verify.py ``_walk_rest``) gives what the documented
checks give, row by row, on a chain of every event kind, intact and tampered (issue 22,
item 3: the auditor's commands made faster, their verdicts unchanged).

The reference reads every row and runs ``checks.check_row`` on it, the way
docs/chain-format.md orders the checks, with no fast path; ``scan_chain`` must
report the same first problem, head and count, and hand its consumer the same
events (the replay reducer's input).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import pytest
from test_chain_verify import attacker
from varied_chain import write_varied_chain

from infervisor.chain import StoredEvent, scan_chain, schema
from infervisor.chain.checks import Problem, check_row, parse_row
from infervisor.chain.verify import BATCH_ROWS, SqlLookups, Verified, stored_event, stored_of

Verdict = tuple[int, int | None, str | None, Problem | None]


def documented(path: Path) -> tuple[Verdict, list[StoredEvent]]:
    """(events, head seq, head hash, first problem) and the good events, checked
    row by row with ``check_row`` only."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.text_factory = bytes
    good: list[StoredEvent] = []
    before = genesis = None
    problem: Problem | None = None
    try:
        for raw in conn.execute(schema.SELECT_EVENTS + " ORDER BY seq"):
            row = parse_row(raw, 0 if before is None else before.seq + 1)
            if isinstance(row, Problem):
                problem = row
                break
            problem = check_row(row, before, genesis, SqlLookups(conn))
            if problem is not None:
                break
            genesis = genesis or row
            good.append(stored_event(row, genesis.node.decode()))
            before = row
    finally:
        conn.close()
    if before is None and problem is None:
        problem = Problem(seq=0, reason="bad genesis", detail="the chain is empty: no row at seq 0")
    head = None if before is None else before.seq
    digest = None if before is None else before.hash.hex()
    return (len(good), head, digest, problem), good


def fast(path: Path) -> tuple[Verdict, list[StoredEvent]]:
    good: list[StoredEvent] = []
    report = scan_chain(path, good.append)
    verdict = (report.events, report.head_seq, report.head_hash, report.problem)
    assert batched(path) == (verdict, good)
    return verdict, good


def batched(path: Path, *, keep_going: bool = False) -> tuple[Verdict, list[StoredEvent]]:
    """`fast` through ``scan_chain``'s batch consumer (what replay folds): the same
    verdict and events, in lists of at most BATCH_ROWS."""
    lists: list[list[Verified]] = []
    report = scan_chain(path, keep_going=keep_going, batch=lists.append)
    assert all(0 < len(rows) <= BATCH_ROWS for rows in lists)
    node = report.node or ""
    good = [stored_of(row, node) for rows in lists for row in rows]
    return (report.events, report.head_seq, report.head_hash, report.problem), good


@pytest.fixture(scope="module")
def varied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("varied") / "chain.db"
    write_varied_chain(path, 300)
    return path


#: Changes an attacker (or a disk) makes, each at a row well inside the chain; the
#: fast path must defer each changed row to the documented checks.
_CHANGES = [
    "payload = payload || x'20' WHERE seq = 150",
    "payload = 7 WHERE seq = 150",
    "payload = NULL WHERE seq = 150",
    "payload_hash = zeroblob(32) WHERE seq = 150",
    "payload_hash = NULL WHERE seq = 150",
    "prev_hash = zeroblob(32) WHERE seq = 150",
    "prev_hash = substr(prev_hash, 1, 31) WHERE seq = 150",
    "hash = zeroblob(32) WHERE seq = 150",
    "hash = 'short' WHERE seq = 150",
    "ts_ns = ts_ns + 1 WHERE seq = 150",
    "ts_ns = 1.5 WHERE seq = 150",
    "ts_ns = 'now' WHERE seq = 150",
    "ts_ns = NULL WHERE seq = 150",
    "node = 'node-b' WHERE seq = 150",
    "node = NULL WHERE seq = 150",
    "source = source || 'x' WHERE seq = 150",
    "source = 12 WHERE seq = 150",
    "kind = 'chain.genesis' WHERE seq = 150",
    "kind = x'ff00' WHERE seq = 150",
    "kind = NULL WHERE seq = 150",
    "subject = CAST(x'c328' AS TEXT) WHERE seq = 150",
    "subject = 3.5 WHERE seq = 150",
    "seq = 'x' WHERE seq = 150",
    "seq = 1000 WHERE seq = 150",
    "seq = seq + 1 WHERE seq >= 150",
    "seq = -1 WHERE seq = 0",
]


#: Changes of a column's type that keep its bytes (the format reads text or blob alike,
#: and SQLite stores 150.0 in an integer column as 150): not tampering, both paths agree.
_SAME_BYTES = [
    "payload = CAST(payload AS TEXT) WHERE seq = 150",
    "node = CAST(node AS BLOB) WHERE seq = 150",
    "source = CAST(source AS BLOB) WHERE seq = 150",
    "seq = 150.0 WHERE seq = 150",
]


def test_an_intact_chain_of_every_kind_checks_out_the_same(varied: Path) -> None:
    verdict, good = fast(varied)
    assert (verdict, good) == documented(varied)
    assert verdict[3] is None and verdict[0] == len(good) > 250


@pytest.mark.parametrize("change", [*_CHANGES, *_SAME_BYTES])
def test_a_changed_row_gets_the_documented_verdict(
    varied: Path, tmp_path: Path, change: str
) -> None:
    path = tmp_path / "chain.db"
    path.write_bytes(varied.read_bytes())
    with attacker(path, strip=True) as conn:
        if change.startswith("seq = seq + 1"):  # one UPDATE of many rows: no key clash
            conn.execute("UPDATE events SET seq = -seq - 1 WHERE seq >= 150")
            conn.execute("UPDATE events SET seq = -seq WHERE seq < 0")
        else:
            conn.execute(f"UPDATE events SET {change}")
    verdict, good = fast(path)
    assert (verdict, good) == documented(path)
    if change in _SAME_BYTES:
        assert verdict[3] is None
    else:  # every change is caught, where it was made
        assert verdict[3] is not None
        assert verdict[3].seq in (-1, 150, 151, 1000)


def test_batches_hold_at_most_batch_rows_and_a_raise_ends_the_scan(
    varied: Path, tmp_path: Path
) -> None:
    """Lists of BATCH_ROWS rows, the last one shorter; a consumer that raises ends the
    scan, its exception propagating (as with one event at a time)."""
    path = tmp_path / "long.db"
    write_varied_chain(path, BATCH_ROWS * 2 + 10)
    sizes: list[int] = []
    scan_chain(path, batch=lambda rows: sizes.append(len(rows)))
    assert sizes == [BATCH_ROWS, BATCH_ROWS, 11]

    def refuse(rows: list[Verified]) -> None:
        raise RuntimeError(f"refused at seq {rows[0][0]}")

    with pytest.raises(RuntimeError, match="refused at seq 0"):
        scan_chain(path, batch=refuse)
    with pytest.raises(ValueError, match="not both"):
        scan_chain(path, sizes.append, batch=sizes.append)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "change", ["hash = zeroblob(32) WHERE seq = 150", "node = 'x' WHERE seq = 9"]
)
def test_unverified_rows_after_a_problem_are_handed_over_unchecked(
    varied: Path, tmp_path: Path, change: str
) -> None:
    """``keep_going``: the rows after the first problem go to the batch consumer as
    they go to `consume` (the node of a `StoredEvent` is the row's own there)."""
    path = tmp_path / "chain.db"
    path.write_bytes(varied.read_bytes())
    with attacker(path, strip=True) as conn:
        conn.execute(f"UPDATE events SET {change}")
    one: list[StoredEvent] = []
    report = scan_chain(path, one.append, keep_going=True)
    verdict, good = batched(path, keep_going=True)
    assert verdict == (report.events, report.head_seq, report.head_hash, report.problem)
    assert report.problem is not None and len(good) == len(one) > report.events
    assert good == [msgspec.structs.replace(e, node="varied") for e in one]
