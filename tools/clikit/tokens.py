"""The bearer token a command sends: --token, --token-file or INFERVISOR_TOKEN.

A token file is either the bare secret or the node's ``api-tokens.json`` (token
names to secrets), from which ``--token-name`` picks one: the whole file is
never sent, so no other token can leak into a header or an error message.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .failure import fail
from .paths import file_problem

__all__ = ["token_of"]


def token_of(
    token: str | None, token_file: Path | None, token_name: str | tuple[str, ...]
) -> str | None:
    """The bearer secret: --token, else --token-file (the bare secret, or the node's
    api-tokens.json, from which --token-name picks), else INFERVISOR_TOKEN."""
    if token is not None:
        return token.strip() or None
    if token_file is None:
        return os.environ.get("INFERVISOR_TOKEN", "").strip() or None
    problem = file_problem(token_file)
    if problem is not None:
        fail(f"--token-file {token_file}: {problem}", "bad_path", "--token-file")
    try:
        text = token_file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"--token-file {token_file}: cannot read it: {e}", "bad_path", "--token-file")
    if not text.startswith("{"):
        return text or None
    try:
        tokens = json.loads(text)
    except ValueError as e:
        fail(f"--token-file {token_file}: not JSON: {e}", "bad_value", "--token-file")
    if not isinstance(tokens, dict) or not all(isinstance(v, str) for v in tokens.values()):
        fail(
            f"--token-file {token_file}: expected the bare secret or a JSON object of "
            'token names and secrets ({"operator": "..."})',
            "bad_value",
            "--token-file",
        )
    if isinstance(token_name, tuple):  # a preference: the first name the file has
        token_name = next((n for n in token_name if n in tokens), token_name[0])
    if token_name not in tokens:
        fail(
            f"--token-name {token_name!r} is not in {token_file}; "
            f"allowed: {', '.join(sorted(tokens)) or 'none'}",
            "bad_value",
            "--token-name",
        )
    return str(tokens[token_name])
