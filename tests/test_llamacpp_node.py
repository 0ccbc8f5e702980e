"""Issue 3 through the Node API: adopted and managed llama.cpp, admission order,
deep health and the capability probe.

Adopted servers are started by the test itself, in a session of their own, as
somebody else would; the node must only ever observe them. Each adopted
scenario runs against the fake llama-protocol server (fast) and the real
llama.cpp server on the project's tiny GGUF (slow).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import NodeFactory
from support import FAKE_GGUF, PROGRAMS, OwnServer, own_server, pids_of_group, wait_until

from infervisor.actors.errors import InvalidState, UnknownInstance, VerbRefused
from infervisor.actors.node import Node
from infervisor.adapters.errors import AdmissionRefused, ProbeError
from infervisor.adapters.launch import resolve_program
from infervisor.adapters.llama_choice import resolve_llama_server
from infervisor.adapters.planning import ALL_ADAPTERS
from infervisor.adapters.ports import free_port, port_in_use
from infervisor.adapters.probe import HealthKind, ServerClient
from infervisor.adapters.spec import Flavor, InstanceSpec, Mode, instance_id
from infervisor.chain import SqliteChain
from infervisor.replay import timeline

REAL_DEADLINE_S = 60.0  # the real server: spawn to serving, generous
ADOPTED_NEVER_STOPPED = "observes it and never stops it"


def llama_spec(port: int, **kw: Any) -> InstanceSpec:
    fields: dict[str, Any] = {"role": "chat", "flavor": Flavor.LLAMACPP, "model": "tiny"}
    fields.update(kw)
    return InstanceSpec(port=port, **fields)


def adopted_spec(port: int, **kw: Any) -> InstanceSpec:
    return llama_spec(port, role="ext", mode=Mode.ADOPTED, **kw)


def spawned_argv(node: Node, iid: str) -> list[str]:
    """The argv of the instance's last ``instance.spawned`` event, from the chain."""
    with SqliteChain.open_readonly(node.settings.chain_path) as chain:
        events = list(chain.events(subject=iid, kinds=["instance.spawned"]))
    assert events, f"{iid} was never spawned"
    argv: list[str] = json.loads(events[-1].payload)["argv"]
    return argv


def proc_environ(pid: int) -> dict[str, str]:
    """The environment ``pid`` was exec'd with, as the kernel keeps it."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = [item.split(b"=", 1) for item in raw.split(b"\0") if item]
    return {k.decode(): v.decode(errors="replace") for k, v in pairs}


def proc_limit(pid: int, name: str) -> tuple[str, str]:
    """(soft, hard) of one line of ``/proc/<pid>/limits`` (``Max open files``)."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith(name):
            soft, hard = line[len(name) :].split()[:2]
            return soft, hard
    raise AssertionError(f"no {name!r} in /proc/{pid}/limits")


def kinds_after(node: Node, iid: str, seq: int) -> list[str]:
    return [e.kind for e in timeline(node.settings.chain_path, iid) if e.seq > seq]


@contextlib.contextmanager
def listening_socket(port: int = 0) -> Iterator[socket.socket]:
    """A loopback socket that listens and never accepts: connections made to it wait
    in its accept queue, where :func:`connection_waiting` sees them."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen(16)
        yield sock


def connection_waiting(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


# --- adopted servers, started by the test ----------------------------------------------


def wait_serving(server: OwnServer, deadline: float) -> None:
    """Poll the server's health until it is up; fail at once if it exits."""

    def up() -> bool:
        server.check_alive()
        with ServerClient(server.base_url, timeout=2.0) as client:
            return client.probe(Flavor.LLAMACPP).health.kind is HealthKind.UP

    wait_until(up, deadline, f"{server.base_url} serving")


def fake_llama_argv(port: int, host: str = "127.0.0.1") -> list[str]:
    script = str(PROGRAMS / "fake_llama.py")
    return [sys.executable, script, "--host", host, "--port", str(port), "--alias", "tiny"]


def real_llama_argv(port: int, gguf: Path) -> list[str]:
    program = resolve_program("infervisor-llama-server")
    argv = [program, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
    return [*argv, "-c", "512", "--alias", "tiny"]


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.slow)])
def adopted_llama(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OwnServer]:
    """A llama-protocol server somebody else runs: the fake one, or real llama.cpp."""
    port = free_port()
    if request.param == "real":
        argv, deadline = real_llama_argv(port, request.getfixturevalue("tiny_gguf")), 60.0
    else:
        argv, deadline = fake_llama_argv(port), 20.0
    with own_server(argv, cwd=tmp_path / "theirs", port=port) as server:
        wait_serving(server, deadline)
        yield server


@pytest.fixture
def node(nodes: NodeFactory, fake_llama: str, fake_model: Path) -> Node:
    n = nodes.open(nodes.settings(fake_llama, fake_model))
    n.registry.adopt("tiny", fake_model / "tiny.gguf")
    return n


def test_adopted_llamacpp_is_observed_and_never_signalled(
    nodes: NodeFactory, fake_llama: str, fake_model: Path, adopted_llama: OwnServer
) -> None:
    server = adopted_llama
    settings = nodes.settings(fake_llama, fake_model)
    node = nodes.open(settings)
    spec = adopted_spec(server.port)
    born = psutil.Process(server.pid).create_time()

    notes = node.admit(spec).notes
    assert notes[0] == f"endpoint {server.base_url}"
    assert "adopting running server (up)" in notes
    assert "1 model(s) listed" in notes

    iid = node.place(spec)
    assert node.status(iid).lifecycle == "loaded"
    started = node.start(iid)
    assert started.lifecycle == "running"  # start only confirms it answers
    assert started.pid is None  # not ours: no process is tracked
    with pytest.raises(VerbRefused, match=ADOPTED_NEVER_STOPPED):
        node.stop(iid)
    with pytest.raises(VerbRefused, match=ADOPTED_NEVER_STOPPED):
        node.restart(iid)
    assert node.status(iid).lifecycle == "running"
    node.wait_for(iid, lambda v: v.health == "up", 60)
    assert server.alive()
    assert psutil.Process(server.pid).create_time() == born

    # Shutdown stops managed servers only; a new node on the same chain re-adopts it.
    node.shutdown()
    assert server.alive()
    assert psutil.Process(server.pid).create_time() == born
    again = nodes.open(settings)
    assert again.status(iid).lifecycle == "running"  # from the chain
    before = again.status(iid).last_seq
    again.wait_for(iid, lambda v: v.health == "up", 60)  # and the health ticks watch it

    server.kill()  # it goes away: that is for whoever runs it to fix
    gone = again.wait_for(iid, lambda v: v.lifecycle == "unhealthy", 60)
    assert "adopted servers are not restarted" in gone.reason
    assert gone.desired == "running"
    assert kinds_after(again, iid, before) == ["instance.unhealthy"]
    assert not port_in_use("127.0.0.1", server.port)

    again.unload(iid)
    # Nothing but the miss and the unload: never started again, never signalled.
    assert kinds_after(again, iid, before) == ["instance.unhealthy", "instance.unloaded"]
    with pytest.raises(UnknownInstance):
        again.status(iid)
    assert iid not in again.rebuild().instances
    with pytest.raises(
        AdmissionRefused, match=f"no llamacpp server answering at {server.base_url}"
    ):
        again.place(spec)


def test_gone_adopted_server_status_says_it_is_not_restarted(node: Node, tmp_path: Path) -> None:
    port = free_port()
    with own_server(fake_llama_argv(port), cwd=tmp_path / "theirs", port=port) as server:
        wait_serving(server, 20)
        iid = node.place(adopted_spec(port))
        node.start(iid)
        node.wait_for(iid, lambda v: v.health == "up", 60)
        server.kill()
        view = node.wait_for(iid, lambda v: v.lifecycle == "unhealthy", 60)
    assert view.status == "exited"
    assert view.status_detail is not None
    assert view.status_detail.endswith("; adopted servers are not restarted")


def test_adopting_where_nothing_answers_is_refused_naming_the_address(node: Node) -> None:
    port = free_port()
    with pytest.raises(AdmissionRefused, match=f"no llamacpp server answering at .*:{port}"):
        node.place(adopted_spec(port))
    assert node.list() == []


def test_adopted_server_beyond_loopback_is_reported_in_exposure(node: Node, tmp_path: Path) -> None:
    port = free_port()
    argv = fake_llama_argv(port, host="0.0.0.0")
    with own_server(argv, cwd=tmp_path / "theirs", port=port) as server:
        wait_serving(server, 20)
        iid = node.place(adopted_spec(port))
        node.start(iid)
        # Exposure is read once per reconcile tick for the whole node, not per start.
        view = wait_until(
            lambda: "listening on 0.0.0.0" in node.status(iid).exposure and node.status(iid),
            20,
            "the reconcile tick's socket table",
        )
        assert "not ours to enforce" in view.exposure
        assert view.lifecycle == "running"  # reported, not stopped: its binding is not ours
        node.unload(iid)
        assert server.alive()


# --- managed llama.cpp ------------------------------------------------------------------


def test_managed_llamacpp_draft_environment_limits_and_workdir(
    nodes: NodeFactory, fake_llama: str, fake_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFERVISOR_TEST_CANARY", "must not reach the server")
    settings = nodes.settings(fake_llama, fake_model, env={"NODE_VAR": "node", "BOTH": "node"})
    node = nodes.open(settings)
    (fake_model / "draft.gguf").write_bytes(FAKE_GGUF + bytes(20))
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    node.registry.adopt("draft", fake_model / "draft.gguf")
    spec = llama_spec(free_port(), draft_model="draft", env={"SPEC_VAR": "spec", "BOTH": "spec"})
    iid = node.place(spec)
    node.start(iid)
    view = node.wait_for(iid, lambda v: v.lifecycle == "running", 60)
    assert view.pid is not None

    argv = spawned_argv(node, iid)
    assert argv[argv.index("-md") + 1] == str((fake_model / "draft.gguf").resolve())
    assert argv[argv.index("-m") + 1] == str((fake_model / "tiny.gguf").resolve())

    env = proc_environ(view.pid)
    assert "INFERVISOR_TEST_CANARY" not in env
    assert env["HOME"] == os.environ["HOME"]
    assert env["PATH"] == os.environ["PATH"]
    assert env["NODE_VAR"] == "node"
    assert env["SPEC_VAR"] == "spec"
    assert env["BOTH"] == "spec"  # the spec's env wins over the node's

    assert proc_limit(view.pid, "Max open files") == ("4096", "4096")
    assert proc_limit(view.pid, "Max address space") == (str(1 << 46), str(1 << 46))

    workdir = Path(settings.data_dir) / "instances" / iid
    assert Path(os.readlink(f"/proc/{view.pid}/cwd")) == workdir
    node.unload(iid)
    assert pids_of_group(view.pid) == []
    assert not workdir.exists()


def direct_launcher(directory: Path) -> str:
    """fake_llama behind a Python shebang, so no shell adds variables (dash adds PWD)."""
    path = directory / "direct-fake-llama"
    script = PROGRAMS / "fake_llama.py"
    path.write_text(  # sys.argv[0] and sys.path[0] as `python script` sets them
        f"#!{sys.executable}\nimport runpy, sys\n"
        f"sys.argv[0] = {str(script)!r}\nsys.path[0] = {str(script.parent)!r}\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    path.chmod(0o755)
    return str(path)


def test_managed_environment_is_exactly_passthrough_node_and_spec_env(
    nodes: NodeFactory, tmp_path: Path, fake_model: Path
) -> None:
    settings = nodes.settings(direct_launcher(tmp_path), fake_model, env={"NODE_VAR": "node"})
    node = nodes.open(settings)
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    iid = node.place(llama_spec(free_port(), env={"SPEC_VAR": "spec"}))
    node.start(iid)
    view = node.wait_for(iid, lambda v: v.lifecycle == "running", 60)
    assert view.pid is not None
    env = proc_environ(view.pid)
    node.stop(iid)
    expected = {n: os.environ[n] for n in ("HOME", "PATH") if n in os.environ}
    # The launch token the exit-status shim recognises its server by (docs/process-supervision.md).
    assert env.pop("INFERVISOR_LAUNCH_TOKEN", "").startswith(iid[:12])
    # The node's choice of llama.cpp server, set last (adapters/llama_choice.py).
    chosen = {"INFERVISOR_LLAMA_SERVER": resolve_llama_server("auto")}
    assert env == {**expected, "NODE_VAR": "node", "SPEC_VAR": "spec", **chosen}


# --- deep health --------------------------------------------------------------------------


def test_deep_health_returns_a_token_and_raises_when_completions_fail(node: Node) -> None:
    iid = node.place(llama_spec(free_port()))
    node.start(iid)
    node.wait_for(iid, lambda v: v.lifecycle == "running", 60)
    assert node.deep_health(iid) == " fake"
    workdir = Path(node.settings.data_dir) / "instances" / iid
    (workdir / "completions").write_text("fail")
    with pytest.raises(ProbeError, match="completion refused: HTTP 500"):
        node.deep_health(iid)
    assert node.status(iid).lifecycle == "running"  # a deep check changes nothing
    node.stop(iid)


@pytest.mark.slow
def test_deep_health_on_real_llamacpp_returns_a_token(
    nodes: NodeFactory, tmp_path: Path, tiny_gguf: Path
) -> None:
    registry = tmp_path / "models"
    registry.mkdir()
    node = nodes.open(nodes.settings("infervisor-llama-server", registry))
    shutil.copy(tiny_gguf, registry / "tiny.gguf")
    node.registry.adopt("tiny", registry / "tiny.gguf")
    iid = node.place(llama_spec(free_port()))
    node.start(iid)
    view = node.wait_for(iid, lambda v: v.lifecycle == "running", REAL_DEADLINE_S)
    token = node.deep_health(iid)
    assert isinstance(token, str) and token
    node.stop(iid)
    assert pids_of_group(view.pid) == []


# --- capability probe ---------------------------------------------------------------------


def test_capability_probe_lists_llamacpp_and_adopted_but_no_absent_ollama(
    nodes: NodeFactory, fake_model: Path
) -> None:
    ollama_port = Flavor.OLLAMA.default_port
    if port_in_use("127.0.0.1", ollama_port):
        pytest.skip(f"something listens on {ollama_port}: the absence of Ollama cannot be shown")
    enabled = tuple(a for a in ALL_ADAPTERS if a != "infer.mlx-lm")  # keeps it fast
    node = nodes.open(nodes.settings("infervisor-llama-server", fake_model, adapters=enabled))
    assert node.provides() == []  # nothing before the first probe
    found = {c.adapter_id: c for c in node.probe_capabilities()}
    assert set(found) == set(enabled)
    assert found["infer.llamacpp"].ok
    assert found["infer.llamacpp"].version.startswith("infervisor-llama-server")
    assert not found["infer.ollama"].ok
    assert f"127.0.0.1:{ollama_port}" in found["infer.ollama"].detail
    provided = node.provides()
    assert "infer.llamacpp" in provided
    assert {"infer.llamacpp.adopted", "infer.mlx-lm.adopted", "infer.ollama.adopted"} <= set(
        provided
    )
    assert "infer.ollama" not in provided
    assert "infer.mlx-lm" not in provided  # not enabled


# --- admission order ----------------------------------------------------------------------


def test_admit_returns_the_notes_and_records_nothing(node: Node) -> None:
    port = free_port()
    head = node.rebuild().head_seq
    admission = node.admit(llama_spec(port))
    assert admission.adapter_id == "infer.llamacpp"
    assert admission.notes[0] == f"endpoint http://127.0.0.1:{port}"
    assert admission.notes[1] == "model tiny (gguf) verified"
    assert re.fullmatch(r"launch \S+/launch-fake_llama with \d+ args", admission.notes[2])
    assert len(admission.notes) == 3
    assert node.rebuild().head_seq == head
    assert node.list() == []


def test_port_outside_the_allowed_range_is_refused_before_any_connection(
    nodes: NodeFactory, fake_llama: str, fake_model: Path, tmp_path: Path
) -> None:
    with listening_socket() as theirs:
        port = theirs.getsockname()[1]
        other = port - 1
        settings = nodes.settings(
            fake_llama, fake_model, allowed_ports=(other, other), probe_timeout_s=0.5
        )
        node = nodes.open(settings)
        outside = f"port {port} is outside this node's allowed range {other}-{other}"
        with pytest.raises(AdmissionRefused, match=outside):
            node.admit(adopted_spec(port))
        with pytest.raises(AdmissionRefused, match=outside):
            node.place(adopted_spec(port))
        assert not connection_waiting(theirs)
        assert node.list() == []

        # The same socket does see the probe of a node that allows the port.
        open_node = nodes.open(
            nodes.settings(
                fake_llama, fake_model, data_dir=str(tmp_path / "other"), probe_timeout_s=0.5
            )
        )
        with pytest.raises(AdmissionRefused, match="no llamacpp server answering"):
            open_node.admit(adopted_spec(port))
        assert connection_waiting(theirs)


def test_instance_id_is_role_hash_node(node: Node) -> None:
    spec = llama_spec(free_port())
    iid = node.place(spec)
    assert re.fullmatch(r"chat-[0-9a-f]{8}-n1", iid)
    assert iid == instance_id(spec, "n1")


def test_same_instance_twice_and_two_managed_on_one_address_are_refused(node: Node) -> None:
    port = free_port()
    iid = node.place(llama_spec(port))
    head = node.rebuild().head_seq
    with pytest.raises(InvalidState, match=f"{iid} is already loaded"):
        node.place(llama_spec(port))
    with pytest.raises(AdmissionRefused, match=rf"127\.0\.0\.1:{port} is already used by .*{iid}"):
        node.place(llama_spec(port, role="other"))
    with pytest.raises(AdmissionRefused, match=f"already used by another instance \\({iid}\\)"):
        node.place(adopted_spec(port))  # adopted over a managed address: refused too
    assert node.rebuild().head_seq == head
    assert [v.instance_id for v in node.list()] == [iid]
