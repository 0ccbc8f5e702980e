"""Admission: plan an instance in the reference order and build its adapter.

Order (``reference/infer_runtime.rs.txt`` ``plan``): the spec is validated;
the adapter for its flavor and mode must be enabled; the port must be in the
allowed range before any connection is made; an adopted server must answer;
a managed model must resolve in the registry with a format the flavor runs;
Ollama must answer and have the model pulled; a launched server needs its
draft model, an executable serve program and a free port. Nothing here
changes anything: a refusal raises, and admission can be asked on its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from .adopted import AdoptedServer
from .errors import AddressTaken, AdmissionRefused, RegistryError
from .launch import build_llamacpp_launch, build_mlx_launch, check_exec_size, resolve_program
from .launched import LaunchedServer
from .llama_choice import resolve_llama_server
from .managed_ollama import OllamaServer
from .ports import port_in_use
from .probe import HealthKind, ProbeTarget
from .prober import HttpProber, Prober
from .proc.limits import ProcLimits
from .proc.plan import LaunchPlan
from .registry import ModelRegistry, ResolvedModel, check_format
from .server import AdapterSettings, Admission, ServerAdapter
from .spec import Flavor, InstanceSpec, Mode

__all__ = ["ALL_ADAPTERS", "build_adapter", "plan", "verify_weights"]

#: Every adapter id a node can enable.
ALL_ADAPTERS: tuple[str, ...] = tuple(
    f.adapter_id(m) for f in Flavor for m in (Mode.MANAGED, Mode.ADOPTED)
)


def plan(
    spec: InstanceSpec,
    instance_id: str,
    registry: ModelRegistry,
    settings: AdapterSettings,
    enabled: tuple[str, ...] = ALL_ADAPTERS,
    *,
    prober: Prober | None = None,
) -> tuple[ServerAdapter, Admission]:
    """Admit ``spec`` and build its adapter, with the reference's notes.

    ``prober`` asks an adopted server or Ollama whether it answers (None: over HTTP).

    Raises:
        SpecError: the spec is invalid.
        AdmissionRefused: refused at one of the steps (AddressTaken for a taken port).
        RegistryError: the model is missing or fails its digest.
    """
    spec.validate()
    prober = prober or HttpProber()  # no thread: it only checks
    adapter_id = spec.flavor.adapter_id(spec.mode)
    if adapter_id not in enabled:
        raise AdmissionRefused(
            f"{adapter_id} is not enabled on this node; enabled: {', '.join(enabled)}"
        )
    _check_port_range(spec, settings)
    notes = [f"endpoint {spec.base_url}"]
    if spec.mode is Mode.ADOPTED:
        notes += _adopted_answers(spec, settings, prober)
        return _finish(build_adapter(spec, instance_id, registry, settings), notes)
    assert spec.model is not None  # validate() requires it when managed
    model = _resolve(registry, spec.model, "model")
    check_format(spec.flavor, model)
    notes.append(f"model {model.entry.name} ({model.entry.format.value}) verified")
    if spec.draft_model:
        _resolve(registry, spec.draft_model, "draft model")
    if spec.flavor is Flavor.OLLAMA:
        _ollama_has(spec, model, settings, prober)
    else:
        _address_free(spec)
    adapter = build_adapter(spec, instance_id, registry, settings)
    if isinstance(adapter, LaunchedServer):
        notes.append(f"launch {adapter.plan.program} with {len(adapter.plan.args)} args")
    return _finish(adapter, notes)


def _finish(adapter: ServerAdapter, notes: list[str]) -> tuple[ServerAdapter, Admission]:
    return adapter, Admission(adapter.adapter_id, notes)


def build_adapter(
    spec: InstanceSpec, instance_id: str, registry: ModelRegistry, settings: AdapterSettings
) -> ServerAdapter:
    """The adapter of an admitted spec, without admission's probes: used at boot
    to rebuild instances the chain knows (a server it still runs holds its port).

    The weights are located, not read: they are verified before each launch
    (:func:`verify_weights`), on the instance's own thread.

    Raises:
        RegistryError, AdmissionRefused: the model or the serve program is gone.
    """
    if spec.mode is Mode.ADOPTED:
        return AdoptedServer(spec, settings.probe_timeout_s)
    assert spec.model is not None
    model = _locate(registry, spec.model, "model")
    check_format(spec.flavor, model)
    if spec.flavor is Flavor.OLLAMA:
        tag = model.entry.ollama_tag or model.entry.name
        return OllamaServer(spec, tag, model.entry.size_bytes, settings)
    return _launched(spec, instance_id, model, registry, settings)


def _check_port_range(spec: InstanceSpec, settings: AdapterSettings) -> None:
    if settings.allowed_ports is None:
        return
    lo, hi = settings.allowed_ports
    if not lo <= spec.port <= hi:
        raise AdmissionRefused(f"port {spec.port} is outside this node's allowed range {lo}-{hi}")


def _shown(name: str) -> str:
    """``name`` as a message prints it: escaped (``'ab\\u200bc'``) when it holds a
    character that does not print, never raw beside its escaped form (stop 34)."""
    return name if name.isprintable() else repr(name)


def _resolve(registry: ModelRegistry, name: str, what: str) -> ResolvedModel:
    try:
        return registry.resolve(name)
    except RegistryError as e:
        raise _named(e, name, what) from e


def _locate(registry: ModelRegistry, name: str, what: str) -> ResolvedModel:
    try:
        return registry.locate(name)
    except RegistryError as e:
        raise _named(e, name, what) from e


def _named(e: RegistryError, name: str, what: str) -> RegistryError:
    """The registry's refusal of ``name`` as ``what`` (model, draft model): the name
    said once, the registry's own ``model NAME: `` prefix dropped."""
    why = str(e).removeprefix(f"model {name}: ")
    return RegistryError(f"{what} {_shown(name)}: {why}")


def verify_weights(adapter: ServerAdapter, registry: ModelRegistry) -> str | None:
    """Why ``adapter`` must not launch on its weights now, or None when they check out.

    A launched server's model (and draft) are verified against their registry
    manifests: present, the size and BLAKE3 digest recorded, a GGUF header
    that parses, and still the files its launch plan names. Other adapters
    hold no weights of this node's: None.

    Blocking: hashes the weights unless the digest cache proves them
    unchanged (see :mod:`.digest`); run it on the instance's own thread.
    """
    if not isinstance(adapter, LaunchedServer):
        return None
    spec = adapter.spec
    wanted = [("model", spec.model), ("draft model", spec.draft_model)]
    for what, name in wanted:
        if name is None:
            continue
        try:
            model = _resolve(registry, name, what)
        except RegistryError as e:
            return str(e)
        if model.path is not None and str(model.path) not in adapter.plan.args:
            return (
                f"{what} {name}: the manifest now names {model.path}, not the weights this "
                "instance was placed with; place it again"
            )
    return None


def _adopted_answers(spec: InstanceSpec, settings: AdapterSettings, prober: Prober) -> list[str]:
    report = prober.check(ProbeTarget(spec.base_url, spec.flavor, settings.probe_timeout_s))
    if report.health.kind is HealthKind.UNREACHABLE:
        raise AdmissionRefused(
            f"no {spec.flavor.value} server answering at {spec.base_url}: {report.health.reason}"
        )
    notes = [f"adopting running server ({report.health.kind})"]
    notes.append(f"{len(report.models)} model(s) listed")
    if report.version:
        notes.append(f"version {report.version}")
    return notes


def _ollama_has(
    spec: InstanceSpec, model: ResolvedModel, settings: AdapterSettings, prober: Prober
) -> None:
    tag = model.entry.ollama_tag or model.entry.name
    report = prober.check(ProbeTarget(spec.base_url, spec.flavor, settings.probe_timeout_s))
    if report.health.kind is HealthKind.UNREACHABLE:
        raise AdmissionRefused(
            f"ollama is not answering at {spec.base_url}; "
            "infervisor drives it but does not start it"
        )
    if not report.lists(tag):
        raise AdmissionRefused(
            f"ollama has no model {tag}: pull it first; infervisor never downloads"
        )


def _address_free(spec: InstanceSpec) -> None:
    if port_in_use(spec.bind_host, spec.port):
        raise AddressTaken(
            f"something is already listening on {spec.bind_host}:{spec.port}; "
            "adopt it instead of managing over it"
        )


def _launched(
    spec: InstanceSpec,
    instance_id: str,
    model: ResolvedModel,
    registry: ModelRegistry,
    settings: AdapterSettings,
) -> LaunchedServer:
    draft = _locate(registry, spec.draft_model, "draft_model") if spec.draft_model else None
    llama = spec.flavor is Flavor.LLAMACPP
    program = resolve_program(settings.llamacpp_program if llama else settings.mlx_program)
    workdir = Path(settings.data_root) / "instances" / instance_id
    launch = _launch_plan(spec, model, draft, program=program, workdir=workdir, settings=settings)
    # mlx-lm knows its model by the path it was given (its /v1/models lists that).
    served = model.entry.name if llama else str(model.path)
    return LaunchedServer(
        spec,
        launch,
        served_model=served,
        model_bytes=model.entry.size_bytes,
        probe_timeout_s=settings.probe_timeout_s,
    )


def _launch_plan(
    spec: InstanceSpec,
    model: ResolvedModel,
    draft: ResolvedModel | None,
    *,
    program: str,
    workdir: Path,
    settings: AdapterSettings,
) -> LaunchPlan:
    env: dict[str, Any] = {"passthrough": settings.env_passthrough, "extra_env": settings.extra_env}
    if spec.flavor is Flavor.LLAMACPP:
        chosen = resolve_llama_server(settings.llama_server)  # resolved at config load already
        launch = build_llamacpp_launch(
            spec, model, draft, program=program, workdir=workdir, llama_server=chosen, **env
        )
    else:
        launch = build_mlx_launch(spec, model, program=program, workdir=workdir, **env)
    plan = msgspec.structs.replace(launch, limits=ProcLimits(), run_as=settings.run_as)
    check_exec_size(plan)  # refused now, not with E2BIG at every spawn
    return plan
