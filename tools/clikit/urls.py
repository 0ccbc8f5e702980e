"""A node's URL as the command line takes it (``--url``, INFERVISOR_URL, ``chain pull URL``).

Checked once where the command reads it, so that no malformed URL reaches the
HTTP client (httpx raises ``InvalidURL`` on ``http://[::1`` or a port ``abc``,
which would end in a traceback) and no port out of range is dialled (port
99999 would read as "nothing answers", exit 3, for what is a typing error).
"""

from __future__ import annotations

import urllib.parse

from .failure import Failure
from .raw_args import number_problem

__all__ = ["URL_ALLOWED", "checked_url"]

#: What a node's URL may be, as the refusal says it.
URL_ALLOWED = "http:// or https://, a host, and a port 1-65535 if any (e.g. http://127.0.0.1:8765)"


def checked_url(url: str, name: str) -> str:
    """``url`` without its trailing slashes, when it is http(s) with a host and a
    port (if given) in 1-65535.

    Raises:
        Failure: ``bad_value`` (exit 2) naming ``name`` (the option, argument or
            environment variable it came from) and what is allowed.
    """

    def refuse(why: str) -> Failure:
        return Failure(f"{name} {url!r}: {why}; allowed: {URL_ALLOWED}", "bad_value", name)

    if any(
        0xD800 <= ord(c) <= 0xDFFF for c in url
    ):  # bytes argv or the environment could not decode
        raise refuse("not valid UTF-8")
    port_problem = number_problem(_port_text(url.strip()))
    if port_problem is not None:  # int() reads full-width 8080 as 8080; urllib: "out of range"
        raise refuse(f"port {port_problem}")
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError:  # an unclosed "[", a port that is not a number or is out of range
        raise refuse(_why_unsplit(url.strip())) from None
    if parts.scheme not in ("http", "https"):
        raise refuse("not an http:// or https:// URL")
    if not parts.hostname:
        raise refuse("no host")
    if port is not None and not 1 <= port <= 65535:
        raise refuse(f"port {port} is out of range")
    if any(ord(c) < 33 or ord(c) == 127 for c in url.strip()):
        raise refuse("it holds a space or a control character")
    return url.strip().rstrip("/")


def _why_unsplit(url: str) -> str:
    """What is wrong with a URL urllib could not split, in the project's words
    (urllib's own, "Port could not be cast to integer value as 'abc'", is
    Python's, not an operator's: a newcomer's trial, stop 33)."""
    netloc = _netloc(url)
    if ("[" in netloc) != ("]" in netloc):
        return "an IPv6 host must be in brackets, [ and ] both (e.g. http://[::1]:8765)"
    port = _port_text(url)
    if port.isdigit():
        return f"port {port} is out of range"
    return f"port {port!r} is not a number"


def _netloc(url: str) -> str:
    """The host and port of ``url`` (its user info dropped), as written."""
    return (
        url.partition("://")[2]
        .split("/", 1)[0]
        .split("?", 1)[0]
        .split("#", 1)[0]
        .rpartition("@")[2]
    )


def _port_text(url: str) -> str:
    """The port of ``url`` as written ("" when it gives none)."""
    netloc = _netloc(url)
    return netloc.rpartition("]")[2].rpartition(":")[2] if ":" in netloc else ""
