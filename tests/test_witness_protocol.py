"""chain/witness_protocol.py: the add-checkpoint body, its strict parser, and `judge`."""

from __future__ import annotations

import base64
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infervisor.chain.merkle import EMPTY_ROOT, consistency_proof, leaf_hash, root_of_hashes
from infervisor.chain.note import Signer, sign_note
from infervisor.chain.witness_protocol import (
    MAX_PROOF_LINES,
    STATUS,
    WitnessProtocolError,
    WitnessState,
    encode_add_checkpoint,
    encode_size_body,
    judge,
    monitoring_path,
    parse_add_checkpoint,
    parse_checkpoint_body,
    parse_cosignature_lines,
    parse_size_body,
)

SIGNER = Signer.generate("example.com/log")
LEAVES = [leaf_hash(os.urandom(32)) for _ in range(40)]


def note(size: int, root: bytes | None = None, extra: str = "") -> str:
    r = root_of_hashes(LEAVES[:size]) if root is None else root
    return sign_note(f"example.com/log\n{size}\n{base64.b64encode(r).decode()}\n{extra}", SIGNER)


def test_the_spec_example_shape_round_trips() -> None:
    proof = consistency_proof(LEAVES, 13, 37)
    body = encode_add_checkpoint(13, proof, note(37))
    head = body.decode().split("\n\n")[0].split("\n")
    assert head[0] == "old 13"
    assert [base64.b64decode(line) for line in head[1:]] == proof
    parsed = parse_add_checkpoint(body)
    assert (parsed.old_size, list(parsed.proof), parsed.note) == (13, proof, note(37))
    assert parsed.checkpoint.origin == "example.com/log"
    assert parsed.checkpoint.size == 37
    assert parsed.checkpoint.extensions == ()


@given(st.integers(0, 2**63 - 1))
def test_size_body_round_trips(size: int) -> None:
    assert parse_size_body(encode_size_body(size)) == size


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (b"", "empty line"),
        (b"old 1\n", "empty line"),
        (b"new 1\n\n", "first line"),
        (b"old 01\n\n", "leading zeros"),
        (b"old -1\n\n", "decimal"),
        (b"old 99999999999999999999\n\n", r"2\^63"),
        (b"old 0\nnot base64!\n\n", "proof line 1"),
        (b"old 0\nAAAA\n\n", "32-byte"),
        (b"\xff\n\n", "UTF-8"),
        (b"old 0\n\nexample.com/log\n1\n", "signed note"),
        (b"old 0\n\nexample.com/log\n1\nAAAA\n\n\xe2\x80\x94 k AAAAAAAA\n", "32-byte"),
    ],
)
def test_a_bad_body_names_what_is_wrong(body: bytes, names: str) -> None:
    with pytest.raises(WitnessProtocolError, match=names):
        parse_add_checkpoint(body)


def test_proof_is_at_most_63_hashes() -> None:
    hashes = [os.urandom(32)] * MAX_PROOF_LINES
    assert len(parse_add_checkpoint(encode_add_checkpoint(1, hashes, note(2))).proof) == 63
    lines = "".join(base64.b64encode(h).decode() + "\n" for h in [*hashes, hashes[0]])
    with pytest.raises(WitnessProtocolError, match="at most 63"):
        parse_add_checkpoint(f"old 1\n{lines}\n{note(2)}".encode())
    with pytest.raises(WitnessProtocolError, match="at most 63"):
        encode_add_checkpoint(1, [*hashes, hashes[0]], note(2))


def test_checkpoint_text_is_c2sp_tlog_checkpoint() -> None:
    root = base64.b64encode(EMPTY_ROOT).decode()
    assert parse_checkpoint_body(f"o\n0\n{root}\next one\n").extensions == ("ext one",)
    for bad, names in [
        (f"o\n0\n{root}", "newline"),
        ("o\n0\n", "at least 3"),
        (f"o\n00\n{root}\n", "leading zeros"),
        (f"\n0\n{root}\n", "empty line"),
        (f"o\n0\n{root}\n\n", "empty line"),
        ("o\n0\nAAAA\n", "32-byte"),
    ]:
        with pytest.raises(WitnessProtocolError, match=names):
            parse_checkpoint_body(bad)


def _judge(old: int, size: int, held: WitnessState | None, proof: list[bytes] | None = None):  # type: ignore[no-untyped-def]
    if proof is None:
        proof = consistency_proof(LEAVES, old, size) if 0 < old < size else []
    return judge(parse_add_checkpoint(encode_add_checkpoint(old, proof, note(size))), held)


def test_judge_follows_the_spec() -> None:
    at = {n: WitnessState(n, root_of_hashes(LEAVES[:n])) for n in (5, 20)}
    assert _judge(0, 5, None) is None  # never cosigned: old 0, no proof
    assert _judge(5, 20, at[5]) is None  # a consistent extension
    assert _judge(20, 20, at[20]) is None  # the same checkpoint again
    assert _judge(21, 20, at[20]) == (400, "old size 21 is above the checkpoint's size 20")
    assert _judge(0, 20, at[5]) == (409, "5")
    assert _judge(5, 20, None) == (409, "0")
    refusal = _judge(0, 5, None, proof=[os.urandom(32)])
    assert refusal is not None
    assert refusal.status == 422
    forked = WitnessState(5, os.urandom(32))
    refusal = _judge(5, 20, forked)
    assert refusal is not None
    assert refusal.status == 422
    refusal = _judge(20, 20, WitnessState(20, os.urandom(32)))
    assert refusal is not None
    assert "forked" in refusal.reason
    bad = consistency_proof(LEAVES, 5, 20)
    bad[-1] = os.urandom(32)
    refusal = _judge(5, 20, at[5], proof=bad)
    assert refusal is not None
    assert refusal.status == 422


def test_size_zero_must_have_the_empty_root() -> None:
    empty = encode_add_checkpoint(0, [], note(0, EMPTY_ROOT))
    assert judge(parse_add_checkpoint(empty), None) is None
    other = encode_add_checkpoint(0, [], note(0, os.urandom(32)))
    refusal = judge(parse_add_checkpoint(other), None)
    assert refusal is not None
    assert refusal.status == 422


def test_answers_and_paths() -> None:
    assert set(STATUS) == {200, 400, 403, 404, 409, 422}
    line = f"\u2014 w {base64.b64encode(os.urandom(76)).decode()}"
    assert parse_cosignature_lines(f"{line}\n{line}\n".encode()) == [line, line]
    for bad in (b"", b"hello\n", line.encode()):
        with pytest.raises(WitnessProtocolError):
            parse_cosignature_lines(bad)
    with pytest.raises(WitnessProtocolError):
        parse_size_body(b"12")
    path = monitoring_path("example.com/log")
    assert path.startswith("/")
    assert path.endswith("/checkpoint")
    assert len(path) == 1 + 64 + len("/checkpoint")
