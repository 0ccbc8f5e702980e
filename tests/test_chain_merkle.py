"""chain/merkle.py agrees with tests/independent_rfc6962.py (written from RFC 6962 alone)."""

from __future__ import annotations

import hashlib

import independent_rfc6962 as ref
import pytest

from infervisor.chain.errors import ProofError
from infervisor.chain.merkle import (
    EMPTY_ROOT,
    CompactTree,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    tree_root,
    verify_consistency,
    verify_inclusion,
)

SIZES = [*list(range(1, 34)), 63, 64, 65, 100, 127, 128, 129]


def leaves(n: int) -> list[bytes]:
    return [hashlib.blake2s(str(i).encode()).digest() for i in range(n)]


def test_empty_tree_and_known_vector() -> None:
    assert tree_root([]) == EMPTY_ROOT == ref.mth([])
    # RFC 6962 leaf: SHA-256(0x00 || data)
    assert leaf_hash(b"") == hashlib.sha256(b"\x00").digest()


@pytest.mark.parametrize("n", SIZES)
def test_roots_agree(n: int) -> None:
    data = leaves(n)
    tree = CompactTree()
    for i, leaf in enumerate(data):
        tree.append(leaf)
        assert tree.root() == ref.mth(data[: i + 1])
    assert tree_root(data) == ref.mth(data)


@pytest.mark.parametrize("n", SIZES)
def test_inclusion_proofs_verified_by_both(n: int) -> None:
    data = leaves(n)
    hashes = [leaf_hash(d) for d in data]
    root = ref.mth(data)
    for m in range(n):
        ours = inclusion_proof(hashes, m)
        assert ours == ref.path(m, data)
        assert ref.verify_inclusion(m, n, data[m], ours, root)
        verify_inclusion(m, n, hashes[m], ours, root)
        if ours:
            bad = [*ours[:-1], bytes(32)]
            assert not ref.verify_inclusion(m, n, data[m], bad, root)
            with pytest.raises(ProofError):
                verify_inclusion(m, n, hashes[m], bad, root)
        with pytest.raises(ProofError):
            verify_inclusion(m, n, leaf_hash(b"other"), ours, root)


@pytest.mark.parametrize("n", SIZES)
def test_consistency_proofs_verified_by_both(n: int) -> None:
    data = leaves(n)
    hashes = [leaf_hash(d) for d in data]
    new_root = ref.mth(data)
    for m in range(1, n + 1):
        old_root = ref.mth(data[:m])
        ours = consistency_proof(hashes, m)
        assert ours == ref.proof(m, data)
        assert ref.verify_consistency(m, n, old_root, new_root, ours)
        verify_consistency(m, n, old_root, new_root, ours)
        if m < n:
            forked = ref.mth([*data[: m - 1], b"forged", *data[m:]])
            assert not ref.verify_consistency(m, n, old_root, forked, ours)
            with pytest.raises(ProofError):
                verify_consistency(m, n, old_root, forked, ours)
            with pytest.raises(ProofError):
                verify_consistency(m, n, bytes(32), new_root, ours)


def test_out_of_range() -> None:
    hashes = [leaf_hash(d) for d in leaves(4)]
    with pytest.raises(ProofError):
        inclusion_proof(hashes, 4)
    with pytest.raises(ProofError):
        consistency_proof(hashes, 0)
    with pytest.raises(ProofError):
        verify_inclusion(5, 4, hashes[0], [], EMPTY_ROOT)
