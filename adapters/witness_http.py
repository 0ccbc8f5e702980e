"""Posting to a C2SP tlog-witness: the bytes in, the status and body out.

The wire format (the add-checkpoint body, the 409 size body, the cosignature
lines) is :mod:`infervisor.chain.witness_protocol`; this module only moves
bytes over HTTP with httpx, keeps the connection alive between submissions
(c2sp.org/tlog-witness: "Clients SHOULD use ... HTTP keep-alive"), bounds
the time and the size of an answer, and turns every transport failure into
one :class:`WitnessUnreachable`.
"""

from __future__ import annotations

from typing import NamedTuple

import httpx

from .tls import client_tls

__all__ = ["MAX_ANSWER_BYTES", "WitnessClient", "WitnessReply", "WitnessUnreachable", "post"]

MAX_ANSWER_BYTES = 64 * 1024
"""Bytes read of a witness's answer (100 cosignature lines fit in a fifth of it)."""


class WitnessUnreachable(Exception):
    """No HTTP answer from the witness (refused, timed out, reset, not HTTP, too large)."""


class WitnessReply(NamedTuple):
    """A witness's answer: HTTP status, Content-Type (without parameters), body."""

    status: int
    content_type: str
    body: bytes


class WitnessClient:
    """Add-checkpoint submissions to one witness (``url`` is its submission prefix).

    Not thread-safe: one per submitting thread.
    """

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        """``timeout_s`` bounds connecting and each read of the answer.

        Raises:
            ValueError: ``url`` is not an ``http(s)://`` URL.
        """
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"witness url must start with http:// or https://, found {url!r}")
        self.url = url.rstrip("/")
        self._client = httpx.Client(timeout=timeout_s, follow_redirects=False, verify=client_tls())

    def add_checkpoint(self, body: bytes) -> WitnessReply:
        """POST ``body`` to ``<url>/add-checkpoint``.

        Raises:
            WitnessUnreachable: no HTTP answer, or one over MAX_ANSWER_BYTES.
        """
        return post(self._client, self.url, body)

    def close(self) -> None:
        """Close the kept-alive connection."""
        self._client.close()


def post(client: httpx.Client, url: str, body: bytes) -> WitnessReply:
    """POST ``body`` to ``<url>/add-checkpoint`` with ``client`` and return the answer.

    Blocks at most the client's timeouts (connect, read, write, pool).

    Raises:
        WitnessUnreachable: no HTTP answer, or one over MAX_ANSWER_BYTES.
    """
    target = url.rstrip("/") + "/add-checkpoint"
    try:
        with client.stream("POST", target, content=body) as answer:
            data = b""
            for chunk in answer.iter_bytes():
                data += chunk
                if len(data) > MAX_ANSWER_BYTES:
                    raise WitnessUnreachable(f"{target}: answer over {MAX_ANSWER_BYTES} bytes")
            kind = answer.headers.get("content-type", "").split(";")[0].strip().lower()
            return WitnessReply(answer.status_code, kind, data)
    except httpx.HTTPError as e:
        raise WitnessUnreachable(f"{target}: {type(e).__name__}: {e or 'no answer'}") from e
