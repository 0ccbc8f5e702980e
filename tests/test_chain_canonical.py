"""The canonical payload form (docs/chain-format.md, "Canonical payloads"): RFC 8785 (JCS)
with exact integers; NaN and infinities refused at encoding; the format version checked
by every verifier."""

from __future__ import annotations

import json
import math
import re
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infervisor.chain import (
    ChainFormatError,
    EventDraft,
    InvalidEventError,
    SqliteChain,
    encode_payload,
    verify_chain,
)
from infervisor.replay import events as ev

VERIFIER = Path(__file__).parent / "independent_verifier.py"

# RFC 8785, Appendix B: IEEE 754 doubles (as hex) and their canonical text.
RFC8785_NUMBERS = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]


def double(hex_bits: str) -> float:
    value: float = struct.unpack(">d", bytes.fromhex(hex_bits))[0]
    return value


@pytest.mark.parametrize(("bits", "text"), RFC8785_NUMBERS)
def test_numbers_are_written_as_rfc_8785_says(bits: str, text: str) -> None:
    assert encode_payload([double(bits)]) == f"[{text}]".encode()


def test_keys_sort_by_utf16_code_units_as_in_rfc_8785() -> None:
    keys = ["\u20ac", "\r", "\ufb33", "1", "\U0001f600", "\u0080", "\u00f6"]
    doc = json.loads(encode_payload({k: i for i, k in enumerate(keys)}))
    assert list(doc) == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]
    nested = json.loads(
        encode_payload([{"\ufb33": 1, "\U0001f600": {"\ufb33": 2, "\U0001f600": 3}}])
    )
    assert list(nested[0]) == ["\U0001f600", "\ufb33"]
    assert list(nested[0]["\U0001f600"]) == ["\U0001f600", "\ufb33"]


def test_strings_are_escaped_as_rfc_8785_says() -> None:
    text = 'a"\\/\b\f\n\r\t\x00\x1f\x7f\u2028é€😀'
    assert encode_payload([text]) == (
        '["a\\"\\\\/\\b\\f\\n\\r\\t\\u0000\\u001f\x7f\u2028é€😀"]'.encode()
    )


def test_equal_values_give_equal_bytes() -> None:
    assert encode_payload({"x": 10}) == encode_payload({"x": 10.0}) == b'{"x":10}'
    assert encode_payload({"x": 0.0}) == encode_payload({"x": -0.0}) == b'{"x":0}'
    assert encode_payload({"b": 1, "a": [True, None]}) == b'{"a":[true,null],"b":1}'
    stop = ev.StopRequested(by="operator", grace_s=5.0)
    assert b'"grace_s":5,' in ev.encode_event(stop)
    assert ev.decode_event(stored(ev.encode_event(stop))) == stop  # 5 reads back as 5.0


def stored(payload: bytes) -> object:
    from infervisor.chain import StoredEvent

    return StoredEvent(
        seq=1,
        ts_ns=0,
        node="n",
        source="operator",
        kind="instance.stop_requested",
        subject="i",
        payload=payload,
        payload_hash=bytes(32),
        prev_hash=bytes(32),
        hash=bytes(32),
    )


@pytest.mark.parametrize(
    ("payload", "path"),
    [
        ({"a": {"b": [1, math.nan]}}, "$.a.b[1]"),
        ({"delay_s": math.inf}, "$.delay_s"),
        ([-math.inf], "$[0]"),
        ({"n": 2**63}, "$.n"),
        ({"n": -(2**63) - 1}, "$.n"),
        ({"s": "\ud800"}, "$.s"),
    ],
)
def test_nan_infinities_huge_ints_and_lone_surrogates_are_refused_naming_the_field(
    payload: object, path: str
) -> None:
    with pytest.raises(InvalidEventError, match=rf"payload field {re.escape(path)} "):
        encode_payload(payload)


def test_a_nan_in_an_event_is_refused_before_it_reaches_the_chain() -> None:
    with pytest.raises(InvalidEventError, match=r"\$\.delay_s .*NaN"):
        ev.encode_event(ev.RestartScheduled(attempt=1, delay_s=math.nan, reason="x"))


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_finite_float_reads_back_exactly(value: float) -> None:
    text = encode_payload([value])
    assert float(json.loads(text)[0]) == value
    assert b"." not in text or not text.endswith(b".0]")


@settings(max_examples=200, deadline=None)
@given(st.integers(-(2**63), 2**63 - 1))
def test_integers_are_exact(value: int) -> None:
    assert msgspec.json.decode(encode_payload([value])) == [value]


# ---------------------------------------------------------------- the format version
def chain_with_version(path: Path, version: int) -> Path:
    with SqliteChain.open(path, "node-a") as chain:
        chain.append(EventDraft(ts_ns=1, source="operator", kind="k", subject="", payload=b"{}"))
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {version}")
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize("version", [0, 2, 99])
def test_verify_refuses_an_unknown_format_version_like_replay(tmp_path: Path, version: int) -> None:
    path = chain_with_version(tmp_path / "chain.db", version)
    with pytest.raises(ChainFormatError, match=r"version|not an infervisor chain"):
        verify_chain(path)
    with pytest.raises(ChainFormatError):
        SqliteChain.open_readonly(path)
    result = subprocess.run(
        [sys.executable, str(VERIFIER), str(path)], capture_output=True, text=True, check=False
    )
    assert (result.returncode, result.stdout) == (2, "")
    assert "version" in result.stderr


def test_version_1_verifies(tmp_path: Path) -> None:
    assert verify_chain(chain_with_version(tmp_path / "chain.db", 1)).ok
