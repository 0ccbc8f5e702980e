"""The steps of :meth:`~.node.Node.open` around the actors' start
(:func:`.node_boot.start_actors`): the chain opened, checked and replayed
before, the boot recorded and every instance booted after.

Nothing here takes a verb; the order is the node's boot order (docs/forensics.md
reads the events it records).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path

from infervisor.adapters.proc.identity import boot_id
from infervisor.chain import SqliteChain
from infervisor.chain.boot import check_node_chain
from infervisor.chain.cosignature import WitnessPolicy
from infervisor.chain.errors import NodeMismatch
from infervisor.replay import NodeState
from infervisor.replay import events as ev

from . import messages as m
from .clock import Clock
from .core.cordon import CordonDecision
from .ledger import hold
from .node_boot import (
    ASK_TIMEOUT_S,
    BootState,
    NodeActors,
    append_node_event,
    boot_state,
    end_unknown,
    stop_actors,
)
from .node_fleet import boot_cordon
from .settings import NodeSettings
from .witness_submit import WitnessTarget

__all__ = ["boot_instances", "open_chain"]


def open_chain(settings: NodeSettings, witnesses: Sequence[WitnessTarget]) -> BootState:
    """Check ``settings``, make the node's folders, open (and create) its chain,
    refuse it when tampered (from its last checkpoint, against ``witnesses``'
    keys) and rebuild the state at its head (:func:`.node_boot.boot_state`).

    Raises:
        ValueError: a setting is out of range (the field is named).
        ChainError: the chain cannot be opened, or belongs to another node;
            ``ChainTampered`` when it fails the check, naming the seq.
    """
    settings.validate()
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
    settings.registry_path.mkdir(parents=True, exist_ok=True)
    path, policy = settings.chain_path, _policy(settings, witnesses)
    existing = path.exists() and path.stat().st_size > 0
    if existing:
        # Every check before anything is written (the open below adds views), read
        # only: the owner, then the boot check, which finds changed triggers and
        # tables as every reader does (ChainTampered; a newcomer's trial, stop 34,
        # read the open's ChainFormatError, exit 2 for usage).
        with SqliteChain.open_readonly(path) as chain:
            if chain.node_id != settings.node_id:
                raise NodeMismatch(str(path), settings.node_id, chain.node_id)
        check_node_chain(path, settings.node_id, policy)
    # Open (and create) the chain here, so its errors reach the caller as raised.
    SqliteChain.open(path, settings.node_id).close()
    if not existing:
        check_node_chain(path, settings.node_id, policy)
    # Each event replayed (those after the snapshot of the state, or all without
    # one: node_boot.boot_state).
    return boot_state(path, settings.node_id)


def boot_instances(
    actors: NodeActors,
    clock: Clock,
    state: NodeState,
    overrides: Sequence[ev.Event],
    version: str,
) -> CordonDecision:
    """Record the boot (the witness check's ``overrides`` first, then
    ``node.started`` with ``version``), hold in the ledger what the chain says
    each instance holds, boot every instance of ``state`` and end the
    instances the chain does not have. The cordon's boot decision.

    The actors are stopped when any step before the last raises (then it raises).
    """
    try:
        started = ev.NodeStarted(pid=os.getpid(), boot_id=boot_id(), version=version)
        for event in (*overrides, started):  # overrides before anything else
            append_node_event(actors.writer, clock, event)
        _seed_ledger(actors, state)
        cordon = _boot_all(actors, state)
    except BaseException:
        stop_actors(actors)
        raise
    end_unknown(actors, clock, set(state.instances))
    return cordon


def _seed_ledger(actors: NodeActors, state: NodeState) -> None:
    """Hold in the ledger what the chain says each instance holds, before any
    instance decides: a demand resumed at boot must not count memory a stop in
    flight still holds as free (each actor syncs its own figure after that)."""
    if actors.ledger is None:
        return
    for iid, inst in state.instances.items():
        if inst.reserved_bytes:
            hold(actors.ledger, iid, inst.reserved_bytes)


def _boot_all(actors: NodeActors, state: NodeState) -> CordonDecision:
    """Boot every instance of ``state``, a drained node holding its controllers'
    ones (actors/core/cordon.py); the cordon's boot decision, once all are booted."""
    cordon = boot_cordon(state)
    booted: Future[list[str]] = actors.host.ask(
        m.BootAll(state=state, hold=frozenset(cordon.hold)), block=True, timeout=ASK_TIMEOUT_S
    )
    booted.result()
    return cordon


def _policy(settings: NodeSettings, witnesses: Sequence[WitnessTarget]) -> WitnessPolicy | None:
    """The config's witnesses as the boot check's trust policy (None: no witnesses)."""
    if not witnesses:
        return None
    return WitnessPolicy.of([w.key for w in witnesses], settings.witness_quorum)
