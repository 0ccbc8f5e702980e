"""What a controller needs to know of a node before placing on it: its
inventory (``GET /v1/node``'s ``inventory``) and its models (``GET /v1/models``).

The inventory is read when asked: CPUs and memory from psutil, GPUs from the
vendors' tools through :class:`~infervisor.adapters.gpus.GpuCache` (cached a
few seconds: the tools take tens of milliseconds), the adapters, ports and
memory budget from the node's settings and what its residency ledger holds.
The models are the registry's manifests (adapters/registry.py), read without
touching the weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from infervisor.adapters.errors import RegistryError
from infervisor.adapters.gpus import Gpu, GpuReport
from infervisor.adapters.manifest import ModelFormat
from infervisor.adapters.spec import Flavor

if TYPE_CHECKING:
    from infervisor.actors.node import Node
    from infervisor.adapters.registry import ModelRegistry
    from infervisor.replay.views import InstanceView

__all__ = ["Gpu", "Inventory", "ModelInfo", "ModelList", "inventory_of", "models_of"]


class Inventory(msgspec.Struct, frozen=True, kw_only=True):
    """The node's resources (``GET /v1/node``'s ``inventory``).

    Attributes:
        cpu_count: logical CPUs of the machine.
        memory_total_bytes: physical memory, bytes.
        memory_available_bytes: memory available to new processes without
            swapping now, bytes (psutil's ``available``).
        gpus: each GPU nvidia-smi or rocm-smi reports (empty: none, or no tool
            on PATH), memory in bytes.
        gpu_errors: why a tool found on PATH gave no answer (one line each).
        adapters: the server flavors the node runs (``llamacpp``, ``mlx-lm``,
            ``ollama``: a spec's ``flavor``), from its enabled adapters.
        allowed_ports: the inclusive port ranges an instance may use
            (``[[lo, hi]]``; empty: any port).
        memory_budget_bytes: the residency ledger's budget, bytes (null: none).
        memory_reserved_bytes: what the ledger holds for instances now, bytes.
    """

    cpu_count: int
    memory_total_bytes: int
    memory_available_bytes: int
    gpus: list[Gpu]
    gpu_errors: list[str] = msgspec.field(default_factory=list)
    adapters: list[str]
    allowed_ports: list[list[int]]
    memory_budget_bytes: int | None
    memory_reserved_bytes: int


class ModelInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One model of the registry: ``format`` ``gguf``, ``mlx`` or ``ollama``;
    ``size_bytes`` the weights' size and ``digest`` their BLAKE3 (hex, of the
    file, or adapters/digest.py's MLX directory digest); both null for an
    Ollama model, whose weights Ollama keeps."""

    name: str
    format: ModelFormat
    size_bytes: int | None
    digest: str | None


class ModelList(msgspec.Struct, frozen=True, kw_only=True):
    """The node's models (``GET /v1/models``), ordered by name."""

    models: list[ModelInfo]


def inventory_of(node: Node, views: list[InstanceView], gpus: GpuReport) -> Inventory:
    """The node's inventory now; ``views`` are its instances (their reservations
    count when the node keeps no budget)."""
    settings = node.settings
    import psutil  # noqa: PLC0415 - the node's side only: a client never loads it

    memory = psutil.virtual_memory()
    ledger = node.ledger()
    reserved = ledger.in_use_bytes if ledger is not None else sum(v.reserved_bytes for v in views)
    flavors = {a.removeprefix("infer.").removesuffix(".adopted") for a in settings.adapters}
    return Inventory(
        cpu_count=psutil.cpu_count(logical=True) or 1,
        memory_total_bytes=int(memory.total),
        memory_available_bytes=int(memory.available),
        gpus=list(gpus.gpus),
        gpu_errors=list(gpus.errors),
        adapters=[f.value for f in Flavor if f.value in flavors],
        allowed_ports=[list(settings.allowed_ports)] if settings.allowed_ports else [],
        memory_budget_bytes=settings.memory_budget_bytes,
        memory_reserved_bytes=reserved,
    )


def models_of(registry: ModelRegistry) -> ModelList:
    """Every model with a readable manifest (a manifest that cannot be read is
    left out and logged; a missing registry directory lists none)."""
    import logging  # noqa: PLC0415 - the node's side only: a client's start-up never loads it

    log = logging.getLogger(__name__)
    try:
        names = registry.names()
    except RegistryError:
        log.warning("models: the registry %s cannot be listed", registry.root, exc_info=True)
        return ModelList(models=[])
    models = []
    for name in names:
        try:
            entry = registry.entry(name)
        except RegistryError as e:
            log.warning("models: %s left out: %s", name, e)
            continue
        ollama = entry.format is ModelFormat.OLLAMA
        models.append(
            ModelInfo(
                name=entry.name,
                format=entry.format,
                size_bytes=None if ollama else entry.size_bytes,
                digest=None if ollama or not entry.blake3 else entry.blake3,
            )
        )
    return ModelList(models=models)
