"""A managed server launched as a process under supervision: llama.cpp or mlx-lm.

Source: ``reference/infer_lifecycle.rs.txt`` (``spawn``: cleared environment,
output cap, ``unlimited`` limits, ``run_as``) and ``reference/infer_runtime.rs.txt``
(``plan``). mlx-lm's server answers ``/health`` 200 before its model is usable
(and even when loading failed), so its readiness is a one-token completion,
and failures are read from its output (see ``docs/mlx-lm-notes.md``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from .errors import ProbeError
from .ports import port_in_use
from .probe import Health, HealthKind, ServerClient, ServerReport
from .proc.cgroups import InstanceCgroup
from .proc.errors import SpawnError
from .proc.handles import ManagedProcess
from .proc.plan import LaunchPlan
from .proc.waiter import ExitInfo
from .server import AdapterKind
from .spec import Flavor, InstanceSpec

__all__ = ["MLX_FAILURE_PATTERNS", "LaunchedServer"]

#: Lines in mlx_lm.server's output that mean it will never serve (it keeps running).
MLX_FAILURE_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"generation thread died: .+"),
    re.compile(r"OSError: \[Errno 98\] Address already in use"),
)


class LaunchedServer:
    """A server process this node launches; readiness per flavor."""

    kind: AdapterKind = "process"

    def __init__(
        self,
        spec: InstanceSpec,
        plan: LaunchPlan,
        *,
        served_model: str,
        model_bytes: int,
        probe_timeout_s: float,
    ) -> None:
        self.spec = spec
        self.plan = plan
        self.adapter_id = spec.flavor.adapter_id(spec.mode)
        self.served_model: str | None = served_model
        self.model_bytes = model_bytes
        self._client = ServerClient(spec.base_url, probe_timeout_s)
        self._confirmed = False

    def spawn(
        self,
        on_exit: Callable[[ExitInfo], None],
        token: str | None = None,
        cgroup: InstanceCgroup | None = None,
    ) -> ManagedProcess:
        """Launch the server in its own process group, through the exit-status shim.

        Args:
            on_exit: called once with the exit report (see
                :meth:`ManagedProcess.spawn`).
            token: the launch token the caller recorded before launching (see
                :func:`~.proc.recovery.recover_launch`); None: a fresh one, not put
                in the server's environment.
            cgroup: the instance's cgroups (None: no cgroups).

        Raises:
            SpawnError: the server could not be launched.
            ValueError: a malformed token.
        """
        cache = self.plan.env.get("HF_HUB_CACHE")
        try:
            Path(self.plan.cwd).mkdir(parents=True, exist_ok=True)
            if cache:
                Path(cache).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SpawnError(f"cannot create {self.plan.cwd}: {e.strerror or e}") from e
        self._confirmed = False
        return ManagedProcess.spawn(self.plan, on_exit, token, cgroup)

    @property
    def plain_probe(self) -> bool:
        """mlx-lm's first probes also ask for a token (:meth:`_confirm_mlx`)."""
        return self.spec.flavor is not Flavor.MLX_LM or self._confirmed

    def probe(self) -> ServerReport:
        report = self._client.probe(self.spec.flavor)
        if self.spec.flavor is not Flavor.MLX_LM or report.health.kind is not HealthKind.UP:
            return report
        return self._confirm_mlx(report)

    def _confirm_mlx(self, report: ServerReport) -> ServerReport:
        """mlx-lm: 200 on /health proves nothing; one token does (once per process)."""
        if self._confirmed:
            return report
        try:
            self._client.tiny_completion(None)
        except ProbeError as e:
            why = f"/health answers but no token yet: {e}"
            return ServerReport(health=Health(kind=HealthKind.LOADING, reason=why))
        self._confirmed = True
        return report

    def failure_in_output(self, output: str) -> str | None:
        """A line of the server's output saying it will never serve, if any."""
        if self.spec.flavor is not Flavor.MLX_LM:
            return None
        for pattern in MLX_FAILURE_PATTERNS:
            found = pattern.search(output)
            if found:
                return found.group(0).strip()[:300]
        return None

    def deep_model(self, report: ServerReport) -> str | None:
        """The served model; None for mlx-lm, which would try to load a model it is
        sent by name instead of answering with its own."""
        return None if self.spec.flavor is Flavor.MLX_LM else self.served_model

    def address_taken(self) -> str | None:
        host, port = self.spec.bind_host, self.spec.port
        return f"{host}:{port}" if port_in_use(host, port) else None

    def close(self) -> None:
        self._client.close()
