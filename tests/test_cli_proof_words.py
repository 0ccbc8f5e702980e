"""A malformed ``--proof`` file, or a malformed line of a bundle's events.jsonl, is
refused in the project's words naming the field and what is allowed, never
Python's (a newcomer's trial, stop 33, read "non-hexadecimal number found in
fromhex() arg at position 0" from ``chain verify --proof``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli_paths import Chain, chain, run

__all__ = ["chain"]  # the fixture, shared with test_cli_paths

PYTHONS_WORDS = ("fromhex", "non-hexadecimal", "Expecting value", "KeyError", "Traceback")


def _proof(chain: Chain) -> dict[str, object]:
    made = run("chain", "prove", chain.db, "1", "--checkpoint", chain.cp, "--json")
    assert made.code == 0, made
    doc: dict[str, object] = json.loads(made.stdout)
    return doc


def _changes() -> list[tuple[str, dict[str, object], str]]:
    """(name, fields changed in a good inclusion proof, what the refusal says)."""
    return [
        ("root not hex", {"root": "zz"}, "root 'zz' is not a hash: 64 hex digits allowed"),
        ("path item not hex", {"path": ["xy"]}, "path[0] 'xy' is not a hash"),
        ("path not a list", {"path": "ab"}, "path is not a list of hashes"),
        ("leaf_index text", {"leaf_index": "one"}, "leaf_index 'one' is not a whole number"),
        ("unknown type", {"type": "nope"}, "type 'nope'; allowed: inclusion, consistency"),
    ]


@pytest.mark.parametrize(("name", "change", "said"), _changes(), ids=[c[0] for c in _changes()])
def test_a_malformed_proof_is_named_in_the_projects_words(
    chain: Chain, tmp_path: Path, name: str, change: dict[str, object], said: str
) -> None:
    proof = tmp_path / "proof.json"
    proof.write_text(json.dumps({**_proof(chain), **change}))
    ran = run("chain", "verify", chain.db, "--proof", proof, "--json")
    assert ran.code == 2, ran
    error = json.loads(ran.stdout)["error"]
    assert (error["code"], error["field"]) == ("bad_value", "--proof")
    assert said in ran.stderr, ran.stderr
    assert not any(words in ran.stderr for words in PYTHONS_WORDS), ran.stderr


def test_a_proof_missing_a_field_or_not_json_says_so(chain: Chain, tmp_path: Path) -> None:
    proof = tmp_path / "proof.json"
    doc = _proof(chain)
    del doc["event_hash"]
    proof.write_text(json.dumps(doc))
    ran = run("chain", "verify", chain.db, "--proof", proof)
    assert ran.code == 2 and "no 'event_hash' field" in ran.stderr, ran
    proof.write_text("not json\n")
    ran = run("chain", "verify", chain.db, "--proof", proof)
    assert ran.code == 2 and "it is not JSON" in ran.stderr, ran
    assert not any(words in ran.stderr for words in PYTHONS_WORDS), ran.stderr


def test_a_good_proof_still_checks_out(chain: Chain, tmp_path: Path) -> None:
    proof = tmp_path / "proof.json"
    proof.write_text(json.dumps(_proof(chain)))
    ran = run(
        "chain", "verify", chain.db, "--proof", proof, "--checkpoint", chain.cp, "--key", chain.pub
    )
    assert ran.code == 0, ran
    assert "ok inclusion proof" in ran.stdout


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("hash", "zz", "hash must be 32 bytes of hex (64 hex digits)"),
        ("payload", "%%%", "payload is not base64"),
        ("seq", None, "no 'seq' field"),
        # stop 35: beyond 64 bits, struct.error came out as a traceback
        ("ts_ns", 2**63, "seq must be at most 2^63-1, ts_ns from -2^63 to 2^63-1"),
        ("seq", 2**64, "seq must be at most 2^63-1, ts_ns from -2^63 to 2^63-1"),
    ],
)
def test_a_malformed_bundle_line_is_named_in_the_projects_words(
    chain: Chain, tmp_path: Path, field: str, value: object, said: str
) -> None:
    out = tmp_path / "bundle"
    assert run("chain", "export", chain.db, out).code == 0
    events = out / "events.jsonl"
    lines = events.read_text().splitlines()
    doc = json.loads(lines[2])
    if value is None:
        del doc[field]
    else:
        doc[field] = value
    lines[2] = json.dumps(doc)
    events.write_text("\n".join(lines) + "\n")
    ran = run("chain", "verify-bundle", out, "--key", chain.pub)
    assert ran.code == 1, ran
    said_all = ran.stdout + ran.stderr
    assert f"events.jsonl line 3: not an event line: {said}" in said_all, said_all
    assert not any(words in said_all for words in PYTHONS_WORDS), said_all
