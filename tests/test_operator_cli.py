"""Operator verbs against a running node: the command line as a client of the HTTP API.

``infervisor run`` runs as a real process with the fake llama-protocol server
(see test_run_resume.py). The verbs run the CLI's click group in this process
(support.cli_here: the same commands, exit statuses and output, against the
same real node over its socket, without a process start of about 0.6 s of CPU
each); the console script itself runs where a process is what is checked (a
signal or Ctrl-C ending it, a pipe, the environment, a verb beside another),
and once per kind of run (a verb, a usage error, ``run``, ``--version``).
``ApiClient`` reads the node directly where only the node is checked.
The gate between verbs and the node's shutdown is checked against a real
``ApiServer`` serving a stub node whose stop blocks until the test lets it go.
Synchronisation is by condition and deadline, never by sleeping.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import threading
import types
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pytest
from support import PROGRAMS, cli_here, make_launcher, wait_until
from test_run_resume import (
    DEADLINE_S,
    EXIT_DEADLINE_S,
    INFERVISOR,
    NodeRun,
    cli,
    end_runs,
    ignores_sigterm,
    put_model,
    read_state,
    write_config,
)

from infervisor.actors.append_health import AppendStatus
from infervisor.actors.errors import UnknownInstance
from infervisor.adapters.ports import free_port
from infervisor.chain import SqliteChain
from infervisor.replay.views import InstanceView
from infervisor.tools.api.client import SOCKET_FILE, ApiClient
from infervisor.tools.api.errors import ApiError, NodeStopping, NodeUnavailable, VerbFailed
from infervisor.tools.api.server import SOCKET_FILE as SERVER_SOCKET_FILE
from infervisor.tools.api.server import ApiServer, check_socket_path

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


def test_the_shutdown_waits_for_an_operator_stop_and_a_second_signal_ends_it(
    start_node: Callable[..., Started], tmp_path: Path
) -> None:
    stubborn = make_launcher(tmp_path, PROGRAMS / "ignore_sigterm.py")  # never answers: starting
    node = start_node(program=stubborn, chat="starting")
    chat, data = node.ids["chat"], node.data
    pid = status_json(data, chat)["pid"]
    node.run.until("the server ignoring SIGTERM", lambda: ignores_sigterm(pid))
    with subprocess.Popen(
        [str(INFERVISOR), "stop", str(data), chat, "--grace", "300"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as operator:
        try:
            node.run.until("chat stopping", lambda: chat_in(data, "stopping"))  # by the API
            node.run.send(signal.SIGTERM)
            # Generous: on a loaded machine the shutdown's first steps can take a while.
            node.run.until("changes refused", lambda: refused_as_stopping(data), timeout=60)
            refused(cli_here("start", data, chat), 3, "shutting down")
            assert table(ok(cli_here("status", data)))[chat][3] == "stopping"  # reads go on
            assert operator.poll() is None  # the operator's stop holds the shutdown
            node.run.send(signal.SIGTERM)  # kills what is stopping: the operator's stop ends
            out, err = operator.communicate(timeout=EXIT_DEADLINE_S)
        finally:
            if operator.poll() is None:
                operator.kill()
    assert operator.returncode == 0, out + err
    assert f"{chat}: stopped (wanted stopped)" in out
    assert err == ""  # no progress in a pipe
    assert node.run.wait() == 0, node.run.output()
    state = read_state(data / "chain.db")
    assert state is not None
    stopped = state.instances[chat]
    assert (stopped.lifecycle, stopped.desired) == ("stopped", "stopped")  # the operator's stop
    assert stopped.last_exit is not None
    assert stopped.last_exit.signal == signal.SIGKILL


# ---------------------------------------------------------------- watch, logs, status -w
def read_lines(stream: Any, count: int, into: list[str]) -> Callable[[], bool]:
    """Read lines of ``stream`` on a thread into ``into``; the predicate: ``count`` read."""

    def reader() -> None:
        for line in stream:
            into.append(line)

    threading.Thread(target=reader, daemon=True).start()
    return lambda: len(into) >= count


def test_watch_prints_new_events_and_resumes_across_a_node_restart(
    start_node: Callable[..., Started],
) -> None:
    node = start_node()
    chat, data = node.ids["chat"], node.data
    db = data / "chain.db"

    everything = cli_here("watch", data, "--from-seq", "0", "--no-follow", "--json")
    events = [json.loads(line) for line in ok(everything).splitlines()]
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert events[0]["kind"] == "chain.genesis"
    text = ok(cli_here("watch", data, "--from-seq", "1", "--no-follow")).splitlines()
    assert text[0].startswith("[1] ")
    assert any(line.startswith("[") and f" {chat}: " in line for line in text)

    lines: list[str] = []
    with subprocess.Popen(
        [str(INFERVISOR), "watch", str(data), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as watcher:
        try:
            got = read_lines(watcher.stdout, 1, lines)

            def cycle() -> bool:  # until one lands after the watch connected
                ok(cli_here("stop", data, chat, "--grace", "5"))
                ok(cli_here("start", data, chat))
                return got()

            wait_until(cycle, DEADLINE_S, "the watch printing a new event")
            first = json.loads(lines[0])["seq"]
            assert first > events[-1]["seq"]  # nothing from before the head
            assert node.run.stop() == 0, node.run.output()
            restarted = NodeRun(node.config, node.run.log.with_name("run-again.log"))
            try:
                restarted.until("chat running again", lambda: chat_running(data))
                ok(cli_here("stop", data, chat, "--grace", "5"))
                final = head_of(db)
                wait_until(
                    lambda: lines and json.loads(lines[-1])["seq"] >= final,
                    DEADLINE_S,
                    "the watch reaching the new boot's events",
                )
                assert restarted.stop() == 0, restarted.output()
            finally:
                end_runs([restarted], db)
        finally:
            watcher.send_signal(signal.SIGINT)
            _, err = watcher.communicate(timeout=EXIT_DEADLINE_S)
    assert watcher.returncode == 0, err
    seqs = [json.loads(line)["seq"] for line in lines]
    assert seqs == list(range(first, first + len(seqs)))  # each once, none missed
    kinds = [json.loads(line)["kind"] for line in lines]
    assert "node.started" in kinds  # the second boot's, after the reconnection
    assert "reconnecting from seq" in err
    assert "reconnected" in err


def test_watch_exits_3_when_no_node_comes_back(tmp_path: Path) -> None:
    result = cli_here("watch", tmp_path, "--retry-for", "0.5", "--json")
    assert result.returncode == 3, result.stdout + result.stderr
    assert json_error(result)["code"] == "no_node"
    assert "--retry-for" in result.stderr


def test_status_watch_redraws_in_a_pipe_and_ctrl_c_ends_it(
    start_node: Callable[..., Started],
) -> None:
    node = start_node()
    chat, data = node.ids["chat"], node.data
    lines: list[str] = []
    with subprocess.Popen(
        [str(INFERVISOR), "status", str(data), "-w"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as watching:
        try:
            read_lines(watching.stdout, 1, lines)
            wait_until(lambda: any(chat in line for line in lines), DEADLINE_S, "a first table")
            ok(cli_here("stop", data, chat, "--grace", "5"))
            wait_until(
                lambda: any(line.split()[:4] == [chat, "llamacpp", "managed", "stopped"]
                            for line in lines if line.strip()),
                DEADLINE_S,
                "a table redrawn with chat stopped",
            )  # fmt: skip
        finally:
            watching.send_signal(signal.SIGINT)
            _, err = watching.communicate(timeout=EXIT_DEADLINE_S)
    assert watching.returncode == 0, err
    assert "\x1b[" not in "".join(lines)  # no screen control in a pipe
    assert "" in [line.strip() for line in lines]  # a blank line between the tables
    assert node.run.stop() == 0, node.run.output()


def test_logs_prints_the_captured_output_and_follows_it(
    start_node: Callable[..., Started],
) -> None:
    from infervisor.tools.api.logs import log_file

    node = start_node()
    chat, data = node.ids["chat"], node.data
    captured = log_file(data, chat, "stderr")
    with captured.open("ab") as out:  # what the server would have written
        out.write(b"first line of the server\n")
    printed = ok(cli_here("logs", data, "chat", "--tail", "4096"))
    assert printed.endswith("first line of the server\n")
    assert printed in captured.read_text(errors="replace")
    assert ok(cli_here("logs", data, chat, "--tail", "5")) == "rver\n"
    got: list[bytes] = []
    with subprocess.Popen(
        [str(INFERVISOR), "logs", str(data), chat, "-f", "--tail", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as following:
        try:
            assert following.stdout is not None
            stdout = following.stdout

            def reader() -> None:
                while chunk := stdout.read1(4096):
                    got.append(chunk)

            threading.Thread(target=reader, daemon=True).start()

            def appended() -> bool:  # until the follower is connected and sends it
                with captured.open("ab") as out:
                    out.write(b"more\n")
                return b"more" in b"".join(got)

            wait_until(appended, DEADLINE_S, "the follower printing what is appended")
            assert following.poll() is None  # follows until Ctrl-C
        finally:
            following.send_signal(signal.SIGINT)
            _, err = following.communicate(timeout=EXIT_DEADLINE_S)
    assert following.returncode == 0, err
    assert b"first line" not in b"".join(got)  # --tail 0: only what came after
    assert node.run.stop() == 0, node.run.output()


# ---------------------------------------------------------------- --url and tokens
def test_the_verbs_over_tcp_with_a_token(start_node: Callable[..., Started]) -> None:
    api_port = free_port()
    node = start_node(top=f'[api]\ntcp = "127.0.0.1:{api_port}"\ntokens = ["operator", "ctl"]\n')
    chat, data = node.ids["chat"], node.data
    url = f"http://127.0.0.1:{api_port}"
    tokens = data / "api-tokens.json"
    secret = json.loads(tokens.read_text())["operator"]

    rows = table(ok(cli_here("status", "--url", url, "--token", secret)))
    assert rows[chat][3] == "running"
    by_file = json.loads(
        ok(cli_here("status", "--url", url, "--token-file", tokens, chat, "--json"))
    )
    assert by_file["instance_id"] == chat
    bare = data.parent / "secret.txt"
    bare.write_text(secret + "\n")
    ok(cli_here("status", "--url", url, "--token-file", bare))
    env = {**os.environ, "INFERVISOR_URL": url, "INFERVISOR_TOKEN": secret}
    by_env = subprocess.run(
        [str(INFERVISOR), "stop", "chat", "--grace", "5", "--json"],
        capture_output=True, text=True, env=env, timeout=EXIT_DEADLINE_S, check=False,
    )  # fmt: skip
    assert by_env.returncode == 0, by_env.stdout + by_env.stderr
    assert json.loads(by_env.stdout)["lifecycle"] == "stopped"
    sources = {(k, s): src for k, s, src in chain_sources(data / "chain.db")}
    assert sources[("instance.stop_requested", chat)] == "operator:token=operator (scope operate)"

    # Refusals in this process (support.cli_here): the same command, no process start.
    wrong = cli_here("status", "--url", url, "--token", "not-the-secret", "--json")
    assert wrong.returncode == 2, wrong.stdout + wrong.stderr
    assert json_error(wrong)["code"] == "unauthorized"
    refused(cli_here("status", "--url", url, "--token-file", tokens, "--token-name", "x"), 2, "ctl")
    refused(cli_here("status", "--url", url, data, chat), 2, "with --url there is no WHERE")
    nobody = cli_here("status", "--url", f"http://127.0.0.1:{free_port()}", "--json")
    assert nobody.returncode == 3, nobody.stdout + nobody.stderr
    assert json_error(nobody)["code"] == "no_node"
    assert node.run.stop() == 0, node.run.output()


# ---------------------------------------------------------------- the socket
def test_the_socket_is_private_and_removed_after_the_run(
    start_node: Callable[..., Started],
) -> None:
    assert SOCKET_FILE == SERVER_SOCKET_FILE
    node = start_node()
    path = node.data / SOCKET_FILE
    assert stat.S_ISSOCK(path.lstat().st_mode)
    assert stat.S_IMODE(path.lstat().st_mode) == 0o600
    with ApiClient(node.data) as first, ApiClient(node.data) as second:
        ids = [v.instance_id for v in first.list()]
        assert [v.instance_id for v in second.list()] == ids
        with pytest.raises(VerbFailed, match="nope") as refusal:
            second.stop("nope")
        assert (refusal.value.code, refusal.value.status) == ("unknown_instance", 404)
        assert first.ledger() is None  # no memory budget configured
    assert node.run.stop() == 0, node.run.output()
    assert not path.exists()


def test_a_stale_socket_is_replaced_and_without_a_node_the_verbs_exit_3(
    start_node: Callable[..., Started], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    put_model(data)
    with socket.socket(socket.AF_UNIX) as crashed:  # bound, never unlinked: what a crash leaves
        crashed.bind(str(data / SOCKET_FILE))
    assert (data / SOCKET_FILE).exists()
    refused(cli_here("restart", data, "chat"), 3, f"{NO_NODE} {data}", "infervisor run CONFIG")
    refused(cli_here("status", data), 3, f"{NO_NODE} {data}", "holds no chain")

    node = start_node()
    assert stat.S_IMODE((data / SOCKET_FILE).lstat().st_mode) == 0o600
    assert node.ids["chat"] in ok(cli_here("status", data))
    assert node.run.stop() == 0, node.run.output()
    assert not (data / SOCKET_FILE).exists()


def test_a_file_in_the_sockets_place_stops_the_run_before_the_node_opens(
    tmp_path: Path, fake_llama: str
) -> None:
    put_model(tmp_path / "data")
    (tmp_path / "data" / SOCKET_FILE).write_text("not a socket")
    result = cli("run", write_config(tmp_path, fake_llama))
    refused(result, 2, f"{SOCKET_FILE} exists and is not a socket; move it away")
    assert not (tmp_path / "data" / "chain.db").exists()


def test_a_socket_path_too_long_for_unix_sockets_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ApiError, match="use a shorter data_dir"):
        check_socket_path(tmp_path / ("d" * 120) / SOCKET_FILE)


# ---------------------------------------------------------------- the gate, against a stub node
def stub_view(instance_id: str, lifecycle: str) -> InstanceView:
    fields: dict[str, object] = {name: None for name in InstanceView.__struct_fields__}
    fields.update(
        instance_id=instance_id, adapter="infer.llamacpp", placed_by="n1", generation=0,
        role="chat", flavor="llamacpp", mode="managed", endpoint="http://127.0.0.1:1",
        lifecycle=lifecycle, desired="running", reason="", since_ns=0, restarts=0,
        health="", health_reason="", status="", reserved_bytes=0, exposure="loopback",
        last_seq=0, misses=0, oom_kills=0, on_demand=False, priority=0, pinned=False,
        resting=False, busy=False,
    )  # fmt: skip
    converted: InstanceView = msgspec.convert(fields, InstanceView)
    return converted


class StubNode:
    """Answers list, status and start at once; stop blocks until ``release`` is set."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.release = threading.Event()
        self.by: list[str] = []
        # What GET /v1/node reads besides append_status.
        self.settings = types.SimpleNamespace(
            lease_s=None, witness_quorum=None, adapters=(), allowed_ports=None,
            memory_budget_bytes=None,
        )  # fmt: skip
        self.containment = types.SimpleNamespace(mode="pgroup", reason="a stub", memory=None)
        self.cordon = types.SimpleNamespace(value="none")  # GET /v1/node's cordon

    def append_status(self) -> AppendStatus:
        return AppendStatus(writable=True, error=None, since_ns=None, failures=0)

    def witness_lag(self) -> list[object]:
        return []  # no [[witnesses]]

    def ledger(self) -> None:
        return None  # no memory budget

    def list(self) -> list[InstanceView]:
        return [stub_view("a", "running")]

    def status(self, instance_id: str) -> InstanceView:
        if instance_id != "a":
            raise UnknownInstance(instance_id, ["a"])
        return stub_view("a", "stopped" if self.release.is_set() else "running")

    def start(self, instance_id: str, *, by: str) -> None:
        self.status(instance_id)
        self.by.append(by)

    def stop(self, instance_id: str, *, grace_s: float | None, by: str) -> None:
        self.stopping.set()
        assert self.release.wait(DEADLINE_S)
        self.by.append(by)


def test_verbs_wait_for_the_node_and_the_shutdown_waits_for_verbs_in_flight(
    tmp_path: Path,
) -> None:
    db = tmp_path / "chain.db"
    SqliteChain.open(db, "n1").close()  # the answers carry the chain's seq and hash
    server = ApiServer.listen(tmp_path, db, "n1")
    node = StubNode()
    try:
        # The verbs run in this process (support.cli_here), but for the stop in
        # flight: a process of its own, since it runs beside the others.
        starting = cli_here("start", tmp_path, "a", "--json")
        assert starting.returncode == 3, starting.stdout + starting.stderr
        assert json_error(starting)["code"] == "node_starting"
        fallback = cli_here("status", tmp_path)  # no node takes requests yet: from the chain
        assert "node starting; state replayed from the chain" in fallback.stderr
        server.serve(node)  # type: ignore[arg-type]  # duck-typed: the verbs it answers
        me = f"operator:uid={os.getuid()}({pwd.getpwuid(os.getuid()).pw_name})"
        assert json.loads(ok(cli_here("start", tmp_path, "a", "--json")))["seq"] == 0
        assert node.by == [me]
        with ThreadPoolExecutor(2) as pool:
            in_flight = pool.submit(cli, "stop", tmp_path, "a")
            assert node.stopping.wait(DEADLINE_S)
            shutdown = pool.submit(server.stopping)
            wait_until(lambda: refused_as_stopping(tmp_path), DEADLINE_S, "changes refused")
            refused(cli_here("start", tmp_path, "a"), 3, "shutting down")
            assert "a" in table(ok(cli_here("status", tmp_path)))  # reading is still served
            assert not shutdown.done()  # the stop in flight holds the shutdown
            node.release.set()
            assert shutdown.result(DEADLINE_S) is True
            assert "a: stopped" in ok(in_flight.result(DEADLINE_S))
    finally:
        node.release.set()
        server.close()
    assert not (tmp_path / SOCKET_FILE).exists()
    refused(cli_here("start", tmp_path, "a"), 3, NO_NODE)


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
