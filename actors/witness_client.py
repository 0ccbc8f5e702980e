"""The node's side of c2sp.org/tlog-witness ``add-checkpoint``: one request, one answer.

The request body is an old size line, the consistency proof's hashes (one
base64 line each, at most 63), an empty line and the signed checkpoint::

    old <N>\\n
    <base64 hash>\\n ...
    \\n
    <checkpoint note with its signatures>

The answers that matter here (tlog-witness, "add-checkpoint"): 200 with the
witness's cosignature lines; 409 with a ``text/x.tlog.size`` body, the size of
the latest checkpoint it cosigned for the origin, in decimal and a newline;
422 when the consistency proof does not verify (the checkpoint is not an
extension of what it cosigned); 400, 403, 404 for a request it cannot take.

The wire format is kept in this one module (``request_body``, ``parse_size``)
until the project's shared protocol module replaces it; :func:`post` is the
only place the node speaks HTTP to a witness (httpx, bounded timeouts), and
it translates every transport failure into :class:`WitnessUnreachable`.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import NamedTuple

import httpx

__all__ = [
    "MAX_PROOF_LINES",
    "SIZE_CONTENT_TYPE",
    "Answer",
    "WitnessUnreachable",
    "parse_size",
    "post",
    "request_body",
]

MAX_PROOF_LINES = 63
"""The most consistency proof lines a client may send (tlog-witness)."""

SIZE_CONTENT_TYPE = "text/x.tlog.size"
"""The media type of a 409 answer's body."""

_MAX_ANSWER = 64 * 1024


class WitnessUnreachable(Exception):
    """No HTTP answer: the connection failed, timed out, or the answer was too large."""


class Answer(NamedTuple):
    """A witness's HTTP answer.

    Attributes:
        status: the HTTP status code.
        body: the body as text (UTF-8, undecodable bytes replaced).
        content_type: the Content-Type header, parameters dropped, lower case.
    """

    status: int
    body: str
    content_type: str


def request_body(old_size: int, proof: Sequence[bytes], note: str) -> bytes:
    """Return the add-checkpoint request body (see the module docstring).

    Raises:
        ValueError: a negative old size, a proof of more than 63 hashes, a proof
            given with old size 0, or a note without its final newline.
    """
    if old_size < 0:
        raise ValueError(f"old size {old_size} is negative")
    if len(proof) > MAX_PROOF_LINES:
        raise ValueError(f"a consistency proof of {len(proof)} lines (at most {MAX_PROOF_LINES})")
    if old_size == 0 and proof:
        raise ValueError("old size 0 takes no consistency proof")
    if not note.endswith("\n"):
        raise ValueError("the checkpoint note must end with a newline")
    lines = [f"old {old_size}"] + [base64.b64encode(h).decode("ascii") for h in proof]
    return ("\n".join(lines) + "\n\n" + note).encode("utf-8")


def parse_size(answer: Answer) -> int | None:
    """The witness's tree size from a 409 answer, or None when it is not one.

    The body must be a decimal without leading zeros (``0`` allowed) and a
    newline, with Content-Type ``text/x.tlog.size`` (a missing type is
    tolerated; another one is not).
    """
    if answer.status != 409 or answer.content_type not in ("", SIZE_CONTENT_TYPE):
        return None
    text = answer.body
    if not text.endswith("\n"):
        return None
    digits = text[:-1]
    if not digits.isascii() or not digits.isdigit() or (digits != "0" and digits[0] == "0"):
        return None
    return int(digits)


def post(client: httpx.Client, url: str, body: bytes) -> Answer:
    """POST ``body`` to ``<url>/add-checkpoint`` and return the answer.

    Blocks at most the client's timeouts (connect, read, write, pool).

    Raises:
        WitnessUnreachable: no answer (connection refused, timed out, reset,
            the answer larger than 64 KiB or not HTTP).
    """
    target = url.rstrip("/") + "/add-checkpoint"
    try:
        with client.stream("POST", target, content=body) as response:
            raw = b""
            for chunk in response.iter_bytes():
                raw += chunk
                if len(raw) > _MAX_ANSWER:
                    raise WitnessUnreachable(f"{target}: an answer over {_MAX_ANSWER} bytes")
            kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
            return Answer(response.status_code, raw.decode("utf-8", "replace"), kind)
    except httpx.HTTPError as e:
        raise WitnessUnreachable(f"{target}: {type(e).__name__}: {e or 'no answer'}") from e
