"""Issue 12, item 7: deep health (one real token) on the kind's schedule.

Each server here answers its health endpoint (200) while every completion
fails: llama.cpp (tests/programs/fault_no_completions.py, managed), mlx-lm
(tests/programs/fake_mlx.py, speaking mlx_lm.server's protocol, adopted) and
Ollama (the Ollama test server with ``--fail-completions``, managed). Ordinary
probes never notice; the kind's ``deep_interval_s`` does: each failed deep
check is recorded, and ``miss_limit`` of them make the instance unhealthy (a
managed process is then restarted under the policy).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from conftest import NodeFactory
from support import PROGRAMS, make_launcher, ollama_server, own_server, wait_until

from infervisor.actors.kinds import KindSettings
from infervisor.actors.node import Node
from infervisor.adapters.manifest import ModelFormat
from infervisor.adapters.ports import free_port
from infervisor.adapters.spec import Flavor, InstanceSpec, Mode
from infervisor.replay import RestartPolicy, timeline
from infervisor.tools.api.serving.server import ApiServer
from infervisor.tools.cli import cli

DEEP = KindSettings(
    deep_interval_s=0.1,
    startup_deadline_s=20.0,
    startup_cap_s=20.0,
    miss_limit=2,
    restart=RestartPolicy(max_restarts=1, base_s=0.1, cap_s=0.2, stable_after_s=60.0),
)


def kinds(node: Node, iid: str) -> list[str]:
    return [e.kind for e in timeline(node.settings.chain_path, iid)]


def reasons(node: Node, iid: str, kind: str) -> list[str]:
    return [e.reason for e in timeline(node.settings.chain_path, iid) if e.kind == kind]


@pytest.fixture
def node_for(nodes: NodeFactory, fake_model: Path) -> Any:
    def open_node(program: str) -> Node:
        settings = nodes.settings(
            program, fake_model, kinds={"deep": DEEP, "plain": KindSettings()}
        )
        n = nodes.open(settings)
        n.registry.adopt("tiny", fake_model / "tiny.gguf")
        n.registry.adopt("tinyllama", format=ModelFormat.OLLAMA, ollama_tag="tinyllama")
        return n

    return open_node


def test_llamacpp_whose_completions_fail_is_killed_and_restarted(
    node_for: Any, tmp_path: Path
) -> None:
    node = node_for(make_launcher(tmp_path, PROGRAMS / "fault_no_completions.py"))
    spec = InstanceSpec(
        role="chat", flavor=Flavor.LLAMACPP, model="tiny", port=free_port(), kind="deep"
    )
    iid = node.place(spec)
    node.start(iid)
    wait_until(lambda: "instance.restart_scheduled" in kinds(node, iid), 30, "a restart")
    events = kinds(node, iid)
    assert events[:5] == [
        "instance.placed",
        "instance.starting",
        "instance.spawned",
        "instance.ready",  # /health answered
        "instance.deep_health_failed",
    ]
    [first, *_] = reasons(node, iid, "instance.deep_health_failed")
    assert "injected: KV cache allocation failed" in first
    unhealthy = reasons(node, iid, "instance.unhealthy")
    assert unhealthy and "deep health: no token of completion" in unhealthy[0]
    assert "instance.terminating" in events
    node.stop(iid)


def test_mlx_whose_completions_fail_is_unhealthy(node_for: Any, tmp_path: Path) -> None:
    node = node_for(make_launcher(tmp_path, PROGRAMS / "fake_llama.py"))
    port = free_port()
    argv = [sys.executable, str(PROGRAMS / "fake_mlx.py"), "--port", str(port)]
    with own_server(argv, cwd=tmp_path / "mlx", port=port):
        spec = InstanceSpec(
            role="chat", flavor=Flavor.MLX_LM, mode=Mode.ADOPTED, model="mlx-model",
            port=port, kind="deep",
        )  # fmt: skip
        wait_until(lambda: _answers(f"http://127.0.0.1:{port}"), 20, "the mlx server")
        iid = node.place(spec)
        node.start(iid)
        view = node.wait_for(iid, lambda v: v.lifecycle == "unhealthy", 60)
        assert "deep health: no token of completion" in view.reason
        assert "adopted servers are not restarted" in view.reason
        assert reasons(node, iid, "instance.deep_health_failed")


def _answers(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
    return False


def test_ollama_whose_completions_fail_is_unhealthy(node_for: Any, tmp_path: Path) -> None:
    node = node_for(make_launcher(tmp_path, PROGRAMS / "fake_llama.py"))
    with ollama_server("tinyllama", load_seconds=0.1, fail_completions=True) as srv:
        spec = InstanceSpec(
            role="llm", flavor=Flavor.OLLAMA, model="tinyllama", port=srv.port, kind="deep"
        )
        iid = node.place(spec)
        node.start(iid)
        view = node.wait_for(iid, lambda v: v.lifecycle == "unhealthy", 60)
        assert "deep health: no token of completion" in view.reason
        assert "llama runner process no longer running" in view.reason
        assert kinds(node, iid).count("instance.deep_health_failed") == 2  # miss_limit
        assert node.stop(iid).lifecycle == "stopped"


def test_health_cli_runs_a_deep_check_on_demand(node_for: Any, tmp_path: Path) -> None:
    node = node_for(make_launcher(tmp_path, PROGRAMS / "fake_llama.py"))
    data = Path(node.settings.data_dir)
    with (
        ollama_server("tinyllama", load_seconds=0.1) as good,
        ollama_server("tinyllama", load_seconds=0.1, fail_completions=True) as bad,
    ):
        for role, srv in (("good", good), ("bad", bad)):
            spec = InstanceSpec(
                role=role, flavor=Flavor.OLLAMA, model="tinyllama", port=srv.port, kind="plain"
            )
            iid = node.place(spec)
            node.start(iid)
            node.wait_for(iid, lambda v: v.lifecycle == "running", 60)
        control = ApiServer.listen(data, Path(node.settings.chain_path), node.settings.node_id)
        try:
            control.serve(node)
            runner = CliRunner()
            ok = runner.invoke(cli, ["health", str(data), "good", "--deep"])
            assert ok.exit_code == 0, ok.output
            assert "deep health ok: token 'Hello'" in ok.output
            as_json = runner.invoke(cli, ["health", str(data), "good", "--deep", "--json"])
            assert json.loads(as_json.output)["token"] == "Hello"
            failed = runner.invoke(cli, ["health", str(data), "bad", "--deep"])
            assert failed.exit_code == 1, failed.output
            assert "llama runner process no longer running" in failed.output
            last = runner.invoke(cli, ["health", str(data), "bad"])
            assert last.exit_code == 0 and ": up" in last.output
        finally:
            control.close()
        for view in node.list():
            node.stop(view.instance_id)


def test_deep_interval_is_a_kind_option_of_the_config(tmp_path: Path) -> None:
    from infervisor.tools.node.config import ConfigError, load_config

    path = tmp_path / "node.toml"
    base = '[node]\nnode_id = "n1"\ndata_dir = "data"\n[node.kinds.chat]\n'
    path.write_text(base + "deep_interval_s = 30\n", encoding="utf-8")
    kinds = load_config(path).node.kinds
    assert kinds["chat"].deep_interval_s == 30.0
    path.write_text(base + "deep_interval_s = -1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="deep_interval_s"):
        load_config(path)
    assert KindSettings().deep_interval_s == 0.0  # off unless asked for
