"""The command line as a contract: one exit-code table, one JSON schema per object,
``--json`` errors on stdout, bad values refused by flag name, long values cut,
instances named by role, and every chain reader taking a data directory, a
config file or the chain file.

Offline checks run on a chain built event by event (test_cli.build_chain);
the node's side runs a real ``infervisor run`` with the fake llama server
(test_operator_cli.start_node; the CLI is the HTTP API's client). Synchronisation
is by condition and deadline.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner
from support import cli_here
from test_cli import CHAT, IDLE, NOW, build_chain, spec, tamper
from test_operator_cli import Started, start_node  # noqa: F401 - a fixture
from test_run_resume import EXIT_DEADLINE_S, INFERVISOR, cli, put_model, write_config

from infervisor.chain import EventDraft, SqliteChain
from infervisor.replay import events as ev
from infervisor.replay import kind_of
from infervisor.replay.views import InstanceView
from infervisor.tools.api.exit_codes import CODES, MAX_VALUE, Exit, exit_for
from infervisor.tools.cli import cli as cli_group
from infervisor.tools.clikit.schemas import (
    ERROR_SCHEMA,
    INSTANCE_SCHEMA,
    PLACE_SCHEMA,
    SCHEMAS,
    TIMELINE_SCHEMA,
    VERB_SCHEMA,
    VERIFY_SCHEMA,
    InstanceRecord,
    PlaceRecord,
    TimelineRecord,
    VerbRecord,
)
from infervisor.tools.operator.progress import Progress
from infervisor.tools.operator.verbs import wait_running

DOC = Path(__file__).parents[1] / "docs" / "cli.md"

Run = subprocess.CompletedProcess[str]
VERBS = ("start", "stop", "restart", "unload")
CHAIN_READERS = ("status", "replay", "chain verify", "timeline")
OFFLINE_NULL = ("health", "health_reason", "status", "status_detail", "rss_bytes", "exposure")


# ---------------------------------------------------------------- a small JSON Schema validator
_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def validate(value: Any, schema: dict[str, Any], at: str = "$") -> None:
    """Raise AssertionError naming the first place VALUE breaks SCHEMA (the subset used)."""
    kinds = schema.get("type")
    if kinds is not None:
        names = [kinds] if isinstance(kinds, str) else kinds
        assert any(_TYPES[k](value) for k in names), f"{at}: {value!r} is not {names}"
    if "enum" in schema:
        assert value in schema["enum"], f"{at}: {value!r} not one of {schema['enum']}"
    if isinstance(value, dict) and "properties" in schema:
        missing = set(schema.get("required", ())) - set(value)
        assert not missing, f"{at}: missing {sorted(missing)}"
        if schema.get("additionalProperties") is False:
            extra = set(value) - set(schema["properties"])
            assert not extra, f"{at}: unexpected {sorted(extra)}"
        for key, sub in schema["properties"].items():
            if key in value:
                validate(value[key], sub, f"{at}.{key}")


def test_the_schemas_match_the_records_they_describe() -> None:
    assert set(INSTANCE_SCHEMA["properties"]) == set(InstanceRecord.__struct_fields__)
    assert set(INSTANCE_SCHEMA["required"]) == set(InstanceRecord.__struct_fields__)
    renamed = {"from" if f == "frm" else f for f in TimelineRecord.__struct_fields__}
    assert set(TIMELINE_SCHEMA["properties"]) == renamed
    assert set(VERB_SCHEMA["required"]) == set(VerbRecord.__struct_fields__)
    assert set(PLACE_SCHEMA["required"]) == set(PlaceRecord.__struct_fields__)


def test_docs_cli_md_holds_every_schema_and_code_as_the_code_has_them() -> None:
    doc = DOC.read_text()
    for name, schema in SCHEMAS.items():
        assert f"### {name}\n\n```json\n{json.dumps(schema, indent=2)}\n```" in doc, name
    for code, status in CODES.items():
        assert f"| `{code}` | {int(status)} |" in doc, code


# ---------------------------------------------------------------- helpers
def exits(result: Run, status: Exit) -> Run:
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result


def json_error(result: Run, code: str, field: str | None = None) -> dict[str, Any]:
    """The one JSON error object on stdout; its code gives the exit status."""
    error = json.loads(result.stdout)
    validate(error, ERROR_SCHEMA)
    body: dict[str, Any] = error["error"]
    assert body["code"] == code, body
    assert result.returncode == exit_for(code), (result.returncode, body)
    assert body["field"] == field
    assert "error: " in result.stderr.lower(), result.stderr
    return body


def on_a_terminal(*args: object) -> tuple[Run, str]:
    """Run the CLI with stderr on a pseudo-terminal: its result, and what the terminal got."""
    master, slave = pty.openpty()
    try:
        result = subprocess.run(
            [str(INFERVISOR), *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=slave,
            text=True,
            timeout=EXIT_DEADLINE_S,
            check=False,
        )
    finally:
        os.close(slave)
    chunks = []
    try:
        while chunk := os.read(master, 4096):
            chunks.append(chunk)
    except OSError:
        pass  # EIO: the terminal's other side is closed and everything was read
    finally:
        os.close(master)
    return result, b"".join(chunks).decode(errors="replace")


@pytest.fixture
def offline(tmp_path: Path, fake_llama: str) -> dict[str, Path]:
    """A chain (no node) named three ways: its data directory, its config, the file."""
    data = tmp_path / "data"
    put_model(data)
    db = build_chain(data / "chain.db")
    return {"dir": data, "config": write_config(tmp_path, fake_llama), "db": db}


def reader_args(command: str, where: Path) -> list[object]:
    args: list[object] = [*command.split(), where]
    return [*args, CHAT] if command == "timeline" else args


# ---------------------------------------------------------------- exit codes, offline
def test_every_code_has_an_exit_status_of_the_table() -> None:
    assert set(CODES.values()) <= set(Exit) - {Exit.OK}
    # 4: no_answer (a verb cut off); 141: stdout closed early (no code: nothing says it)
    assert {e.value for e in Exit} == {0, 1, 2, 3, 4, 141}


@pytest.mark.parametrize("command", [*CHAIN_READERS, *VERBS, "run", "demo"])
def test_each_commands_help_ends_with_the_exit_table(command: str) -> None:
    result = CliRunner().invoke(cli_group, [*command.split(), "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "Exit status (every command): 0 done or already so; 1 refused or invalid" in text
    assert "3 no node takes verbs there" in text


@pytest.mark.parametrize("command", CHAIN_READERS)
@pytest.mark.parametrize("how", ["dir", "config", "db"])
def test_every_chain_reader_takes_a_data_dir_a_config_or_the_chain(
    offline: dict[str, Path], command: str, how: str
) -> None:
    result = exits(cli_here(*reader_args(command, offline[how]), "--json"), Exit.OK)
    json.loads(result.stdout)


def test_exit_codes_without_a_node(offline: dict[str, Path], tmp_path: Path) -> None:
    data = offline["dir"]
    # The console script itself (a process of its own) for one verb and one usage
    # error; the rest run the same command in this process (support.cli_here).
    json_error(exits(cli("stop", data, CHAT, "--json"), Exit.NO_NODE), "no_node")
    exits(cli("frobnicate"), Exit.USAGE)
    for verb in VERBS:  # no node takes verbs: 3, also as one JSON object
        json_error(exits(cli_here(verb, data, CHAT, "--json"), Exit.NO_NODE), "no_node")
    exits(cli_here("status", data), Exit.OK)  # replayed from the chain
    json_error(
        exits(cli_here("status", data, "nope", "--json"), Exit.REFUSED),
        "unknown_instance",
        "INSTANCE",
    )
    json_error(
        exits(cli_here("timeline", data, "nope", "--json"), Exit.REFUSED),
        "unknown_instance",
        "INSTANCE",
    )
    json_error(exits(cli_here("status", data, "--frob", "--json"), Exit.USAGE), "usage")
    missing = tmp_path / "nowhere"
    for command in CHAIN_READERS:
        json_error(
            exits(cli_here(*reader_args(command, missing), "--json"), Exit.USAGE), "bad_path"
        )
    empty = tmp_path / "empty"
    empty.mkdir()
    # neither a node nor a chain there: WHERE names nothing, a usage error (stop 32)
    json_error(exits(cli_here("status", empty, "--json"), Exit.USAGE), "no_chain", "WHERE")
    json_error(
        exits(cli_here("status", empty, "--node", "--json"), Exit.USAGE), "no_chain", "WHERE"
    )
    json_error(exits(cli_here("replay", empty, "--json"), Exit.USAGE), "no_chain")
    tamper(offline["db"], "UPDATE events SET prev_hash = randomblob(32) WHERE seq = 5")
    verdict = json.loads(exits(cli_here("chain", "verify", data, "--json"), Exit.REFUSED).stdout)
    validate(verdict, VERIFY_SCHEMA)


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e400", "-1", "soon"])
def test_nan_infinity_and_bad_seconds_are_refused_by_flag_name(
    offline: dict[str, Path], value: str
) -> None:
    for args in (
        ["stop", offline["dir"], CHAT, "--grace", value],
        ["start", offline["dir"], CHAT, "--wait", "--timeout", value],
    ):
        flag = str(args[-2])
        result = exits(cli_here(*args, "--json"), Exit.USAGE)
        body = json_error(result, "bad_value", flag)
        assert f"'{flag}'" in body["message"] and "grace_s" not in body["message"]
        assert f"'{flag}'" in result.stderr
        assert "finite number of seconds" in result.stderr or "not a number" in result.stderr


def test_long_values_are_cut_in_messages(offline: dict[str, Path]) -> None:
    huge = "x" * 100_000
    for args in (
        ["timeline", offline["db"], huge],
        ["status", offline["dir"], huge],
        ["stop", offline["dir"], CHAT, "--grace", huge],
    ):
        result = exits(cli_here(*args, "--json"), Exit.REFUSED if args[0] != "stop" else Exit.USAGE)
        message = json.loads(result.stdout)["error"]["message"]
        assert len(message) < 2 * MAX_VALUE + 400, len(message)
        assert "x" * (MAX_VALUE - 1) + "…" in message  # the quote, then the cut value
        assert len(result.stderr) < 4 * MAX_VALUE + 800


# ---------------------------------------------------------------- schemas, offline
def test_status_json_from_the_chain_follows_the_instance_schema(offline: dict[str, Path]) -> None:
    records = json.loads(exits(cli_here("status", offline["dir"], "--json"), Exit.OK).stdout)
    assert [r["instance_id"] for r in records] == sorted([CHAT, IDLE])
    for record in records:
        validate(record, INSTANCE_SCHEMA)
        assert record["source"] == "chain"
        assert all(record[key] is None for key in OFFLINE_NULL)
        assert "" not in record.values()
    chat = json.loads(
        exits(cli_here("status", offline["config"], "chat", "--json"), Exit.OK).stdout
    )
    validate(chat, INSTANCE_SCHEMA)
    assert (chat["instance_id"], chat["role"], chat["pid"]) == (CHAT, "chat", None)
    assert chat["last_exit"]["exit_code"] == 0


def test_timeline_json_follows_its_schema_and_instances_are_named_by_role(
    offline: dict[str, Path],
) -> None:
    by_id = json.loads(exits(cli_here("timeline", offline["db"], CHAT, "--json"), Exit.OK).stdout)
    by_role = json.loads(
        exits(cli_here("timeline", offline["db"], "chat", "--json"), Exit.OK).stdout
    )
    assert by_id == by_role
    for entry in by_id:
        validate(entry, TIMELINE_SCHEMA)
    assert by_id[0]["from"] is None and by_id[0]["to"] == "loaded"
    assert "frm" not in by_id[0]


def test_a_role_of_several_instances_is_refused_naming_them(tmp_path: Path) -> None:
    db = tmp_path / "chain.db"
    twins = ["chat-aaaa-n1", "chat-bbbb-n1"]
    with SqliteChain.open(db, "n1", now_ns=lambda: NOW) as chain:
        for i, iid in enumerate(twins):
            placed = ev.Placed(spec=spec("chat", 18080 + i), placed_by="n1")
            chain.append(
                EventDraft(
                    ts_ns=NOW + i,
                    source="operator",
                    kind=kind_of(placed),
                    subject=iid,
                    payload=ev.encode_event(placed),
                )
            )
    for command in ("timeline", "status"):
        result = exits(cli_here(command, db, "chat", "--json"), Exit.REFUSED)
        body = json_error(result, "ambiguous_instance", "INSTANCE")
        assert all(iid in body["message"] for iid in twins)


# ---------------------------------------------------------------- against a running node
def test_the_contract_with_the_node_up_and_down(start_node: Callable[..., Started]) -> None:  # noqa: F811
    # The console script runs where a pipe or a terminal is what is checked; the
    # other commands run in this process (support.cli_here), against the same node.
    node = start_node()
    chat, embed, data = node.ids["chat"], node.ids["embed"], node.data

    up = json.loads(exits(cli_here("status", node.config, "--json"), Exit.OK).stdout)
    for record in up:
        validate(record, INSTANCE_SCHEMA)
        assert record["source"] == "node"
        assert "" not in record.values()

    # idempotent verbs: 0, "already", nothing recorded
    before = json.loads(exits(cli_here("status", data, chat, "--json"), Exit.OK).stdout)
    again = exits(cli_here("start", data, "chat"), Exit.OK)  # by role
    assert f"{chat}: already running (wanted running)" in again.stdout
    after = json.loads(exits(cli_here("status", data, chat, "--json"), Exit.OK).stdout)
    assert after["pid"] == before["pid"]
    assert after["last_seq"] == before["last_seq"]
    # placed, never started (loaded, wanted stopped): at rest as a stopped one is, so
    # its stop records nothing (stop 33's trial recorded loaded -> stopped)
    embed_before = json.loads(exits(cli_here("status", data, embed, "--json"), Exit.OK).stdout)
    stopped = exits(cli("stop", data, "embed", "--grace", "5"), Exit.OK)
    assert f"{embed}: already loaded (wanted stopped)" in stopped.stdout
    assert stopped.stdout.rstrip().endswith("; nothing recorded"), stopped.stdout
    assert stopped.stderr == ""  # no progress in a pipe
    again = exits(cli_here("stop", data, embed, "--json"), Exit.OK)
    validate(json.loads(again.stdout), VERB_SCHEMA)
    assert json.loads(again.stdout)["lifecycle"] == "loaded"
    assert json.loads(again.stdout)["last_seq"] == embed_before["last_seq"]

    # start --wait: answers once running; quiet in a pipe
    waited = exits(cli("start", data, "embed", "--wait", "--json"), Exit.OK)
    record = json.loads(waited.stdout)
    validate(record, VERB_SCHEMA)
    assert (record["lifecycle"], record["source"]) == ("running", "node")
    assert "\r" not in waited.stderr
    down = exits(cli_here("stop", data, "embed", "--grace", "5"), Exit.OK)
    assert f"{embed}: stopped (wanted stopped)" in down.stdout
    assert down.stderr == ""
    assert "already stopped" in exits(cli_here("stop", data, embed), Exit.OK).stdout

    # on a terminal: the grace counts down, the start shows its progress
    result, terminal = on_a_terminal("stop", data, "chat", "--grace", "5")
    assert result.returncode == 0 and f"{chat}: stopped" in result.stdout
    assert f"stopping {chat}: SIGKILL in 5 s" in terminal
    result, terminal = on_a_terminal("start", data, "chat", "--wait")
    assert result.returncode == 0 and f"{chat}: running" in result.stdout, terminal
    assert f"{chat}: starting" in terminal

    # refusals: 1, one JSON object on stdout (in this process: support.cli_here)
    json_error(
        exits(cli_here("stop", data, "nope", "--json"), Exit.REFUSED),
        "unknown_instance",
        "INSTANCE",
    )
    json_error(
        exits(cli_here("stop", data, chat, "--grace", "inf", "--json"), Exit.USAGE),
        "bad_value",
        "--grace",
    )

    assert node.run.stop() == 0, node.run.output()
    offline = json.loads(exits(cli_here("status", data, "--json"), Exit.OK).stdout)
    assert [r["instance_id"] for r in offline] == [r["instance_id"] for r in up]
    for live, replayed in zip(up, offline, strict=True):
        validate(replayed, INSTANCE_SCHEMA)
        assert set(replayed) == set(live)  # one shape, node up or down
        assert replayed["source"] == "chain"
        assert all(replayed[key] is None for key in OFFLINE_NULL)
    json_error(exits(cli_here("stop", data, chat, "--json"), Exit.NO_NODE), "no_node")
    for verb in VERBS:
        json_error(exits(cli_here(verb, data, chat, "--json"), Exit.NO_NODE), "no_node")


# ---------------------------------------------------------------- start --wait, its failure
def view(lifecycle: str, seq: int, reason: str = "") -> InstanceView:
    fields: dict[str, object] = {name: None for name in InstanceView.__struct_fields__}
    fields.update(
        instance_id="chat-1", adapter="infer.llamacpp", placed_by="n1", generation=0,
        role="chat", flavor="llamacpp", mode="managed", endpoint="http://127.0.0.1:1",
        lifecycle=lifecycle, desired="running", reason=reason, since_ns=0, restarts=0,
        health="", health_reason="", status="", reserved_bytes=0, exposure="loopback",
        last_seq=seq, oom_kills=0, on_demand=False, priority=0, pinned=False,
        resting=False, busy=False, rest_reason="", refusals_folded=0, embeddings=False,
    )  # fmt: skip
    converted: InstanceView = msgspec.convert(fields, InstanceView)
    return converted


class Polled:
    """Answers status with the next view of a script."""

    def __init__(self, *views: InstanceView) -> None:
        self.views = list(views)

    def status(self, instance: str) -> InstanceView:
        return self.views.pop(0)


def test_start_wait_exits_1_with_the_reason_when_the_start_fails(
    capsys: pytest.CaptureFixture[str],
) -> None:
    client = Polled(view("starting", 5), view("restarting", 7, "exit code 1: bad magic"))
    with pytest.raises(SystemExit) as ended:
        wait_running(client, view("starting", 4), 60.0, Progress())  # type: ignore[arg-type]
    assert ended.value.code == Exit.REFUSED
    err = capsys.readouterr().err
    assert "chat-1 did not start: restarting: exit code 1: bad magic" in err
    assert "\r" not in err  # not a terminal: no progress


def test_start_wait_answers_once_running() -> None:
    client = Polled(view("starting", 5), view("running", 6, "serving"))
    done = wait_running(client, view("starting", 4), 60.0, Progress())  # type: ignore[arg-type]
    assert (done.lifecycle, client.views) == ("running", [])
