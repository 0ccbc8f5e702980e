"""The command line's one error path, and its JSON output.

A command reports a refusal with :func:`fail`, or raises :class:`Failure`
from its work (its :class:`~.command.Command` sends that to :func:`fail`):
the message on stderr, and under ``--json`` also one object on stdout
(``{"error": {"code", "message", "field"}}``); then it exits by the code's
status in the exit table of docs/cli.md. Never a traceback.
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import click
import msgspec

from ..api.exit_codes import cut, exit_for

__all__ = ["Failure", "echo_json", "fail", "json_mode", "say_line"]


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


def say_line(answer: Any) -> None:
    """One JSON object on one line, flushed (for --json streams)."""
    sys.stdout.buffer.write(msgspec.json.encode(answer) + b"\n")
    sys.stdout.buffer.flush()


def json_mode() -> bool:
    """Whether the running command was given --json."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.params.get("as_json"))


def fail(message: str, code: str, field: str | None = None) -> NoReturn:
    """Report an error (stderr; stdout too as JSON under --json) and exit by its code."""
    message = cut(message)
    click.echo(f"error: {message}", err=True)
    if json_mode():
        from .schemas import ErrorBody, ErrorRecord  # noqa: PLC0415 - wire types load the replay

        record = ErrorRecord(error=ErrorBody(code=code, message=message, field=field))
        ctx = click.get_current_context(silent=True)
        if ctx is not None and ctx.meta.get("json_lines"):
            say_line(record)  # a JSON-lines stream ends with one more line, not a block
        else:
            echo_json(record)
    sys.exit(exit_for(code))
