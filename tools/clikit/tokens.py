"""The bearer token a command sends: --token, --token-file or INFERVISOR_TOKEN.

A token file is either the bare secret or the node's ``api-tokens.json`` (token
names to secrets), from which ``--token-name`` picks one: the whole file is
never sent, so no other token can leak into a header or an error message.

A token that is a signed-note private key (``PRIVATE+KEY+...``: ``--token-file
DATA_DIR/node.key``) is refused before anything is sent, by the shape
:func:`~.key_shapes.shape_of` gives ``--key`` and ``--checkpoint`` (a newcomer's
trial, stop 34: the node's signing key went out as a bearer header over HTTP).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..netkit.bearer import BOM, TokenFileError, token_file_secrets, token_problem
from .failure import fail
from .key_shapes import shape_of
from .paths import file_problem

__all__ = ["TOKEN_FILE_HOLDS", "token_of"]

#: What a token file holds, as the refusals say it.
TOKEN_FILE_HOLDS = "a token file holds the bare secret, or the node's DATA_DIR/api-tokens.json"  # noqa: S105 - words, no secret


def _refuse_private(text: str, field: str, shown: str) -> None:
    """Exit 2 (``bad_value``) naming ``field`` when ``text`` is a private signing key."""
    if shape_of(text.encode("utf-8", "surrogateescape")) == "private":
        fail(
            f"{shown} is a PRIVATE signing key (PRIVATE+KEY+..., a node.key), not a bearer "
            f"token: it is never sent; {TOKEN_FILE_HOLDS} (--token-name picks one)",
            "bad_value",
            field,
        )


def _header_safe(secret: str | None, field: str, shown: str | None = None) -> str | None:
    """``secret`` when an Authorization header can carry it (the one rule of every
    client: tools/netkit/bearer.py), else exit 2 (``bad_value``) naming ``field``
    (said as ``shown``, the field by default)."""
    if secret is not None and (problem := token_problem(secret)) is not None:
        fail(f"{shown or field}: {problem}", "bad_value", field)
    return secret


def token_of(
    token: str | None, token_file: Path | None, token_name: str | tuple[str, ...]
) -> str | None:
    """The bearer secret: --token, else --token-file (the bare secret, or the node's
    api-tokens.json, from which --token-name picks), else INFERVISOR_TOKEN.

    Exits 2 through :func:`~.failure.fail`: ``bad_path`` for a token file that
    cannot be read, ``bad_value`` for a private signing key in any of the three,
    a token a header cannot carry, a token file that holds no one secret (empty,
    several lines, JSON other than an object of names and secrets: one leading
    byte order mark is dropped, tools/netkit/bearer.py), or a --token-name it lacks."""
    if token is not None:
        _refuse_private(token, "--token", "--token")
        return _header_safe(token.strip() or None, "--token")
    if token_file is None:
        secret = os.environ.get("INFERVISOR_TOKEN", "")
        _refuse_private(secret, "INFERVISOR_TOKEN", "INFERVISOR_TOKEN")
        return _header_safe(secret.strip() or None, "INFERVISOR_TOKEN")
    problem = file_problem(token_file)
    if problem is not None:
        fail(f"--token-file {token_file}: {problem}", "bad_path", "--token-file")
    try:
        text = token_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        fail(f"--token-file {token_file}: cannot read it: {e}", "bad_path", "--token-file")
    _refuse_private(text.removeprefix(BOM).strip(), "--token-file", f"--token-file {token_file}")
    try:
        tokens = token_file_secrets(text)
    except TokenFileError as e:
        fail(f"--token-file {token_file}: {e}; {TOKEN_FILE_HOLDS}", "bad_value", "--token-file")
    if isinstance(tokens, str):
        return tokens
    if isinstance(token_name, tuple):  # a preference: the first name the file has
        token_name = next((n for n in token_name if n in tokens), token_name[0])
    if token_name not in tokens:
        fail(
            f"--token-name {token_name!r} is not in {token_file}; "
            f"allowed: {', '.join(sorted(tokens)) or 'none'}",
            "bad_value",
            "--token-name",
        )
    shown = f"--token-file {token_file} (token {token_name!r})"
    return _header_safe(tokens[token_name], "--token-file", shown)
