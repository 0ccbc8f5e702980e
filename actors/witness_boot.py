"""The boot check against the witnesses: ask each, within a bound, then decide.

Before the node resumes it makes sure a signed checkpoint covers every event
(a checkpoint lost with the machine's power while its events were kept is
signed again), then submits that checkpoint to every configured witness at
once (:func:`~.witness_submit.submit`, ``old`` = the size the chain's stored
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
from infervisor.chain.checkpoint_store import Checkpointer, read_stored

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
    Checkpointer(path, settings.node_id, signer).close()  # covers every event
    latest = read_stored(path)[-1]
    bound = settings.witness_boot_timeout_s
    pool = ThreadPoolExecutor(max_workers=len(targets), thread_name_prefix="witness-boot")
    futures = [pool.submit(_ask, t, path, (latest.tree_size, latest.note), bound) for t in targets]
    wait(futures, timeout=bound)
    pool.shutdown(wait=False, cancel_futures=True)
    answers = [WitnessAnswer(t.name, _done(f)) for t, f in zip(targets, futures, strict=True)]
    decision = decide_witness_boot(answers, latest.tree_size, accept_conflict=accept_conflict)
    for note in decision.notes:
        log.warning("%s", note)
    return decision


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
