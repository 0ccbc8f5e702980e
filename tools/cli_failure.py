"""What the command line's modules share for errors and JSON output.

A command's work raises :class:`Failure`; ``tools/cli.py`` reports it on the
error path of docs/cli.md (the message, the code's exit status from
:mod:`.api.exit_codes`, the field at fault).
"""

from __future__ import annotations

from typing import Any

import click
import msgspec

__all__ = ["Failure", "echo_json"]


class Failure(Exception):
    """A refusal the command line reports by its code: message, code
    (a key of ``exit_codes.CODES``) and the field at fault (or None)."""

    def __init__(self, message: str, code: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.field = field


def echo_json(obj: Any) -> None:
    """Print ``obj`` as indented JSON (msgspec's encoding) on standard output."""
    click.echo(msgspec.json.format(msgspec.json.encode(obj), indent=2))
