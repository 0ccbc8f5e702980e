"""One interface over every model server an instance can run on.

The instance actor talks only to a :class:`ServerAdapter`: spawn (managed
only), probe, and the address check that guards every start. Source:
``reference/infer_runtime.rs.txt`` (``InferRuntime``: adopted vs managed) and
``reference/infer_lifecycle.rs.txt`` (start, status).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import msgspec

from .errors import AdmissionRefused
from .launch import build_llamacpp_launch, resolve_program
from .ports import port_in_use
from .probe import ServerClient, ServerReport
from .process import ExitInfo, LaunchPlan, ManagedProcess
from .registry import ModelRegistry, check_format
from .spec import Flavor, InstanceSpec, Mode

__all__ = ["AdapterSettings", "LaunchedServer", "ServerAdapter", "make_adapter"]


class AdapterSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What a node gives its adapters.

    Attributes:
        llamacpp_program: the llama.cpp launcher (``infervisor-llama-server`` or a path).
        data_root: per-instance working directories are made under it.
        env_passthrough: parent environment names forwarded to servers.
        extra_env: environment entries added for every server.
        probe_timeout_s: per-request timeout of health probes, seconds.
    """

    llamacpp_program: str
    data_root: str
    env_passthrough: tuple[str, ...] = ("HOME", "PATH")
    extra_env: dict[str, str] = msgspec.field(default_factory=dict)
    probe_timeout_s: float = 2.0


class ServerAdapter(Protocol):
    """What the instance actor needs of a server, whatever its flavor and mode."""

    spec: InstanceSpec
    managed: bool

    def spawn(self, on_exit: Callable[[ExitInfo], None]) -> ManagedProcess:
        """Launch the server (managed only). Raises SpawnError or AdmissionRefused."""
        ...

    def probe(self) -> ServerReport:
        """Ask the server how it is (never raises: unreachable is a report)."""
        ...

    def address_taken(self) -> str | None:
        """``host:port`` when something already listens there, else None."""
        ...

    def close(self) -> None:
        """Release the HTTP client."""
        ...


class LaunchedServer:
    """A managed llama.cpp server: launched through the launcher program."""

    managed = True

    def __init__(self, spec: InstanceSpec, plan: LaunchPlan, probe_timeout_s: float) -> None:
        self.spec = spec
        self.plan = plan
        self._client = ServerClient(spec.base_url, probe_timeout_s)

    def spawn(self, on_exit: Callable[[ExitInfo], None]) -> ManagedProcess:
        Path(self.plan.cwd).mkdir(parents=True, exist_ok=True)
        return ManagedProcess.spawn(self.plan, on_exit)

    def probe(self) -> ServerReport:
        return self._client.probe(self.spec.flavor)

    def address_taken(self) -> str | None:
        host, port = self.spec.bind_host, self.spec.port
        return f"{host}:{port}" if port_in_use(host, port) else None

    def close(self) -> None:
        self._client.close()


def make_adapter(
    spec: InstanceSpec,
    instance_id: str,
    registry: ModelRegistry,
    settings: AdapterSettings,
) -> ServerAdapter:
    """Build the adapter for a placed instance, resolving its model in the registry.

    Raises:
        SpecError: the spec is invalid.
        RegistryError: the model (or draft model) is not in the registry or fails its digest.
        AdmissionRefused: the flavor/mode is not supported here, or the format does not fit.
    """
    spec.validate()
    if spec.mode is not Mode.MANAGED or spec.flavor is not Flavor.LLAMACPP:
        raise AdmissionRefused(
            f"{spec.flavor.adapter_id(spec.mode)} is not available on this node yet; "
            "supported: infer.llamacpp"
        )
    assert spec.model is not None  # validate() guarantees it for managed specs
    model = registry.resolve(spec.model)
    check_format(spec.flavor, model)
    draft = registry.resolve(spec.draft_model) if spec.draft_model else None
    plan = build_llamacpp_launch(
        spec,
        model,
        draft,
        program=resolve_program(settings.llamacpp_program),
        workdir=Path(settings.data_root) / "instances" / instance_id,
        passthrough=settings.env_passthrough,
        extra_env=settings.extra_env,
    )
    return LaunchedServer(spec, plan, settings.probe_timeout_s)
