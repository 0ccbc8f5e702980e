"""What a node does for residency (issue 21): starts that must make room,
demands, evictions, requests begun and ended. A base of :class:`~.node.Node`;
F's OpenAI-compatible front calls these from its own threads.

It executes the decisions of :mod:`.core.residency`: decide, append
(durable), then act.

- Any start the node is asked for goes to the instance's own actor: a
  request's demand (which never starts an instance an operator or controller
  stopped), or an operator's or controller's start or restart (which may).
  The actor decides it with the start's checks; when the memory does not fit,
  nothing is recorded there and the node plans room
  (:func:`.core.residency.plan_room`) from each instance's facts and the
  ledger, under one lock (plans are made one at a time, so two starts never
  count the same victim's bytes).
- With victims, the started instance records ``residency.demanded`` first
  (``RoomPlanned``: it is wanted running, and a boot resumes it); each
  victim's actor records ``residency.evicted`` with its stop to rest (one
  transaction) before anything of it is stopped, refusing if it turned busy
  meanwhile (then the node plans again); the node waits until the victims
  are gone and their memory released, then asks the start again, which now
  fits (``instance.starting``: the use).
- Nothing evictable for now, only because instances that would make room
  serve a request or load (the plan's ``wait_for``): a request waits for one
  of them to end, within its own deadline (it is in the front's bounded
  queue), then plans again; an instance is never evicted mid-request for it.
  A verb does not wait.
- Nothing evictable (pinned, higher priority, or still busy at the deadline):
  the instance records ``residency.refused`` with the ledger (identical
  refusals within a window are counted, not recorded), and the start raises
  ``NotResident`` (``no_room``). A refused start is no use.

A node killed mid-way decides the same after boot: a victim's stop in flight
is finished by its boot (it rests), and a start recorded as demanded but not
made is resumed by :meth:`NodeResidency.resume_demands`, room made first as
the live node would have.
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

import pykka

from infervisor.adapters.proc.errors import AdapterError
from infervisor.replay.callers import Role
from infervisor.replay.views import InstanceView, LedgerView

from . import messages as m
from .core import observations as o
from .core import residency as rule
from .errors import Cordoned, InvalidState, NodeError, NotResident
from .ledger import BudgetExceeded
from .node_boot import ASK_TIMEOUT_S
from .settings import NodeSettings

__all__ = ["DEFAULT_START_S", "NodeResidency"]

log = logging.getLogger(__name__)
#: A demand's wait for readiness when the kind sets no start-up cap, seconds.
DEFAULT_START_S = 120.0
#: How many times a demand plans room again when a victim turned busy meanwhile.
_PLANS = 4
#: The longest a demand waiting for a busy instance goes without planning again,
#: seconds (a request routed by the node wakes it at once; the server's own count
#: and a load's end are seen at the next plan).
_REPLAN_S = 0.25


class NodeResidency:
    """Demands, evictions and request counts (see the module docstring)."""

    settings: NodeSettings
    _room_lock: threading.Lock
    #: Set when a routed request ends: a demand waiting for room plans again.
    _room_changed: threading.Event

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
        answer = _started(ref, asked)
        if answer is not None and answer.done():  # serving already: one ask, the hot path
            return _ready(instance_id, answer, began, 0.0)
        if timeout_s is None:
            facts: rule.Holder = _ask(ref, m.ResidencyFacts())
            timeout_s = facts.startup_s or DEFAULT_START_S
        if answer is None:
            planned = o.RoomPlanned(request=request, model=model, by=by, verb=False)
            answer = self._make_room(instance_id, ref, asked, planned, began + timeout_s)
        return _ready(instance_id, answer, began + timeout_s, timeout_s)

    def _start_making_room(self, instance_id: str, verb: m.Start | m.Restart) -> Future[Any]:
        """An operator's or controller's start or restart (``room`` set): its answer,
        room made first when it does not fit (a verb waits for no request to end).

        Raises:
            NotResident: ``no_room`` (recorded as ``residency.refused``).
            UnknownInstance, InvalidState, AdmissionRefused, ...: the verb's refusal.
        """
        ref = self._ref(instance_id)
        answer = _started(ref, verb)
        if answer is not None:
            return answer
        view = self.status(instance_id)
        model = view.model or view.role or instance_id
        planned = o.RoomPlanned(request="verb", model=model, by=verb.by, verb=True)
        return self._make_room(instance_id, ref, verb, planned, time.monotonic())

    def request_began(self, instance_id: str) -> None:
        """A request routed to the instance began (never blocks: an actor tell).
        The first of a busy spell is recorded (``residency.busy``); an unknown
        instance is ignored (it was unloaded meanwhile)."""
        self._tell(instance_id, o.RequestBegan())

    def request_ended(self, instance_id: str) -> None:
        """A request routed to the instance ended (never blocks). The idle spell it
        may begin is recorded at the instance's next reconcile tick; a demand
        waiting for room plans again."""
        self._tell(instance_id, o.RequestEnded())
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
    def _make_room(
        self,
        iid: str,
        ref: pykka.ActorRef[Any],
        asked: Any,
        planned: o.RoomPlanned,
        deadline: float,
    ) -> Future[Any]:
        """Evict by the plan until the start ``asked`` (a demand, a start or restart
        verb) fits; its answer. ``planned`` is recorded before any eviction. Room
        that busy or loading instances hold is waited for until ``deadline``
        (``time.monotonic()``), planning again whenever a request ends.

        Raises:
            NotResident: ``no_room`` (recorded as ``residency.refused``), or
                ``stopped`` (a request's, stopped meanwhile).
        """
        with self._room_lock:
            plans = 0
            while plans < _PLANS:
                plans += 1
                self._room_changed.clear()  # a request ending from here on wakes a wait
                answer = _started(ref, asked)  # room may have been made meanwhile
                if answer is not None:
                    return answer
                ledger = self.ledger()
                if ledger is None:  # no budget: nothing to plan (cannot refuse on memory)
                    break
                holders = self._holders(ledger)
                me: rule.Holder = holders.get(iid) or _ask(ref, m.ResidencyFacts())
                releasing = [h.instance_id for h in holders.values() if h.releasing]
                if releasing:
                    self._await_released(releasing)  # memory on its way back: count it first
                    continue
                plan = rule.plan_room(
                    iid, me.needs_bytes, ledger.budget_bytes, me.priority, holders.values()
                )
                if plan.refusal is None and not plan.victims:
                    return _own_refusal(ref, asked)
                if plan.refusal is not None and plan.wait_for and self._await_room(deadline):
                    plans -= 1  # waited, not planned in vain: bounded by the deadline
                    continue
                if plan.refusal is not None:
                    self._refuse(ref, me, ledger, plan)
                if plan.victims:
                    _ask(ref, planned)  # residency.demanded, before any eviction
                if not self._evict(iid, me, ledger, plan):
                    log.info("%s: a victim turned busy while room was made; planning again", iid)
        raise NotResident(
            f"{iid}: no room could be made for it (victims kept turning busy)",
            code="no_room",
            retry_after_s=5.0,
        )

    def _await_room(self, deadline: float) -> bool:
        """Wait for a request to end (at most :data:`_REPLAN_S`); False, at once,
        once ``deadline`` (``time.monotonic()``) has passed."""
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        self._room_changed.wait(min(left, _REPLAN_S))
        return True

    def _await_released(self, iids: Sequence[str]) -> None:
        """Wait until each of ``iids`` has stopped (its grace plus 30 s at most)."""
        grace = self.settings.stop_grace_s
        for iid in iids:
            try:
                answer: Future[Any] = _ask(self._ref(iid), m.AwaitStopped())
                answer.result(timeout=grace + 30)
            except (FutureTimeout, NodeError, pykka.ActorDeadError) as e:
                log.warning("%s: its stop did not end: %s", iid, e)

    def _holders(self, ledger: LedgerView) -> dict[str, rule.Holder]:
        """Every instance's facts (asked of all at once), holding what the ledger says."""
        asked = [(ref, ref.ask(m.ResidencyFacts(), block=False)) for ref in self._refs()]
        holders: dict[str, rule.Holder] = {}
        for _, reply in asked:
            try:
                h: rule.Holder = reply.get(timeout=ASK_TIMEOUT_S)
            except pykka.ActorDeadError:
                continue
            held = ledger.reservations.get(h.instance_id, h.held_bytes)
            holders[h.instance_id] = rule.Holder(
                **{**_fields(h), "held_bytes": held},
            )
        return holders

    def _refuse(
        self, ref: pykka.ActorRef[Any], me: rule.Holder, ledger: LedgerView, plan: rule.RoomPlan
    ) -> None:
        """Record ``residency.refused`` on the demanded instance; raises NotResident."""
        held = {iid: b for iid, b in ledger.reservations.items() if iid != me.instance_id}
        refused = o.RoomRefused(
            by=Role.NODE,
            needed_bytes=me.needs_bytes,
            budget_bytes=ledger.budget_bytes,
            in_use_bytes=plan.in_use_bytes,
            held=held,
            candidates=plan.candidates,
        )
        _ask(ref, refused)  # raises the refusal: NotResident no_room
        raise NotResident(  # not reached unless the instance changed meanwhile
            f"{me.instance_id}: no room ({plan.refusal})", code="no_room", retry_after_s=5.0
        )

    def _evict(self, iid: str, me: rule.Holder, ledger: LedgerView, plan: rule.RoomPlan) -> bool:
        """Ask each victim to rest (recorded before it is stopped) and wait until all
        are gone; False when one refused (it turned busy: plan again)."""
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
            )
            try:
                answer: Future[Any] = _ask(self._ref(victim), verb)
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


def _ask(ref: pykka.ActorRef[Any], msg: Any) -> Any:
    return ref.ask(msg, block=True, timeout=ASK_TIMEOUT_S)


def _fields(h: rule.Holder) -> dict[str, Any]:
    return {f: getattr(h, f) for f in h.__struct_fields__}


def _started(ref: pykka.ActorRef[Any], asked: Any) -> Future[Any] | None:
    """Ask for the start (a demand, or a start or restart verb with ``room``); its
    answer, or None when the start does not fit (no room). The start's memory
    check runs in the decision, so a refusal is known at once.

    Raises:
        NotResident: stopped or failed (a demand's refusal); a verb's refusals.
    """
    try:
        answer = _as_future(_ask(ref, asked))
    except BudgetExceeded:  # a start verb's: answered at once, not recorded
        return None
    if answer.done() and isinstance(answer.exception(), BudgetExceeded):
        return None
    if answer.done() and answer.exception() is not None:
        answer.result()  # raises it
    return answer


def _own_refusal(ref: pykka.ActorRef[Any], asked: Any) -> Future[Any]:
    """The start asked once more, where the room planner sees room that the start
    does not find: the instance alone knows its size (an Ollama model's, read from
    its tags as it starts), so no eviction can be planned for it. Its answer if it
    fits now, else its own refusal, with its numbers.

    Raises:
        BudgetExceeded: a verb's (the API's 422 ``no_room``).
        NotResident: ``no_room``, a demand's, with the same message.
    """
    answer = _as_future(_ask(ref, asked))  # a verb's BudgetExceeded is raised here
    refusal = answer.exception() if answer.done() else None
    if isinstance(refusal, BudgetExceeded):
        raise NotResident(str(refusal), code="no_room", retry_after_s=5.0) from refusal
    return answer


def _as_future(answer: Any) -> Future[Any]:
    """A demand's answer is a future already; a start verb's is its view."""
    if isinstance(answer, Future):
        return answer
    done: Future[Any] = Future()
    done.set_result(answer)
    return done


def _ready(iid: str, answer: Future[InstanceView], deadline: float, wait_s: float) -> InstanceView:
    """The view once the instance serves.

    Raises:
        NotResident: it did not become ready in time, or will not by itself.
    """
    try:
        view = answer.result(timeout=max(0.0, deadline - time.monotonic()))
    except FutureTimeout:
        raise NotResident(
            f"{iid}: not ready within {wait_s:g} s (its start-up deadline); it goes on starting",
            code="start_timeout",
            retry_after_s=5.0,
        ) from None
    if view is None:
        raise InvalidState(f"{iid} was unloaded while it was demanded")
    if view.lifecycle == "running":
        return view
    code = "failed" if view.lifecycle == "failed" else "stopped"
    raise NotResident(
        f"{iid} is {view.lifecycle} and will not serve: {view.reason}",
        code=code,
        retry_after_s=0.0,
    )
