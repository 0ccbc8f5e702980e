"""The trust boundary, node side (issue 17, item 2): nothing a placement says
chooses what the node executes, loads or reads; bad input is refused naming
its field; what the node writes about specs and requests is private.

Real processes (the launcher, a node with fake servers) and real files; the
``llama-server`` programs here are shell scripts that leave a marker file.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from chain_tamper import make_chain
from conftest import NodeFactory
from support import FAKE_GGUF, PROGRAMS
from test_run_resume import NodeRun, end_runs

from infervisor.actors.errors import BadArgument
from infervisor.adapters.errors import RegistryError, SpecError
from infervisor.adapters.ports import free_port
from infervisor.adapters.proc.output import create_logs, log_paths, rotate
from infervisor.adapters.registry import ModelRegistry
from infervisor.adapters.spec import Flavor, InstanceSpec, valid_token
from infervisor.adapters.spec_env import LLAMA_ARG_TUNING, MAX_ENV_KEYS, REFUSED_ENV
from infervisor.chain.backup import backup_chain
from infervisor.chain.bundle import export_bundle
from infervisor.tools.api.answers import answer_for
from infervisor.tools.node.boot import diagnostics_to
from infervisor.tools.node.config import ConfigError, ModelEntryConfig, load_config
from infervisor.tools.node.lock import RunError
from infervisor.tools.node.models import register_models

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
LAUNCHER = BIN / "infervisor-llama-server"
INFERVISOR = BIN / "infervisor"


def spec(**kw: Any) -> InstanceSpec:
    fields: dict[str, Any] = {"role": "chat", "flavor": Flavor.LLAMACPP, "port": 18080}
    return InstanceSpec(**({"model": "tiny"} | fields | kw))


def refusal(**kw: Any) -> SpecError:
    with pytest.raises(SpecError) as caught:
        spec(**kw).validate()
    return caught.value


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def marker_server(folder: Path, marker: Path) -> Path:
    """A ``llama-server`` in ``folder`` that writes its arguments to ``marker`` and exits 0."""
    folder.mkdir(parents=True, exist_ok=True)
    program = folder / "llama-server"
    program.write_text(f"#!/bin/sh\necho \"$@\" > '{marker}'\n")
    program.chmod(0o755)
    return program


def good_server(folder: Path, marker: Path) -> Path:
    """A ``llama-server`` in ``folder`` that writes its arguments to ``marker`` and
    then serves as tests/programs/fake_llama.py (which takes no ``-t``)."""
    folder.mkdir(parents=True, exist_ok=True)
    program = folder / "llama-server"
    fake = PROGRAMS / "fake_llama.py"
    program.write_text(
        f"#!{sys.executable}\nimport runpy, sys\n"
        f"open({str(marker)!r}, 'w').write(' '.join(sys.argv[1:]))\n"
        "args = sys.argv[1:]\nat = args.index('-t')\ndel args[at:at + 2]\n"
        f"sys.argv = [{str(fake)!r}, *args]\nsys.path[0] = {str(fake.parent)!r}\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    program.chmod(0o755)
    return program


# ---------------------------------------------------------------- the env table
def test_every_refused_row_is_refused_and_listed_in_docs_api() -> None:
    doc = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    for pattern, _ in REFUSED_ENV:
        key = pattern.replace("*", "ANY")
        error = refusal(env={key: "x"})
        assert error.field == f"env.{key}", error
        assert "docs/api.md" in str(error) and pattern in str(error)
        assert f"`{pattern}`" in doc, f"{pattern} is refused but not listed in docs/api.md"


@pytest.mark.parametrize(
    "key",
    [
        "PATH", "HOME", "SHELL", "BASH_ENV", "ENV", "IFS", "XDG_CACHE_HOME",
        "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "DYLD_INSERT_LIBRARIES", "GCONV_PATH",
        "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONEXECUTABLE",
        "PYTHONINSPECT", "PYTHONBREAKPOINT", "PYTHONSAFEPATH", "PYTHONWARNINGS",
        "PERL5LIB", "PERL5OPT", "RUBYOPT", "NODE_OPTIONS", "OPENSSL_CONF",
        "INFERVISOR_LAUNCH_TOKEN", "INFERVISOR_LLAMA_SERVER",
        "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HF_HOME", "HF_ENDPOINT", "TRANSFORMERS_CACHE",
        "LLAMA_ARG_MODEL", "LLAMA_ARG_HF_REPO", "LLAMA_ARG_MODEL_URL", "LLAMA_ARG_HOST",
        "LLAMA_CACHE", "GGML_BACKEND_PATH",
        "path", "Ld_Preload",  # compared in upper case
    ],
)  # fmt: skip
def test_a_variable_that_chooses_code_or_weights_is_refused(key: str) -> None:
    error = refusal(env={key: "/tmp/x"})
    assert error.field == f"env.{key}"
    status, body = answer_for(error)
    assert (status, body.code, body.field) == (400, "bad_spec", f"spec.env.{key}")


@pytest.mark.parametrize("key", ["LLAMA_ARG_THREADS", "LLAMA_ARG_THREADS_BATCH"])
def test_a_thread_count_by_variable_is_refused_naming_the_threads_key(key: str) -> None:
    """A second trial (stop 34): LLAMA_ARG_THREADS was accepted, though the
    launcher's -t wins over it; the spec's ``threads`` key sets it."""
    error = refusal(env={key: "64"})
    assert error.field == f"env.{key}"
    assert "threads key" in str(error)


def test_ordinary_tuning_variables_pass() -> None:
    spec(env={"OMP_NUM_THREADS": "2", "TZ": "UTC", "MY_KNOB": "", "_X1": "y" * 1000}).validate()
    spec(env=dict.fromkeys(LLAMA_ARG_TUNING, "1")).validate()  # llama.cpp tuning flags


@pytest.mark.parametrize(
    ("env", "field", "says"),
    [
        ({"": "x"}, "env.", "not a valid environment variable name"),
        ({"A=B": "x"}, "env.A=B", "not a valid environment variable name"),
        ({"A\0": "x"}, "env.A\0", "not a valid environment variable name"),
        ({"1A": "x"}, "env.1A", "not a valid environment variable name"),
        ({"A\n": "x"}, "env.A\n", "not a valid environment variable name"),
        ({"A": "x\0y"}, "env.A", "NUL"),
        ({"A": "\ud800"}, "env.A", "surrogate"),
        ({"BIG": "x" * 900_000}, "env.BIG", "allowed at most 32768"),
        ({f"K{i}": "" for i in range(40_000)}, "env", f"allowed at most {MAX_ENV_KEYS}"),
        ({f"K{i}": "v" * 1000 for i in range(70)}, "env", "allowed at most 65536"),
    ],
)
def test_a_malformed_or_oversized_env_is_refused_naming_the_bound(
    env: dict[str, str], field: str, says: str
) -> None:
    error = refusal(env=env)
    assert error.field == field
    assert says in str(error)


# ---------------------------------------------------------------- every bad_spec names a field
@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"role": ""}, "role"),
        ({"role": "chat\n"}, "role"),
        ({"role": "-x"}, "role"),
        ({"port": 0}, "port"),
        ({"port": 70000}, "port"),
        ({"host": "0.0.0.0"}, "host"),
        ({"model": None}, "model"),
        ({"ctx_size": 1}, "ctx_size"),
        ({"threads": 0}, "threads"),
        ({"env": {"PATH": "/x"}}, "env.PATH"),
        ({"env": {"A": "x" * 40_000}}, "env.A"),
    ],
)
def test_every_validation_failure_names_its_field(kw: dict[str, Any], field: str) -> None:
    error = refusal(**kw)
    assert error.field == field
    _, body = answer_for(error)
    assert body.code == "bad_spec" and body.field == f"spec.{field}"


def test_a_bad_spec_answer_never_says_field_null() -> None:
    answers = {
        "spec.draft_model": RegistryError(
            "draft_model nope: not in the registry; registered models: tiny"
        ),
        "spec.model": RegistryError("model nope: not in the registry; registered models: tiny"),
        "spec.kind": SpecError("kind 'x' is not a kind of this node", field="kind"),
        "spec.restart": SpecError("restart: max_restarts -1", field="restart"),
        "spec": SpecError("something no field covers"),
    }
    for field, error in answers.items():
        _, body = answer_for(error)
        assert (body.code, body.field) == ("bad_spec", field), error


# ---------------------------------------------------------------- whole-string ids
def test_a_trailing_newline_makes_no_token() -> None:
    assert valid_token("chat") and valid_token("n1.b-2_c")
    for bad in ("chat\n", "chat\r\n", "\nchat", "ch at", "", "x" * 65):
        assert not valid_token(bad), repr(bad)


def test_a_node_id_with_a_trailing_newline_is_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text('[node]\nnode_id = "n1\\n"\ndata_dir = "data"\n')
    with pytest.raises(ConfigError, match="node_id 'n1\\\\n' must be a plain token"):
        load_config(config)


def test_a_controller_name_with_a_trailing_newline_is_refused(
    nodes: NodeFactory, fake_llama: str, fake_model: Path
) -> None:
    node = nodes.open(nodes.settings(fake_llama, fake_model))
    with pytest.raises(BadArgument, match="controller 'c1\\\\n' must be a plain token"):
        node.heartbeat("c1\n")
    with pytest.raises(BadArgument, match="controller"):
        node.place(spec(port=free_port()), placed_by="c1\n")
    node.heartbeat("c1")


# ---------------------------------------------------------------- nested TOML
DEEP = ["a = " + "[" * 100_000 + "]" * 100_000, "a = " + "[" * 40 + "]" * 40]


@pytest.mark.parametrize("text", DEEP, ids=["recursion", "depth"])
def test_a_deeply_nested_config_is_a_one_line_error(tmp_path: Path, text: str) -> None:
    config = tmp_path / "node.toml"
    config.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    message = str(caught.value)
    assert message.startswith(f"{config}: not valid TOML: ") and "\n" not in message


@pytest.mark.parametrize("text", DEEP, ids=["recursion", "depth"])
def test_a_deeply_nested_fragment_is_a_one_line_error(tmp_path: Path, text: str) -> None:
    fragment = tmp_path / "deep.toml"
    fragment.write_text(text)
    done = subprocess.run(
        [str(INFERVISOR), "place", str(tmp_path / "data"), "--file", str(fragment)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr
    assert f"--file {fragment}: not valid TOML: " in done.stderr


# ---------------------------------------------------------------- [[models]]
def test_a_configured_model_that_differs_from_its_registration_is_refused(
    tmp_path: Path,
) -> None:
    registry = ModelRegistry(tmp_path / "models")
    (tmp_path / "models").mkdir()
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / "models" / name).write_bytes(FAKE_GGUF + name.encode())
    register_models(registry, [ModelEntryConfig(name="tiny", path="a.gguf")])
    register_models(registry, [ModelEntryConfig(name="tiny", path="./a.gguf")])  # the same file
    with pytest.raises(RunError) as caught:
        register_models(registry, [ModelEntryConfig(name="tiny", path="b.gguf")])
    message = str(caught.value)
    assert "'b.gguf'" in message and "'a.gguf'" in message
    assert str(tmp_path / "models" / "tiny.toml") in message and "remove that manifest" in message
    assert registry.entry("tiny").path == "a.gguf"  # nothing re-registered behind the operator


# ---------------------------------------------------------------- file modes
def test_server_logs_and_their_rotations_are_private(tmp_path: Path) -> None:
    with umask(0):
        for _ in range(3):  # three spawns: .1 and .2 are rotated copies
            for fd in create_logs(str(tmp_path)):
                os.write(fd, b"spec env and requests\n")
                os.close(fd)
        _, err = log_paths(str(tmp_path))
        Path(err + ".earlier").write_bytes(b"saved tail")
        Path(err + ".earlier").chmod(0o666)  # as an older version could leave it
        rotate(err)
    logs = sorted(p.name for p in tmp_path.iterdir())
    assert {"server.stdout.log.2", "server.stderr.log.1", "server.stderr.log.3"} <= set(logs)
    assert {p.name: mode(p) for p in tmp_path.iterdir()} == dict.fromkeys(logs, 0o600)


def test_node_log_is_private(tmp_path: Path) -> None:
    with umask(0), diagnostics_to(tmp_path / "node.log"):
        pass
    assert mode(tmp_path / "node.log") == 0o600


def test_chain_backup_and_export_are_private(tmp_path: Path) -> None:
    db = make_chain(tmp_path / "data", 6, every=3)
    with umask(0):
        backup_chain(db, tmp_path / "backup.db")
        export_bundle(db, tmp_path / "bundle")
    assert mode(tmp_path / "backup.db") == 0o600
    bundle = tmp_path / "bundle"
    found = {p.relative_to(bundle).as_posix(): mode(p) for p in [bundle, *bundle.rglob("*")]}
    assert found.pop("checkpoints") == 0o700 and found.pop(".") == 0o700
    assert set(found) >= {"events.jsonl", "manifest.json", "checkpoints/3.txt"}
    assert set(found.values()) == {0o600}, found


# ---------------------------------------------------------------- the node's server runs
def launch(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LAUNCHER), *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    path = tmp_path / "m.gguf"
    path.write_bytes(FAKE_GGUF)
    return path


def test_the_launcher_execs_exactly_the_configured_server(tmp_path: Path, weights: Path) -> None:
    good = marker_server(tmp_path / "good", tmp_path / "good.ran")
    marker_server(tmp_path / "evil", tmp_path / "evil.ran")
    args = ["-m", str(weights), "--port", str(free_port())]
    evil_path = f"{tmp_path / 'evil'}:{os.environ['PATH']}"
    done = launch(args, {"PATH": evil_path, "INFERVISOR_LLAMA_SERVER": str(good)})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "good.ran").read_text().startswith(f"-m {weights} ")
    assert not (tmp_path / "evil.ran").exists()
    # By hand, with no choice given, PATH decides (as documented for manual use).
    done = launch(args, {"PATH": evil_path})
    assert done.returncode == 0 and (tmp_path / "evil.ran").exists(), done.stderr


@pytest.mark.parametrize("value", ["llama-server", "bin/llama-server", "/nonexistent/llama"])
def test_the_launcher_refuses_a_choice_it_cannot_exec_as_given(
    tmp_path: Path, weights: Path, value: str
) -> None:
    marker_server(tmp_path / "evil", tmp_path / "evil.ran")
    env = {"PATH": str(tmp_path / "evil"), "INFERVISOR_LLAMA_SERVER": value}
    done = launch(["-m", str(weights), "--port", str(free_port())], env)
    assert done.returncode == 1 and "INFERVISOR_LLAMA_SERVER" in done.stderr, done.stderr
    assert not (tmp_path / "evil.ran").exists()


def count_events(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        (count,) = conn.execute("SELECT count(*) FROM events").fetchone()
    return int(count)


def test_a_node_runs_the_server_resolved_at_config_load_and_refuses_env_path(
    nodes: NodeFactory, fake_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = good_server(tmp_path / "good", tmp_path / "good.ran")
    marker_server(tmp_path / "evil", tmp_path / "evil.ran")
    monkeypatch.setenv("PATH", f"{good.parent}:{os.environ['PATH']}")
    config = tmp_path / "node.toml"
    node_table = f'[node]\nnode_id = "n1"\ndata_dir = "data"\nllamacpp_program = "{LAUNCHER}"\n'
    config.write_text(node_table)
    chosen = load_config(config).node.llama_server
    assert chosen == str(good)  # auto, resolved on the node's PATH when the config was read
    # The node's own PATH changes after the config was read: it changes nothing.
    monkeypatch.setenv("PATH", f"{tmp_path / 'evil'}:{os.environ['PATH']}")
    node = nodes.open(nodes.settings(str(LAUNCHER), fake_model, llama_server=chosen))
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    db = Path(node.settings.chain_path)

    before = count_events(db)
    with pytest.raises(SpecError) as caught:
        node.place(spec(port=free_port(), env={"PATH": str(tmp_path / "evil")}))
    assert caught.value.field == "env.PATH"
    assert answer_for(caught.value)[1].field == "spec.env.PATH"
    assert count_events(db) == before  # refused: nothing appended

    port = free_port()
    iid = node.place(spec(port=port))
    node.start(iid)
    node.wait_for(iid, lambda v: v.lifecycle == "running", 60)
    assert f"--port {port}" in (tmp_path / "good.ran").read_text()
    workdir = Path(node.settings.data_dir) / "instances" / iid
    written = {p.name: mode(p) for p in workdir.rglob("*") if p.is_file()}
    assert "server.stderr.log" in written and any(n.endswith(".json") for n in written)
    assert set(written.values()) == {0o600}, written  # logs, launch record: private
    node.unload(iid)
    assert not (tmp_path / "evil.ran").exists()


def test_an_env_too_large_to_exec_once_escaped_is_refused_at_placement(
    nodes: NodeFactory, fake_llama: str, fake_model: Path
) -> None:
    # The spec's own size bound keeps its env far below Linux's limit, so the
    # node's [node.env] makes the launch too large: 30 KB of escapes, six times
    # that as the trampoline's one JSON argument.
    big = {"NODE_NOTE": "\x01" * 30_000}
    node = nodes.open(nodes.settings(fake_llama, fake_model, env=big))
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    db = Path(node.settings.chain_path)
    before = count_events(db)
    with pytest.raises(SpecError, match="Linux allows 131072 bytes in one") as caught:
        node.place(spec(port=free_port()))
    assert caught.value.field == "env"
    assert count_events(db) == before


def test_a_spec_too_large_for_one_tiles_entry_is_refused_naming_the_env(
    nodes: NodeFactory, fake_llama: str, fake_model: Path
) -> None:
    node = nodes.open(nodes.settings(fake_llama, fake_model))
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    escaped = {f"K{i}": "\x01" * 1000 for i in range(5)}  # 5 KB, six times that as JSON
    db = Path(node.settings.chain_path)
    before = count_events(db)
    with pytest.raises(SpecError, match=r"allowed at most 16384 \(16 KiB\)") as caught:
        node.place(spec(port=free_port(), env=escaped))
    assert caught.value.field == "env"
    assert count_events(db) == before


def test_node_env_and_config_instances_get_the_same_refusals(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    base = '[node]\nnode_id = "n1"\ndata_dir = "data"\n'
    config.write_text(base + '[node.env]\nLD_PRELOAD = "/tmp/x.so"\n')
    with pytest.raises(ConfigError, match=r"\[node\] env.LD_PRELOAD: refused"):
        load_config(config)
    config.write_text(
        base + '[[instances]]\nrole = "chat"\nflavor = "ollama"\nport = 11434\n'
        'mode = "adopted"\nenv = { PYTHONPATH = "/tmp" }\n'
    )
    with pytest.raises(ConfigError, match=r"\[\[instances\]\] #1: env.PYTHONPATH: refused"):
        load_config(config)


def test_a_llama_server_that_is_not_a_program_is_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    base = '[node]\nnode_id = "n1"\ndata_dir = "data"\n'
    for value, says in [("llama", "allowed auto, embedded"), ("./nothing", "not an executable")]:
        config.write_text(base + f'llama_server = "{value}"\n')
        with pytest.raises(ConfigError, match=f"llama_server .*{says}"):
            load_config(config)
    config.write_text(base + 'llama_server = "embedded"\n')
    assert load_config(config).node.llama_server == "embedded"


def test_the_api_refuses_a_spec_env_path_naming_it_and_records_nothing(
    tmp_path: Path, fake_llama: str
) -> None:
    data = tmp_path / "data"
    config = tmp_path / "node.toml"
    config.write_text(
        f'[node]\nnode_id = "n1"\ndata_dir = "data"\nllamacpp_program = "{fake_llama}"\n'
    )
    marker_server(tmp_path / "evil", tmp_path / "evil.ran")
    run = NodeRun(config, tmp_path / "run.log")
    try:
        run.until("the API socket", (data / "api.sock").exists)
        transport = httpx.HTTPTransport(uds=str(data / "api.sock"))
        with httpx.Client(transport=transport, base_url="http://node", timeout=30) as client:
            run.until("the node open", lambda: client.get("/v1/node").status_code == 200)
            before = count_events(data / "chain.db")
            base = {"role": "chat", "flavor": "llamacpp", "model": "tiny", "port": free_port()}
            bodies = {
                "spec.env.PATH": {"env": {"PATH": str(tmp_path / "evil")}},
                "spec.env.BIG": {"env": {"BIG": "x" * 900_000}},
                "spec.env": {"env": {f"K{i}": "" for i in range(40_000)}},
                "spec.role": {"role": "chat\n"},
            }
            for field, extra in bodies.items():
                answer = client.post("/v1/instances", json={"spec": base | extra, "start": True})
                error = answer.json()["error"]
                assert (answer.status_code, error["code"], error["field"]) == (
                    400, "bad_spec", field
                ), error  # fmt: skip
            answer = client.post("/v1/heartbeat", json={"controller": "c1\n"})
            assert answer.status_code == 400 and answer.json()["error"]["field"] == "controller"
            assert count_events(data / "chain.db") == before  # nothing recorded
        assert run.stop() == 0, run.output()
    finally:
        end_runs([run], data / "chain.db")
    assert not (tmp_path / "evil.ran").exists()
