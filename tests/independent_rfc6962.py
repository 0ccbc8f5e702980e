"""A second RFC 6962 Merkle tree implementation, written from RFC 6962 section 2.1 alone.

Imports no infervisor code. It follows the RFC's recursive definitions
literally (MTH, PATH, PROOF/SUBPROOF) and checks proofs by rebuilding the
roots along the same recursion (not with the bit-walking algorithms of RFC
9162 that infervisor.chain.merkle uses), so the two can disagree if either
is wrong.
"""

from __future__ import annotations

import hashlib


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def largest_power_of_two_below(n: int) -> int:
    """k such that k < n <= 2k, k a power of two (n > 1)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def mth(leaves: list[bytes]) -> bytes:
    """MTH(D[n]): the Merkle Tree Hash of a list of leaf inputs."""
    n = len(leaves)
    if n == 0:
        return sha256(b"")
    if n == 1:
        return sha256(b"\x00" + leaves[0])
    k = largest_power_of_two_below(n)
    return sha256(b"\x01" + mth(leaves[:k]) + mth(leaves[k:]))


def path(m: int, leaves: list[bytes]) -> list[bytes]:
    """PATH(m, D[n]) of section 2.1.1."""
    n = len(leaves)
    if n == 1:
        return []
    k = largest_power_of_two_below(n)
    if m < k:
        return [*path(m, leaves[:k]), mth(leaves[k:])]
    return [*path(m - k, leaves[k:]), mth(leaves[:k])]


def proof(m: int, leaves: list[bytes]) -> list[bytes]:
    """PROOF(m, D[n]) of section 2.1.2."""
    return subproof(m, leaves, True)


def subproof(m: int, leaves: list[bytes], b: bool) -> list[bytes]:
    n = len(leaves)
    if m == n:
        return [] if b else [mth(leaves)]
    k = largest_power_of_two_below(n)
    if m <= k:
        return [*subproof(m, leaves[:k], b), mth(leaves[k:])]
    return [*subproof(m - k, leaves[k:], False), mth(leaves[:k])]


def root_from_path(m: int, n: int, leaf_input: bytes, audit_path: list[bytes]) -> bytes:
    """The root that an audit path gives for leaf m of a tree of n leaves (mirrors PATH)."""
    if n == 1:
        if audit_path:
            raise ValueError("audit path too long")
        return sha256(b"\x00" + leaf_input)
    if not audit_path:
        raise ValueError("audit path too short")
    k = largest_power_of_two_below(n)
    sibling, rest = audit_path[-1], audit_path[:-1]
    if m < k:
        return sha256(b"\x01" + root_from_path(m, k, leaf_input, rest) + sibling)
    return sha256(b"\x01" + sibling + root_from_path(m - k, n - k, leaf_input, rest))


def verify_inclusion(
    m: int, n: int, leaf_input: bytes, audit_path: list[bytes], root: bytes
) -> bool:
    """True if the audit path shows leaf_input at index m of the tree of n leaves with root."""
    if not 0 <= m < n:
        return False
    try:
        return root_from_path(m, n, leaf_input, list(audit_path)) == root
    except ValueError:
        return False


def _roots_from_proof(
    m: int, n: int, b: bool, items: list[bytes], old_root: bytes
) -> tuple[bytes, bytes]:
    """(old subtree root, new subtree root) a SUBPROOF(m, D[n], b) gives (mirrors SUBPROOF)."""
    if m == n:
        if b:
            if items:
                raise ValueError("proof too long")
            return old_root, old_root
        if len(items) != 1:
            raise ValueError("proof length wrong")
        return items[0], items[0]
    if not items:
        raise ValueError("proof too short")
    k = largest_power_of_two_below(n)
    last, rest = items[-1], items[:-1]
    if m <= k:
        old, new_left = _roots_from_proof(m, k, b, rest, old_root)
        return old, sha256(b"\x01" + new_left + last)
    old_right, new_right = _roots_from_proof(m - k, n - k, False, rest, old_root)
    return sha256(b"\x01" + last + old_right), sha256(b"\x01" + last + new_right)


def verify_consistency(
    m: int, n: int, old_root: bytes, new_root: bytes, items: list[bytes]
) -> bool:
    """True if items is a valid PROOF(m, D[n]) between the two roots (0 < m <= n)."""
    if not 0 < m <= n:
        return False
    if m == n:
        return not items and old_root == new_root
    try:
        old, new = _roots_from_proof(m, n, True, list(items), old_root)
    except ValueError:
        return False
    return old == old_root and new == new_root
