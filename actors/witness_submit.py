"""One submission of a checkpoint to one witness (c2sp.org/tlog-witness add-checkpoint).

:func:`submit` posts the checkpoint with ``old N`` (the size the node
believes the witness last cosigned) and the RFC 6962 consistency proof
``N -> new`` over the chain's event hashes; a 409 answer gives the witness's
own size, from which it builds the proof again and posts once more. Each
cosignature the witness returns is verified against the witness's configured
key before it is stored, durably, beside the checkpoint
(:func:`~infervisor.chain.cosignature_store.store`). The outcome says what
the witness answered; nothing here retries after time passes (the caller
does: :mod:`.witnessing` while running, :mod:`.witness_boot` at boot).
"""

from __future__ import annotations

import os
import sqlite3
from typing import NamedTuple

import httpx

from infervisor.adapters.witness_http import WitnessReply, WitnessUnreachable, post
from infervisor.chain.connect import connect_reader, translated
from infervisor.chain.cosignature import (
    Cosignature,
    CosignatureError,
    WitnessKey,
    cosignatures_of,
)
from infervisor.chain.cosignature_store import cosigned_note, lines_by_size, store
from infervisor.chain.errors import ChainError, NoteError
from infervisor.chain.merkle import Memo, consistency_proof, leaf_hash
from infervisor.chain.note import DASH, split_note
from infervisor.chain.witness_protocol import (
    SIZE_CONTENT_TYPE,
    WitnessProtocolError,
    encode_add_checkpoint,
    parse_size_body,
)

from .core.witness_boot import Outcome, Submitted

__all__ = [
    "Leaves",
    "Outcome",
    "Submitted",
    "WitnessTarget",
    "cosigned_size",
    "submit",
    "witness_size",
]

#: 409 answers followed in one submission (the witness's size may move between
#: two posts when another client of the same origin submits too).
MAX_CONFLICTS = 3


class WitnessTarget(NamedTuple):
    """A configured witness: where it is and the key its cosignatures verify under.

    Attributes:
        url: the submission prefix; the node posts to ``<url>/add-checkpoint``.
        key: the witness's cosignature/v1 verifier key.
    """

    url: str
    key: WitnessKey

    @property
    def name(self) -> str:
        """The witness's key name."""
        return self.key.name


def submit(
    client: httpx.Client,
    target: WitnessTarget,
    chain_path: str | os.PathLike[str],
    checkpoint: tuple[int, str],
    believed: int,
    *,
    leaves: Leaves | None = None,
) -> Submitted:
    """Get the witness's cosignature of the stored checkpoint ``(tree_size, note)``.

    Args:
        believed: the size the node believes the witness last cosigned (0: none).
        leaves: the chain's leaves kept between submissions (None: read them now).

    Blocks for at most (1 + MAX_CONFLICTS) posts within the client's timeouts.
    Never raises for what the witness does; a chain that cannot be read is
    reported as REFUSED with the reason.
    """
    size, note = checkpoint
    old = min(believed, size)
    own = leaves is None
    leaves = leaves or Leaves(chain_path)
    try:
        for _ in range(1 + MAX_CONFLICTS):
            body = encode_add_checkpoint(old, leaves.proof(old, size), note)
            answer = post(client, target.url, body)
            if answer.status == 409:
                found = witness_size(answer)
                if found is None:
                    return _refused(answer, "a 409 without a text/x.tlog.size body")
                if found > size:
                    return Submitted(Outcome.AHEAD, found, f"the witness cosigned size {found}")
                old = found
                continue
            return _judge(answer, target, chain_path, (size, note), old)
        return Submitted(Outcome.UNREACHABLE, old, "the witness's size kept changing (409)")
    except WitnessUnreachable as e:
        return Submitted(Outcome.UNREACHABLE, None, str(e))
    except (ChainError, NoteError, ValueError) as e:
        return Submitted(Outcome.REFUSED, None, f"cannot submit size {size}: {e}")
    finally:
        if own:
            leaves.close()


def _judge(
    answer: WitnessReply,
    target: WitnessTarget,
    chain_path: str | os.PathLike[str],
    checkpoint: tuple[int, str],
    old: int,
) -> Submitted:
    """The outcome of a non-409 answer; a 200's cosignatures verified and stored."""
    size, note = checkpoint
    if answer.status == 422:
        return Submitted(
            Outcome.INCONSISTENT,
            old,
            f"the witness refused size {size} from its size {old} (422): {_first(answer)}",
        )
    if answer.status >= 500:
        return Submitted(Outcome.UNREACHABLE, None, f"HTTP {answer.status}: {_first(answer)}")
    if answer.status != 200:
        return _refused(answer, f"HTTP {answer.status}")
    try:
        cosigs = _verified(_text(answer), target.key, split_note(note)[0])
    except CosignatureError as e:
        return _refused(answer, f"a cosignature that does not verify: {e}")
    if not cosigs:
        return _refused(answer, f"no cosignature of {target.name} in the answer")
    store(chain_path, size, cosigs)
    return Submitted(Outcome.COSIGNED, size, f"cosigned size {size}")


def _verified(body: str, key: WitnessKey, checkpoint_body: str) -> list[Cosignature]:
    """The answer's cosignature lines of ``key``, each verified (others ignored).

    Raises:
        CosignatureError: a line names the key but does not verify.
    """
    found = []
    for line in body.splitlines():
        words = line.split(" ")
        if len(words) == 3 and words[0] == DASH and words[1] == key.name:
            try:
                found.append(key.verify(checkpoint_body, line))
            except CosignatureError as e:
                if "is not of witness" in str(e):
                    continue  # the same name, another key: not ours to judge
                raise
    return found


class Leaves:
    """The chain's RFC 6962 leaves (the leaf hash of each event's BLAKE3 hash, as
    the checkpoint roots are built), read once and then only the new ones, and
    the memo of perfect subtree roots: a submitter's proofs cost O(log^2 n)
    hashes, not O(n). Valid while the node appends to the chain it read. Its
    read-only connection stays open between reads (opening one per submission
    was a fifth of a submission's CPU): :meth:`close` it.
    """

    def __init__(self, chain_path: str | os.PathLike[str]) -> None:
        self._path = os.fspath(chain_path)
        self._leaves: list[bytes] = []
        self._memo: Memo = {}
        self._conn: sqlite3.Connection | None = None

    def close(self) -> None:
        """Close the read-only connection (idempotent; a later read opens another)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def proof(self, old: int, new: int) -> list[bytes]:
        """PROOF(old, D[new]) ([] when old is 0 or new).

        Raises:
            ChainIOError: the chain cannot be read.
            ProofError: the chain has fewer than ``new`` events.
        """
        if old in (0, new):
            return []
        if len(self._leaves) < new:
            self._read(new)
        return consistency_proof(self._leaves, old, new, self._memo)

    def _read(self, below: int) -> None:
        if self._conn is None:
            self._conn = connect_reader(self._path)
        try:
            with translated(self._path, "read event hashes of"):
                rows = self._conn.execute(
                    "SELECT hash FROM events WHERE seq >= ? AND seq < ? ORDER BY seq",
                    (len(self._leaves), below),
                ).fetchall()
        except ChainError:
            self.close()  # the next read opens the file afresh
            raise
        self._leaves.extend(leaf_hash(bytes(h)) for (h,) in rows)


def cosigned_size(chain_path: str | os.PathLike[str], key: WitnessKey) -> int:
    """The largest stored checkpoint whose stored cosignature of ``key`` verifies (0: none).

    Lines that do not verify (altered, another key) are skipped: the node
    trusts only what it can check.

    Raises:
        ChainIOError: the chain cannot be read.
    """
    name = os.fspath(chain_path)
    conn = connect_reader(name)
    try:
        with translated(name, "read cosignatures of"):
            for size in sorted(lines_by_size(conn), reverse=True):
                note = cosigned_note(conn, size)
                try:
                    if note is not None and cosignatures_of(note, [key]):
                        return size
                except NoteError:
                    continue
    finally:
        conn.close()
    return 0


def _refused(answer: WitnessReply, what: str) -> Submitted:
    return Submitted(Outcome.REFUSED, None, f"{what}: {_first(answer)}")


def _first(answer: WitnessReply) -> str:
    text = _text(answer).strip()
    line = text.splitlines()[0] if text else "(empty)"
    return line[:200]


def witness_size(answer: WitnessReply) -> int | None:
    """The witness's tree size from a 409 ``text/x.tlog.size`` answer, or None when it
    is not one (a missing Content-Type is tolerated, another one is not)."""
    if answer.status != 409 or answer.content_type not in ("", SIZE_CONTENT_TYPE):
        return None
    try:
        return parse_size_body(answer.body)
    except WitnessProtocolError:
        return None


def _text(answer: WitnessReply) -> str:
    return answer.body.decode("utf-8", "replace")
