"""Operator verbs against a running node: the command line as a client of the HTTP API
(status, start, stop, restart, unload, place; bad input; an adopted server; help).
The helpers and the ``start_node`` fixture here serve the other files of the
operator's commands: test_operator_follow.py (watch, status -w, logs -f),
test_operator_listeners.py (the socket, TCP with tokens) and
test_operator_shutdown.py (verbs in flight and the node's shutdown).

``infervisor run`` runs as a real process with the fake llama-protocol server
(see test_run_resume.py). The verbs run the CLI's click group in this process
(support.cli_here: the same commands, exit statuses and output, against the
same real node over its socket, without a process start of about 0.6 s of CPU
each); the console script itself runs where a process is what is checked, and
once per kind of run (a verb, a usage error, ``run``, ``--version``).
``ApiClient`` reads the node directly where only the node is checked.
Synchronisation is by condition and deadline, never by sleeping.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import PROGRAMS, cli_here, wait_until
from test_run_resume import (
    DEADLINE_S,
    NodeRun,
    cli,
    end_runs,
    put_model,
    write_config,
)

from infervisor.adapters.ports import free_port
from infervisor.replay.views import InstanceView
from infervisor.tools.api.client import SOCKET_FILE, ApiClient
from infervisor.tools.api.errors import NodeStopping, NodeUnavailable, VerbFailed

NO_NODE = "no node is running on"
FALLBACK = "no node running; state replayed from the chain"


# ---------------------------------------------------------------- helpers
class Started:
    """A running ``infervisor run``: its process, config, data_dir and instance ids."""

    def __init__(self, run: NodeRun, config: Path, data: Path, views: list[InstanceView]) -> None:
        self.run, self.config, self.data = run, config, data
        self.ids = {v.role: v.instance_id for v in views}


def live_views(data: Path) -> list[InstanceView] | None:
    """The node's instances, or None while no node takes requests there."""
    try:
        with ApiClient(data) as client:
            return client.list()
    except NodeUnavailable:
        return None


def role_of(views: list[InstanceView], role: str) -> InstanceView | None:
    return next((v for v in views if v.role == role), None)


def chat_in(data: Path, lifecycle: str) -> list[InstanceView] | None:
    """The views once chat is in ``lifecycle`` with a pid (``running``: and answering)
    and embed is placed."""
    views = live_views(data)
    if views is None or role_of(views, "embed") is None:
        return None
    chat = role_of(views, "chat")
    return views if chat is not None and chat.lifecycle == lifecycle and chat.pid else None


def chat_running(data: Path) -> list[InstanceView] | None:
    return chat_in(data, "running")


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def refused(result: subprocess.CompletedProcess[str], status: int, *needles: str) -> None:
    assert result.returncode == status, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr


def table(stdout: str) -> dict[str, list[str]]:
    """The rows of a status table by instance id, split on whitespace."""
    return {line.split()[0]: line.split() for line in stdout.splitlines()[1:] if line.strip()}


def status_json(where: Path, *instance: str) -> Any:
    return json.loads(ok(cli_here("status", where, *instance, "--json")))


def json_error(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(result.stdout)["error"]
    return body


@pytest.fixture
def start_node(tmp_path: Path, fake_llama: str) -> Iterator[Callable[..., Started]]:
    """Starts ``infervisor run`` (chat started, embed placed) and returns once it
    placed every instance; teardown ends what a failed test left running."""
    runs: list[NodeRun] = []
    data = tmp_path / "data"
    put_model(data)

    def start(
        extra: str = "", program: str = fake_llama, chat: str = "running", top: str = ""
    ) -> Started:
        config = write_config(tmp_path, program, top_extra=top)
        config.write_text(config.read_text() + extra)
        run = NodeRun(config, tmp_path / f"run-{len(runs) + 1}.log")
        runs.append(run)
        views = run.until(
            f"every instance placed, chat {chat}",
            lambda: "Ctrl-C or SIGTERM stops it" in run.output() and chat_in(data, chat),
        )
        return Started(run, config, data, views)

    yield start
    end_runs(runs, data / "chain.db")


def chain_sources(db: Path) -> list[tuple[str, str, str]]:
    """(kind, subject, source) of every event, in sequence order."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        rows = con.execute("SELECT kind, subject, source FROM events ORDER BY seq").fetchall()
    return [(k, s or "", src) for k, s, src in rows]


def last_of(db: Path, subject: str) -> tuple[int, str]:
    """(seq, hash hex) of the subject's last event in the chain."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        seq, digest = con.execute(
            "SELECT seq, hash FROM events WHERE subject = ? ORDER BY seq DESC LIMIT 1", (subject,)
        ).fetchone()
    return int(seq), bytes(digest).hex()


def event_at(db: Path, seq: int) -> tuple[str, str]:
    """(hash hex, subject) of event ``seq``."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        digest, subject = con.execute(
            "SELECT hash, subject FROM events WHERE seq = ?", (seq,)
        ).fetchone()
    return bytes(digest).hex(), subject


def head_of(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        return int(con.execute("SELECT max(seq) FROM events").fetchone()[0])


def answers(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def refused_as_stopping(data: Path) -> bool:
    """True once the node refuses verbs that change state (probed with an unknown id:
    refused as unknown before, so it changes nothing either way)."""
    try:
        with ApiClient(data) as client:
            client.start("nope")
    except NodeStopping:
        return True
    except VerbFailed:
        return False
    pytest.fail("a start of an unknown instance was accepted")


# ---------------------------------------------------------------- the operator's verbs
def test_status_stop_start_restart_unload_through_the_cli(
    start_node: Callable[..., Started],
) -> None:
    node = start_node()
    chat, embed, data = node.ids["chat"], node.ids["embed"], node.data
    db = data / "chain.db"

    lines = ok(cli_here("status", node.config)).splitlines()  # the config names the data_dir
    assert lines[0].split() == [
        "INSTANCE", "FLAVOR", "MODE", "STATE", "WANTED", "SINCE", "RESTARTS", "ENDPOINT",
        "MEM", "MiB",
    ]  # fmt: skip
    rows = table("\n".join(lines))
    assert rows[chat][1:5] == ["llamacpp", "managed", "running", "running"]
    assert rows[chat][5][-1] in "smhd" and rows[chat][5][:-1].isdigit()  # an age: 42s, 5m
    used, budget = rows[chat][6].split("/")
    assert used == "0" and (budget.isdigit() or budget == "-")
    assert rows[chat][7].startswith("http://127.0.0.1:")
    assert rows[embed][3:5] == ["loaded", "stopped"]
    views = status_json(data)
    assert [v["instance_id"] for v in views] == sorted([chat, embed])
    first_pid = status_json(data, chat)["pid"]
    assert isinstance(first_pid, int)
    one = ok(cli_here("status", data, chat))
    assert list(table(one.split("\n\n")[0])) == [chat]
    assert "endpoint   http://127.0.0.1:" in one  # the details of the one instance
    assert f"pid        {first_pid}" in one

    for verb in ("status", "stop", "start", "restart", "unload", "logs", "health"):
        # In this process (support.cli_here): the same command, without a process's start.
        refused(cli_here(verb, data, "nope"), 1, "no instance 'nope'", chat, embed)

    stopped = ok(cli("stop", data, chat, "--grace", "5"))
    assert f"{chat}: stopped (wanted stopped)" in stopped
    view = status_json(data, chat)
    assert (view["lifecycle"], view["desired"], view["pid"]) == ("stopped", "stopped", None)

    started = json.loads(ok(cli_here("start", data, chat, "--json")))
    assert started["desired"] == "running"
    assert started["lifecycle"] in ("starting", "running")
    assert started["seq"] >= started["last_seq"]
    node.run.until("chat running again", lambda: chat_running(data))
    second_pid = status_json(data, chat)["pid"]
    assert second_pid not in (None, first_pid)

    restarted = json.loads(ok(cli_here("restart", data, chat, "--json")))
    assert restarted["pid"] not in (None, second_pid)
    assert restarted["desired"] == "running"
    # The answer's seq and hash are the chain's, of the instance's last event then.
    assert event_at(db, restarted["seq"]) == (restarted["hash"], chat)

    unloaded = json.loads(ok(cli_here("unload", data, embed, "--json")))
    assert (unloaded["unloaded"], unloaded["seq"], unloaded["hash"]) == (embed, *last_of(db, embed))
    assert [v["instance_id"] for v in status_json(node.config)] == [chat]
    # Who did it: the socket peer's uid (SO_PEERCRED) is each verb's source.
    me = f"operator:uid={os.getuid()}({pwd.getpwuid(os.getuid()).pw_name})"
    sources = {(kind, subj): src for kind, subj, src in chain_sources(db)}
    for kind, subj in (
        ("instance.stop_requested", chat),
        ("instance.starting", chat),
        ("instance.unloaded", embed),
    ):
        assert sources[(kind, subj)] == me, (kind, subj)

    assert node.run.stop() == 0, node.run.output()
    assert not (data / SOCKET_FILE).exists()
    refused(cli_here("stop", node.config, chat), 3, f"{NO_NODE} {data}", "infervisor run CONFIG")
    fallback = cli_here("status", data)
    assert FALLBACK in fallback.stderr
    rows = table(ok(fallback))
    assert list(rows) == [chat]  # the unload is in the chain too
    assert rows[chat][3:5] == ["stopped", "running"]  # stopped by the shutdown, still wanted
    assert rows[chat][-1].endswith("/?")  # memory: resident unknown from the chain
    [replayed] = json.loads(ok(cli_here("status", data, "--json")))
    assert (replayed["instance_id"], replayed["lifecycle"]) == (chat, "stopped")
    refused(cli_here("status", data, embed), 1, f"no instance {embed!r}", chat)


def test_bad_input_exits_by_the_table_and_changes_nothing(
    start_node: Callable[..., Started], tmp_path: Path
) -> None:
    node = start_node()
    chat, data = node.ids["chat"], node.data
    db = data / "chain.db"
    head = head_of(db)

    cases: list[tuple[list[object], int, str, str | None]] = [
        (["stop", data, "nope"], 1, "unknown_instance", "INSTANCE"),
        (["start", data, "nope"], 1, "unknown_instance", "INSTANCE"),
        (["stop", data, chat, "--grace", "-1"], 2, "bad_value", "--grace"),
        (["stop", data, chat, "--grace", "nan"], 2, "bad_value", "--grace"),
        (["stop", data, chat, "--grace", "4000"], 2, "bad_value", "--grace"),
        (["stop", data], 2, "usage", "INSTANCE"),
        (["place", data, "--role", "x", "--flavor", "llamacpp"], 2, "bad_spec", "--port"),
        (["place", data, "--env", "NOVALUE", "--role", "x"], 2, "bad_value", "--env"),
        (["place", data, "--generation", "3", "--role", "x"], 2, "usage", "--generation"),
        (
            [
                "place",
                data,
                "--role",
                "x",
                "--flavor",
                "llamacpp",
                "--port",
                "9",
                "--model",
                "tiny",
                "--priority",
                "2000",
            ],
            2,
            "bad_spec",
            "--priority",
        ),
        (
            [
                *("place", data, "--role", "x", "--flavor", "mlx-lm", "--port", "9"),
                *("--model", "tiny", "--threads", "2"),
            ],
            2,
            "bad_spec",
            "--threads",
        ),
        (["status", "--url", "ftp://x"], 2, "bad_value", "--url"),
    ]
    for args, status, code, field in cases:
        result = cli_here(*args, "--json")
        assert result.returncode == status, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
        body = json_error(result)
        assert (body["code"], body["field"]) == (code, field), (args, body)

    # The console script itself for one case; the rest run the same command in this
    # process (support.cli_here): a CLI process costs about 0.4 s of CPU to start.
    refused(cli("logs", data, chat, "--stream", "both"), 2, "'both' is not one of")

    fragment = tmp_path / "typo.toml"
    fragment.write_text('role = "x"\nflavor = "llamacpp"\nport = 9\nmodell = "tiny"\n')
    result = cli_here("place", data, "--file", fragment, "--json")
    assert result.returncode == 2, result.stdout + result.stderr
    body = json_error(result)
    assert body["code"] == "bad_spec"
    assert "unknown key `modell`; did you mean `model`?" in body["message"]
    fragment.write_text('role = "x"\nflavor = "llamacp"\nport = 9\n')
    result = cli_here("place", data, "--file", fragment)
    refused(result, 2, "key `flavor`", "allowed: llamacpp, mlx-lm, ollama")
    fragment.write_text('[[instances]]\nrole = "a"\n[[instances]]\nrole = "b"\n')
    refused(cli_here("place", data, "--file", fragment), 2, "exactly one [[instances]] table")
    # The node refuses a spec it cannot take (its own check): a managed server beyond loopback.
    result = cli_here(
        "place", data, "--role", "x", "--flavor", "llamacpp", "--port", "9", "--model", "tiny",
        "--host", "10.1.2.3", "--json",
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert json_error(result)["code"] == "bad_spec"
    assert "loopback" in json_error(result)["message"]

    assert head_of(db) == head  # nothing was recorded
    assert status_json(data, chat)["lifecycle"] == "running"
    assert node.run.stop() == 0, node.run.output()


def test_place_from_flags_and_from_a_fragment(
    start_node: Callable[..., Started], tmp_path: Path
) -> None:
    node = start_node()
    data = node.data
    db = data / "chain.db"
    port = free_port()
    placed = json.loads(
        ok(
            cli_here(
                "place", data, "--role", "extra", "--flavor", "llamacpp", "--port", port,
                "--model", "tiny", "--env", "A=1", "--json",
            )
        )
    )  # fmt: skip
    iid = placed["instance_id"]
    assert placed["outcome"] == "applied"
    assert event_at(db, placed["seq"]) == (placed["hash"], iid)
    assert placed["instance"]["lifecycle"] == "loaded"

    fragment = tmp_path / "extra.toml"
    fragment.write_text(
        f'[[instances]]\nrole = "extra"\nflavor = "llamacpp"\nport = {port}\nmodel = "tiny"\n'
        'env = { A = "1" }\n'
    )
    again = ok(cli_here("place", data, "--file", fragment))  # the same spec: nothing recorded
    assert f"{iid}: unchanged" in again
    assert f"seq {placed['seq']} hash {placed['hash']}" in again

    ignored = json.loads(
        ok(cli_here("place", data, "--file", fragment, "--controller", "ctl", "--generation", "0",
               "--port", free_port(), "--json"))
    )  # fmt: skip
    assert ignored["outcome"] in ("applied", "ignored")
    assert node.run.stop() == 0, node.run.output()


def test_an_adopted_server_is_never_stopped(
    start_node: Callable[..., Started], tmp_path: Path
) -> None:
    port = free_port()
    outside = subprocess.Popen(
        [sys.executable, str(PROGRAMS / "fake_llama.py"), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: answers(port), DEADLINE_S, "the outside server listening")
        node = start_node(
            f'\n[[instances]]\nrole = "ext"\nflavor = "llamacpp"\nmode = "adopted"\n'
            f"port = {port}\nstart = false\n"
        )
        ext = node.ids["ext"]
        refused(cli_here("stop", node.data, ext), 1, "observes it and never stops it")
        assert ok(cli_here("unload", node.data, ext)) == f"{ext}: unloaded\n"
        assert outside.poll() is None  # forgotten, not stopped
        assert node.run.stop() == 0, node.run.output()
    finally:
        outside.kill()
        outside.wait()


# ---------------------------------------------------------------- help
@pytest.mark.parametrize(
    "verb", ["status", "start", "stop", "restart", "unload", "place", "logs", "watch", "health"]
)
def test_each_verb_teaches_its_arguments_and_exit_statuses(verb: str) -> None:
    text = " ".join(ok(cli_here(verb, "--help")).split())
    for needle in (
        "WHERE",
        ".toml",
        "--url",
        "--token-file FILE",
        "INFERVISOR_URL",
        "Exit 0",
        "Exit status (every command)",
    ):
        assert needle in text, f"{verb} --help lacks {needle!r}: {text}"
    if verb not in ("logs",):
        assert "--json" in text
    if verb == "stop":
        assert "--grace SECONDS" in text


def test_version() -> None:
    from infervisor.actors.node import VERSION

    assert ok(cli("--version")) == f"infervisor {VERSION}\n"
