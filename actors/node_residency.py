"""What a node does for residency (issue 21): starts that must make room,
demands, evictions, requests begun and ended. A base of :class:`~.node.Node`;
F's OpenAI-compatible front calls these from its own threads.

It executes the decisions of :mod:`.core.residency` and :mod:`.core.room`:
decide, append (durable), then act.

- Any start goes to the instance's own actor: a request's demand (which never
  starts an instance an operator or controller stopped), an operator's or
  controller's start or restart (which may), or a start the node decided
  itself (a restart coming due, a boot resuming: the core's ``AskRoom``,
  through actors/room_asks.py). The actor decides it with the start's checks;
  when the memory does not fit, nothing is recorded there and the node plans
  room (:func:`.core.room.plan_room`) from each instance's facts and the
  ledger, one plan at a time (two starts never count the same victim's bytes).
- With victims, a request's or verb's start records ``residency.demanded``
  first (``RoomPlanned``: wanted running, and a boot resumes it; a node's own
  start is wanted running already, and no use); each victim's actor records
  ``residency.evicted`` (with why the other starts) and its stop to rest in
  one transaction before anything of it is stopped, refusing if it turned busy
  meanwhile (then the node plans again); once the victims are gone and their
  memory released, the start is asked again and fits (``instance.starting``).
- Room that only instances serving a request or loading could make (the
  plan's ``wait_for``): a request or verb waits for one of them to end, within
  its deadline (the kind's start-up deadline), then plans again; nothing is
  evicted mid-request. A node's own start does not wait (its tick asks again).
- Nothing evictable (pinned, higher priority, or still busy at the deadline):
  the instance records ``residency.refused`` with the ledger (identical
  refusals within a window are counted, not recorded; a node's own start's
  once per cause), and the start raises ``NotResident`` (``no_room``).

A node killed mid-way decides the same after boot: a victim's stop in flight
is finished by its boot (it rests); a start recorded as demanded but not made
is resumed by :meth:`NodeResidency.resume_demands`, and a node's own start by
its boot, room made first as the live node would have.
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pykka

from infervisor.adapters.proc.errors import AdapterError
from infervisor.replay.callers import Role
from infervisor.replay.views import InstanceView, LedgerView

from . import messages as m
from .core import observations as o
from .core import residency as rule
from .errors import Cordoned, InvalidState, NodeError, NotResident
from .node_boot import ASK_TIMEOUT_S
from .settings import NodeSettings
from .start_answers import ask, own_refusal, ready, recorded, started

__all__ = ["DEFAULT_START_S", "MAX_VERB_WAITS", "NodeResidency"]

log = logging.getLogger(__name__)
#: A demand's wait for readiness when the kind sets no start-up cap, seconds.
DEFAULT_START_S = 120.0
#: How many times a demand plans room again when a victim turned busy meanwhile.
_PLANS = 4
#: The longest a demand waiting for a busy instance goes without planning again,
#: seconds (a request routed by the node wakes it at once; the server's own count
#: and a load's end are seen at the next plan).
_REPLAN_S = 0.25
#: How many verb starts may wait for busy instances at once. Each holds one of the
#: control API's worker threads (anyio's default limiter: 40) for up to its kind's
#: start-up deadline, so a bound keeps a burst of waiting starts from taking every
#: thread the API answers with; one more is refused ``queue_full`` at once.
MAX_VERB_WAITS = 8
#: What one plan tells the loop: wait for a busy instance, or plan again.
_WAIT, _AGAIN = object(), object()


@dataclass(frozen=True)
class _Start:
    """One start that makes room.

    Attributes:
        iid: the instance.
        ref: its actor.
        asked: the start (a demand, a start or restart verb, ``StartAgain``).
        planned: recorded before any eviction (``residency.demanded``); None for
            a start the node decided (wanted running already, and no use).
        cause: why it starts, recorded with each eviction.
        deadline: until when busy instances are waited for (``time.monotonic()``).
        began: when the start was asked (``time.monotonic()``).
    """

    iid: str
    ref: pykka.ActorRef[Any]
    asked: Any
    planned: o.RoomPlanned | None
    cause: str
    deadline: float
    began: float


class NodeResidency:
    """Demands, evictions and request counts (see the module docstring)."""

    settings: NodeSettings
    _room_lock: threading.Lock
    #: Set when a routed request ends: a demand waiting for room plans again.
    _room_changed: threading.Event
    #: Held by each verb start while it waits for busy instances (:data:`MAX_VERB_WAITS`).
    _verb_waits: threading.BoundedSemaphore

    if TYPE_CHECKING:  # what Node (actors/node.py) and its views give

        def ledger(self) -> LedgerView | None: ...
        def list(self) -> builtins.list[InstanceView]: ...
        def _ref(self, instance_id: str) -> pykka.ActorRef[Any]: ...
        def _refs(self) -> builtins.list[pykka.ActorRef[Any]]: ...
        def _refuse_drained_start(self, iid: str) -> None: ...
        def status(self, instance_id: str) -> InstanceView: ...

    def demand(
        self,
        instance_id: str,
        *,
        request: str,
        model: str,
        by: str,
        timeout_s: float | None = None,
    ) -> InstanceView:
        """Return once the instance is running and ready (at once when it is; waits
        when it is starting or loading). A resting instance is started
        (``residency.demanded``), evicting by the policy when the start does not
        fit. Concurrent demands of one instance coalesce into one start (its
        actor decides them one at a time). ``timeout_s`` None: the kind's
        start-up deadline (its cap), else :data:`DEFAULT_START_S`.

        Blocks the calling thread (never an actor's) up to ``timeout_s`` plus
        the victims' stop grace. Room that only instances serving a request or
        loading could make is waited for within ``timeout_s`` (nothing is
        evicted mid-request); ``no_room`` when they are still busy then.

        Raises:
            UnknownInstance, InvalidState: no such instance, or being unloaded.
            NotResident: ``no_room`` (nothing evictable: the numbers are in the
                message and in ``residency.refused``), ``stopped`` (an operator or
                controller stopped it: named; a drained node's controller
                instances too), ``failed``, ``start_timeout``.
        """
        ref = self._ref(instance_id)
        try:
            self._refuse_drained_start(instance_id)
        except Cordoned as e:  # the drain stopped it: a request does not start it
            raise NotResident(str(e), code="stopped", retry_after_s=0.0) from e
        asked = o.DemandVerb(request=request, model=model, by=by)
        began = time.monotonic()
        answer = started(ref, asked)
        if answer is not None and answer.done():  # serving already: one ask, the hot path
            return ready(instance_id, answer, began, 0.0)
        if timeout_s is None:
            facts: rule.Holder = ask(ref, m.ResidencyFacts())
            timeout_s = facts.startup_s or DEFAULT_START_S
        if answer is None:
            planned = o.RoomPlanned(request=request, model=model, by=by, verb=False)
            cause = f"request {request} by {by}"
            start = _Start(instance_id, ref, asked, planned, cause, began + timeout_s, began)
            answer = self._make_room(start)
        return ready(instance_id, answer, began + timeout_s, timeout_s)

    def _start_making_room(self, instance_id: str, verb: m.Start | m.Restart) -> Future[Any]:
        """An operator's or controller's start or restart (``room`` set): its answer,
        room made first when it does not fit. Room that only instances serving a
        request (or loading) could make is waited for, as a request waits in the
        front's queue, within the kind's start-up deadline (its cap, else
        :data:`DEFAULT_START_S`); nothing is evicted mid-request.

        Blocks the calling thread up to that deadline plus the victims' stop grace.

        Raises:
            NotResident: ``no_room`` (recorded as ``residency.refused``; the
                message names what could not go and why, what was busy
                included, and how long the start waited).
            UnknownInstance, InvalidState, AdmissionRefused, ...: the verb's refusal.
        """
        ref = self._ref(instance_id)
        began = time.monotonic()
        answer = started(ref, verb)
        if answer is not None:
            return answer
        view = self.status(instance_id)
        model = view.model or view.role or instance_id
        planned = o.RoomPlanned(request="verb", model=model, by=verb.by, verb=True)
        facts: rule.Holder = ask(ref, m.ResidencyFacts())
        deadline = began + (facts.startup_s or DEFAULT_START_S)
        cause = f"a {type(verb).__name__.lower()} by {verb.by}"
        return self._make_room(_Start(instance_id, ref, verb, planned, cause, deadline, began))

    def node_start(self, instance_id: str, by: str, cause: str) -> None:
        """A start the node decided itself (``by`` the supervisor or the boot: a
        restart coming due, a boot resuming an instance wanted running) did not
        fit: evict by the same rules as for a verb (LRU, priority, pins; nothing
        busy or loading), each eviction recording ``cause``, then decide the start
        again. No demand is recorded (the instance is wanted running already, and
        the start is no use of it); no wait for busy instances (the reconcile tick
        asks again). Nothing evictable: ``residency.refused``, once per cause.

        Runs on the room asks' thread (actors/room_asks.py), never an actor's."""
        try:
            ref = self._ref(instance_id)
            now = time.monotonic()
            self._make_room(_Start(instance_id, ref, o.StartAgain(by=by), None, cause, now, now))
        except NotResident as e:
            log.info("%s: its %s is refused: %s", instance_id, cause, e)
        except (NodeError, AdapterError, pykka.ActorDeadError, pykka.Timeout) as e:
            log.warning("%s: room for its %s was not made: %s", instance_id, cause, e)

    def request_began(self, instance_id: str, count: int = 1) -> None:
        """``count`` requests routed to the instance began (never blocks: an actor
        tell). The first of a busy spell is recorded (``residency.busy``); an
        unknown instance is ignored (it was unloaded meanwhile)."""
        self._tell(instance_id, o.RequestBegan(count=count))

    def request_ended(self, instance_id: str, count: int = 1) -> None:
        """``count`` requests routed to the instance ended (never blocks). The idle
        spell it may begin is recorded at the instance's next reconcile tick; a
        demand waiting for room plans again."""
        self._tell(instance_id, o.RequestEnded(count=count))
        self._room_changed.set()

    def resume_demands(self, pending: Sequence[str]) -> threading.Thread | None:
        """At boot: go on with demands recorded but not started (room made first),
        on a thread of their own (nobody waits for them). The thread, or None."""
        if not pending:
            return None

        def run() -> None:
            for iid in pending:
                try:
                    self.demand(iid, request="boot", model="", by=Role.BOOT)
                except (NodeError, AdapterError, pykka.ActorDeadError, pykka.Timeout) as e:
                    log.warning("%s: the demand resumed at boot is not served: %s", iid, e)

        thread = threading.Thread(target=run, name="resume-demands", daemon=True)
        thread.start()
        return thread

    # ------------------------------------------------------------------ room
    def _make_room(self, start: _Start) -> Future[Any]:
        """Evict by the plan until ``start.asked`` (a demand, a start or restart verb,
        a node's own start) fits; its answer. Room that busy or loading instances
        hold is waited for until ``start.deadline``, planning again whenever a
        request ends; plans are made one at a time, waits are not.

        Raises:
            NotResident: ``no_room`` (recorded as ``residency.refused``), or
                ``stopped`` (a request's, stopped meanwhile).
        """
        # What the start needs, read once by its actor as its start reads it (an
        # Ollama model's size from Ollama), outside the lock: an HTTP read.
        me: rule.Holder = ask(start.ref, m.ResidencyFacts(sizing=True))
        plans = 0
        while plans < _PLANS:
            plans += 1
            self._room_changed.clear()  # a request ending from here on wakes a wait
            with self._room_lock:
                step = self._plan_once(start, me)
            if isinstance(step, Future):
                return step
            if step is _WAIT:
                plans -= 1  # waited, not planned in vain: bounded by the deadline
                self._wait_for_room(start)
        raise NotResident(
            f"{start.iid}: no room could be made for it (victims kept turning busy)",
            code="no_room",
            retry_after_s=5.0,
        )

    def _plan_once(self, start: _Start, me: rule.Holder) -> Future[Any] | object:
        """One plan (under the room lock) for ``me`` (the starting instance's facts,
        its ``needs_bytes`` sized as its start reserves): the start's answer once
        it fits or the plan cannot make room for it; :data:`_WAIT` when only busy
        instances could make room and the deadline has not passed; :data:`_AGAIN`
        when it should plan again (a victim turned busy, or memory was on its way back).

        Raises:
            NotResident: ``no_room`` (recorded), or a refusal of the start.
        """
        iid, ref, asked = start.iid, start.ref, start.asked
        answer = started(ref, asked)  # room may have been made meanwhile
        if answer is not None:
            return answer
        if self.ledger() is None:  # no budget: nothing to plan (cannot refuse on memory)
            raise NotResident(f"{iid}: no room, and no memory budget to plan", code="no_room")
        ledger, holders = self._holders()
        releasing = [h.instance_id for h in holders.values() if h.releasing]
        if releasing:
            self._await_released(releasing)  # memory on its way back: count it first
            return _AGAIN
        budget = ledger.budget_bytes
        plan = rule.plan_room(iid, me.needs_bytes, budget, me.priority, holders.values())
        if plan.refusal is None and not plan.victims:
            return own_refusal(ref, recorded(asked))
        if plan.refusal is not None and plan.wait_for and time.monotonic() < start.deadline:
            return _WAIT
        if plan.refusal is not None:
            waited = time.monotonic() - start.began if plan.wait_for else 0.0
            self._refuse(ref, me, ledger, plan, waited, node=isinstance(asked, o.StartAgain))
        if plan.victims and start.planned is not None:
            ask(ref, start.planned)  # residency.demanded, before any eviction
        if not self._evict(iid, me, ledger, plan, start.cause):
            log.info("%s: a victim turned busy while room was made; planning again", iid)
        return _AGAIN

    def _wait_for_room(self, start: _Start) -> None:
        """Wait for busy instances to make room (:meth:`_await_room`); a verb's start
        waits only while fewer than :data:`MAX_VERB_WAITS` others do.

        Raises:
            NotResident: ``queue_full`` (not recorded: nothing was decided) when
                that many verb starts wait already.
        """
        if start.planned is None or not start.planned.verb:
            self._await_room(start.deadline)
            return
        if not self._verb_waits.acquire(blocking=False):
            raise NotResident(
                f"{start.iid}: {MAX_VERB_WAITS} starts already wait for busy instances to"
                " make room; try again once one of them is served",
                code="queue_full",
                retry_after_s=5.0,
            )
        try:
            self._await_room(start.deadline)
        finally:
            self._verb_waits.release()

    def _await_room(self, deadline: float) -> None:
        """Wait for a request to end (at most :data:`_REPLAN_S`, and never past
        ``deadline``, ``time.monotonic()``)."""
        left = deadline - time.monotonic()
        if left > 0:
            self._room_changed.wait(min(left, _REPLAN_S))

    def _await_released(self, iids: Sequence[str]) -> None:
        """Wait until each of ``iids`` has stopped (its grace plus 30 s at most)."""
        grace = self.settings.stop_grace_s
        for iid in iids:
            try:
                answer: Future[Any] = ask(self._ref(iid), m.AwaitStopped())
                answer.result(timeout=grace + 30)
            except (FutureTimeout, NodeError, pykka.ActorDeadError) as e:
                log.warning("%s: its stop did not end: %s", iid, e)

    def _holders(self) -> tuple[LedgerView, dict[str, rule.Holder]]:
        """The ledger and every instance's facts (asked of all at once), holding
        what the ledger says.

        The ledger is read once every actor has answered: an actor answers after
        the decisions before the ask, each of which ends with its reservation
        synced to its chain (actors/ledger.py ``Reservation.sync``). Read first,
        it could count what a decision had just released: at boot, the
        reservation the node seeded for an eviction's victim whose exit the
        boot records, and the demand resumed meanwhile evicted another for it.
        """
        asked = [(ref, ref.ask(m.ResidencyFacts(), block=False)) for ref in self._refs()]
        facts: list[rule.Holder] = []
        for _, reply in asked:
            try:
                facts.append(reply.get(timeout=ASK_TIMEOUT_S))
            except pykka.ActorDeadError:
                continue
        ledger = self.ledger()
        if ledger is None:  # the budget is fixed for the node's life: not reached
            raise NotResident("no room, and no memory budget to plan", code="no_room")
        holders = {
            h.instance_id: rule.Holder(
                **{**_fields(h), "held_bytes": ledger.reservations.get(h.instance_id, h.held_bytes)}
            )
            for h in facts
        }
        return ledger, holders

    def _refuse(
        self,
        ref: pykka.ActorRef[Any],
        me: rule.Holder,
        ledger: LedgerView,
        plan: rule.RoomPlan,
        waited_s: float,
        *,
        node: bool,
    ) -> None:
        """Record ``residency.refused`` on the demanded instance (``waited_s``: how
        long the start waited for busy instances; ``node``: a start the node
        decided, refused once per cause); raises NotResident."""
        held = {iid: b for iid, b in ledger.reservations.items() if iid != me.instance_id}
        refused = o.RoomRefused(
            by=Role.NODE,
            needed_bytes=me.needs_bytes,
            budget_bytes=ledger.budget_bytes,
            in_use_bytes=plan.in_use_bytes,
            held=held,
            candidates=plan.candidates,
            waited_s=waited_s,
            node=node,
        )
        ask(ref, refused)  # raises the refusal: NotResident no_room
        raise NotResident(  # not reached unless the instance changed meanwhile
            f"{me.instance_id}: no room ({plan.refusal})", code="no_room", retry_after_s=5.0
        )

    def _evict(
        self, iid: str, me: rule.Holder, ledger: LedgerView, plan: rule.RoomPlan, cause: str
    ) -> bool:
        """Ask each victim to rest (recorded before it is stopped, with ``cause``: why
        ``iid`` starts) and wait until all are gone; False when one refused (it
        turned busy: plan again)."""
        grace = self.settings.stop_grace_s
        waiting: builtins.list[tuple[str, Future[Any]]] = []
        refused = False
        for victim in plan.victims:
            verb = o.EvictVerb(
                by=Role.NODE,
                for_instance=iid,
                needed_bytes=me.needs_bytes,
                freed_bytes=plan.freed_bytes,
                budget_bytes=ledger.budget_bytes,
                in_use_bytes=plan.in_use_bytes,
                candidates=plan.candidates,
                grace_s=grace,
                cause=cause,
            )
            try:
                answer: Future[Any] = ask(self._ref(victim), verb)
            except (NodeError, pykka.ActorDeadError) as e:
                log.info("%s: not evicted: %s", victim, e)
                refused = True
                continue
            waiting.append((victim, answer))
        for victim, answer in waiting:
            try:
                answer.result(timeout=grace + 30)
            except InvalidState as e:
                log.info("%s: not evicted: %s", victim, e)
                refused = True
            except (FutureTimeout, NodeError, AdapterError) as e:
                log.warning("%s: its eviction's stop is not done: %s", victim, e)
                refused = True
        return not refused

    def _tell(self, instance_id: str, message: Any) -> None:
        try:
            self._ref(instance_id).tell(message)
        except (NodeError, pykka.ActorDeadError):
            return  # unloaded meanwhile: its requests no longer count


def _fields(h: rule.Holder) -> dict[str, Any]:
    return {f: getattr(h, f) for f in h.__struct_fields__}
