"""Cosignatures (c2sp.org/tlog-cosignature, cosignature/v1) and their table in chain.db."""

from __future__ import annotations

import base64
import hashlib
import sqlite3
import struct
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from infervisor.chain import cosignature_store
from infervisor.chain.cosignature import (
    CosignatureError,
    Cosigner,
    WitnessPolicy,
    cosignatures_of,
    parse_cosigner_key,
    parse_witness_key,
    with_cosignatures,
)
from infervisor.chain.errors import ChainIntegrityError, NoteError
from infervisor.chain.note import Signer, sign_note

BODY = "example.com/log\n3\n" + base64.b64encode(bytes(32)).decode() + "\n"


def test_a_cosignature_is_the_spec_message_signed_with_key_id_0x04_and_a_timestamp() -> None:
    cosigner = Cosigner.generate("witness.example/w1")
    cosig = cosigner.cosign(BODY, 1679315147)
    name, b64 = cosig.line.removeprefix("\u2014 ").split(" ")
    raw = base64.b64decode(b64)
    public = cosigner.key.public
    # Written from the spec, not from the module: key ID, timestamp, message.
    assert raw[:4] == hashlib.sha256(name.encode() + b"\n\x04" + public).digest()[:4]
    assert struct.unpack(">Q", raw[4:12]) == (1679315147,)
    message = b"cosignature/v1\ntime 1679315147\n" + BODY.encode()
    Ed25519PublicKey.from_public_bytes(public).verify(raw[12:], message)
    assert cosigner.key.verify(BODY, cosig.line) == cosig


def test_keys_round_trip_and_a_log_key_is_not_a_witness_key() -> None:
    cosigner = Cosigner.generate("w1")
    assert parse_witness_key(cosigner.key.key_string()) == cosigner.key
    assert parse_cosigner_key(cosigner.key_string()).key == cosigner.key
    with pytest.raises(NoteError, match="type 0x04"):
        parse_witness_key(Signer.generate("w1").verifier.key_string())


def test_notes_carry_cosignatures_and_an_altered_one_is_refused() -> None:
    log, w1, w2 = (
        Signer.generate("example.com/log"),
        Cosigner.generate("w1"),
        Cosigner.generate("w2"),
    )
    note = sign_note(BODY, log)
    lines = [w1.cosign(BODY, 10).line, w2.cosign(BODY, 11).line]
    cosigned = with_cosignatures(note, lines + lines[:1])
    assert cosigned.count("\u2014 w1 ") == 1
    found = cosignatures_of(cosigned, [w1.key, w2.key])
    assert [c.witness for c in found] == ["w1", "w2"]
    assert WitnessPolicy.of([w1.key, w2.key]).met_by(found)
    assert not WitnessPolicy.of([w1.key, w2.key]).met_by(found[:1])
    assert WitnessPolicy.of([w1.key, w2.key], 1).met_by(found[:1])
    with pytest.raises(CosignatureError, match="does not verify"):
        cosignatures_of(cosigned.replace("\n3\n", "\n4\n"), [w1.key])
    with pytest.raises(NoteError, match=r"quorum must be 1 \.\. 2"):
        WitnessPolicy.of([w1.key, w2.key], 3)


def test_the_table_is_append_only_and_only_of_stored_checkpoints(tmp_path: Path) -> None:
    path = tmp_path / "chain.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE checkpoints (tree_size INTEGER PRIMARY KEY, ts_ns, note TEXT)")
    conn.execute("INSERT INTO checkpoints VALUES (3, 0, ?)", (BODY + "\n\u2014 log x\n",))
    conn.commit()
    conn.close()
    w1 = Cosigner.generate("w1")
    assert cosignature_store.store(path, 3, [w1.cosign(BODY, 5)]) == 1
    assert cosignature_store.store(path, 3, [w1.cosign(BODY, 5)]) == 0
    with pytest.raises(ChainIntegrityError, match="stored checkpoint"):
        cosignature_store.store(path, 4, [w1.cosign(BODY, 5)])
    conn = sqlite3.connect(path)
    assert cosignature_store.witness_sizes(conn) == {"w1": 3}
    assert (cosignature_store.cosigned_note(conn, 3) or "").endswith(w1.cosign(BODY, 5).line + "\n")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("DELETE FROM cosignatures")
    conn.close()
