"""The host actor: the node. Creates and ends instance actors and routes to them.

Placement follows the reference order (``reference/infer_runtime.rs.txt``
``plan`` and ``load``): the spec is validated, the id computed, a second load
of the same instance and a second managed instance on one address are
refused, and the model is resolved in the registry, all before anything is
appended. Only then is the placement recorded and the actor started.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import msgspec
import pykka

from infervisor.adapters.errors import AdapterError, AddressTaken, AdmissionRefused, SpecError
from infervisor.adapters.planning import build_adapter, plan
from infervisor.adapters.registry import ModelRegistry
from infervisor.adapters.server import Admission, ServerAdapter
from infervisor.adapters.spec import InstanceSpec, instance_id
from infervisor.chain import ChainError, EventDraft, SqliteChain, StoredEvent
from infervisor.replay import (
    EventDecodeError,
    InstanceState,
    NodeState,
    ReplayError,
    apply_instance,
    kind_of,
)
from infervisor.replay import events as ev

from . import messages as m
from .errors import InvalidState, UnknownInstance
from .instance import InstanceActor, InstanceContext

__all__ = ["HostActor"]

log = logging.getLogger(__name__)
#: How long the host waits for an instance actor (an unload may terminate for seconds).
ASK_TIMEOUT_S = 60.0


class HostActor(pykka.ThreadingActor):
    """Owns the set of instance actors. Never asks an actor that may ask it back."""

    def __init__(
        self, ctx: InstanceContext, registry: ModelRegistry, supervisor: pykka.ActorRef[Any]
    ) -> None:
        super().__init__()
        self.ctx = ctx
        self.registry = registry
        self.supervisor = supervisor
        self._refs: dict[str, pykka.ActorRef[Any]] = {}
        self._specs: dict[str, InstanceSpec] = {}
        #: Instances the chain has whose adapter could not be rebuilt at boot: why.
        self._unbuilt: dict[str, str] = {}

    def on_receive(self, message: Any) -> Any:
        match message:
            case m.Place():
                return self._place(message)
            case m.Admit(spec=spec):
                return self._plan(spec, instance_id(spec, self.ctx.node_id))[1]
            case m.Lookup(instance_id=iid):
                return self._lookup(iid)
            case m.ListInstances():
                return dict(self._refs)
            case m.UnloadInstance(instance_id=iid, by=by):
                return self._unload(iid, by)
            case m.BootAll(state=state):
                return self._boot(state)
            case m.Revive(instance_id=iid):
                return self._revive(iid)
        raise TypeError(f"HostActor does not take {type(message).__name__}")

    def on_stop(self) -> None:
        for ref in self._refs.values():
            ref.stop(block=False)

    def _lookup(self, iid: str) -> pykka.ActorRef[Any]:
        ref = self._refs.get(iid)
        if ref is None:
            raise UnknownInstance(iid, list(self._refs))
        return ref

    def _place(self, msg: m.Place) -> str:
        spec = msg.spec
        spec.validate()
        try:
            self.ctx.settings.supervision(spec.kind, spec.restart)
        except ValueError as e:
            raise SpecError(str(e)) from e
        iid = instance_id(spec, self.ctx.node_id)
        if iid in self._unbuilt:
            raise InvalidState(
                f"{iid} is in the chain but was not rebuilt at boot ({self._unbuilt[iid]}); "
                "fix that and restart the node"
            )
        if iid in self._refs:
            return self._place_again(iid, msg)
        self._refuse_shared_address(spec)
        try:
            adapter, _ = self._plan(spec, iid)
        except AddressTaken as e:
            # The node's own condition, not the caller's mistake: recorded for the audit.
            refused = ev.AdmissionRefused(reason=str(e), spec=msgspec.to_builtins(spec))
            self._append(iid, refused, msg.source)
            raise
        event = ev.Placed(
            spec=msgspec.to_builtins(spec), placed_by=msg.placed_by, generation=msg.generation
        )
        stored = self._append(iid, event, msg.source)
        state = apply_instance(None, stored, event)
        assert state is not None
        self._adopt_actor(state, spec, adapter)
        return iid

    def _place_again(self, iid: str, msg: m.Place) -> str:
        """A placement of an instance already here: a newer generation is applied,
        an older one ignored (both recorded); the same one is refused."""
        ref = self._refs[iid]
        view: m.InstanceView = ref.ask(m.GetStatus(), block=True, timeout=ASK_TIMEOUT_S)
        if msg.generation == view.generation:
            raise InvalidState(f"{iid} is already loaded (generation {view.generation})")
        placement = m.NewPlacement(placed_by=msg.placed_by, generation=msg.generation)
        ref.ask(placement, block=True, timeout=ASK_TIMEOUT_S)
        return iid

    def _refuse_shared_address(self, spec: InstanceSpec) -> None:
        for other_id, other in self._specs.items():
            same = (other.bind_host, other.port) == (spec.bind_host, spec.port)
            if same and "managed" in (spec.mode.value, other.mode.value):
                raise AdmissionRefused(
                    f"{spec.bind_host}:{spec.port} is already used by another instance ({other_id})"
                )

    def _plan(self, spec: InstanceSpec, iid: str) -> tuple[ServerAdapter, Admission]:
        settings = self.ctx.settings
        return plan(spec, iid, self.registry, settings.adapter_settings(), settings.adapters)

    def _append(self, iid: str, event: ev.Event, source: str) -> StoredEvent:
        draft = EventDraft(
            ts_ns=self.ctx.clock.wall_ns(),
            source=source,
            kind=kind_of(event),
            subject=iid,
            payload=ev.encode_event(event),
        )
        stored: StoredEvent = self.ctx.writer.ask(m.Append(drafts=(draft,)), block=True)[0]
        return stored

    def _adopt_actor(
        self, state: InstanceState, spec: InstanceSpec, adapter: ServerAdapter
    ) -> pykka.ActorRef[Any]:
        ref = InstanceActor.start(state, adapter, self.ctx)
        self._refs[state.instance_id] = ref
        self._specs[state.instance_id] = spec
        self.supervisor.tell(m.Register(instance_id=state.instance_id, ref=ref))
        return ref

    def _unload(self, iid: str, by: str) -> None:
        ref = self._lookup(iid)
        ref.ask(m.Unload(by=by), block=True, timeout=ASK_TIMEOUT_S)
        self.supervisor.tell(m.Deregister(instance_id=iid))
        del self._refs[iid], self._specs[iid]
        ref.stop()

    def _boot(self, state: NodeState) -> list[str]:
        booted = []
        for iid, inst in state.instances.items():
            spec = msgspec.convert(inst.spec, InstanceSpec)
            try:
                adapter = build_adapter(
                    spec, iid, self.registry, self.ctx.settings.adapter_settings()
                )
            except AdapterError as e:
                log.error("%s: cannot rebuild its adapter (%s); not supervised", iid, e)  # noqa: TRY400 - the reason is the message; a traceback adds nothing
                self._unbuilt[iid] = str(e)
                continue
            self._adopt_actor(inst, spec, adapter).tell(m.Boot())
            booted.append(iid)
        return booted

    def _revive(self, iid: str) -> None:
        """Recreate a dead instance actor from the chain; its Boot re-attaches the process."""
        if iid not in self._specs:
            return  # unloaded meanwhile
        try:
            with SqliteChain.open_readonly(self.ctx.settings.chain_path) as chain:
                inst = _fold_instance(chain.events(subject=iid))
        except (ChainError, ReplayError, EventDecodeError) as e:
            log.error("%s: cannot replay it to recreate its actor: %s", iid, e)  # noqa: TRY400
            return
        if inst is None:
            return
        log.warning("%s: its actor died; recreating it from the chain", iid)
        spec = self._specs[iid]
        try:
            adapter = build_adapter(spec, iid, self.registry, self.ctx.settings.adapter_settings())
        except AdapterError as e:
            # A tell that raises would end the host, and with it the node's API.
            log.error("%s: cannot recreate it (%s); not supervised", iid, e)  # noqa: TRY400
            self._unbuilt[iid] = str(e)
            return
        self._adopt_actor(inst, spec, adapter).tell(m.Boot())


def _fold_instance(stored_events: Iterable[StoredEvent]) -> InstanceState | None:
    inst: InstanceState | None = None
    for stored in stored_events:
        event = ev.decode_event(stored)
        if isinstance(event, ev.InstanceEvent):
            inst = apply_instance(inst, stored, event)
    return inst
