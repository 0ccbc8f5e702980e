"""RFC 6962 Merkle tree hashes, inclusion and consistency proofs (SHA-256).

The chain's Merkle tree (docs/chain-format.md, "Merkle tree") has one leaf
per event, in seq order; the leaf's data is the event's 32-byte `hash`.
Hashing is RFC 6962 section 2.1 exactly:

- the hash of an empty tree is SHA-256 of no bytes;
- a leaf hash is ``SHA-256(0x00 || leaf data)``;
- an interior node is ``SHA-256(0x01 || left || right)``, where the left
  subtree holds the largest power of two of leaves smaller than the tree.

Proof generation follows RFC 6962 section 2.1.1 (``PATH``) and 2.1.2
(``PROOF``/``SUBPROOF``); verification follows the algorithms of RFC 9162
sections 2.1.3.2 and 2.1.4.2. Roots of a growing tree are kept with
`CompactTree` (a stack of perfect subtree roots): one leaf hash and on
average one node hash per appended leaf.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from infervisor.chain.errors import ProofError

HASH_SIZE = 32
EMPTY_ROOT = bytes.fromhex("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
"""MTH({}): SHA-256 of the empty string (RFC 6962 section 2.1)."""


class _Digest(Protocol):
    def digest(self) -> bytes: ...


def _first_sha256(data: bytes) -> _Digest:
    """``hashlib.sha256(data)``, importing hashlib at the first tree hashed: it loads
    OpenSSL (~5 ms of every start-up), and a reader of a chain without checkpoints
    hashes no tree (tests/test_cli_imports.py)."""
    global _sha256  # noqa: PLW0603 - replaced once by the function it stood for
    import hashlib  # noqa: PLC0415 - see above

    _sha256 = hashlib.sha256
    return _sha256(data)


_sha256: Callable[[bytes], _Digest] = _first_sha256


def leaf_hash(data: bytes) -> bytes:
    """Return ``SHA-256(0x00 || data)``: the RFC 6962 hash of one leaf (32 bytes)."""
    return _sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """Return ``SHA-256(0x01 || left || right)``: an RFC 6962 interior node (32 bytes)."""
    return _sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than n (n >= 2): RFC 6962's k."""
    return 1 << ((n - 1).bit_length() - 1)


def root_of_hashes(hashes: Sequence[bytes]) -> bytes:
    """Return MTH of a tree given its leaf *hashes* (already `leaf_hash`ed).

    Args:
        hashes: the leaf hashes, 32 bytes each, in leaf order.

    Returns:
        The 32-byte root (`EMPTY_ROOT` for no leaves). RFC 6962 section 2.1.
    """
    tree = CompactTree()
    for h in hashes:
        tree.append_hash(h)
    return tree.root()


def tree_root(leaves: Iterable[bytes]) -> bytes:
    """Return MTH(D[n]) of the leaf data `leaves` (RFC 6962 section 2.1), 32 bytes."""
    tree = CompactTree()
    for leaf in leaves:
        tree.append(leaf)
    return tree.root()


class CompactTree:
    """The roots of the perfect subtrees of a growing tree (a compact range from 0).

    Appending a leaf costs one leaf hash and, on average, one node hash;
    `root` folds the at most log2(n) stored roots. Memory: O(log n).

    Attributes:
        size: the number of leaves appended.
    """

    def __init__(self) -> None:
        self.size = 0
        self._roots: list[bytes] = []  # perfect subtrees, largest (leftmost) first

    def append(self, data: bytes) -> None:
        """Append one leaf given its data (an event hash); see `leaf_hash`."""
        self.append_hash(_sha256(b"\x00" + data).digest())

    def append_hash(self, digest: bytes) -> None:
        """Append one leaf given its leaf hash (32 bytes)."""
        roots = self._roots
        size = self.size
        while size & 1:
            digest = _sha256(b"\x01" + roots.pop() + digest).digest()
            size >>= 1
        roots.append(digest)
        self.size += 1

    def root(self) -> bytes:
        """Return MTH of the leaves appended so far (`EMPTY_ROOT` for none), 32 bytes."""
        if not self._roots:
            return EMPTY_ROOT
        digest = self._roots[-1]
        for left in reversed(self._roots[:-1]):
            digest = _sha256(b"\x01" + left + digest).digest()
        return digest

    def frontier(self) -> bytes:
        """The stored subtree roots, concatenated (32 bytes each, largest first):
        with `size`, all that `from_frontier` needs to go on from here."""
        return b"".join(self._roots)

    @classmethod
    def from_frontier(cls, size: int, frontier: bytes) -> CompactTree:
        """The tree of `size` leaves whose `frontier` this is.

        Raises:
            ValueError: `frontier` is not one 32-byte root per set bit of `size`.
        """
        count = size.bit_count() if size >= 0 else -1
        if count < 0 or len(frontier) != 32 * count:
            raise ValueError(f"a frontier of tree size {size} is {count} roots of 32 bytes")
        tree = cls()
        tree.size = size
        tree._roots = [frontier[i : i + 32] for i in range(0, len(frontier), 32)]
        return tree

    def copy(self) -> CompactTree:
        """Return an independent copy."""
        other = CompactTree()
        other.size = self.size
        other._roots = list(self._roots)
        return other


#: Perfect subtrees of at least this many leaves are kept in a proof memo.
MEMO_MIN_LEAVES = 256

Memo = dict[tuple[int, int], bytes]
"""Roots of perfect subtrees, by (first leaf, leaves): valid while the leaves are."""


def _mth(hashes: Sequence[bytes], lo: int, hi: int, memo: Memo | None = None) -> bytes:
    """MTH of leaf hashes[lo:hi] (hi > lo); perfect subtrees of `MEMO_MIN_LEAVES` or
    more leaves are read from and written to `memo` when given."""
    n = hi - lo
    if n == 1:
        return hashes[lo]
    kept = memo is not None and n >= MEMO_MIN_LEAVES and n & (n - 1) == 0
    if kept and (found := memo.get((lo, n))) is not None:  # type: ignore[union-attr]
        return found
    k = _split(n)
    root = node_hash(_mth(hashes, lo, lo + k, memo), _mth(hashes, lo + k, hi, memo))
    if kept:
        memo[(lo, n)] = root  # type: ignore[index]
    return root


def inclusion_proof(hashes: Sequence[bytes], index: int, size: int | None = None) -> list[bytes]:
    """Return PATH(index, D[size]): the audit path of one leaf (RFC 6962 section 2.1.1).

    Args:
        hashes: leaf hashes of (at least) the first `size` leaves.
        index: the leaf, 0 <= index < size.
        size: the tree size (default: len(hashes)).

    Returns:
        The path's node hashes, from the leaf's sibling up to the root's child.

    Raises:
        ProofError: index or size out of range.
    """
    n = len(hashes) if size is None else size
    if not 0 <= index < n <= len(hashes):
        raise ProofError(f"no inclusion proof of leaf {index} in a tree of {n} leaves")
    path: list[bytes] = []
    lo, hi, m = 0, n, index
    while hi - lo > 1:
        k = _split(hi - lo)
        if m < k:
            path.append(_mth(hashes, lo + k, hi))
            hi = lo + k
        else:
            path.append(_mth(hashes, lo, lo + k))
            lo, m = lo + k, m - k
    path.reverse()
    return path


def consistency_proof(
    hashes: Sequence[bytes], old: int, new: int | None = None, memo: Memo | None = None
) -> list[bytes]:
    """Return PROOF(old, D[new]) (RFC 6962 section 2.1.2).

    Args:
        hashes: leaf hashes of (at least) the first `new` leaves.
        old: the earlier tree size, 0 < old <= new.
        new: the later tree size (default: len(hashes)).
        memo: perfect subtree roots kept between calls on the same (growing)
            leaves: a proof then hashes O(log^2 n) nodes instead of O(n).

    Returns:
        The proof's node hashes ([] when old == new).

    Raises:
        ProofError: sizes out of range.
    """
    n = len(hashes) if new is None else new
    if not 0 < old <= n <= len(hashes):
        raise ProofError(f"no consistency proof from tree size {old} to {n}")
    proof: list[bytes] = []
    _subproof(hashes, old, (0, n), whole=True, out=(proof, memo))
    return proof


def _subproof(
    hashes: Sequence[bytes],
    m: int,
    span: tuple[int, int],
    *,
    whole: bool,
    out: tuple[list[bytes], Memo | None],
) -> None:
    (lo, hi), (proof, memo) = span, out
    n = hi - lo
    if m == n:
        if not whole:
            proof.append(_mth(hashes, lo, hi, memo))
        return
    k = _split(n)
    if m <= k:
        _subproof(hashes, m, (lo, lo + k), whole=whole, out=out)
        proof.append(_mth(hashes, lo + k, hi, memo))
    else:
        _subproof(hashes, m - k, (lo + k, hi), whole=False, out=out)
        proof.append(_mth(hashes, lo, lo + k, memo))


def verify_inclusion(
    index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes
) -> None:
    """Check an inclusion proof (RFC 9162 section 2.1.3.2).

    Args:
        index: the leaf's index, 0 <= index < size.
        size: the tree size.
        leaf: the leaf *hash* (`leaf_hash` of the event hash), 32 bytes.
        proof: the audit path, as `inclusion_proof` returns it.
        root: the tree's root hash, 32 bytes.

    Raises:
        ProofError: the proof does not show the leaf at `index` in that tree.
    """
    if not 0 <= index < size:
        raise ProofError(f"leaf index {index} is not below tree size {size}")
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            raise ProofError("inclusion proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("inclusion proof is shorter than the tree is deep")
    if r != root:
        raise ProofError(f"inclusion proof of leaf {index} gives root {r.hex()}, not {root.hex()}")


def verify_consistency(
    old: int, new: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> None:
    """Check a consistency proof between two tree heads (RFC 9162 section 2.1.4.2).

    Args:
        old, new: the tree sizes, 0 < old <= new.
        old_root, new_root: their 32-byte roots.
        proof: as `consistency_proof` returns it ([] when old == new).

    Raises:
        ProofError: the later tree does not extend the earlier one (a fork
            or a rewrite), or the proof is malformed.
    """
    if not 0 < old <= new:
        raise ProofError(f"no consistency between tree sizes {old} and {new}")
    if old == new:
        if proof:
            raise ProofError("a consistency proof between equal sizes must be empty")
        if old_root != new_root:
            raise ProofError(f"two different roots for tree size {old}: the log forked")
        return
    if not proof:
        raise ProofError("empty consistency proof between different sizes")
    path = list(proof)
    if old & (old - 1) == 0:  # an exact power of two
        path.insert(0, old_root)
    fr, sr, sn = _fold_consistency(path, old - 1, new - 1)
    if sn != 0:
        raise ProofError("consistency proof is shorter than needed")
    if fr != old_root:
        raise ProofError(
            f"consistency proof does not reproduce the root of tree size {old}: "
            "the later tree is not an extension of it (fork or rewrite)"
        )
    if sr != new_root:
        raise ProofError(
            f"consistency proof does not reproduce the root of tree size {new}: "
            "the later tree is not an extension of the earlier one (fork or rewrite)"
        )


def _fold_consistency(path: list[bytes], fn: int, sn: int) -> tuple[bytes, bytes, int]:
    """Steps 4-6 of RFC 9162 section 2.1.4.2: the two roots the proof gives, and sn."""
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("consistency proof is longer than needed")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return fr, sr, sn
