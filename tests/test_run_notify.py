"""A node under a service manager: systemd's notify protocol and the resident-models file.

A real ``infervisor run`` is given ``NOTIFY_SOCKET`` naming a datagram socket
this test listens on (and ``WATCHDOG_USEC``): ``READY=1`` comes once the API
answers, ``WATCHDOG=1`` keeps coming from the supervisor's ticks,
``STOPPING=1`` on SIGTERM. The same run writes ``DATA_DIR/resident.json`` and
an NFD feature file. The protocol itself, the watchdog's pacing and the
systemd unit of docs/deploy.md are checked in-process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import wait_until
from test_run_resume import end_runs, put_model, write_config

from infervisor.actors import messages as m
from infervisor.actors.clock import ManualClock
from infervisor.actors.supervisor import SupervisorActor
from infervisor.actors.watchdog import Watchdog
from infervisor.adapters.sdnotify import Notifier
from infervisor.replay import NodeState
from infervisor.tools.node.resident import features_text, label_value

INFERVISOR = Path(sys.executable).parent / "infervisor"
DEADLINE_S = 60.0


class Listener:
    """A datagram socket standing in for systemd's notify socket."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.got: list[str] = []

    def until(self, line: str, deadline_s: float = DEADLINE_S) -> list[str]:
        """Receive until a datagram holds ``line``; every line received so far."""
        end = time.monotonic() + deadline_s
        while not any(line in m.split("\n") for m in self.got):
            left = end - time.monotonic()
            assert left > 0, f"no {line!r} within {deadline_s} s; got {self.got}"
            self.sock.settimeout(left)
            self.got.append(self.sock.recv(4096).decode())
        return self.got

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[Listener]:
    heard = Listener(f"@infervisor-test-{os.getpid()}-{tmp_path.name}")
    yield heard
    heard.close()


def test_a_node_notifies_ready_watchdog_and_stopping_and_writes_its_resident_models(
    tmp_path: Path, fake_llama: str, listener: Listener
) -> None:
    put_model(tmp_path / "data")
    # What a crash between an append and the file's write leaves: the boot rewrites it.
    (tmp_path / "data" / "resident.json").write_text('{"format": 1, "instances": []}')
    (tmp_path / "features.d").mkdir()
    config = write_config(tmp_path, fake_llama, node_extra='features_file = "features.d/infer"')
    env = {**os.environ, "NOTIFY_SOCKET": listener.address, "WATCHDOG_USEC": "1000000"}
    env.pop("WATCHDOG_PID", None)
    log = tmp_path / "run.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(INFERVISOR), "run", str(config)], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    try:
        listener.until("READY=1")
        # Ready means answering: the API is open at once.
        transport = httpx.HTTPTransport(uds=str(tmp_path / "data" / "api.sock"))
        with httpx.Client(transport=transport, base_url="http://node") as api:
            assert api.get("/v1/node").status_code == 200
        assert any(m.startswith("STATUS=") for m in listener.got)
        ready_at = len(listener.got)
        for _ in range(2):  # pings keep coming after READY, from the supervisor's ticks
            listener.got = listener.got[:ready_at]
            listener.until("WATCHDOG=1")
            ready_at = len(listener.got)
        resident = tmp_path / "data" / "resident.json"
        shown = wait_until(lambda: _chat_is(resident, "running"), DEADLINE_S, "chat running")
        assert shown["node_id"] == "n1" and shown["format"] == 1
        labels = tmp_path / "features.d" / "infer"
        features = wait_until(
            lambda: (
                "infervisor.io/model.tiny=true" in labels.read_text().split("\n")
                and labels.read_text()
            ),
            DEADLINE_S,
            "the model's label",
        )
        assert re.search(r"^# \+expiry-time=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", features, re.M)
        proc.send_signal(signal.SIGTERM)
        listener.until("STOPPING=1")
        assert proc.wait(timeout=DEADLINE_S) == 0, log.read_text()
        assert _chat_is(resident, "stopped"), resident.read_text()
        assert "infervisor.io/running=0" in (tmp_path / "features.d" / "infer").read_text()
        assert not list((tmp_path / "features.d").glob(".*")), "a temporary file was left"
    finally:
        end_runs([_Run(proc)], tmp_path / "data" / "chain.db")


class _Run:
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc


def _chat_is(path: Path, state: str) -> dict[str, object] | None:
    if not path.exists():
        return None
    shown = json.loads(path.read_text())
    chats = [i for i in shown["instances"] if i["role"] == "chat"]
    return shown if chats and chats[0]["state"] == state else None


# ---------------------------------------------------------------- in-process
def test_the_protocol_on_a_path_and_an_abstract_socket(tmp_path: Path) -> None:
    for address in (str(tmp_path / "notify"), f"@infervisor-unit-{os.getpid()}"):
        heard = Listener(address)
        try:
            env = {"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "42"}
            notify = Notifier.from_environ(env, pid=42)
            assert env == {}, "the variables are not passed on to children"
            assert notify.watchdog_s == 2.0
            assert notify.ready("up\nand running")
            assert heard.until("READY=1")[-1] == "READY=1\nSTATUS=up and running"
            assert notify.stopping("bye")
            heard.until("STOPPING=1")
            notify.close()
        finally:
            heard.close()


def test_the_watchdog_is_paced_by_half_its_timeout_and_only_when_it_is_ours() -> None:
    now = [100.0]
    notify = Notifier("@nobody-listens-here", watchdog_s=2.0, clock=lambda: now[0])
    sent: list[str] = []
    notify.send = lambda *lines: sent.append("\n".join(lines)) or True  # type: ignore[method-assign]
    pings = []
    for step in range(10):  # a tick every 0.25 s for 2.5 s
        now[0] = 100.0 + step * 0.25
        pings.append(notify.watchdog())
    assert pings == [True, False, False, False, True, False, False, False, True, False]
    assert sent == ["WATCHDOG=1"] * 3
    other = Notifier.from_environ(
        {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "7"}, pid=8
    )
    assert other.watchdog_s is None and other.enabled
    assert not Notifier.from_environ({}).enabled
    assert not Notifier("relative/path").enabled  # neither a path nor @name: ignored


def test_a_manager_that_is_gone_costs_a_notification_not_the_node(tmp_path: Path) -> None:
    notify = Notifier(str(tmp_path / "nobody"))
    assert notify.status("x") is False
    assert notify.status("y") is False
    notify.close()


def test_the_tick_callback_stops_when_the_node_has_failed() -> None:
    clock = ManualClock()
    dog = Watchdog(clock, stall_s=15.0)
    ticks: list[int] = []
    dog.on_tick(lambda: ticks.append(1))
    timer = clock.call_later(1.0, lambda: None)
    dog.watch_tick(timer)
    dog.watch_tick(timer)
    assert len(ticks) == 2
    dog.fail("supervision ticks", "blocked")
    dog.watch_tick(timer)
    assert len(ticks) == 2


def test_feature_labels_are_valid_label_names() -> None:
    assert label_value("llama3:8b-instruct/q4") == "llama3-8b-instruct-q4"
    assert label_value("::") is None
    assert len(label_value("x" * 100) or "") == 63
    from datetime import UTC, datetime

    text = features_text(NodeState(node_id="gpu 01", head_seq=3, head_hash=""), datetime.now(UTC))
    assert "infervisor.io/node-id=gpu-01" in text and "infervisor.io/running=0" in text


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not here")
def test_the_documented_systemd_unit_verifies(tmp_path: Path) -> None:
    doc = (Path(__file__).parents[1] / "docs" / "deploy.md").read_text()
    after = doc[doc.index("`/etc/systemd/system/infervisor.service`:") :]
    unit = re.search(r"```ini\n(.*?)```", after, re.S)
    assert unit is not None
    text = unit.group(1).replace("/opt/infervisor/.venv/bin/infervisor", str(INFERVISOR))
    assert "Type=notify" in text and "WatchdogSec=" in text
    path = tmp_path / "infervisor.service"
    path.write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_features_file_in_a_missing_folder_is_refused_naming_the_key(
    tmp_path: Path, fake_llama: str
) -> None:
    from infervisor.tools.node.config import ConfigError, load_config

    config = write_config(tmp_path, fake_llama, node_extra='features_file = "nowhere/infer"')
    with pytest.raises(ConfigError, match=r"\[node\] features_file 'nowhere/infer'"):
        load_config(config)


def test_the_watchdog_pings_come_from_the_supervisors_ticks_and_stop_while_it_is_wedged(
    nodes: Any, fake_llama: str, fake_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock()
    node = nodes.open(nodes.settings(fake_llama, fake_model, health_interval_s=1.0), clock)
    supervisor = node._actors.supervisor
    pings: list[float] = []
    node.on_tick(lambda: pings.append(clock.monotonic()))

    def handled_tick() -> int:
        clock.advance(node.settings.health_interval_s)
        supervisor.ask(m.Deregister(instance_id="-"), timeout=DEADLINE_S)  # handled all
        return len(pings)

    assert handled_tick() == 1 and handled_tick() == 2
    # Wedge the supervisor: it handles nothing until released.
    release, wedged = threading.Event(), threading.Event()

    def stuck(self: SupervisorActor, controller: str) -> None:
        wedged.set()
        release.wait(DEADLINE_S)

    monkeypatch.setattr(SupervisorActor, "_heard", stuck)
    node.heartbeat("ctl")
    assert wedged.wait(DEADLINE_S)
    for _ in range(3):
        clock.advance(node.settings.health_interval_s)  # ticks fire, none is handled
    assert len(pings) == 2, "a wedged supervisor must not ping"
    release.set()
    assert handled_tick() >= 3  # handled again: pinging again
