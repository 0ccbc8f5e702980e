"""tools/witness/service.py on a real witness.db: any body gets a status of the spec, never
a 500; a mutated valid request never moves the state but to a consistent extension."""

from __future__ import annotations

import uuid
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from witness_support import Log

from infervisor.chain.cosignature import Cosigner
from infervisor.chain.witness_protocol import AddCheckpoint, Refusal, WitnessState
from infervisor.tools.witness.config import WitnessedLog
from infervisor.tools.witness.service import Witness
from infervisor.tools.witness.store import WitnessStore

LOG = Log("example.com/fuzz")
LOG.grow(12)
SPEC_STATUSES = {200, 400, 403, 404, 409, 422}


def _witness(path: Path) -> Witness:
    logs = {LOG.origin: WitnessedLog(LOG.origin, (LOG.signer.verifier,))}
    return Witness(Cosigner.generate("w.test/fuzz"), logs, WitnessStore(path))


@settings(
    max_examples=150,
    deadline=None,  # a loaded machine is slow, not wrong
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(body=st.binary(max_size=400))
def test_any_bytes_get_a_status_of_the_spec(tmp_path: Path, body: bytes) -> None:
    witness = _witness(tmp_path / f"{uuid.uuid4().hex}.db")
    try:
        assert witness.add_checkpoint(body).status in SPEC_STATUSES
    finally:
        witness.store.close()


@settings(
    max_examples=150,
    deadline=None,  # a loaded machine is slow, not wrong
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_a_mutated_request_is_refused_or_harmless(tmp_path: Path, data: st.DataObject) -> None:
    witness = _witness(tmp_path / f"{uuid.uuid4().hex}.db")
    try:
        assert witness.add_checkpoint(LOG.request(0, size=5)).status == 200
        body = bytearray(LOG.request(5))
        at = data.draw(st.integers(0, len(body) - 1))
        body[at] = data.draw(st.integers(0, 255))
        answer = witness.add_checkpoint(bytes(body))
        assert answer.status in SPEC_STATUSES
        held = witness.store.get(LOG.origin)
        assert held is not None
        if answer.status == 200:  # only a byte that changed nothing signed or proven
            assert held.size == 12
        else:
            assert held.size == 5
    finally:
        witness.store.close()


def test_the_audit_seam_refuses_before_anything_is_stored(tmp_path: Path) -> None:
    calls: list[tuple[int | None, int]] = []

    def auditor(
        log: WitnessedLog, held: WitnessState | None, request: AddCheckpoint
    ) -> Refusal | None:
        calls.append((held.size if held else None, request.checkpoint.size))
        if request.checkpoint.size == 9:
            return Refusal(503, "the log's entries cannot be fetched now")
        if request.checkpoint.size > 9:
            return Refusal(422, "event seq 9 breaks a lifecycle rule")
        return None

    logs = {LOG.origin: WitnessedLog(LOG.origin, (LOG.signer.verifier,))}
    store = WitnessStore(tmp_path / "audit.db")
    witness = Witness(Cosigner.generate("w.test/audit"), logs, store, auditor=auditor)
    try:
        assert witness.add_checkpoint(LOG.request(0, size=5)).status == 200
        assert witness.add_checkpoint(LOG.request(5, size=9)).status == 503
        answer = witness.add_checkpoint(LOG.request(5, size=12))
        assert (answer.status, answer.body) == (422, b"event seq 9 breaks a lifecycle rule\n")
        assert calls == [(None, 5), (5, 9), (5, 12)]
        held = store.get(LOG.origin)
        assert held is not None
        assert held.size == 5
        assert store.refusal_counts() == {LOG.origin: (1, "event seq 9 breaks a lifecycle rule")}
    finally:
        store.close()
