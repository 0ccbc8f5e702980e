"""The pure reducer: ``apply(state, event) -> state``.

Live actors and replay call the same rules (replay/instance_rules.py), so live
state and replayed state cannot disagree: `apply_instance` runs them on a copy
of the instance and freezes it, `Folder` (replay/folder.py) on records it keeps
for a whole chain. Nothing here does I/O or reads a clock: timestamps come
from the stored event.
"""

from __future__ import annotations

import msgspec

from infervisor.chain import GENESIS_KIND, StoredEvent

from . import events as ev
from .folder import BOOT_TYPES, Folder, fold
from .instance_rules import INSTANCE_TYPES, ReplayError, advance
from .node_sets import NODE_SET_TYPES, node_sets
from .reasons import reason_of
from .state import InstanceState, LeaseRecord, NodeState, freeze, thaw

__all__ = ["Folder", "ReplayError", "apply", "apply_instance", "fold", "reason_of"]


def apply(state: NodeState, stored: StoredEvent) -> NodeState:
    """Fold one stored event into the node state.

    Raises:
        ReplayError: the event is not the next in sequence, names an unknown
            instance, or makes an illegal transition.
        EventDecodeError: the payload is not a known event.
    """
    if stored.seq != state.head_seq + 1:
        raise ReplayError(f"seq {stored.seq} applied after {state.head_seq}: not the next event")
    base = msgspec.structs.replace(state, head_seq=stored.seq, head_hash=stored.hash_hex())
    if stored.kind == GENESIS_KIND:
        return base
    event = ev.decode_event(stored)
    kind = type(event)
    run = state.run.after(stored.ts_ns, boot=kind in BOOT_TYPES)
    base = msgspec.structs.replace(base, run=run)
    if kind is ev.NodeStarted:
        return msgspec.structs.replace(base, boots=state.boots + 1)
    if kind is ev.LeaseRenewed:
        assert isinstance(event, ev.LeaseRenewed)
        lease = LeaseRecord(controller=event.controller, at=event.at, down_ns=run.down_ns)
        leases = {**state.leases, event.controller: lease}
        return msgspec.structs.replace(base, lease=lease, leases=leases)
    if kind in NODE_SET_TYPES:
        cordon, sets = node_sets(state.cordon, state.placement_sets, event)
        return msgspec.structs.replace(base, cordon=cordon, placement_sets=sets)
    if kind not in INSTANCE_TYPES:
        return base
    current = state.instances.get(stored.subject)
    updated = apply_instance(current, stored, event)  # type: ignore[arg-type]
    instances = dict(state.instances)
    if updated is None:
        instances.pop(stored.subject, None)
    else:
        instances[stored.subject] = updated
    return msgspec.structs.replace(base, instances=instances)


def apply_instance(
    inst: InstanceState | None, stored: StoredEvent, event: ev.InstanceEvent
) -> InstanceState | None:
    """Fold one instance event into that instance's state (``None``: not placed / unloaded).

    A pure function: `inst` is left as it is (the rules run on a copy).

    Raises:
        ReplayError: unknown instance, a second placement, or an illegal transition.
    """
    work = None if inst is None else thaw(inst)
    updated = advance(work, event, stored.seq, stored.ts_ns, stored.kind, stored.subject)
    return None if updated is None else freeze(updated)
