"""The chain refuses writes while a server is SIGKILLed (issue 17, item 5), for real.

Two ways a real chain refuses: its data directory on a small tmpfs filled to
the last block (``SQLITE_FULL``), and another process holding ``BEGIN
IMMEDIATE`` on ``chain.db`` past the busy timeout (``SQLITE_BUSY``). Each time
the node's managed fake server is SIGKILLed meanwhile. The node must say that
the chain refuses writes (status and ``/metrics``), invent nothing while it
does (no missed checks, no health kill, no ``stable``), and once the chain
takes writes again record the exit as the shim saw it (signal 9) and the
restart, in that order, on a chain that verifies. Real processes, real time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from support import PROGRAMS, make_launcher, wait_until
from test_crash_recovery import alive, consistent
from test_group_commit import TIMEOUT_S, Gate, draft, hold, stored_subjects
from test_misbehaving_servers import history, nothing_left

from infervisor.actors import messages as m
from infervisor.actors.append_health import AppendHealth
from infervisor.actors.chain_writer import ChainWriter
from infervisor.actors.node import Node
from infervisor.adapters.ports import free_port, port_in_use
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.chain import ChainIOError, SqliteChain, connect, verify_chain
from infervisor.replay import RestartPolicy
from infervisor.tools.api.client import ApiClient
from infervisor.tools.api.metrics import NodeMetrics
from infervisor.tools.api.serving.server import ApiServer
from infervisor.tools.cli import cli

#: What the chain must never say of a server that was SIGKILLed by someone else.
INVENTED = ("instance.unhealthy", "instance.terminating", "instance.stable")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """The node's data directory on a 16 MiB tmpfs of its own (root only).

    Requested before ``nodes`` so that the node is shut down before it is unmounted.
    """
    data = tmp_path / "data"
    data.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(data)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield data
    finally:
        subprocess.run(["umount", "-l", str(data)], check=False)


def _fill(folder: Path) -> Path:
    """Write a file until the file system has no block left; returns it."""
    ballast = folder / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        block = b"\0" * 65536
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, block)
        with contextlib.suppress(OSError):  # the last partial block
            while True:
                os.write(fd, b"\0" * 512)
    finally:
        os.close(fd)
    return ballast


def _running(nodes: Any, tmp_path: Path, fake_model: Path, **settings: Any) -> tuple[Node, str]:
    program = make_launcher(tmp_path, PROGRAMS / "fake_llama.py")
    node = nodes.open(nodes.settings(program, fake_model, **settings))
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    port = free_port()
    iid = node.place(InstanceSpec(role="chat", flavor=Flavor.LLAMACPP, model="tiny", port=port))
    node.start(iid)
    node.wait_for(iid, lambda v: v.lifecycle == "running", 60)
    wait_until(lambda: port_in_use("127.0.0.1", port), 20, "the server listening")
    return node, iid


def _metrics(node: Node) -> dict[str, float]:
    """The node's unlabelled samples, as a scrape of ``/metrics`` reads them."""
    text, _ = NodeMetrics(lambda: node, node.settings.chain_path).render()
    samples = (ln.split() for ln in text.decode().splitlines() if not ln.startswith("#"))
    return {fields[0]: float(fields[1]) for fields in samples if len(fields) == 2}


def _refusing(node: Node, iid: str, kind: str) -> None:
    """Wait until the node says the chain refuses writes, twice over (a retry of
    the waiting exit refused too), in its status, its metrics and the instance's."""
    wait_until(lambda: node.append_status().failures >= 2, 60, "the exit refused and retried")
    status = node.append_status()
    assert not status.writable, status
    assert status.error is not None and kind in status.error, status.error
    assert status.since_ns is not None
    scraped = _metrics(node)
    assert scraped["infervisor_chain_append_failing"] == 1
    assert scraped["infervisor_chain_append_failures_total"] >= 2
    view = node.status(iid)
    assert ", in order, for the chain to record them" in view.reason, view.reason


def _said_by_the_api_and_status(data: Path, kind: str) -> None:
    """``GET /v1/node`` and ``infervisor status`` say the chain refuses writes."""
    with ApiClient(data_dir=data) as client:
        info = client.node()
    assert not info.chain_writable
    assert info.chain_error is not None and kind in info.chain_error
    assert info.chain_failing_since_ns is not None and info.chain_append_failures >= 2
    shown = CliRunner().invoke(cli, ["status", str(data)])
    assert shown.exit_code == 0, shown.stderr
    assert shown.stderr.startswith("warning: the node's chain refuses writes since "), shown.stderr
    assert kind in shown.stderr
    assert "chat-" in shown.stdout  # the table follows the warning


def _told_true(node: Node, iid: str, before: int, pid: int) -> None:
    """The exit as the shim saw it (SIGKILL), then the restart; nothing invented."""
    wait_until(lambda: node.append_status().writable, 60, "the chain to take writes again")
    wait_until(
        lambda: any(s.kind == "instance.spawned" for s in history(node, iid)[before:]),
        60,
        "the restart",
    )
    after = history(node, iid)[before:]
    kinds = [s.kind.removeprefix("instance.") for s in after]
    assert kinds[:4] == ["exited", "restart_scheduled", "starting", "spawned"], kinds
    exited = after[0].event
    assert (exited.pid, exited.signal, exited.exit_code) == (pid, 9, None)
    assert exited.reason == "killed by a signal infervisor did not send: signal 9 (SIGKILL)"
    told = after[: kinds.index("spawned")]  # what follows the new server is its own story
    assert not [s for s in told if s.kind in INVENTED or "unknown" in s.reason], kinds
    assert _metrics(node)["infervisor_chain_append_failing"] == 0
    node.wait_for(iid, lambda v: v.lifecycle == "running", 60)
    assert "fault" not in node.status(iid).reason
    consistent(node)


def test_a_full_disk_while_a_server_is_killed(small_disk, nodes, tmp_path, fake_model) -> None:
    node, iid = _running(nodes, tmp_path, fake_model)
    pid = node.status(iid).pid
    assert pid is not None
    before = len(history(node, iid))
    ballast = _fill(small_disk)
    os.kill(pid, signal.SIGKILL)
    _refusing(node, iid, "disk is full")
    assert len(history(node, iid)) == before
    ballast.unlink()
    _told_true(node, iid, before, pid)
    node.shutdown()
    assert not alive(pid)
    nothing_left(node)


def test_a_held_write_lock_while_a_server_is_killed(nodes, tmp_path, fake_model, monkeypatch):
    """Also the issue's false ``stable``: the server was restarted once (its restart
    budget clears after ``stable_after_s`` up), and is killed while the lock is held."""
    monkeypatch.setattr(connect, "BUSY_TIMEOUT_S", 1.0)  # the writer's, read when it connects
    policy = RestartPolicy(base_s=0.2, cap_s=1.0, stable_after_s=3.0)
    node, iid = _running(nodes, tmp_path, fake_model, restart=policy)
    first = node.status(iid).pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    node.wait_for(iid, lambda v: v.pid not in (None, first) and v.lifecycle == "running", 60)
    pid = node.status(iid).pid
    assert pid is not None
    before = len(history(node, iid))
    data = Path(node.settings.data_dir)
    api = ApiServer.listen(data, node.settings.chain_path, node.settings.node_id)
    holder = sqlite3.connect(node.settings.chain_path, isolation_level=None)
    try:
        api.serve(node)
        holder.execute("BEGIN IMMEDIATE")
        os.kill(pid, signal.SIGKILL)
        _refusing(node, iid, "database is locked")
        _said_by_the_api_and_status(data, "database is locked")
        assert len(history(node, iid)) == before  # read while the lock is still held
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        api.close()
    _told_true(node, iid, before, pid)
    node.shutdown()
    assert not alive(pid)
    nothing_left(node)


def test_a_group_commit_on_a_full_disk_fails_every_caller_and_stores_none(
    small_disk, monkeypatch
) -> None:
    """A real SQLITE_FULL inside a group commit: every asker of the batch gets the
    chain's own error, none of their events is stored (not half of one asker's
    two), the writer reports the refusal, and its connection goes on once there
    is room again."""
    gate = Gate()  # holds the writer in its first transaction while the others queue
    monkeypatch.setattr(SqliteChain, "append_many", gate.wrap(SqliteChain.append_many))
    health = AppendHealth()
    writer = ChainWriter.start(small_disk / "chain.db", "node-a", health=health)
    try:
        first = hold(writer, gate)
        doomed = [
            writer.ask(m.Append(drafts=(draft(subject="x1"),)), block=False),
            writer.ask(m.Append(drafts=(draft(subject="x2"), draft(subject="x3"))), block=False),
        ]
        ballast = _fill(small_disk)
        gate.release.set()
        for future in [first, *doomed]:
            with pytest.raises(ChainIOError, match="database or disk is full"):
                future.get(timeout=TIMEOUT_S)
        assert gate.batches[-1] == ["x1", "x2", "x3"]  # one transaction, refused whole
        status = health.snapshot()
        assert (status.writable, status.failures) == (False, 2)
        assert status.error is not None and "disk is full" in status.error
        ballast.unlink()
        later = writer.ask(m.Append(drafts=(draft(subject="after"),)), timeout=TIMEOUT_S)
        assert [e.seq for e in later] == [1]
        assert health.snapshot().writable
    finally:
        writer.stop(timeout=TIMEOUT_S)
    assert stored_subjects(small_disk / "chain.db") == ["after"]
    assert verify_chain(small_disk / "chain.db").ok
