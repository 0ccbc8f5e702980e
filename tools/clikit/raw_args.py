"""What the command line says before click converts it: a path option or argument
given as an empty string, and a single-valued option given twice.

Both read as something else once converted: ``Path("")`` is ``.``, so ``--witness
""`` was read as the current directory, and click keeps the last of an option given
twice, so ``--checkpoint A --checkpoint B`` checked B alone and ``stop --grace 1
--grace 2`` waited 2 s (newcomers' trials, stop 34). :func:`check_raw` refuses them
as usage (exit 2), naming the option. A number given with other than ASCII
characters (``--port ١٨٧٧٧``: Python's ``int()`` and ``float()`` read every Unicode
digit, the API does not) is refused too (``bad_value``). Every option that takes
one value is checked (not one declared ``multiple=True``, such as ``--witness`` or
``--env``); a flag given twice says the same thing twice and is left alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import click

from .paths import BadPath, KeyOrFile

__all__ = ["NotAscii", "Repeated", "check_raw", "number_problem"]


class Repeated(click.UsageError):
    """A single-valued option given more than once (usage, exit 2); ``param`` names it
    (the ``field`` of the JSON error)."""

    def __init__(self, message: str, ctx: click.Context, param: click.Parameter) -> None:
        super().__init__(message, ctx)
        self.param = param


class NotAscii(click.BadParameter):
    """A number holding a character other than ASCII (``bad_value``, exit 2)."""


def _takes_a_number(param: click.Parameter) -> bool:
    """A parameter click converts with ``int()`` or ``float()`` (ranges, and
    :class:`~.command.Seconds`, named "seconds", too)."""
    kind = param.type
    return isinstance(kind, (click.types.IntParamType, click.types.FloatParamType)) or (
        kind.name == "seconds"
    )


def number_problem(value: str) -> str | None:
    """Why ``value`` is no number as the API and every other reader writes one, or
    None: Python's ``int()`` and ``float()`` take what no other reader of a number
    does: other scripts' digits (Arabic-Indic, full-width), ``1_0`` and
    surrounding spaces (a second trial, stop 34: ``--threads 1_0`` placed 10
    threads). Also the check of a URL's port (:mod:`.urls`)."""
    if not value.isascii():
        why = "not other scripts' digits"
    elif "_" in value or value != value.strip():
        why = "without underscores or spaces"
    else:
        return None
    return f"{value!a}: a number is written in ASCII digits (0-9), {why}"


def _check_ascii_number(ctx: click.Context, param: click.Parameter, values: Sequence[Any]) -> None:
    """A number option's values, by :func:`number_problem`."""
    for value in values:
        if isinstance(value, str) and (why := number_problem(value)) is not None:
            raise NotAscii(why, ctx, param)


def _takes_a_path(param: click.Parameter) -> bool:
    """A parameter whose value names a file or directory (or a key, or a file holding one)."""
    return isinstance(param.type, (click.Path, click.File, KeyOrFile))


def _name(param: click.Parameter) -> str:
    if isinstance(param, click.Option) and param.opts:
        return max(param.opts, key=len)
    return str(param.human_readable_name)


def _values(value: Any) -> Sequence[Any]:
    return value if isinstance(value, (list, tuple)) else [value]


def _single_valued(param: click.Parameter) -> bool:
    """An option that takes one value: not repeatable, not a flag, not a counter."""
    return (
        isinstance(param, click.Option)
        and not param.multiple
        and not param.is_flag
        and not param.count
    )


def check_raw(ctx: click.Context, opts: dict[str, Any], order: Sequence[click.Parameter]) -> None:
    """Refuse, as usage naming the option or argument: an empty value where a path
    (or key) is expected, a single-valued option given twice, and a number written
    with other than ASCII.

    Args:
        ctx: the command's context.
        opts: the parser's values by parameter name, before conversion.
        order: the parameters in the order the command line gave them (an option
            once per occurrence).

    Raises:
        BadPath: an empty path (``bad_path``, exit 2).
        NotAscii: a number holding other than ASCII (``bad_value``, exit 2).
        Repeated: an option given twice (``usage``, exit 2).
    """
    seen = Counter(p.name for p in order)
    for param in dict.fromkeys(order):
        if seen[param.name] > 1 and _single_valued(param):
            raise Repeated(
                f"{_name(param)} given {seen[param.name]} times: it takes one value (give it once)",
                ctx,
                param,
            )
        if _takes_a_number(param):
            _check_ascii_number(ctx, param, _values(opts.get(param.name or "")))
        if not _takes_a_path(param):
            continue
        name = _name(param)
        if any(isinstance(v, str) and not v.strip() for v in _values(opts.get(param.name or ""))):
            raise BadPath(f"an empty value: {name} takes {_what(param)}", ctx, param)


def _what(param: click.Parameter) -> str:
    """What a path parameter takes, for the refusal of an empty value: by its type, or
    by its metavar (FILE, DIR) where the type lets both through and the command
    refuses the other (``--checkpoint DIR`` is refused as no file)."""
    kind = param.type
    if isinstance(kind, KeyOrFile):
        return "a key string or a file holding one"
    if (isinstance(kind, click.Path) and not kind.dir_okay) or param.metavar == "FILE":
        return "a file name"
    if (isinstance(kind, click.Path) and not kind.file_okay) or param.metavar == "DIR":
        return "a directory name"
    return "a file or directory name"
