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
from .probe import ServerClient, ServerReport, deep_health
from .server import AdapterKind, AdapterSettings
from .spec import InstanceSpec

__all__ = ["OllamaServer"]

UNLOAD_WAIT_S = 30.0


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
        self.keep_alive = ollama.parse_keep_alive(settings.ollama_keep_alive)
        self._probe_timeout = settings.probe_timeout_s
        self.probe_timeout_s = settings.probe_timeout_s
        self._deep_timeout = settings.deep_timeout_s
        self._client = ServerClient(spec.base_url, settings.probe_timeout_s)

    def begin_load(self) -> ollama.OllamaLoad:
        """Start loading the model in the background (see :class:`ollama.OllamaLoad`)."""
        return ollama.OllamaLoad(
            self.spec.base_url, self.tag, self.keep_alive, probe_timeout=self._probe_timeout
        ).start()

    def unload_and_wait(self) -> bool:
        """Unload (keep_alive 0), then wait until Ollama no longer lists it. Raises ProbeError."""
        ollama.unload(self.spec.base_url, self.tag)
        return ollama.wait_unloaded(self.spec.base_url, self.tag, UNLOAD_WAIT_S)

    def probe(self) -> ServerReport:
        return self._client.probe(self.spec.flavor)

    def deep_health(self) -> str:
        tag = self.tag
        return deep_health(self.spec.base_url, self.spec.flavor, self._deep_timeout, lambda _: tag)

    def address_taken(self) -> str | None:
        return None  # Ollama's own address: we drive it, we never bind it

    def close(self) -> None:
        self._client.close()
