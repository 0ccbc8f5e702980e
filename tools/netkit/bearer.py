"""What a bearer token may hold: the one check of every token the node's tools send
in an ``Authorization: Bearer`` header (RFC 6750).

A token is sent as it is read; one holding a control character (CR, LF: the
header breaks, or a second header is smuggled in), a space or a character beyond
ASCII would be refused by the HTTP client at the first request, in words that
say nothing of the token (a newcomer's trial, stop 34: ``--token $'a\\nb'`` read
as the node going away), or sent broken. So each sender refuses it where it is
read, naming where it came from: the command line's ``--token``,
``--token-file`` and ``INFERVISOR_TOKEN`` (tools/clikit/tokens.py), the fleet's
``[[nodes]]`` (tools/fleet/config.py) and the witness's ``[[logs]] token_file``
(tools/witness/config.py). Visible ASCII, ``!`` to ``~``, holds RFC 6750's
``b64token`` and every secret the node generates (``secrets.token_urlsafe``).
"""

from __future__ import annotations

__all__ = ["TOKEN_HOLDS", "token_problem"]

#: What a token may hold, as every refusal says it.
TOKEN_HOLDS = (
    "visible ASCII only (letters, digits, punctuation; "  # noqa: S105 - words, no secret
    "no spaces, controls or other characters)"
)


def token_problem(secret: str) -> str | None:
    """Why an ``Authorization`` header cannot carry ``secret``, naming its first
    character that may not be sent (``a token may hold visible ASCII only (...),
    found '\\n'``); None when it can."""
    bad = next((ch for ch in secret if not "!" <= ch <= "~"), None)
    return None if bad is None else f"a token may hold {TOKEN_HOLDS}, found {bad!a}"
