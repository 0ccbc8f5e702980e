"""The ``infervisor`` command line: help, chain verify, replay, timeline.

Chains are built by appending typed events directly (no node, no server).
In-process runs use click's CliRunner; exit statuses of the real console
script are checked with subprocesses. Bad input never prints a traceback.
"""

from __future__ import annotations

import itertools
import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner, Result
from support import cli_here

from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.chain import EventDraft, SqliteChain
from infervisor.replay import events as ev
from infervisor.replay import kind_of
from infervisor.tools.cli import cli

INFERVISOR = Path(sys.executable).parent / "infervisor"
NOW = 1_793_491_200_000_000_000  # 2026-11-01 00:00:00 UTC
NODE = "n1"
CHAT = "chat-0123abcd-n1"
IDLE = "embed-4567ef01-n1"
TAMPERED_SEQ = 4
#: CHAT's transitions, in order, as the timeline shows them.
CHAT_PATH = [
    ("-", "loaded"),
    ("loaded", "starting"),
    ("starting", "starting"),
    ("starting", "running"),
    ("running", "stopping"),
    ("stopping", "stopped"),
]


def spec(role: str, port: int) -> dict[str, object]:
    built: dict[str, object] = msgspec.to_builtins(
        InstanceSpec(role=role, flavor=Flavor.LLAMACPP, model="tiny", port=port)
    )
    return built


def build_chain(path: Path) -> Path:
    """Node n1: CHAT placed, started, serving, stopped by the operator; IDLE only placed."""
    ticks = itertools.count(NOW, 250_000_000)
    with SqliteChain.open(path, NODE, now_ns=lambda: NOW - 1) as chain:

        def put(subject: str, event: ev.Event, source: str = "operator") -> None:
            chain.append(
                EventDraft(
                    ts_ns=next(ticks),
                    source=source,
                    kind=kind_of(event),
                    subject=subject,
                    payload=ev.encode_event(event),
                )
            )

        put("", ev.NodeStarted(pid=100, boot_id="boot-1", version="0.1.0"), "node")
        put(CHAT, ev.Placed(spec=spec("chat", 18080), placed_by=NODE))
        put(CHAT, ev.Starting(by="operator", reset_budget=True))
        put(CHAT, ev.Spawned(pid=4242, pgid=4242, start_time=1.5, boot_id="boot-1", argv=["s"]))
        put(CHAT, ev.Ready(detail="serving"), "supervisor")
        put(CHAT, ev.StopRequested(by="operator", grace_s=5.0))
        put(CHAT, ev.Exited(pid=4242, exit_code=0, signal=None, reason="stopped by operator"))
        put(IDLE, ev.Placed(spec=spec("embed", 18081), placed_by=NODE))
        put("", ev.NodeStopped(reason="test over"), "node")
    return path


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return build_chain(tmp_path / "chain.db")


def tamper(path: Path, sql: str) -> Path:
    """Edit the chain as whoever holds the file: drop the append-only triggers first."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'"):
            conn.execute(f'DROP TRIGGER "{name}"')
        assert conn.execute(sql).rowcount == 1, f"no row changed by {sql}"
    finally:
        conn.close()
    return path


@pytest.fixture
def tampered(db: Path) -> Path:
    """The pid in seq 4 changed: verification must name seq 4, payload altered."""
    return tamper(
        db,
        f"UPDATE events SET payload = CAST(replace(CAST(payload AS TEXT), '4242', '4243') "
        f"AS BLOB) WHERE seq = {TAMPERED_SEQ}",
    )


def invoke(*args: object) -> Result:
    """Run the CLI in-process; an exception other than exiting is a bug."""
    result = CliRunner().invoke(cli, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def script(*args: object) -> subprocess.CompletedProcess[str]:
    """Run the installed console script."""
    result = subprocess.run(
        [str(INFERVISOR), *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def here(*args: object) -> subprocess.CompletedProcess[str]:
    """The same command in this process (support.cli_here: no process start of
    about 0.6 s of CPU); an exception other than exiting is a bug."""
    result = cli_here(*args)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def words(text: str) -> str:
    return " ".join(text.split())


# ---------------------------------------------------------------- help
@pytest.mark.parametrize(
    ("command", "teaches"),
    [
        ([], ["run", "chain", "replay", "timeline", "demo", "infervisor demo"]),
        (["run"], ["CONFIG", "SIGINT, SIGTERM or SIGHUP", "examples/node.toml"]),
        (["chain"], ["verify"]),
        (["chain", "verify"], ["WHERE", "--json", "Exit 0 when valid", "sequence number", ".toml"]),
        (["replay"], ["WHERE", "--json", "verified in the same pass", "--unverified", ".toml"]),
        (["timeline"], ["WHERE", "INSTANCE", "--json", "before -> after", "role"]),
        (["demo"], ["--dir", "--json", "llama.cpp"]),
    ],
)
def test_help_exits_0_and_teaches_the_arguments(command: list[str], teaches: list[str]) -> None:
    result = invoke(*command, "--help")
    assert result.exit_code == 0
    text = words(result.output)
    for needle in teaches:
        assert needle in text, f"{command} --help lacks {needle!r}:\n{result.output}"


def test_the_console_script_answers_help_and_refuses_an_unknown_command() -> None:
    assert script("--help").returncode == 0
    assert script("-h").returncode == 0
    unknown = script("frobnicate")
    assert unknown.returncode == 2
    assert "frobnicate" in unknown.stderr


# ---------------------------------------------------------------- chain verify
def test_verify_exits_0_on_a_valid_chain(db: Path) -> None:
    result = here("chain", "verify", db)
    assert result.returncode == 0
    assert result.stdout.startswith(f"ok: 10 events, node {NODE}, head seq 9 ")


def test_verify_exits_1_naming_the_seq_and_reason(tampered: Path) -> None:
    result = here("chain", "verify", tampered)
    assert result.returncode == 1
    assert result.stdout.startswith(f"INVALID at seq {TAMPERED_SEQ}: payload altered: ")


def test_verify_names_a_broken_link(db: Path) -> None:
    tamper(db, "UPDATE events SET prev_hash = randomblob(32) WHERE seq = 5")
    result = invoke("chain", "verify", db)
    assert result.exit_code == 1
    assert "INVALID at seq 5: link broken" in result.output


@pytest.mark.parametrize("kind", ["missing", "not sqlite", "empty", "folder"])
def test_verify_exits_2_on_a_file_that_is_not_a_chain(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "chain.db"
    match kind:
        case "not sqlite":
            path.write_bytes(b"definitely not a database\n" * 200)
        case "empty":
            path.write_bytes(b"")
        case "folder":
            path.mkdir()
    result = here("chain", "verify", path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ")
    assert str(path) in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_verify_json_reports_ok_and_no_problem(db: Path) -> None:
    result = invoke("chain", "verify", "--json", db)
    assert result.exit_code == 0
    report = json.loads(result.stdout)  # stderr says what cannot be ruled out
    assert report["ok"] is True
    assert report["problem"] is None
    assert (report["events"], report["node"], report["head_seq"]) == (10, NODE, 9)


def test_verify_json_reports_the_problem(tampered: Path) -> None:
    result = invoke("chain", "verify", "--json", tampered)
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert report["ok"] is False
    assert report["problem"]["seq"] == TAMPERED_SEQ
    assert report["problem"]["reason"] == "payload altered"
    assert report["problem"]["detail"]


# ---------------------------------------------------------------- replay
def test_replay_prints_the_node_and_one_line_per_instance(db: Path) -> None:
    result = invoke("replay", db)
    assert result.exit_code == 0
    head, *lines = result.stdout.splitlines()
    assert head == f"node {NODE}: head seq 9, 1 boots, 2 instances"
    assert len(lines) == 2
    chat = next(line for line in lines if CHAT in line)
    idle = next(line for line in lines if IDLE in line)
    assert words(chat).split()[:4] == [CHAT, "stopped", "wanted", "stopped"]
    assert "stopped by operator" in chat
    assert words(idle).split()[:4] == [IDLE, "loaded", "wanted", "stopped"]
    # the trust policy's anchor line (issue 18): no witness, no saved checkpoint
    assert result.stderr == "unanchored: no checkpoint held outside this node\n"


def test_replay_json_is_the_node_state(db: Path) -> None:
    result = invoke("replay", "--json", db)
    assert result.exit_code == 0
    state = json.loads(result.stdout)
    assert (state["node_id"], state["head_seq"], state["boots"]) == (NODE, 9, 1)
    assert set(state["instances"]) == {CHAT, IDLE}
    chat = state["instances"][CHAT]
    assert (chat["lifecycle"], chat["desired"], chat["process"]) == ("stopped", "stopped", None)
    assert chat["last_exit"]["exit_code"] == 0
    assert chat["spec"]["port"] == 18080


def test_replay_of_a_chain_that_does_not_verify_is_refused_naming_the_seq(tampered: Path) -> None:
    result = invoke("replay", tampered)
    assert result.exit_code == 1
    assert f"does not verify: seq {TAMPERED_SEQ}: payload altered" in result.stderr
    assert "--unverified" in result.stderr
    assert result.stdout == ""


def test_replay_unverified_reads_it_as_stored_and_says_so(tampered: Path) -> None:
    result = invoke("replay", "--unverified", tampered)
    assert result.exit_code == 0
    first, head, *_ = result.stdout.splitlines()
    assert first.startswith("UNVERIFIED: ")
    assert f"seq {TAMPERED_SEQ}: payload altered" in first
    assert head.startswith(f"node {NODE}: head seq 9")
    assert "UNVERIFIED" in result.stderr
    report = json.loads(invoke("replay", "--unverified", "--json", tampered).stdout)
    assert report["verified"] is False
    assert (report["problem"]["seq"], report["problem"]["reason"]) == (4, "payload altered")
    assert report["answer"]["head_seq"] == 9
    assert report["answer"]["instances"][CHAT]["process"] is None  # stopped later


def test_replay_unverified_of_a_valid_chain_is_marked_verified(db: Path) -> None:
    report = json.loads(invoke("replay", "--unverified", "--json", db).stdout)
    assert (report["verified"], report["problem"]) == (True, None)
    assert invoke("replay", "--unverified", db).stdout.startswith("verified: ")


def test_replay_of_an_event_that_does_not_fit_exits_1_in_one_line(db: Path) -> None:
    tamper(db, "UPDATE events SET kind = 'instance.teleported' WHERE seq = 4")
    result = here("replay", db)
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: {db} does not verify: seq 4: header altered")
    result = here("replay", "--unverified", db)
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: {db} cannot be replayed: seq 4: ")
    assert "instance.teleported" in result.stderr
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    ("until", "head", "chat"),
    [
        ("5", 5, "running"),
        ("2026-11-01T00:00:01Z", 5, "running"),  # seq 5 is stamped 00:00:01.000 exactly
        ("2026-11-01T00:00:01.100+00:00", 5, "running"),
        ("2026-11-01 00:00:00.800", 4, "starting"),  # no offset: UTC
        ("2026-11-01T01:00:01.300+01:00", 6, "stopping"),
        ("3", 3, "starting"),
    ],
)
def test_replay_until_gives_the_state_at_that_point(
    db: Path, until: str, head: int, chat: str
) -> None:
    result = invoke("replay", "--json", "--until", until, db)
    assert result.exit_code == 0, result.output
    state = json.loads(result.stdout)
    assert state["head_seq"] == head
    assert state["instances"][CHAT]["lifecycle"] == chat
    assert IDLE not in state["instances"]  # placed at seq 8
    assert f"(replayed up to seq {head})" in invoke("replay", "--until", until, db).stdout


def test_replay_until_still_verifies_the_whole_chain(tampered: Path) -> None:
    result = invoke("replay", "--until", "2", tampered)  # the tampered row is after it
    assert result.exit_code == 1
    assert f"seq {TAMPERED_SEQ}: payload altered" in result.stderr


def test_replay_until_refuses_what_is_neither_a_seq_nor_a_time(db: Path) -> None:
    result = invoke("replay", "--until", "yesterday", db)
    assert result.exit_code == 2
    assert "--until 'yesterday'" in result.stderr


def test_replay_of_a_missing_file_exits_2(tmp_path: Path) -> None:
    result = here("replay", tmp_path / "none.db")
    assert result.returncode == 2
    assert "no such chain file" in result.stderr


# ---------------------------------------------------------------- timeline
LINE = re.compile(
    r"^\s*(?P<seq>\d+) (?P<when>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z)"
    r"\s+(?P<frm>\S+) -> (?P<to>\S+)\s+(?P<reason>\S.*)$"
)


def test_timeline_prints_one_line_per_event(db: Path) -> None:
    result = invoke("timeline", db, CHAT)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), lines
    rows = [m for m in parsed if m is not None]
    assert [(m["frm"], m["to"]) for m in rows] == CHAT_PATH
    assert [int(m["seq"]) for m in rows] == [2, 3, 4, 5, 6, 7]
    assert rows[0]["when"] == "2026-11-01 00:00:00.250Z"
    assert "placed by n1" in rows[0]["reason"]
    assert "stop by operator" in rows[4]["reason"]


def test_timeline_json_has_the_same_entries(db: Path) -> None:
    result = invoke("timeline", "--json", db, CHAT)
    assert result.exit_code == 0
    entries = json.loads(result.stdout)
    path = [(e["from"] or "-", e["to"]) for e in entries]
    assert path == CHAT_PATH
    assert entries[0]["from"] is None  # nothing before the placement: null, not "-"
    assert entries[0]["kind"] == "instance.placed"
    assert all(e["reason"] for e in entries)


def test_timeline_of_an_unknown_instance_names_the_known_ones(db: Path) -> None:
    result = here("timeline", db, "chat-ffffffff-n1")
    assert result.returncode == 1
    assert "chat-ffffffff-n1" in result.stderr
    assert f"{CHAT} (chat), {IDLE} (embed)" in result.stderr
    assert result.stdout == ""


def test_an_unloaded_instance_keeps_its_timeline_by_id_and_by_role(db: Path) -> None:
    with SqliteChain.open(db, NODE) as chain:
        chain.append(
            EventDraft(
                ts_ns=NOW + 10**10,
                source="operator:uid=0(root)",
                kind="instance.unloaded",
                subject=IDLE,
                payload=ev.encode_event(ev.Unloaded(by="operator:uid=0(root)")),
            )
        )
    for name in (IDLE, "embed"):
        shown = invoke("timeline", db, name)
        assert shown.exit_code == 0, shown.output
        assert "unloaded by operator:uid=0(root)" in shown.stdout
        listed = invoke("events", db, "--instance", name)
        assert listed.exit_code == 0, listed.output
        assert "instance.unloaded" in listed.stdout


def test_timeline_of_a_missing_file_exits_2(tmp_path: Path) -> None:
    result = invoke("timeline", tmp_path / "none.db", CHAT)
    assert result.exit_code == 2
    assert "no such chain file" in result.stderr
