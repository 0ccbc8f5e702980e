"""What the host's workers do, off the host's thread: admission and the
append of a placement, re-placement asks, boot's adapter rebuilds, a
revive's replay of the chain, and waiting for an instance actor's unload.
Each returns (or raises) into a Future the host acts on when it is done."""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

import msgspec
import pykka

from infervisor.adapters import planning
from infervisor.adapters.errors import AdmissionRefused, SpecError
from infervisor.adapters.proc.errors import AdapterError
from infervisor.adapters.registry import ModelRegistry
from infervisor.adapters.server import Admission, ServerAdapter
from infervisor.adapters.spec import InstanceSpec, instance_id
from infervisor.chain import SqliteChain, StoredEvent
from infervisor.replay import InstanceState, NodeState, apply_instance
from infervisor.replay import events as ev
from infervisor.replay.views import InstanceView

from . import messages as m
from .append import Entry
from .context import InstanceContext
from .core import admission as admission_rules
from .errors import InvalidState
from .kinds import DEFAULT_KINDS, RestartOverrideError
from .stand_in import record_unbuilt

__all__ = [
    "ASK_TIMEOUT_S",
    "Placement",
    "PlacementOutcome",
    "Rebuilt",
    "admission",
    "admit_and_record",
    "admit_many_and_record",
    "append",
    "ask_unload",
    "changed_keys",
    "copy",
    "place_again",
    "rebuild_all",
    "recorded_unloaded",
    "replay",
    "settle",
    "tell",
]

log = logging.getLogger(__name__)
#: The longest the host's helpers wait for one answer of another actor (seconds).
ASK_TIMEOUT_S = 60.0
#: What boot rebuilds per instance: its state, spec and adapter, or why not.
Rebuilt = tuple[InstanceState, InstanceSpec, ServerAdapter | str]


# ---------------------------------------------------------------------- on the pool
def admit_and_record(
    ctx: InstanceContext, registry: ModelRegistry, iid: str, msg: m.Place
) -> tuple[InstanceState, ServerAdapter]:
    """Admission, then the placement appended (durable): the new instance's state."""
    spec = msg.spec
    try:
        adapter, _ = _plan(ctx, registry, spec, iid)
    except Exception as e:
        refused = admission_rules.placement_event(spec, msg.placed_by, msg.generation, e)
        if refused is not None:
            append(ctx, iid, refused, msg.source)
        raise
    event = admission_rules.placement_event(spec, msg.placed_by, msg.generation, None)
    assert isinstance(event, ev.Placed)
    try:
        stored = append(ctx, iid, event, msg.source)
    except BaseException:
        adapter.close()
        raise
    state = apply_instance(None, stored, event)
    assert state is not None
    return state, adapter


#: At most this many admissions of one batch run at once (each may probe a server).
BATCH_ADMISSIONS = 16
#: One placement of a batch: the new instance's state and adapter, or why not.
Admitted = tuple[InstanceState, ServerAdapter] | Exception


def admit_many_and_record(
    ctx: InstanceContext,
    registry: ModelRegistry,
    batch: list[tuple[str, m.Place]],
    lead: Sequence[Entry] = (),
    *,
    whole: bool = False,
) -> list[Admitted]:
    """Admission of every placement of ``batch`` side by side, then all their events
    (``instance.placed``, or ``node.admission_refused`` for the node's own
    conditions) appended in ONE transaction: one durable round trip for the
    batch. Answers, in order, each placement's state and adapter or its error.
    When the append fails, every placement of the batch fails with its error
    and nothing of it is stored (the writer's transaction is all or nothing).
    ``lead``: events recorded first in the same transaction. ``whole``: one
    placement refused refuses the batch: nothing is recorded (not even the
    node's own refusals) and the others fail as not placed.
    """

    def plan(item: tuple[str, m.Place]) -> ServerAdapter | Exception:
        iid, msg = item
        try:
            return _plan(ctx, registry, msg.spec, iid)[0]
        except Exception as e:  # noqa: BLE001 - that placement's answer
            return e

    with ThreadPoolExecutor(min(BATCH_ADMISSIONS, len(batch)), "admit") as pool:
        plans = list(pool.map(plan, batch))
    if whole and any(isinstance(p, Exception) for p in plans):
        return _refuse_whole(batch, plans)
    entries: list[Entry] = list(lead)
    events: list[ev.Event | None] = []
    for (iid, msg), planned in zip(batch, plans, strict=True):
        refused = planned if isinstance(planned, Exception) else None
        event = admission_rules.placement_event(msg.spec, msg.placed_by, msg.generation, refused)
        events.append(event)
        if event is not None:
            entries.append(Entry(event, msg.source, iid))
    try:
        stored = ctx.chain.append_batch(entries)
    except Exception as e:  # noqa: BLE001 - nothing of the batch is stored: all fail with it
        for planned in plans:
            if not isinstance(planned, Exception):
                planned.close()
        return [e] * len(batch)
    return _outcomes(plans, events, iter(stored[len(lead) :]))


def _refuse_whole(
    batch: list[tuple[str, m.Place]], plans: list[ServerAdapter | Exception]
) -> list[Admitted]:
    """A whole batch with a refused admission: every adapter closed, nothing recorded."""
    outcomes: list[Admitted] = []
    for (iid, _), planned in zip(batch, plans, strict=True):
        if isinstance(planned, Exception):
            outcomes.append(planned)
            continue
        planned.close()
        outcomes.append(
            InvalidState(f"{iid}: not placed (another placement of the set was refused)")
        )
    return outcomes


def _outcomes(
    plans: list[ServerAdapter | Exception],
    events: list[ev.Event | None],
    stored: Iterator[StoredEvent],
) -> list[Admitted]:
    outcomes: list[Admitted] = []
    for planned, event in zip(plans, events, strict=True):
        row = next(stored) if event is not None else None
        if isinstance(planned, Exception):
            outcomes.append(planned)
            continue
        assert row is not None
        assert isinstance(event, ev.Placed)
        state = apply_instance(None, row, event)
        assert state is not None
        outcomes.append((state, planned))
    return outcomes


def check_spec(ctx: InstanceContext, spec: InstanceSpec) -> None:
    """Refuse a spec the node cannot place, before anything is recorded.

    Raises:
        SpecError: a field is invalid, the kind is not one this node runs, or its
            restart policy is out of the node's ranges (``field`` names which).
    """
    spec.validate()
    unknown = admission_rules.kind_refusal(spec.kind, {*DEFAULT_KINDS, *ctx.settings.kinds})
    if unknown is not None:  # the judge of an unknown kind would be "process"
        raise SpecError(unknown, field="kind")
    try:
        ctx.settings.supervision(spec.kind, spec.restart)
    except RestartOverrideError as e:  # the key at fault: spec.restart.base_s
        raise SpecError(str(e), field=f"restart.{e.key}" if e.key else "restart") from e
    except ValueError as e:
        why = str(e) if str(e).startswith("restart") else f"restart: {e}"
        raise SpecError(why, field="restart") from e


def admission(ctx: InstanceContext, registry: ModelRegistry, spec: InstanceSpec) -> Admission:
    adapter, admission = _plan(ctx, registry, spec, instance_id(spec, ctx.node_id))
    adapter.close()
    return admission


def _plan(
    ctx: InstanceContext, registry: ModelRegistry, spec: InstanceSpec, iid: str
) -> tuple[ServerAdapter, Admission]:
    settings = ctx.settings
    containment = ctx.containment
    refusal = admission_rules.placement_limit_refusal(
        spec.memory_max_bytes, containment.memory is not None, containment.mode, containment.reason
    )
    if refusal is not None:
        raise AdmissionRefused(refusal)
    adapters = settings.adapter_settings()
    return planning.plan(spec, iid, registry, adapters, settings.adapters, prober=ctx.engine)


class PlacementOutcome(enum.StrEnum):
    """What a placement did: ``applied`` (recorded: a new instance, or a newer
    generation of one placed), ``unchanged`` (the same generation and spec as in
    force: nothing recorded) or ``ignored`` (an older generation: recorded as
    ignored, nothing changes)."""

    APPLIED = "applied"
    UNCHANGED = "unchanged"
    IGNORED = "ignored"


class Placement(msgspec.Struct, frozen=True):
    """The answer to a placement: the instance, what was done, the generation in force."""

    instance_id: str
    outcome: PlacementOutcome
    generation: int


def changed_keys(old: InstanceSpec, new: InstanceSpec) -> list[str]:
    """The spec fields whose values differ, sorted."""
    a, b = msgspec.to_builtins(old), msgspec.to_builtins(new)
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def place_again(ref: pykka.ActorRef[Any], iid: str, msg: m.Place, old: InstanceSpec) -> Placement:
    """A placement of an instance already here: a newer generation is applied, an older
    one ignored (both recorded by the instance actor); the same one with the same spec
    is unchanged (nothing recorded).

    Raises:
        InvalidState: the spec differs from the one in force and the generation is not
            older: a placement never replaces a spec (unload the instance first).
    """
    view: InstanceView = ref.ask(m.GetStatus(), block=True, timeout=ASK_TIMEOUT_S)
    changed = changed_keys(old, msg.spec)
    if changed and msg.generation >= view.generation:
        raise InvalidState(
            f"{iid} is placed (generation {view.generation}) with another spec: "
            f"{', '.join(changed)} differ; a placement does not replace the spec of a placed "
            "instance (nothing recorded): unload it first, then place the new spec"
        )
    if msg.generation == view.generation:
        return Placement(iid, PlacementOutcome.UNCHANGED, view.generation)
    placement = m.NewPlacement(placed_by=msg.placed_by, generation=msg.generation, by=msg.source)
    applied = ref.ask(placement, block=True, timeout=ASK_TIMEOUT_S)
    if applied:
        return Placement(iid, PlacementOutcome.APPLIED, msg.generation)
    return Placement(iid, PlacementOutcome.IGNORED, view.generation)


def append(ctx: InstanceContext, iid: str, event: ev.Event, source: str) -> StoredEvent:
    return ctx.chain.append([event], source=source, subject=iid)[0]


def rebuild_all(ctx: InstanceContext, registry: ModelRegistry, state: NodeState) -> list[Rebuilt]:
    """Each instance of the rebuilt state with its adapter (or why it has none), in order."""
    rebuilt: list[Rebuilt] = []
    for iid, inst in state.instances.items():
        spec = msgspec.convert(inst.spec, InstanceSpec)
        try:
            adapter: ServerAdapter | str = planning.build_adapter(
                spec, iid, registry, ctx.settings.adapter_settings()
            )
        except AdapterError as e:
            adapter = str(e)
        if isinstance(adapter, str):
            rebuilt.append((record_unbuilt(ctx.chain, inst, adapter), spec, adapter))
        else:
            rebuilt.append((inst, spec, adapter))
    return rebuilt


def replay(
    ctx: InstanceContext, registry: ModelRegistry, iid: str, spec: InstanceSpec
) -> tuple[InstanceState, ServerAdapter | str] | None:
    """The instance replayed from the chain and a new adapter (or why it cannot be
    built, recorded as for boot); None when the chain has it unloaded.

    Raises:
        ChainError, ReplayError, EventDecodeError: the chain cannot be replayed.
    """
    inst = _replay_one(ctx, iid)
    if inst is None:
        return None
    try:
        return inst, planning.build_adapter(spec, iid, registry, ctx.settings.adapter_settings())
    except AdapterError as e:
        return record_unbuilt(ctx.chain, inst, str(e)), str(e)


def recorded_unloaded(ctx: InstanceContext, iid: str) -> bool:
    """True when the chain has the instance unloaded (or never placed)."""
    return _replay_one(ctx, iid) is None


def _replay_one(ctx: InstanceContext, iid: str) -> InstanceState | None:
    with SqliteChain.open_readonly(ctx.settings.chain_path) as chain:
        return _fold_instance(chain.events(subject=iid))


def _fold_instance(stored_events: Iterable[StoredEvent]) -> InstanceState | None:
    inst: InstanceState | None = None
    for stored in stored_events:
        event = ev.decode_event(stored)
        if isinstance(event, ev.InstanceEvent):
            inst = apply_instance(inst, stored, event)
    return inst


# ---------------------------------------------------------------------- unload waiting
def ask_unload(ref: pykka.ActorRef[Any], iid: str, by: str) -> Future[None]:
    """Ask the instance actor to unload without waiting; the Future resolves once it has.

    The actor answers when it is done (None), or at once with a Future that
    resolves once ``instance.unloaded`` is durable: either is waited for on a
    thread of this unload's own, never on the host's.
    """
    outcome: Future[None] = Future()
    reply = ref.ask(m.Unload(by=by), block=False)

    def wait() -> None:
        try:
            answer = _reply_of(reply, ref, iid)
        except Exception as e:  # noqa: BLE001 - the unload's outcome
            settle(outcome, error=e)
            return
        if isinstance(answer, Future):
            answer.add_done_callback(partial(copy, dst=outcome))
        else:
            settle(outcome, None)

    threading.Thread(target=wait, name=f"unload-{iid}", daemon=True).start()
    return outcome


def _reply_of(reply: pykka.Future[Any], ref: pykka.ActorRef[Any], iid: str) -> Any:
    """The actor's reply, asked again every ASK_TIMEOUT_S while the actor lives: an
    unload that outlasts one wait stays in progress (and not routed), never abandoned."""
    while True:
        try:
            return reply.get(timeout=ASK_TIMEOUT_S)
        except pykka.Timeout:
            if not ref.is_alive():
                raise pykka.ActorDeadError(f"{iid}: its actor ended during the unload") from None
            log.warning("%s: still unloading after another %g s", iid, ASK_TIMEOUT_S)


# ---------------------------------------------------------------------- futures
def tell(ref: pykka.ActorRef[Any], message: Any) -> None:
    """Tell, ignoring an actor that has already stopped (work finishing after shutdown)."""
    with contextlib.suppress(pykka.ActorDeadError):
        ref.tell(message)


def settle(fut: Future[Any], result: Any = None, error: BaseException | None = None) -> None:
    """Resolve ``fut`` unless it already is (a stop may have failed it first)."""
    if fut.done():
        return
    with contextlib.suppress(Exception):  # InvalidStateError: resolved meanwhile
        if error is None:
            fut.set_result(result)
        else:
            fut.set_exception(error)


def resolve(fut: Future[Any], outcome: Any) -> None:
    """Settle ``fut`` with ``outcome``: its exception when it is one, else its result."""
    if isinstance(outcome, BaseException):
        settle(fut, error=outcome)
    else:
        settle(fut, outcome)


def copy(src: Future[Any], dst: Future[Any]) -> None:
    """Give ``dst`` the outcome of the done ``src``."""
    if src.cancelled():
        settle(dst, error=pykka.ActorDeadError("the node stopped before answering"))
        return
    error = src.exception()
    settle(dst, None if error is not None else src.result(), error)
