"""The boot check against the witnesses: ask each, within a bound, then decide.

When events follow the latest stored checkpoint, that checkpoint is submitted
to every witness first: a witness that cosigned more than the chain holds (a
rollback) or something it does not extend refuses the boot before the node
key signs anything over the chain (a newcomer's trial, stop 34: a refused
boot signed a checkpoint over a truncated chain). Then the node makes sure a
signed checkpoint covers every event (a checkpoint lost with the machine's
power while its events were kept is signed again), and submits that
checkpoint to every configured witness at once
(:func:`~.witness_submit.submit`, ``old`` = the size the chain's stored
cosignatures say): a 409 gives the witness's size, a consistent extension is
cosigned and stored, a size above the chain's or a 422 is a conflict. A
witness that does not answer within ``[node] witness_boot_timeout_s`` is not
waited for. What follows from the answers is the pure
:func:`~.core.witness_boot.decide_witness_boot`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

from infervisor.chain.checkpoint import load_or_create_signer
from infervisor.chain.checkpoint_store import Checkpointer, StoredCheckpoint, read_stored
from infervisor.chain.connect import connect_reader, translated

from .core.witness_boot import WitnessAnswer, WitnessBootDecision, decide_witness_boot
from .errors import WitnessConflict
from .settings import NodeSettings
from .witness_submit import Submitted, WitnessTarget, cosigned_size, submit
from .witnessing import http_client

__all__ = ["boot_check", "check_witnesses"]

log = logging.getLogger(__name__)


def boot_check(
    settings: NodeSettings, targets: Sequence[WitnessTarget], *, accept_conflict: bool
) -> WitnessBootDecision:
    """The boot check of a node with ``targets`` (none: nothing to check, resume);
    a configured ``[node] origin`` that the node key cannot have is refused first.

    Raises:
        WitnessConflict: a witness refuses the chain and ``accept_conflict`` is
            false (one line: the witness, both sizes, the flag that overrides).
        ChainError: the chain cannot be read, or a checkpoint cannot be signed;
            ``CheckpointError`` for an origin the node key cannot have.
    """
    if settings.origin is not None:  # a key under another name: one line, before anything
        load_or_create_signer(settings.data_dir, settings.node_id, origin=settings.origin)
    if not targets:
        return WitnessBootDecision(None, (), ())
    decision = check_witnesses(settings, targets, accept_conflict=accept_conflict)
    if decision.refusal is not None:
        raise WitnessConflict(decision.refusal)
    return decision


def check_witnesses(
    settings: NodeSettings, targets: Sequence[WitnessTarget], *, accept_conflict: bool
) -> WitnessBootDecision:
    """Ask every witness about this chain (at most ``witness_boot_timeout_s``) and decide.

    Blocks up to the bound (plus the time to sign a checkpoint). The decision's
    notes are logged here; its refusal and events are the caller's to act on.

    Raises:
        ChainError: the chain cannot be read, or a checkpoint cannot be signed.
    """
    path = settings.chain_path
    signer = load_or_create_signer(settings.data_dir, settings.node_id, origin=settings.origin)
    stored, size = read_stored(path), _chain_size(path)
    first: list[WitnessAnswer] | None = None
    if stored and stored[-1].tree_size < size and not accept_conflict:
        # Asked first with what the key signed already: a witness that cosigned more
        # than the chain holds (a rollback), or something it does not extend, refuses
        # it before the node key signs anything over it (a newcomer's trial, stop 34).
        first = _ask_all(settings, targets, stored[-1])
        probe = decide_witness_boot(first, size, accept_conflict=False)
        if probe.refusal is not None:
            return probe
    Checkpointer(path, settings.node_id, signer).close()  # covers every event
    latest = read_stored(path)[-1]
    answers = _ask_all(settings, targets, latest, skip=first)
    decision = decide_witness_boot(answers, latest.tree_size, accept_conflict=accept_conflict)
    for note in decision.notes:
        log.warning("%s", note)
    return decision


def _ask_all(
    settings: NodeSettings,
    targets: Sequence[WitnessTarget],
    checkpoint: StoredCheckpoint,
    *,
    skip: Sequence[WitnessAnswer] | None = None,
) -> list[WitnessAnswer]:
    """Submit ``checkpoint`` to every target at once, waiting at most
    ``witness_boot_timeout_s``; a witness that gave no answer in ``skip`` (the
    first round) is not waited for again: its answer is None."""
    path, bound = settings.chain_path, settings.witness_boot_timeout_s
    silent = {a.witness for a in skip or () if a.submitted is None}
    asked = [t for t in targets if t.name not in silent]
    pool = ThreadPoolExecutor(max_workers=max(1, len(asked)), thread_name_prefix="witness-boot")
    note = (checkpoint.tree_size, checkpoint.note)
    futures = {t.name: pool.submit(_ask, t, path, note, bound) for t in asked}
    wait(futures.values(), timeout=bound)
    pool.shutdown(wait=False, cancel_futures=True)
    return [
        WitnessAnswer(t.name, _done(futures[t.name]) if t.name in futures else None)
        for t in targets
    ]


def _chain_size(path: Path) -> int:
    """The number of events in the chain at ``path`` (its next seq).

    Raises:
        ChainIOError: the chain cannot be read.
    """
    name = str(path)
    conn = connect_reader(name)
    try:
        with translated(name, "count the events of"):
            (size,) = conn.execute("SELECT COALESCE(MAX(seq) + 1, 0) FROM events").fetchone()
    finally:
        conn.close()
    return int(size)


def _ask(target: WitnessTarget, path: Path, checkpoint: tuple[int, str], bound: float) -> Submitted:
    believed = cosigned_size(path, target.key)
    with http_client(bound) as client:
        return submit(client, target, path, checkpoint, believed)


def _done(future: Future[Submitted]) -> Submitted | None:
    if not future.done() or future.cancelled():
        return None
    try:
        return future.result()
    except Exception as e:  # noqa: BLE001 - a witness's failure is reported, never raised
        log.warning("a witness could not be asked: %s", e)
        return None
