"""How a request's body is framed, and what the node's HTTP/1.1 listeners refuse of
it: one set of rules for the control API (h11) and the front (httptools), each
listener answering in its own error shape and then closing the connection.

RFC 9112 section 6 frames a request body one way: ``Transfer-Encoding: chunked``
or ``Content-Length``. A request carrying both is the classic request-smuggling
vector (a proxy in front may take one length and the node the other, and read
the rest as a second request): RFC 9112 section 6.1 lets a server reject it, and
says it ought to close the connection after answering. A trial (stop 35) found
the control API took it (h11 reads the chunked body and ignores the length). So
both listeners refuse, before the request reaches an app (and before its caller
is authenticated: nothing of it is trusted yet):

- ``Transfer-Encoding`` together with ``Content-Length``: 400 ``bad_framing``;
- a ``Transfer-Encoding`` other than ``chunked`` given once (``gzip``,
  ``gzip, chunked``, ``chunked`` twice), or one in an HTTP/1.0 request: 400
  ``bad_framing``. RFC 9112 section 6.1 wants 400 where chunked is not the final
  coding and suggests 501 for a coding the server does not decode; h11 refuses
  both before the node sees the value, so one answer is given for every coding
  but ``chunked``;
- ``Content-Length`` given more than once, as a list, or not a decimal number:
  400 ``bad_framing`` (RFC 9110 section 8.6 lets identical copies be taken as
  one; h11 does take them, httptools refuses them: the API answers such a
  request, the front refuses it);
- a body announced (``Content-Length``) or sent (chunked) beyond the listener's
  limit: 413 ``body_too_large`` naming the limit in bytes, at once, not after
  reading it;
- anything else the parser cannot read: 400 ``bad_request`` in the parser's words.

The answers' ``field`` names the header at fault (``body`` for a 413).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Refusal", "body_too_large", "framing_refusal", "parser_refusal"]

#: RFC 9110 section 8.6: ``Content-Length = 1*DIGIT``.
_DIGITS = re.compile(rb"[0-9]+")
#: Most characters of a parser's words quoted in a refusal.
_SAID = 200
#: The RFC section every framing refusal points to.
_RFC = "RFC 9112 section 6"


@dataclass(frozen=True)
class Refusal:
    """A request refused for how it is framed; the connection closes after the answer.

    Attributes:
        status: the HTTP status (400 or 413).
        code: ``bad_framing``, ``body_too_large`` or ``bad_request``.
        message: what was wrong and what is allowed.
        field: the header at fault (``Transfer-Encoding``, ``Content-Length``), or
            ``body`` for a body over the limit; None when the parser said no more.
    """

    status: int
    code: str
    message: str
    field: str | None = None


#: Both lengths given: the smuggling vector, in the same words whichever parser saw it.
_BOTH = Refusal(
    400,
    "bad_framing",
    "Transfer-Encoding and Content-Length given together: a body's length is given "
    f"one way ({_RFC}.1; two lengths are the request-smuggling vector): send "
    "Content-Length alone, or Transfer-Encoding: chunked alone",
    "Transfer-Encoding",
)


def framing_refusal(
    headers: Iterable[tuple[bytes, bytes]], http_version: str, limit: int
) -> Refusal | None:
    """What is wrong with a request head's framing (module doc), or None.

    Args:
        headers: the head's fields as received (names in any case).
        http_version: ``"1.1"`` or ``"1.0"``.
        limit: the largest body the listener takes, bytes.
    """
    codings = [v for n, v in headers if n.lower() == b"transfer-encoding"]
    lengths = [v for n, v in headers if n.lower() == b"content-length"]
    if codings and lengths:
        return _BOTH
    if codings:
        return _coding_refusal(codings, http_version)
    if lengths:
        return _length_refusal(lengths, limit)
    return None


def _coding_refusal(codings: list[bytes], http_version: str) -> Refusal | None:
    given = b", ".join(codings).decode("latin-1")
    if http_version == "1.0":
        why = "an HTTP/1.0 request has no Transfer-Encoding: send Content-Length"
    elif len(codings) == 1 and codings[0].strip().lower() == b"chunked":
        return None
    else:
        why = "the only one taken is chunked, given once: send the body as it is"
    return Refusal(
        400,
        "bad_framing",
        f"Transfer-Encoding {given!r}: {why} ({_RFC}.1)",
        "Transfer-Encoding",
    )


def _length_refusal(lengths: list[bytes], limit: int) -> Refusal | None:
    value = lengths[0].strip()
    if len(lengths) > 1 or not _DIGITS.fullmatch(value):
        given = b", ".join(lengths).decode("latin-1")
        return Refusal(
            400,
            "bad_framing",
            f"Content-Length {given!r}: give it once, as one decimal number of bytes ({_RFC}.2)",
            "Content-Length",
        )
    if int(value) > limit:
        return body_too_large(limit, int(value))
    return None


def body_too_large(limit: int, announced: int | None = None) -> Refusal:
    """413 ``body_too_large``: a body of ``announced`` bytes (None: sent chunked and
    found over the limit while it arrived) where ``limit`` bytes are the most taken."""
    size = "over that" if announced is None else f"{announced} bytes"
    return Refusal(
        413,
        "body_too_large",
        f"the body is {size}; this listener takes a body of at most {limit} bytes",
        "body",
    )


def parser_refusal(said: str) -> Refusal:
    """A request the HTTP parser could not read (h11's or llhttp's words in ``said``):
    ``bad_framing`` naming the header when it is about the body's framing, else
    ``bad_request``."""
    if len(said) > _SAID:  # h11 quotes the line it could not read, whole
        said = f"{said[:_SAID]}… ({len(said)} characters in all)"
    lowered = said.lower()
    named = [h for h in ("Transfer-Encoding", "Content-Length") if h.lower() in lowered]
    if len(named) == 2:  # llhttp's "Content-Length can't be present with Transfer-Encoding"
        return _BOTH
    if named:
        return Refusal(
            400,
            "bad_framing",
            f"the request's {named[0]} cannot be taken ({said}): send Content-Length "
            f"once, as a decimal number, or Transfer-Encoding: chunked alone ({_RFC})",
            named[0],
        )
    return Refusal(400, "bad_request", f"the request is not valid HTTP/1.1: {said}")
