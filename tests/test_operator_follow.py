"""The operator's commands that follow a running node: ``watch`` (new events as they
are appended, resumed across a node restart with none missed or repeated), ``status
-w`` (redrawn on each event, in a pipe, ended by Ctrl-C) and ``logs`` (the captured
output, ``-f`` following it).

``infervisor run`` runs as a real process with the fake llama-protocol server
(tests/test_operator_cli.py ``start_node``); the following commands run as processes
of their own, since a signal (Ctrl-C) or a pipe ending them is what is checked.
Synchronisation is by condition and deadline, never by sleeping.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import test_operator_cli
from support import cli_here, wait_until
from test_operator_cli import (
    Started,
    chat_running,
    head_of,
    json_error,
    ok,
)
from test_run_resume import (
    DEADLINE_S,
    EXIT_DEADLINE_S,
    INFERVISOR,
    NodeRun,
    end_runs,
)

start_node = test_operator_cli.start_node  # the fixture: starts ``infervisor run``


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
    # stop 34's trial: a start beyond the head + 1 printed nothing and exited 0
    head = events[-1]["seq"]
    assert cli_here("watch", data, "--from-seq", str(head + 1), "--no-follow").returncode == 0
    for follow in ([], ["--no-follow"]):
        beyond = cli_here("watch", data, "--from-seq", str(head + 50), *follow, "--json")
        assert beyond.returncode == 1, beyond.stdout + beyond.stderr
        assert f"--from-seq {head + 50} is beyond the chain's head (seq " in beyond.stderr
        assert json.loads(beyond.stdout)["error"]["code"] == "beyond_head"

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
