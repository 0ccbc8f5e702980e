"""adapters.launch: the llama.cpp argv and environment built from a spec and the registry."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import FAKE_GGUF

from infervisor.adapters.errors import AdmissionRefused, SpecError
from infervisor.adapters.launch import build_llamacpp_launch
from infervisor.adapters.registry import ModelFormat, ModelRegistry, ResolvedModel
from infervisor.adapters.spec import Flavor, InstanceSpec, Mode


@pytest.fixture
def reg(tmp_path: Path) -> ModelRegistry:
    (tmp_path / "w").mkdir()
    for name in ("tiny", "draft"):
        (tmp_path / "w" / f"{name}.gguf").write_bytes(FAKE_GGUF + name.encode() * 10)
    registry = ModelRegistry(tmp_path)
    registry.adopt("tiny", tmp_path / "w" / "tiny.gguf")
    registry.adopt("draft", tmp_path / "w" / "draft.gguf")
    registry.adopt("llama3", format=ModelFormat.OLLAMA)
    return registry


def spec(**kw: object) -> InstanceSpec:
    fields: dict[str, object] = {
        "role": "chat",
        "flavor": Flavor.LLAMACPP,
        "port": 18080,
        "model": "tiny",
    }
    return InstanceSpec(**(fields | kw))  # type: ignore[arg-type]


def test_plan_argv_env_and_cwd(
    reg: ModelRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", "/home/op")
    monkeypatch.setenv("SECRET_TOKEN", "x")
    s = spec(draft_model="draft", ctx_size=2048, env={"OMP_NUM_THREADS": "2", "NODE": "spec"})
    plan = build_llamacpp_launch(
        s,
        reg.resolve("tiny"),
        reg.resolve("draft"),
        program="infervisor-llama-server",
        workdir=tmp_path / "inst",
        passthrough=("HOME",),
        extra_env={"NODE": "node", "HF_HOME": "/hf"},
        llama_server="/opt/llama/bin/llama-server",
    )
    weights = (tmp_path / "w").resolve()
    assert plan.program == "infervisor-llama-server"
    assert plan.args == [
        "-m", str(weights / "tiny.gguf"),
        "--host", "127.0.0.1",
        "--port", "18080",
        "-c", "2048",
        "--alias", "tiny",
        "-md", str(weights / "draft.gguf"),
    ]  # fmt: skip
    assert plan.env == {
        "HOME": "/home/op",
        "HF_HOME": "/hf",
        "NODE": "spec",
        "OMP_NUM_THREADS": "2",
        "INFERVISOR_LLAMA_SERVER": "/opt/llama/bin/llama-server",  # the node's, set last
    }
    assert plan.cwd == str(tmp_path / "inst")


def test_plan_without_draft(reg: ModelRegistry, tmp_path: Path) -> None:
    plan = build_llamacpp_launch(spec(), reg.resolve("tiny"), None, program="p", workdir=tmp_path)
    assert "-md" not in plan.args
    assert plan.args[-2:] == ["--alias", "tiny"]


def test_refusals(reg: ModelRegistry, tmp_path: Path) -> None:
    tiny, draft = reg.resolve("tiny"), reg.resolve("draft")
    with pytest.raises(AdmissionRefused, match="cannot run model llama3"):
        build_llamacpp_launch(
            spec(model="llama3"), reg.resolve("llama3"), None, program="p", workdir=tmp_path
        )
    with pytest.raises(AdmissionRefused, match="spec asks for model draft"):
        build_llamacpp_launch(spec(model="draft"), tiny, None, program="p", workdir=tmp_path)
    with pytest.raises(AdmissionRefused, match="draft model None"):
        build_llamacpp_launch(spec(), tiny, draft, program="p", workdir=tmp_path)
    with pytest.raises(AdmissionRefused, match="cannot run a spec for ollama"):
        build_llamacpp_launch(spec(flavor=Flavor.OLLAMA), tiny, None, program="p", workdir=tmp_path)
    with pytest.raises(SpecError, match="loopback"):
        build_llamacpp_launch(spec(host="0.0.0.0"), tiny, None, program="p", workdir=tmp_path)
    assert isinstance(tiny, ResolvedModel)
    assert spec().mode is Mode.MANAGED


def test_embeddings_and_pooling_are_llama_servers_flags(reg: ModelRegistry, tmp_path: Path) -> None:
    """``embeddings`` and ``pooling`` become ``--embeddings --pooling P``; the
    launcher passes them on to llama-server (and to the embedded one)."""
    from infervisor.tools.servers.launcher import llama_server_argv, parse_args

    s = spec(embeddings=True, pooling="mean")
    plan = build_llamacpp_launch(
        s, reg.resolve("tiny"), None, program="p", workdir=tmp_path / "inst"
    )
    assert plan.args[-3:] == ["--embeddings", "--pooling", "mean"]
    plain = build_llamacpp_launch(spec(), reg.resolve("tiny"), None, program="p", workdir=tmp_path)
    assert "--embeddings" not in plain.args and "--pooling" not in plain.args
    args = parse_args(plan.args)
    assert args is not None and args.embeddings and args.pooling == "mean"
    assert llama_server_argv("/bin/llama-server", args)[-3:] == [
        "--embeddings",
        "--pooling",
        "mean",
    ]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"embeddings": True, "flavor": Flavor.MLX_LM}, "embeddings"),
        ({"embeddings": True, "mode": Mode.ADOPTED}, "embeddings"),
        ({"pooling": "mean", "flavor": Flavor.MLX_LM}, "pooling"),
        ({"embeddings": True, "pooling": "max"}, "pooling"),
    ],
)
def test_embeddings_and_pooling_are_refused_naming_the_field(
    fields: dict[str, object], field: str
) -> None:
    with pytest.raises(SpecError) as refused:
        spec(**fields).validate()
    assert refused.value.field == field and field in str(refused.value)


def test_threads_is_llama_servers_threads_flag(reg: ModelRegistry, tmp_path: Path) -> None:
    """``threads`` becomes ``-t N``, which the launcher passes on to an exec'd
    llama-server and to the embedded one (generation and batches); none: no
    ``-t`` in the plan, and the launcher's default (2)."""
    from infervisor.tools.servers.launcher import (
        DEFAULT_THREADS,
        _build_params,
        llama_server_argv,
        parse_args,
    )

    plan = build_llamacpp_launch(spec(threads=1), reg.resolve("tiny"), None, program="p",
                                 workdir=tmp_path)  # fmt: skip
    assert plan.args[-2:] == ["-t", "1"]
    args = parse_args(plan.args)
    assert args is not None and args.threads == 1
    assert llama_server_argv("/bin/llama-server", args)[7:9] == ["-t", "1"]
    xllamacpp = pytest.importorskip("xllamacpp")
    params = _build_params(xllamacpp, args)
    assert (params.cpuparams.n_threads, params.cpuparams_batch.n_threads) == (1, 1)

    plain = build_llamacpp_launch(spec(), reg.resolve("tiny"), None, program="p", workdir=tmp_path)
    assert "-t" not in plain.args
    default = parse_args(plain.args)
    assert default is not None and default.threads == DEFAULT_THREADS


@pytest.mark.parametrize(
    "fields",
    [
        {"threads": 0},
        {"threads": -2},
        {"threads": 1025},
        {"threads": True},
        {"threads": 2.0},
    ],
)
def test_threads_is_refused_naming_the_field_and_the_allowed_values(
    fields: dict[str, object],
) -> None:
    with pytest.raises(SpecError) as refused:
        spec(**fields).validate()
    assert refused.value.field == "threads"
    assert "threads" in str(refused.value) and "1 to 1024" in str(refused.value)


@pytest.mark.parametrize(
    ("fields", "which"),
    [
        ({"threads": 2, "flavor": Flavor.MLX_LM}, "mlx-lm, managed"),
        ({"threads": 2, "mode": Mode.ADOPTED}, "llamacpp, adopted"),
    ],
)
def test_threads_on_another_server_names_the_server_not_the_range(
    fields: dict[str, object], which: str
) -> None:
    """Stop 34's trial: ``threads 2`` on mlx-lm read "allowed a whole number from 1 to
    1024", though 2 is one; the flavor (or mode) is what is wrong."""
    with pytest.raises(SpecError) as refused:
        spec(**fields).validate()
    assert refused.value.field == "threads"
    assert (
        f"only a managed llama.cpp server takes threads (its --threads); this one is {which}"
        in str(refused.value)
    )
    assert "1 to 1024" not in str(refused.value)
    assert "managed llama.cpp" in str(refused.value)
