"""The adapter of an instance whose adapter cannot be built: a stand-in.

At boot (or when a dead instance actor is recreated) the host rebuilds each
instance's adapter from its recorded spec. That fails when the model is gone
from the registry or fails its digest check, or when the launcher program is
missing. Such an instance does not vanish: the host gives its ordinary
:class:`~.instance.InstanceActor` an :class:`UnbuiltServer`, and

- ``status`` answers from the sourced state, its reason being the problem;
- ``start`` and ``restart`` first try to build the adapter again (hashing the
  model's weights on the instance's own thread): once the operator has fixed
  the problem the actor takes the built adapter, tells the host
  (:class:`AdapterBuilt`: its health ticks begin), sees what became of its server
  as a boot does, and the verb goes on; no node restart is needed. Otherwise
  the start check refuses (:func:`~.core.unbuilt.refuse_start`: the problem
  and the fix, recorded once per cause);
- ``stop`` and ``unload`` are decided by the ordinary rules while nothing of it
  runs, refused while a server of it is recorded running
  (:func:`~.core.unbuilt.stop_refusal`);
- ticks and boot never reach it (the host registers it with the supervisor
  only once it is built).

:func:`record_unbuilt` records the problem found at boot the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import msgspec
import pykka

from infervisor.adapters import planning
from infervisor.adapters.probe import Health, HealthKind, ServerReport
from infervisor.adapters.proc.errors import AdapterError
from infervisor.adapters.registry import ModelRegistry
from infervisor.adapters.server import AdapterKind, ServerAdapter
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.adapters.spec import Mode as SpecMode
from infervisor.replay import InstanceState, apply_instance

from .append import ChainAppend
from .core.unbuilt import FIX_HINT, refuse_start
from .errors import InvalidState
from .settings import NodeSettings

__all__ = ["AdapterBuilt", "UnbuiltServer", "record_unbuilt"]

log = logging.getLogger(__name__)


class AdapterBuilt(msgspec.Struct, frozen=True):
    """To the host: the adapter of an unbuilt instance could be built; its actor
    (``sender``) supervises it from now on (register it for health ticks)."""

    instance_id: str
    sender: Any  # the instance actor's ref: the host acts only on what it still routes


class UnbuiltServer:
    """Stands in for the adapter of an instance whose adapter cannot be built.

    Args:
        spec: the instance's recorded spec.
        instance_id: the instance.
        problem: why its adapter cannot be built (what the operator must fix).
        registry, settings: what a rebuild builds from.
        host: the host actor, told :class:`AdapterBuilt` once a rebuild works.
    """

    plain_probe = False
    model_bytes = 0

    def __init__(
        self,
        spec: InstanceSpec,
        instance_id: str,
        problem: str,
        *,
        registry: ModelRegistry,
        settings: NodeSettings,
        host: pykka.ActorRef[Any] | None = None,
    ) -> None:
        self.spec = spec
        self.instance_id = instance_id
        self.problem = problem
        self.adopted = spec.mode is SpecMode.ADOPTED
        flavor = "ollama" if spec.flavor is Flavor.OLLAMA else "process"
        self.kind: AdapterKind = "adopted" if self.adopted else flavor  # type: ignore[assignment]
        self.adapter_id = f"infer.{spec.flavor.value}" + (".adopted" if self.adopted else "")
        self.served_model: str | None = spec.model
        self._build: Callable[[], ServerAdapter] = partial(
            planning.build_adapter, spec, instance_id, registry, settings.adapter_settings()
        )
        self._host = host

    def rebuild(self) -> ServerAdapter:
        """The instance's real adapter, built again (may hash the weights: blocking).

        Raises:
            AdapterError: still cannot be built; :attr:`problem` says why now.
        """
        try:
            return self._build()
        except AdapterError as e:
            self.problem = str(e)
            raise

    def built(self, actor: pykka.ActorRef[Any]) -> None:
        """Tell the host that ``actor`` took the rebuilt adapter."""
        log.info("%s: its adapter could be built; it is supervised again", self.instance_id)
        if self._host is not None:
            self._host.tell(AdapterBuilt(instance_id=self.instance_id, sender=actor))

    # ------------------------------------------------------------------ ServerAdapter
    def probe(self) -> ServerReport:
        """Never sent (no ticks reach it); unhealthy, naming the problem."""
        reason = f"cannot be started: {self.problem}"
        return ServerReport(health=Health(kind=HealthKind.UNHEALTHY, reason=reason))

    def deep_health(self) -> str:
        """Raises InvalidState: nothing of it runs that could answer."""
        raise InvalidState(f"{self.instance_id} cannot be started: {self.problem}; {FIX_HINT}")

    def address_taken(self) -> str | None:
        """None: a start never gets as far as the address (its check refuses first)."""
        return None

    def close(self) -> None:
        """Nothing held."""


def record_unbuilt(chain: ChainAppend, inst: InstanceState, why: str) -> InstanceState:
    """Record why the instance's adapter cannot be built, found at boot, as a refused
    start (once per cause: not again when it is the refusal last recorded); its
    state after that. A failed append is logged: the problem stays its status."""
    decision = refuse_start(inst, why, "boot")
    if not decision.events:
        return inst
    try:
        stored = chain.append(decision.events, source=decision.source, subject=inst.instance_id)
    except Exception:
        log.exception("%s: could not record why its adapter cannot be built", inst.instance_id)
        return inst
    state: InstanceState | None = inst
    for record, event in zip(stored, decision.events, strict=True):
        state = apply_instance(state, record, event)
    return inst if state is None else state
