"""Launch plans: the exact argv and environment a managed server starts with.

Source of the behaviour: ``reference/infer_runtime.rs.txt`` (``build_launch``
and ``check_format``: weights come from the registry only, the server binds
the spec's loopback host and port, the environment is cleared but for a few
passed-through names) and ``reference/infer_config.rs.txt`` (``env``,
``env_passthrough``).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

from .errors import AdmissionRefused, ProgramMissing, SpecError
from .llama_choice import LLAMA_SERVER_VAR
from .manifest import ModelFormat
from .proc.plan import LaunchPlan, launch_env
from .registry import ResolvedModel, check_format
from .spec import Flavor, InstanceSpec

__all__ = [
    "MAX_ARG_STRLEN",
    "build_llamacpp_launch",
    "build_mlx_launch",
    "check_exec_size",
    "check_format",
    "resolve_program",
]

_EMPTY: Mapping[str, str] = MappingProxyType({})

MAX_ARG_STRLEN = 32 * 4096
"""Bytes (with its NUL) Linux allows one argv or environment string at exec
(``MAX_ARG_STRLEN`` in ``include/uapi/linux/binfmts.h``); a longer one is E2BIG."""
_MAX_EXEC_BYTES = 1 << 20
"""All of argv and the environment: half of the usual ``ARG_MAX`` (a quarter of
an 8 MiB stack), so the check does not depend on this host's stack limit."""
_SPAWN_MARGIN = 1024
"""Bytes the spawn adds after this check (the launch token variable)."""


def _weights(model: ResolvedModel, role: str) -> str:
    if model.path is None or model.entry.format is not ModelFormat.GGUF:
        raise AdmissionRefused(
            f"{role} {model.entry.name} is {model.entry.format.value}: llama.cpp needs a GGUF file"
        )
    return str(model.path)


def _check_names(spec: InstanceSpec, model: ResolvedModel, draft: ResolvedModel | None) -> None:
    if spec.model != model.entry.name:
        raise AdmissionRefused(f"spec asks for model {spec.model}, not {model.entry.name}")
    if spec.draft_model != (draft.entry.name if draft else None):
        got = draft.entry.name if draft else "none"
        raise AdmissionRefused(f"spec asks for draft model {spec.draft_model}, got {got}")


def build_llamacpp_launch(
    spec: InstanceSpec,
    model: ResolvedModel,
    draft: ResolvedModel | None,
    *,
    program: str,
    workdir: Path,
    passthrough: Sequence[str] = ("HOME", "PATH"),
    extra_env: Mapping[str, str] = _EMPTY,
    llama_server: str | None = None,
) -> LaunchPlan:
    """The plan for a managed llama.cpp server::

        program -m <model path> --host <host> --port <port> -c <ctx_size>
                --alias <model name> [-md <draft path>] [--embeddings]
                [--pooling <pooling>] [-t <threads>]

    run in ``workdir`` with only the ``passthrough`` variables of this process,
    then ``extra_env``, then ``spec.env`` (a later one wins on a clash), then,
    last, ``INFERVISOR_LLAMA_SERVER=<llama_server>`` when ``llama_server`` (the
    node's resolved choice, adapters/llama_choice.py) is given: nothing in a
    spec changes which server the launcher execs.

    Raises:
        SpecError: the spec is invalid.
        AdmissionRefused: not a llama.cpp spec, a model that is not GGUF, or a
            model or draft other than the ones the spec names.
    """
    spec.validate()
    if spec.flavor is not Flavor.LLAMACPP:
        raise AdmissionRefused(f"a llama.cpp launch cannot run a spec for {spec.flavor.value}")
    check_format(spec.flavor, model)
    _check_names(spec, model, draft)
    args = ["-m", _weights(model, "model"), "--host", spec.host, "--port", str(spec.port)]
    args += ["-c", str(spec.ctx_size), "--alias", model.entry.name]
    if draft is not None:
        args += ["-md", _weights(draft, "draft model")]
    if spec.embeddings:
        args += ["--embeddings"]
    if spec.pooling is not None:
        args += ["--pooling", spec.pooling]
    if spec.threads is not None:
        args += ["-t", str(spec.threads)]
    return LaunchPlan(
        program=program,
        args=args,
        env=launch_env(passthrough, {**extra_env, **spec.env, **_chosen(llama_server)}),
        cwd=str(workdir),
    )


def _chosen(llama_server: str | None) -> dict[str, str]:
    return {} if llama_server is None else {LLAMA_SERVER_VAR: llama_server}


def build_mlx_launch(
    spec: InstanceSpec,
    model: ResolvedModel,
    *,
    program: str,
    workdir: Path,
    passthrough: Sequence[str] = ("HOME", "PATH"),
    extra_env: Mapping[str, str] = _EMPTY,
) -> LaunchPlan:
    """The plan for a managed mlx-lm server::

        program --model <model dir> --host <host> --port <port>

    with ``HF_HUB_OFFLINE=1`` so it never reaches for a hub (weights come only
    from the registry) and ``HF_HUB_CACHE`` set to an empty folder of its own.

    Raises:
        AdmissionRefused: not an mlx-lm spec, or the model is not an MLX directory.
    """
    spec.validate()
    if spec.flavor is not Flavor.MLX_LM:
        raise AdmissionRefused(f"an mlx-lm launch cannot run a spec for {spec.flavor.value}")
    check_format(spec.flavor, model)
    _check_names(spec, model, None)
    if model.path is None:
        raise AdmissionRefused(f"model {model.entry.name} has no directory for mlx-lm")
    args = ["--model", str(model.path), "--host", spec.host, "--port", str(spec.port)]
    # Offline, with an empty cache of its own: /v1/models then lists only this model
    # (without a cache directory it answers an empty body; docs/mlx-lm-notes.md).
    cache = str(workdir / "hf-cache")
    # Applied last: no spec or node setting can turn the hub back on.
    env = {**extra_env, **spec.env, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": cache}
    return LaunchPlan(
        program=program, args=args, env=launch_env(passthrough, env), cwd=str(workdir)
    )


def check_exec_size(plan: LaunchPlan) -> None:
    """Refuse a plan Linux could not exec, before it is placed (not at every spawn).

    The limits trampoline carries the whole environment as one JSON argument
    (adapters/proc/limits.py), so escapes in a spec's env values count several
    times over. Checked on :meth:`LaunchPlan.argv`, which is what is exec'd.

    Raises:
        SpecError: (field ``env``) one string over :data:`MAX_ARG_STRLEN`, or
            all of them over 1 MiB, with the sizes.
    """
    strings = [*plan.argv(), *(f"{k}={v}" for k, v in plan.env.items())]
    sizes = [len(s.encode("utf-8", "surrogateescape")) + 1 for s in strings]
    longest, total = max(sizes) + _SPAWN_MARGIN, sum(sizes) + _SPAWN_MARGIN
    if longest > MAX_ARG_STRLEN or total > _MAX_EXEC_BYTES:
        raise SpecError(
            f"env: the server's launch would pass one string of {longest} bytes "
            f"({total} in all); Linux allows {MAX_ARG_STRLEN} bytes in one (the "
            "environment travels as one JSON argument, escapes included): shorten the env",
            field="env",
        )


def resolve_program(name: str) -> str:
    """The absolute path of a serve program, checked to be an executable file.

    A bare name is looked up on ``PATH``, then beside this Python interpreter
    (where ``pip`` installs ``infervisor-llama-server`` in a virtual environment
    that is not activated). Source: ``reference/infer_runtime.rs.txt``
    (``plan``: "serve program ... is not executable").

    Raises:
        ProgramMissing: not found, or not an executable file.
    """
    if os.sep in name:
        path: str | None = name
    else:
        beside = Path(sys.executable).parent / name
        path = shutil.which(name) or (str(beside) if beside.exists() else None)
    if path is None or not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise ProgramMissing(
            f"serve program {name} is not executable (not found on PATH or beside {sys.executable})"
        )
    return str(Path(path).absolute())
