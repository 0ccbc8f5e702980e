"""Operator verbs against a running node: the control socket and the CLI over it.

``infervisor run`` runs as a real process with the fake llama-protocol server
(see test_run_resume.py); the verbs go through the console script as an
operator types them, and through ``ControlClient`` where the protocol itself
is checked. The gate between verbs and the node's shutdown is checked
in-process against a stub node whose verb blocks until the test lets it go.
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
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pytest
from support import PROGRAMS, make_launcher, wait_until
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

from infervisor.actors.errors import UnknownInstance
from infervisor.actors.messages import InstanceView
from infervisor.adapters.ports import free_port
from infervisor.tools.control import (
    SOCKET_FILE,
    ControlClient,
    ControlError,
    ListVerb,
    NodeStarting,
    NodeStopping,
    NodeUnavailable,
    NotRunning,
    StartVerb,
    StopVerb,
    VerbFailed,
    check_socket_path,
)
from infervisor.tools.control_server import ControlServer

NO_NODE = "no node is running on"
FALLBACK = "no node running; state replayed from the chain"


# ---------------------------------------------------------------- helpers
class Started:
    """A running ``infervisor run``: its process, config, data_dir and instance ids."""

    def __init__(self, run: NodeRun, config: Path, data: Path, views: list[InstanceView]) -> None:
        self.run, self.config, self.data = run, config, data
        self.ids = {v.role: v.instance_id for v in views}


def live_views(data: Path) -> list[InstanceView] | None:
    """The node's instances, or None while no node takes verbs there."""
    try:
        with ControlClient(data) as client:
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


def call(data: Path, request: Any) -> Any:
    with ControlClient(data) as client:
        return msgspec.json.decode(client.call(request))


def table(stdout: str) -> dict[str, list[str]]:
    """The rows of a status table by instance id, split on whitespace (the reason too)."""
    return {line.split()[0]: line.split() for line in stdout.splitlines()[1:]}


def status_json(where: Path, *instance: str) -> Any:
    return json.loads(ok(cli("status", where, *instance, "--json")))


@pytest.fixture
def start_node(tmp_path: Path, fake_llama: str) -> Iterator[Callable[..., Started]]:
    """Starts ``infervisor run`` (chat started, embed placed) and returns once it
    placed every instance; teardown ends what a failed test left running."""
    runs: list[NodeRun] = []
    data = tmp_path / "data"
    put_model(data)

    def start(extra: str = "", program: str = fake_llama, chat: str = "running") -> Started:
        config = write_config(tmp_path, program)
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


# ---------------------------------------------------------------- the operator's verbs
def test_status_stop_start_restart_unload_through_the_cli(
    start_node: Callable[..., Started],
) -> None:
    node = start_node()
    chat, embed, data = node.ids["chat"], node.ids["embed"], node.data

    lines = ok(cli("status", node.config)).splitlines()  # the config names the data_dir
    assert lines[0].split()[:3] == ["INSTANCE", "ADAPTER", "LIFECYCLE"]
    assert "MiB RES/RSS" in lines[0]
    rows = table("\n".join(lines))
    assert rows[chat][1:4] == ["infer.llamacpp", "running", "running"]
    assert rows[embed][2:4] == ["loaded", "stopped"]
    views = status_json(data)
    assert [v["instance_id"] for v in views] == sorted([chat, embed])
    first_pid = status_json(data, chat)["pid"]
    assert isinstance(first_pid, int)
    one = ok(cli("status", data, chat))
    assert list(table(one.split("\n\n")[0])) == [chat]
    assert "endpoint   http://127.0.0.1:" in one  # the details of the one instance

    for verb in ("status", "stop"):  # the other verbs take the same path as stop
        refused(cli(verb, data, "nope"), 1, "no instance 'nope'", chat, embed)

    stopped = ok(cli("stop", data, chat, "--grace", "5"))
    assert f"{chat}: stopped (wanted stopped)" in stopped
    view = status_json(data, chat)
    assert (view["lifecycle"], view["desired"], view["pid"]) == ("stopped", "stopped", None)

    started = json.loads(ok(cli("start", data, chat, "--json")))
    assert started["desired"] == "running"
    assert started["lifecycle"] in ("starting", "running")
    node.run.until("chat running again", lambda: chat_running(data))
    second_pid = status_json(data, chat)["pid"]
    assert second_pid not in (None, first_pid)

    restarted = json.loads(ok(cli("restart", data, chat, "--json")))
    assert restarted["pid"] not in (None, second_pid)
    assert restarted["desired"] == "running"

    assert ok(cli("unload", data, embed)) == f"{embed}: unloaded\n"
    assert [v["instance_id"] for v in status_json(node.config)] == [chat]
    # Who did it: the socket peer's uid (SO_PEERCRED) is each verb's source.
    me = f"operator:uid={os.getuid()}({pwd.getpwuid(os.getuid()).pw_name})"
    sources = {(kind, subj): src for kind, subj, src in chain_sources(data / "chain.db")}
    for kind, subj in (
        ("instance.stop_requested", chat),
        ("instance.starting", chat),
        ("instance.unloaded", embed),
    ):
        assert sources[(kind, subj)] == me, (kind, subj)

    assert node.run.stop() == 0, node.run.output()
    assert not (data / SOCKET_FILE).exists()
    refused(cli("stop", node.config, chat), 3, f"{NO_NODE} {data}", "infervisor run CONFIG")
    fallback = cli("status", data)
    assert FALLBACK in fallback.stderr
    rows = table(ok(fallback))
    assert list(rows) == [chat]  # the unload is in the chain too
    assert rows[chat][2:4] == ["stopped", "running"]  # stopped by the shutdown, still wanted
    [replayed] = json.loads(ok(cli("status", data, "--json")))
    assert (replayed["instance_id"], replayed["lifecycle"]) == (chat, "stopped")
    refused(cli("status", data, embed), 1, f"no instance {embed!r}", chat)


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
        refused(cli("stop", node.data, ext), 1, "observes it and never stops it")
        assert ok(cli("unload", node.data, ext)) == f"{ext}: unloaded\n"
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
        call(data, StartVerb(instance="nope"))
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
            node.run.until(
                "chat stopping", lambda: status_json(data, chat)["lifecycle"] == "stopping"
            )
            node.run.send(signal.SIGTERM)
            # Generous: on a loaded machine the shutdown's first steps can take a while.
            node.run.until("changes refused", lambda: refused_as_stopping(data), timeout=60)
            refused(cli("start", data, chat), 3, "shutting down")
            assert table(ok(cli("status", data)))[chat][2] == "stopping"  # reads go on
            assert operator.poll() is None  # the operator's stop holds the shutdown
            node.run.send(signal.SIGTERM)  # kills what is stopping: the operator's stop ends
            out, err = operator.communicate(timeout=EXIT_DEADLINE_S)
        finally:
            if operator.poll() is None:
                operator.kill()
    assert operator.returncode == 0, out + err
    assert f"{chat}: stopped (wanted stopped)" in out
    assert node.run.wait() == 0, node.run.output()
    state = read_state(data / "chain.db")
    assert state is not None
    stopped = state.instances[chat]
    assert (stopped.lifecycle, stopped.desired) == ("stopped", "stopped")  # the operator's stop
    assert stopped.last_exit is not None
    assert stopped.last_exit.signal == signal.SIGKILL


# ---------------------------------------------------------------- the socket and its protocol
def test_the_socket_is_private_serves_connections_at_once_and_answers_bad_requests(
    start_node: Callable[..., Started],
) -> None:
    node = start_node()
    path = node.data / SOCKET_FILE
    assert stat.S_ISSOCK(path.lstat().st_mode)
    assert stat.S_IMODE(path.lstat().st_mode) == 0o600
    with ControlClient(node.data) as first:
        ids = [v.instance_id for v in first.list()]
        with ControlClient(node.data) as second:  # while the first connection is open
            assert [v.instance_id for v in second.list()] == ids
            with pytest.raises(VerbFailed, match="no instance 'nope'") as refusal:
                second.stop("nope")
            assert refusal.value.kind == "UnknownInstance"
        assert first.status(ids[0]).instance_id == ids[0]
        assert first.ledger() is None  # no memory budget configured

    with socket.socket(socket.AF_UNIX) as raw:
        raw.connect(str(path))
        raw.sendall(
            b'not json\n{"verb": "fly"}\n{"verb": "stop", "instance": "x", "grace_s": -1}\n'
        )
        raw.sendall(b'{"verb": "list"}\n')
        with raw.makefile("rb") as replies:
            lines = [json.loads(replies.readline()) for _ in range(4)]
    assert [(a["ok"], a.get("kind")) for a in lines[:3]] == [(False, "BadRequest")] * 3
    assert "list, status, start, stop" in lines[0]["error"]
    assert "Invalid value 'fly'" in lines[1]["error"]
    assert "$.grace_s" in lines[2]["error"]
    assert lines[3]["ok"] is True
    assert sorted(v["instance_id"] for v in lines[3]["result"]) == ids
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
    with pytest.raises(NotRunning, match="start one with `infervisor run CONFIG`"):
        ControlClient(data).list()
    refused(cli("restart", data, "chat"), 3, f"{NO_NODE} {data} (no control socket)")
    refused(cli("status", data), 3, f"{NO_NODE} {data}", "holds no chain")

    node = start_node()
    assert stat.S_IMODE((data / SOCKET_FILE).lstat().st_mode) == 0o600
    assert node.ids["chat"] in ok(cli("status", data))
    assert node.run.stop() == 0, node.run.output()
    assert not (data / SOCKET_FILE).exists()


def test_a_file_in_the_sockets_place_stops_the_run_before_the_node_opens(
    tmp_path: Path, fake_llama: str
) -> None:
    put_model(tmp_path / "data")
    (tmp_path / "data" / SOCKET_FILE).write_text("not a socket")
    result = cli("run", write_config(tmp_path, fake_llama))
    refused(result, 2, "control.sock exists and is not a socket; move it away")
    assert not (tmp_path / "data" / "chain.db").exists()


def test_a_socket_path_too_long_for_unix_sockets_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ControlError, match="use a shorter data_dir"):
        check_socket_path(tmp_path / ("d" * 120) / SOCKET_FILE)


# ---------------------------------------------------------------- the gate, against a stub node
class StubNode:
    """Answers list and start at once; stop blocks until ``release`` is set."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.release = threading.Event()

    def list(self) -> list[Any]:
        return []

    def start(self, instance_id: str, *, by: str) -> dict[str, str]:
        if instance_id == "nope":
            raise UnknownInstance(instance_id, ["a"])
        return {"started": instance_id, "by": by}

    def stop(self, instance_id: str, *, grace_s: float | None, by: str) -> dict[str, str]:
        self.stopping.set()
        assert self.release.wait(DEADLINE_S)
        return {"stopped": instance_id, "by": by}


def test_verbs_wait_for_the_node_and_the_shutdown_waits_for_verbs_in_flight(
    tmp_path: Path,
) -> None:
    server = ControlServer.listen(tmp_path)
    idle = ControlClient(tmp_path)
    node = StubNode()
    try:
        with pytest.raises(NodeStarting, match="the node is starting"):
            call(tmp_path, ListVerb())
        server.serve(node)  # type: ignore[arg-type]  # duck-typed: the verbs it answers
        me = f"operator:uid={os.getuid()}({pwd.getpwuid(os.getuid()).pw_name})"
        assert call(tmp_path, StartVerb(instance="a")) == {"started": "a", "by": me}
        idle.connect()
        with ThreadPoolExecutor(2) as pool:
            in_flight = pool.submit(call, tmp_path, StopVerb(instance="a"))
            assert node.stopping.wait(DEADLINE_S)
            shutdown = pool.submit(server.stopping)
            wait_until(lambda: refused_as_stopping(tmp_path), DEADLINE_S, "changes refused")
            assert call(tmp_path, ListVerb()) == []  # reading is still served
            assert not shutdown.done()  # the stop in flight holds the shutdown
            node.release.set()
            assert shutdown.result(DEADLINE_S) is None
            assert in_flight.result(DEADLINE_S) == {"stopped": "a", "by": me}
    finally:
        node.release.set()
        server.close()  # with the idle connection still open
    assert not (tmp_path / SOCKET_FILE).exists()
    with pytest.raises(NodeUnavailable):
        idle.list()
    idle.close()
    with pytest.raises(NotRunning):
        call(tmp_path, ListVerb())


# ---------------------------------------------------------------- help
@pytest.mark.parametrize("verb", ["status", "start", "stop", "restart", "unload"])
def test_each_verb_teaches_its_arguments_and_exit_statuses(verb: str) -> None:
    text = " ".join(ok(cli(verb, "--help")).split())
    for needle in (
        "DATA_DIR",
        ".toml",
        "Exit 0",
        "2 when",
        "3 when",
        "Exit status (every command)",
    ):
        assert needle in text, f"{verb} --help lacks {needle!r}: {text}"
    if verb != "unload":
        assert "--json" in text
    if verb == "stop":
        assert "--grace SECONDS" in text
