"""The node's shutdown and the operator's verbs in flight: a stop the operator asked for
holds the shutdown until it ends (a second signal kills what is stopping), changes are
refused as "shutting down" while reads are still served, and verbs sent before the
node is open are answered "starting".

``infervisor run`` runs as a real process with a fake llama-protocol server that
ignores SIGTERM (tests/test_operator_cli.py ``start_node``: the signals are what is
checked); the gate between verbs and the shutdown is checked against a real
``ApiServer`` serving a stub node whose stop blocks until the test lets it go. The
verbs run the CLI's click group in this process (support.cli_here), but for the stop
in flight, which runs beside the others in a process of its own.
Synchronisation is by condition and deadline, never by sleeping.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import threading
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
import test_operator_cli
from support import PROGRAMS, cli_here, make_launcher, wait_until
from test_operator_cli import (
    NO_NODE,
    Started,
    chat_in,
    json_error,
    ok,
    refused,
    refused_as_stopping,
    status_json,
    table,
)
from test_run_resume import (
    DEADLINE_S,
    EXIT_DEADLINE_S,
    INFERVISOR,
    cli,
    ignores_sigterm,
    read_state,
)

from infervisor.actors.append_health import AppendStatus
from infervisor.actors.errors import UnknownInstance
from infervisor.chain import SqliteChain
from infervisor.replay.views import InstanceView
from infervisor.tools.api.client import SOCKET_FILE
from infervisor.tools.api.serving.server import ApiServer

start_node = test_operator_cli.start_node  # the fixture: starts ``infervisor run``


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


# ---------------------------------------------------------------- the gate, against a stub node
def stub_view(instance_id: str, lifecycle: str) -> InstanceView:
    fields: dict[str, object] = {name: None for name in InstanceView.__struct_fields__}
    fields.update(
        instance_id=instance_id, adapter="infer.llamacpp", placed_by="n1", generation=0,
        role="chat", flavor="llamacpp", mode="managed", endpoint="http://127.0.0.1:1",
        lifecycle=lifecycle, desired="running", reason="", since_ns=0, restarts=0,
        health="", health_reason="", status="", reserved_bytes=0, exposure="loopback",
        last_seq=0, misses=0, oom_kills=0, on_demand=False, priority=0, pinned=False,
        resting=False, busy=False, rest_reason="", refusals_folded=0, embeddings=False,
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
