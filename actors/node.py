"""The node: the Python API a node controller uses.

``Node.open`` starts the chain writer, rebuilds the node's state from the
chain, records the boot and starts the supervisor and host actors; every
instance wanted running is resumed. Verbs go to the instance's own actor and
answer once their event is durable. The node finds that actor in the routes
the host publishes (:mod:`.routes`), without asking the host, so a host busy
with an admission or an unload never delays a verb to another instance.

A refused verb raises and leaves state as it was; the chain is left as it was
too, except for refusals the node records for the audit: a taken address (at
placement or start), a memory budget that does not fit, and a launch that
failed (recorded as an exit).

This module holds the verbs, ``open`` and ``shutdown``; the node's actors are
started and stopped in :mod:`.node_boot`, and the read views (status, list,
ledger, append health) are :class:`~.node_views.NodeViews`, its base.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib.metadata
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

import pykka

from infervisor.adapters.capabilities import Capability, probe_capabilities
from infervisor.adapters.prober import Prober
from infervisor.adapters.proc.errors import AdapterError
from infervisor.adapters.registry import ModelRegistry
from infervisor.adapters.server import Admission
from infervisor.adapters.spec import InstanceSpec
from infervisor.chain import StoredEvent
from infervisor.replay import events as ev
from infervisor.replay.callers import Role
from infervisor.replay.policy import check_duration
from infervisor.replay.views import InstanceView

from . import messages as m
from .clock import Clock, RealClock
from .core.common import demand_pending
from .errors import BadArgument, InvalidState, VerbTimeout
from .host_work import Placement, PlacementOutcome
from .node_boot import ASK_TIMEOUT_S, NodeActors, append_node_event, start_actors, stop_actors
from .node_fleet import NodeFleet
from .node_open import boot_instances, open_chain
from .node_residency import MAX_VERB_WAITS, NodeResidency
from .node_views import NodeViews
from .settings import NodeSettings
from .witness_boot import boot_check
from .witness_submit import WitnessTarget

__all__ = ["Node", "Placement", "PlacementOutcome"]

log = logging.getLogger(__name__)
VERSION = importlib.metadata.version("infervisor")
"""The installed distribution's version (pyproject.toml), recorded in node.started."""
#: How long ``place`` and ``admit`` wait for admission, seconds (a model's first
#: admission reads all of its weights to check their digest).
PLACE_WAIT_S = 300.0
#: How long ``unload`` waits beyond the stop grace, seconds (a managed server:
#: ``stop_grace_s``, then SIGKILL; Ollama: up to 30 s for the model to leave memory).
UNLOAD_WAIT_S = 60.0

T = TypeVar("T")


class Node(NodeViews, NodeFleet, NodeResidency):
    """A running node. Use :meth:`open`; end with :meth:`shutdown` (or ``with``).

    Every verb naming an instance raises ``UnknownInstance`` when there is no
    such instance, and ``InvalidState`` while it is being unloaded (from the
    moment :meth:`unload` is asked until it is answered: it is no longer routed
    to; once unloaded it is unknown, and if the unload fails it is routed again).
    """

    def __init__(self, settings: NodeSettings, clock: Clock, actors: NodeActors) -> None:
        self.settings = settings
        self.clock = clock
        self._writer = actors.writer
        self._supervisor = actors.supervisor
        self._host = actors.host
        self._ledger = actors.ledger
        self._routes = actors.routes
        self._actors = actors
        self.registry = ModelRegistry(settings.registry_path)
        self._capabilities: builtins.list[Capability] = []
        #: What the boot check against the witnesses has to tell the operator.
        self.witness_notes: builtins.list[str] = []
        self._fleet_lock = threading.Lock()
        self._room_lock = threading.Lock()
        self._room_changed = threading.Event()
        self._verb_waits = threading.BoundedSemaphore(MAX_VERB_WAITS)

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def open(
        cls,
        settings: NodeSettings,
        clock: Clock | None = None,
        on_event: Callable[[StoredEvent], None] | None = None,
        *,
        prober: Prober | None = None,
        witnesses: Sequence[WitnessTarget] = (),
        accept_witness_conflict: bool = False,
        started_before_s: float = 0.0,
    ) -> Node:
        """Start the node on ``settings.data_dir`` and resume what the chain says.

        ``on_event`` is called with every event once it is durable (on the
        chain writer's thread; keep it quick): live output for an operator.
        ``prober`` asks the servers how they are (None: over HTTP; tests give a
        :class:`~infervisor.adapters.prober_fake.ScriptedProber`); the node closes it.
        Blocks until every instance the chain has is rebuilt (a model's weights
        missing from the digest cache are read in full). An instance whose adapter
        cannot be built (its model gone or changed, its launcher program missing)
        is still listed and answers verbs: its reason is the problem (recorded as
        ``instance.start_refused``, once per cause), a start is refused naming it
        and the fix until it is fixed, then works without a node restart; stop
        and unload work while nothing of it runs (see :mod:`.stand_in`).

        ``witnesses``: checked at boot (:func:`.witness_boot.boot_check`), then
        given each checkpoint (:mod:`.witnessing`); see :attr:`witness_notes`.

        ``started_before_s``: seconds the node's process spent starting before
        this call (``infervisor run``: its age then); with the time this call
        takes to check and replay the chain, it is excused from each
        controller's lease at boot (actors/core/lease.py ``lease_at_boot``).

        Raises:
            ValueError: a setting is out of range (the field is named).
            ChainError: the chain cannot be opened, or belongs to another node;
                ``ChainTampered`` when it fails the check before resuming
                (``chain.boot``: from the last signed checkpoint), naming the seq.
            WitnessConflict: a witness refuses the chain (one line: the witness, both sizes).
        """
        clock = clock or RealClock()
        opened_s = clock.monotonic()
        booted = open_chain(settings, witnesses)
        decision = boot_check(settings, witnesses, accept_conflict=accept_witness_conflict)
        startup_s = max(0.0, started_before_s) + (clock.monotonic() - opened_s)
        actors = start_actors(
            settings, clock, on_event, booted.state.leases, prober,
            witnesses=witnesses, run=booted.state.run, startup_s=startup_s, booted=booted,
        )  # fmt: skip
        cordon = boot_instances(actors, clock, booted.state, decision.events, VERSION)
        node = cls(settings, clock, actors)
        node.witness_notes = list(decision.notes)
        node.resume_cordon(booted.state, cordon)
        pending = [i for i, inst in booted.state.instances.items() if demand_pending(inst)]
        node.resume_demands(pending)
        actors.rooms.attach(node.node_start)  # the starts the boot decided that need room
        return node

    def shutdown(self, *, stop_servers: bool = True, reason: str = "shutdown") -> None:
        """Stop managed servers gracefully (recorded; they stay wanted running for
        the next start), record the shutdown and end every actor (even when a
        failed node cannot stop or record: then it raises after)."""
        try:
            self._stop_and_record(stop_servers, reason)
        finally:
            stop_actors(self._actors)

    def _stop_and_record(self, stop_servers: bool, reason: str) -> None:
        self._actors.rooms.close()  # a shutdown evicts nothing for the node's own starts
        with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
            self._actors.supervisor.ask(m.ShuttingDown(), timeout=ASK_TIMEOUT_S)
        if stop_servers:
            futures = [
                self._ask(ref, m.Stop(by=Role.SHUTDOWN, reason=reason)) for ref in self._refs()
            ]
            for fut in futures:
                try:
                    _wait(fut, self.settings.stop_grace_s + 30)
                except (VerbTimeout, AdapterError) as e:
                    # Recorded as stopping; the shutdown itself must still complete.
                    log.error("shutdown: a server did not stop cleanly: %s", e)  # noqa: TRY400
        append_node_event(self._writer, self.clock, ev.NodeStopped(reason=reason))

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ verbs
    def place(
        self,
        spec: InstanceSpec,
        *,
        placed_by: str | None = None,
        generation: int = 0,
        source: str = "operator",
    ) -> str:
        """Admit an instance (state ``loaded``); answers its id once recorded and routed.

        As :meth:`place_outcome`, which also says what the placement did, except
        that a placement ``unchanged`` (the same generation and spec as in force)
        is refused here: ``InvalidState`` saying it is already loaded.
        """
        placed = self.place_outcome(spec, placed_by=placed_by, generation=generation, source=source)
        if placed.outcome is PlacementOutcome.UNCHANGED:
            raise InvalidState(
                f"{placed.instance_id} is already loaded (generation {placed.generation})"
            )
        return placed.instance_id

    def place_outcome(
        self,
        spec: InstanceSpec,
        *,
        placed_by: str | None = None,
        generation: int = 0,
        source: str = "operator",
    ) -> Placement:
        """Place an instance; answers what was done once it is recorded and routed.

        Admission runs off the host's thread: other verbs, and placements of
        other instances, go on meanwhile. The outcome
        (:class:`~.host_work.PlacementOutcome`) of a placement of an instance:

        - not placed: ``applied`` (``instance.placed`` recorded);
        - placed, with the same spec: ``applied`` when ``generation`` is newer
          (``instance.replaced`` recorded), ``unchanged`` when equal (nothing
          recorded), ``ignored`` when older (``instance.placement_ignored``
          recorded, nothing changes);
        - placed, with another spec (say ``ctx_size`` or ``port``): refused
          (``InvalidState`` naming the changed keys, nothing recorded) unless
          the generation is older (then ``ignored``, as any stale placement). A
          placement never replaces the spec of a placed instance: unload it
          first, then place the new spec.

        ``source`` is who asks, as :func:`~infervisor.replay.callers.source_for`
        writes it (``operator:uid=1000(alice)``, ``controller:token=fleet``).

        Raises:
            SpecError, RegistryError, AdmissionRefused, InvalidState: refused; nothing
                recorded (except a taken address, which is recorded for the audit).
                InvalidState also when a placement of the same instance is still in
                progress, the instance is being unloaded, or it cannot be started
                (its adapter cannot be built).
            Cordoned: the node is cordoned or drained and the instance is new
                (nothing recorded; actors/core/cordon.py).
            VerbTimeout: admission took longer than ``PLACE_WAIT_S``; it goes on, and
                its outcome is recorded (or not) as for any placement.
        """
        if placed_by is not None:
            self.heartbeat(placed_by)
        placer = placed_by or self.settings.node_id
        self._refuse_new_placement(spec)
        msg = m.Place(spec=spec, placed_by=placer, generation=generation, source=source)
        answer: Future[Placement] = self._host.ask(msg, block=True, timeout=ASK_TIMEOUT_S)
        return _answer(answer, PLACE_WAIT_S, "the placement")

    def place_many(
        self,
        specs: Sequence[InstanceSpec],
        *,
        placed_by: str | None = None,
        generation: int = 0,
        source: str = "operator",
    ) -> builtins.list[Placement | Exception]:
        """Place a batch: the new instances' admissions run side by side and all
        their events are appended in one transaction (one durable round trip
        for the batch, not one per instance). Answers, in the order of
        ``specs``, each placement's :class:`Placement` or the error
        :meth:`place_outcome` would have raised; one refusal does not stop the
        others. A placement of an instance already placed goes as alone.
        """
        if placed_by is not None:
            self.heartbeat(placed_by)
        placer = placed_by or self.settings.node_id
        msgs = tuple(
            m.Place(spec=spec, placed_by=placer, generation=generation, source=source)
            for spec in specs
        )
        asked: builtins.list[Future[Placement] | Exception] = self._host.ask(
            m.PlaceMany(placements=msgs), block=True, timeout=ASK_TIMEOUT_S
        )
        answers: builtins.list[Placement | Exception] = []
        for item in asked:
            if isinstance(item, Exception):
                answers.append(item)
                continue
            try:
                answers.append(_answer(item, PLACE_WAIT_S, "the placement"))
            except Exception as e:  # noqa: BLE001 - handed back as that placement's answer
                answers.append(e)
        return answers

    def admit(self, spec: InstanceSpec) -> Admission:
        """Run admission only, in the reference order: nothing is placed or recorded.

        Raises:
            SpecError, RegistryError, AdmissionRefused: what placing it would raise.
            VerbTimeout: admission took longer than ``PLACE_WAIT_S``.
        """
        answer: Future[Admission] = self._host.ask(
            m.Admit(spec=spec), block=True, timeout=ASK_TIMEOUT_S
        )
        return _answer(answer, PLACE_WAIT_S, "admission")

    def deep_health(self, instance_id: str) -> str:
        """The normal probe plus one real token (the token), within ``deep_timeout_s``.

        Raises:
            UnknownInstance, InvalidState: no such instance, or it is being unloaded.
            ProbeError: the server did not produce a token, with the reason.
            VerbTimeout: no token within ``deep_timeout_s`` (plus 5 s).
        """
        fut: Future[str] = self._ask(self._ref(instance_id), m.DeepHealth())
        try:
            return fut.result(timeout=self.settings.deep_timeout_s + 5)
        except FutureTimeout as e:
            raise VerbTimeout(
                f"{instance_id}: no token in {self.settings.deep_timeout_s:g} s"
            ) from e

    def probe_capabilities(self) -> builtins.list[Capability]:
        """Probe each enabled adapter (version commands, Ollama's version) and
        remember what passed; see :meth:`provides`. Blocks up to 30 s per program."""
        self._capabilities = probe_capabilities(
            self.settings.adapter_settings(), self.settings.adapters
        )
        return self._capabilities

    def provides(self) -> builtins.list[str]:
        """Adapter ids whose capability probe passed (empty before the first probe)."""
        return [c.adapter_id for c in self._capabilities if c.ok]

    def start(self, instance_id: str, *, by: str = "operator") -> InstanceView:
        """Start the server; an operator start resets the restart budget.

        ``by`` is the verb's source on every event it causes: a role, or
        ``role:identity`` for an authenticated caller (:mod:`infervisor.replay.callers`);
        the role decides the rules (an ``operator`` start resets the budget).
        Stop, restart and unload take ``by`` the same way.

        Whatever the instance rests as (placed on demand, evicted, expired, or
        stopped by an operator or controller), a start that does not fit the
        memory budget makes room by the residency policy (issue 21,
        :mod:`.node_residency`): idle, unpinned instances of lower or equal
        priority are evicted, least recently used first, and gone before it
        starts. Room that only instances serving a request (or loading) could
        make is waited for, within the kind's start-up deadline (nothing is
        evicted mid-request), so this may block that long. This answers once
        its start is recorded, as any start does; the start is a use of the
        instance (its last use).

        Raises:
            UnknownInstance, InvalidState: refused; nothing recorded.
            Cordoned: the node is drained and a controller placed the instance.
            AdmissionRefused: the address is taken (the refusal is recorded).
            NotResident: nothing can be evicted for it, or what could was still
                busy at the deadline (``no_room``, recorded as ``residency.refused``
                with the numbers; the message names each candidate and why not).
            SpawnError: the launcher could not run (recorded as an exit).
        """
        self._refuse_drained_start(instance_id)
        answer = self._start_making_room(instance_id, m.Start(by=by, room=True))
        return _wait(answer, ASK_TIMEOUT_S)

    def stop(
        self,
        instance_id: str,
        *,
        grace_s: float | None = None,
        wait: bool = True,
        by: str = "operator",
    ) -> InstanceView:
        """Stop the server: SIGTERM to its group, SIGKILL after ``grace_s`` seconds.

        A second stop while stopping escalates to SIGKILL at once. With ``wait``
        this returns once nothing of the group is left.

        Raises:
            UnknownInstance, InvalidState: no such instance, or it is being unloaded.
            BadArgument: ``grace_s`` is out of range.
            VerbTimeout: the stop is recorded but the group outlived the wait.
        """
        if grace_s is not None:
            try:
                check_duration("grace_s", grace_s, allow_zero=True)
            except ValueError as e:
                raise BadArgument(str(e)) from e
        fut: Future[InstanceView] = self._ask(
            self._ref(instance_id), m.Stop(by=by, grace_s=grace_s)
        )
        if not wait:
            return self.status(instance_id)
        grace = self.settings.stop_grace_s if grace_s is None else grace_s
        return _wait(fut, grace + 30)

    def restart(self, instance_id: str, *, by: str = "operator") -> InstanceView:
        """Stop (when running), then start. An instance with nothing to stop is
        started as :meth:`start` starts it (making room when it does not fit).

        Raises:
            UnknownInstance, InvalidState: refused (as :meth:`start`); or being unloaded.
            NotResident: nothing can be evicted for its start (as :meth:`start`).
            VerbTimeout: not done within the stop grace plus 60 s; still in progress.
        """
        self._refuse_drained_start(instance_id)
        answer = self._start_making_room(instance_id, m.Restart(by=by, room=True))
        return _wait(answer, self.settings.stop_grace_s + 60)

    def unload(self, instance_id: str, *, by: str = "operator") -> None:
        """Stop the server (the stop grace, ``stop_grace_s``) and forget the instance; answers once
        ``instance.unloaded`` is durable and the instance's actor is ended.

        From the moment the host takes the unload, no verb is routed to the
        instance (they raise ``InvalidState``); the host itself does not wait
        for it, so every other instance's verbs go on. A second unload while
        one is in progress waits for the same outcome.

        Raises:
            UnknownInstance: no such instance.
            InvalidState: the node is still rebuilding its instances.
            VerbTimeout: not done within ``stop_grace_s + UNLOAD_WAIT_S``; the unload goes on and
                the instance stays unrouted until it is done.
            VerbFailed, AdapterError: the unload failed (e.g. the server could not be
                ended) and the chain does not have it unloaded; the instance stays
                placed and is routed again. (Recorded unloaded, it is done whatever
                failed beside it: that is only logged.)
        """
        msg = m.UnloadInstance(instance_id=instance_id, by=by)
        answer: Future[None] = self._host.ask(msg, block=True, timeout=ASK_TIMEOUT_S)
        wait = self.settings.stop_grace_s + UNLOAD_WAIT_S
        _answer(answer, wait, f"the unload of {instance_id}")


def _wait(fut: Future[InstanceView], timeout: float) -> InstanceView:
    try:
        return fut.result(timeout=timeout)
    except FutureTimeout as e:
        raise VerbTimeout(
            f"not done after {timeout:g} s; it is recorded and still in progress"
        ) from e


def _answer(fut: Future[T], timeout: float, what: str) -> T:
    """The host's answer (its refusal raised), waiting up to ``timeout`` seconds.

    Raises:
        VerbTimeout: not answered in time; the work goes on.
    """
    try:
        return fut.result(timeout=timeout)
    except FutureTimeout as e:
        raise VerbTimeout(
            f"{what} is not answered after {timeout:g} s; it is still in progress "
            "and whatever it does is recorded"
        ) from e
