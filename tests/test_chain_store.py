"""The chain stores: one contract suite for SqliteChain and MemoryChain, then SQLite specifics."""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import infervisor.chain as chain_package
from infervisor.chain import (
    FORMAT_VERSION,
    GENESIS_KIND,
    ZERO_HASH,
    Chain,
    ChainFormatError,
    ChainIntegrityError,
    ChainIOError,
    EventDraft,
    InvalidEventError,
    MemoryChain,
    NodeMismatch,
    SqliteChain,
    StoredEvent,
    encode_payload,
    verify_chain,
)
from infervisor.chain import sqlite as chain_sqlite
from infervisor.chain.hashing import seal

NOW = 1_793_491_200_000_000_000  # 2026-11-01T00:00:00Z


def draft(
    n: int = 0, *, kind: str = "instance.placed", subject: str = "inst-1", source: str = "operator"
) -> EventDraft:
    return EventDraft(
        ts_ns=NOW + n,
        source=source,
        kind=kind,
        subject=subject,
        payload=encode_payload({"n": n}),
    )


class ChainContract:
    """What every chain store promises. Subclasses say how to open one."""

    now: Callable[[], object] = staticmethod(lambda: NOW)

    def open_chain(self, node_id: str = "node-a") -> Chain:
        raise NotImplementedError

    @pytest.fixture
    def chain(self) -> Iterator[Chain]:
        with self.open_chain() as chain:
            yield chain

    def test_new_chain_holds_only_its_genesis(self, chain: Chain) -> None:
        genesis = chain.head()
        assert chain.node_id == "node-a"
        assert (genesis.seq, genesis.ts_ns, genesis.node) == (0, NOW, "node-a")
        assert (genesis.source, genesis.kind, genesis.subject) == ("node", GENESIS_KIND, "")
        assert genesis.payload == b'{"format":1,"hash":"blake3","node":"node-a"}'
        assert genesis.prev_hash == ZERO_HASH
        assert list(chain.events()) == [genesis]

    def test_append_returns_the_stored_event(self, chain: Chain) -> None:
        genesis = chain.head()
        event = chain.append(draft(1))
        assert (event.seq, event.ts_ns, event.node, event.kind) == (
            1,
            NOW + 1,
            "node-a",
            "instance.placed",
        )
        assert (event.source, event.subject, event.payload) == ("operator", "inst-1", b'{"n":1}')
        assert event.prev_hash == genesis.hash
        assert len(event.hash) == 32
        assert event.hash_hex() == event.hash.hex()
        assert chain.head() == event
        assert list(chain.events(after=0)) == [event]

    def test_hashes_are_the_format_not_the_store(self, chain: Chain) -> None:
        event = chain.append(draft(1))
        assert event == seal(draft(1), seq=1, node="node-a", prev_hash=event.prev_hash)

    def test_each_event_links_to_the_one_before(self, chain: Chain) -> None:
        for n in range(5):
            chain.append(draft(n))
        events = list(chain.events())
        assert [e.seq for e in events] == list(range(6))
        assert all(b.prev_hash == a.hash for a, b in itertools.pairwise(events))
        assert len({e.hash for e in events}) == 6

    def test_append_many_stores_a_batch_in_order(self, chain: Chain) -> None:
        stored = chain.append_many([draft(n) for n in range(4)])
        assert [e.seq for e in stored] == [1, 2, 3, 4]
        assert [e.ts_ns for e in stored] == [NOW + n for n in range(4)]
        assert stored[1].prev_hash == stored[0].hash
        assert chain.head() == stored[-1]
        assert chain.append_many([]) == []
        assert chain.head() == stored[-1]

    def test_events_filters_by_seq_subject_and_kind(self, chain: Chain) -> None:
        chain.append(draft(1, subject="a", kind="instance.placed"))
        chain.append(draft(2, subject="b", kind="instance.placed"))
        chain.append(draft(3, subject="a", kind="instance.started"))
        chain.append(draft(4, subject="", kind="node.heartbeat"))

        def seqs(**query: object) -> list[int]:
            return [e.seq for e in chain.events(**query)]  # type: ignore[arg-type]

        assert seqs(after=2) == [3, 4]
        assert seqs(subject="a") == [1, 3]
        assert seqs(subject="") == [0, 4]
        assert seqs(kinds={"instance.placed"}) == [1, 2]
        assert seqs(kinds=["instance.started", "node.heartbeat"]) == [3, 4]
        assert seqs(subject="a", kinds={"instance.placed"}, after=0) == [1]
        assert seqs(kinds=set()) == []
        assert seqs(after=99) == []

    def test_kinds_must_be_a_collection_not_a_str(self, chain: Chain) -> None:
        with pytest.raises(TypeError, match="collection"):
            chain.events(kinds="instance.placed")

    @pytest.mark.parametrize(
        "bad",
        [
            EventDraft(ts_ns=NOW, source="operator", kind=GENESIS_KIND, subject="", payload=b"{}"),
            EventDraft(ts_ns=NOW, source="operator", kind="", subject="", payload=b"{}"),
            EventDraft(ts_ns=NOW, source="", kind="k", subject="", payload=b"{}"),
            EventDraft(ts_ns=2**63, source="operator", kind="k", subject="", payload=b"{}"),
            EventDraft(ts_ns=1.5, source="operator", kind="k", subject="", payload=b"{}"),  # type: ignore[arg-type]
            EventDraft(ts_ns=NOW, source="operator", kind="k", subject="\udc80", payload=b"{}"),
            EventDraft(ts_ns=NOW, source="operator", kind="k", subject="", payload="{}"),  # type: ignore[arg-type]
        ],
        ids=[
            "genesis-kind",
            "empty-kind",
            "empty-source",
            "ts-overflow",
            "float-ts",
            "surrogate",
            "str-payload",
        ],
    )
    def test_a_bad_draft_is_refused_and_nothing_is_appended(
        self, chain: Chain, bad: EventDraft
    ) -> None:
        with pytest.raises(InvalidEventError):
            chain.append_many([draft(1), bad])
        assert chain.head().seq == 0

    def test_a_closed_chain_refuses_every_call(self) -> None:
        chain = self.open_chain()
        with chain:
            chain.append(draft(1))
        chain.close()
        for call in (chain.head, lambda: chain.append(draft(2)), chain.events):
            with pytest.raises(ChainIOError, match="closed"):
                call()

    @pytest.mark.parametrize("node_id", ["", "\udc80"])
    def test_a_bad_node_id_is_refused(self, node_id: str) -> None:
        with pytest.raises(InvalidEventError):
            self.open_chain(node_id)

    def test_a_clock_that_is_not_int_ns_is_refused(self) -> None:
        self.now = lambda: 1.5e18
        with pytest.raises(InvalidEventError, match="ts_ns"):
            self.open_chain()


class TestMemoryChain(ChainContract):
    def open_chain(self, node_id: str = "node-a") -> Chain:
        return MemoryChain(node_id, now_ns=self.now)  # type: ignore[arg-type]


class TestSqliteChain(ChainContract):
    @pytest.fixture(autouse=True)
    def _in(self, tmp_path: Path) -> None:
        self.path = tmp_path / "chain.db"

    def open_chain(self, node_id: str = "node-a") -> Chain:
        return SqliteChain.open(self.path, node_id, now_ns=self.now)  # type: ignore[arg-type]


def test_the_public_surface_is_exported() -> None:
    """Every name of ``__all__`` loads (the package is lazy: chain/lazy.py), and
    nothing else is offered as public."""
    exported = set(chain_package.__all__)
    assert len(chain_package.__all__) == len(exported)
    assert exported == set(chain_package._HOME)
    for name in exported:
        assert getattr(chain_package, name) is not None
    public = {
        name
        for name, value in vars(chain_package).items()
        if not name.startswith("_") and not isinstance(value, ModuleType)
    }
    assert public - exported <= {"TYPE_CHECKING", "annotations", "lazy_names"}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "chain.db"
    with SqliteChain.open(path, "node-a", now_ns=lambda: NOW) as chain:
        chain.append_many([draft(n) for n in range(1, 4)])
    return path


def test_reopen_finds_the_same_chain(db: Path) -> None:
    with SqliteChain.open(db, "node-a", now_ns=lambda: 0) as chain:
        assert chain.head().seq == 3
        assert chain.append(draft(4)).seq == 4
    with SqliteChain.open_readonly(db) as reader:
        assert reader.node_id == "node-a"
        assert [e.seq for e in reader.events()] == [0, 1, 2, 3, 4]
        assert next(reader.events()).ts_ns == NOW


def test_a_chain_of_another_node_is_refused(db: Path) -> None:
    with pytest.raises(NodeMismatch, match="node-a") as caught:
        SqliteChain.open(db, "node-b")
    assert (caught.value.expected, caught.value.found) == ("node-b", "node-a")


def test_the_file_is_wal_synchronous_and_versioned(db: Path) -> None:
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == FORMAT_VERSION
    finally:
        conn.close()


def test_a_readonly_chain_never_writes(db: Path) -> None:
    before = db.read_bytes()
    with SqliteChain.open_readonly(db) as reader:
        with pytest.raises(ChainIOError, match="read-only"):
            reader.append(draft(9))
        assert reader.head().seq == 3
    assert db.read_bytes() == before


def test_readonly_open_of_a_missing_file_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(ChainIOError):
        SqliteChain.open_readonly(tmp_path / "missing.db")
    assert not (tmp_path / "missing.db").exists()


def test_files_that_are_not_chains_are_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite " * 100)
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t (x)")
    conn.close()
    with pytest.raises(ChainIOError, match="not a database"):
        SqliteChain.open(junk, "node-a")
    with pytest.raises(ChainFormatError, match="not an infervisor chain"):
        SqliteChain.open(other, "node-a")
    with pytest.raises(ChainFormatError):
        SqliteChain.open_readonly(other)


def test_a_newer_format_is_refused(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA user_version = 2")
    conn.close()
    with pytest.raises(ChainFormatError, match="format version 2"):
        SqliteChain.open(db, "node-a")


def raw_insert(db: Path, event: StoredEvent) -> None:
    conn = sqlite3.connect(db)
    try:
        with conn:
            conn.execute(
                "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                tuple(msgspec.structs.astuple(event)),
            )
    finally:
        conn.close()


def test_the_database_refuses_a_gap_or_a_fork(db: Path) -> None:
    with SqliteChain.open_readonly(db) as reader:
        head = reader.head()
        first = next(reader.events(after=0))
    gap = seal(draft(9), seq=head.seq + 2, node="node-a", prev_hash=head.hash)
    fork = seal(draft(9), seq=head.seq + 1, node="node-a", prev_hash=first.hash)
    rewrite = seal(draft(9), seq=1, node="node-a", prev_hash=first.prev_hash)
    for bad in (gap, fork, rewrite):
        with pytest.raises(sqlite3.IntegrityError):
            raw_insert(db, bad)
    assert verify_chain(db).head_seq == head.seq


def test_insert_or_replace_cannot_delete_an_event(db: Path) -> None:
    with SqliteChain.open_readonly(db) as reader:
        head = reader.head()
        victim = next(reader.events(after=0))
    forged = seal(draft(9), seq=head.seq + 1, node="node-a", prev_hash=head.hash)
    conn = sqlite3.connect(db)
    try:
        with pytest.raises(sqlite3.IntegrityError, match="hash already stored"):
            conn.execute(
                "INSERT OR REPLACE INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*msgspec.structs.astuple(forged)[:9], victim.hash),
            )
    finally:
        conn.close()
    assert verify_chain(db).ok


def test_a_shared_prev_hash_is_refused_by_the_trigger_not_an_index(db: Path) -> None:
    """prev_hash has no UNIQUE index (chain/schema.py): the insert trigger alone
    refuses a second row linking to the same event, replacing or not."""
    with SqliteChain.open_readonly(db) as reader:
        head = reader.head()
        first = next(reader.events(after=0))
    fork = seal(draft(9), seq=head.seq + 1, node="node-a", prev_hash=first.hash)
    conn = sqlite3.connect(db)
    try:
        assert not [
            row
            for row in conn.execute("PRAGMA index_list(events)")
            if "prev_hash" in [c[2] for c in conn.execute(f"PRAGMA index_info('{row[1]}')")]
        ]
        for verb in ("INSERT", "INSERT OR REPLACE"):
            with pytest.raises(sqlite3.IntegrityError, match="prev_hash must be the hash"):
                conn.execute(
                    f"{verb} INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    tuple(msgspec.structs.astuple(fork)),
                )
    finally:
        conn.close()
    assert verify_chain(db).head_seq == head.seq


@pytest.mark.parametrize(
    "statement", ["UPDATE events SET kind = 'x' WHERE seq = 1", "DELETE FROM events WHERE seq = 3"]
)
def test_the_database_refuses_updates_and_deletes(db: Path, statement: str) -> None:
    conn = sqlite3.connect(db)
    try:
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            conn.execute(statement)
    finally:
        conn.close()


def test_an_append_from_a_stale_head_is_refused(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with SqliteChain.open(db, "node-a") as chain:
        stale = next(chain.events(after=1))
        monkeypatch.setattr(chain_sqlite, "read_head", lambda conn: stale)
        with pytest.raises(ChainIntegrityError, match="refused"):
            chain.append(draft(9))
        monkeypatch.undo()
        assert chain.head().seq == 3


def test_a_chain_without_its_triggers_is_not_appended_to(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute("DROP TRIGGER events_append_only_delete")
    conn.close()
    with pytest.raises(ChainFormatError, match="triggers"):
        SqliteChain.open(db, "node-a")


def test_readers_stream_a_snapshot_while_the_writer_appends(db: Path) -> None:
    with SqliteChain.open(db, "node-a") as chain:
        stream = chain.events()
        assert next(stream).seq == 0
        chain.append_many([draft(n) for n in range(10)])
        assert [e.seq for e in stream] == [1, 2, 3]
        assert [e.seq for e in chain.events(after=3)] == list(range(4, 14))


CHILD = """
import sys
from infervisor.chain import EventDraft, SqliteChain
chain = SqliteChain.open(sys.argv[1], "node-a")
event = chain.append(EventDraft(ts_ns=1, source="operator", kind="k", subject="s", payload=b"{}"))
print(event.seq, event.hash_hex(), flush=True)
sys.stdin.read()
"""


def test_an_acknowledged_append_survives_sigkill(db: Path) -> None:
    args = [sys.executable, "-c", CHILD, str(db)]
    with subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        seq, digest = child.stdout.readline().split()
        child.kill()
    assert child.returncode == -9
    with SqliteChain.open(db, "node-a") as chain:
        assert chain.head().seq == int(seq) == 4
        assert chain.head().hash_hex() == digest
    assert verify_chain(db).ok


WRITER = """
import sys
from infervisor.chain import EventDraft, SqliteChain
path, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
with SqliteChain.open(path, "node-a") as chain:
    print("ready", flush=True)
    sys.stdin.readline()
    for i in range(count):
        chain.append(EventDraft(ts_ns=i, source=name, kind="k", subject=name, payload=b"%d" % i))
"""


def test_two_writer_processes_cannot_fork_the_chain(tmp_path: Path) -> None:
    path = tmp_path / "chain.db"
    SqliteChain.open(path, "node-a").close()
    with contextlib.ExitStack() as stack:
        writers = [
            stack.enter_context(
                subprocess.Popen(
                    [sys.executable, "-c", WRITER, str(path), name, "200"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
            for name in ("w1", "w2")
        ]
        for writer in writers:
            assert writer.stdout is not None
            assert writer.stdout.readline() == "ready\n"
        for writer in writers:  # release both before waiting for either
            assert writer.stdin is not None
            writer.stdin.write("go\n")
            writer.stdin.flush()
        for writer in writers:
            writer.communicate()
            assert writer.returncode == 0
    report = verify_chain(path)
    assert (report.ok, report.events) == (True, 401)
    with SqliteChain.open_readonly(path) as chain:
        for name in ("w1", "w2"):
            assert [e.payload for e in chain.events(subject=name)] == [
                b"%d" % i for i in range(200)
            ]


STEPPER = """
import sys
from infervisor.chain import EventDraft, SqliteChain
with SqliteChain.open(sys.argv[1], "node-a") as chain:
    for line in sys.stdin:
        event = chain.append(EventDraft(ts_ns=0, source="t", kind="k", subject="s", payload=b"{}"))
        print(event.seq, flush=True)
"""


def test_writers_taking_turns_each_read_the_head_afresh(db: Path) -> None:
    with contextlib.ExitStack() as stack:
        args = [sys.executable, "-c", STEPPER, str(db)]
        writers = [
            stack.enter_context(
                subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            )
            for _ in range(2)
        ]
        seqs = [step(writers[turn % 2]) for turn in range(20)]
        for writer in writers:
            writer.communicate()
    assert seqs == list(range(4, 24))
    assert verify_chain(db).events == 24


def step(writer: subprocess.Popen[str]) -> int:
    assert writer.stdin is not None
    assert writer.stdout is not None
    writer.stdin.write("append\n")
    writer.stdin.flush()
    return int(writer.stdout.readline())


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)  # the canonical form's range
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
payload_dicts = st.dictionaries(st.text(max_size=10), json_values, max_size=5)
texts = st.text(min_size=1, max_size=12).filter(lambda text: text != GENESIS_KIND)


def same_json(a: object, b: object) -> bool:
    """Equal as JSON values: a float equals the number its canonical digits read back as
    (RFC 8785 writes 2.0**63 as 9223372036854776000, which reads back as an int)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(b, float) and type(a) in (int, float):
        return float(a) == b
    return type(a) is type(b) and a == b


@settings(max_examples=40, deadline=None)
@given(
    payloads=st.lists(payload_dicts, min_size=1, max_size=6),
    kind=texts,
    subject=st.text(max_size=12),
)
def test_payloads_round_trip_and_the_chain_reverifies(
    payloads: list[dict[str, object]], kind: str, subject: str
) -> None:
    drafts = [
        EventDraft(
            ts_ns=NOW + i, source="operator", kind=kind, subject=subject, payload=encode_payload(p)
        )
        for i, p in enumerate(payloads)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "chain.db"
        with SqliteChain.open(path, "node-a", now_ns=lambda: NOW) as chain:
            stored = chain.append_many(drafts)
        with SqliteChain.open_readonly(path) as reader:
            read = list(reader.events(after=0))
        report = verify_chain(path)
    assert read == stored
    assert [e.payload for e in read] == [encode_payload(p) for p in payloads]
    assert all(
        same_json(msgspec.json.decode(e.payload), p) for e, p in zip(read, payloads, strict=True)
    )
    assert (report.ok, report.head_hash) == (True, stored[-1].hash_hex())
    memory = MemoryChain("node-a", now_ns=lambda: NOW)
    assert memory.append_many(drafts) == stored
