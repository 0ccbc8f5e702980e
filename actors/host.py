"""The host actor: the node. Creates and ends instance actors and routes to them.

Placement follows the reference order (``reference/infer_runtime.rs.txt``
``plan`` and ``load``): the spec is validated, the id computed, a second load
of the same instance and a second managed instance on one address are
refused, and the model is resolved in the registry, all before anything is
appended. Only then is the placement recorded and the actor started.

The host never waits. Its thread decides and keeps the books; whatever may
take time runs elsewhere and reports back as a :class:`_Finished` message,
which the host then acts on:

- on the host's pool (:data:`WORKERS` threads): admission (``plan``: registry
  look-up, weight hashing, port checks) and the append of the placement or of
  a recorded refusal; the asks of a placement of an instance already here;
  boot's adapter rebuilds; a revive's replay of the chain;
- on a thread of its own per unload (so a server ignoring SIGTERM holds no
  pool worker): waiting for the instance actor's answer to ``Unload``, and
  when that answer is a ``concurrent.futures.Future``, chaining on it.

``Place``, ``Admit``, ``UnloadInstance`` and ``BootAll`` answer a
``concurrent.futures.Future`` at once (or raise a refusal found at once);
the Future resolves when the work is done. Routing is published in a
:class:`~.routes.Routes` whenever it changes, for the node to read without
asking. What is in flight, by instance id:

- a placement: a second placement of the same id is refused
  (``InvalidState``, nothing recorded); its address counts as used;
- an unload: the instance is no longer routed; a placement of it is refused;
  a second unload joins the first (the same Future). Once the instance
  actor's unload is done (``instance.unloaded`` durable) the host
  deregisters the actor from the supervisor, stops it and forgets it. An
  unload that fails is checked against the chain: recorded unloaded, it is
  done all the same (the failure is logged); otherwise the instance is
  routed again and the error answered.

An instance of the chain whose adapter cannot be built (at boot, or when its
dead actor is recreated: the model is gone or fails its digest check, the
launcher program is missing) never vanishes: it is routed to an ordinary
instance actor with a stand-in adapter
(:class:`~.stand_in.UnbuiltServer`) whose start check refuses with the problem
(recorded as ``instance.start_refused``, once per cause); it is registered for
ticks once a start finds the problem fixed (:class:`~.stand_in.AdapterBuilt`).

A placement answers a :class:`~.host_work.Placement` (applied, unchanged or
ignored as stale); a placement of a placed instance with another spec is
refused unless its generation is older (see ``Node.place``).

Unanswered Futures fail with ``pykka.ActorDeadError`` when the host stops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import msgspec
import pykka

from infervisor.adapters.errors import AddressTaken
from infervisor.adapters.registry import ModelRegistry
from infervisor.adapters.server import Admission, ServerAdapter
from infervisor.adapters.spec import InstanceSpec, instance_id
from infervisor.chain import ChainError
from infervisor.replay import (
    EventDecodeError,
    InstanceState,
    NodeState,
    ReplayError,
)

from . import host_work as work
from . import messages as m
from .context import InstanceContext
from .core import admission
from .errors import InvalidState, UnknownInstance
from .host_work import ASK_TIMEOUT_S, Placement, PlacementOutcome, Rebuilt
from .instance import InstanceActor
from .routes import Routes, RouteTable
from .stand_in import AdapterBuilt, UnbuiltServer

__all__ = ["ASK_TIMEOUT_S", "WORKERS", "HostActor"]

log = logging.getLogger(__name__)
#: Threads for admissions, re-placements, boot and revives (unloads have their own).
WORKERS = 4

T = TypeVar("T")


class _Finished(msgspec.Struct, frozen=True):
    """Work done off the host's thread: ``then(done)`` runs on the host's thread."""

    then: Callable[[Future[Any]], None]
    done: Future[Any]


@dataclass(frozen=True)
class _Placing:
    """A placement in flight: its spec (its address counts as used) and its answer."""

    spec: InstanceSpec
    answer: Future[Placement]


class HostActor(pykka.ThreadingActor):
    """Owns the set of instance actors. Never waits; never asks an actor that may
    ask it back (instance actors and the chain writer never ask the host)."""

    def __init__(
        self,
        ctx: InstanceContext,
        registry: ModelRegistry,
        supervisor: pykka.ActorRef[Any],
        routes: Routes | None = None,
    ) -> None:
        super().__init__()
        self.ctx = ctx
        self.registry = registry
        self.supervisor = supervisor
        self.routes = routes if routes is not None else Routes()
        self._refs: dict[str, pykka.ActorRef[Any]] = {}
        self._specs: dict[str, InstanceSpec] = {}
        #: Instances the chain has whose adapter could not be built (their actor has
        #: a :class:`~.stand_in.UnbuiltServer`): why.
        self._unbuilt: dict[str, str] = {}
        #: Whose lease each instance is under: its placement's controller ("": this node's).
        self._controllers: dict[str, str] = {}
        self._placing: dict[str, _Placing] = {}
        self._unloading: dict[str, Future[None]] = {}
        self._reviving: set[str] = set()
        self._booting = False
        #: Every Future answered to a caller and not yet resolved.
        self._answers: set[Future[Any]] = set()
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="host")

    def on_receive(self, message: Any) -> Any:
        match message:
            case _Finished(then=then, done=done):
                self._finish(then, done)
                return None
            case m.Place():
                return self._place(message)
            case m.PlaceMany(placements=placements, lead=lead, whole=whole):
                return self._place_many(placements, lead, whole=whole)
            case m.InstanceGone(instance_id=iid):
                self._gone(iid)
                return None
            case m.Admit(spec=spec):
                return self._admit(spec)
            case m.Lookup(instance_id=iid):
                return self.routes.current.lookup(iid)
            case m.ListInstances():
                return dict(self.routes.current.refs)
            case m.UnloadInstance(instance_id=iid, by=by):
                return self._unload(iid, by)
            case m.BootAll(state=state, hold=hold):
                return self._boot(state, hold)
            case m.Revive(instance_id=iid):
                self._revive(iid)
                return None
            case AdapterBuilt():
                self._adapter_built(message)
                return None
        raise TypeError(f"HostActor does not take {type(message).__name__}")

    def on_stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for answer in list(self._answers):
            work.settle(answer, error=pykka.ActorDeadError("the node stopped before answering"))
        for ref in self._refs.values():
            ref.stop(block=False)

    # ------------------------------------------------------------------ off the thread
    def _finish(self, then: Callable[[Future[Any]], None], done: Future[Any]) -> None:
        try:
            then(done)
        except Exception:
            # A tell that raises would end the host, and with it the node's API.
            log.exception("host: error acting on finished work")

    def _offload(self, fn: Callable[[], T], then: Callable[[Future[T]], None]) -> None:
        """Run ``fn`` on the pool; ``then`` gets its done Future on the host's thread."""
        self._report(self._pool.submit(fn), then)

    def _report(self, job: Future[T], then: Callable[[Future[T]], None]) -> None:
        host = self.actor_ref
        job.add_done_callback(lambda done: work.tell(host, _Finished(then=then, done=done)))

    def _answer(self) -> Future[Any]:
        answer: Future[Any] = Future()
        self._answers.add(answer)
        answer.add_done_callback(self._answers.discard)
        return answer

    def _publish(self) -> None:
        self.routes.publish(RouteTable.of(self._refs, self._unloading))

    # ------------------------------------------------------------------ placement
    def _place(self, msg: m.Place) -> Future[Placement]:
        iid, answer = self._take(msg)
        ref = self._refs.get(iid)
        if ref is not None:
            again = partial(work.place_again, ref, iid, msg, self._specs[iid])
            self._offload(again, partial(self._placed, iid, msg.placed_by))
            return answer
        record = partial(work.admit_and_record, self.ctx, self.registry, iid, msg)
        self._offload(record, partial(self._admitted, iid))
        return answer

    def _place_many(
        self, msgs: tuple[m.Place, ...], lead: tuple[Any, ...] = (), *, whole: bool = False
    ) -> list[Future[Placement] | Exception]:
        """Each placement's answer (or the refusal found at once), in order. New
        instances are admitted side by side and recorded in one transaction
        (after ``lead``'s events); placements of instances already here go their
        own way, as alone. ``whole``: all new ones, or none (see ``m.PlaceMany``)."""
        answers: list[Future[Placement] | Exception] = []
        batch: list[tuple[str, m.Place]] = []
        for msg in msgs:
            try:
                iid, answer = self._take(msg)
            except Exception as e:  # noqa: BLE001 - that placement's answer
                answers.append(e)
                continue
            answers.append(answer)
            ref = self._refs.get(iid)
            if ref is None:
                batch.append((iid, msg))
            else:
                again = partial(work.place_again, ref, iid, msg, self._specs[iid])
                self._offload(again, partial(self._placed, iid, msg.placed_by))
        if whole and any(isinstance(a, Exception) for a in answers):
            return self._release(batch, answers)
        if batch:
            record = partial(
                work.admit_many_and_record, self.ctx, self.registry, batch, lead, whole=whole
            )
            self._offload(record, partial(self._admitted_many, [iid for iid, _ in batch]))
        return answers

    def _release(
        self, batch: list[tuple[str, m.Place]], answers: list[Future[Placement] | Exception]
    ) -> list[Future[Placement] | Exception]:
        """A whole batch with a refusal found at once: nothing of it goes on."""
        for iid, _ in batch:
            refused = InvalidState(f"{iid}: not placed (the batch was refused)")
            work.settle(self._placing.pop(iid).answer, error=refused)
        return answers

    def _take(self, msg: m.Place) -> tuple[str, Future[Placement]]:
        """Check a placement and count it in flight: its instance id and answer.

        Raises:
            SpecError, InvalidState, AdmissionRefused: refused at once (nothing recorded).
        """
        spec = msg.spec
        work.check_spec(self.ctx, spec)
        iid = instance_id(spec, self.ctx.node_id)
        self._refuse_busy(iid)
        if iid not in self._refs:
            self._refuse_shared_address(spec)
        answer: Future[Placement] = self._answer()
        self._placing[iid] = _Placing(spec, answer)
        return iid, answer

    def _refuse_busy(self, iid: str) -> None:
        busy = admission.placement_busy(
            iid,
            booting=self._booting,
            unbuilt=self._unbuilt.get(iid),
            unloading=iid in self._unloading,
            placing=iid in self._placing,
        )
        if busy is not None:
            raise InvalidState(busy)

    def _refuse_shared_address(self, spec: InstanceSpec) -> None:
        placing = ((iid, p.spec) for iid, p in self._placing.items())
        taken = admission.shared_address(spec, [*self._specs.items(), *placing])
        if taken is not None:
            raise AddressTaken(taken)

    def _admitted(self, iid: str, job: Future[tuple[InstanceState, ServerAdapter]]) -> None:
        pending = self._placing.pop(iid)
        try:
            state, adapter = job.result()
        except Exception as e:  # noqa: BLE001 - the refusal is the caller's answer
            work.settle(pending.answer, error=e)
            return
        self._adopt_actor(state, pending.spec, adapter)
        self._publish()
        work.settle(pending.answer, Placement(iid, PlacementOutcome.APPLIED, state.generation))

    def _admitted_many(self, iids: list[str], job: Future[list[work.Admitted]]) -> None:
        try:
            outcomes = job.result()
        except Exception as e:  # noqa: BLE001 - the batch's error is each placement's
            outcomes = [e] * len(iids)
        settled: list[tuple[Future[Placement], Placement | Exception]] = []
        for iid, outcome in zip(iids, outcomes, strict=True):
            pending = self._placing.pop(iid)
            if isinstance(outcome, Exception):
                settled.append((pending.answer, outcome))
                continue
            state, adapter = outcome
            self._adopt_actor(state, pending.spec, adapter)
            placed = Placement(iid, PlacementOutcome.APPLIED, state.generation)
            settled.append((pending.answer, placed))
        self._publish()  # routed before any caller hears it is placed
        for answer, result in settled:
            work.resolve(answer, result)

    def _placed(self, iid: str, placed_by: str, job: Future[Placement]) -> None:
        applied = job.exception() is None and job.result().outcome is PlacementOutcome.APPLIED
        ref = self._refs.get(iid)
        if applied and ref is not None:  # the instance is under the new placer's lease now
            self._controllers[iid] = self._controller(placed_by)
            if iid not in self._unbuilt:
                self._register(iid, ref)
        work.copy(job, self._placing.pop(iid).answer)

    def _controller(self, placed_by: str) -> str:
        return "" if placed_by == self.ctx.node_id else placed_by  # "": under no lease

    def _register(self, iid: str, ref: pykka.ActorRef[Any]) -> None:
        placed_by = self._controllers.get(iid, "")
        self.supervisor.tell(m.Register(instance_id=iid, ref=ref, placed_by=placed_by))

    def _admit(self, spec: InstanceSpec) -> Future[Admission]:
        answer: Future[Admission] = self._answer()
        admit = partial(work.admission, self.ctx, self.registry, spec)
        self._offload(admit, partial(work.copy, dst=answer))
        return answer

    def _adopt_actor(
        self, state: InstanceState, spec: InstanceSpec, adapter: ServerAdapter
    ) -> pykka.ActorRef[Any]:
        ref = InstanceActor.start(state, adapter, self.ctx)
        self._refs[state.instance_id] = ref
        self._specs[state.instance_id] = spec
        self._controllers[state.instance_id] = self._controller(state.placed_by)
        self._register(state.instance_id, ref)
        return ref

    def _adopt_unbuilt(self, state: InstanceState, spec: InstanceSpec, why: str) -> None:
        """An instance whose adapter cannot be built: its actor answers, refuses to
        start (no ticks until a start builds the adapter)."""
        iid = state.instance_id
        log.error("%s: cannot build its adapter (%s); it answers, but cannot start", iid, why)
        stand_in = UnbuiltServer(
            spec, iid, why, registry=self.registry, settings=self.ctx.settings, host=self.actor_ref
        )
        self._refs[iid] = InstanceActor.start(state, stand_in, self.ctx)
        self._specs[iid] = spec
        self._controllers[iid] = self._controller(state.placed_by)
        self._unbuilt[iid] = why

    def _adapter_built(self, msg: AdapterBuilt) -> None:
        """An unbuilt instance's actor built its adapter: its ticks begin."""
        iid = msg.instance_id
        current = self._refs.get(iid)
        sender: pykka.ActorRef[Any] = msg.sender
        if current is None or current.actor_urn != sender.actor_urn or iid not in self._unbuilt:
            return  # unloaded or recreated meanwhile
        del self._unbuilt[iid]
        self._register(iid, current)

    # ------------------------------------------------------------------ unload
    def _unload(self, iid: str, by: str) -> Future[None]:
        joined = self._unloading.get(iid)
        if joined is not None:
            return joined
        if self._booting:
            raise InvalidState("the node is still rebuilding its instances from the chain")
        ref = self._refs.get(iid)
        if ref is None:
            raise UnknownInstance(iid, list(self.routes.current.refs))
        answer: Future[None] = self._answer()
        self._unloading[iid] = answer
        self._publish()  # no verb is routed to it from now on
        self._report(work.ask_unload(ref, iid, by), partial(self._unloaded, iid, ref))
        return answer

    def _unloaded(self, iid: str, ref: pykka.ActorRef[Any], outcome: Future[None]) -> None:
        error = outcome.exception()
        if error is None:
            answer = self._unloading.pop(iid)
            self._forget(iid, ref)
            self._publish()
            work.settle(answer)
            return
        # A failed unload may still have recorded the instance unloaded: the chain decides
        # (an unloaded actor must never be routed to again).
        check = partial(work.recorded_unloaded, self.ctx, iid)
        self._offload(check, partial(self._unload_failed, iid, ref, error))

    def _unload_failed(
        self, iid: str, ref: pykka.ActorRef[Any], error: BaseException, check: Future[bool]
    ) -> None:
        answer = self._unloading.pop(iid)
        unloaded = check.exception() is None and check.result()
        if unloaded:
            # Durable, so the unload is done; what failed beside it is only logged.
            log.warning("%s: unloaded (recorded), though its unload reported: %s", iid, error)
            self._forget(iid, ref)
        else:
            log.warning("%s: the unload failed, so it stays placed: %s", iid, error)
            if not ref.is_alive():
                self._revive(iid)  # a revive asked meanwhile was skipped: it was unloading
        self._publish()
        work.settle(answer, error=None if unloaded else error)

    def _gone(self, iid: str) -> None:
        """Forget an instance its own decision unloaded; an unload this host asked
        for is finished by :meth:`_unloaded` instead."""
        ref = self._refs.get(iid)
        if ref is None or iid in self._unloading:
            return
        self._forget(iid, ref)
        self._publish()

    def _forget(self, iid: str, ref: pykka.ActorRef[Any]) -> None:
        """The instance is unloaded: no more ticks, its actor ended, its id free again."""
        self.supervisor.tell(m.Deregister(instance_id=iid))
        ref.stop(block=False)
        self._refs.pop(iid, None)
        self._specs.pop(iid, None)
        self._unbuilt.pop(iid, None)
        self._controllers.pop(iid, None)

    # ------------------------------------------------------------------ boot and revive
    def _boot(self, state: NodeState, hold: frozenset[str] = frozenset()) -> Future[list[str]]:
        answer: Future[list[str]] = self._answer()
        self._booting = True
        rebuild = partial(work.rebuild_all, self.ctx, self.registry, state)
        self._offload(rebuild, partial(self._booted, answer, hold))
        return answer

    def _booted(
        self, answer: Future[list[str]], hold: frozenset[str], job: Future[list[Rebuilt]]
    ) -> None:
        self._booting = False
        try:
            rebuilt = job.result()
        except Exception as e:  # noqa: BLE001 - the node's open raises it
            work.settle(answer, error=e)
            return
        for inst, spec, adapter in rebuilt:
            if isinstance(adapter, str):
                self._adopt_unbuilt(inst, spec, adapter)
            else:
                held = inst.instance_id in hold
                self._adopt_actor(inst, spec, adapter).tell(m.Boot(held=held))
        self._publish()
        work.settle(answer, [inst.instance_id for inst, _, _ in rebuilt])

    def _revive(self, iid: str) -> None:
        """Recreate a dead instance actor from the chain; its Boot re-attaches the process."""
        spec = self._specs.get(iid)
        if spec is None or iid in self._unloading or iid in self._reviving:
            return  # unloaded (or being unloaded) meanwhile, or already being recreated
        self._reviving.add(iid)
        replay = partial(work.replay, self.ctx, self.registry, iid, spec)
        self._offload(replay, partial(self._revived, iid))

    def _revived(
        self, iid: str, job: Future[tuple[InstanceState, ServerAdapter | str] | None]
    ) -> None:
        self._reviving.discard(iid)
        try:
            replayed = job.result()
        except (ChainError, ReplayError, EventDecodeError) as e:
            log.error("%s: cannot replay it to recreate its actor: %s", iid, e)  # noqa: TRY400
            return
        current = self._refs.get(iid)
        spec = self._specs.get(iid)
        alive = current is not None and current.is_alive()
        if spec is None or iid in self._unloading or alive:
            if replayed is not None and not isinstance(replayed[1], str):
                replayed[1].close()  # unloaded meanwhile, or alive after all
            return
        if replayed is None:
            if current is not None:
                self._forget(iid, current)  # the chain says it is unloaded
                self._publish()
            return
        inst, adapter = replayed
        log.warning("%s: its actor died; recreating it from the chain", iid)
        if isinstance(adapter, str):
            self._adopt_unbuilt(inst, spec, adapter)
        else:
            self._adopt_actor(inst, spec, adapter).tell(m.Boot())
        self._publish()
