"""What a bearer secret may be, and what a token file holds: one reading for every
client of the node (the command line's ``--token``, ``INFERVISOR_TOKEN`` and
``--token-file``, a fleet's ``token_file``).

The node takes ``Authorization: Bearer <secret>`` (RFC 6750) and compares the
secret, stripped, with those of its ``api-tokens.json`` (:mod:`.auth`,
``Tokens.identify``), which it generates with ``secrets.token_urlsafe``. A
header carries visible ASCII only: a secret holding a space, a control or any
other character cannot reach the node as written, so a client refuses it
rather than send something else (a newcomer's trial, stop 34: ``--token
$'a\\nb'`` read as the node going away).

A token file holds the bare secret on one line, or the node's own
``api-tokens.json`` (token names to secrets, from which the client picks one).
One leading UTF-8 byte order mark is dropped (editors on Windows write one:
stop 35's trial); an empty file, a second line, or JSON that is not an object
of names and secrets is refused, never sent.
"""

from __future__ import annotations

import json

__all__ = ["BOM", "TokenFileError", "secret_problem", "token_file_secrets"]

#: The byte order mark an editor may put before a file's text (U+FEFF).
BOM = "\ufeff"


class TokenFileError(ValueError):
    """A token file that holds no usable secret; the message says why (without
    the file's name, which the caller knows and names)."""


def secret_problem(secret: str) -> str | None:
    """Why ``secret`` cannot go out as ``Authorization: Bearer <secret>``, or None:
    it is empty, or holds other than visible ASCII (``!`` to ``~``: RFC 6750's
    b64token and more)."""
    if not secret:
        return "an empty token"
    bad = next((ch for ch in secret if not "!" <= ch <= "~"), None)
    if bad is None:
        return None
    return (
        "a token may hold visible ASCII only (letters, digits, punctuation; no spaces, "
        f"controls or other characters), found {bad!a}"
    )


def token_file_secrets(raw: str) -> str | dict[str, str]:
    """The bare secret a token file's text holds, or the names and secrets of the
    node's ``api-tokens.json`` (each secret is checked by :func:`secret_problem`
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
    problem = secret_problem(text)
    if problem is not None:
        raise TokenFileError(problem)
    return text
