"""What a node does for a fleet: its controllers' leases (a heartbeat renews
one; the supervisor decides a lapse, actors/core/lease.py), cordon, drain and
uncordon, and a controller's whole desired set (``PUT /v1/placements``). A base
of :class:`~.node.Node`.

Both execute decisions of the core (:mod:`.core.cordon`,
:mod:`.core.placement_set`): decide, append (durable), then act. A drain's
``node.drained`` is durable before the first stop; a set's
``node.placement_set`` and its new placements are one transaction, before
any replacement, unload or start. A node killed in the middle of a drain
resumes it at boot (:meth:`NodeFleet.resume_cordon`); a set cut off in the
middle is finished by sending it again (the same generation records nothing
more and does what is left).

Cordon changes and sets are taken one at a time (a lock). A placement asked
while a cordon is being recorded may still be taken: the cordon refuses what
is asked once it is recorded.
"""

from __future__ import annotations

import builtins
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

import msgspec
import pykka

from infervisor.adapters.proc.errors import AdapterError
from infervisor.adapters.spec import InstanceSpec, instance_id, valid_token
from infervisor.replay import Desired, NodeState
from infervisor.replay.callers import Role
from infervisor.replay.cordon_reason import CordonInForce, cordon_in_force
from infervisor.replay.state import Cordon
from infervisor.replay.views import InstanceView

from . import messages as m
from .append import Entry, WriterAppend
from .clock import Clock
from .core import cordon as rule
from .core import placement_set as sets
from .errors import (
    BadArgument,
    Cordoned,
    NodeError,
    NotAController,
    SetItemRefused,
    VerbRefused,
)
from .host_work import Placement
from .node_boot import ASK_TIMEOUT_S
from .settings import NodeSettings

__all__ = ["CordonOutcome", "NodeFleet", "SetOutcome", "SetRefused", "boot_cordon"]

log = logging.getLogger(__name__)

#: Lifecycle states with something of the server up (a drain stops them).
_UP = frozenset({"starting", "running", "unhealthy", "stopping"})
#: How long a set waits for its new placements' admission, seconds.
_PLACE_WAIT_S = 300.0


class CordonOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """The cordon after a cordon verb, the instances it stopped, whether it
    recorded an event (False: the node was so already, its reason unchanged),
    and the cordon event in force after it (its reason and time; None: uncordoned)."""

    cordon: Cordon
    stopped: builtins.list[str]
    recorded: bool = False
    in_force: CordonInForce | None = None


class SetOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What a placement set did (instance ids), and the starts that were refused."""

    placed: builtins.list[str]
    replaced: builtins.list[str]
    unloaded: builtins.list[str]
    unchanged: builtins.list[str]
    started: builtins.list[str]
    start_errors: dict[str, Exception] = msgspec.field(default_factory=dict)


class SetRefused(VerbRefused):
    """A placement set refused as a whole: ``code`` (``stale_generation``,
    ``cordoned``, ``invalid_state``, ``bad_value``) and the ``field`` at fault."""

    def __init__(self, refusal: sets.SetRefusal) -> None:
        super().__init__(refusal.message)
        self.code = refusal.kind.value
        self.field = refusal.field


def boot_cordon(state: NodeState) -> rule.CordonDecision:
    """The cordon's boot decision on the rebuilt state (which instances to hold)."""
    held = [
        rule.Held(
            instance_id=iid,
            by_controller=inst.placed_by != state.node_id,
            wanted_running=inst.desired is Desired.RUNNING,
            up=inst.lifecycle.value in _UP,
        )
        for iid, inst in state.instances.items()
    ]
    return rule.decide_cordon(state.cordon, rule.BootFound(), held)


class NodeFleet:
    """Controllers' leases, cordon, drain, uncordon and placement sets (see the
    module docstring)."""

    settings: NodeSettings
    clock: Clock
    _writer: pykka.ActorRef[Any]
    _host: pykka.ActorRef[Any]
    _supervisor: pykka.ActorRef[Any]
    _cordon_now: Cordon = Cordon.NONE
    _fleet_lock: threading.Lock

    if TYPE_CHECKING:  # what Node (actors/node.py) and its views give

        def list(self) -> builtins.list[InstanceView]: ...
        def rebuild(self) -> NodeState: ...
        def status(self, instance_id: str) -> InstanceView: ...
        def start(self, instance_id: str, *, by: str = ...) -> InstanceView: ...
        def unload(self, instance_id: str, *, by: str = ...) -> None: ...
        def place_outcome(
            self,
            spec: InstanceSpec,
            *,
            placed_by: str | None = ...,
            generation: int = ...,
            source: str = ...,
        ) -> Placement: ...
        def _ref(self, instance_id: str) -> pykka.ActorRef[Any]: ...

    def heartbeat(self, controller: str) -> None:
        """Record that ``controller`` was heard from (renews that controller's lease),
        without waiting: what a verb naming a controller does.

        Raises:
            BadArgument: ``controller`` is not a plain token (a trailing newline
                included: the whole name must match).
            NotAController: ``controller`` is this node's own id.
        """
        self._check_controller(controller)
        self._supervisor.tell(m.Heard(controller=controller))

    def renew(self, controller: str) -> bool:
        """A heartbeat: renew ``controller``'s lease and answer whether it had lapsed
        before (False when the node keeps no lease). Blocks until the supervisor
        took it (at most ``ASK_TIMEOUT_S`` seconds).

        Raises:
            BadArgument, NotAController: as :meth:`heartbeat`.
            pykka.Timeout: the supervisor did not answer in time.
        """
        self._check_controller(controller)
        lapsed = self._supervisor.ask(m.Heard(controller=controller), timeout=ASK_TIMEOUT_S)
        return bool(lapsed)

    def _check_controller(self, controller: str) -> None:
        if not valid_token(controller):
            raise BadArgument(
                f"controller {controller!r} must be a plain token (letters, digits, '.', '_', "
                "'-', at most 64 characters)"
            )
        if controller == self.settings.node_id:
            raise NotAController(
                f"controller {controller!r} is this node's own id: name the controller "
                "itself (a node is not its own controller)"
            )

    @property
    def cordon(self) -> Cordon:
        """Whether the node takes placements: ``none``, ``cordoned`` or ``drained``."""
        return self._cordon_now

    # ------------------------------------------------------------------ cordon
    def cordon_verb(self, asked: rule.CordonObservation, *, by: str) -> CordonOutcome:
        """Cordon, drain or uncordon (``asked``): its event durable, then (a drain)
        every controller's instance wanted running stopped with its grace;
        answers once they are stopped.

        Raises:
            ChainError, pykka.ActorDeadError, pykka.Timeout: the event was not
                recorded: nothing changed and nothing was stopped.
        """
        with self._fleet_lock:
            node_id = self.settings.node_id
            placed = [_held(v, node_id) for v in self.list()]
            now = self._cordon_in_force()
            decision = rule.decide_cordon(self._cordon_now, asked, placed, now)
            if decision.events:
                WriterAppend(self._writer, self.clock).append(decision.events, source=by)
            self._cordon_now = decision.cordon
            if decision.events:
                now = self._cordon_in_force()
        stopped = self._stop_all(decision.stop, by)
        recorded = bool(decision.events)
        return CordonOutcome(
            cordon=decision.cordon, stopped=stopped, recorded=recorded, in_force=now
        )

    def _cordon_in_force(self) -> CordonInForce | None:
        """The chain's cordon event in force (None: the node is not cordoned), read
        under the fleet lock: every cordon event is appended under it.

        Raises:
            ChainIOError: the chain cannot be read.
        """
        if self._cordon_now is Cordon.NONE:
            return None
        return cordon_in_force(self.settings.chain_path)

    def resume_cordon(self, state: NodeState, decision: rule.CordonDecision) -> None:
        """At boot: take the chain's cordon and stop what a drain left wanted running."""
        self._cordon_now = state.cordon
        for iid in decision.stop:
            try:
                self._ref(iid).ask(
                    m.Stop(by=Role.NODE, reason="the node is drained"), timeout=ASK_TIMEOUT_S
                )
            except (NodeError, AdapterError, pykka.ActorDeadError, pykka.Timeout) as e:
                log.error("%s: the drain's stop at boot failed: %s", iid, e)  # noqa: TRY400

    def _stop_all(self, iids: Sequence[str], by: str) -> builtins.list[str]:
        """Ask every instance of ``iids`` to stop at once, then wait for each (its
        grace plus 30 s); those stopped, in order."""
        asked: builtins.list[tuple[str, Future[Any]]] = []
        for iid in iids:
            try:
                msg = m.Stop(by=by, reason="the node is drained")
                answer: Future[Any] = self._ref(iid).ask(msg, block=True, timeout=ASK_TIMEOUT_S)
                asked.append((iid, answer))
            except (NodeError, pykka.ActorDeadError) as e:
                log.warning("%s: not stopped by the drain: %s", iid, e)
        stopped: builtins.list[str] = []
        for iid, fut in asked:
            try:
                fut.result(timeout=self.settings.stop_grace_s + 30)
                stopped.append(iid)
            except (FutureTimeout, NodeError, AdapterError) as e:
                log.warning("%s: the drain's stop is not done: %s", iid, e)
        return stopped

    def _refuse_new_placement(self, spec: InstanceSpec) -> None:
        """Raise :class:`Cordoned` for a placement of a new instance on a cordoned node."""
        if self._cordon_now is Cordon.NONE:
            return
        try:
            iid = instance_id(spec, self.settings.node_id)
        except Exception:  # noqa: BLE001 - the placement itself names what is wrong
            return
        if iid not in {v.instance_id for v in self.list()}:
            why = rule.placement_refusal(self._cordon_now, self._cordon_in_force())
            raise Cordoned(why or f"the node is {self._cordon_now}")

    def _refuse_drained_start(self, iid: str) -> None:
        """Raise :class:`Cordoned` for a start of a controller's instance on a drained node."""
        if self._cordon_now is not Cordon.DRAINED:
            return
        view = self.status(iid)
        why = rule.start_refusal(self._cordon_now, iid, view.placed_by != self.settings.node_id)
        if why is not None:
            raise Cordoned(why)

    # ------------------------------------------------------------------ placement sets
    def put_placements(
        self,
        controller: str,
        generation: int,
        items: Sequence[tuple[InstanceSpec, bool]],
        *,
        source: str,
    ) -> SetOutcome:
        """Make ``items`` (spec, start) the whole set ``controller`` wants here.

        Raises:
            BadArgument: ``controller`` is not a plain token.
            SetItemRefused: an item's spec is refused (its index and the error).
            SetRefused: the set is refused (stale, cordoned, another spec, twice).
            VerbTimeout: admission took too long (it goes on; nothing else is done).
        """
        self.heartbeat(controller)
        ids = [_checked_id(n, spec, self.settings.node_id) for n, (spec, _) in enumerate(items)]
        asked = sets.Asked(
            controller=controller,
            generation=generation,
            items=tuple(
                sets.Item(instance_id=iid, spec=msgspec.to_builtins(spec), start=start)
                for iid, (spec, start) in zip(ids, items, strict=True)
            ),
        )
        with self._fleet_lock:
            state = self.rebuild()
            placed = {iid: _existing(inst) for iid, inst in state.instances.items()}
            last = state.placement_sets.get(controller)
            now = self._cordon_in_force()
            decision = sets.decide_set(asked, placed, last, self._cordon_now, now)
            if decision.refusal is not None:
                raise SetRefused(decision.refusal)
            return self._do_set(asked, [spec for spec, _ in items], decision, source)

    def _do_set(
        self, asked: sets.Asked, specs: Sequence[InstanceSpec], d: sets.SetDecision, source: str
    ) -> SetOutcome:
        ctl, gen = asked.controller, asked.generation
        self._record_set(asked, specs, d, source)
        by_id = {item.instance_id: spec for item, spec in zip(asked.items, specs, strict=True)}
        for iid in d.replace:
            self.place_outcome(by_id[iid], placed_by=ctl, generation=gen, source=source)
        for iid in d.unload:
            self.unload(iid, by=source)
        started: builtins.list[str] = []
        errors: dict[str, Exception] = {}
        for iid in d.start:
            try:
                self.start(iid, by=source)
                started.append(iid)
            except (NodeError, AdapterError) as e:
                errors[iid] = e  # the placement is recorded: it stands
        return SetOutcome(
            placed=[asked.items[n].instance_id for n in d.place],
            replaced=list(d.replace),
            unloaded=list(d.unload),
            unchanged=list(d.unchanged),
            started=started,
            start_errors=errors,
        )

    def _record_set(
        self, asked: sets.Asked, specs: Sequence[InstanceSpec], d: sets.SetDecision, source: str
    ) -> None:
        """The set's events and its new placements: one transaction, all or nothing."""
        if not d.place:
            if d.events:
                WriterAppend(self._writer, self.clock).append(d.events, source=source)
            return
        msgs = tuple(
            m.Place(
                spec=specs[n],
                placed_by=asked.controller,
                generation=asked.generation,
                source=source,
            )
            for n in d.place
        )
        lead = tuple(Entry(event, source) for event in d.events)
        answers: builtins.list[Future[Placement] | Exception] = self._host.ask(
            m.PlaceMany(placements=msgs, lead=lead, whole=True), block=True, timeout=ASK_TIMEOUT_S
        )
        for n, answer in zip(d.place, answers, strict=True):
            if isinstance(answer, Exception):  # refused at once: the others were let go for it
                raise SetItemRefused(n, answer)
        for n, answer in zip(d.place, answers, strict=True):
            if isinstance(answer, Exception):
                continue
            try:
                answer.result(timeout=_PLACE_WAIT_S)
            except FutureTimeout:
                raise
            except Exception as e:
                raise SetItemRefused(n, e) from e


def _checked_id(n: int, spec: InstanceSpec, node_id: str) -> str:
    """Item ``n``'s instance id, once its spec validates (else SetItemRefused)."""
    try:
        spec.validate()
        return instance_id(spec, node_id)
    except Exception as e:
        raise SetItemRefused(n, e) from e


def _held(view: InstanceView, node_id: str) -> rule.Held:
    return rule.Held(
        instance_id=view.instance_id,
        by_controller=view.placed_by != node_id,
        wanted_running=view.desired == Desired.RUNNING.value,
        up=view.lifecycle in _UP,
    )


def _existing(inst: Any) -> sets.Existing:
    running = inst.desired is Desired.RUNNING or inst.lifecycle.value in _UP
    return sets.Existing(
        placed_by=inst.placed_by, generation=inst.generation, spec=inst.spec, running=running
    )
