"""A node run as a supervisord program, as docs/deploy.md shows it.

Real supervisord and supervisorctl (the ``supervisor`` package, a test extra)
run ``infervisor run`` with the fake llama-protocol server:

- ``supervisorctl stop`` is a graceful stop: the server stopped, ``node.stopped``
  recorded;
- ``supervisorctl start`` and ``restart`` resume from the chain (the instance
  wanted running runs again);
- a kill -9 of the node alone, then supervisord's autorestart: the next node
  re-attaches the server that outlived it (same pid, ``instance.reattached``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import wait_until
from test_operator_cli import chat_running
from test_run_resume import events_of, put_model, server_groups, write_config

from infervisor.replay.views import InstanceView

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
DEADLINE_S = 60.0


class Supervisord:
    """supervisord in the foreground on a config of its own; ``ctl`` runs supervisorctl."""

    def __init__(self, conf: Path, log: Path) -> None:
        self.conf, self.log = conf, log
        self.proc = subprocess.Popen(
            [str(BIN / "supervisord"), "-n", "-c", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def ctl(self, *args: str) -> str:
        done = subprocess.run(
            [str(BIN / "supervisorctl"), "-c", str(self.conf), *args],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S + 30,
            check=False,
        )
        return done.stdout + done.stderr

    def node_pid(self) -> int:
        """The running node's pid (0 while none runs)."""
        out = self.ctl("pid", "infervisor").strip()
        return int(out) if out.isdigit() else 0


def program_section(doc: str) -> str:
    """The ``[program:infervisor]`` section of docs/deploy.md."""
    found = re.search(r"```ini\n(\[program:infervisor\]\n.*?)```", doc, re.S)
    assert found is not None, "docs/deploy.md shows no [program:infervisor] section"
    return found.group(1)


@pytest.fixture
def supervised(tmp_path: Path, fake_llama: str) -> Iterator[tuple[Supervisord, Path]]:
    put_model(tmp_path / "data")
    config = write_config(tmp_path, fake_llama)
    doc = (Path(__file__).parents[1] / "docs" / "deploy.md").read_text()
    program = program_section(doc)
    program = program.replace("/opt/infervisor/.venv/bin/infervisor", str(BIN / "infervisor"))
    program = program.replace("/etc/infervisor/node.toml", str(config))
    program = re.sub(r"(?m)^(user|directory|stdout_logfile|stderr_logfile)=.*\n", "", program)
    program = re.sub(r"(?m)^startsecs=.*$", "startsecs=1", program)  # start answers sooner
    sock = tmp_path / "sv.sock"
    conf = tmp_path / "supervisord.conf"
    conf.write_text(
        f"""[unix_http_server]
file={sock}
[supervisord]
logfile={tmp_path / "supervisord.log"}
pidfile={tmp_path / "supervisord.pid"}
childlogdir={tmp_path}
[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface
[supervisorctl]
serverurl=unix://{sock}
{program}
stdout_logfile={tmp_path / "node.log"}
"""
    )
    sv = Supervisord(conf, tmp_path / "node.log")
    try:
        yield sv, tmp_path / "data"
    finally:
        sv.ctl("stop", "all")
        sv.proc.send_signal(signal.SIGTERM)
        try:
            sv.proc.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            sv.proc.kill()
            sv.proc.wait()
        db = tmp_path / "data" / "chain.db"
        for pgid in server_groups(db) if db.exists() else []:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                continue


def _chat(data: Path, sv: Supervisord, what: str) -> InstanceView:
    views = wait_until(lambda: chat_running(data), DEADLINE_S, what)
    if views is None:
        pytest.fail(f"{what}: node output:\n{sv.log.read_text() if sv.log.exists() else ''}")
    return next(v for v in views if v.role == "chat")


def _kinds(data: Path) -> list[str]:
    return [e.kind for e in events_of(data / "chain.db")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_node_under_supervisord_stops_resumes_and_reattaches(
    supervised: tuple[Supervisord, Path],
) -> None:
    sv, data = supervised
    first = _chat(data, sv, "chat running under supervisord")
    assert first.pid is not None

    # stop: graceful (stopsignal=TERM): the server stopped, node.stopped recorded.
    assert "stopped" in sv.ctl("stop", "infervisor")
    wait_until(lambda: not _alive(first.pid or 0), DEADLINE_S, "the server stopped")
    assert "node.stopped" in _kinds(data)
    stops = _kinds(data).count("node.stopped")

    # start: resumes from the chain; chat was wanted running, so it runs again.
    assert "started" in sv.ctl("start", "infervisor")
    second = _chat(data, sv, "chat running again after start")
    assert second.pid != first.pid

    # kill -9 of the node alone: autorestart, and the server is re-attached.
    node = sv.node_pid()
    os.kill(node, signal.SIGKILL)
    wait_until(lambda: "instance.reattached" in _kinds(data), DEADLINE_S, "re-attached")
    third = _chat(data, sv, "chat re-attached")
    assert third.pid == second.pid and _alive(second.pid or 0)
    assert sv.node_pid() not in (0, node), "supervisord restarted the node"
    assert _kinds(data).count("node.stopped") == stops  # no graceful stop happened

    # restart: a graceful stop and a resume.
    assert "started" in sv.ctl("restart", "infervisor")
    fourth = _chat(data, sv, "chat running after restart")
    assert _kinds(data).count("node.stopped") == stops + 1
    assert fourth.pid != third.pid

    def resident_chat() -> list[str]:
        shown = json.loads((data / "resident.json").read_text())
        return [i["state"] for i in shown["instances"] if i["role"] == "chat"]

    wait_until(lambda: resident_chat() == ["running"], DEADLINE_S, "resident.json shows chat")
