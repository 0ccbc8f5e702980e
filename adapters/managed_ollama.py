"""Managed Ollama: driven through its HTTP API, never started by us.

Source: ``reference/infer_lifecycle.rs.txt`` (the Ollama arms of
``start_instance``, ``stop_instance``, ``unload_instance``): a load runs in the
background with only ``model`` and ``keep_alive``; a model already resident
when we ask is not ours, so stop leaves it loaded; a model we asked to load is
ours from the moment we ask, so a stop during the load still unloads it;
memory counts as released only when ``/api/ps`` no longer lists the model.
"""

from __future__ import annotations

from . import ollama
from .errors import ProbeError
from .ollama_keep_alive import spec_keep_alive
from .ollama_load import OllamaLoad
from .probe import ServerClient, ServerReport
from .server import AdapterKind, AdapterSettings
from .spec import Flavor, InstanceSpec, Mode

__all__ = ["DEFAULT_LOAD_TIMEOUT_S", "OllamaServer", "address_conflict", "load_timeout_s"]

UNLOAD_WAIT_S = 30.0
DEFAULT_LOAD_TIMEOUT_S = ollama.LOAD_TIMEOUT
"""Seconds an Ollama load may take when its kind gives no startup allowance
(``startup_cap_s`` 0, as the ``process`` kind): 900 s, the reference's value,
long enough for a large model read from a slow disk."""


def load_timeout_s(startup_cap_s: float) -> float:
    """Seconds an Ollama load may take: the kind's ``startup_cap_s``, the most a
    loading server is given to become ready (the ``inference`` kind: 900 s);
    :data:`DEFAULT_LOAD_TIMEOUT_S` for a kind with no allowance (cap 0).

    A load still running then is given up (its request is cut off, which
    Ollama takes as a cancel) and ends as a failed load: an exit under the
    restart policy."""
    return startup_cap_s if startup_cap_s > 0 else DEFAULT_LOAD_TIMEOUT_S


def _binds_port(spec: InstanceSpec) -> bool:
    """A managed llama.cpp or mlx-lm server listens on its port itself; Ollama's
    port is Ollama's, and an adopted server is somebody else's."""
    return spec.mode is Mode.MANAGED and spec.flavor is not Flavor.OLLAMA


def address_conflict(spec: InstanceSpec, other: InstanceSpec) -> str | None:
    """Why ``spec`` cannot share its address with ``other`` (None: it can).

    The one-address rule is for adapters that bind their port (managed
    llama.cpp and mlx-lm): nothing else may use that address. One Ollama
    serves any number of models from its one port, so managed and adopted
    Ollama instances share it, one instance per model when one of them is
    managed (the node unloads a model it loaded: two instances of it would
    unload each other's model).
    """
    if (spec.bind_host, spec.port) != (other.bind_host, other.port):
        return None
    if _binds_port(spec) or _binds_port(other):
        binder = spec if _binds_port(spec) else other
        what = binder.flavor.value
        return f"a managed {what} server binds its port and needs an address of its own"
    both_ollama = spec.flavor is Flavor.OLLAMA and other.flavor is Flavor.OLLAMA
    one_managed = Mode.MANAGED in (spec.mode, other.mode)
    if both_ollama and one_managed and spec.model is not None and spec.model == other.model:
        return (
            f"Ollama there already serves model {spec.model} for it; one Ollama serves a model "
            "to one instance when it is managed (give other models their own instances)"
        )
    return None


class OllamaServer:
    """One Ollama model as an instance: load, unload, probe."""

    kind: AdapterKind = "ollama"

    def __init__(
        self, spec: InstanceSpec, tag: str, model_bytes: int, settings: AdapterSettings
    ) -> None:
        self.spec = spec
        self.tag = tag
        self.adapter_id = spec.flavor.adapter_id(spec.mode)
        self.served_model: str | None = tag
        self.model_bytes = model_bytes
        self.keep_alive = spec_keep_alive(spec.idle_ttl_s, settings.ollama_keep_alive)
        self._probe_timeout = settings.probe_timeout_s
        self.probe_timeout_s = settings.probe_timeout_s
        self._client = ServerClient(spec.base_url, settings.probe_timeout_s)

    def begin_load(self, timeout_s: float = DEFAULT_LOAD_TIMEOUT_S) -> OllamaLoad:
        """Start loading the model in the background (see :class:`~.ollama_load.OllamaLoad`);
        the load may take ``timeout_s`` seconds (see :func:`load_timeout_s`)."""
        return OllamaLoad(
            self.spec.base_url,
            self.tag,
            self.keep_alive,
            timeout=timeout_s,
            probe_timeout=self._probe_timeout,
        ).start()

    def reported_size(self) -> int | None:
        """What Ollama says the model takes on disk (``/api/tags`` ``size``, bytes),
        for the reservation at a start; None when Ollama cannot be asked or gives
        no size (the registry's size is used then)."""
        try:
            return ollama.pulled_size(self.spec.base_url, self.tag, self.probe_timeout_s)
        except ProbeError:
            return None

    def unload_and_wait(self) -> bool:
        """Unload (keep_alive 0), then wait until Ollama no longer lists it. Raises ProbeError."""
        ollama.unload(self.spec.base_url, self.tag)
        return ollama.wait_unloaded(self.spec.base_url, self.tag, UNLOAD_WAIT_S)

    plain_probe = True

    def probe(self) -> ServerReport:
        return self._client.probe(self.spec.flavor)

    def deep_model(self, report: ServerReport) -> str | None:
        """The model's tag: Ollama loads what it is asked for."""
        return self.tag

    def address_taken(self) -> str | None:
        return None  # Ollama's own address: we drive it, we never bind it

    def close(self) -> None:
        self._client.close()
