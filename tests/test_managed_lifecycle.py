"""The node's actors against real processes of a small llama-protocol server.

Fast: the fake server starts in ~100 ms. The real llama.cpp server is covered
in test_llamacpp_real.py.
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest
from conftest import NodeFactory
from support import PROGRAMS, make_launcher, pids_of_group

from infervisor.actors.errors import InvalidState, UnknownInstance
from infervisor.adapters.errors import AddressTaken, AdmissionRefused, RegistryError, SpecError
from infervisor.adapters.ports import free_port
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.chain import SqliteChain, verify_chain
from infervisor.replay import timeline


def spec(port: int, **kw: object) -> InstanceSpec:
    fields: dict[str, object] = {
        "role": "chat",
        "flavor": Flavor.LLAMACPP,
        "model": "tiny",
        "port": port,
    }
    fields.update(kw)
    return InstanceSpec(**fields)  # type: ignore[arg-type]


@pytest.fixture
def node(nodes: NodeFactory, fake_llama: str, fake_model: Path):
    n = nodes.open(nodes.settings(fake_llama, fake_model))
    n.registry.adopt("tiny", fake_model / "tiny.gguf")
    return n


def running(node, iid):
    return node.wait_for(iid, lambda v: v.lifecycle == "running", 60)


def chain_len(node) -> int:
    return node.rebuild().head_seq


def test_place_start_stop_leaves_no_process(node):
    iid = node.place(spec(free_port()))
    assert node.status(iid).lifecycle == "loaded"
    node.start(iid)
    view = running(node, iid)
    pgid = view.pid
    stopped = node.stop(iid)
    assert stopped.lifecycle == "stopped"
    assert stopped.desired == "stopped"
    assert pids_of_group(pgid) == []
    kinds = [e.kind for e in timeline(node.settings.chain_path, iid)]
    assert kinds == [
        "instance.placed",
        "instance.starting",
        "instance.spawned",
        "instance.ready",
        "instance.stop_requested",
        "instance.exited",
    ]
    assert verify_chain(node.settings.chain_path).ok


def test_sigkill_is_recorded_and_restarted_after_backoff(node):
    iid = node.place(spec(free_port()))
    node.start(iid)
    first = running(node, iid)
    os.kill(first.pid, signal.SIGKILL)
    again = node.wait_for(iid, lambda v: v.lifecycle == "running" and v.pid != first.pid, 60)
    assert again.restarts == 1
    assert again.last_exit is not None and again.last_exit.signal == 9
    entries = timeline(node.settings.chain_path, iid)
    path = [(e.frm, e.to) for e in entries if e.frm != e.to]
    assert ("running", "exited") in path
    assert ("exited", "restarting") in path
    assert ("restarting", "starting") in path
    node.stop(iid)


def listening_socket(port: int = 0) -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def still_listening(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_place_over_taken_port_is_refused_and_recorded(node):
    with listening_socket() as other:
        port = other.getsockname()[1]
        with pytest.raises(AddressTaken, match=f"127.0.0.1:{port}"):
            node.place(spec(port))
        still_listening(port)
    with SqliteChain.open_readonly(node.settings.chain_path) as chain:
        refused = [e for e in chain.events(kinds=["node.admission_refused"])]
    assert len(refused) == 1
    assert f"127.0.0.1:{port}" in refused[0].payload.decode()
    assert node.list() == []


def test_start_over_taken_port_is_refused_recorded_and_other_process_untouched(node):
    port = free_port()
    iid = node.place(spec(port))
    with listening_socket(port):
        with pytest.raises(AdmissionRefused, match=f"127.0.0.1:{port} is already taken"):
            node.start(iid)
        assert node.status(iid).lifecycle == "loaded"
        entries = timeline(node.settings.chain_path, iid)
        refused = [e for e in entries if e.kind == "instance.start_refused"]
        assert len(refused) == 1
        assert f"127.0.0.1:{port}" in refused[0].reason
        still_listening(port)


def test_refused_verbs_leave_chain_untouched(node):
    port = free_port()
    iid = node.place(spec(port))
    head = chain_len(node)
    with pytest.raises(UnknownInstance, match="no instance 'nope'"):
        node.start("nope")
    with pytest.raises(InvalidState, match="already loaded"):
        node.place(spec(port))
    with pytest.raises(AdmissionRefused, match="already used by another instance"):
        node.place(spec(port, role="other"))
    with pytest.raises(SpecError, match="loopback"):
        node.place(spec(free_port(), host="0.0.0.0"))
    with pytest.raises(SpecError, match="port 70000"):
        node.place(spec(70000))
    with pytest.raises(RegistryError):
        node.place(spec(free_port(), model="missing-model"))
    node.start(iid)
    running(node, iid)
    head = chain_len(node)
    assert node.start(iid).lifecycle == "running"  # idempotent: answered as it is
    assert chain_len(node) == head
    node.stop(iid)


def test_unhealthy_server_is_killed_and_restarted(node, tmp_path):
    iid = node.place(spec(free_port()))
    node.start(iid)
    first = running(node, iid)
    workdir = Path(node.settings.data_dir) / "instances" / iid
    (workdir / "health").write_text("fail")
    again = node.wait_for(iid, lambda v: v.pid not in (None, first.pid), 60)
    (Path(node.settings.data_dir) / "instances" / iid / "health").write_text("ok")
    running(node, iid)
    path = [(e.frm, e.to) for e in timeline(node.settings.chain_path, iid) if e.frm != e.to]
    assert ("running", "unhealthy") in path
    assert ("unhealthy", "exited") in path
    assert again.pid != first.pid
    node.stop(iid)


def test_budget_spent_leaves_failed_until_operator_start(nodes, tmp_path, fake_model):
    crasher = make_launcher(tmp_path, PROGRAMS / "exit_at_once.py")
    settings = nodes.settings(crasher, fake_model)
    settings = type(settings)(
        **{
            **{f: getattr(settings, f) for f in settings.__struct_fields__},
            "restart": settings.restart.__class__(max_restarts=2, base_s=0.05, cap_s=0.1),
        }
    )
    node = nodes.open(settings)
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    iid = node.place(spec(free_port()))
    node.start(iid)
    failed = node.wait_for(iid, lambda v: v.lifecycle == "failed", 60)
    assert failed.restarts == 2
    assert "restart budget spent" in failed.reason
    assert failed.desired == "stopped"
    # An operator start resets the budget.
    node.start(iid)
    assert node.status(iid).restarts == 0
    node.wait_for(iid, lambda v: v.lifecycle == "failed", 60)
    node.stop(iid)


def test_unload_forgets_and_removes_workdir(node):
    iid = node.place(spec(free_port()))
    node.start(iid)
    view = running(node, iid)
    node.unload(iid)
    assert pids_of_group(view.pid) == []
    assert not (Path(node.settings.data_dir) / "instances" / iid).exists()
    with pytest.raises(UnknownInstance):
        node.status(iid)
    assert iid not in node.rebuild().instances


def test_live_state_equals_replayed_state(node):
    iid = node.place(spec(free_port()))
    node.start(iid)
    running(node, iid)
    node.stop(iid)
    assert node.live_states() == node.rebuild().instances
