"""Forensics: triggers checked by their SQL, the decoded views, docs/forensics.md, `events`,
and offline reads that verify in the same pass.

The views and the documented queries run on a chain made by a real scenario:
a node (manual clock) supervising tests/programs/exit_at_once.py, which crashes
at start until the restart budget is spent; the operator then stops it.
"""

from __future__ import annotations

import csv
import io
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils
from click.testing import CliRunner, Result
from conftest import NodeFactory
from support import wait_until
from test_cli import CHAT, IDLE, NODE, TAMPERED_SEQ, build_chain, tamper
from test_misbehaving_servers import count, restart_at_its_time, rig, wait_kind

from infervisor.actors.clock import ManualClock
from infervisor.chain import ChainFormatError, SqliteChain
from infervisor.chain.errors import ChainTampered
from infervisor.chain.schema import TRIGGERS, VIEWS
from infervisor.replay import RestartPolicy, timeline
from infervisor.tools.cli import cli

DOC = Path(__file__).parents[1] / "docs" / "forensics.md"
SQL_BLOCK = re.compile(r"```sql\n(.*?)```", re.DOTALL)


def invoke(*args: object) -> Result:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return build_chain(tmp_path / "chain.db")


@pytest.fixture
def scenario(
    nodes: NodeFactory, tmp_path: Path, fake_model: Path, manual_clock: ManualClock
) -> tuple[Path, str]:
    """A real node's chain: crash at start, one restart, budget spent, operator stop."""
    policy = RestartPolicy(max_restarts=1, base_s=1.0, cap_s=1.0, stable_after_s=30.0)
    r = rig(nodes, tmp_path, fake_model, manual_clock, "exit_at_once.py", restart=policy)
    r.node.start(r.iid)
    wait_kind(r.node, r.iid, "restart_scheduled", 1)
    restart_at_its_time(r, 1.0, starts_before=1)
    wait_until(lambda: r.status().lifecycle == "failed", 20, "failed")
    r.node.stop(r.iid)
    assert count(r.node, r.iid, "stop_requested") == 1
    r.node.shutdown()
    return r.node.settings.chain_path, r.iid


# ---------------------------------------------------------------- triggers by their SQL
def replace_trigger(path: Path, name: str, body: str = "SELECT 1;") -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(f"DROP TRIGGER {name}")
        conn.execute(f"CREATE TRIGGER {name} BEFORE UPDATE ON events BEGIN {body} END")
    finally:
        conn.close()


@pytest.mark.parametrize("name", sorted(TRIGGERS))
def test_a_do_nothing_trigger_under_the_right_name_is_refused_on_open(db: Path, name: str) -> None:
    replace_trigger(db, name)
    with pytest.raises(ChainFormatError, match=rf"altered \['{name}'\]"):
        SqliteChain.open(db, NODE)


def test_a_dropped_trigger_and_an_added_one_are_refused(db: Path) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("DROP TRIGGER events_append_only_delete")
    conn.execute("CREATE TRIGGER sneaky AFTER INSERT ON events BEGIN SELECT 1; END")
    conn.close()
    with pytest.raises(ChainFormatError) as caught:
        SqliteChain.open(db, NODE)
    assert "missing ['events_append_only_delete']" in str(caught.value)
    assert "not ours ['sneaky']" in str(caught.value)


def test_the_triggers_are_compared_modulo_whitespace(db: Path) -> None:
    name, sql = "events_append_only_update", TRIGGERS["events_append_only_update"]
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(f"DROP TRIGGER {name}")
    conn.execute("\n\n   ".join(sql.split()))
    conn.close()
    SqliteChain.open(db, NODE).close()


def test_a_node_refuses_to_resume_on_a_chain_whose_trigger_was_replaced(
    nodes: NodeFactory, tmp_path: Path, fake_model: Path, fake_llama: str
) -> None:
    settings = nodes.settings(fake_llama, fake_model)
    nodes.open(settings).shutdown()
    replace_trigger(settings.chain_path, "events_append_only_update")
    # The boot check finds it, as every reader does (stop 34: the open's
    # ChainFormatError made `run` exit 2, for usage).
    with pytest.raises(ChainTampered, match="altered"):
        nodes.open(settings)


def test_run_refuses_to_resume_on_a_chain_whose_trigger_was_replaced(
    tmp_path: Path, fake_llama: str
) -> None:
    from test_run_resume import cli as run_cli
    from test_run_resume import put_model, write_config

    data = tmp_path / "data"
    put_model(data)
    config = write_config(tmp_path, fake_llama)
    build_chain(data / "chain.db")  # node n1's chain, as a run would have left it
    replace_trigger(data / "chain.db", "events_append_only_update")
    before = (data / "chain.db").read_bytes()
    result = run_cli("run", config, timeout=60)
    assert result.returncode == 1, result.stderr  # a finding about the chain (stop 34)
    assert "events_append_only_update" in result.stderr
    assert (data / "chain.db").read_bytes() == before


# ---------------------------------------------------------------- views
def test_views_exist_on_a_new_chain_and_are_added_to_an_old_one_on_open(db: Path) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    for name in VIEWS:
        conn.execute(f"DROP VIEW {name}")
    conn.execute("DROP INDEX events_ts")
    conn.close()
    SqliteChain.open_readonly(db).close()  # a reader never changes the file
    conn = sqlite3.connect(db)
    assert not conn.execute("SELECT name FROM sqlite_master WHERE type = 'view'").fetchall()
    conn.close()
    SqliteChain.open(db, NODE).close()
    conn = sqlite3.connect(db)
    names = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'view'")}
    indexes = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    conn.close()
    assert names == set(VIEWS)
    assert {"events_ts", "events_source_seq", "events_subject_seq", "events_kind_seq"} <= indexes


def test_event_log_decodes_payloads_into_columns(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    rows = {r["seq"]: r for r in conn.execute("SELECT * FROM event_log")}
    conn.close()
    assert rows[2]["time"] == "2026-11-01T00:00:00.250Z"
    assert (rows[2]["instance"], rows[2]["kind"], rows[2]["who"]) == (
        CHAT,
        "instance.placed",
        "operator",
    )
    assert rows[2]["placed_by"] == NODE
    assert (rows[7]["exit_code"], rows[7]["reason"]) == (0, "stopped by operator")
    assert rows[6]["by_whom"] == "operator"
    assert rows[0]["time"] == "2026-10-31T23:59:59.999Z"  # 1 ns before: floor, not rounding


def test_the_views_agree_with_the_timeline_on_a_real_scenario(scenario: tuple[Path, str]) -> None:
    path, iid = scenario
    conn = sqlite3.connect(path)
    got = conn.execute(
        "SELECT seq, from_state, to_state FROM transitions WHERE instance = ? ORDER BY seq",
        (iid,),
    ).fetchall()
    conn.close()
    want = [
        (e.seq, None if e.frm == "-" else e.frm, None if e.to == "-" else e.to)
        for e in timeline(path, iid)
    ]
    assert got == want
    assert ("failed", "stopped") in {(f, t) for _, f, t in got}


def test_sqlite_utils_reads_the_decoded_views(scenario: tuple[Path, str]) -> None:
    path, iid = scenario
    database = sqlite_utils.Database(path)
    assert set(VIEWS) <= set(database.view_names())
    rows = list(database["event_log"].rows_where("instance = ?", [iid], order_by="seq"))
    assert rows[0]["kind"] == "instance.placed"
    assert all(isinstance(r["time"], str) and r["time"].endswith("Z") for r in rows)
    exits = [r for r in rows if r["kind"] == "instance.exited"]
    assert exits
    assert all(r["exit_code"] == 3 for r in exits[:2])  # exit_at_once.py exits 3
    assert all(isinstance(r["payload"], str) for r in rows)  # text, not a blob
    failed = list(database["transitions"].rows_where("to_state = 'failed'"))
    assert [r["instance"] for r in failed] == [iid]
    database.close()


def test_every_query_in_the_forensics_doc_runs_on_a_real_chain(scenario: tuple[Path, str]) -> None:
    path, _ = scenario
    queries = SQL_BLOCK.findall(DOC.read_text())
    assert len(queries) >= 5
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    results = []
    try:
        for query in queries:
            results.append([dict(r) for r in conn.execute(query, {"instance": "chat"})])
    finally:
        conn.close()
    assert any(results), "no documented query found anything in the scenario's chain"


# ---------------------------------------------------------------- events
def test_events_prints_a_table_of_every_event(db: Path) -> None:
    result = invoke("events", db)
    assert result.exit_code == 0, result.output
    head, *lines = result.stdout.splitlines()
    assert head.split() == ["SEQ", "TIME", "INSTANCE", "KIND", "SOURCE", "FROM", "TO", "REASON"]
    assert len(lines) == 10
    stop = next(line for line in lines if "instance.stop_requested" in line)
    assert "running" in stop
    assert "stopping" in stop
    assert "stop by operator" in stop


@pytest.mark.parametrize(
    ("args", "seqs"),
    [
        (["--instance", CHAT], [2, 3, 4, 5, 6, 7]),
        (["--instance", "embed"], [8]),  # a role names one instance
        (["--kind", "instance.exited"], [7]),
        (["--kind", "exited", "--kind", "placed"], [2, 7, 8]),
        (["--source", "supervisor"], [5]),
        (["--since", "2026-11-01T00:00:01.500Z"], [7, 8, 9]),
        (["--until", "2026-11-01T00:00:00.250Z"], [0, 1, 2]),
        (["--grep", "STOPPED BY"], [7]),
        (["--instance", CHAT, "--source", "operator", "--kind", "starting"], [3]),
        (["--kind", "node.*"], [1, 9]),  # a prefix: every kind under it (stop 32)
        (["--kind", "instance.*", "--instance", "embed"], [8]),
        (["--kind", "chain.*", "--kind", "exited"], [0, 7]),
    ],
)
def test_events_filters(db: Path, args: list[str], seqs: list[int]) -> None:
    result = invoke("events", "--jsonl", *args, db)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["seq"] for r in rows] == seqs


def test_events_jsonl_and_csv_carry_the_same_rows(db: Path) -> None:
    rows = [json.loads(line) for line in invoke("events", "--jsonl", db).stdout.splitlines()]
    table = list(csv.DictReader(io.StringIO(invoke("events", "--csv", db).stdout)))
    assert [int(r["seq"]) for r in table] == [r["seq"] for r in rows]
    exited = next(r for r in rows if r["kind"] == "instance.exited")
    assert (exited["from"], exited["to"], exited["exit_code"]) == ("stopping", "stopped", 0)
    assert exited["time"] == "2026-11-01T00:00:01.500Z"
    assert next(r for r in table if r["seq"] == "7")["to"] == "stopped"
    assert invoke("events", "--jsonl", "--csv", db).exit_code == 2


def test_events_of_an_unknown_instance_or_a_bad_time_are_refused(db: Path) -> None:
    assert invoke("events", "--instance", "nope", db).exit_code == 1
    assert invoke("events", "--since", "last tuesday", db).exit_code == 2


@pytest.mark.parametrize("kind", ["residency.", "residency", "*", ".*", "resi*.*", "nope.*"])
def test_a_kind_that_names_no_kind_nor_a_prefix_of_one_is_refused(db: Path, kind: str) -> None:
    """Only ``PREFIX.*`` is a prefix (``--help`` and docs/forensics.md say so)."""
    result = invoke("events", "--kind", kind, db)
    assert result.exit_code == 2, result.output
    assert "--kind" in result.output and "residency.*" in result.output


# ---------------------------------------------------------------- offline reads verify
@pytest.fixture
def tampered(db: Path) -> Path:
    return tamper(
        db,
        f"UPDATE events SET payload = CAST(replace(CAST(payload AS TEXT), '4242', '4243') "
        f"AS BLOB) WHERE seq = {TAMPERED_SEQ}",
    )


@pytest.mark.parametrize(
    "command",
    [["timeline", "{db}", CHAT], ["status", "{db}"], ["events", "{db}"], ["replay", "{db}"]],
    ids=["timeline", "status", "events", "replay"],
)
def test_offline_reads_refuse_a_chain_that_does_not_verify(
    tampered: Path, command: list[str]
) -> None:
    args = [a.format(db=tampered) for a in command]
    result = invoke(*args)
    assert result.exit_code == 1
    assert f"seq {TAMPERED_SEQ}: payload altered" in result.stderr
    assert "--unverified" in result.stderr
    assert result.stdout == ""
    as_json = invoke(*args, "--json") if command[0] != "events" else invoke(*args, "--jsonl")
    if command[0] != "events":
        assert json.loads(as_json.stdout)["error"]["code"] == "chain_invalid"


@pytest.mark.parametrize(
    ("command", "key"),
    [(["timeline", "{db}", CHAT], list), (["status", "{db}"], list), (["replay", "{db}"], dict)],
    ids=["timeline", "status", "replay"],
)
def test_offline_reads_unverified_are_marked_in_text_and_json(
    tampered: Path, command: list[str], key: type[Any]
) -> None:
    args = [a.format(db=tampered) for a in command]
    text = invoke(*args, "--unverified")
    assert text.exit_code == 0, text.output
    assert text.stdout.startswith(f"UNVERIFIED: {tampered} does not verify (seq {TAMPERED_SEQ}")
    doc = json.loads(invoke(*args, "--unverified", "--json").stdout)
    assert doc["verified"] is False
    assert doc["problem"]["seq"] == TAMPERED_SEQ
    assert isinstance(doc["answer"], key)


def test_events_unverified_is_marked(tampered: Path) -> None:
    result = invoke("events", "--unverified", tampered)
    assert result.exit_code == 0
    assert result.stdout.startswith("UNVERIFIED: ")
    rows = invoke("events", "--unverified", "--jsonl", tampered).stdout.splitlines()
    assert all(json.loads(r)["verified"] is False for r in rows)


def test_timeline_and_status_of_a_valid_chain_still_work(db: Path) -> None:
    assert invoke("timeline", db, CHAT).exit_code == 0
    status = invoke("status", "--json", db)
    assert status.exit_code == 0
    assert {r["instance_id"] for r in json.loads(status.stdout)} == {CHAT, IDLE}
