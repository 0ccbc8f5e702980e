"""Issue 12, item 6, through the Node API: an adopted llama.cpp server that is
still loading its model (503 "Loading model") is ``starting`` (never ready,
never unhealthy) until it serves, then ``running``; it is never signalled.

The server is started by the test, in a session of its own, as somebody else
would (tests/programs/adopted_loading.py): it loads until the test creates
the file ``serve`` in its working directory, and counts its loading answers,
so the test knows the node asked it many times while it loaded.
"""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
from conftest import NodeFactory
from support import PROGRAMS, OwnServer, own_server, wait_until

from infervisor.adapters.ports import free_port
from infervisor.adapters.probe import HealthKind, ServerClient
from infervisor.adapters.spec import Flavor, InstanceSpec, Mode
from infervisor.replay import timeline


def loading_answers(cwd: Path) -> int:
    path = cwd / "loading_answers"
    return len(path.read_text().splitlines()) if path.exists() else 0


def probed_loading(server: OwnServer) -> bool:
    server.check_alive()
    with ServerClient(server.base_url, timeout=2.0) as client:
        return client.probe(Flavor.LLAMACPP).health.kind is HealthKind.LOADING


def test_an_adopted_server_still_loading_is_starting_until_it_serves(
    nodes: NodeFactory, fake_llama: str, fake_model: Path, tmp_path: Path
) -> None:
    settings = nodes.settings(fake_llama, fake_model)
    node = nodes.open(settings)
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    port = free_port()
    cwd = tmp_path / "theirs"
    argv = [sys.executable, str(PROGRAMS / "adopted_loading.py"), "--port", str(port)]
    with own_server([*argv, "--alias", "tiny"], cwd=cwd, port=port) as server:
        wait_until(lambda: probed_loading(server), 20, f"{server.base_url} loading")
        born = psutil.Process(server.pid).create_time()
        spec = InstanceSpec(
            port=port, role="ext", flavor=Flavor.LLAMACPP, model="tiny", mode=Mode.ADOPTED
        )
        assert spec.kind == "inference"  # the kind with a startup allowance
        iid = node.place(spec)
        started = node.start(iid)
        assert started.lifecycle == "starting"  # it answered, but it is loading
        assert started.pid is None

        # Asked many more times than the miss limit while it loads: still starting.
        asked = loading_answers(cwd)
        wanted = asked + 3 * settings.miss_limit
        wait_until(lambda: loading_answers(cwd) >= wanted, 20, f"{wanted} loading answers")
        view = node.status(iid)
        assert view.lifecycle == "starting", view
        assert view.desired == "running"
        assert (view.health, view.status_detail) == ("loading", "loading model")

        (cwd / "serve").write_text("")  # the model is loaded: it serves
        view = node.wait_for(iid, lambda v: v.lifecycle == "running", 60)
        assert "adopted server answers" in view.reason
        kinds = [e.kind for e in timeline(settings.chain_path, iid)]
        assert kinds == ["instance.placed", "instance.starting", "instance.ready"], kinds
        node.wait_for(iid, lambda v: v.health == "up", 60)
        # Never signalled: the same process, still running.
        assert server.alive()
        assert psutil.Process(server.pid).create_time() == born
        node.unload(iid)
        assert server.alive()
