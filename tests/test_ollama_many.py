"""Issue 12, Ollama: many models on one Ollama, loads within the kind's startup
budget, keep_alive checked at configuration, status while a load runs.

Against the Ollama test server (tests/servers/ollama_server.py). Nothing here
waits by sleeping: every wait is on a state the node or the server reports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import test_ollama_node
from conftest import NodeFactory
from support import OllamaTestServer, wait_until
from test_ollama_node import kinds, reservations

from infervisor.actors.kinds import KindSettings
from infervisor.actors.node import Node
from infervisor.adapters import ollama
from infervisor.adapters.errors import AdmissionRefused
from infervisor.adapters.managed_ollama import DEFAULT_LOAD_TIMEOUT_S, load_timeout_s
from infervisor.adapters.manifest import ModelFormat
from infervisor.adapters.ollama_keep_alive import parse_keep_alive
from infervisor.adapters.probe import Health, HealthKind, ServerReport
from infervisor.adapters.spec import Flavor, InstanceSpec, Mode
from infervisor.adapters.status import LoadKind, LoadState, StatusState, map_report
from infervisor.replay import RestartPolicy
from infervisor.replay.views import InstanceView
from infervisor.tools.node.config import ConfigError, load_config

A, B = "tinyllama", "qwen:0.5b"
RESERVED = 4096
server = test_ollama_node.server  # the fixture: ``server(*models, **flags)``


@pytest.fixture
def node(nodes: NodeFactory, fake_llama: str, fake_model: Path) -> Node:
    settings = nodes.settings(
        fake_llama,
        fake_model,
        memory_budget_bytes=10 * RESERVED,
        reserve_overhead_bytes=RESERVED,
        ollama_keep_alive=300,  # seconds, as a TOML integer gives it
        kinds={
            # a startup budget of 1 s, and one restart before Failed
            "quick": KindSettings(
                startup_deadline_s=1.0,
                startup_cap_s=1.0,
                restart=RestartPolicy(max_restarts=1, base_s=0.1, cap_s=0.2, stable_after_s=60.0),
            )
        },
    )
    n = nodes.open(settings)
    n.registry.adopt("a", format=ModelFormat.OLLAMA, ollama_tag=A)
    n.registry.adopt("b", format=ModelFormat.OLLAMA, ollama_tag=B)
    return n


def spec(
    srv: OllamaTestServer, model: str, *, role: str = "llm", mode: Mode = Mode.MANAGED, **kw: Any
) -> InstanceSpec:
    return InstanceSpec(
        role=role, flavor=Flavor.OLLAMA, mode=mode, model=model, port=srv.port, **kw
    )


def resident(srv: OllamaTestServer, tag: str) -> bool:
    return ollama.resident(srv.url, tag, timeout=5.0)


# --- many models on one Ollama ------------------------------------------------------------


def test_two_managed_models_on_one_ollama_are_independent(node: Node, server: Any) -> None:
    srv = server(A, B, load_seconds=0.2)
    ia = node.place(spec(srv, "a", role="chat"))
    ib = node.place(spec(srv, "b", role="embed"))
    assert ia != ib
    node.start(ia)
    node.start(ib)
    for iid in (ia, ib):
        view = node.wait_for(iid, lambda v: v.lifecycle == "running", 60)
        assert "loaded by this node" in view.reason
    assert resident(srv, A)
    assert resident(srv, B)
    assert reservations(node) == {ia: RESERVED, ib: RESERVED}

    assert node.stop(ia).lifecycle == "stopped"  # unloads a, and only a
    assert not resident(srv, A)
    assert resident(srv, B)
    wait_until(lambda: ia not in reservations(node), 20, "a's memory released")
    assert node.status(ib).lifecycle == "running"
    assert reservations(node) == {ib: RESERVED}

    node.unload(ib)  # stops and forgets b; a stays placed
    assert not resident(srv, B)
    assert reservations(node) == {}
    assert {v.instance_id for v in node.list()} == {ia}
    assert node.status(ia).lifecycle == "stopped"


def test_managed_and_adopted_ollama_share_the_address(node: Node, server: Any) -> None:
    srv = server(A, B, load_seconds=0.2)
    managed = node.place(spec(srv, "a"))
    watched = node.place(spec(srv, "b", mode=Mode.ADOPTED))
    node.start(managed)
    node.wait_for(managed, lambda v: v.lifecycle == "running", 60)
    assert node.start(watched).lifecycle == "running"
    node.stop(managed)
    assert node.status(watched).lifecycle == "running"


def test_one_ollama_model_is_one_managed_instance(node: Node, server: Any) -> None:
    srv = server(A)
    first = node.place(spec(srv, "a", role="chat"))
    with pytest.raises(
        AdmissionRefused, match=rf"\({first}\): Ollama there already serves model a"
    ):
        node.place(spec(srv, "a", role="other"))


def test_a_managed_llamacpp_address_stays_its_own(node: Node, server: Any) -> None:
    srv = server(A)
    llama = InstanceSpec(role="llm", flavor=Flavor.LLAMACPP, model="m", port=srv.port)
    first = node.place(spec(srv, "a"))
    with pytest.raises(AdmissionRefused, match=rf"\({first}\): a managed llamacpp server binds"):
        node.place(llama)


# --- the load's budget ------------------------------------------------------------------


def test_load_timeout_is_the_kinds_startup_cap() -> None:
    assert load_timeout_s(900.0) == 900.0
    assert load_timeout_s(1200.0) == 1200.0
    assert load_timeout_s(3.0) == 3.0
    assert load_timeout_s(0.0) == DEFAULT_LOAD_TIMEOUT_S  # no allowance: the documented default


def test_a_load_longer_than_the_cap_fails_at_the_cap_and_is_retried(
    node: Node, server: Any
) -> None:
    srv = server(A, load_seconds=30.0)
    iid = node.place(spec(srv, "a", kind="quick"))
    node.start(iid)
    view = node.wait_for(iid, lambda v: v.lifecycle == "failed", 60)
    assert "restart budget spent (1 restarts)" in view.reason
    assert "load failed: not loaded within 1 s" in view.reason
    events = kinds(node, iid)
    assert events.count("instance.restart_scheduled") == 1
    assert "instance.ready" not in events
    # The server notices the closed request on its own thread: wait for it.
    wait_until(lambda: not resident(srv, A), 20, "the server cancelled the load given up")
    wait_until(lambda: iid not in reservations(node), 20, "the memory released")


def test_a_load_within_the_cap_completes(node: Node, server: Any) -> None:
    srv = server(A, load_seconds=2.0)
    iid = node.place(spec(srv, "a"))  # inference: cap 900 s
    node.start(iid)
    view = node.wait_for(iid, lambda v: v.lifecycle == "running", 60)
    assert "loaded by this node" in view.reason
    assert node.status(iid).restarts == 0


# --- keep_alive at configuration ------------------------------------------------------------


def write_config(tmp_path: Path, keep_alive: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(
        f'[node]\nnode_id = "n1"\ndata_dir = "data"\nollama_keep_alive = {keep_alive}\n',
        encoding="utf-8",
    )
    return path


@pytest.mark.parametrize("zero", ["0", '"0"', '"0s"', "0.0", '"-0m"'])
def test_keep_alive_that_unloads_at_once_is_refused_with_the_reason(
    tmp_path: Path, zero: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write_config(tmp_path, zero))
    message = str(err.value)
    assert "[node] ollama_keep_alive" in message
    assert "would unload the model as soon as it is loaded" in message


@pytest.mark.parametrize(
    ("toml", "sent"), [("300", 300), ("-1", -1), ("600.0", 600), ('"30m"', "30m"), ('"-1"', -1)]
)
def test_keep_alive_seconds_may_be_a_toml_number(tmp_path: Path, toml: str, sent: Any) -> None:
    config = load_config(write_config(tmp_path, toml))
    keep = config.node.adapter_settings().ollama_keep_alive
    assert parse_keep_alive(keep) == sent  # what the load sends


def test_keep_alive_fraction_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"ollama_keep_alive: keep_alive 0\.5 is not valid"):
        load_config(write_config(tmp_path, "0.5"))


# --- status while loading ----------------------------------------------------------------


def test_status_map_says_loading_while_ollama_lists_a_loading_model() -> None:
    report = ServerReport(Health(HealthKind.UP), models=[A], resident=[A], flavor=Flavor.OLLAMA)
    loading = map_report(
        Flavor.OLLAMA, A, report, alive=False, adopted=False, load=LoadState(LoadKind.LOADING)
    )
    assert (loading.state, loading.detail) == (StatusState.DEGRADED, "loading model")
    done = map_report(
        Flavor.OLLAMA, A, report, alive=False, adopted=False, load=LoadState(LoadKind.DONE)
    )
    assert (done.state, done.detail) == (StatusState.RUNNING, "model resident")


def test_status_says_loading_during_a_load(node: Node, server: Any) -> None:
    srv = server(A, load_seconds=60.0)
    iid = node.place(spec(srv, "a"))
    node.start(iid)
    wait_until(lambda: resident(srv, A), 20, "Ollama listing the model it is loading")
    seen: list[tuple[str, str | None]] = []

    def loading(v: InstanceView) -> bool:
        seen.append((v.lifecycle, v.status_detail))
        return v.lifecycle == "starting" and v.status_detail == "loading model"

    view = node.wait_for(iid, loading, 60)
    assert view.status == "degraded"
    assert ("starting", "model resident") not in seen
    assert node.stop(iid).lifecycle == "stopped"
    assert not resident(srv, A)


# ---------------------------------------------------------------- the config file
def _two_instances(tmp_path: Path, first: str, second: str) -> Path:
    config = tmp_path / "node.toml"
    config.write_text(
        f"""
[node]
node_id = "n1"
data_dir = "{tmp_path / "data"}"

[[models]]
name = "a"
format = "ollama"
ollama_tag = "a:latest"

[[models]]
name = "b"
format = "ollama"
ollama_tag = "b:latest"

[[instances]]
{first}

[[instances]]
{second}
"""
    )
    return config


def test_a_config_may_put_two_ollama_models_on_one_ollama_but_not_two_llama_servers(
    tmp_path: Path,
) -> None:
    from infervisor.tools.node.config import ConfigError, load_config

    ollama = 'role = "{r}"\nflavor = "ollama"\nmode = "managed"\nmodel = "{m}"\nport = 11434'
    loaded = load_config(
        _two_instances(tmp_path, ollama.format(r="x", m="a"), ollama.format(r="y", m="b"))
    )
    assert len(loaded.instances) == 2  # one Ollama serves both models
    llama = 'role = "{r}"\nflavor = "llamacpp"\nmode = "managed"\nmodel = "a"\nport = 18000'
    config = _two_instances(tmp_path, llama.format(r="x"), llama.format(r="y"))
    with pytest.raises(ConfigError, match=r"#2 uses 127\.0\.0\.1:18000, as \[\[instances\]\] #1"):
        load_config(config)
