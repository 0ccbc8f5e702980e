"""adapters/activity.py: a server's own count of the requests it serves now.

The pure readings are checked on answers of every shape a server can give;
the ``slow`` tests read a real llama.cpp server on the tiny model (``/slots``
through the project's launcher, ``/metrics`` through
tests/programs/llama_counters_server.py) while a real streamed completion is
in flight and after it ends; Ollama is read from the project's Ollama test
server. Synchronisation is by condition and deadline.
"""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
from support import PROGRAMS, wait_until

from infervisor.adapters import ollama
from infervisor.adapters.activity import (
    Activity,
    ActivityError,
    ActivityReader,
    ActivitySource,
    from_metrics,
    from_ps,
    from_slots,
    renewed,
)
from infervisor.adapters.spec import Flavor

LAUNCHER = Path(sys.executable).with_name("infervisor-llama-server")
DEADLINE_S = 60.0
NOW_NS = 1_750_000_000 * 10**9

# --- pure readings ---------------------------------------------------------------------

# /slots as llama-server answers it (tools/server/README.md "GET /slots"), cut to
# the fields that matter; a slot repeats its sampling parameters besides.
SLOT_IDLE = b'{"id": 0, "n_ctx": 512, "speculative": false, "is_processing": false}'
SLOT_BUSY = b'{"id": 1, "n_ctx": 512, "is_processing": true, "id_task": 4, "params": {}}'


@pytest.mark.parametrize(
    ("body", "in_flight", "slots"),
    [
        (b"[" + SLOT_IDLE + b"]", 0, 1),
        (b"[" + SLOT_BUSY + b"]", 1, 1),
        (b"[" + SLOT_BUSY + b"," + SLOT_IDLE + b"," + SLOT_BUSY + b"]", 2, 3),
    ],
)
def test_slots_count_the_processing_ones(body: bytes, in_flight: int, slots: int) -> None:
    got = from_slots(body)
    assert (got.in_flight, got.slots, got.source) == (in_flight, slots, ActivitySource.SLOTS)
    assert got.idle is (in_flight == 0)
    assert got.seen == f"{in_flight} of {slots} slots processing"


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b"[]", b"5", b"{}", b'[{"id": 0}]', b'[{"is_processing": 1}]', b"[null]"],
)
def test_unreadable_slots_are_an_error(body: bytes) -> None:
    with pytest.raises(ActivityError, match="expected a list of slots") as caught:
        from_slots(body)
    assert (caught.value.source, caught.value.status) == (ActivitySource.SLOTS, 200)


METRICS = b"""# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
"""


def test_metrics_give_processing_and_deferred() -> None:
    got = from_metrics(METRICS)
    assert (got.in_flight, got.deferred, got.source) == (2, 1, ActivitySource.METRICS)
    assert got.seen == "2 requests processing, 1 deferred"
    only = from_metrics(b"llamacpp:requests_processing 0\n")
    assert (only.in_flight, only.deferred, only.idle) == (0, None, True)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"garbage{",
        b"llamacpp:requests_deferred 1\n",
        b"llamacpp:requests_processing -1\n",
        b"llamacpp:requests_processing 1.5\n",
        b"llamacpp:requests_processing NaN\n",
        b"\xff\xfe",
    ],
)
def test_unreadable_metrics_are_an_error(body: bytes) -> None:
    with pytest.raises(ActivityError, match="llamacpp:requests_processing") as caught:
        from_metrics(body)
    assert caught.value.source is ActivitySource.METRICS


def _ps(*entries: str) -> bytes:
    return b'{"models": [' + ",".join(entries).encode() + b"]}"


def test_ps_knows_loaded_never_in_flight() -> None:
    later = '{"name": "tinyllama:latest", "expires_at": "2025-06-15T16:46:40Z"}'
    got = from_ps(_ps(later), "tinyllama", NOW_NS)  # expires 6000 s after NOW_NS
    assert (got.in_flight, got.idle, got.loaded) == (None, None, True)
    assert got.expires_at_ns == NOW_NS + 6000 * 10**9
    assert "no in-flight count" in got.seen
    past = from_ps(_ps(later), "tinyllama", NOW_NS + 6001 * 10**9)
    assert past.loaded is False  # listed, but due to be dropped
    gone = from_ps(_ps(), "tinyllama", NOW_NS)
    assert (gone.loaded, gone.expires_at_ns) == (False, None)
    forever = from_ps(_ps('{"model": "tinyllama", "expires_at": "2318-01-01T00:00:00Z"}'), "t", 0)
    assert forever.loaded is False  # another model's entry
    kept = from_ps(_ps('{"model": "t", "expires_at": "2318-01-01T00:00:00Z"}'), "t", NOW_NS)
    assert (kept.loaded, kept.expires_at_ns) == (True, None)  # "forever"


@pytest.mark.parametrize("body", [b"", b"[]", b'{"models": 3}', b"<html>"])
def test_unreadable_ps_is_an_error(body: bytes) -> None:
    with pytest.raises(ActivityError, match="an Ollama model list"):
        from_ps(body, "tinyllama", NOW_NS)


def test_renewed_only_when_the_expiry_moved_later() -> None:
    def at(ns: int | None) -> Activity:
        return Activity(in_flight=None, source=ActivitySource.OLLAMA_PS, seen="", expires_at_ns=ns)

    assert renewed(at(1), at(2))
    assert not renewed(at(2), at(2))
    assert not renewed(at(2), at(1))
    assert not renewed(at(None), at(2))
    assert not renewed(at(1), at(None))


def test_mlx_lm_has_no_counters_and_is_never_asked() -> None:
    reader = ActivityReader(Flavor.MLX_LM, "http://127.0.0.1:9")  # nothing listens there
    got = reader.read(NOW_NS)
    assert (got.in_flight, got.source) == (None, ActivitySource.NONE)


def test_a_server_that_cannot_be_asked_is_an_error_without_status(port: int) -> None:
    reader = ActivityReader(Flavor.LLAMACPP, f"http://127.0.0.1:{port}", timeout=2.0)
    with pytest.raises(ActivityError) as caught:
        reader.read(NOW_NS)
    assert (caught.value.source, caught.value.status) == (ActivitySource.SLOTS, None)


class _Off(http.server.BaseHTTPRequestHandler):
    """llama-server started with --no-slots and without --metrics: both answer 501
    with its error shape (server.cpp, "This server does not support ... endpoint")."""

    asked: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.asked.append(self.path)
        body = (
            b'{"error": {"code": 501, "message": "not supported", "type": "not_supported_error"}}'
        )
        self.send_response(501)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_both_counters_off_is_unknown_not_an_error() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Off)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        reader = ActivityReader(Flavor.LLAMACPP, f"http://127.0.0.1:{server.server_port}")
        for _ in range(2):
            got = reader.read(NOW_NS)
            assert (got.in_flight, got.source, got.idle) == (None, ActivitySource.NONE, None)
        assert _Off.asked == ["/slots", "/metrics", "/slots", "/metrics"]  # asked again
        reader.close()
    finally:
        server.shutdown()
        server.server_close()


def test_ollama_needs_a_tag() -> None:
    with pytest.raises(ValueError, match="tag"):
        ActivityReader(Flavor.OLLAMA, "http://127.0.0.1:11434")


# --- the Ollama test server ------------------------------------------------------------


def test_ollama_loaded_then_renewed_then_gone(ollama_url) -> None:  # type: ignore[no-untyped-def]
    url = ollama_url("tinyllama", load_seconds=0.1)
    reader = ActivityReader(Flavor.OLLAMA, url, tag="tinyllama")
    assert reader.read(time.time_ns()).loaded is False
    ollama.load(url, "tinyllama", keep_alive=600)
    first = reader.read(time.time_ns())
    assert (first.loaded, first.in_flight) == (True, None)
    assert first.expires_at_ns is not None
    assert first.expires_at_ns > time.time_ns() + 500 * 10**9
    body = {"model": "tinyllama", "prompt": "hi", "stream": False, "keep_alive": 900}
    assert httpx.post(f"{url}/api/generate", json=body, timeout=30).status_code == 200
    assert renewed(first, reader.read(time.time_ns()))  # a request ended in between
    ollama.unload(url, "tinyllama")
    wait_until(lambda: reader.read(time.time_ns()).loaded is False, 30, "the model to go")
    reader.close()


# --- real llama.cpp servers ------------------------------------------------------------


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=out, start_new_session=True)


@pytest.fixture
def servers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(DEADLINE_S)


def _ready(base: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    def healthy() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            return httpx.get(f"{base}/health", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(healthy, DEADLINE_S, "the server to be healthy")


#: Streams sent at most until one is read in flight (each lasts a fraction of a second).
STREAMS = 10


def _in_flight_during_a_stream(base: str, reader: ActivityReader) -> list[int | None]:
    """Counts read before, during and after a streamed completion. "During" is the
    largest count read while the stream runs, polled from its start: the tiny model
    ends 480 tokens in a fraction of a second, and the server marks its slot busy
    on its own loop, so one reading after the first token found it idle at load
    10 either way. Under load a whole stream can even end between two readings
    (seen in a full suite run), so streams are sent again, up to
    :data:`STREAMS`, until one is seen in flight: the test is that the reader can
    see a stream, not that it sees every one."""
    seen = [reader.read(time.time_ns()).in_flight]
    body = {"prompt": "Hello", "n_predict": 480, "ignore_eos": True, "stream": True}
    done = threading.Event()

    def stream() -> None:
        try:
            with (
                httpx.Client(timeout=DEADLINE_S) as http,
                http.stream("POST", f"{base}/completion", json=body) as answer,
            ):
                for _ in answer.iter_lines():
                    pass
        finally:
            done.set()

    during = 0
    for _ in range(STREAMS):
        done.clear()
        streamer = threading.Thread(target=stream, daemon=True)
        streamer.start()
        while not done.is_set():
            during = max(during, reader.read(time.time_ns()).in_flight or 0)
        streamer.join(DEADLINE_S)
        if during:
            break
    seen.append(during)
    wait_until(lambda: reader.read(time.time_ns()).in_flight == 0, DEADLINE_S, "idle again")
    seen.append(0)
    return seen


@pytest.mark.slow
def test_llama_server_slots_through_the_launcher(
    tmp_path: Path, tiny_gguf: Path, port: int, servers: list[subprocess.Popen[bytes]]
) -> None:
    base, log = f"http://127.0.0.1:{port}", tmp_path / "server.log"
    argv = [str(LAUNCHER), "-m", str(tiny_gguf), "--port", str(port), "-c", "512"]
    servers.append(_start(argv, log))
    _ready(base, servers[0], log)
    reader = ActivityReader(Flavor.LLAMACPP, base, timeout=10.0)
    try:
        assert _in_flight_during_a_stream(base, reader) == [0, 1, 0]
        assert reader.read(time.time_ns()).source is ActivitySource.SLOTS
    finally:
        reader.close()


@pytest.mark.slow
def test_llama_server_metrics_when_slots_are_off(
    tmp_path: Path, tiny_gguf: Path, port: int, servers: list[subprocess.Popen[bytes]]
) -> None:
    base, log = f"http://127.0.0.1:{port}", tmp_path / "server.log"
    program = PROGRAMS / "llama_counters_server.py"
    argv = [sys.executable, str(program), "-m", str(tiny_gguf), "--port", str(port), "-c", "512"]
    servers.append(_start(argv, log))
    _ready(base, servers[0], log)
    assert httpx.get(f"{base}/slots", timeout=10).status_code == 501  # --no-slots
    reader = ActivityReader(Flavor.LLAMACPP, base, timeout=10.0)
    try:
        assert _in_flight_during_a_stream(base, reader) == [0, 1, 0]
        got = reader.read(time.time_ns())
        assert (got.source, got.deferred) == (ActivitySource.METRICS, 0)
    finally:
        reader.close()
