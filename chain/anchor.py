"""How far a chain's verdict is anchored outside the node, and, when witnesses
were given, how far their cosignatures fall short of the quorum
(docs/chain-format.md, "Cosignatures and the trust policy").

Split from chain/trust.py (at its 500-line bound) when the shortfall was added:
a newcomer's trial (stop 34) read exit 0 and "pass --witness" from
``chain verify --witness VKEY`` on a chain no witness had cosigned.
"""

from __future__ import annotations

from infervisor.chain.checkpoint import Checkpoint
from infervisor.chain.cosignature import Cosignature, WitnessPolicy

__all__ = ["QUORUM_UNMET", "anchor", "shortfall"]

QUORUM_UNMET = "witness quorum not met"
"""The reason of a verdict whose required witnesses did not cosign a quorum."""


def anchor(
    cosigned: dict[int, list[Cosignature]],
    policy: WitnessPolicy | None,
    external: tuple[Checkpoint, str] | None,
) -> tuple[str, int]:
    """The one-line anchor statement and the tree size it covers (0: none).

    Args:
        cosigned: tree size -> the policy witnesses' cosignatures that verified on it.
        policy: the witnesses trusted and their quorum (None: none).
        external: a checkpoint held outside the node and its name, or None.
    """
    quorate = [s for s, c in cosigned.items() if policy is not None and policy.met_by(c)]
    if policy is not None and policy.keys and quorate:
        size = max(quorate)
        count = len({(c.witness, c.key_id) for c in cosigned[size]})
        return f"anchored: {count} of {len(policy.keys)} witnesses at size {size:,}", size
    if external is not None:
        cp, name = external
        return f"anchored: checkpoint {name} at size {cp.tree_size:,}", cp.tree_size
    if policy is not None and policy.keys:
        best = max((len({c.witness for c in cs}) for cs in cosigned.values()), default=0)
        return (
            f"unanchored: {best} of {len(policy.keys)} witnesses cosigned, quorum {policy.quorum}",
            0,
        )
    return "unanchored: no checkpoint held outside this node", 0


def shortfall(
    cosigned: dict[int, list[Cosignature]], policy: WitnessPolicy | None, checkpoints: int
) -> str | None:
    """Why the witnesses of `policy` vouch for no checkpoint, or None when a quorum
    of them cosigned one (or there is no policy).

    Names how many cosignatures were found of how many needed, at the checkpoint
    the most witnesses cosigned, and which witnesses: ``1 of 2 needed
    cosignatures found (at tree size 12: alice.example); witnesses given:
    alice.example, bob.example``.

    Args:
        cosigned: tree size -> the policy witnesses' cosignatures that verified on it.
        policy: the witnesses required and their quorum.
        checkpoints: how many stored checkpoints verified (0: nothing to cosign).
    """
    if policy is None or not policy.keys:
        return None
    if any(policy.met_by(c) for c in cosigned.values()):
        return None
    by_size = {s: sorted({c.witness for c in cs}) for s, cs in cosigned.items()}
    best = max(by_size, key=lambda s: (len(by_size[s]), s), default=None)
    found = 0 if best is None else len(by_size[best])
    where = (
        f"at tree size {best}: {', '.join(by_size[best])}"
        if best is not None
        else "no stored checkpoint is cosigned by any of them"
        if checkpoints
        else "the chain stores no signed checkpoint for them to cosign"
    )
    given = ", ".join(k.name for k in policy.keys)
    return (
        f"{found} of {policy.quorum} needed cosignatures found ({where}); witnesses given: {given}"
    )
