"""A pause is not a death, and the CLI never hangs (issue 17, item 4).

A node stopped with SIGSTOP (as a frozen cgroup or a paused VM stops it) is a
real ``infervisor run`` with the fake llama-protocol server (test_operator_cli's
``start_node``); a node that takes connections and never answers is also a
bare listening Unix socket, which is what a stopped node's socket is to a
client (the kernel queues the connection). Synchronisation is by condition
and deadline; the one sleep is the pause itself, the length the issue asks for.
The status commands run in this process (support.cli_here: the CLI's own
--timeout is what ends them); a verb runs as a process of its own, which must
end within :data:`CLI_DEADLINE_S`. A node that is there and does not answer
is exit 4 (``no_answer``), not 3 (no node): stop 35's trial. A test that
stops the node sends SIGCONT in a ``finally``, whatever fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import cli_here
from test_operator_cli import Started, live_views, role_of, start_node  # noqa: F401 - a fixture
from test_run_resume import INFERVISOR, put_model

from infervisor.tools.api.client import ApiClient, socket_path
from infervisor.tools.api.errors import NoAnswer

#: How long the node is stopped: longer than the watchdog's stall allowance
#: (actors/watchdog.py ``MIN_STALL_S``, 15 s; issue 17 paused it 30 s), so that
#: a pause taken for a stall would fail the node.
PAUSE_S = 20.0
#: A CLI call against a deaf node must end well within this (its --timeout is 2 s).
CLI_DEADLINE_S = 30.0


@contextlib.contextmanager
def deaf_node(data: Path) -> Iterator[Path]:
    """A socket in the node's place that takes connections and never answers."""
    data.mkdir(parents=True, exist_ok=True)
    path = socket_path(data)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(16)
        try:
            yield path
        finally:
            path.unlink(missing_ok=True)


def json_error(result: object) -> dict[str, object]:
    stdout = getattr(result, "stdout", "")
    body: dict[str, object] = json.loads(stdout)["error"]
    return body


def test_a_socket_that_takes_connections_and_does_not_answer_is_no_answer(
    tmp_path: Path,
) -> None:
    """Exit 4 (``no_answer``), naming the socket, the timeout and its listener's pid:
    something is there and does not answer (stop 35: it was exit 3, "no node")."""
    data = tmp_path / "data"
    put_model(data)
    with deaf_node(data) as path:
        result = cli_here("status", data, "--timeout", "1", "--json")
        assert result.returncode == 4, result.stdout + result.stderr
        assert "Traceback" not in result.stderr
        error = json_error(result)
        assert error["code"] == "no_answer"
        assert error["field"] == "--timeout"
        message = str(error["message"])
        assert str(path) in message and "took the connection" in message
        assert "within 1 s" in message
        assert f"its process (pid {os.getpid()}) runs, but it is paused" in message
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr

        verb = subprocess.run(  # a verb, its timeout from the environment
            [str(INFERVISOR), "stop", str(data), "chat"],
            capture_output=True,
            text=True,
            timeout=CLI_DEADLINE_S,
            check=False,
            env={**os.environ, "INFERVISOR_TIMEOUT": "1"},
        )
        assert verb.returncode == 4, verb.stdout + verb.stderr
        assert "did not answer within 1 s" in verb.stderr

        with ApiClient(data, timeout_s=1.0) as client, pytest.raises(NoAnswer) as sent:
            client.heartbeat("ctl")  # a POST with no wait of its own: 1 s
        assert sent.value.code == "no_answer"  # a verb sent may have been recorded
        assert "may have been recorded" in str(sent.value)


def test_a_url_that_takes_connections_and_does_not_answer_is_no_answer() -> None:
    """Over TCP too: the kernel took the connection (a listener whose process is
    paused, with no accept), so something is there: exit 4, not 3."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        result = cli_here("status", "--url", url, "--timeout", "1", "--json")
    assert result.returncode == 4, result.stdout + result.stderr
    error = json_error(result)
    assert error["code"] == "no_answer" and "within 1 s" in str(error["message"])
    assert "`kill -CONT PID`" in str(error["message"])


@contextlib.contextmanager
def stopped(node: Started) -> Iterator[int]:
    """The node's process stopped with SIGSTOP; SIGCONT always follows, failed or not."""
    node.run.send(signal.SIGSTOP)
    try:
        yield node.run.proc.pid
    finally:
        node.run.send(signal.SIGCONT)


def test_a_stopped_node_is_no_answer_naming_its_pid_and_kill_cont(
    start_node: Callable[..., Started],  # noqa: F811
) -> None:
    """Stop 35's trial: `infervisor stop` to a SIGSTOPped `infervisor run` exited 3
    (no_node) although the node holds its lock and its socket takes connections;
    it is 4 (no_answer), naming the pid that is stopped and `kill -CONT` (fails before)."""
    node = start_node()
    with stopped(node) as pid:
        for args in (["status", node.data, "--json"], ["stop", node.data, "chat", "--json"]):
            ran = subprocess.run(
                [str(INFERVISOR), *map(str, args), "--timeout", "2"],
                capture_output=True,
                text=True,
                timeout=CLI_DEADLINE_S,
                check=False,
            )
            assert ran.returncode == 4, ran.stdout + ran.stderr
            error = json_error(ran)
            assert (error["code"], error["field"]) == ("no_answer", "--timeout")
            message = str(error["message"])
            assert "did not answer within 2 s" in message, message
            assert f"its process (pid {pid}) is stopped: `kill -CONT {pid}` resumes it" in message
        with ApiClient(node.data, timeout_s=2.0) as client, pytest.raises(NoAnswer) as sent:
            client.heartbeat("ctl")
        assert sent.value.code == "no_answer" and "may have been recorded" in str(sent.value)
    node.run.until("the node answers again", lambda: live_views(node.data))
    assert cli_here("status", node.data).returncode == 0


@pytest.mark.parametrize("value", ["0", "nan"])
def test_a_timeout_that_is_no_number_of_seconds_is_refused(tmp_path: Path, value: str) -> None:
    data = tmp_path / "data"
    put_model(data)
    result = cli_here("status", data, "--timeout", value, "--json")
    assert result.returncode == 2, result.stdout + result.stderr
    error = json_error(result)
    assert error["code"] == "bad_value" and error["field"] == "--timeout"


def chat_events_after(db: Path, seq: int, subject: str) -> list[str]:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        rows = con.execute(
            "SELECT kind FROM events WHERE seq > ? AND subject = ? ORDER BY seq", (seq, subject)
        ).fetchall()
    return [str(kind) for (kind,) in rows]


def head_of(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        return int(con.execute("SELECT max(seq) FROM events").fetchone()[0])


@pytest.mark.slow
def test_a_node_stopped_past_the_stall_allowance_resumes_and_stops_no_server(
    start_node: Callable[..., Started],  # noqa: F811
) -> None:
    node = start_node()
    db = node.data / "chain.db"
    views = live_views(node.data)
    assert views is not None
    chat = role_of(views, "chat")
    assert chat is not None and chat.pid
    before = head_of(db)
    node.run.send(signal.SIGSTOP)
    try:
        stopped_at = time.monotonic()
        # While it is stopped the CLI does not hang: exit 4 naming the timeout.
        deaf = cli_here("status", node.data, "--timeout", "2")
        assert deaf.returncode == 4, deaf.stdout + deaf.stderr
        assert "did not answer within 2 s" in deaf.stderr
        time.sleep(max(0.0, PAUSE_S - (time.monotonic() - stopped_at)))  # the pause itself
    finally:
        node.run.send(signal.SIGCONT)
    node.run.until("the watchdog saw the pause", lambda: "paused for" in log_of(node))
    node.run.until("the node answers", lambda: live_views(node.data))
    answer = cli_here("status", node.data, "--timeout", "10")
    assert answer.returncode == 0, answer.stdout + answer.stderr
    views = live_views(node.data)
    assert views is not None
    after = role_of(views, "chat")
    assert after is not None
    assert (after.pid, after.lifecycle) == (chat.pid, "running")  # the same process, serving
    assert chat_events_after(db, before, chat.instance_id) == []  # not stopped nor restarted
    assert node.run.proc.poll() is None
    assert node.run.stop() == 0  # a clean stop: the node never failed (that would be 3)


def log_of(node: Started) -> str:
    path = node.data / "node.log"
    return path.read_text(errors="replace") if path.exists() else ""
