"""Where the first event that differs lies, as far as checkpoints alone tell
(chain/trust.py ``_locate``, chain/unkeyed.py): a checkpoint's root commits to
every event below its size, but only a copy of the events can say which one
differs, so the evidence bounds it between the largest checkpoint the chain
still matches and the smallest one it fails against (docs/chain-format.md,
"Cosignatures and the trust policy").
"""

from __future__ import annotations

from infervisor.chain.checkpoint import Checkpoint

__all__ = ["beside", "bounds", "last_of"]


def beside(detail: str, cp: Checkpoint, name: str, finding: str) -> str:
    """A problem of the chain's own evidence (its checkpoint triggers changed, its
    checkpoints dropped or deleted, a stored signature bad), ``detail``, with what
    the external checkpoint ``cp`` (named ``name``) shows beside it, ``finding``:
    that checkpoint vouches for more than the stored ones, so it is named too (a
    newcomer's trial, stop 33: a chain truncated below the external checkpoint,
    its delete trigger dropped, read only "checkpoint triggers changed")."""
    return f"{detail}; and against checkpoint {name} (tree size {cp.tree_size}): {finding}"


def last_of(low: int, high: int) -> int | None:
    """A problem's ``last_seq`` for the range ``low..high``: None when it is the
    one seq ``low`` (the problem's ``seq`` names it)."""
    return None if low == high else high


def bounds(low: int, high: int, matched: bool) -> str:
    """Where the first event that differs lies, and the evidence that says so.

    Args:
        low: the size of the largest checkpoint below the failure that the chain
            still matches (events below it are unchanged); 0 when none does.
        high: the last seq below the smallest checkpoint the chain fails
            against (its size minus 1).
        matched: whether some checkpoint below the failure matches (False:
            ``low`` is 0 for want of one, and the text says so rather than
            naming a size).

    Returns:
        A clause for a problem's detail (stop 32's trial read "checkpoints of
        sizes none and 58" where no checkpoint below 58 matched).
    """
    if low == high:
        return f"the first event that differs is seq {low}"
    size = high + 1
    evidence = (
        f"the chain matches the checkpoint of size {low} and not the one of size {size}"
        if matched
        else f"the chain does not match the checkpoint of size {size}, and no smaller "
        "checkpoint that it matches narrows it"
    )
    return (
        f"the first event that differs is in seq {low}..{high} ({evidence}; only a copy "
        "of the events names it)"
    )
