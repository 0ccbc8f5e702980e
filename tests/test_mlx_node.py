"""Issue 3 through the Node API: adopted and managed mlx-lm, on the real
``mlx_lm.server`` and the project's tiny MLX model (slow).

mlx-lm never exits by itself when it cannot serve (docs/mlx-lm-notes.md): a
broken model and a taken port both leave it running. The node must read the
reason from its output and end the instance failed, not loading forever.
"""

from __future__ import annotations

import importlib.util
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import NodeFactory
from support import OwnServer, own_server, pids_of_group, wait_until

from infervisor.actors.errors import VerbRefused
from infervisor.actors.node import Node
from infervisor.adapters.manifest import ModelFormat
from infervisor.adapters.ports import free_port
from infervisor.adapters.spec import Flavor, InstanceSpec, Mode
from infervisor.replay import RestartPolicy, timeline
from infervisor.tools.servers.tinymlx import generate_tiny_mlx

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("mlx_lm") is None,
        reason="mlx-lm is not installed (on Linux: pip install 'mlx-lm[cpu]')",
    ),
]

DEADLINE_S = 90.0  # spawn to serving or to failed, generous (about 1.5 s measured)
MLX_SERVER = str(Path(sys.executable).parent / "mlx_lm.server")
# One restart, soon: a broken server fails twice, then the budget is spent.
ONE_RESTART = RestartPolicy(max_restarts=1, base_s=0.2, cap_s=1.0, stable_after_s=60.0)


def mlx_spec(port: int, model: str = "tiny-mlx") -> InstanceSpec:
    return InstanceSpec(role="chat", flavor=Flavor.MLX_LM, model=model, port=port)


def one_token(base_url: str) -> bool:
    try:
        r = httpx.post(f"{base_url}/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
    except httpx.TransportError:
        return False
    return r.status_code == 200


@pytest.fixture
def registry(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    return root


def mlx_node(nodes: NodeFactory, registry: Path, program: str = MLX_SERVER, **kw: object) -> Node:
    settings = nodes.settings("infervisor-llama-server", registry, mlx_program=program, **kw)
    return nodes.open(settings)


def adopt_tiny(node: Node, name: str = "tiny-mlx") -> Path:
    return generate_tiny_mlx(node.registry.root / name, seed=0)


def reasons(node: Node, iid: str) -> list[str]:
    return [e.reason for e in timeline(node.settings.chain_path, iid)]


# --- adopted --------------------------------------------------------------------------


@pytest.fixture
def their_mlx(tmp_path: Path) -> Iterator[OwnServer]:
    """A real mlx_lm.server somebody else runs, offline, with an empty cache of its own."""
    model = generate_tiny_mlx(tmp_path / "their-model", seed=0)
    hub = tmp_path / "their-hf" / "hub"
    hub.mkdir(parents=True)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(hub.parent),
        "HF_HUB_CACHE": str(hub),
    }
    port = free_port()
    argv = [MLX_SERVER, "--model", str(model), "--host", "127.0.0.1", "--port", str(port)]
    with own_server(argv, cwd=tmp_path / "theirs", port=port, env=env) as server:

        def ready() -> bool:
            server.check_alive()
            return one_token(server.base_url)

        wait_until(ready, DEADLINE_S, "their mlx_lm.server answering one token")
        yield server


def test_adopted_mlx_is_observed_and_stop_is_refused(
    nodes: NodeFactory, registry: Path, their_mlx: OwnServer
) -> None:
    node = mlx_node(nodes, registry)
    spec = InstanceSpec(role="ext", flavor=Flavor.MLX_LM, mode=Mode.ADOPTED, port=their_mlx.port)
    notes = node.admit(spec).notes
    assert notes[:2] == [f"endpoint {their_mlx.base_url}", "adopting running server (up)"]
    iid = node.place(spec)
    assert node.start(iid).lifecycle == "running"
    node.wait_for(iid, lambda v: v.health == "up", 60)
    with pytest.raises(VerbRefused, match="observes it and never stops it"):
        node.stop(iid)
    assert their_mlx.alive()
    node.shutdown()
    assert their_mlx.alive()
    assert one_token(their_mlx.base_url)


# --- managed --------------------------------------------------------------------------


def test_managed_mlx_reaches_running_through_one_token(nodes: NodeFactory, registry: Path) -> None:
    node = mlx_node(nodes, registry)
    node.registry.adopt("tiny-mlx", adopt_tiny(node), format=ModelFormat.MLX)
    spec = mlx_spec(free_port())
    iid = node.place(spec)
    node.start(iid)
    view = node.wait_for(iid, lambda v: v.lifecycle == "running", DEADLINE_S)
    assert one_token(spec.base_url)
    assert node.deep_health(iid)
    moves = [(e.frm, e.to) for e in timeline(node.settings.chain_path, iid) if e.frm != e.to]
    assert moves == [("-", "loaded"), ("loaded", "starting"), ("starting", "running")]
    node.stop(iid)
    assert view.pid is not None and pids_of_group(view.pid) == []


def test_broken_model_ends_failed_with_the_reason_from_its_output(
    nodes: NodeFactory, registry: Path
) -> None:
    node = mlx_node(nodes, registry, restart=ONE_RESTART)
    model = adopt_tiny(node, "broken")
    (model / "model.safetensors").write_bytes(b"garbage" * 100)
    node.registry.adopt("broken", model, format=ModelFormat.MLX)
    iid = node.place(mlx_spec(free_port(), model="broken"))
    node.start(iid)
    view = node.wait_for(iid, lambda v: v.lifecycle == "failed", DEADLINE_S)
    assert "restart budget spent (1 restarts)" in view.reason
    assert "generation thread died: " in view.reason
    died = [r for r in reasons(node, iid) if "generation thread died: " in r]
    assert any("Invalid json header length" in r for r in died), died
    assert view.pid is None


def port_holder(directory: Path) -> str:
    """A launcher that first has a child of its own take the ``--port`` it was given
    (bound and listening), then execs mlx_lm.server: the node's check that the port
    is free passes, and the server then finds its port taken."""
    path = directory / "hold-port-then-mlx"
    path.write_text(
        f"""#!{sys.executable}
import os, signal, socket, sys

port = int(sys.argv[sys.argv.index("--port") + 1])
ready_r, ready_w = os.pipe()
if os.fork() == 0:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    os.write(ready_w, b"x")
    while True:
        signal.pause()
os.read(ready_r, 1)
os.execv({MLX_SERVER!r}, [{MLX_SERVER!r}, *sys.argv[1:]])
"""
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_taken_port_ends_failed_with_the_reason_from_its_output(
    nodes: NodeFactory, registry: Path, tmp_path: Path
) -> None:
    node = mlx_node(
        nodes, registry, program=port_holder(tmp_path), restart=ONE_RESTART, probe_timeout_s=1.0
    )
    node.registry.adopt("tiny-mlx", adopt_tiny(node), format=ModelFormat.MLX)
    iid = node.place(mlx_spec(free_port()))
    node.start(iid)
    view = node.wait_for(iid, lambda v: v.lifecycle == "failed", DEADLINE_S)
    assert "restart budget spent (1 restarts)" in view.reason
    assert "Address already in use" in view.reason
    taken = [r for r in reasons(node, iid) if "OSError: [Errno 98] Address already in use" in r]
    assert len(taken) >= 2, reasons(node, iid)  # the first run and the restart
    assert view.pid is None
