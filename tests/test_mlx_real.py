"""The real ``mlx_lm.server`` on the tiny MLX model, and how it really fails.

Facts these tests pin down (mlx-lm 0.32.2, mlx 0.32.4 on Linux CPU; see
docs/mlx-lm-notes.md):

- ``GET /health`` answers 200 while the model is still loading, so only a
  one-token completion proves the server is ready;
- a model that fails to load leaves the process running, listening, with
  ``/health`` 503 and every completion 404 ``{"error": "generation thread died"}``;
- a taken port leaves the process running without listening at all;
- ``/v1/models`` names the ``--model`` path whether or not it loaded;
- SIGTERM ends it at once, by the signal (no handler).

The server runs in its own session with ``HF_HUB_OFFLINE=1`` and a private,
empty Hugging Face cache. Waits poll a condition with a deadline; the pause
between polls is a wait on the server process, so a death is seen at once.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from support import pids_of_group, run_tool

from infervisor.tools.servers.tinymlx import (
    SPECIAL_TOKENS,
    TinyMlxDims,
    byte_alphabet,
    generate_tiny_mlx,
    safetensors_bytes,
)

needs_mlx_lm = pytest.mark.skipif(
    importlib.util.find_spec("mlx_lm") is None,
    reason="mlx-lm is not installed (on Linux: pip install 'mlx-lm[cpu]')",
)
READY_DEADLINE_S = 60.0
EXIT_DEADLINE_S = 30.0
ONE_TOKEN = {"prompt": "Hello", "max_tokens": 1}
DIED = {"error": "generation thread died"}
DIED_LOG = "ERROR - mlx_lm.server generation thread died: "
PORT_TAKEN_LOG = "OSError: [Errno 98] Address already in use"


class Server:
    """A real ``python -m mlx_lm server`` process and its captured output."""

    def __init__(self, model: Path | str, port: int, tmp: Path) -> None:
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.out = tmp / "server.out"
        self.err = tmp / "server.err"
        hub = tmp / "hf" / "hub"
        hub.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(hub.parent)}
        env |= {"HF_HUB_CACHE": str(hub), "PYTHONUNBUFFERED": "1"}
        argv = [sys.executable, "-m", "mlx_lm", "server", "--model", str(model)]
        argv += ["--host", "127.0.0.1", "--port", str(port)]
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=err, env=env, start_new_session=True
            )

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def pause(self) -> None:
        """Wait briefly on the process; fail at once if it has exited."""
        try:
            rc = self.proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            return
        pytest.fail(f"mlx_lm.server exited with {rc}:\n{self.stderr()[-3000:]}")

    def wait_for(self, what: str, check: Callable[[], Any]) -> Any:
        """Poll ``check`` until it returns something truthy, within the deadline."""
        deadline = time.monotonic() + READY_DEADLINE_S
        while time.monotonic() < deadline:
            if value := check():
                return value
            self.pause()
        pytest.fail(f"no {what} after {READY_DEADLINE_S} s:\n{self.stderr()[-3000:]}")

    def get(self, path: str) -> httpx.Response | None:
        """The answer, or ``None`` while nothing answers on the port."""
        try:
            return httpx.get(self.base + path, timeout=5)
        except httpx.TransportError:
            return None

    def answer(self, path: str) -> tuple[int, Any]:
        """(status, JSON body) of a GET that must be answered."""
        r = httpx.get(self.base + path, timeout=5)
        return r.status_code, r.json()

    def post(self, path: str, body: dict[str, Any], timeout: float = 30) -> httpx.Response:
        return httpx.post(self.base + path, json=body, timeout=timeout)

    def one_token(self) -> dict[str, Any] | None:
        """A one-token completion's JSON once it succeeds; ``None`` until then."""
        try:
            r = self.post("/v1/completions", ONE_TOKEN)
        except httpx.TransportError:
            return None
        return r.json() if r.status_code == 200 else None

    def listening(self) -> list[int]:
        conns = psutil.Process(self.proc.pid).net_connections(kind="tcp")
        return [c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN]

    def terminate(self) -> int:
        """SIGTERM the group, wait, and check no process of the group is left."""
        started = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGTERM)
        rc = self.proc.wait(EXIT_DEADLINE_S)
        assert time.monotonic() - started < 2.0
        assert pids_of_group(self.proc.pid) == []
        return rc


def _status(response: httpx.Response | None) -> int | None:
    return None if response is None else response.status_code


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return generate_tiny_mlx(tmp_path / "tiny", seed=0)


@pytest.fixture
def start(tmp_path: Path, port: int) -> Iterator[Callable[[Path | str], Server]]:
    """Start servers on ``port``; SIGKILL the group of any still running at teardown."""
    servers: list[Server] = []

    def _start(model: Path | str) -> Server:
        servers.append(Server(model, port, tmp_path))
        return servers[-1]

    yield _start
    for s in servers:
        if s.proc.poll() is None:
            os.killpg(s.proc.pid, signal.SIGKILL)
        s.proc.wait(EXIT_DEADLINE_S)


# --- the generator ----------------------------------------------------------


def test_same_seed_gives_identical_files(tmp_path: Path) -> None:
    a = generate_tiny_mlx(tmp_path / "a", seed=7)
    b = generate_tiny_mlx(tmp_path / "b", seed=7)
    names = sorted(p.name for p in a.iterdir())
    assert names == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_other_seed_gives_other_weights(tmp_path: Path) -> None:
    a = generate_tiny_mlx(tmp_path / "a", seed=0) / "model.safetensors"
    b = generate_tiny_mlx(tmp_path / "b", seed=1) / "model.safetensors"
    assert a.stat().st_size == b.stat().st_size == 463_720
    assert a.read_bytes() != b.read_bytes()


@needs_mlx_lm
def test_weights_are_what_safetensors_itself_writes(tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save

    path = generate_tiny_mlx(tmp_path / "m", seed=3) / "model.safetensors"
    tensors = load_file(path)
    assert len(tensors) == 3 + 9 * 2
    assert tensors["lm_head.weight"].shape == (259, 64)
    assert save(tensors, metadata={"format": "mlx"}) == path.read_bytes()
    assert safetensors_bytes(tensors, {"format": "mlx"}) == path.read_bytes()


@needs_mlx_lm
def test_tokenizer_is_byte_level(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(generate_tiny_mlx(tmp_path / "m") / "tokenizer.json"))
    text = "héllo\n wörld \U0001f642\x00"
    ids = tok.encode(text).ids
    assert ids == list(text.encode())
    assert tok.decode(ids) == text
    assert tok.get_vocab_size() == 259
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [256, 257, 258]
    assert len(set(byte_alphabet())) == 256


def test_heads_must_divide_hidden(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="multiple of heads"):
        generate_tiny_mlx(tmp_path / "bad", dims=TinyMlxDims(hidden=60, heads=8))


def test_command_line_writes_the_directory(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    assert run_tool("servers.tinymlx", str(out), "--seed", "3") == str(out)
    api = generate_tiny_mlx(tmp_path / "api", seed=3)
    assert (out / "model.safetensors").read_bytes() == (api / "model.safetensors").read_bytes()


_LOAD_AND_GENERATE = """
import json, sys
from mlx_lm import generate, load
model, tok = load(sys.argv[1])
chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
print(json.dumps({
    "eos": sorted(tok.eos_token_ids),
    "ids": tok.encode("a é"),
    "chat": tok.decode(chat),
    "text": generate(model, tok, "Hello", max_tokens=24),
}))
"""


@needs_mlx_lm
def test_mlx_lm_loads_it_offline_and_generates_printable_text(tmp_path: Path) -> None:
    directory = generate_tiny_mlx(tmp_path / "m")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run(
        [sys.executable, "-c", _LOAD_AND_GENERATE, str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["eos"] == [256, 258]
    assert got["ids"] == list("a é".encode())
    assert got["chat"] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert len(got["text"]) == 24  # never stops early: special tokens are suppressed
    assert all(" " <= c <= "~" for c in got["text"])


# --- the real server ---------------------------------------------------------


@pytest.mark.slow
@needs_mlx_lm
def test_serves_one_token_then_stops_on_sigterm(
    model: Path, start: Callable[[Path | str], Server]
) -> None:
    t0 = time.monotonic()
    server = start(model)
    done = server.wait_for("one-token completion", server.one_token)
    ready_s = time.monotonic() - t0
    assert done["object"] == "text_completion"
    assert done["model"] == "default_model"
    assert done["choices"][0]["finish_reason"] == "length"
    assert len(done["choices"][0]["text"]) == 1
    assert done["usage"]["completion_tokens"] == 1

    assert server.answer("/health") == (200, {"status": "ok"})
    status, models = server.answer("/v1/models")
    assert status == 200
    assert [(m["id"], m["object"]) for m in models["data"]] == [(str(model.resolve()), "model")]

    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    answer = server.post("/v1/chat/completions", chat).json()
    assert answer["object"] == "chat.completion"
    assert len(answer["choices"][0]["message"]["content"]) == 1
    assert server.listening() == [server.port]

    rss_mib = psutil.Process(server.proc.pid).memory_info().rss / 2**20
    assert rss_mib < 1024  # about 85 MiB measured
    assert ready_s < READY_DEADLINE_S  # about 1.2 s measured
    assert server.terminate() == -signal.SIGTERM
    assert f"INFO - Starting httpd at 127.0.0.1 on port {server.port}..." in server.stderr()


@pytest.mark.slow
@needs_mlx_lm
def test_health_is_ok_while_the_model_is_still_loading(
    model: Path, start: Callable[[Path | str], Server]
) -> None:
    # A FIFO as config.json: the loader blocks opening it, for as long as we like.
    (model / "config.json").unlink()
    os.mkfifo(model / "config.json")
    server = start(model)
    health = server.wait_for("answer on /health", lambda: server.get("/health"))
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    with pytest.raises(httpx.ReadTimeout):
        server.post("/v1/completions", ONE_TOKEN, timeout=2)
    assert server.answer("/health") == (200, {"status": "ok"})
    assert server.terminate() == -signal.SIGTERM


def _corrupt(model: Path) -> str:
    (model / "model.safetensors").write_bytes(b"garbage" * 100)
    return "[load_safetensors] Invalid json header length file "


def _truncated(model: Path) -> str:
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200_000])
    return "invalid data offsets"


def _no_weights(model: Path) -> str:
    (model / "model.safetensors").unlink()
    return f"No safetensors found in {model}"


def _missing_dir(model: Path) -> str:
    return "Repo id must be in the form 'repo_name' or 'namespace/repo_name'"


BREAKAGES: dict[str, Callable[[Path], str]] = {
    "corrupt-weights": _corrupt,
    "truncated-weights": _truncated,
    "no-weights": _no_weights,
    "missing-dir": _missing_dir,
}


@pytest.mark.slow
@needs_mlx_lm
@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_broken_model_keeps_running_with_health_503(
    tmp_path: Path, model: Path, start: Callable[[Path | str], Server], breakage: str
) -> None:
    expected = BREAKAGES[breakage](model)
    path = tmp_path / "nowhere" if breakage == "missing-dir" else model
    server = start(path)
    server.wait_for("load failure on stderr", lambda: DIED_LOG in server.stderr())
    died = next(line for line in server.stderr().splitlines() if DIED_LOG in line)
    assert expected in died

    # The error is logged a moment before the thread is marked failed: wait for 503.
    server.wait_for("503 on /health", lambda: _status(server.get("/health")) == 503)
    assert server.answer("/health") == (503, {"status": "unavailable"})
    done = server.post("/v1/completions", ONE_TOKEN)
    assert (done.status_code, done.json()) == (404, DIED)
    status, models = server.answer("/v1/models")
    listed = [m["id"] for m in models["data"]]
    assert (status, listed) == (200, [] if breakage == "missing-dir" else [str(model.resolve())])

    assert server.proc.poll() is None  # it never exits by itself
    assert server.terminate() == -signal.SIGTERM


@pytest.mark.slow
@needs_mlx_lm
def test_taken_port_keeps_running_without_listening(
    model: Path, port: int, start: Callable[[Path | str], Server]
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        server = start(model)
        server.wait_for("bind failure on stderr", lambda: PORT_TAKEN_LOG in server.stderr())
        assert server.stderr().rstrip().endswith(PORT_TAKEN_LOG)
        # The main thread is gone; the non-daemon generation thread keeps the process.
        with pytest.raises(subprocess.TimeoutExpired):
            server.proc.wait(timeout=2)
        assert server.listening() == []
        assert server.terminate() == -signal.SIGTERM
