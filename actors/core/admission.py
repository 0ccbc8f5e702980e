"""Admission, pure: which placement and which start is admitted, in what order,
and whether a model fits the node's memory budget, with which numbers.

The executors gather the facts (the host's books, a port check, the weights'
digest, the ledger's holdings) and carry out what these rules answer; the
refusal texts are written here, once. Sources: the reference's admission
order (``reference/infer_runtime.rs.txt`` ``plan`` and ``load``) and its
residency ledger (``reserve`` in ``reference/infer_lifecycle.rs.txt``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping

import msgspec

from infervisor.adapters.errors import AddressTaken, ProgramMissing
from infervisor.adapters.managed_ollama import address_conflict
from infervisor.adapters.spec import InstanceSpec
from infervisor.replay import events as ev

from . import effects as fx
from . import observations as o

__all__ = [
    "START_ORDER",
    "MemoryFit",
    "StartCheck",
    "fit_memory",
    "kind_refusal",
    "next_start_check",
    "placement_busy",
    "placement_event",
    "placement_limit_refusal",
    "shared_address",
    "spawn_limit_refusal",
    "start_checked",
    "start_memory_bytes",
]


# ---------------------------------------------------------------- a placement
def kind_refusal(kind: str, known: Iterable[str]) -> str | None:
    """Why a spec's ``kind`` is not one of this node's (its health judge would be a
    guess), or None."""
    names = sorted(set(known))
    if kind in names:
        return None
    return (
        f"kind {kind!r} is not a kind of this node: one of {', '.join(names)} "
        f"(or define it in [node.kinds.{kind}])"
    )


def placement_busy(
    iid: str, *, booting: bool, unbuilt: str | None, unloading: bool, placing: bool
) -> str | None:
    """Why the host cannot take a placement of ``iid`` now (None: it can), from its
    books: the node rebuilding, the instance unbuildable (``unbuilt``: why),
    being unloaded or already being placed. Nothing is recorded for these."""
    if booting:
        return "the node is still rebuilding its instances from the chain"
    if unbuilt is not None:
        return (
            f"{iid} is placed but cannot be started ({unbuilt}); nothing "
            "recorded: fix that and start it (then place it again), or unload it"
        )
    if unloading:
        return f"{iid} is being unloaded; place it again once that is answered"
    if placing:
        return (
            f"a placement of {iid} is already in progress; this one is refused "
            "(nothing recorded): place it again once that one is answered"
        )
    return None


def shared_address(spec: InstanceSpec, others: Iterable[tuple[str, InstanceSpec]]) -> str | None:
    """Why ``spec`` cannot use its address beside the instances ``others`` (id, spec)
    placed or being placed, or None. The one-address rule binds adapters that bind
    their port; Ollama instances share Ollama's (``managed_ollama.address_conflict``)."""
    for other_id, other in others:
        why = address_conflict(spec, other)
        if why is not None:
            return (
                f"{spec.bind_host}:{spec.port} is already used by another instance "
                f"({other_id}): {why}"
            )
    return None


def placement_limit_refusal(
    limit_bytes: int | None, enforceable: bool, mode: str, reason: str
) -> str | None:
    """Why a spec's ``memory_max_bytes`` cannot be placed on a node without a memory
    cgroup (``mode`` and ``reason``: how the node contains its servers), or None."""
    if limit_bytes is None or enforceable:
        return None
    return (
        f"memory_max_bytes {limit_bytes}: this node has no memory cgroup to "
        f"enforce it ({mode}: {reason}); place it "
        "without a limit, or on a node with cgroups (docs/process-supervision.md)"
    )


def placement_event(
    spec: InstanceSpec, placed_by: str, generation: int, refused: Exception | None
) -> ev.Event | None:
    """What a placement's admission records: ``instance.placed`` when admitted,
    ``node.admission_refused`` when refused for the node's own condition (a taken
    address, a missing program: for the audit), nothing for the caller's mistakes."""
    if refused is None:
        return ev.Placed(spec=msgspec.to_builtins(spec), placed_by=placed_by, generation=generation)
    if isinstance(refused, AddressTaken | ProgramMissing):
        return ev.AdmissionRefused(reason=str(refused), spec=msgspec.to_builtins(spec))
    return None


# ---------------------------------------------------------------- a start
class StartCheck(enum.StrEnum):
    """What is checked before a start, in :data:`START_ORDER`."""

    ADDRESS = "address"  # nothing else listens on the instance's host:port
    WEIGHTS = "weights"  # the model's files still match their manifest
    MEMORY = "memory"  # the model fits the memory budget (and is reserved)


#: The order of a start's checks; the first refusal wins and ends them.
START_ORDER = (StartCheck.ADDRESS, StartCheck.WEIGHTS, StartCheck.MEMORY)
#: A restart's pre-check, before it stops the server that holds the port.
_PRECHECK = (StartCheck.WEIGHTS,)


def next_start_check(
    check: fx.CheckStart, found: Mapping[StartCheck, str | None]
) -> StartCheck | None:
    """The next check to run, given what the checks run so far ``found`` (a refusal
    or None); None once one refused or all passed."""
    if any(refusal is not None for refusal in found.values()):
        return None
    order = _PRECHECK if check.weights_only else START_ORDER
    return next((c for c in order if c not in found), None)


def start_checked(
    check: fx.CheckStart, found: Mapping[StartCheck, str | None], reserved_bytes: int = 0
) -> o.StartChecked:
    """The observation the checks make (``reserved_bytes``: what the ledger set aside)."""
    return o.StartChecked(
        by=check.by,
        reset_budget=check.reset_budget,
        attempt=check.attempt,
        verb=check.verb,
        taken=found.get(StartCheck.ADDRESS),
        model_refusal=found.get(StartCheck.WEIGHTS),
        memory_refusal=found.get(StartCheck.MEMORY),
        reserved_bytes=reserved_bytes,
        precheck=check.weights_only,
        demand=check.demand,
        request=check.request,
        model=check.model,
        planned=check.planned,
    )


def start_memory_bytes(model_bytes: int, reported_bytes: int | None) -> int:
    """A model's size for the budget: what its server reports (Ollama's
    ``/api/tags``), else the registry's (bytes)."""
    return reported_bytes or model_bytes


def spawn_limit_refusal(limit_bytes: int | None, program: str, enforceable: bool) -> str | None:
    """Why a server with ``memory_max_bytes`` must not be launched without a memory
    cgroup to enforce it (the cgroup's memory controller gone since placement)."""
    if limit_bytes is None or enforceable:
        return None
    why = f"no memory cgroup to enforce memory_max_bytes {limit_bytes} on this node"
    return f"cannot start {program}: {why}"


# ---------------------------------------------------------------- memory
class MemoryFit(msgspec.Struct, frozen=True, kw_only=True):
    """Whether a reservation fits: the bytes it holds then, or why not.

    Attributes:
        held_bytes: what the instance holds once admitted (model plus overhead,
            or what it held already); 0 when refused.
        refusal: the budget, in use and needed, in bytes; None when it fits.
    """

    held_bytes: int = 0
    refusal: str | None = None


def fit_memory(
    budget_bytes: int,
    overhead_bytes: int,
    held: Mapping[str, int],
    iid: str,
    model_bytes: int,
) -> MemoryFit:
    """Whether ``iid``'s model (``model_bytes`` plus ``overhead_bytes``) fits
    ``budget_bytes`` beside what the instances hold (``held``: id to bytes). An
    instance that holds memory already keeps it (a retried start)."""
    if iid in held:
        return MemoryFit(held_bytes=held[iid])
    needed = model_bytes + overhead_bytes
    in_use = sum(held.values())
    if in_use + needed > budget_bytes:
        return MemoryFit(
            refusal=f"memory budget {budget_bytes} bytes, {in_use} in use, {needed} needed "
            f"({model_bytes} model + {overhead_bytes} overhead): does not fit"
        )
    return MemoryFit(held_bytes=needed)
