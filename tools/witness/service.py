"""The witness's add-checkpoint and monitoring answers (c2sp.org/tlog-witness).

:meth:`Witness.add_checkpoint` takes a request body and returns the
:class:`Answer`; the HTTP layer (:mod:`.app`) only moves bytes. Order:

1. parse (400), origin (404), the log's signature (403), then `judge`
   against the stored state (400, 409, 422) — all pure;
2. the ``--audit`` seam: an :class:`Auditor`, if given, looks at the new
   checkpoint and the state it extends and may refuse: 422 for a checkpoint
   whose entries break a rule (kept, like any 422), another status (503:
   the log's entries cannot be fetched now) for a refusal not to keep;
3. cosign, then :meth:`~.store.WitnessStore.advance` (a compare-and-swap on
   the judged state, durable on return); lost to another submission: 409;
4. answer 200 with the cosignature line.

A checkpoint a known log signed but refused with 422 (inconsistent, or an
auditor's verdict) is kept in the ``refusals`` table as evidence, with its reason.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import NamedTuple, Protocol

from infervisor.chain.cosignature import Cosigner, with_cosignatures
from infervisor.chain.errors import NoteError
from infervisor.chain.note import open_note
from infervisor.chain.witness_protocol import (
    SIZE_CONTENT_TYPE,
    AddCheckpoint,
    Refusal,
    WitnessProtocolError,
    WitnessState,
    encode_size_body,
    judge,
    monitoring_path,
    parse_add_checkpoint,
)

from .config import WitnessedLog
from .store import Held, StoreError, WitnessStore

__all__ = ["Answer", "Auditor", "Witness"]

log = logging.getLogger(__name__)

_MONITOR = re.compile(r"/([0-9a-f]{64})/checkpoint")


class Answer(NamedTuple):
    """An HTTP answer: status, Content-Type, body."""

    status: int
    content_type: str
    body: bytes


def _text(status: int, message: str) -> Answer:
    return Answer(status, "text/plain; charset=utf-8", (message + "\n").encode())


class Auditor(Protocol):
    """The ``--audit`` seam: a check of a checkpoint's new entries before cosigning.

    Called after the checkpoint's signature and consistency proof verified and
    before anything is stored, outside any lock (it may fetch over the
    network); the store's compare-and-swap catches a state that moved meanwhile.
    """

    def __call__(
        self, log: WitnessedLog, held: WitnessState | None, request: AddCheckpoint
    ) -> Refusal | None:
        """None to cosign; a `Refusal` (its status and one-line reason) to refuse."""
        ...


class Witness:
    """A tlog-witness over a store, a cosigner and the logs it witnesses."""

    def __init__(
        self,
        cosigner: Cosigner,
        logs: dict[str, WitnessedLog],
        store: WitnessStore,
        *,
        auditor: Auditor | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Serve ``logs`` (by origin), storing in ``store``, cosigning with ``cosigner``."""
        self.cosigner = cosigner
        self.logs = logs
        self.store = store
        self.auditor = auditor
        self._clock = clock
        self._by_path = {monitoring_path(origin): origin for origin in logs}

    def add_checkpoint(self, body: bytes) -> Answer:
        """Answer one add-checkpoint request body (see the module doc for the order)."""
        try:
            request = parse_add_checkpoint(body)
        except WitnessProtocolError as e:
            return _text(400, str(e))
        origin = request.checkpoint.origin
        witnessed = self.logs.get(origin)
        if witnessed is None:
            return _text(404, f"unknown origin {origin[:200]!r}: this witness does not witness it")
        try:
            open_note(request.note, list(witnessed.verifiers))
        except NoteError as e:
            return _text(403, f"checkpoint of {origin}: {e}")
        try:
            return self._consistent(witnessed, request)
        except StoreError as e:
            log.warning("witness state: %s", e)
            return _text(503, "the witness cannot store its state now; try again later")

    def _consistent(self, witnessed: WitnessedLog, request: AddCheckpoint) -> Answer:
        held = self.store.get(witnessed.origin)
        state = held.state if held is not None else None
        refusal = judge(request, state)
        if refusal is None and self.auditor is not None:
            refusal = self.auditor(witnessed, state, request)
        if refusal is not None:
            return self._refused(request, refusal)
        cp = request.checkpoint
        body = request.note[: request.note.index("\n\n") + 1]
        # never before the last cosignature of the origin, even if the clock went back
        now = max(int(self._clock()), held.timestamp_s if held is not None else 1)
        cosig = self.cosigner.cosign(body, now)
        new = Held(cp.origin, cp.size, cp.root, request.note, (cosig.line,), cosig.timestamp_s)
        raced = self.store.advance(state, new)
        if raced is not None:  # another submission moved the state since it was judged
            return Answer(409, SIZE_CONTENT_TYPE, encode_size_body(raced.size))
        log.info("cosigned %s at size %d (old %d)", cp.origin, cp.size, request.old_size)
        return Answer(200, "text/plain; charset=utf-8", (cosig.line + "\n").encode())

    def _refused(self, request: AddCheckpoint, refusal: Refusal) -> Answer:
        if refusal.status == 409:
            return Answer(409, SIZE_CONTENT_TYPE, encode_size_body(int(refusal.reason)))
        if refusal.status == 422:  # a known log's signed checkpoint, inconsistent: evidence
            self.store.refuse(request, refusal)
            log.warning(
                "refused %s at size %d: %s",
                request.checkpoint.origin,
                request.checkpoint.size,
                refusal.reason,
            )
        return _text(refusal.status, refusal.reason)

    def checkpoint(self, path: str) -> Answer | None:
        """Answer ``GET /<origin hash>/checkpoint`` (None: not such a path).

        The latest checkpoint cosigned for the origin, with the log's
        signatures and this witness's cosignature; 404 if it never cosigned.
        """
        if _MONITOR.fullmatch(path) is None:
            return None
        origin = self._by_path.get(path)
        held = self.store.get(origin) if origin is not None else None
        if held is None:
            return _text(404, "this witness has cosigned no checkpoint of that origin")
        note = with_cosignatures(held.note, held.cosignatures)
        return Answer(200, "text/plain; charset=utf-8", note.encode())
