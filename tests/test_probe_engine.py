"""The node's probing engine (adapters/probe_engine.py) against real servers.

The fault-injecting server (tests/programs/http_fault.py, HTTP/1.0) and the
cheap keep-alive fake (bench/_fake_keepalive.py, HTTP/1.1) answer; the
engine must judge every answer exactly as the synchronous ServerClient does,
keep its connection between probes, and never let a hung server hold up the
probe of another.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import wait_until
from test_probe import server  # noqa: F401 - the fixture

from infervisor.adapters import probe_http
from infervisor.adapters.ports import free_port
from infervisor.adapters.probe import HealthKind, ProbeTarget, ServerClient, ServerReport
from infervisor.adapters.probe_engine import ProbeEngine
from infervisor.adapters.spec import Flavor

KEEPALIVE = Path(__file__).parent.parent / "bench" / "_fake_keepalive.py"
DEADLINE = 60.0  # a bound on a hang, never a measurement: generous at load 10
MODES = [
    "ok",
    "ok-legacy-models",
    "models-garbage",
    "loading-nested",
    "loading-flat",
    "500",
    "garbage",
    "huge",
]


@pytest.fixture
def engine() -> Iterator[ProbeEngine]:
    e = ProbeEngine()
    yield e
    e.close()


class Reports:
    """Collects the reports the engine hands back, per key."""

    def __init__(self) -> None:
        self.got: dict[str, list[ServerReport]] = {}
        self._lock = threading.Lock()

    def done(self, key: str):  # type: ignore[no-untyped-def]
        def deliver(report: ServerReport) -> None:
            with self._lock:
                self.got.setdefault(key, []).append(report)

        return deliver

    def count(self, key: str) -> int:
        with self._lock:
            return len(self.got.get(key, []))

    def wait(self, key: str, n: int = 1) -> ServerReport:
        wait_until(lambda: self.count(key) >= n, DEADLINE, f"{n} report(s) of {key}")
        with self._lock:
            return self.got[key][n - 1]


def probe_once(engine: ProbeEngine, url: str, flavor: Flavor, timeout: float = 2.0):  # type: ignore[no-untyped-def]
    reports = Reports()
    engine.probe(url, ProbeTarget(url, flavor, timeout), reports.done(url))
    return reports.wait(url)


@pytest.mark.parametrize("mode", MODES)
def test_every_answer_is_judged_as_the_synchronous_client_judges_it(
    server,  # noqa: F811 - the fixture
    engine: ProbeEngine,
    mode: str,
) -> None:
    url = server(mode)
    with ServerClient(url) as client:
        expected = client.probe(Flavor.LLAMACPP)
    assert probe_once(engine, url, Flavor.LLAMACPP) == expected


def test_ollama_answers_are_judged_alike(server, engine: ProbeEngine) -> None:  # noqa: F811
    url = server("ollama")
    with ServerClient(url) as client:
        expected = client.probe(Flavor.OLLAMA)
    assert expected.health.kind is HealthKind.UP
    assert probe_once(engine, url, Flavor.OLLAMA) == expected


def test_refused_is_unreachable_and_worded_as_the_client_words_it(engine: ProbeEngine) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    report = probe_once(engine, url, Flavor.LLAMACPP)
    assert report.health.kind is HealthKind.UNREACHABLE
    assert report.health.reason.startswith(f"{url}/health: cannot connect")


@pytest.fixture
def hung() -> Iterator[str]:
    """A server that accepts connections (the kernel does) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def keepalive(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, str(KEEPALIVE), "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(argv, cwd=tmp_path, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(port), DEADLINE, "the keep-alive fake listening")
        yield url
    finally:
        proc.kill()
        proc.wait()


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def test_a_hung_server_delays_no_other_probe(
    engine: ProbeEngine, hung: str, keepalive: str
) -> None:
    reports = Reports()
    engine.probe("hung", ProbeTarget(hung, Flavor.LLAMACPP, 3.0), reports.done("hung"))
    for n in range(1, 6):  # five probes of a healthy server while the hung one waits
        engine.probe("ok", ProbeTarget(keepalive, Flavor.LLAMACPP, 3.0), reports.done("ok"))
        assert reports.wait("ok", n).health.kind is HealthKind.UP
    assert reports.count("hung") == 0  # still waiting for its own timeout
    late = reports.wait("hung")
    assert late.health.kind is HealthKind.UNREACHABLE
    assert late.health.reason == f"{hung}/health: no answer within 3.0 s"


def test_one_connection_is_kept_between_probes(engine: ProbeEngine, keepalive: str) -> None:
    reports = Reports()
    before = stats(keepalive)
    for n in range(1, 21):
        engine.probe("k", ProbeTarget(keepalive, Flavor.LLAMACPP, 2.0), reports.done("k"))
        assert reports.wait("k", n).health.kind is HealthKind.UP
    after = stats(keepalive)
    assert after["health"] - before["health"] == 20
    assert after["connections"] - before["connections"] == 2  # the engine's one, and stats'


def stats(url: str) -> dict[str, int]:
    """What the keep-alive fake counted: requests per route, connections accepted."""
    with urllib.request.urlopen(f"{url}/bench/stats", timeout=DEADLINE) as answer:
        found: dict[str, int] = json.load(answer)
    return found


def test_a_probe_while_one_runs_is_refused_at_once(engine: ProbeEngine, hung: str) -> None:
    reports = Reports()
    engine.probe("h", ProbeTarget(hung, Flavor.LLAMACPP, 3.0), reports.done("h"))
    engine.probe("h", ProbeTarget(hung, Flavor.LLAMACPP, 3.0), reports.done("h"))
    first = reports.wait("h")
    assert first.health.reason == "a probe is still running"
    assert reports.wait("h", 2).health.kind is HealthKind.UNREACHABLE


def test_after_close_no_report_is_delivered(hung: str) -> None:
    engine = ProbeEngine()
    reports = Reports()
    engine.probe("h", ProbeTarget(hung, Flavor.LLAMACPP, 30.0), reports.done("h"))
    engine.close()
    engine.probe("h", ProbeTarget(hung, Flavor.LLAMACPP, 30.0), reports.done("h"))
    assert reports.count("h") == 0


class FlakyServer:
    """A keep-alive HTTP/1.1 server on a thread that can turn rude: then it closes
    every connection at once, and the one kept open since, without answering."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.rude = threading.Event()
        self.kept: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.rude.is_set():
                conn.close()
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        self.kept.append(conn)
        body = b'{"status":"ok"}'
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        with contextlib.suppress(OSError):
            while conn.recv(65536):
                if self.rude.is_set():
                    break
                conn.sendall(head + body)
        conn.close()

    def turn_rude(self) -> None:
        self.rude.set()
        for conn in self.kept:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.sock.close()


def test_a_server_that_closes_every_connection_is_a_plain_verdict_each_time(
    engine: ProbeEngine,
) -> None:
    flaky = FlakyServer()
    try:
        reports = Reports()
        for n in (1, 2):  # up, over one kept connection
            engine.probe("f", ProbeTarget(flaky.url, Flavor.LLAMACPP, 5.0), reports.done("f"))
            assert reports.wait("f", n).health.kind is HealthKind.UP
        flaky.turn_rude()
        for n in (3, 4, 5):  # the kept one is closed, and so is each new one
            engine.probe("f", ProbeTarget(flaky.url, Flavor.LLAMACPP, 5.0), reports.done("f"))
            report = reports.wait("f", n)
            assert report.health.kind is HealthKind.UNREACHABLE, report
            assert "closed the connection without answering" in report.health.reason
        flaky.rude.clear()
        engine.probe("f", ProbeTarget(flaky.url, Flavor.LLAMACPP, 5.0), reports.done("f"))
        assert reports.wait("f", 6).health.kind is HealthKind.UP  # and it recovers
    finally:
        flaky.close()


class ScriptedServer:
    """A keep-alive HTTP/1.1 server on a thread whose /health answers follow a
    script, one entry per request: "ok" (a length), "chunked", "huge" (a body
    beyond the engine's limit), "hang" (no answer). Counts its connections."""

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)
        self.connections = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            while True:
                request = conn.recv(65536)
                if not request:
                    return
                if request.startswith(b"GET /v1/models"):
                    conn.sendall(_answer(b'{"data":[{"id":"tiny"}]}'))
                    continue
                mode = self.script.pop(0)
                if mode == "hang":
                    conn.recv(65536)  # until the engine gives up and closes
                    return
                if mode == "chunked":
                    body = b'{"status":"ok"}'
                    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    conn.sendall(head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
                    continue
                size = 100_000 if mode == "huge" else 0
                conn.sendall(_answer(b'{"status":"ok"}' + b" " * size))

    def close(self) -> None:
        self.sock.close()


def _answer(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def test_answers_over_a_kept_connection_each_judged_and_the_connection_replaced_when_spent(
    engine: ProbeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's callback path (a kept connection, no task): chunked bodies, a
    body beyond the limit (the connection dropped), a hang (the timeout, the
    connection dropped), each followed by a probe that connects again."""
    sent: list[bool] = []  # each request: over the kept connection (True) or not
    send = probe_http.Connection.send

    def counted(self: probe_http.Connection, path: str, answered: probe_http.Answered) -> bool:
        sent.append(send(self, path, answered))
        return sent[-1]

    monkeypatch.setattr(probe_http.Connection, "send", counted)
    script = ["ok", "chunked", "ok", "huge", "ok", "hang", "ok"]
    scripted = ScriptedServer(script)
    try:
        reports = Reports()
        for n in range(1, len(script) + 1):
            target = ProbeTarget(scripted.url, Flavor.LLAMACPP, 1.0)
            engine.probe("s", target, reports.done("s"))
            reports.wait("s", n)
        kinds = [r.health.kind for r in reports.got["s"]]
        up, down = HealthKind.UP, HealthKind.UNREACHABLE
        assert kinds[:3] == [up, up, up] and kinds[4] is up and kinds[6] is up, kinds
        assert reports.got["s"][0].models == ["tiny"] and reports.got["s"][1].models == ["tiny"]
        assert kinds[3] is not up  # what the synchronous client says of a body too long
        assert kinds[5] is down
        assert reports.got["s"][5].health.reason == f"{scripted.url}/health: no answer within 1.0 s"
        assert scripted.connections == 3  # kept through 1-4, again 5-6, again 7
        # each probe's requests (/health, then /v1/models at first and after a
        # verdict other than up or unreachable): a new connection False, the kept one True
        by_probe = [[False, True], [True], [True], [True], [False, True], [True], [False]]
        assert sent == [kept for probe in by_probe for kept in probe], sent
    finally:
        scripted.close()
