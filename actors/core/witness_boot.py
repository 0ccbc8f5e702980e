"""The boot check against the witnesses: ``decide_witness_boot(answers, chain_size, accept)``.

Pure: given what each configured witness answered when the node submitted
its latest checkpoint at boot (:mod:`infervisor.actors.witness_boot` asks
them), the chain's size and whether the operator gave the override flag, it
answers whether the node refuses to resume, the events to append first
(``node.witness_override``, before anything else), and the lines to tell the
operator. Source: issue 18 item 2; c2sp.org/tlog-witness (a 409 gives the
witness's size; a 422 refuses the consistency proof from it).

- cosigned the latest checkpoint: resume;
- its size (409) above the chain's: refuse, a rollback (an older backup
  restored, events cut);
- 422 to the proof from its size: refuse, the chain is not an extension of
  what it cosigned (a rewrite or fork);
- nothing within the bound, or 5xx: resume, saying the chain is unanchored
  at that witness;
- another refusal (400, 403, 404, a bad cosignature): resume, saying so (a
  configuration problem, not evidence).

With the override flag every refusal becomes a ``node.witness_override``
event (one per witness refusing) and the node resumes.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple

from infervisor.replay import events as ev

__all__ = [
    "OVERRIDE_FLAG",
    "Outcome",
    "Submitted",
    "WitnessAnswer",
    "WitnessBootDecision",
    "decide_witness_boot",
]


class Outcome(enum.Enum):
    """What a submission ended with."""

    COSIGNED = "cosigned"  # a verified cosignature of the checkpoint is stored
    AHEAD = "ahead"  # the witness cosigned a larger tree than this checkpoint's
    INCONSISTENT = "inconsistent"  # 422: not an extension of what it cosigned
    UNREACHABLE = "unreachable"  # no answer, or a 5xx: try again later
    REFUSED = "refused"  # another answer (400, 403, 404, a bad cosignature, ...)


class Submitted(NamedTuple):
    """A submission's outcome.

    Attributes:
        outcome: see :class:`Outcome`.
        witness_size: the size the witness has now, as far as known: the
            checkpoint's when cosigned, the 409's when ahead, the ``old``
            size of the refused proof when inconsistent; None when unknown.
        detail: one line saying what happened (for logs, status and metrics).
    """

    outcome: Outcome
    witness_size: int | None
    detail: str


#: The ``infervisor run`` flag that resumes past a witness's refusal.
OVERRIDE_FLAG = "--accept-witness-conflict"


class WitnessAnswer(NamedTuple):
    """One witness's answer at boot.

    Attributes:
        witness: its key name.
        submitted: what the submission ended with (None: no answer within the bound).
    """

    witness: str
    submitted: Submitted | None


class WitnessBootDecision(NamedTuple):
    """What the boot does.

    Attributes:
        refusal: the one-line refusal (None: resume).
        events: to append before anything else (overrides).
        notes: lines for the operator (node.log and the terminal).
    """

    refusal: str | None
    events: tuple[ev.WitnessOverride, ...]
    notes: tuple[str, ...]


def decide_witness_boot(
    answers: Sequence[WitnessAnswer], chain_size: int, *, accept_conflict: bool
) -> WitnessBootDecision:
    """Refuse or resume given the witnesses' answers; see the module docstring."""
    conflicts: list[tuple[str, int, str]] = []
    notes: list[str] = []
    for answer in answers:
        found = _judge(answer, chain_size)
        if isinstance(found, tuple):
            conflicts.append(found)
        elif found:
            notes.append(found)
    if not conflicts:
        return WitnessBootDecision(None, (), tuple(notes))
    if not accept_conflict:
        return WitnessBootDecision(_refusal(conflicts[0], chain_size), (), tuple(notes))
    events = tuple(
        ev.WitnessOverride(
            witness=name, witness_size=size, chain_size=chain_size, reason=why, flag=OVERRIDE_FLAG
        )
        for name, size, why in conflicts
    )
    notes += [
        f"witness {name}: resuming past its refusal ({OVERRIDE_FLAG}; recorded): {why}"
        for name, _size, why in conflicts
    ]
    return WitnessBootDecision(None, events, tuple(notes))


def _judge(answer: WitnessAnswer, chain_size: int) -> tuple[str, int, str] | str:
    """A conflict ``(witness, its size, reason)``, or a note for the operator ("" for none)."""
    name, done = answer.witness, answer.submitted
    if done is None:
        return f"witness {name} did not answer in time: the chain is unanchored at {name}"
    size = done.witness_size
    if done.outcome is Outcome.AHEAD and size is not None and size > chain_size:
        return name, size, "rollback: the witness cosigned more events than the chain has"
    if done.outcome is Outcome.INCONSISTENT and size is not None:
        return name, size, "fork: the chain is not an extension of what the witness cosigned"
    if done.outcome is Outcome.COSIGNED:
        return ""
    return f"witness {name}: {done.detail}: the chain is unanchored at {name}"


def _refusal(conflict: tuple[str, int, str], chain_size: int) -> str:
    name, size, why = conflict
    if why.startswith("rollback"):
        what = (
            f"witness {name} cosigned size {size} of this chain, but the chain has {chain_size} "
            "events: it was rolled back (an older backup restored, or events cut)"
        )
    else:
        what = (
            f"witness {name} cosigned size {size}, and the chain of {chain_size} events is not "
            f"an extension of it (it refused the consistency proof from {size}): the chain was "
            "rewritten or forked"
        )
    return f"{what}; to resume anyway: infervisor run {OVERRIDE_FLAG} (it is recorded)"
