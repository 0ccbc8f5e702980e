"""The node's models as a resource: ``GET /v1/models``, the registry's
manifests (name, format, size, digest), so a controller learns what a node
can run before it places (tools/api/inventory.py)."""

from __future__ import annotations

from litestar import Controller, get

from ..context import AdmittedNode
from ..inventory import ModelList, models_of
from ..openapi import responses
from .params import PREFIX

__all__ = ["ModelController"]


class ModelController(Controller):
    """``GET /v1/models``."""

    path = PREFIX

    @get("/models", operation_id="listModels", sync_to_thread=True, responses=responses())
    def list_models(self, node: AdmittedNode) -> ModelList:
        """Every model of the node's registry, ordered by name: its format, the
        weights' size (bytes) and BLAKE3 digest (hex; both null for Ollama)."""
        return models_of(node.registry)
