"""What a bearer token may hold, and what a token file holds: the one reading of
every token the node's tools send in an ``Authorization: Bearer`` header (RFC 6750).

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

A token file holds the bare secret on one line, or the node's own
``api-tokens.json`` (token names to secrets, from which the client picks one).
One leading UTF-8 byte order mark is dropped (editors on Windows write one:
stop 35's trial); an empty file, a second line, or JSON that is not an object
of names and secrets is refused, never sent.
"""

from __future__ import annotations

import json

__all__ = ["BOM", "TOKEN_HOLDS", "TokenFileError", "token_file_secrets", "token_problem"]

#: What a token may hold, as every refusal says it.
TOKEN_HOLDS = (
    "visible ASCII only (letters, digits, punctuation; "  # noqa: S105 - words, no secret
    "no spaces, controls or other characters)"
)

#: The byte order mark an editor may put before a file's text (U+FEFF).
BOM = "\ufeff"


class TokenFileError(ValueError):
    """A token file that holds no usable secret; the message says why (without
    the file's name, which the caller knows and names)."""


def token_problem(secret: str) -> str | None:
    """Why an ``Authorization`` header cannot carry ``secret`` (empty, or naming its
    first character that may not be sent: ``a token may hold visible ASCII only
    (...), found '\\n'``); None when it can."""
    if not secret:
        return "an empty token"
    bad = next((ch for ch in secret if not "!" <= ch <= "~"), None)
    return None if bad is None else f"a token may hold {TOKEN_HOLDS}, found {bad!a}"


def token_file_secrets(raw: str) -> str | dict[str, str]:
    """The bare secret a token file's text holds, or the names and secrets of the
    node's ``api-tokens.json`` (each secret is checked by :func:`token_problem`
    when it is picked, not here: the file may hold tokens for others).

    Raises:
        TokenFileError: the text is empty, holds more than one line, is JSON other
            than an object of strings, or its bare secret cannot go in a header.
    """
    text = raw.removeprefix(BOM).strip()
    if not text:
        raise TokenFileError("it is empty")
    if text.startswith("{"):
        try:
            tokens = json.loads(text)
        except ValueError as e:
            raise TokenFileError(f"not JSON: {e}") from e
        if not isinstance(tokens, dict) or not all(isinstance(v, str) for v in tokens.values()):
            raise TokenFileError(
                'expected a JSON object of token names and secrets ({"operator": "..."})'
            )
        return tokens
    if text.startswith(("[", '"')):  # a secret the node makes never starts so
        raise TokenFileError(
            "JSON that is not an object of token names and secrets "
            '({"operator": "..."}), nor a bare secret'
        )
    if len(text.splitlines()) > 1:
        raise TokenFileError("more than one line: a bare secret is the file's one line")
    problem = token_problem(text)
    if problem is not None:
        raise TokenFileError(problem)
    return text
